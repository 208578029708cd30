"""Typed schemas for the Hydra config tree, registered in Hydra's ConfigStore.

Every YAML option of a typed group starts with `defaults: [_schema, _self_]`, and `conf/train.yaml` starts with the
root schema, so a misspelled key (`hardware.batchsize=8`, `maxsteps=5`) or a wrong type (`max_steps=ten`) fails at
start-up with Hydra's message naming the key, instead of training for an hour with a default (LHT #57).

`None` in a hardware field means "take it from the detected profile" (see `pixelsmith.hardware`), which is how
`hardware=auto` composes with command-line overrides such as `hardware.batch_size=32`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
STRATEGIES = ("auto", "ddp", "fsdp")
SCHEDULES = ("constant", "warmup_cosine")
GAN_LOSSES = ("non_saturating", "hinge")


@dataclass
class HardwareConfig:
    """A hardware profile: device, default precision, backend switches, loader settings and batch size."""

    name: str = "auto"
    accelerator: str | None = None  # "cpu" or "cuda"
    devices: int | None = None
    num_nodes: int = 1
    precision: str | None = None  # the profile's default; `precision=...` on the command line wins
    expected_gpu: str | None = None  # substring of torch.cuda.get_device_name(); a mismatch warns
    cudnn_benchmark: bool | None = None
    matmul_precision: str | None = None  # torch.set_float32_matmul_precision: highest | high | medium
    allow_tf32: bool | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    compile_mode: str | None = None  # default | reduce-overhead | max-autotune
    num_workers: int | None = None
    pin_memory: bool | None = None
    batch_size: int | None = None


@dataclass
class PrecisionConfig:
    name: str = "auto"  # auto = the hardware profile's default


@dataclass
class StrategyConfig:
    name: str = "auto"
    process_group_backend: str | None = None  # None: nccl on CUDA, gloo on CPU
    timeout_minutes: int = 30


@dataclass
class DataConfig:
    _target_: str = MISSING
    name: str = MISSING
    batch_size: int | None = None  # global micro-batch summed over ranks; None = hardware profile default
    resolution: int = 32
    channels: int = 1
    num_workers: int | None = None  # None = hardware profile default
    pin_memory: bool | None = None
    persistent_workers: bool = True
    prefetch_factor: int = 2
    root: str | None = None
    extensions: list[str] = field(default_factory=lambda: ["jpg", "jpeg", "png", "webp"])
    on_corrupt: str = "skip"  # skip (warn and count) | error
    limit: int | None = None  # use only the first N items (debugging)


@dataclass
class ScheduleConfig:
    name: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    total_steps: int | None = None  # None = max_steps


@dataclass
class OptimizerConfig:
    lr: float = 2e-4
    betas: list[float] = field(default_factory=lambda: [0.5, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass
class EMAConfig:
    enabled: bool = True
    half_life_kimg: float = 10.0  # StyleGAN2-ADA: beta = 0.5 ** (batch / (half_life_kimg * 1000))
    rampup: float | None = 0.05  # half-life limited to rampup * images seen so far (None: no ramp-up)


@dataclass
class GANModelConfig:
    _target_: str = "pixelsmith.gan.module.GANModule"
    name: str = MISSING
    generator: Any = MISSING  # {_target_: ..., kwargs}; instantiated by the module
    discriminator: Any = MISSING
    loss: str = "non_saturating"
    r1_gamma: float = 0.0  # 0 disables R1
    r1_interval: int = 16  # lazy regularisation: R1 every N iterations, scaled by N
    g_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    d_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    sample_grid_size: int = 64


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


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    data_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class TrainConfig:
    """The root of `conf/train.yaml`."""

    task_name: str = "train"
    seed: int = 42
    max_steps: int = 2000  # training iterations (one G and one D update each), whatever the optimizer count
    accumulate: int = 1  # micro-batches per optimizer step
    ckpt_path: str | None = None  # resume from this checkpoint
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = MISSING
    augment: Any = None
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    logger: Any = None
    callbacks: Any = None
    paths: PathsConfig = field(default_factory=PathsConfig)


def register_configs() -> None:
    """Register every schema; called by the entry points before Hydra composes."""
    cs = ConfigStore.instance()
    cs.store(name="_train_schema", node=TrainConfig)
    cs.store(group="hardware", name="_schema", node=HardwareConfig)
    cs.store(group="precision", name="_schema", node=PrecisionConfig)
    cs.store(group="strategy", name="_schema", node=StrategyConfig)
    cs.store(group="data", name="_schema", node=DataConfig)
    cs.store(group="schedule", name="_schema", node=ScheduleConfig)
    cs.store(group="model", name="_gan_schema", node=GANModelConfig)
    cs.store(group="paths", name="_schema", node=PathsConfig)
