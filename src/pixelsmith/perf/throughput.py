"""Throughput and utilisation: images/s averaged over windows, FLOPs per iteration, achieved FLOP/s, MFU, peak memory.

FLOPs are counted on real training iterations with `torch.utils.flop_counter.FlopCounterMode` (without its module
tracker, `pixelsmith.perf.flops.TotalFlopCounter`): every matmul/convolution of the module's `training_step`, forward
and backward (double backward included), for every network; callbacks around the step (sample grids, evaluation) are
outside the count. Iterations come in kinds: "common", "r1" for a GAN's lazy-R1 iterations (every
R1 interval-th, when R1's gamma > 0), and the names of other lazy phases that run (e.g. "Greg"). The common kind is counted on the last warm-up iteration (or the first common
one after it); R1 on the first R1 iteration, iteration 0 of a fresh run, inside the warm-up, unless a network is
compiled (counting runs the step eagerly and would push compilation into the timed window): then on the first R1
iteration after the warm-up (e.g. 16), which is left out of the timed iterations (the counter slows it down; the
step-time breakdown still holds it). Every timed iteration then has a known count, so FLOP/s is exact: the FLOPs of
the timed iterations, each of its kind, over their time. `flops_per_iteration` in throughput.json is that mean over
the timed iterations (lazy R1 included as often as it ran), with the per-kind counts and the amortised long-run
figure beside it. MFU = achieved FLOP/s per device / peak FLOP/s of the device at the run's precision
(`pixelsmith.perf.flops`); a measured CPU peak below the achieved FLOP/s is measured again after training
(`plausible_peak_flops`), so no MFU above 100% is reported against it. Written every `every_n_steps` iterations as
`perf/*` scalars and at the end as `perf/throughput.json`.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from pixelsmith.perf.flops import TFLOPS, FlopCounting, device_peak_flops, plausible_peak_flops
from pixelsmith.perf.memory import peak_memory_mb

log = logging.getLogger(__name__)


def iteration_kind(pl_module) -> str:
    """The kind of the iteration about to run, as the model says (`TrainingCore.iteration_kind()`: "common", or the
    lazy regularisation phases that run in it, e.g. "r1" or "Dreg+Greg"). Each kind's FLOPs are counted once. A module
    without the hook but with `r1_gamma`/`r1_interval` attributes (a fork's own R1 bookkeeping) is read from them."""
    if callable(getattr(pl_module, "iteration_kind", None)):
        return pl_module.iteration_kind()
    iteration = int(getattr(pl_module, "iteration", 0))
    gamma = float(getattr(pl_module, "r1_gamma", 0.0) or 0.0)
    interval = int(getattr(pl_module, "r1_interval", 1) or 1)
    if gamma > 0 and interval > 1 and iteration % interval == 0:
        return "r1"
    return "common"


def _has_compiled(pl_module) -> bool:
    modules = pl_module.modules() if hasattr(pl_module, "modules") else ()
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in modules)


