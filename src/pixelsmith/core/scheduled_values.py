"""The hyper-parameters `model.schedules` moves (`model.schedules.lr`, `beta2`, the GAN's `gamma`, `augment_p`, ...):
which names a model takes, their schedules, and writing each iteration's values into the run.

A model offers its targets (`TrainingCore.schedule_targets()`: name -> setter). `ScheduledValues.add` checks the
names a config gives against them, at start-up; `apply` writes every value for the coming iteration, read at the
images seen before it (as R3GAN's training loop): a Python float from the host's exact count in an eager run (no
device read), a device tensor from the device's own count under `hardware.cuda_graphs` (the replay computes it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from pixelsmith.core.config import ScalarScheduleConfig
from pixelsmith.core.schedules import ScalarSchedule
from pixelsmith.errors import PixelsmithError

Setter = Callable[[float | torch.Tensor], None]


class ScheduledValues:
    def __init__(self) -> None:
        self.schedules: dict[str, ScalarSchedule] = {}
        self.setters: dict[str, Setter] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.schedules

    def __bool__(self) -> bool:
        return bool(self.schedules)

    def sets_learning_rate(self, optimizer: str) -> bool:
        """Whether a schedule here writes `optimizer`'s learning rate (then its lr scheduler must not)."""
        return "lr" in self.schedules or f"{optimizer}_lr" in self.schedules

    def sets_betas(self) -> bool:
        return any(key.startswith("beta") or "_beta" in key for key in self.schedules)

    def add(self, schedules: Any, targets: dict[str, Setter], model: str, lr_schedule: str) -> None:
        """Schedule the hyper-parameters `schedules` names (name -> ScalarScheduleConfig node); an unknown name fails
        here with the names `targets` offers, as does an lr schedule beside the `schedule=` group's."""
        schedules = dict(schedules or {})
        if not schedules:
            return
        unknown = sorted(set(schedules) - set(targets))
        if unknown:
            raise PixelsmithError(
                f"model.schedules names {unknown}, which this model ({model}) cannot schedule. It "
                f"schedules: {', '.join(targets)}."
            )
        lr_keys = [key for key in schedules if key == "lr" or key.endswith("_lr")]
        if lr_keys and lr_schedule != "constant":
            raise PixelsmithError(
                f"model.schedules.{lr_keys[0]} and schedule={lr_schedule} would both set the learning "
                "rate: choose one (schedule=constant keeps the model's schedule alone)."
            )
        for name, node in schedules.items():
            self.schedules[name] = ScalarSchedule.from_config(schedule_config(name, node), name)
        self.setters = {name: targets[name] for name in self.schedules}

    def step_lr_schedulers(self, schedulers: dict[str, Any], constant_rate: bool) -> None:
        """Advance each optimizer's lr scheduler by an iteration, except where a schedule here sets its rate. With
        `constant_rate` (a graphed run at a constant rate) a step would refill the learning-rate tensor with its own
        value (kernels every iteration): the count alone advances, as in a stepped scheduler."""
        for name, scheduler in schedulers.items():
            if self.sets_learning_rate(name):
                continue
            if constant_rate:
                scheduler.last_epoch += 1
                scheduler._step_count += 1
            else:
                scheduler.step()

    def apply(self, images_seen: int | torch.Tensor) -> dict[str, Any]:
        """Write every scheduled value for the coming iteration; returns them for the logs."""
        values = {}
        for name, schedule in self.schedules.items():
            value = schedule.value(images_seen)
            self.setters[name](value)
            values[f"schedule/{name}"] = value
        return values


def core_targets(
    optimizers: list[str], set_optimizer: Callable[[list[str], str, float | torch.Tensor], None], emas: list
) -> dict[str, Setter]:
    """The core's own targets: `lr`, `beta1`, `beta2` (every optimizer) and `<optimizer>_lr` / `_beta1` / `_beta2`
    (one), written by `set_optimizer(names, key, value)`; and `ema_half_life_kimg` (every EMA, when there is one)."""
    targets: dict[str, Setter] = {}
    for key in ("lr", "beta1", "beta2"):
        targets[key] = partial(set_optimizer, optimizers, key)
        for name in optimizers:
            targets[f"{name}_{key}"] = partial(set_optimizer, [name], key)
    if emas:

        def set_half_life(value: float | torch.Tensor) -> None:
            for ema in emas:
                ema.set_half_life_kimg(value)

        targets["ema_half_life_kimg"] = set_half_life
    return targets


def set_optimizer_value(
    optimizer: torch.optim.Optimizer,
    name: str,
    key: str,
    value: float | torch.Tensor,
    scaling: tuple[float, float],
) -> None:
    """Write `key` (lr, beta1 or beta2) into every param group of `optimizer` (called `name` in messages), with its
    lazy-regularisation scaling (lr x lr_scale, betas ** betas_power): in place into a device tensor (a graphed
    run's), as a float otherwise."""
    lr_scale, betas_power = scaling
    for group in optimizer.param_groups:
        if key == "lr":
            scaled = value * lr_scale
            if torch.is_tensor(group["lr"]):
                group["lr"].copy_(scaled)
            else:
                group["lr"] = float(scaled)
            continue
        index = 0 if key == "beta1" else 1
        if "betas" not in group:
            raise PixelsmithError(
                f"model.schedules.{key}: optimizer {name} ({type(optimizer).__name__}) has no betas to schedule."
            )
        powered = value**betas_power
        betas = list(group["betas"])
        if torch.is_tensor(betas[index]):
            betas[index].copy_(powered)
        else:
            betas[index] = float(powered)
        group["betas"] = tuple(betas)


def schedule_config(name: str, node: Any) -> ScalarScheduleConfig:
    """`model.schedules.<name>`'s node as a ScalarScheduleConfig, or one paragraph saying what it takes."""
    if isinstance(node, ScalarScheduleConfig):
        return node
    fields = list(ScalarScheduleConfig.__dataclass_fields__)
    given = dict(node) if hasattr(node, "keys") else None
    unknown = sorted(set(given or {}) - set(fields)) if given is not None else []
    if given is None or unknown or "start" not in given:
        raise PixelsmithError(
            f"model.schedules.{name}={node!r} is not a schedule"
            f"{': unknown keys ' + str(unknown) if unknown else ''}. It takes {', '.join(fields)} (start required), "
            f"e.g. +model.schedules.{name}={{start: 2e-4, final: 5e-5, shape: cosine, horizon_kimg: 20000}}."
        )
    return ScalarScheduleConfig(**given)
