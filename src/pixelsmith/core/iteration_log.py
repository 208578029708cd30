"""What the training core logs at a logging iteration, and the values it keeps until then.

An iteration's values (losses, scheduled values, EMA betas) are device tensors; `add` keeps the newest per key, so a
value of some iterations only (R1's `loss/r1`) still reaches the next logging iteration. `metrics` assembles the
logged set: those values, the model's `logging_values()`, the iteration and kimg, skipped files, the guard's
counts, the loss scale, learning rates and gradient norms. The images-per-second rate is averaged over the interval
since the previous log: a steadier progress bar than one iteration's rate.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class IterationLog:
    def __init__(self) -> None:
        self.pending: dict[str, Any] = {}  # the newest value per key since the last log
        self.last_point: tuple[float, int] | None = None  # (perf_counter, images_seen) at the last log

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
        """The logged set, device tensors where the values live on the device; empties the pending values."""
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
        metrics["guard/nonfinite_skipped"] = float(core.nonfinite_skipped)
        metrics["guard/amp_overflow_skipped"] = float(core.amp_overflow_skipped)
        if core.mixed_precision.scaler is not None:
            metrics["amp/scale"] = float(core.mixed_precision.scaler.get_scale())
        for name in core._optimizer_index:
            metrics[f"lr/{name}"] = core._raw_optimizer(name).param_groups[0]["lr"]
        for name, norm in core.stepper.last_grad_norm.items():
            metrics[f"grad_norm/{name}"] = norm
        return metrics
