"""Schemas of the training core's settings (`schedule`, `train`, the optimizer and EMA nodes of every model),
beside the code that reads them (core/module.py, core/optim.py, core/schedules.py, core/preemption.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from pixelsmith.config.choices import choice, values
from pixelsmith.core.budget import TimeBudget


class Precision(StrEnum):
    FP32 = "32-true"
    FP16_MIXED = "16-mixed"
    BF16_MIXED = "bf16-mixed"


class OptimizerImpl(StrEnum):  # core/optim.py OPTIMIZER_IMPLS
    AUTO = "auto"
    FUSED = "fused"
    FOREACH = "foreach"
    FOR_LOOP = "for_loop"


class Schedule(StrEnum):
    CONSTANT = "constant"
    WARMUP_COSINE = "warmup_cosine"


class ScheduleShape(StrEnum):  # model.schedules.<name>.shape (core/schedules.py ScalarSchedule)
    CONSTANT = "constant"
    LINEAR = "linear"
    COSINE = "cosine"


class HostSyncMode(StrEnum):  # train.host_sync_check (callbacks/host_sync.py)
    OFF = "off"
    WARN = "warn"
    ERROR = "error"


class HostSyncScope(StrEnum):  # train.host_sync_scope (callbacks/host_sync.py)
    LOOP = "loop"
    STEP = "step"


PRECISIONS = values(Precision)
SCHEDULES = values(Schedule)
SCHEDULE_SHAPES = values(ScheduleShape)
HOST_SYNC_MODES = values(HostSyncMode)
HOST_SYNC_SCOPES = values(HostSyncScope)


@dataclass
class ScheduleConfig:
    name: str = choice(Schedule, "constant")
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    total_steps: int | None = None  # None = max_steps


@dataclass
class ScalarScheduleConfig:
    """One scheduled hyper-parameter, `model.schedules.<name>` (core/schedules.py ScalarSchedule), driven by the images
    seen: `start` -> `final` over `horizon_kimg` thousand images (counted from 0, warm-up included) along `shape`, then
    `final`; with `warmup_kimg` > 0 it first climbs linearly from `warmup_start` to `start`. The names a model takes
    (lr, beta2, ema_half_life_kimg, gamma, augment_p, ...) are listed by its error message for an unknown one."""

    start: float = MISSING
    final: float | None = None  # None: start (a constant after any warm-up)
    shape: str = choice(ScheduleShape, "cosine")
    horizon_kimg: float | None = None  # required by linear and cosine
    warmup_kimg: float = 0.0
    warmup_start: float = 0.0


@dataclass
class OptimizerConfig:
    """An optimizer as a Hydra partial (core/optim.py): the core calls it with the parameters. Adam by default;
    another torch optimizer by `_target_`, with null for the keys it does not take and its own in `kwargs`
    (e.g. `_target_=torch.optim.SGD betas=null eps=null kwargs={momentum: 0.9}`)."""

    _target_: str = "torch.optim.Adam"
    _partial_: bool = True
    lr: float = 2e-4
    betas: list[float] | None = field(default_factory=lambda: [0.5, 0.999])
    eps: float | None = 1e-8
    weight_decay: float = 0.0
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class EMAConfig:
    enabled: bool = True
    half_life_kimg: float = 10.0  # StyleGAN2-ADA: beta = 0.5 ** (batch / (half_life_kimg * 1000))
    rampup: float | None = 0.05  # half-life limited to rampup * images seen so far (None: no ramp-up)


@dataclass
class PreemptionConfig:
    """Signals that end the run after the current iteration with last.ckpt, exiting 128 + signal (core/preemption.py)."""

    # the signals that end the run with last.ckpt (SIGINT: Ctrl-C, exit 130); [] keeps the default handlers
    signals: list[str] = field(default_factory=lambda: ["SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2"])
    # under SLURM: `scontrol requeue` the job (it comes back to the same run dir and resumes) ...
    requeue: bool = True
    # ... for these signals (not SIGTERM: `scancel` sends it, and a job the user cancelled must stay cancelled)
    requeue_on: list[str] = field(default_factory=lambda: ["SIGUSR1", "SIGUSR2"])
    # under several processes the ranks agree on a signal every N iterations; None = train.log_every_n_steps
    check_every_n_steps: int | None = None


@dataclass
class TrainLoopConfig:
    """Loop settings shared by every model: clipping, non-finite guard, logging, samples, checkpoints."""

    clip_grad_norm: float | None = None  # max global L2 norm per optimizer, on unscaled gradients
    nonfinite_max_consecutive: int = 20  # stop after this many skipped steps in a row
    log_every_n_steps: int = 10
    sample_every_n_steps: int = 250
    checkpoint_every_n_steps: int = 500
    keep_checkpoints: int = 3  # periodic step_*.ckpt files kept besides last.ckpt (0 keeps none)
    progress_bar: bool = True
    # Wall-clock minutes from the start of the run: training also ends at the first iteration past it, and the final
    # evaluation, samples and checkpoint are of that iteration. None = no budget, always all max_steps.
    time_budget_minutes: float | None = None
    # off | warn | error: iterations that log nothing must not make the host wait for the device
    # (callbacks/host_sync.py; CUDA's sync debug mode on a GPU, a count of syncing ops everywhere)
    host_sync_check: str = choice(HostSyncMode, "off")
    # loop: the whole Lightning loop of such an iteration (the fetch, every callback, the bookkeeping); step: from
    # on_train_batch_start to the check's own on_train_batch_end
    host_sync_scope: str = choice(HostSyncScope, "loop")
    # Resume from <run dir>/checkpoints/last.ckpt when the run dir has one and no ckpt_path is given (a requeued
    # SLURM job, a restarted Kubernetes pod, a torchrun restart, a rerun with the same hydra.run.dir).
    auto_resume: bool = True
    # Start in a run dir that holds another run's outputs but no last.ckpt to resume from (they are overwritten).
    overwrite: bool = False
    preemption: PreemptionConfig = field(default_factory=lambda: PreemptionConfig())


def as_config(cls, value):
    """A module argument given as a config dataclass, a mapping (a composed node) or None (the dataclass defaults)
    as that dataclass: the modules take all three, so Python callers need not build the dataclass."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    return cls(**dict(value))


