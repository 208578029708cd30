"""Step-time breakdown: where each training iteration's time goes, region by region.

`StepTimeBreakdown` (a Lightning callback) attaches a `StepTimer` to the module (the core's `self.region(name)`
hook) and wraps the Trainer's profiler in a `LoopClock`, which turns Lightning's own profiling calls into marks:
the loader's `next()` (data wait), the batch-transfer hooks (host-to-device) and `training_step`. One iteration
runs from one `next()` on the loader to the next one, so every millisecond of the loop lands in exactly one row:

    data_wait      waiting for the loader (next(); decode/augment in the main process when num_workers=0)
    h2d            Lightning's batch transfer hooks + the module's `h2d` region (copy, uint8 -> float, layout)
    (the model's)  the regions the model names (`with self.region(name):`), in the order of its `breakdown_regions`
                   (each model module documents its own: forwards, backwards, regularisation, augmentation), then
                   any it did not list, in the order they first appear
    opt_step       all-reduce, unscale, finite check, clipping, optimizer step, zero_grad
    ema            the EMA update at the end of the iteration
    other_in_step  inside training_step but in no region: latents, bookkeeping, `self.log`
    other_loop     outside training_step: Lightning's loop, callbacks, loggers, progress bar

Every `every_n_steps` iterations the window's mean milliseconds and shares go to the loggers
(`perf/ms/<region>`, `perf/share/<region>`); at the end `perf/breakdown.md`, `.csv`, `.json` and `.png` are written.
Iterations before `warmup_steps` are left out (first-step allocations, oneDNN primitive creation, compilation).
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PassThroughProfiler, Profiler

from pixelsmith.perf.plot import Bar, bar_chart
from pixelsmith.perf.timer import (
    DATA_WAIT,
    H2D,
    OTHER_IN_STEP,
    OTHER_LOOP,
    StepTimer,
    measure_overhead,
)

log = logging.getLogger(__name__)

# The loop's regions around the model's own (which come from the module's `breakdown_regions`: general code names no
# model's regions, so a model part can be removed or added without an edit here).
LEADING_REGIONS = [DATA_WAIT, H2D]
TRAILING_REGIONS = ["opt_step", "ema"]
OTHER_LABELS = [OTHER_IN_STEP, OTHER_LOOP]
REGION_TOLERANCE = (
    0.01  # named regions + other must equal the step time within 1% (exact on CPU by construction)
)


class LoopClock(Profiler):
    """A Lightning profiler that forwards everything to the real one and marks the loop's regions on a timer.

    Lightning calls `profiler.start/stop(action)` around the loader's next(), every hook and the strategy's
    training_step: the only public place where the data fetch itself can be timed.
    """

    def __init__(self, timer: StepTimer, inner: Profiler | None = None):
        super().__init__()
        self.timer = timer
        self.inner = inner if inner is not None else PassThroughProfiler()
        self._kinds: dict[str, str] = {}

    def _kind(self, action: str) -> str:
        kind = self._kinds.get(action)
        if kind is None:
            if action.endswith("train_dataloader_next"):
                kind = "fetch"
            elif action.endswith(".on_before_batch_transfer"):
                kind = "transfer_start"
            elif action.startswith("[Strategy]") and action.endswith(".batch_to_device"):
                kind = "transfer_end"
            elif action.startswith("[Strategy]") and action.endswith(".training_step"):
                kind = "step"
            else:
                kind = ""
            self._kinds[action] = kind
        return kind

    def start(self, action_name: str) -> None:
        kind = self._kind(action_name)
        if kind == "fetch":
            self.timer.begin_iteration()
        elif kind == "transfer_start":
            self.timer.set_region(H2D)
        elif kind == "step":
            self.timer.set_region(OTHER_IN_STEP)
        self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        self.inner.stop(action_name)
        kind = self._kind(action_name)
        if kind in ("fetch", "transfer_end", "step"):
            self.timer.set_region(OTHER_LOOP)

    def summary(self) -> str:
        return self.inner.summary()

    def describe(self) -> None:
        self.inner.describe()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        self.inner.setup(stage, local_rank, log_dir)

    def teardown(self, stage: str | None) -> None:
        self.inner.teardown(stage)


def ordered_labels(labels, model_regions: Iterable[str] = ()) -> list[str]:
    """The rows' order: data wait and host-to-device, the model's regions (its `breakdown_regions` first, then any
    other it recorded, in order of appearance), optimizer step and EMA, then the two "other" rows."""
    present = list(dict.fromkeys(labels))
    fixed = LEADING_REGIONS + TRAILING_REGIONS + OTHER_LABELS + ["total"]
    declared = [name for name in dict.fromkeys(model_regions) if name not in fixed]
    head = [name for name in LEADING_REGIONS + declared if name in present]
    middle = [name for name in present if name not in fixed and name not in declared]
    tail = [name for name in TRAILING_REGIONS + OTHER_LABELS if name in present]
    return head + middle + tail


class BreakdownStats:
    """Running sums per label (so a long run keeps O(labels) state) and a bounded sample of step totals."""

    def __init__(self, keep_totals: int = 20_000):
        self.count = 0
        self.sums: dict[str, float] = {}
        self.host_sums: dict[str, float] = {}
        self.totals: list[float] = []
        self.per_label: dict[str, list[float]] = {}
        self.marks = 0
        self.keep = keep_totals

    def add(self, device: dict[str, float], host: dict[str, float], marks: int) -> None:
        self.count += 1
        self.marks += marks
        for label, value in device.items():
            self.sums[label] = self.sums.get(label, 0.0) + value
            if len(self.per_label.setdefault(label, [])) < self.keep:
                self.per_label[label].append(value)
        for label, value in host.items():
            self.host_sums[label] = self.host_sums.get(label, 0.0) + value
        if len(self.totals) < self.keep:
            self.totals.append(device["total"])

    def mean_ms(self, label: str, host: bool = False) -> float:
        sums = self.host_sums if host else self.sums
        return 1000.0 * sums.get(label, 0.0) / max(self.count, 1)

    def median_ms(self, label: str) -> float:
        values = self.per_label.get(label, [])
        # An iteration without the region spent 0 ms in it: pad, so medians describe all iterations.
        padded = values + [0.0] * (min(self.count, self.keep) - len(values))
        return 1000.0 * statistics.median(padded) if padded else 0.0


class StepTimeBreakdown(Callback):
    def __init__(
        self, dirpath: str | Path, every_n_steps: int = 50, warmup_steps: int = 2, write_png: bool = True
    ):
        self.dirpath = Path(dirpath)
        self.every_n_steps = max(1, int(every_n_steps))
        self.warmup_steps = max(0, int(warmup_steps))
        self.write_png = write_png
        self.timer: StepTimer | None = None
        self._clock: LoopClock | None = None
        self.stats = BreakdownStats()
        self.window = BreakdownStats()
        self._resolved = 0
        self.overhead_per_region_s = 0.0
        self.images_per_iteration = 0
        self.summary: dict[str, Any] | None = None
        self.model_regions: tuple[str, ...] = ()

    # ---- attach / detach ----------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        device = trainer.strategy.root_device
        self.model_regions = tuple(getattr(pl_module, "breakdown_regions", ()))
        existing = getattr(pl_module, "_region_timer", None)
        self.timer = StepTimer(device, timing=True, annotate=bool(existing is not None and existing.annotate))
        pl_module._region_timer = self.timer
        self._clock = LoopClock(self.timer, trainer.profiler)
        trainer.profiler = self._clock
        self.overhead_per_region_s = measure_overhead(device)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._clock is not None and trainer.profiler is self._clock:
            trainer.profiler = self._clock.inner
        if getattr(pl_module, "_region_timer", None) is self.timer:
            pl_module._region_timer = None

    # ---- per iteration -----------------------------------------------------------------------------------------
    def _consume(self) -> None:
        assert self.timer is not None
        device, host, marks = self.timer.drain()
        for d, h, m in zip(device, host, marks, strict=True):
            index = self._resolved
            self._resolved += 1
            if index < self.warmup_steps:
                continue
            self.stats.add(d, h, m)
            self.window.add(d, h, m)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.images_per_iteration = int(getattr(pl_module, "images_per_iteration", 0) or 0)
        if trainer.should_stop and self.timer is not None:
            # The last iteration has no next fetch to close it: close it here, before on_train_end's checkpoint
            # writing would be charged to it.
            self.timer.end(close_open=True)
        self._consume()
        iteration = int(getattr(pl_module, "iteration", batch_idx + 1))
        if iteration % self.every_n_steps == 0 and self.window.count:
            self._log_window(trainer, iteration)

    def _log_window(self, trainer, iteration: int) -> None:
        window, self.window = self.window, BreakdownStats()
        total = window.mean_ms("total")
        metrics = {"perf/ms/total": total}
        for label in ordered_labels(window.sums, self.model_regions):
            ms = window.mean_ms(label)
            metrics[f"perf/ms/{label}"] = ms
            metrics[f"perf/share/{label}"] = ms / total if total > 0 else 0.0
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=iteration)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.timer is None:
            return
        self.timer.end(
            close_open=False
        )  # stopped some other way: an unfinished iteration is not a measurement
        self._consume()
        self.summary = self.build_summary()
        if trainer.is_global_zero and self.summary["iterations"]:
            self.write(self.summary)

    # ---- report ------------------------------------------------------------------------------------------------
    def build_summary(self) -> dict[str, Any]:
        stats = self.stats
        total = stats.mean_ms("total")
        rows = []
        for label in ordered_labels(stats.sums, self.model_regions):
            rows.append(
                {
                    "phase": label,
                    "mean_ms": stats.mean_ms(label),
                    "median_ms": stats.median_ms(label),
                    "share": stats.mean_ms(label) / total if total > 0 else 0.0,
                    "host_mean_ms": stats.mean_ms(label, host=True),
                }
            )
        named = sum(r["mean_ms"] for r in rows)
        marks_per_iteration = stats.marks / max(stats.count, 1)
        # Each region is two marks; a mark is half of a measured enter+exit pair.
        overhead_ms = 1000.0 * self.overhead_per_region_s * marks_per_iteration / 2.0
        other = sum(r["mean_ms"] for r in rows if r["phase"] in OTHER_LABELS)
        return {
            "iterations": stats.count,
            "warmup_steps": self.warmup_steps,
            "clock": "cuda events (GPU timeline)" if self.timer and self.timer.cuda else "perf_counter (CPU)",
            "step_mean_ms": total,
            "step_median_ms": 1000.0 * statistics.median(stats.totals) if stats.totals else 0.0,
            "sum_of_phases_ms": named,
            "other_ms": other,
            "other_share": other / total if total > 0 else 0.0,
            "images_per_iteration": self.images_per_iteration,
            "img_per_s": self.images_per_iteration / (total / 1000.0) if total > 0 else 0.0,
            "timer_overhead_us_per_phase": 1e6 * self.overhead_per_region_s,
            "timer_overhead_ms_per_iteration": overhead_ms,
            "timer_overhead_share": overhead_ms / total if total > 0 else 0.0,
            "rows": rows,
        }

    def write(self, summary: dict[str, Any]) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        write_breakdown_csv(self.dirpath / "breakdown.csv", summary)
        (self.dirpath / "breakdown.json").write_text(json.dumps(summary, indent=2))
        (self.dirpath / "breakdown.md").write_text(breakdown_markdown(summary))
        if self.write_png:
            breakdown_png(self.dirpath / "breakdown.png", summary)
        log.info("Step-time breakdown written to %s", self.dirpath / "breakdown.md")


def write_breakdown_csv(path: Path, summary: dict[str, Any]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["phase", "mean_ms", "median_ms", "share", "host_mean_ms"])
        for r in summary["rows"]:
            writer.writerow(
                [
                    r["phase"],
                    f"{r['mean_ms']:.4f}",
                    f"{r['median_ms']:.4f}",
                    f"{r['share']:.5f}",
                    f"{r['host_mean_ms']:.4f}",
                ]
            )
        writer.writerow(
            ["total", f"{summary['step_mean_ms']:.4f}", f"{summary['step_median_ms']:.4f}", "1.0", ""]
        )


def breakdown_markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# Step-time breakdown",
        "",
        f"{summary['iterations']} iterations after {summary['warmup_steps']} warm-up; clock: {summary['clock']}; "
        f"{summary['images_per_iteration']} images per iteration -> {summary['img_per_s']:.1f} img/s.",
        "",
        "| region | mean ms | median ms | share |",
        "|---|---:|---:|---:|",
    ]
    for r in summary["rows"]:
        lines.append(
            f"| {r['phase']} | {r['mean_ms']:.2f} | {r['median_ms']:.2f} | {100 * r['share']:.1f}% |"
        )
    lines += [
        f"| **step** | **{summary['step_mean_ms']:.2f}** | **{summary['step_median_ms']:.2f}** | 100% |",
        "",
        f"other (in step + loop): {summary['other_ms']:.2f} ms = {100 * summary['other_share']:.1f}% of the step.",
        f"Regions sum to {summary['sum_of_phases_ms']:.2f} ms of a {summary['step_mean_ms']:.2f} ms step "
        f"(tolerance {100 * REGION_TOLERANCE:.0f}%).",
        f"Measurement overhead: {summary['timer_overhead_us_per_phase']:.2f} us per region (measured at start) "
        f"-> {1000 * summary['timer_overhead_ms_per_iteration']:.1f} us per iteration "
        f"({100 * summary['timer_overhead_share']:.3f}% of the step).",
        "",
        "How to read it: docs/performance.md#reading-the-breakdown",
        "",
    ]
    return "\n".join(lines)


def breakdown_png(path: Path, summary: dict[str, Any]) -> Path:
    rows = summary["rows"]
    return bar_chart(
        path,
        f"Share of step time ({summary['step_mean_ms']:.1f} ms/step, {summary['iterations']} iterations)",
        [r["phase"] for r in rows],
        [[Bar(100.0 * r["share"]) for r in rows]],
        ["share"],
        value_format="{:.1f}",
        unit="%",
    )
