"""What the training core logs at a logging iteration, and how it reads those values without making the GPU wait.

An iteration's values (losses, scheduled values, EMA betas) are device tensors; `add` keeps the newest per key, so a
value of some iterations only (R1's `loss/r1`) still reaches the next logging iteration. `metrics` assembles the
logged set: those values, the model's `logging_values()`, the iteration and kimg, skipped files, the guard's counts,
the loss scale, learning rates and gradient norms. The images-per-second rate is averaged over the interval since the
previous log: a steadier progress bar than one iteration's rate.

Reading a device value makes the host wait for every kernel queued before it, and the GPU then idles while the host
logs: on an H200 a logging iteration of a graphed DCGAN took 19 ms against 0.6 ms for the others. So a logging
iteration only *stages* its values (`stage`): the device ones are stacked into one tensor, copied into a pinned host
buffer with `non_blocking=True`, and an event is recorded after the copy. The next logging iteration `read`s them,
one interval later, when the event is long complete: the loggers, `metrics.csv`, the progress bar and the report get
the same values at the same logger step as an immediate read would give, one interval later. The last iteration
reads its own values at once (`read` of a freshly staged set waits, as the end of a run may).

The non-finite guard's counters ride along (`GUARD_KEYS`): a streak that reaches the limit is seen at the logging
iteration after the one that staged it, within two intervals of the streak's end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

# The guard's device state staged with the logged values: [guard events, fp16 overflows] and each optimizer's trip.
GUARD_COUNTS = "_guard/counts"
GUARD_TRIPS = "_guard/trips"


@dataclass
class StagedLog:
    """One logging iteration's values on their way to the host."""

    iteration: int
    step: int  # the loggers' step for this iteration (Lightning's count of batches that stepped)
    epoch: int
    host: dict[str, float] = field(default_factory=dict)  # values already on the host
    layout: list[tuple[str, int]] = field(default_factory=list)  # (key, element count) in the buffer's order
    buffer: torch.Tensor | None = None  # the device values' copy (pinned host memory on CUDA)
    event: Any = None  # recorded after the copy on CUDA; None where the copy is synchronous

    def read(self) -> dict[str, Any]:
        """The values as Python numbers (a guard entry as a list). Waits for the copy only if it is not done yet:
        never, one interval after staging."""
        if self.event is not None:
            self.event.synchronize()
        values: dict[str, Any] = dict(self.host)
        if self.buffer is not None:
            flat = self.buffer.tolist()
            offset = 0
            for key, count in self.layout:
                part = flat[offset : offset + count]
                values[key] = part if key in (GUARD_COUNTS, GUARD_TRIPS) else part[0]
                offset += count
        return values


