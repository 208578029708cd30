"""Fully sharded data parallel for multi-network models: FSDP2 (`fully_shard`) per network, manual optimization.

Lightning's FSDPStrategy expects one optimizer and automatic optimization, and refuses a CPU accelerator (#19685).
Here every network a TrainingCore lists in `networks()` (GAN: G, D and the EMA copy of G) becomes its own FSDP2
unit on one 1-D device mesh, in `TrainingCore.configure_model`; a model can split a network further into per-block
units with `TrainingCore.shard_units`. Each parameter is sharded on dim 0 over the ranks whatever the unit grouping,
so the EMA copy's shards line up with G's and the EMA lerp runs shard-locally with no communication.

What the training core does differently under this strategy (see `TrainingCore.loss_backward` and `.step`):
- gradients are reduce-scattered (averaged) by FSDP2 during the backward of the last micro-batch; the micro-steps
  before it run with `set_requires_gradient_sync(False)`, so accumulation costs no communication. The core no
  longer all-reduces sharded gradients, only the non-finite flag (and any unsharded parameter);
- the gradient norm for clipping and the finite check is the global norm (DTensor reductions);
- phases that differentiate through a gradient (R1) keep the weights gathered through the double backward
  (`TrainingCore.keep_unsharded`): FSDP2 would otherwise free them after the first backward.
BatchNorm statistics and other buffers are not sharded by FSDP2; the core averages them once per iteration as
under DDP.

Checkpoints are the same plain, unsharded format as single-process and DDP runs (`state_dict` of full tensors,
optimizer states keyed by parameter index), gathered onto rank 0 with torch.distributed.checkpoint's full-state
API; so `last.ckpt` loads with `torch.load` on one process, and a run can resume across strategies (fsdp <-> ddp
<-> one process). Loading is the reverse: every rank reads the file (as Lightning does for any strategy) and
torch.distributed.checkpoint scatters rank 0's copy of each tensor into the shards.

Why DDPStrategy as the base and not ModelParallelStrategy: ModelParallelStrategy builds a 2-D (data x tensor) mesh,
re-keys full optimizer states by the index of each parameter in the *whole* LightningModule (so D's optimizer
state would not line up with a DDP or single-process checkpoint, and a DDP checkpoint's D state would be loaded
onto G's parameters), and is experimental. DDPStrategy brings the process launch, process group, barrier and
reduce that MultiNetworkDDPStrategy already uses; the FSDP-specific parts are the few overrides below.

Costs: each network is materialised whole on every rank once at start-up (moved to the device and broadcast from
rank 0 before sharding), so start-up peak memory is one full model per rank; during training each rank holds 1/N
of the parameters, gradients and Adam states plus one gathered network (or one gathered block with
`shard_units`) at a time. On CPU (gloo) this strategy exists to test the code path; it saves memory only on GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

log = logging.getLogger(__name__)


class MultiNetworkFSDPStrategy(DDPStrategy):
    strategy_name = "pixelsmith_fsdp"

    def __init__(self, reshard_after_forward: bool = True, **kwargs: Any):
        """`reshard_after_forward=False` keeps each network gathered from forward to backward (ZeRO-2-like: fewer
        all-gathers, more memory); True (ZeRO-3) frees it after forward and gathers it again in backward."""
        super().__init__(**kwargs)
        self.reshard_after_forward = reshard_after_forward
        self._device_mesh: DeviceMesh | None = None

    @property
    def device_mesh(self) -> DeviceMesh:
        if self._device_mesh is None:
            raise RuntimeError("The FSDP device mesh exists only after the process group is set up.")
        return self._device_mesh

    def setup_environment(self) -> None:
        super().setup_environment()  # process group
        self._device_mesh = init_device_mesh(
            self.root_device.type, (self.world_size,), mesh_dim_names=("data_parallel",)
        )

    # ---- sharding (called from TrainingCore.configure_model) -------------------------------------------------
    def shard_networks(self, module: nn.Module) -> None:
        """Shard each of `module.networks()` (and the units `module.shard_units` names inside it) over all ranks."""
        networks = module.networks()
        if all(isinstance(net, FSDPModule) for net in networks.values()):
            return  # configure_model runs again on a second fit(); the networks are sharded already
        # fully_shard keeps each rank's own slice of its own copy: make every copy rank 0's first, as DDP's
        # constructor does (same seeds make them equal already; this makes it a guarantee).
        module.to(self.root_device)
        _sync_module_states(module)
        for name, net in networks.items():
            units = list(module.shard_units(name, net))
            for unit in units:
                fully_shard(unit, mesh=self.device_mesh, reshard_after_forward=self.reshard_after_forward)
            fully_shard(net, mesh=self.device_mesh, reshard_after_forward=self.reshard_after_forward)
            log.info(
                "FSDP: %s sharded over %d ranks as %d unit(s), %d parameters",
                name,
                self.world_size,
                len(units) + 1,
                sum(p.numel() for p in net.parameters()),
            )

    def configure_ddp(self) -> None:
        # Nothing to wrap: the networks were sharded (and synchronised) in configure_model.
        pass

    @contextmanager
    def keep_unsharded(self, *modules: nn.Module) -> Iterator[None]:
        """Keep the gathered weights of `modules` after backward until the block ends: a double backward (R1,
        path length) still needs them after `autograd.grad(create_graph=True)`'s backward. Gradients are still
        reduce-scattered as usual; the cost is holding the gathered network for the phase."""
        units = [m for module in modules for m in module.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.set_reshard_after_backward(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_backward(True, recurse=False)

    # ---- checkpoints: plain full tensors on rank 0, the same format as DDP and single-process runs ------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Collective: every rank takes part; with cpu_offload only rank 0 receives the tensors (others get {}).
        return get_model_state_dict(
            self.lightning_module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        # Every rank has read the whole file; each sharded tensor is scattered from rank 0's copy (distribute_tensor).
        set_model_state_dict(
            self.lightning_module,
            checkpoint["state_dict"],
            options=StateDictOptions(full_state_dict=True, strict=strict),
        )

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        if not optimizer.state:
            # Never stepped (every step so far skipped): nothing to gather. Not get_optimizer_state_dict, which
            # would "initialise" the state with a zero step that advances Adam's step counter.
            return optimizer.state_dict()
        state = get_optimizer_state_dict(
            self.lightning_module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return fqn_keyed_to_plain(state) if self.is_global_zero else {}

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        names = {id(p): name for name, p in self.lightning_module.named_parameters()}
        for optimizer, saved in zip(self.optimizers, checkpoint["optimizer_states"], strict=True):
            if not saved["state"]:
                optimizer.load_state_dict(saved)  # hyper-parameters only
                continue
            set_optimizer_state_dict(
                self.lightning_module,
                optimizer,
                plain_to_fqn_keyed(saved, optimizer, names),
                options=StateDictOptions(full_state_dict=True),
            )
            # The round trip turns tuples (Adam's betas) into lists; keep the hyper-parameters exactly as saved.
            for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
                group.update({k: v for k, v in saved_group.items() if k != "params"})

    def teardown(self) -> None:
        # As ModelParallelStrategy: the sharded networks stay where they are (no move of DTensors to the CPU).
        assert self.cluster_environment is not None
        assert self.accelerator is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


def fqn_keyed_to_plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """torch.distributed.checkpoint's optimizer state (keyed by parameter name) -> `Optimizer.state_dict()` format
    (keyed by the parameter's position across the optimizer's param groups), which is what every other strategy
    writes. The param groups keep the optimizer's parameter order, so position i is the optimizer's i-th parameter."""
    plain_state: dict[int, Any] = {}
    groups = []
    index = 0
    for group in state["param_groups"]:
        ids = []
        for name in group["params"]:
            if name in state["state"]:
                plain_state[index] = state["state"][name]
            ids.append(index)
            index += 1
        groups.append({**group, "params": ids})
    return {"state": plain_state, "param_groups": groups}


def plain_to_fqn_keyed(
    saved: Mapping[str, Any], optimizer: torch.optim.Optimizer, names: Mapping[int, str]
) -> dict[str, Any]:
    """The reverse of `fqn_keyed_to_plain` for `optimizer`: saved position i -> the name of the optimizer's i-th
    parameter (the same positional matching `Optimizer.load_state_dict` does)."""
    current = [p for group in optimizer.param_groups for p in group["params"]]
    saved_count = sum(len(g["params"]) for g in saved["param_groups"])
    if saved_count != len(current):
        raise ValueError(
            f"The checkpoint's optimizer has {saved_count} parameters but this model's has {len(current)}: "
            "the checkpoint was written by a different model configuration."
        )
    saved_ids = [pid for group in saved["param_groups"] for pid in group["params"]]
    name_of = {pid: names[id(param)] for pid, param in zip(saved_ids, current, strict=True)}
    state = {name_of[pid]: value for pid, value in saved["state"].items()}
    groups = [{**g, "params": [name_of[pid] for pid in g["params"]]} for g in saved["param_groups"]]
    return {"state": state, "param_groups": groups}
