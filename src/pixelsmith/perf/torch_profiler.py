"""`profiler=torch`: capture a window of training iterations with `torch.profiler` and write, into `<run>/perf/`:

- `trace.json`: a Chrome trace (open in https://ui.perfetto.dev or chrome://tracing). The module's regions
  (G_fwd, D_bwd, opt_step, ...) appear as named ranges, because the region timer wraps each in `record_function`;
- `kernels.txt`: torch's key-averages table, sorted by self device time on a GPU (the CUDA kernels), by self CPU
  time on a CPU (the aten ops and oneDNN primitives);
- `kernels.csv`: the same numbers, machine-readable.

The window is `wait` iterations (skipped: warm-up), `warmup` iterations traced but discarded (the profiler's own
start-up), then `active` recorded iterations. The profiler is stopped right after, so the rest of the run is not
slowed down.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from torch.profiler import ProfilerActivity

from pixelsmith.perf.timer import StepTimer

log = logging.getLogger(__name__)


class TorchProfilerWindow(Callback):
    def __init__(
        self,
        dirpath: str | Path,
        wait: int = 2,
        warmup: int = 1,
        active: int = 3,
        record_shapes: bool = True,
        profile_memory: bool = False,
        with_stack: bool = False,
        row_limit: int = 40,
    ):
        self.dirpath = Path(dirpath)
        self.wait, self.warmup, self.active = max(0, wait), max(0, warmup), max(1, active)
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.row_limit = row_limit
        self._profiler: torch.profiler.profile | None = None
        self._steps = 0
        self._cuda = False
        self.written: list[Path] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        timer = getattr(pl_module, "_region_timer", None)
        if timer is None:
            pl_module._region_timer = StepTimer(trainer.strategy.root_device, timing=False, annotate=True)
        else:
            timer.annotate = True  # a breakdown timer keeps timing and names its regions as well

    def on_train_start(self, trainer, pl_module) -> None:
        self._cuda = trainer.strategy.root_device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=self.wait, warmup=self.warmup, active=self.active, repeat=1
            ),
            on_trace_ready=self._write,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._profiler.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._profiler is None:
            return
        self._profiler.step()
        self._steps += 1
        if self._steps >= self.wait + self.warmup + self.active:
            self._stop()

    def on_train_end(self, trainer, pl_module) -> None:
        if self._profiler is not None and self._steps < self.wait + self.warmup + self.active:
            log.warning(
                "profiler=torch: training ended after %d iterations, inside the capture window (wait %d + warmup %d "
                "+ active %d); the trace holds what was recorded, if anything.",
                self._steps,
                self.wait,
                self.warmup,
                self.active,
            )
        self._stop()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._stop()
        timer = getattr(pl_module, "_region_timer", None)
        if isinstance(timer, StepTimer) and not timer.timing:
            pl_module._region_timer = None

    def _stop(self) -> None:
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.__exit__(None, None, None)

    def _write(self, prof: torch.profiler.profile) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        trace = self.dirpath / "trace.json"
        prof.export_chrome_trace(str(trace))
        sort_by = "self_cuda_time_total" if self._cuda else "self_cpu_time_total"
        averages = prof.key_averages()
        table = averages.table(sort_by=sort_by, row_limit=self.row_limit)
        header = (
            f"torch.profiler kernel summary: {self.active} recorded iterations after {self.wait} skipped and "
            f"{self.warmup} warm-up; sorted by {sort_by}. Times are totals over the recorded iterations.\n\n"
        )
        (self.dirpath / "kernels.txt").write_text(header + table + "\n")
        rows = sorted(
            averages,
            key=lambda e: e.self_device_time_total if self._cuda else e.self_cpu_time_total,
            reverse=True,
        )
        with open(self.dirpath / "kernels.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(
                ["name", "calls", "self_cpu_ms", "cpu_total_ms", "self_device_ms", "device_total_ms", "flops"]
            )
            for e in rows:
                writer.writerow(
                    [
                        e.key,
                        e.count,
                        f"{e.self_cpu_time_total / 1000:.4f}",
                        f"{e.cpu_time_total / 1000:.4f}",
                        f"{e.self_device_time_total / 1000:.4f}",
                        f"{e.device_time_total / 1000:.4f}",
                        e.flops,
                    ]
                )
        self.written = [trace, self.dirpath / "kernels.txt", self.dirpath / "kernels.csv"]
        log.info("profiler=torch: Chrome trace and kernel summary written to %s", self.dirpath)
