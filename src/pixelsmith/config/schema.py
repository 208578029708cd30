"""Typed schemas for the Hydra config tree, registered in Hydra's ConfigStore.

Every YAML option of a typed group starts with `defaults: [_schema, _self_]`, and `conf/train.yaml` starts with the
root schema, so a misspelled key (`hardware.batchsize=8`, `maxsteps=5`) or a wrong type (`max_steps=ten`) fails at
start-up with Hydra's message naming the key, instead of training for an hour with a default (LHT #57).

The hardware group is composed by Hydra like any other: `hardware=auto` is the profile the entry point detected
(`pixelsmith.hardware.settings.register_detected_profile`), so `--cfg job` prints the settings that run, and a
command-line `hardware.batch_size=32` lands on top of the profile's value. `None` in a hardware field is the hardware
settings' default (`pixelsmith.hardware.settings.resolve_hardware_settings`).

No holes: a field with a fixed set of values is a `choice(Enum, default)` (pixelsmith/config/choices.py; `model.loss_net.arch=
vgg11` fails at composition naming the key and the values), each datamodule option of `conf/data/` has its own schema
(`data=mnist data.root=/x` fails: MNIST takes no root), and the shipped G/D networks have typed configs.

Each schema lives beside the code that reads it (`core/config.py`, `hardware_config.py`, `data/config.py`,
`augment/config.py`, `metrics/config.py`, `perf/config.py`); this module holds the root and registers them all, so
it sits above them (tests/test_architecture.py). The optional parts' schemas (the models: `gan/config.py`,
`style/config.py`, a fork's own) are registered from what each part present lists in its `part.py`
(`pixelsmith.parts`): this module names no part, so a part can be deleted (README "Removing a part").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from pixelsmith.augment.config import AdaptiveAugmentConfig, DiffAugmentConfig
from pixelsmith.config.choices import typed
from pixelsmith.core.config import ScheduleConfig, TrainLoopConfig
from pixelsmith.data.config import (
    DataConfig,
    ImageFolderDataConfig,
    MNISTDataConfig,
    ShardsDataConfig,
    ZipDataConfig,
)
from pixelsmith.hardware.schema import HardwareConfig, PrecisionConfig, StrategyConfig
from pixelsmith.metrics.config import EvalConfig
from pixelsmith.parts import contributed
from pixelsmith.perf.config import AutoBatchConfig, ProfilerConfig


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
    objective: str = (
        "eval/best_fid"  # the final metric a sweep optimises (returned to Hydra, ranked in summary.md)
    )
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    data: Any = MISSING  # each data option brings its own schema (MNISTDataConfig, ...)
    model: Any = MISSING
    augment: Any = None
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    logger: Any = None
    callbacks: Any = None
    paths: PathsConfig = field(default_factory=PathsConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    auto_batch: AutoBatchConfig = field(default_factory=AutoBatchConfig)


# The general groups' typed schemas: (group, name, dataclass), as stored in Hydra's ConfigStore.
GENERAL_SCHEMAS: list[tuple[str, str, type]] = [
    ("hardware", "_schema", HardwareConfig),
    ("precision", "_schema", PrecisionConfig),
    ("strategy", "_schema", StrategyConfig),
    ("data", "_schema", DataConfig),
    ("data", "_mnist_schema", MNISTDataConfig),
    ("data", "_image_folder_schema", ImageFolderDataConfig),
    ("data", "_zip_schema", ZipDataConfig),
    ("data", "_shards_schema", ShardsDataConfig),
    ("schedule", "_schema", ScheduleConfig),
    ("augment", "_diffaugment_schema", DiffAugmentConfig),
    ("augment", "_ada_schema", AdaptiveAugmentConfig),
    ("paths", "_schema", PathsConfig),
    ("profiler", "_schema", ProfilerConfig),
]


def all_schemas() -> list[tuple[str, str, type]]:
    """Every group schema: the general ones and those of each part present (the models' and their data's)."""
    return [*GENERAL_SCHEMAS, *contributed("SCHEMAS")]


def register_configs() -> None:
    """Register every schema; called by the entry points before Hydra composes."""
    cs = ConfigStore.instance()
    cs.store(name="_train_schema", node=typed(TrainConfig))
    for group, name, schema in all_schemas():
        cs.store(group=group, name=name, node=typed(schema))
