"""Performance toolkit: step-time breakdown, throughput/MFU/memory, torch.profiler windows, switches, auto batch size
and the benchmark behind `bench.py`. See docs/performance.md.

`pixelsmith.train.run` calls the three functions below; nothing here runs unless the config asks for it
(`profiler=breakdown|torch`, `auto_batch.enabled=true`, `hardware.optimizer_impl=...`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

# Imports stay inside the functions: `python -m pixelsmith.perf.numa` must not pay for torch before it execs.
if TYPE_CHECKING:
    from omegaconf import DictConfig

    from pixelsmith.hardware import RuntimePlan
    from pixelsmith.perf.switches import PerfSwitches


def prepare_run(cfg: DictConfig, plan: RuntimePlan) -> PerfSwitches:
    """Before data and model: resolve and apply the memory switches, then (if enabled) search the batch size,
    which rewrites `cfg.data.batch_size` (and the lrs with `auto_batch.scale_lr`)."""
    from pixelsmith.perf.batch_size import choose_batch_size
    from pixelsmith.perf.switches import apply_switches, resolve_switches

    switches = resolve_switches(cfg.hardware, plan)
    apply_switches(switches, plan)
    choose_batch_size(cfg, plan, switches.memory_fraction)
    return switches


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
