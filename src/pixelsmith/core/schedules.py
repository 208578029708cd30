"""Schedules of scalar hyper-parameters, and the learning-rate multiplier of the `schedule` group built on them.

`ScalarSchedule` moves one value from `start` to `final` over `horizon` units (images in `model.schedules`, whose
unit is kimg; iterations in the `schedule` group), optionally after a linear warm-up from `warmup_start`, along one
of three shapes, then stays at `final`. It is R3GAN's `cosine_decay_with_warmup` (`brownvc/R3GAN`,
`training/training_loop.py`) generalised to three shapes: the horizon counts from 0 and includes the warm-up, and the
value is read at the count *before* an iteration runs.

`value()` takes a Python number or a device tensor and computes the same formula with the same operations on
either: the host evaluates it from its exact count in an eager run (no device read), and a CUDA-graph replay
evaluates it on the device from the device's own count (nothing the host computed is baked into the graph).

The `schedule` group (`schedule=warmup_cosine`: every optimizer's lr, driven by the iteration counter, which is not
Lightning's `global_step`: that counts every optimizer step, Lightning #17958) is one use: a LambdaLR whose
multiplier is a ScalarSchedule from 1 to `min_lr_ratio` over `total_steps` iterations, warming up from 1/warmup so the
first iteration still learns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from pixelsmith.core.config import SCHEDULE_SHAPES, SCHEDULES, ScalarScheduleConfig
from pixelsmith.errors import PixelsmithError


@dataclass(frozen=True)
class ScalarSchedule:
    """start -> final over `horizon` units (counted from 0, warm-up included), then final. shape: constant (start
    throughout, after any warm-up), linear, or cosine (half a cosine period). warmup > 0: the value climbs linearly
    from `warmup_start` at 0 to `start` at `warmup`."""

    start: float
    final: float
    shape: str = "cosine"
    horizon: float = 1.0
    warmup: float = 0.0
    warmup_start: float = 0.0

    def __post_init__(self):
        if self.shape not in SCHEDULE_SHAPES:
            raise PixelsmithError(
                f"schedule shape {self.shape!r} is unknown: choose one of {', '.join(SCHEDULE_SHAPES)}."
            )
        if self.warmup < 0 or (self.shape != "constant" and self.horizon <= self.warmup):
            raise PixelsmithError(
                f"A {self.shape} schedule needs 0 <= warmup ({self.warmup:g}) < horizon ({self.horizon:g}): the "
                "horizon counts from 0 and includes the warm-up."
            )

    @classmethod
    def from_config(cls, config: ScalarScheduleConfig, name: str) -> ScalarSchedule:
        """A `model.schedules.<name>` node (kimg) as a schedule in images."""
        final = config.start if config.final is None else config.final
        if config.shape != "constant" and config.horizon_kimg is None:
            raise PixelsmithError(
                f"model.schedules.{name}: a {config.shape} schedule needs horizon_kimg (the thousands of images over "
                f"which it moves from start to final), e.g. model.schedules.{name}.horizon_kimg=20000."
            )
        try:
            return cls(
                float(config.start),
                float(final),
                str(config.shape),
                float(config.horizon_kimg or 0.0) * 1000.0,
                float(config.warmup_kimg) * 1000.0,
                float(config.warmup_start),
            )
        except PixelsmithError as error:
            raise PixelsmithError(f"model.schedules.{name}: {error}") from None

    def value(self, count: float | Tensor) -> float | Tensor:
        """The value after `count` units (images or iterations): a float for a number, a 0-dim float64 tensor on the
        count's device for a tensor (float64 so both give the same number)."""
        is_tensor = isinstance(count, Tensor)
        n = count.double() if is_tensor else float(count)
        if self.shape == "constant":
            decayed = n * 0.0 + self.start if is_tensor else self.start
        else:
            progress = (n - self.warmup) / (self.horizon - self.warmup)
            progress = progress.clamp(0.0, 1.0) if is_tensor else min(1.0, max(0.0, progress))
            if self.shape == "linear":
                fraction = progress
            else:
                cos = torch.cos(progress * math.pi) if is_tensor else math.cos(progress * math.pi)
                fraction = 0.5 * (1.0 - cos)
            decayed = self.start + (self.final - self.start) * fraction
            # Past the horizon exactly `final` (start + (final - start) * 1 can be an ulp off), as the reference.
            decayed = (
                torch.where(progress >= 1.0, self.final, decayed)
                if is_tensor
                else (self.final if progress >= 1.0 else decayed)
            )
        if self.warmup <= 0:
            return decayed
        ramp = self.warmup_start + (self.start - self.warmup_start) * (n / self.warmup)
        if is_tensor:
            return torch.where(n < self.warmup, ramp, decayed)
        return ramp if n < self.warmup else decayed


def lr_multiplier(
    iteration: int, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """Factor applied to the base learning rate after `iteration` completed iterations (the `schedule` group)."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule.name={name!r} is unknown; choose one of {', '.join(SCHEDULES)}.")
    return float(_lr_schedule(name, warmup_steps, total_steps, min_lr_ratio).value(iteration))


def _lr_schedule(name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> ScalarSchedule:
    if name == "constant":
        return ScalarSchedule(1.0, 1.0, "constant")
    # Warm-up from 1/warmup (never 0: the first iteration still learns); the horizon at least one decay iteration.
    return ScalarSchedule(
        1.0,
        min_lr_ratio,
        "cosine",
        horizon=max(total_steps, warmup_steps + 1),
        warmup=warmup_steps,
        warmup_start=1.0 / warmup_steps if warmup_steps > 0 else 0.0,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepped once per iteration by the core, so its `last_epoch` equals the iteration counter."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule.name={name!r} is unknown; choose one of {', '.join(SCHEDULES)}.")
    if warmup_steps < 0 or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError("schedule.warmup_steps must be >= 0 and schedule.min_lr_ratio within [0, 1].")
    schedule = _lr_schedule(name, warmup_steps, total_steps, min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: float(schedule.value(it)))
