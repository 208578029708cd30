"""Schemas of the `profiler` group and the `auto_batch` node, beside the performance hooks that read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ProfilerConfig:
    """Performance measurement (conf/profiler/: none | breakdown | torch); see docs/performance.md."""

    name: str = "none"
    breakdown: bool = False  # per-region step time -> perf/ms/*, perf/share/*, <run>/perf/breakdown.*
    throughput: bool = False  # img/s, FLOPs, TFLOP/s, MFU, peak memory -> <run>/perf/throughput.json
    torch: bool = False  # torch.profiler window -> <run>/perf/trace.json (Chrome trace) + kernels.txt/csv
    every_n_steps: int | None = None  # scalars every N iterations; None = train.log_every_n_steps
    warmup_steps: int = 2  # iterations left out of the averages; FLOPs are counted on the last of them
    peak_tflops: float | None = None  # MFU denominator; None = GPU datasheet table / measured CPU GEMM
    torch_wait: int = 2  # iterations skipped before the torch.profiler window
    torch_warmup: int = 1
    torch_active: int = 3  # iterations recorded
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False


@dataclass
class AutoBatchConfig:
    """Largest micro-batch that fits, backed off by `margin` (pixelsmith.perf.batch_size)."""

    enabled: bool = False
    margin: float = 0.15  # back off this fraction from the largest batch that fitted
    ram_budget_gb: float | None = None  # CPU: peak RSS allowed; None = current RSS + 80% of MemAvailable
    gpu_budget_fraction: float = 0.9  # CUDA: peak reserved memory allowed, fraction of the device memory
    start: int | None = None  # first per-process batch tried; None = the configured batch
    max_batch: int = 4096  # per process
    scale_lr: bool = False  # linear scaling rule: every *optimizer.lr x new_batch / reference_batch
    reference_batch: int | None = None  # the batch the lrs were tuned for; None = the configured batch
