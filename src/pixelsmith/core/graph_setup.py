"""Deciding, at the start of training, whether a run's iterations can be replayed as CUDA graphs, and preparing the
optimizers for it (`hardware.cuda_graphs`). The rules a model follows to qualify are in `core/graphs.py`'s
docstring; `CudaGraphSetup.blockers` names each one a run breaks, at start-up.

Also decided there from the same hooks: whether Lightning's `manual_backward` would do anything but `loss.backward()`
(`lightning_backward_is_inert`); where it would not, the core skips its hook dispatch, a fixed host cost per backward.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, Strategy
from torch.nn.parallel import DistributedDataParallel

from pixelsmith.core.graphs import IterationGraphs
from pixelsmith.core.host_reads import host_reads_allowed

log = logging.getLogger(__name__)

# Lightning calls these from inside `manual_backward`, i.e. inside a captured iteration: a replay would skip them.
HOOKS_INSIDE_THE_STEP = ("on_before_backward", "on_after_backward")


def classes_with_backward_hooks(core: Any) -> list[str]:
    """The model's and callbacks' class names that override a hook Lightning calls around every backward."""
    return [
        type(obj).__name__
        for obj, base in [(core, L.LightningModule), *((c, L.Callback) for c in core.trainer.callbacks)]
        for hook in HOOKS_INSIDE_THE_STEP
        if getattr(type(obj), hook) is not getattr(base, hook)
    ]


def lightning_backward_is_inert(core: Any) -> bool:
    """Whether `core.manual_backward(loss)` would do exactly `loss.backward()`: the base precision plugin (the core
    runs mixed precision itself, so the Trainer's is always 32-true), a strategy whose backward hooks act on nothing
    here (single device, or the core's DDP without a DistributedDataParallel wrapper), no model or callback hook
    around the backward, and a model that overrides neither `backward` nor `manual_backward`. Lightning's dispatch
    through those hooks costs tens of microseconds of host time a backward: an eager GPU loop at small sizes is bound
    by exactly that kind of time."""
    strategy = core.trainer.strategy
    base_pre, base_post = Strategy.pre_backward, Strategy.post_backward
    strategy_inert = (
        type(strategy).backward is Strategy.backward
        and type(strategy).pre_backward in (base_pre, DDPStrategy.pre_backward)
        and type(strategy).post_backward in (base_post, DDPStrategy.post_backward)
        # DDPStrategy's hooks act on a DistributedDataParallel wrapper only (the core's DDP has none).
        and not isinstance(strategy.model, DistributedDataParallel)
    )
    return (
        strategy_inert
        and type(strategy.precision_plugin) is Precision
        and type(core).backward is L.LightningModule.backward
        and type(core).manual_backward is L.LightningModule.manual_backward
        and core._fabric is None
        and not classes_with_backward_hooks(core)
    )


class CudaGraphSetup:
    """Reads a started run (its model, optimizers, strategy, profiler and callbacks) and gives it its graphs."""

    def __init__(self, core: Any):
        self.core = core

    def blockers(self) -> list[str]:
        """Why this run cannot replay its iterations as CUDA graphs (empty: it can). CPU is no blocker: there the
        graphed iteration's code runs uncaptured."""
        core = self.core
        reasons = []
        if not core.supports_cuda_graphs:
            reasons.append(f"{type(core).__name__} declares no iteration plan (supports_cuda_graphs = False)")
        if core._fsdp is not None:
            reasons.append("strategy=fsdp gathers and frees weights inside the iteration")
        if core._region_timer is not None:
            reasons.append("a profiler (profiler=breakdown|torch) times the phases on the host")
        unfused = [
            name for name in core._optimizer_index if not core._raw_optimizer(name).defaults.get("fused")
        ]
        if unfused:
            reasons.append(
                f"optimizer(s) {unfused} are not fused (hardware.optimizer_impl=fused): the host decides their "
                "skipped steps"
            )
        hooked = classes_with_backward_hooks(core)
        if hooked:
            reasons.append(
                f"{', '.join(sorted(set(hooked)))} run(s) code in {' / '.join(HOOKS_INSIDE_THE_STEP)}, which a "
                "replayed graph would skip"
            )
        return reasons

    def start(self, wanted: bool) -> IterationGraphs | None:
        """The run's graphs (None: it launches eagerly, saying why when graphs were asked for), with what the host
        changes between iterations (the learning rates, scheduled betas) moved into device tensors the graphs read,
        or back to floats for an eager run."""
        core = self.core
        graphs = None
        if wanted:
            blockers = self.blockers()
            if blockers:
                log.warning(
                    "hardware.cuda_graphs=true, but this run launches its kernels eagerly: %s. Set "
                    "hardware.cuda_graphs=false to silence this.",
                    "; ".join(blockers),
                )
            else:
                capture = core.device.type == "cuda"
                if not capture:
                    log.info(
                        "hardware.cuda_graphs: no CUDA device, so nothing is captured; the graphed iteration's code "
                        "runs uncaptured (static batch buffer, learning rates and counters on the device)."
                    )
                graphs = IterationGraphs(capture=capture)
        graphed = graphs is not None
        # CUDA's fused Adam computes in float32 and CPU's in float64, so each device's tensor dtype gives the float's
        # update (float32 on an Apple GPU too: MPS has no float64).
        dtype = torch.float64 if core.device.type == "cpu" else torch.float32
        for name in core._optimizer_index:
            for group in core._raw_optimizer(name).param_groups:
                # A graph reads the learning rate from a tensor the schedule fills (a float would be baked into it);
                # an eager run keeps floats (a checkpoint of a graphed run may bring tensors along).
                with host_reads_allowed():
                    value = float(group["lr"]) if torch.is_tensor(group["lr"]) else group["lr"]
                group["lr"] = torch.full((), value, dtype=dtype, device=core.device) if graphed else value
                if "capturable" in group:
                    group["capturable"] = graphed and graphs.capture
                if "betas" in group and core.scheduled.sets_betas():
                    # Scheduled betas are written inside the replay too: device tensors there, floats otherwise.
                    with host_reads_allowed():
                        betas = [float(b) if torch.is_tensor(b) else b for b in group["betas"]]
                    group["betas"] = tuple(
                        torch.full((), b, dtype=dtype, device=core.device) if graphed else b for b in betas
                    )
                    if graphed and graphs.capture and group.get("fused"):
                        # CUDA's fused Adam takes its betas as host floats (`_fused_adam_` has a tensor-lr overload
                        # only): a capture would bake the first value in. Capturable foreach Adam reads tensors.
                        group["fused"], group["foreach"] = False, True
                        log.info(
                            "Scheduled betas under CUDA graphs: optimizer %s steps with foreach Adam.", name
                        )
        return graphs
