"""Checkpoints on the model's own iteration counter, written atomically.

Lightning's ModelCheckpoint counts `global_step`, which under manual optimization advances once per optimizer step
(Lightning #17958), and its local writes go through a temp file in /tmp that is then moved, which is a copy (not
atomic) when /tmp is another filesystem. Here every file is written next to its final name and `os.replace`d, so a
crash leaves either the previous complete file or the new complete file, never half of one.

`last.ckpt` is written first and the periodic `step_N.ckpt` is a hard link to the same file (a copy where the
filesystem has no links), so a run killed during its first checkpoint still has a complete `last.ckpt` or none, and
resuming from `last.ckpt` always works. Partial files a killed run left behind are removed when the next run starts in
that directory. A full disk or a read-only output directory stops the run with one paragraph naming the path, and a
second Ctrl-C in the middle of a write removes the partial file and leaves the previous `last.ckpt` as it was.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from pixelsmith.errors import PixelsmithError, why_unwritable

log = logging.getLogger(__name__)


class CheckpointWriteError(PixelsmithError, OSError):
    """A checkpoint could not be written (full disk, read-only directory); earlier checkpoints are intact."""


class IterationCheckpoint(Callback):
    def __init__(self, dirpath: str, every_n_steps: int = 500, keep: int = 3, save_last: bool = True):
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.save_last = save_last
        self._last_saved_iteration: int | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.is_global_zero and self.dirpath.is_dir():
            stale = sorted(self.dirpath.glob(".*.ckpt.partial"))
            for path in stale:
                path.unlink(missing_ok=True)
            if stale:
                log.info(
                    "Removed %d partial checkpoint file(s) left by an interrupted run in %s.",
                    len(stale),
                    self.dirpath,
                )

    def _save(self, trainer: L.Trainer, iteration: int, periodic: bool) -> None:
        if self._last_saved_iteration == iteration:
            return
        tmp = self.dirpath / f".step_{iteration:07d}.ckpt.partial"
        try:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            # The full training state (optimizers, schedulers, callbacks), said explicitly so Lightning does not log
            # a default on every save. Every rank takes part; rank 0 writes; it ends in a barrier.
            trainer.save_checkpoint(tmp, weights_only=False)
            if trainer.is_global_zero:
                self._publish(tmp, iteration, periodic)
            # No rank runs ahead (and, after a preemption, exits) before rank 0 has published the file.
            trainer.strategy.barrier("checkpoint-published")
        except OSError as err:
            if trainer.is_global_zero:
                tmp.unlink(missing_ok=True)
            raise _explain_write_error(err, self.dirpath) from err
        except BaseException:
            # A second Ctrl-C (core/preemption.py) stops in the middle of the write: the partial file goes, the
            # previous last.ckpt was never touched.
            if trainer.is_global_zero:
                tmp.unlink(missing_ok=True)
            raise
        self._last_saved_iteration = iteration

    def _publish(self, tmp: Path, iteration: int, periodic: bool) -> None:
        last = self.dirpath / "last.ckpt"
        if not (periodic and self.keep > 0):
            if self.save_last:
                os.replace(tmp, last)
            else:
                tmp.unlink(missing_ok=True)
            return
        final = self.dirpath / f"step_{iteration:07d}.ckpt"
        if not self.save_last:
            os.replace(tmp, final)
        else:
            os.replace(tmp, last)  # first: a kill from here on leaves a complete last.ckpt
            _link_or_copy(last, final)
        self._prune()

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


def _link_or_copy(source: Path, target: Path) -> None:
    """`target` becomes the same complete file as `source`: a hard link (no copy, no window), else an atomic copy."""
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)
    except OSError:  # no hard links on this filesystem (some network and FUSE mounts)
        shutil.copyfile(source, partial)
    os.replace(partial, target)


def _explain_write_error(err: OSError, dirpath: Path) -> CheckpointWriteError:
    cause = why_unwritable(err)
    if err.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM):
        fix = f"{'free space there' if err.errno == errno.ENOSPC else 'make it writable'}, or put the run elsewhere with hydra.run.dir=... (paths.output_dir)"
    else:
        fix = "check the path, or put the run elsewhere with hydra.run.dir=..."
    return CheckpointWriteError(
        f"Could not write a checkpoint in {dirpath}: {cause} ({err}). Fix: {fix}, then resume with "
        f"ckpt_path={dirpath / 'last.ckpt'} if it exists. Checkpoints written before are intact and no partial file "
        "was left behind."
    )
