"""Sample grids every N iterations: a PNG under `<run>/samples/` and an image in TensorBoard.

The model provides `sample_grid() -> Tensor[C, H, W] in [0, 1]` (GAN: EMA generator on fixed latents; style:
content | style | result rows), so a resumed run continues the same series of pictures.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torchvision.utils import save_image


class SampleGrid(Callback):
    def __init__(self, dirpath: str, every_n_steps: int = 250):
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self._last_iteration: int | None = None

    def _write(self, trainer, pl_module) -> None:
        iteration = int(pl_module.iteration)
        if iteration == self._last_iteration:
            return
        self._last_iteration = iteration
        grid = pl_module.sample_grid()  # every rank computes it (cheap); only rank 0 writes
        if not trainer.is_global_zero:
            return
        self.dirpath.mkdir(parents=True, exist_ok=True)
        save_image(grid, self.dirpath / f"step_{iteration:07d}.png")
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image("samples", grid, global_step=iteration)

    def on_train_start(self, trainer, pl_module) -> None:
        if self.every_n_steps > 0:
            self._write(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every_n_steps > 0 and int(pl_module.iteration) % self.every_n_steps == 0:
            self._write(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._write(trainer, pl_module)
