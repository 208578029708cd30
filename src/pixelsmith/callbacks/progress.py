"""The rich progress bar, labelled in training iterations.

Pixelsmith runs one endless epoch and stops after `max_steps` iterations (the Trainer gets `max_epochs=-1`), so
Lightning's stock description "Epoch 0/-2" is noise: show "Training" instead. The bar's total and count are our
iterations already, and `img/s` arrives as a progress-bar metric from the module.

Lightning reads the progress-bar metrics on every batch, converting each logged tensor with `.item()`: on a GPU that
is a host-device synchronisation per iteration, for values that only change at logging iterations. This bar reads
them at logging iterations (and the last) only.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


class IterationProgressBar(RichProgressBar):
    """RichProgressBar whose training description does not show the (meaningless) epoch count."""

    def _get_train_description(self, current_epoch: int) -> str:
        # Overrides a private hook (Lightning 2.6): the only place the description is built.
        description = "Training"
        if len(self.validation_description) > len(description):
            description = f"{description:{len(self.validation_description)}}"
        return description

    def _update_metrics(self, trainer, pl_module) -> None:
        # Overrides a private hook (Lightning 2.6), called at every batch end: see the module docstring.
        core = getattr(pl_module, "core", None)
        iteration = getattr(pl_module, "iteration", None)
        between_logs = core is not None and iteration is not None and iteration % core.log_every_n_steps != 0
        if between_logs and not trainer.should_stop:
            return
        super()._update_metrics(trainer, pl_module)
