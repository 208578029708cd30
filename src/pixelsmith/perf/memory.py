"""Memory readings: CUDA allocator peaks, or the process RSS on CPU (current, lifetime peak, resettable peak).

On Linux the kernel keeps a resettable high-water mark of the resident set (VmHWM in /proc/self/status; writing 5
to /proc/self/clear_refs resets it), which is what the RAM-budget batch-size search measures. glibc keeps freed
memory in its arenas, so `release_free_memory()` calls `malloc_trim(0)` first, otherwise a larger earlier trial
would still be resident and inflate the next reading.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys
from pathlib import Path

import torch

try:
    import resource
except ImportError:  # Windows: no getrusage; the process's peak RSS is then not reported
    resource = None

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_mb(key: str) -> float | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def rss_mb() -> float | None:
    """Current resident set size of this process (Linux), MB."""
    return _status_mb("VmRSS")


def process_peak_rss_mb() -> float | None:
    """Peak RSS of this process since it started (getrusage; KB on Linux, bytes on macOS), MB; None on Windows."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def can_reset_peak_rss() -> bool:
    return _CLEAR_REFS.exists() and _status_mb("VmHWM") is not None


def reset_peak_rss() -> None:
    """Reset the kernel's RSS high-water mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    _CLEAR_REFS.write_text("5")


def peak_rss_since_reset_mb() -> float:
    value = _status_mb("VmHWM")
    if value is None:
        raise RuntimeError("/proc/self/status has no VmHWM: measuring a RAM peak needs Linux.")
    return value


def release_free_memory() -> None:
    """Collect garbage, empty the CUDA cache and give glibc's free arenas back to the OS."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    libc_name = ctypes.util.find_library("c")
    if libc_name and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # musl and friends have no malloc_trim
            ctypes.CDLL(libc_name).malloc_trim(0)


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """What the throughput callback logs: CUDA max allocated/reserved on a GPU, process RSS peak/current on CPU."""
    if device.type == "cuda":
        return {
            "peak_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
        }
    current = rss_mb()
    # The kernel updates the high-water mark lazily (when RSS is about to shrink), so the current RSS can be
    # above it for a moment: the peak is the largest of the three readings.
    readings = [r for r in (process_peak_rss_mb(), _status_mb("VmHWM"), current) if r is not None]
    out = {"peak_rss_mb": max(readings)} if readings else {}
    if current is not None:
        out["rss_mb"] = current
    return out
