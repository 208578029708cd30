"""What every benchmark here shares: composing the real config tree with the outputs in a chosen dir and without the
main job's time budget, `IterationClock`, the callback that stamps the end of every training iteration of a template
run, `require_every_iteration`, the check that a run trained every iteration a benchmark times, and `KernelProfile`,
which profiles a few iterations after the timed window: where a window's time went, kernel by kernel.

A template run names the clock as a config entry (`cfg.callbacks.bench_clock`, `CLOCK_TARGET`), so Hydra
instantiates it like any other callback; the benchmark reads the class-level lists after `pixelsmith.run.fit.run`.
"""

from __future__ import annotations

import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from pixelsmith.errors import PixelsmithError

CLOCK_TARGET = "benchmarks.harness.IterationClock"
PROFILE_TARGET = "benchmarks.harness.KernelProfile"
# The main job's wall-clock budget (`train.time_budget_minutes`, 4.5 min in conf/train.yaml) ends a run at the first
# iteration past it; on a slow CPU a benchmark run would then stop inside its timed window. Every config composed
# here starts with this override, so a benchmark trains all max_steps; an explicit budget later in the overrides
# still wins (and `require_every_iteration` names it when it cuts a run short).
NO_TIME_BUDGET = "train.time_budget_minutes=null"