class ThroughputMonitor(Callback):
    def __init__(
        self,
        dirpath: str | Path,
        every_n_steps: int = 50,
        warmup_steps: int = 2,
        peak_tflops: float | None = None,
        count_flops: bool = True,
    ):
        self.dirpath = Path(dirpath)
        self.every_n_steps = max(1, int(every_n_steps))
        self.warmup_steps = max(0, int(warmup_steps))
        self.peak_tflops = peak_tflops
        self.count_flops = count_flops
        self.flops_by_kind: dict[str, int] = {}  # FLOPs of one iteration of each kind ("common", "r1")
        # Index (0-based, from the start of this fit) of the iteration each count was taken on.
        self.flops_counted_at: dict[str, int] = {}
        self.peak_flops: float | None = None
        self.peak_key = ""
        self.peak_source = ""
        self.r1_interval: int | None = None
        self._kind = "common"
        self._counted_now = False
        self._wrapped = None
        self._last_end: float | None = None
        self._seen = 0
        self.step_times: list[float] = []
        self._window: list[tuple[float, int | None]] = []
        self._timed_seconds = 0.0
        self._timed_flops = 0
        self._timed_flops_known = True
        self._timed_by_kind: dict[str, int] = {}
        self.images_per_iteration = 0
        self.summary: dict[str, Any] | None = None

    @property
    def count_at(self) -> int:
        """Index (0-based, counted from the start of this fit) of the iteration whose FLOPs are counted."""
        return max(0, self.warmup_steps - 1)

    @property
    def flops_per_iteration(self) -> float | None:
        """Mean FLOPs of the timed iterations (each counted for its kind); before any, the common iteration's."""
        timed = sum(self._timed_by_kind.values())
        if timed and self._timed_flops_known:
            mean = self._timed_flops / timed
            return int(mean) if mean == int(mean) else mean
        return self.flops_by_kind.get("common")

    def on_train_start(self, trainer, pl_module) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        precision = getattr(getattr(pl_module, "core", None), "precision", "32-true")
        self.peak_flops, self.peak_key, self.peak_source = device_peak_flops(
            device, precision, self.peak_tflops
        )
        if callable(getattr(pl_module, "lazy_interval", None)):
            self.r1_interval = pl_module.lazy_interval()  # None when no lazy phase runs
        elif float(getattr(pl_module, "r1_gamma", 0.0) or 0.0) > 0:
            self.r1_interval = int(getattr(pl_module, "r1_interval", 1) or 1)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._kind = iteration_kind(pl_module)
        self._counted_now = False
        if self.count_flops and self._kind not in self.flops_by_kind and self._due(pl_module):
            self._count_next_training_step(pl_module, self._kind)

    def _due(self, pl_module) -> bool:
        """Count the common iteration at the last warm-up one; an R1 iteration from there on, or earlier in the
        warm-up (iteration 0 of a fresh run) when no network is compiled: counting runs the step eagerly, which
        with compiled networks would push their compilation into the timed iterations."""
        if self._seen >= self.count_at:
            return True
        return self._kind != "common" and not _has_compiled(pl_module)

    def _count_next_training_step(self, pl_module, kind: str) -> None:
        """Count the FLOPs of this iteration's `training_step` only: the module's method is wrapped for one call
        (Lightning looks it up on the instance at each step), so hooks of other callbacks (a sample grid, an FID
        evaluation at the end of the batch) are not in the count."""
        step = pl_module.training_step

        def counted_training_step(*args, **kwargs):
            self._unwrap()
            counting = FlopCounting()
            counting.start()
            try:
                out = step(*args, **kwargs)
            except BaseException:
                counting.stop()
                raise
            self.flops_by_kind[kind] = counting.stop()
            self.flops_counted_at[kind] = self._seen
            self._counted_now = True
            return out

        pl_module.training_step = counted_training_step
        self._wrapped = pl_module

    def _unwrap(self) -> None:
        if self._wrapped is not None and "training_step" in vars(self._wrapped):
            del self._wrapped.training_step
        self._wrapped = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._unwrap()  # a step that did not run (skipped batch) leaves no wrapper behind
        now = time.perf_counter()
        index = self._seen
        self._seen += 1
        self.images_per_iteration = int(getattr(pl_module, "images_per_iteration", 0) or 0)
        # A counted iteration ran under the FLOP counter (slower): it is never timed.
        if self._last_end is not None and index >= self.warmup_steps and not self._counted_now:
            dt = now - self._last_end
            flops = self.flops_by_kind.get(self._kind)
            self._window.append((dt, flops))
            if len(self.step_times) < 100_000:
                self.step_times.append(dt)
            self._timed_seconds += dt
            self._timed_by_kind[self._kind] = self._timed_by_kind.get(self._kind, 0) + 1
            if flops is None:
                self._timed_flops_known = False
            else:
                self._timed_flops += flops
        self._last_end = now
        iteration = int(getattr(pl_module, "iteration", index + 1))
        if iteration % self.every_n_steps == 0 and self._window:
            metrics = self._metrics(self._window, trainer.strategy.root_device)
            self._window = []
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=iteration)

    def _metrics(self, window: list[tuple[float, int | None]], device: torch.device) -> dict[str, float]:
        seconds = sum(dt for dt, _ in window)
        step_s = seconds / len(window)
        metrics = {"perf/img_per_s_avg": self.images_per_iteration / step_s, "perf/step_ms": 1000 * step_s}
        if self.count_flops and all(flops for _, flops in window):
            achieved = sum(flops for _, flops in window) / seconds
            metrics["perf/tflops"] = achieved / TFLOPS
            # Above 100% the peak is wrong (a CPU's measured under load): no scalar mid-run, where measuring again
            # would stall training; throughput.json gets the checked figure at the end.
            if self.peak_flops and (achieved <= self.peak_flops or not self._peak_is_measured(device)):
                metrics["perf/mfu"] = achieved / self.peak_flops
        for key, value in peak_memory_mb(device).items():
            metrics[f"perf/{key}"] = value
        return metrics

    def on_train_end(self, trainer, pl_module) -> None:
        self._unwrap()
        device = trainer.strategy.root_device
        times = self.step_times
        summary: dict[str, Any] = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": getattr(getattr(pl_module, "core", None), "precision", None),
            "measured_iterations": len(times),
            "warmup_steps": self.warmup_steps,
            "images_per_iteration": self.images_per_iteration,
            "flops_per_iteration": self.flops_per_iteration,
            "flops_counted_at_iteration": self.flops_counted_at.get("common"),
            "flops_by_iteration_kind": {
                kind: {"flops": flops, "counted_at_iteration": self.flops_counted_at[kind]}
                for kind, flops in self.flops_by_kind.items()
            },
            "timed_iterations_by_kind": dict(self._timed_by_kind),
            "r1_interval": self.r1_interval,
            "flops_per_iteration_amortised": self._amortised(),
            "peak_tflops": self.peak_flops / TFLOPS if self.peak_flops else None,
            "peak_precision": self.peak_key,
            "peak_source": self.peak_source,
            "memory": peak_memory_mb(device),
        }
        if times:
            median = statistics.median(times)
            mean = sum(times) / len(times)
            summary.update(
                step_ms={
                    "median": 1000 * median,
                    "mean": 1000 * mean,
                    "min": 1000 * min(times),
                    "max": 1000 * max(times),
                },
                img_per_s={
                    "from_median_step": self.images_per_iteration / median,
                    "from_mean_step": self.images_per_iteration / mean,
                },
            )
            if self.flops_per_iteration and self._timed_flops_known:
                achieved = self._timed_flops / self._timed_seconds
                # Rank 0 alone measures (it writes throughput.json): ranks measuring at once share the cores.
                remeasure = trainer.is_global_zero and self._peak_is_measured(device)
                if self.peak_flops and achieved > self.peak_flops and remeasure:
                    self.peak_flops, self.peak_source = plausible_peak_flops(self.peak_key, achieved)
                    summary["peak_tflops"] = self.peak_flops / TFLOPS if self.peak_flops else None
                    summary["peak_source"] = self.peak_source
                summary["achieved_tflops"] = achieved / TFLOPS
                summary["mfu"] = achieved / self.peak_flops if self.peak_flops else None
                if summary["mfu"] and summary["mfu"] > 1.0 and not self._peak_is_measured(device):
                    log.warning(
                        "MFU %.0f%% > 100%%: the peak (%s) is below what the run achieved; check "
                        "profiler.peak_tflops or the GPU's entry in pixelsmith/perf/flops.py GPU_PEAK_FLOPS.",
                        100 * summary["mfu"],
                        self.peak_source,
                    )
        self.summary = summary
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            (self.dirpath / "throughput.json").write_text(json.dumps(summary, indent=2))
            if summary.get("achieved_tflops"):
                log.info(
                    "Throughput: %.1f img/s, %.3f TFLOP/s, MFU %s against %s",
                    summary["img_per_s"]["from_mean_step"],
                    summary["achieved_tflops"],
                    f"{100 * summary['mfu']:.1f}%" if summary.get("mfu") else "n/a",
                    self.peak_source,
                )

    def _peak_is_measured(self, device: torch.device) -> bool:
        """The peak is this CPU's cached GEMM measurement (not a datasheet figure, not profiler.peak_tflops)."""
        return device.type == "cpu" and not self.peak_tflops

    def _amortised(self) -> float | None:
        """Long-run mean FLOPs per iteration with lazy R1 (one R1 iteration in every r1_interval), when both kinds
        were counted; the common count without lazy R1."""
        common = self.flops_by_kind.get("common")
        if common is None or not self.r1_interval or self.r1_interval < 2:
            return common
        r1 = self.flops_by_kind.get("r1")
        return None if r1 is None else common + (r1 - common) / self.r1_interval