class IterationLog:
    def __init__(self) -> None:
        self.pending: dict[str, Any] = {}  # the newest value per key since the last log
        self.last_point: tuple[float, int] | None = None  # (perf_counter, images_seen) at the last log
        self.staged: StagedLog | None = None  # the previous logging iteration's values, read at the next
        self._pinned: dict[tuple[int, torch.device], list[torch.Tensor]] = {}
        self._flip = 0

    def add(self, logs: dict[str, Any]) -> None:
        self.pending.update(logs)

    def start(self, images_seen: int) -> None:
        """The first iteration ended: img/s counts from here."""
        self.last_point = (time.perf_counter(), images_seen)

    def rate(self, images_seen: int) -> float | None:
        """Images per second since the previous log (None before the first); starts the next interval."""
        now = time.perf_counter()
        rate = None
        if self.last_point is not None:
            last_time, last_images = self.last_point
            rate = (images_seen - last_images) / max(now - last_time, 1e-9)
        self.last_point = (now, images_seen)
        return rate

    def metrics(self, core: Any) -> dict[str, Any]:
        """The logged set of the TrainingCore `core`, device tensors where the values live on the device (nothing
        here reads the device); empties the pending values."""
        metrics: dict[str, Any] = {**self.pending, **core.logging_values()}
        self.pending = {}
        metrics["train/iteration"] = float(core.iteration)
        metrics["train/kimg"] = core.images_seen / 1000.0
        datamodule = core._trainer.datamodule if core._trainer is not None else None
        # Files the datamodule's set-up check left out (distinct, the same on every rank) ...
        left_out = int(getattr(datamodule, "skipped_file_count", 0))
        if torch.is_tensor(core.skipped_files) or left_out:
            # ... plus substitutions for files that broke later: each rank reads its own files, so those are summed
            # (one scalar all-reduce per log).
            total = torch.as_tensor(core.skipped_files, device=core.device).detach().float().clone()
            core.world_all_reduce(total)
            metrics["data/skipped_files"] = total + left_out
        guard = core._guard_state()
        metrics["guard/nonfinite_skipped"] = guard["counts"][0]
        metrics["guard/amp_overflow_skipped"] = guard["counts"][1]
        metrics[GUARD_COUNTS] = guard["counts"]
        metrics[GUARD_TRIPS] = guard["trips"]
        scaler = core.mixed_precision.scaler
        if scaler is not None:
            scale = scaler._get_scale_async()  # the device tensor (get_scale() would wait for it)
            metrics["amp/scale"] = scaler.get_scale() if scale is None else scale
        for name in core._optimizer_index:
            metrics[f"lr/{name}"] = core._raw_optimizer(name).param_groups[0]["lr"]
        for name, norm in core.stepper.last_grad_norm.items():
            metrics[f"grad_norm/{name}"] = norm
        return metrics

    def stage(self, metrics: dict[str, Any], iteration: int, step: int, epoch: int) -> StagedLog:
        """Start copying `metrics`' device values to the host; nothing waits."""
        staged = StagedLog(iteration, step, epoch)
        device_values = []
        for key, value in metrics.items():
            if torch.is_tensor(value) and value.device.type != "cpu":
                flat = value.detach().reshape(-1)
                staged.layout.append((key, flat.numel()))
                device_values.append(flat)
            elif torch.is_tensor(value):
                staged.layout.append((key, value.numel()))
                device_values.append(value.detach().reshape(-1))
            else:
                staged.host[key] = value
        if not device_values:
            return staged
        device = device_values[0].device
        # float64 holds the counters exactly; an Apple GPU has no float64.
        dtype = torch.float32 if device.type == "mps" else torch.float64
        # One concatenation (it promotes mixed dtypes itself) and at most one cast: not a cast kernel per value.
        stacked = torch.cat([v.to(device=device) for v in device_values]).to(dtype)
        if device.type == "cuda":
            buffer = self._pinned_buffer(stacked.numel(), device)
            buffer.copy_(stacked, non_blocking=True)
            staged.event = torch.cuda.Event()
            staged.event.record()
            staged.buffer = buffer
        elif device.type == "cpu":
            staged.buffer = stacked  # a new tensor, on the host already
        else:
            staged.buffer = stacked.cpu()  # an Apple GPU: its copy waits anyway
        return staged

    def log(self, core: Any, last: bool) -> None:
        """A logging iteration of the TrainingCore `core`: stage its values and hand the previous logging
        iteration's to the loggers; the last iteration hands over its own too."""
        metrics = self.metrics(core)
        rate = self.rate(core.images_seen)
        if rate is not None:
            metrics["img/s"] = rate
        loop = core.trainer.fit_loop.epoch_loop
        staged = self.stage(metrics, core.iteration, loop._batches_that_stepped, core.trainer.current_epoch)
        previous, self.staged = self.staged, (None if last else staged)
        if previous is not None:
            self.hand_over(core, previous, to_callbacks=not last)
        if last:
            self.hand_over(core, staged, to_callbacks=True)

    @staticmethod
    def hand_over(core: Any, staged: StagedLog, to_callbacks: bool) -> None:
        """A staged set to the loggers at its own step, to the progress bar and callbacks (`callback_metrics`), and
        its guard counters to the guard's check (which may stop the run, naming the iteration of the streak)."""
        values = staged.read()
        counts, trips = values.pop(GUARD_COUNTS), values.pop(GUARD_TRIPS)
        core.trainer._logger_connector.log_metrics({**values, "epoch": staged.epoch}, step=staged.step)
        if to_callbacks:
            # Host tensors, straight into the dicts behind `trainer.callback_metrics` and `progress_bar_metrics`.
            # Through `self.log` each value would pass Lightning's result collection (moved, synced and converted
            # again at every batch end): about 0.5 ms a value on a CPU core, most of a logging iteration's host
            # time, for numbers that are final already.
            connector = core.trainer._logger_connector
            connector._callback_metrics.update(
                {key: torch.tensor(value, dtype=torch.float64) for key, value in values.items()}
            )
            if "img/s" in values:
                connector._progress_bar_metrics["img/s"] = float(values["img/s"])
        core.guard.check_values(counts, trips, core.iteration)

    def _pinned_buffer(self, size: int, device: torch.device) -> torch.Tensor:
        # Two buffers per size, alternating: the one staged last interval is still to be read while this one fills.
        buffers = self._pinned.get((size, device))
        if buffers is None:
            buffers = [torch.empty(size, dtype=torch.float64).pin_memory() for _ in range(2)]
            self._pinned[(size, device)] = buffers
        self._flip = 1 - self._flip
        return buffers[self._flip]
