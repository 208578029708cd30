"""The rich progress bar, labelled in training iterations, and the training numbers on the console.

Pixelsmith runs one endless epoch and stops after `max_steps` iterations (the Trainer gets `max_epochs=-1`), so
Lightning's stock description "Epoch 0/-2" is noise: show "Training" instead. The bar's total and count are our
iterations already, and `img/s` arrives as a progress-bar metric from the module.

Lightning reads the progress-bar metrics on every batch, converting each logged tensor with `.item()`: on a GPU that
is a host-device synchronisation per iteration, for values that only change at logging iterations. This bar reads
them at logging iterations (and the last) only, and adds the numbers a user watches (`console_metrics`: the losses,
the learning rate, ADA's p) from what the module logged there, without making them progress-bar metrics (which
Lightning would convert at every batch).

Where no live bar is drawn (`train.progress_bar=false`, or output to a file or a batch job's log, where rich draws
only the final state), `ConsoleMetrics` logs the same numbers as one line per logging iteration instead.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

log = logging.getLogger(__name__)


def console_metrics(logged: Mapping[str, Any]) -> dict[str, str]:
    """The losses (`loss/*`), the learning rate (`lr`, or one per network when they differ) and ADA's `p`, formatted,
    from a logging iteration's metrics (`trainer.callback_metrics`)."""
    values = {}
    for key, value in logged.items():
        try:
            values[key] = float(value)
        except (TypeError, ValueError, RuntimeError):  # a non-scalar
            continue
    shown = {k: v for k, v in sorted(values.items()) if k.startswith("loss/")}
    rates = {k: v for k, v in sorted(values.items()) if k.startswith("lr/")}
    if rates and len(set(rates.values())) == 1:
        shown["lr"] = next(iter(rates.values()))
    else:
        shown.update(rates)
    if "augment/p" in values:
        shown["p"] = values["augment/p"]
    return {k: f"{v:.4g}" if math.isfinite(v) else str(v) for k, v in shown.items()}


def _at_logging_iteration(trainer, pl_module) -> bool:
    core = getattr(pl_module, "core", None)
    iteration = getattr(pl_module, "iteration", None)
    if core is None or iteration is None:
        return True
    return iteration % core.log_every_n_steps == 0 or bool(trainer.should_stop)


class IterationProgressBar(RichProgressBar):
    """RichProgressBar whose training description does not show the (meaningless) epoch count."""

    def _get_train_description(self, current_epoch: int) -> str:
        # Overrides a private hook (Lightning 2.6): the only place the description is built.
        description = "Training"
        if len(self.validation_description) > len(description):
            description = f"{description:{len(self.validation_description)}}"
        return description

    @property
    def draws_live(self) -> bool:
        """Whether the bar is redrawn in place (a terminal): elsewhere rich shows only its final state."""
        console = getattr(self, "_console", None)
        return self.is_enabled and console is not None and console.is_terminal

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        # Called by _update_metrics below, at logging iterations only.
        return {**super().get_metrics(trainer, pl_module), **console_metrics(trainer.callback_metrics)}

    def _update_metrics(self, trainer, pl_module) -> None:
        # Overrides a private hook (Lightning 2.6), called at every batch end: see the module docstring.
        if not _at_logging_iteration(trainer, pl_module):
            return
        super()._update_metrics(trainer, pl_module)


class ConsoleMetrics(L.Callback):
    """One log line per logging iteration (iteration, losses, learning rate, ADA's p, img/s) where no live progress
    bar shows them (see the module docstring)."""

    def __init__(self) -> None:
        self.enabled: bool | None = (
            None  # decided at the first logging iteration, once the bar has its console
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not (trainer.is_global_zero and _at_logging_iteration(trainer, pl_module)):
            return
        if self.enabled is None:
            bar = trainer.progress_bar_callback
            self.enabled = not (isinstance(bar, IterationProgressBar) and bar.draws_live)
        if not self.enabled:
            return
        logged = trainer.callback_metrics
        shown = console_metrics(logged)
        if "img/s" in logged:
            shown["img/s"] = f"{float(logged['img/s']):.0f}"
        # The values are the ones the training core handed over: a logging iteration hands over the previous one's
        # (read without waiting for the GPU), so the line names the iteration they belong to.
        if "train/iteration" in logged:
            iteration = int(float(logged["train/iteration"]))
        elif hasattr(pl_module, "iteration_log"):
            return  # the first logging iteration: nothing handed over yet
        else:
            iteration = getattr(pl_module, "iteration", trainer.global_step)
        max_steps = getattr(getattr(pl_module, "core", None), "max_steps", None)
        where = f"Iteration {iteration}" + (f"/{max_steps}" if max_steps else "")
        log.info("%s: %s", where, "  ".join(f"{k} {v}" for k, v in shown.items()))
