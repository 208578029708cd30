"""The run's resolved config and its final objective, handed to every experiment tracker.

Lightning logs a module's `save_hyperparameters()` only; Pixelsmith's modules take a settings object instead, so
without this TensorBoard's `hparams.yaml` was `{}` and W&B and MLflow got no config at all. At start-up each logger
gets the resolved config (`core.run_config`): TensorBoard as flat `group/key` names, the columns of its HParams view;
the others as the nested dict (W&B keeps the tree in its config panel, MLflow and CSV flatten or store it
themselves). At the end the run's `objective=` value (train.yaml: `eval/best_fid`) is attached: TensorBoard gets
its HParams session (the config with that metric), so the HParams view compares a sweep's runs side by side; the
other trackers, CSV aside (`final_metrics.json` holds it), get it as a metric at the last iteration.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

log = logging.getLogger(__name__)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a/b": 1}`; lists and empty dicts (`augment: {}`) stay values, shown as text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def wants_flat(logger: Logger) -> bool:
    return isinstance(logger, TensorBoardLogger)


def log_run_config(loggers: Iterable[Logger], config: Mapping[str, Any]) -> None:
    """Each logger's `log_hyperparams` with the resolved config, flat or nested as the module docstring says."""
    flat = flatten(config)
    for logger in loggers:
        logger.log_hyperparams(flat if wants_flat(logger) else dict(config))


def attach_objective(
    loggers: Iterable[Logger], config: Mapping[str, Any], objective: str | None, metrics: Mapping[str, Any]
) -> None:
    """The final `objective` value to each logger (nothing when the run has no finite value for it)."""
    value = metrics.get(objective) if objective else None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return
    step = int(metrics.get("iteration", 0))
    flat = flatten(config)
    for logger in loggers:
        try:
            if wants_flat(logger):
                # The HParams session: the config with the metric; logs the metric's scalar too.
                logger.log_hyperparams(flat, metrics={objective: float(value)}, step=step)
            elif not isinstance(logger, CSVLogger):
                logger.log_metrics({objective: float(value)}, step=step)
            else:
                continue
            logger.save()
            # Lightning finalized the loggers when fit ended; this closes what the lines above reopened.
            logger.finalize("success")
        except Exception as err:  # a tracker's hiccup must not cost a finished run its result
            log.warning(
                "Could not attach %s to the %s logger (%s: %s).",
                objective,
                type(logger).__name__,
                type(err).__name__,
                err,
            )
