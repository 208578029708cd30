"""FLOP counting and the peak FLOP/s that MFU (model FLOPs utilisation) is measured against.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode` (matmul/conv/attention FLOPs, forward and backward, the
usual MFU convention: element-wise work and optimizer updates are not counted), totals only: FlopCounterMode's
per-module attribution (`torch.utils.module_tracker.ModuleTracker`) is switched off, as its forward hooks put
autograd hooks on module inputs and fail on a view of a parameter made under `no_grad` ("Expected gradient function
to be set": StyleGAN2's constant input when G runs under no_grad) and on `autograd.grad` of leaves (lazy R1).

GPU peaks are dense (no 2:4 sparsity) tensor-core figures from NVIDIA's datasheets, in FLOP/s. "tf32" is the peak
when fp32 matmuls run on tensor cores (`matmul_precision=high` / allow_tf32); "fp16"/"bf16" assume fp32
accumulation, which is what PyTorch's autocast matmuls and convolutions use. Lightning's own table mixes sparse
and dense entries for H100 NVL/H200 and lists the RTX 4090 fp16 tensor peak as its fp32 peak (Lightning #21677),
so Pixelsmith keeps its own. On a CPU the peak is a GEMM measured once per (CPU, threads, torch, dtype) and cached
in ~/.cache/pixelsmith/cpu_gemm_peak.json (`$PIXELSMITH_CACHE_DIR` or `$XDG_CACHE_HOME` move it); a cached peak
below what a run achieved (MFU above 100%: it was measured under load) is measured again (`plausible_peak_flops`).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

log = logging.getLogger(__name__)

TFLOPS = 1e12

# name key (matched as a substring of torch.cuda.get_device_name(), most specific first) -> precision -> FLOP/s.
GPU_PEAK_FLOPS: dict[str, dict[str, float]] = {
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67, TF32 989 / BF16 1,979 / FP16 1,979 TFLOPS "with
    # sparsity"; dense is half. NVL: FP32 60, TF32 835, BF16/FP16 1,671 with sparsity.
    "h200 nvl": {"fp32": 60.0e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "h200": {"fp32": 67.0e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    # NVIDIA H100 Tensor Core GPU datasheet: SXM FP32 67, TF32 989, BF16/FP16 1,979 (sparse); PCIe FP32 51,
    # TF32 756, BF16/FP16 1,513 (sparse); NVL (per GPU) FP32 60, TF32 835, BF16/FP16 1,671 (sparse).
    "h100 nvl": {"fp32": 60.0e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "h100 pcie": {"fp32": 51.0e12, "tf32": 378.0e12, "bf16": 756.0e12, "fp16": 756.0e12},
    "h100": {"fp32": 67.0e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    # NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe alike): FP32 19.5, TF32 156, BF16/FP16 312 (dense).
    "a100": {"fp32": 19.5e12, "tf32": 156.0e12, "bf16": 312.0e12, "fp16": 312.0e12},
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120, BF16/FP16 242 TFLOPS with sparsity -> dense 60 / 121.
    "l4": {"fp32": 30.3e12, "tf32": 60.0e12, "bf16": 121.0e12, "fp16": 121.0e12},
    # NVIDIA Ada GPU architecture whitepaper v2.1, appendix table (GeForce RTX 4090): peak FP32 82.6; TF32
    # tensor 82.6; FP16 and BF16 tensor with FP32 accumulate 165.2 (dense; 330.4 sparse).
    "rtx 4090": {"fp32": 82.6e12, "tf32": 82.6e12, "bf16": 165.2e12, "fp16": 165.2e12},
    # NVIDIA V100 datasheet: SXM2 FP32 15.7, tensor (FP16, FP32 accumulate) 125; PCIe 14 / 112; V100S PCIe
    # 16.4 / 130. Volta has no TF32 and no BF16 tensor cores.
    "v100s": {"fp32": 16.4e12, "fp16": 130.0e12},
    "v100 pcie": {"fp32": 14.0e12, "fp16": 112.0e12},
    "v100-pcie": {"fp32": 14.0e12, "fp16": 112.0e12},
    "v100": {"fp32": 15.7e12, "fp16": 125.0e12},
}

PRECISION_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def peak_precision_key(precision: str, device_type: str) -> str:
    """Which peak a run's precision is compared against: fp32 | tf32 | bf16 | fp16."""
    if precision == "bf16-mixed":
        return "bf16"
    if precision == "16-mixed":
        return "fp16"
    if device_type == "cuda" and (
        torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    ):
        return "tf32"
    return "fp32"


