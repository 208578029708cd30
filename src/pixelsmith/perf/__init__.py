"""Performance toolkit of a training run: step-time breakdown, throughput/MFU/memory, torch.profiler windows, auto
batch size (the hardware switches are part of the run's hardware settings:
`pixelsmith.hardware.settings.apply_hardware`). The benchmarks (`bench.py`, the plain loop) live outside the package, in `benchmarks/`.
See docs/performance.md.

`pixelsmith.run.fit.run` calls the three functions below; nothing here runs unless the config asks for it
(`profiler=breakdown|torch`, `auto_batch.enabled=true`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

# Imports stay inside the functions: `python -m pixelsmith.perf.numa` must not pay for torch before it execs.
if TYPE_CHECKING:
    from omegaconf import DictConfig

    from pixelsmith.hardware.settings import HardwareSettings


def prepare_run(cfg: DictConfig, hardware: HardwareSettings) -> None:
    """Before data and model, after `pixelsmith.hardware.settings.apply_hardware` set the hardware settings' switches: (if enabled) search the
    batch size, which rewrites `cfg.data.batch_size` (and the lrs with `auto_batch.scale_lr`)."""
    from pixelsmith.perf.batch_size import choose_batch_size

    choose_batch_size(cfg, hardware, hardware.memory_fraction)


def build_callbacks(cfg: DictConfig) -> list:
    """The profiler group's callbacks: breakdown, throughput, torch.profiler window (writing to <run>/perf)."""
    p = cfg.get("profiler")
    if not p:
        return []
    from pixelsmith.perf.breakdown import StepTimeBreakdown
    from pixelsmith.perf.throughput import ThroughputMonitor
    from pixelsmith.perf.torch_profiler import TorchProfilerWindow

    dirpath = Path(cfg.paths.output_dir) / "perf"
    every = p.every_n_steps or cfg.train.log_every_n_steps
    callbacks: list = []
    if p.breakdown:
        callbacks.append(StepTimeBreakdown(dirpath, every, p.warmup_steps))
    if p.throughput:
        callbacks.append(ThroughputMonitor(dirpath, every, p.warmup_steps, p.peak_tflops))
    if p.torch:
        callbacks.append(
            TorchProfilerWindow(
                dirpath,
                wait=p.torch_wait,
                warmup=p.torch_warmup,
                active=p.torch_active,
                record_shapes=p.record_shapes,
                profile_memory=p.profile_memory,
                with_stack=p.with_stack,
            )
        )
    return callbacks


__all__ = ["build_callbacks", "prepare_run"]
