"""Checkpoints on the model's own iteration counter, written atomically.

Lightning's ModelCheckpoint counts `global_step`, which under manual optimization advances once per optimizer step
(Lightning #17958), and its local writes go through a temp file in /tmp that is then moved, which is a copy (not
atomic) when /tmp is another filesystem. Here every file is written next to its final name and `os.replace`d, so a
crash leaves either the previous complete file or the new complete file, never half of one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class IterationCheckpoint(Callback):
    def __init__(self, dirpath: str, every_n_steps: int = 500, keep: int = 3, save_last: bool = True):
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.save_last = save_last
        self._last_saved_iteration: int | None = None

    def _save(self, trainer: L.Trainer, iteration: int, periodic: bool) -> None:
        if self._last_saved_iteration == iteration:
            return
        self.dirpath.mkdir(parents=True, exist_ok=True)
        tmp = self.dirpath / f".step_{iteration:07d}.ckpt.partial"
        trainer.save_checkpoint(tmp)  # every rank takes part; rank 0 writes; ends in a barrier
        if trainer.is_global_zero:
            if periodic and self.keep > 0:
                final = self.dirpath / f"step_{iteration:07d}.ckpt"
                os.replace(tmp, final)
                if self.save_last:
                    last_tmp = self.dirpath / ".last.ckpt.partial"
                    shutil.copyfile(final, last_tmp)
                    os.replace(last_tmp, self.dirpath / "last.ckpt")
                self._prune()
            elif self.save_last:
                os.replace(tmp, self.dirpath / "last.ckpt")
            else:
                tmp.unlink(missing_ok=True)
        self._last_saved_iteration = iteration

    def _prune(self) -> None:
        periodic = sorted(self.dirpath.glob("step_*.ckpt"))
        for old in periodic[: max(0, len(periodic) - self.keep)]:
            old.unlink(missing_ok=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        iteration = int(pl_module.iteration)
        if self.every_n_steps > 0 and iteration % self.every_n_steps == 0:
            self._save(trainer, iteration, periodic=True)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, int(pl_module.iteration), periodic=False)