def gpu_peak_flops(device_name: str, key: str) -> float | None:
    """Dense peak FLOP/s of a known GPU for a precision key, or None (unknown GPU, or no such unit, e.g. V100 bf16)."""
    name = device_name.lower()
    for chip, peaks in GPU_PEAK_FLOPS.items():
        # Whole-token match: "l4" must not match "L40S", "v100" must not match "V100S".
        if re.search(rf"(?<![a-z0-9]){re.escape(chip)}(?![a-z0-9])", name):
            return peaks.get(key)
    return None


def cache_dir() -> Path:
    if os.environ.get("PIXELSMITH_CACHE_DIR"):
        return Path(os.environ["PIXELSMITH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pixelsmith"


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_gemm_flops(dtype: torch.dtype, size: int = 2048, min_seconds: float = 2.0) -> float:
    """Best-of-N FLOP/s of an n x n x n matmul on the CPU (2 n^3 FLOPs each), after one warm-up.

    The best run, not the mean: other processes can only slow a run down, so on a shared machine the fastest of
    many runs over a couple of seconds is the closest to the hardware's peak (here fp32 ranged 148-327 GFLOP/s
    between single runs while two other jobs were running)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    start = time.perf_counter()
    runs = 0
    while runs < 3 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return 2.0 * size**3 / best


# The variables that cap the instruction set ATen / inductor and oneDNN use.
ISA_CAP_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def _cache_entry(key: str) -> tuple[str, Path]:
    """The CPU GEMM peak cache's entry for a precision key (CPU model, threads, torch, dtype) and the cache file."""
    dtype = PRECISION_DTYPES[key]
    entry = f"{cpu_model_name()}|threads={torch.get_num_threads()}|torch={torch.__version__}|{dtype}"
    # A capped instruction set (e.g. an AVX2-only machine emulated on an AVX-512 one) has its own peak.
    capped = [f"{name}={os.environ[name]}" for name in ISA_CAP_VARIABLES if os.environ.get(name)]
    if capped:
        entry += "|" + ",".join(capped)
    return entry, cache_dir() / "cpu_gemm_peak.json"


def cpu_peak_flops(
    key: str, measure: Callable[[torch.dtype], float] = measure_gemm_flops, refresh: bool = False
) -> tuple[float, str]:
    """Measured CPU GEMM peak for a precision key (cached); returns (FLOP/s, where it came from)."""
    entry, path = _cache_entry(key)
    table: dict[str, float] = {}
    if path.is_file():
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
    if entry in table and not refresh:
        return float(table[entry]), f"cached GEMM peak ({path})"
    # Load can only make a measurement lower: a refresh keeps the larger of the old and the new value.
    dtype = PRECISION_DTYPES[key]
    value = max(measure(dtype), float(table.get(entry, 0.0)))
    table[entry] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=2, sort_keys=True))
        tmp.replace(path)
    except OSError as err:  # a read-only home must not stop training
        log.warning("Could not cache the CPU GEMM peak in %s: %s", path, err)
    log.info(
        "Measured CPU GEMM peak (%s, %d threads): %.1f GFLOP/s", dtype, torch.get_num_threads(), value / 1e9
    )
    return value, f"measured GEMM peak, cached in {path}"


# Cache entries re-measured in this process because a run outdid them: a second implausible MFU (a busy machine,
# or GEMM kernels slower than the convolutions for this dtype) does not cost another measurement.
_REMEASURED: set[str] = set()