def synchronize_device() -> None:
    """Wait for every kernel queued on the GPU (nothing to wait for without one)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def window_edges(warmup: int, steps: int) -> frozenset[int]:
    """The iterations (1-based) whose end clock reading opens and closes a timed window of `steps` iterations after
    `warmup`: there the clock waits for the device, so the window holds the work it launched and finished, not
    only what the host queued (a replayed graph returns long before its kernels end)."""
    return frozenset({warmup, warmup + steps})


class IterationClock(Callback):
    """Wall clock and process CPU time at the end of every training iteration (class-level, read by the bench
    child after run()). At the iterations in `synchronize_after` (1-based; `window_edges`) it synchronises the
    device before reading the clock."""

    ends: list[float] = []
    cpu_ends: list[float] = []
    synchronize_after: frozenset[int] = frozenset()

    def on_train_start(self, trainer, pl_module) -> None:
        IterationClock.ends = []
        IterationClock.cpu_ends = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if len(IterationClock.ends) + 1 in IterationClock.synchronize_after:
            synchronize_device()
        IterationClock.ends.append(time.perf_counter())
        IterationClock.cpu_ends.append(time.process_time())


class Profiling:
    """torch.profiler (CUDA's kernels too where a GPU runs) and cProfile (the host's Python) over the same iterations,
    summarised per iteration by `stop` (`profile_summary`). The device is synchronised before both stop, so every
    kernel launched is in the profile."""

    def __init__(self, iterations: int):
        import cProfile

        import torch
        from torch.profiler import ProfilerActivity, profile

        self.iterations = iterations
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        self.torch_profile = profile(activities=activities)
        self.python_profile = cProfile.Profile()
        self.started = 0.0

    def start(self) -> None:
        self.torch_profile.__enter__()
        self.python_profile.enable()
        self.started = time.perf_counter()

    def discard(self) -> None:
        """Stop both profilers without a summary (a run that ended before the last profiled iteration): another
        profiler, a user's or the next run's, could not start while they run."""
        self.python_profile.disable()
        self.torch_profile.__exit__(None, None, None)

    def stop(self) -> dict:
        # cProfile first: the wait for the device below is not the host's Python time.
        self.python_profile.disable()
        synchronize_device()
        wall = time.perf_counter() - self.started
        self.torch_profile.__exit__(None, None, None)
        summary = profile_summary(self.torch_profile, self.iterations)
        summary["wall_ms_per_iteration"] = 1e3 * wall / self.iterations  # profiled: slower than the window
        summary["python_top"] = python_summary(self.python_profile, self.iterations)
        return summary


def profiled(iterations: int, step) -> dict:
    """Run `step()` `iterations` times under `Profiling` and summarise them."""
    profiling = Profiling(iterations)
    profiling.start()
    for _ in range(iterations):
        step()
    return profiling.stop()


def profile_summary(prof, iterations: int, top: int = 8) -> dict:
    """Per iteration: the device's kernel time and kernel count (a replayed graph's kernels included), or, on a
    CPU, the host's operator time and count; and the `top` kernels (operators) by time. A time per iteration far
    above what the clock saw means work the clock did not wait for; two kinds' kernel counts compare their
    bookkeeping on the device itself."""
    from torch.autograd import DeviceType

    events = prof.key_averages()
    # Kernels and copies only: record_function ranges (an optimizer's step, a compiled graph's call) also come back
    # as CUDA events, spanning their kernels; torch's own table leaves them out the same way.
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    on_device = bool(kernels)
    rows = kernels if on_device else [e for e in events if e.device_type == DeviceType.CPU]

    def micros(e) -> float:
        return e.self_device_time_total if on_device else e.self_cpu_time_total

    rows.sort(key=micros, reverse=True)
    return {
        "timed": "device kernels" if on_device else "host operators",
        "ms_per_iteration": sum(micros(e) for e in rows) / 1e3 / iterations,
        "count_per_iteration": sum(e.count for e in rows) / iterations,
        "top": [
            {"name": e.key[:100], "calls": e.count / iterations, "us": micros(e) / iterations}
            for e in rows[:top]
        ],
    }


def python_summary(profile, iterations: int, top: int = 15) -> list[dict]:
    """The host's costliest functions per iteration, by time spent in each itself (cProfile's tottime), with their
    time including callees: where an eager iteration's host time goes, Lightning's loop, the core or torch."""
    import pstats

    stats = pstats.Stats(profile).stats
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return [
        {
            "function": f"{_short_path(path)}:{line}({name})",
            "calls": calls / iterations,
            "self_us": 1e6 * own / iterations,
            "total_us": 1e6 * total / iterations,
        }
        for (path, line, name), (_, calls, own, total, _) in rows
    ]


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "src/", "lib/python"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


class KernelProfile(Callback):
    """Profiles the template's iterations `first` .. `first + count - 1` (1-based; class-level, set by the bench
    child before `run()`, read after it as `summary`) with `Profiling`."""

    first = 0
    count = 0
    summary: dict | None = None
    _profiling: Profiling | None = None
    _seen = 0

    def on_train_start(self, trainer, pl_module) -> None:
        KernelProfile.discard()
        KernelProfile.summary, KernelProfile._seen = None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        KernelProfile._seen += 1
        if KernelProfile._seen == KernelProfile.first and KernelProfile.count:
            KernelProfile._profiling = Profiling(KernelProfile.count)
            KernelProfile._profiling.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        profiling = KernelProfile._profiling
        if profiling is not None and KernelProfile._seen == KernelProfile.first + KernelProfile.count - 1:
            KernelProfile._profiling = None
            KernelProfile.summary = profiling.stop()

    def on_exception(self, trainer, pl_module, exception) -> None:
        KernelProfile.discard()

    @staticmethod
    def discard() -> None:
        """Stop profiling that is still on (the run ended inside the profiled iterations), keeping no summary."""
        profiling, KernelProfile._profiling = KernelProfile._profiling, None
        if profiling is not None:
            profiling.discard()


def compose(overrides: list[str], output_dir: Path):
    """The training config as `train.py` composes it (the repository's `conf/`, the typed schemas), without the main
    job's time budget (`NO_TIME_BUDGET`, before `overrides`) and with `paths.output_dir` set to `output_dir`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from pixelsmith.config.paths import CONF_DIR
    from pixelsmith.config.schema import register_configs
    from pixelsmith.hardware.settings import register_detected_profile

    register_configs()
    register_detected_profile()  # what `hardware=auto` composes
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=[NO_TIME_BUDGET, *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
    return cfg


class RunEndedEarly(PixelsmithError):
    """A benchmark's template run trained fewer iterations than the benchmark times."""


def require_every_iteration(metrics: dict, expected: int) -> None:
    """Stop with the cause when a template run (`metrics`: what `pixelsmith.run.fit.run` returned) ended before
    `expected` iterations: its timed window would be short, and a figure from it would be wrong."""
    trained = int(metrics.get("iteration", 0))
    if trained >= expected:
        return
    reason = metrics.get("stop_reason")
    if reason == "time_budget":
        minutes = metrics.get("train/time_budget_minutes")
        at_stop = metrics.get("train/minutes_at_stop")
        cause = (
            f"its time budget ended it (train.time_budget_minutes={minutes}"
            + (f", reached after {at_stop:.2f} min" if at_stop is not None else "")
            + "). Benchmarks compose their runs with train.time_budget_minutes=null, so this budget came from an "
            "override you gave (--override or a tool's own list): remove it, or make it longer than the run"
        )
    elif reason == "preempted":
        cause = (
            "a signal stopped it (train.preemption.signals: SIGTERM, SIGUSR1, SIGUSR2; a scheduler's preemption or "
            "a kill). Run the benchmark again where nothing signals it"
        )
    else:
        cause = (
            f"training ended by itself (stop reason {reason!r}). Check the overrides for one that ends training "
            "early (max_steps, a resumed checkpoint through ckpt_path or train.auto_resume in a reused run dir)"
        )
    raise RunEndedEarly(
        f"The benchmark's template run stopped at iteration {trained} of {expected}, so its timed iterations are "
        f"missing: {cause}."
    )
