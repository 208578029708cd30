"""Builders of a run's parts from the composed config: the hardware settings, the core settings, the datamodule and the
model. `pixelsmith.run.fit` fits with them; the auto batch size search (`pixelsmith.perf.batch_size`), `evaluate.py`
and the benchmarks build the same parts the same way. Below `train` and `perf` so both can use them without an
import circle (tests/test_architecture.py).
"""

from __future__ import annotations

import logging

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pixelsmith.config.stored import accepted_arguments
from pixelsmith.core.budget import TimeBudget
from pixelsmith.core.config import CoreSettings, ScheduleConfig
from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.settings import HardwareSettings, resolve_hardware_settings

log = logging.getLogger(__name__)

# Keys the builder adds to every datamodule's arguments (from the root config), besides the `data.*` keys.
DATAMODULE_RUN_KEYS = ("accumulate", "max_steps", "seed")


def resolve_hardware(cfg: DictConfig) -> HardwareSettings:
    """The run's HardwareSettings from the composed config (`pixelsmith.hardware.settings.resolve_hardware_settings`).
    `run()` builds it once and passes it on; nothing else re-reads the hardware profile. `max_steps` and `accumulate`
    are checked once, by config/validate.py's rules at start-up."""
    budget = cfg.train.get("time_budget_minutes")
    if budget is not None and budget <= 0:
        raise PixelsmithError(
            f"train.time_budget_minutes={budget} must be positive; null trains all max_steps iterations."
        )
    return resolve_hardware_settings(
        cfg.hardware, cfg.precision.name, cfg.strategy.name, cfg.strategy.process_group_backend
    )


def build_core_settings(cfg: DictConfig, hardware: HardwareSettings) -> CoreSettings:
    schedule = ScheduleConfig(**OmegaConf.to_container(cfg.schedule, resolve=True))
    run_config = OmegaConf.to_container(cfg, resolve=True)
    run_config["runtime_plan"] = hardware.__dict__.copy()
    return CoreSettings(
        precision=hardware.precision,
        accumulate=cfg.accumulate,
        max_steps=cfg.max_steps,
        clip_grad_norm=cfg.train.clip_grad_norm,
        nonfinite_max_consecutive=cfg.train.nonfinite_max_consecutive,
        schedule=schedule,
        channels_last=hardware.channels_last,
        compile=hardware.compile,
        compile_mode=hardware.compile_mode,
        compile_scope=hardware.compile_scope,
        cuda_graphs=hardware.cuda_graphs,
        seed=cfg.seed,
        log_every_n_steps=cfg.train.log_every_n_steps,
        optimizer_impl=hardware.optimizer_impl,
        run_config=run_config,
        # The clock starts here: set-up and the evaluations during training count, the final ones come after.
        time_budget=TimeBudget(cfg.train.get("time_budget_minutes")),
        preemption_signals=tuple(cfg.train.preemption.signals),
        preemption_check_every_n_steps=cfg.train.preemption.check_every_n_steps,
    )


def build_datamodule(cfg: DictConfig, hardware: HardwareSettings) -> L.LightningDataModule:
    """Instantiate `cfg.data`, passing each key its class declares (so a fork's datamodule takes what it needs)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    target = data.pop("_target_")
    data.pop("name", None)
    data["batch_size"] = data.get("batch_size") or hardware.batch_size
    if data.get("num_workers") is None:
        data["num_workers"] = hardware.num_workers
    if data.get("pin_memory") is None:
        data["pin_memory"] = hardware.pin_memory
    cls = _locate(target)
    accepted = _accepted_kwargs(cls)
    unknown = sorted(k for k in data if accepted is not None and k not in accepted)
    if unknown:
        # The shipped datamodules' schemas refuse these at composition; a fork's untyped datamodule ends up here.
        raise PixelsmithError(
            f"data.{unknown[0]} is not an argument of {cls.__name__} ({target}), so nothing would read it "
            f"(unknown: {', '.join('data.' + k for k in unknown)}). Remove the key, or add the argument to "
            f"{cls.__name__}.__init__ (and to its data schema)."
        )
    run_keys = {k: cfg[k] for k in DATAMODULE_RUN_KEYS if accepted is None or k in accepted}
    return cls(**data, **run_keys)


def _locate(target: str):
    from hydra.utils import get_class

    return get_class(target)


def _accepted_kwargs(cls) -> set[str] | None:
    """The keyword arguments `cls` takes; None when it takes any (a `**kwargs` of its own)."""
    names, any_key = accepted_arguments(cls)
    return None if any_key else names


def build_model(cfg: DictConfig, core: CoreSettings) -> L.LightningModule:
    """`cfg.model` as plain keyword arguments (nested `_target_` nodes are instantiated by the model itself), plus
    the core settings and the augmentation module. Not `hydra.utils.instantiate(cfg.model, core=...)`: that would
    turn the CoreSettings dataclass into a DictConfig, which then ends up pickled inside checkpoints."""
    kwargs = OmegaConf.to_container(cfg.model, resolve=True)
    cls = _locate(kwargs.pop("_target_"))
    try:
        augment = instantiate(cfg.augment) if cfg.get("augment") and cfg.augment.get("_target_") else None
        if augment is not None:
            kwargs["augment"] = augment
        return cls(core=core, **kwargs)
    except InstantiationException as err:
        # Hydra wraps the error of a part the model instantiates (a network refusing its resolution); a
        # user-fixable one is shown as its own paragraph, not as Hydra's "Error in call to target" traceback.
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, PixelsmithError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from err