def plausible_peak_flops(
    key: str, achieved: float, measure: Callable[[torch.dtype], float] | None = None
) -> tuple[float | None, str]:
    """The CPU GEMM peak to compute MFU from, for a run that achieved `achieved` FLOP/s: (FLOP/s or None, source).

    No run does more matmul/convolution FLOP/s than the machine's peak, so a cached peak below `achieved` (an MFU
    above 100%) is wrong: measured under load (load can only lower a measurement). It is measured again, once per
    process (the cache keeps the larger value). When even the new measurement is below `achieved`, no peak here is
    trustworthy: None, and the source says why, so no MFU above 100% is ever reported."""
    measure = measure or measure_gemm_flops  # looked up now: a test replaces the module's measurement
    value, source = cpu_peak_flops(key, measure)
    if achieved <= value:
        return value, source
    entry, path = _cache_entry(key)
    stale = value
    if f"{path}|{entry}" not in _REMEASURED:
        _REMEASURED.add(f"{path}|{entry}")
        log.warning(
            "The cached CPU GEMM peak (%s, %.1f GFLOP/s) is below the %.1f GFLOP/s a run achieved (MFU above "
            "100%%): measuring it again.",
            key,
            stale / 1e9,
            achieved / 1e9,
        )
        value, _ = cpu_peak_flops(key, measure, refresh=True)
        if achieved <= value:
            return value, (
                f"GEMM peak re-measured now (the cached {stale / 1e9:.1f} GFLOP/s was below the "
                f"{achieved / 1e9:.1f} GFLOP/s achieved), cached in {path}"
            )
    return None, (
        f"no plausible peak: the {key} GEMM peak measured on this CPU ({value / 1e9:.1f} GFLOP/s) is below the "
        f"{achieved / 1e9:.1f} GFLOP/s achieved (a busy machine, or {key} GEMM kernels slower than the "
        "convolutions'), so no MFU is given; `python -m pixelsmith.perf.flops --refresh` on a quiet machine"
    )


def device_peak_flops(device: torch.device, precision: str, override_tflops: float | None = None):
    """(peak FLOP/s or None, precision key, source) for MFU."""
    key = peak_precision_key(precision, device.type)
    if override_tflops:
        return override_tflops * TFLOPS, key, "configured (profiler.peak_tflops)"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        value = gpu_peak_flops(name, key)
        return value, key, f"datasheet dense peak for {name}" if value else f"no peak known for {name}/{key}"
    if device.type == "cpu":
        value, source = cpu_peak_flops(key)
        return value, key, source
    return None, key, f"no peak known for {device.type}"


class _NoModuleTracker:
    """Stands in for FlopCounterMode's ModuleTracker: every FLOP goes to "Global" (the total), no hooks at all.

    The tracker registers a global module forward (pre-)hook that calls `register_multi_grad_hook` on every module
    input and output that requires grad. That raises "Expected gradient function to be set" for a view of a
    parameter taken under `no_grad` (it keeps requires_grad=True but has no grad_fn: StyleGAN2's `const[None]
    .expand(...)` when G makes the fakes for D under no_grad), and its hooks on leaves break `torch.autograd.grad`
    (pytorch#131753: R1's gradient w.r.t. the real images). Attribution to modules is not needed for a total."""

    parents = frozenset({"Global"})
    is_bw = False

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        return None


class TotalFlopCounter(FlopCounterMode):
    """`FlopCounterMode(display=False)` without module attribution: `get_total_flops()` only, safe under no_grad,
    double backward (`autograd.grad(create_graph=True)`), gradient checkpointing and detached tensors."""

    def __init__(self):
        super().__init__(display=False)
        self.mod_tracker = _NoModuleTracker()


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of running `fn()` (forward and any backward it runs), compiled code run eagerly for the count."""
    with _eager(), TotalFlopCounter() as counter:
        fn()
    return int(counter.get_total_flops())


class FlopCounting:
    """Enter/exit pair around one real training iteration (a callback opens it in one hook, closes it in another)."""

    def __init__(self):
        self._counter = TotalFlopCounter()
        self._stance = _eager()
        self.flops: int | None = None

    def start(self) -> None:
        self._stance.__enter__()
        self._counter.__enter__()

    def stop(self) -> int:
        self._counter.__exit__(None, None, None)
        self._stance.__exit__(None, None, None)
        self.flops = int(self._counter.get_total_flops())
        return self.flops


def _eager():
    # FLOPs do not depend on compilation, but a dispatch mode inside a compiled region would force recompiles or
    # miss the ops: run compiled modules eagerly while counting.
    return torch.compiler.set_stance("force_eager")


def main(argv: list[str] | None = None) -> int:
    """`python -m pixelsmith.perf.flops [--refresh]`: print (measure if needed) this CPU's cached GEMM peaks."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--refresh", action="store_true", help="measure again (keeps the larger value)")
    args = parser.parse_args(argv)
    for key in ("fp32", "bf16"):
        value, source = cpu_peak_flops(key, refresh=args.refresh)
        print(f"{key}: {value / 1e9:.1f} GFLOP/s ({source}, {torch.get_num_threads()} threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
