"""What a model and the training core hand each other: the optimizers a model declares (`OptimizerDefinition`, from
`optimizer_definitions()`) and what one iteration returns (`IterationResult`, from `train_iteration`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class OptimizerDefinition:
    name: str
    params: list[nn.Parameter]
    # an optimizer config node (`_target_`, `_partial_`, lr, betas ...; see core/optim.py) or a partial/callable
    optimizer: Any = None
    lr_scale: float = 1.0  # e.g. lazy regularisation's interval / (interval + 1)
    betas_power: float = 1.0  # lazy regularisation raises Adam betas to this power


@dataclass
class IterationResult:
    """What `train_iteration` returns: images this rank trained on, and device values to log (held until the next
    logging iteration; read by the host only there)."""

    images: int
    logs: dict[str, Any] = field(default_factory=dict)
    # Set by the core: gradient all-reduces this iteration made (a replayed graph makes them without Python).
    grad_allreduce_calls: int = field(default=0, repr=False)
