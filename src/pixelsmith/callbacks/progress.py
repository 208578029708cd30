"""The rich progress bar, labelled in training iterations.

Pixelsmith runs one endless epoch and stops after `max_steps` iterations (the Trainer gets `max_epochs=-1`), so
Lightning's stock description "Epoch 0/-2" is noise: show "Training" instead. The bar's total and count are our
iterations already, and `img/s` arrives as a progress-bar metric from the module.
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
