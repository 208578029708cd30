"""Throughput and utilisation: images/s averaged over windows, FLOPs per iteration, achieved FLOP/s, MFU, peak memory.

FLOPs are counted once, on a real training iteration (the last warm-up one, so its slower, instrumented step is
not in any average), with `torch.utils.flop_counter.FlopCounterMode`: every matmul/convolution of that iteration,
forward and backward, for every network. Iterations that differ (StyleGAN2's lazy R1 every 16th iteration) are not
in that count, so MFU is slightly understated for them. MFU = achieved FLOP/s per device / peak FLOP/s of the
device at the run's precision (`pixelsmith.perf.flops`). Written every `every_n_steps` iterations as `perf/*`
scalars and at the end as `perf/throughput.json`.
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

from pixelsmith.perf.flops import TFLOPS, FlopCounting, device_peak_flops
from pixelsmith.perf.memory import peak_memory_mb

log = logging.getLogger(__name__)


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
        self.flops_per_iteration: int | None = None
        self.peak_flops: float | None = None
        self.peak_key = ""
        self.peak_source = ""
        self._counting: FlopCounting | None = None
        self._last_end: float | None = None
        self._seen = 0
        self.step_times: list[float] = []
        self._window: list[float] = []
        self.images_per_iteration = 0
        self.summary: dict[str, Any] | None = None

    @property
    def count_at(self) -> int:
        """Index (0-based, counted from the start of this fit) of the iteration whose FLOPs are counted."""
        return max(0, self.warmup_steps - 1)

    def on_train_start(self, trainer, pl_module) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        precision = getattr(getattr(pl_module, "core", None), "precision", "32-true")
        self.peak_flops, self.peak_key, self.peak_source = device_peak_flops(
            device, precision, self.peak_tflops
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.count_flops and self.flops_per_iteration is None and self._seen == self.count_at:
            self._counting = FlopCounting()
            self._counting.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._counting is not None:
            self.flops_per_iteration = self._counting.stop()
            self._counting = None
        now = time.perf_counter()
        index = self._seen
        self._seen += 1
        self.images_per_iteration = int(getattr(pl_module, "images_per_iteration", 0) or 0)
        if self._last_end is not None and index >= self.warmup_steps:
            dt = now - self._last_end
            self._window.append(dt)
            if len(self.step_times) < 100_000:
                self.step_times.append(dt)
        self._last_end = now
        iteration = int(getattr(pl_module, "iteration", index + 1))
        if iteration % self.every_n_steps == 0 and self._window:
            metrics = self._metrics(sum(self._window) / len(self._window), trainer.strategy.root_device)
            self._window = []
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=iteration)

    def _metrics(self, step_s: float, device: torch.device) -> dict[str, float]:
        metrics = {"perf/img_per_s_avg": self.images_per_iteration / step_s, "perf/step_ms": 1000 * step_s}
        if self.flops_per_iteration:
            achieved = self.flops_per_iteration / step_s
            metrics["perf/tflops"] = achieved / TFLOPS
            if self.peak_flops:
                metrics["perf/mfu"] = achieved / self.peak_flops
        for key, value in peak_memory_mb(device).items():
            metrics[f"perf/{key}"] = value
        return metrics

    def on_train_end(self, trainer, pl_module) -> None:
        if self._counting is not None:  # training ended inside the counted iteration
            self._counting.stop()
            self._counting = None
        device = trainer.strategy.root_device
        times = self.step_times
        summary: dict[str, Any] = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": getattr(getattr(pl_module, "core", None), "precision", None),
            "measured_iterations": len(times),
            "warmup_steps": self.warmup_steps,
            "images_per_iteration": self.images_per_iteration,
            "flops_per_iteration": self.flops_per_iteration,
            "flops_counted_at_iteration": self.count_at,
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
            if self.flops_per_iteration:
                achieved = self.flops_per_iteration / mean
                summary["achieved_tflops"] = achieved / TFLOPS
                summary["mfu"] = achieved / self.peak_flops if self.peak_flops else None
                if summary["mfu"] and summary["mfu"] > 1.0:
                    log.warning(
                        "MFU %.0f%% > 100%%: the peak (%s) is too low. On a CPU it was measured under load; "
                        "re-measure on a quiet machine with `python -m pixelsmith.perf.flops --refresh`.",
                        100 * summary["mfu"],
                        self.peak_source,
                    )
        self.summary = summary
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            (self.dirpath / "throughput.json").write_text(json.dumps(summary, indent=2))
            if times and self.flops_per_iteration:
                log.info(
                    "Throughput: %.1f img/s, %.3f TFLOP/s, MFU %s against %s",
                    summary["img_per_s"]["from_mean_step"],
                    summary["achieved_tflops"],
                    f"{100 * summary['mfu']:.1f}%" if summary.get("mfu") else "n/a",
                    self.peak_source,
                )
