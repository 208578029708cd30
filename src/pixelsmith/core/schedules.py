"""Learning-rate schedules driven by the training core's own iteration counter (not Lightning's `global_step`,
which counts every optimizer step: two per GAN iteration, more with lazy regularisation, Lightning #17958)."""

from __future__ import annotations

import math

import torch

from pixelsmith.core.config import SCHEDULES


def lr_multiplier(
    iteration: int, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """Factor applied to the base learning rate after `iteration` completed iterations."""
    if name == "constant":
        return 1.0
    if name != "warmup_cosine":
        raise ValueError(f"schedule.name={name!r} is unknown; choose one of {', '.join(SCHEDULES)}.")
    if warmup_steps > 0 and iteration < warmup_steps:
        # Linear ramp that reaches the base lr exactly at the end of warm-up; never 0 so step 0 still learns.
        return (iteration + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (iteration - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepped once per iteration by the core, so its `last_epoch` equals the iteration counter."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule.name={name!r} is unknown; choose one of {', '.join(SCHEDULES)}.")
    if warmup_steps < 0 or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError("schedule.warmup_steps must be >= 0 and schedule.min_lr_ratio within [0, 1].")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: lr_multiplier(it, name, warmup_steps, total_steps, min_lr_ratio)
    )
