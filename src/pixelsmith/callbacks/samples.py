"""Sample grids every N iterations: a PNG under `<run>/samples/`, and the image in every logger that shows images:
TensorBoard (`add_image`), Weights & Biases (`log_image`, a step slider in the run's media panel) and MLflow (the PNG
as an artifact under `samples/`).

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
        path = self.dirpath / f"step_{iteration:07d}.png"
        save_image(grid, path)
        for logger in trainer.loggers:
            log_grid(logger, grid, iteration, path)

    def on_train_start(self, trainer, pl_module) -> None:
        if self.every_n_steps > 0:
            self._write(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every_n_steps > 0 and int(pl_module.iteration) % self.every_n_steps == 0:
            self._write(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._write(trainer, pl_module)


def log_grid(logger, grid, iteration: int, png: Path) -> None:
    """Hand one sample grid ([C, H, W] in [0, 1], already saved as `png`) to a logger that can show images. By class
    name for the optional ones, so neither wandb nor mlflow has to be installed to import this."""
    kind = type(logger).__name__
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_image("samples", grid, global_step=iteration)
    elif kind == "WandbLogger":
        logger.log_image(key="samples", images=[str(png)], step=iteration, caption=[f"iteration {iteration}"])
    elif kind == "MLFlowLogger":
        logger.experiment.log_artifact(logger.run_id, str(png), artifact_path="samples")
