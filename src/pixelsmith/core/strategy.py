"""Data-parallel strategy for multi-network models: processes over NCCL/gloo, no DistributedDataParallel wrapper.

Lightning's DDP wraps the whole LightningModule, so a GAN's D step leaves G's parameters unused and DDP errors
(Lightning #20328); `find_unused_parameters=True` hides that at the cost of a graph walk every backward. Like
StyleGAN2-ADA, Pixelsmith instead all-reduces each optimizer's gradients once, in one flat buffer, right before
that optimizer steps (`TrainingCore.step`). Consequences, by construction: no unused-parameter error, and no
communication at all on accumulation micro-steps (no `no_sync` needed). The cost: the all-reduce is not overlapped
with the backward pass as DDP's bucketed hooks are (measured in docs/performance.md when on GPU).
"""

from __future__ import annotations

from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.strategies import DDPStrategy


class MultiNetworkDDPStrategy(DDPStrategy):
    strategy_name = "pixelsmith_ddp"

    def configure_ddp(self) -> None:
        # Same starting weights on every rank (what DDP's constructor would have broadcast), then no wrapper.
        _sync_module_states(self.model)
