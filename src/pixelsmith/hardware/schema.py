"""Schemas of the hardware, precision and strategy groups (`conf/hardware/`, `conf/precision/`, `conf/strategy/`),
beside `pixelsmith.hardware.settings`, which turns them into the run's hardware settings."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pixelsmith.config.choices import choice, values
from pixelsmith.core.config import OptimizerImpl, Precision


class PrecisionName(StrEnum):  # precision.name: a precision, or auto = the hardware profile's default
    AUTO = "auto"
    FP32 = "32-true"
    FP16_MIXED = "16-mixed"
    BF16_MIXED = "bf16-mixed"


class Strategy(StrEnum):
    AUTO = "auto"
    DDP = "ddp"
    FSDP = "fsdp"


class ProcessGroupBackend(StrEnum):
    NCCL = "nccl"
    GLOO = "gloo"


class Accelerator(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"  # an Apple GPU (Metal Performance Shaders)


class MatmulPrecision(StrEnum):  # torch.set_float32_matmul_precision
    HIGHEST = "highest"
    HIGH = "high"
    MEDIUM = "medium"


class CompileScope(StrEnum):  # what torch.compile compiles: each network whole, or the blocks it names
    NETWORK = "network"
    BLOCKS = "blocks"


class CompileMode(StrEnum):  # torch.compile(mode=...)
    DEFAULT = "default"
    REDUCE_OVERHEAD = "reduce-overhead"
    MAX_AUTOTUNE = "max-autotune"
    MAX_AUTOTUNE_NO_CUDAGRAPHS = "max-autotune-no-cudagraphs"


STRATEGIES = values(Strategy)


@dataclass
class HardwareConfig:
    """A hardware profile, `conf/hardware/<name>.yaml` (hardware=auto: the detected one), composed by Hydra with the
    user's `hardware.*` keys on top: device, default precision, backend switches, loader settings and batch size.
    `pixelsmith.hardware.settings.resolve_hardware_settings` turns it into the HardwareSettings; a field left None takes
    its default there."""

    name: str = "auto"
    accelerator: str | None = choice(Accelerator, None)  # cpu | cuda | mps
    devices: int | None = None
    num_nodes: int = 1
    # the profile's default precision; `precision=...` on the command line wins
    precision: str | None = choice(Precision, None)
    expected_gpu: str | None = None  # substring of torch.cuda.get_device_name(); a mismatch warns
    cudnn_benchmark: bool | None = None
    matmul_precision: str | None = choice(MatmulPrecision, None)  # torch.set_float32_matmul_precision
    allow_tf32: bool | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    compile_mode: str | None = choice(CompileMode, None)  # default | reduce-overhead | max-autotune
    # network (default): each network one graph; blocks: each block a network names (`compile_units()`) a graph of
    # its own (smaller graphs; on a CPU they compiled slower in all, 152 s against 91 s for a small StyleGAN2)
    compile_scope: str | None = choice(CompileScope, None)
    # Replay each training iteration as CUDA graph(s) (core/graphs.py); on CPU the same code runs uncaptured.
    cuda_graphs: bool | None = None
    num_workers: int | None = None
    num_threads: int | None = None  # torch.set_num_threads (intra-op) per process; None = torch's default
    pin_memory: bool | None = None
    batch_size: int | None = None
    optimizer_impl: str | None = choice(OptimizerImpl, None)  # Adam: auto | fused | foreach | for_loop
    memory_fraction: float | None = None  # CUDA: torch.cuda.set_per_process_memory_fraction (0, 1]
    cuda_alloc_conf: str | None = None  # CUDA: PYTORCH_CUDA_ALLOC_CONF, e.g. "expandable_segments:True"
    # torch.compile's on-disk cache, kept across runs; None: $TORCHINDUCTOR_CACHE_DIR, else ~/.cache/pixelsmith/compile
    compile_cache_dir: str | None = None


@dataclass
class PrecisionConfig:
    name: str = choice(PrecisionName, "auto")  # auto = the hardware profile's default


@dataclass
class StrategyConfig:
    name: str = choice(Strategy, "auto")
    process_group_backend: str | None = choice(ProcessGroupBackend, None)  # None: nccl on CUDA, gloo on CPU
    timeout_minutes: int = 30