@dataclass
class CoreSettings:
    """Everything the core needs that is not model-specific; built by `pixelsmith.run.fit` from the run config."""

    precision: str = "32-true"
    accumulate: int = 1
    max_steps: int = 1000
    clip_grad_norm: float | None = None
    nonfinite_max_consecutive: int = 20
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    channels_last: bool = False
    compile: bool = False
    compile_mode: str = "default"
    compile_scope: str = "network"  # network | blocks (each block a network's compile_units() names)
    cuda_graphs: bool = False  # hardware.cuda_graphs: the iteration replayed as CUDA graphs (core/graphs.py)
    seed: int = 42
    log_every_n_steps: int = 10
    optimizer_impl: str = (
        "foreach"  # Adam implementation: fused | foreach | for_loop | auto (hardware.optimizer_impl)
    )
    run_config: dict[str, Any] | None = None  # the resolved run config, stored in every checkpoint
    # train.time_budget_minutes: training also ends at the first iteration past it (core/budget.py)
    time_budget: TimeBudget = field(default_factory=TimeBudget)
    # train.preemption.signals: these end the run after the current iteration with last.ckpt (core/preemption.py)
    preemption_signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1", "SIGUSR2")
    preemption_check_every_n_steps: int | None = None  # None: at logging iterations


@dataclass
class CoreModelConfig:
    """The model keys the training core itself reads, for any model that inherits its schema from this one:
    `model.ema` (the EMA copies, core/ema.py), `model.init_from` and `model.schedules` (hyper-parameters moved by the images seen:
    name -> {start, final, shape, horizon_kimg, ...}, core/scheduled_values.py). Each schedule node is checked against
    ScalarScheduleConfig when the model is built (a typed dict of dataclasses would refuse
    `+model.schedules.lr={start: ...}` on the command line, an OmegaConf limitation)."""

    ema: EMAConfig = field(default_factory=EMAConfig)
    schedules: dict[str, Any] = field(default_factory=dict)
    # Start the networks from these weights (fine-tuning), where the model supports it (the GAN: an NVlabs network
    # pickle, read as data, or a Pixelsmith checkpoint). A resume (ckpt_path=) loads its own weights and never reads
    # this file again.
    init_from: str | None = None
