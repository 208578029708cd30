"""The Lightning Trainer a run fits with: its strategy (our DDP or FSDP2 per network, see core/strategy.py and
core/fsdp.py), loggers and callbacks from the config groups, with the checks of optional logger packages."""

from __future__ import annotations

import os

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig

from pixelsmith.callbacks.host_sync import HostSyncCheck
from pixelsmith.callbacks.model_summary import ParameterSummary
from pixelsmith.callbacks.progress import ConsoleMetrics
from pixelsmith.callbacks.step_results import StepResultsRelease
from pixelsmith.core.fsdp import MultiNetworkFSDPStrategy
from pixelsmith.core.strategy import MultiNetworkDDPStrategy
from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.settings import HardwareSettings
from pixelsmith.perf import build_callbacks as build_perf_callbacks


def build_strategy(hardware: HardwareSettings, cfg: DictConfig):
    from datetime import timedelta

    # Both without Lightning's wrappers: DDP all-reduces per optimizer step, FSDP2 shards each network
    # (core/strategy.py, core/fsdp.py); Lightning's own FSDPStrategy refuses two optimizers (#19685).
    kinds = {"ddp": MultiNetworkDDPStrategy, "fsdp": MultiNetworkFSDPStrategy}
    if hardware.strategy in kinds:
        return kinds[hardware.strategy](
            process_group_backend=hardware.process_group_backend,
            timeout=timedelta(minutes=cfg.strategy.timeout_minutes),
        )
    return "auto"


# Loggers whose package is an optional extra: the class, the module it needs, and the extra that installs it.
OPTIONAL_LOGGERS = {
    "WandbLogger": ("wandb", "wandb"),
    "MLFlowLogger": ("mlflow", "mlflow"),
}


def _check_optional_packages(node: DictConfig) -> None:
    import importlib.util

    for name, entry in node.items():
        target = str(entry.get("_target_", "")) if entry is not None else ""
        needed = OPTIONAL_LOGGERS.get(target.rsplit(".", 1)[-1])
        if needed and importlib.util.find_spec(needed[0]) is None:
            module, extra = needed
            raise PixelsmithError(
                f"logger={name} needs the {module} package, which is not installed. Install it with "
                f'pip install -e ".[{extra}]" (or pip install {module}), or choose another logger: '
                "logger=default (CSV + TensorBoard), logger=csv, logger=tensorboard or logger=none."
            )


def _allow_mlflow_file_store(node: DictConfig) -> None:
    """MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE is set ("maintenance mode"). A store in the
    run dir needs no server and no database package, which is what `logger=mlflow` is for here: opt in for file:
    URIs (a tracking server or database URI in logger.mlflow.tracking_uri is left alone)."""
    for entry in node.values():
        target = str(entry.get("_target_", "")) if entry is not None else ""
        if target.endswith("MLFlowLogger") and str(entry.get("tracking_uri") or "").startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def _instantiate_group(node: DictConfig | None) -> list:
    if not node:
        return []
    _check_optional_packages(node)
    _allow_mlflow_file_store(node)
    return [instantiate(entry) for entry in node.values() if entry is not None and entry.get("_target_")]


def build_trainer(cfg: DictConfig, hardware: HardwareSettings) -> L.Trainer:
    # StepResultsRelease always: without it Lightning converts the last logged progress-bar value with `.item()` at
    # every batch end (a GPU sync per iteration; callbacks/step_results.py).
    callbacks = _instantiate_group(cfg.get("callbacks")) + build_perf_callbacks(cfg) + [StepResultsRelease()]
    # The losses, learning rate and ADA's p on the console where no live bar shows them; the model summary without
    # Lightning's FLOPs column, which reads 0 for a module without example_input_array (callbacks/model_summary.py).
    callbacks += [ConsoleMetrics(), ParameterSummary()]
    if cfg.train.get("host_sync_check", "off") != "off":
        # First, so that in step scope its window closes before the sample/evaluation/checkpoint callbacks read
        # the device.
        scope = cfg.train.get("host_sync_scope", "loop")
        callbacks.insert(0, HostSyncCheck(cfg.train.host_sync_check, scope=scope))
    if not cfg.train.progress_bar:
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return L.Trainer(
        accelerator=hardware.accelerator,
        devices=hardware.devices,
        num_nodes=hardware.num_nodes,
        strategy=build_strategy(hardware, cfg),
        precision="32-true",  # mixed precision is run by the TrainingCore (see core/precision.py)
        max_epochs=-1,
        max_steps=-1,  # `max_steps` counts our iterations, enforced by the core (global_step counts optimizer steps)
        logger=_instantiate_group(cfg.get("logger")) or False,
        callbacks=callbacks,
        enable_checkpointing=False,  # IterationCheckpoint does it on the iteration counter, atomically
        enable_model_summary=False,  # ParameterSummary above instead of Lightning's default one
        enable_progress_bar=cfg.train.progress_bar,
        use_distributed_sampler=False,  # IterationSampler shards by rank and resumes by iteration
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.train.log_every_n_steps,
        default_root_dir=cfg.paths.output_dir,
    )
