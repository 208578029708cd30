"""torch.compile of a model's networks: what to compile (whole networks or their blocks), in which mode, and
running a compiled network eagerly where its compiled code cannot serve (a double backward).

The core compiles submodules, never the LightningModule: the networks `networks()` names, each in place
(`nn.Module.compile`, so state_dict keys keep their names), with `dynamic=False` (a batch of another size is a static
graph of its own, never a dynamic-shape graph every later iteration would run slower). EMA copies are not compiled:
they only sample and evaluate, at batch sizes of their own, every few hundred iterations.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

BLOCK_RECOMPILE_LIMIT = 128


def compile_units(network: nn.Module, scope: str) -> list[nn.Module]:
    """What to compile of `network`: itself (scope network, or a network that names no blocks), or the blocks its
    `compile_units()` names (scope blocks). Blocks of one class at several resolutions are graphs of their own
    under one code object: Dynamo's recompile limit is raised to hold them all (else the rest would run eagerly)."""
    named = getattr(network, "compile_units", None)
    if scope == "network" or not callable(named):
        return [network]
    units = list(named())
    # Blocks share code objects (one class's forward, or a decorator's wrapper across classes, in G and D alike), and
    # each block compiles twice (trained, and frozen under the other network's phase): far beyond the limit of 8.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, BLOCK_RECOMPILE_LIMIT)
    return units


def compile_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


# torch.compile's modes that capture CUDA graphs of their own (cudagraph trees).
INDUCTOR_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def compile_mode_under_graphs(mode: str, cuda_graphs: bool) -> str:
    """The compile mode to use: under hardware.cuda_graphs the whole iteration is one graph already, and
    reduce-overhead / max-autotune's own CUDA graphs inside it cannot be captured again."""
    replacement = dict(zip(INDUCTOR_CUDA_GRAPH_MODES, ("default", "max-autotune-no-cudagraphs"), strict=True))
    if not cuda_graphs or mode not in replacement:
        return mode
    log.info(
        "hardware.cuda_graphs captures the whole iteration: compile_mode=%s runs as %s (its own CUDA graphs "
        "cannot sit inside ours).",
        mode,
        replacement[mode],
    )
    return replacement[mode]


@contextmanager
def eager(*modules: nn.Module) -> Iterator[None]:
    """Run modules compiled with `nn.Module.compile` uncompiled inside the block (their compiled code is kept for
    after). Only the modules' own compiled entry points are switched off: a compiled sub-module keeps compiling.

    For a phase that differentiates through a gradient (R1, path length): AOTAutograd's compiled backward is not
    itself differentiable ("torch.compile with aot_autograd does not currently support double backward"; the gradient
    from `autograd.grad(create_graph=True)` comes back without a grad_fn). The other phases keep the compiled code; a
    lazy regulariser runs every 4-16 iterations, so eager costs little there."""
    switched = [
        (m, m._compiled_call_impl)
        for module in modules
        for m in module.modules()
        if getattr(m, "_compiled_call_impl", None) is not None
    ]
    for m, _ in switched:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, compiled in switched:
            m._compiled_call_impl = compiled


def compile_networks(
    networks: dict[str, nn.Module], names: list[str], mode: str, cuda_graphs: bool, scope: str
) -> bool:
    """Compile the networks `names` picks, in place; returns whether inductor captures CUDA graphs of its own."""
    if not names:
        return False
    mode = compile_mode_under_graphs(mode, cuda_graphs)
    for name in names:
        net = networks[name]
        units = compile_units(net, scope)
        log.info(
            "Compiling %s (mode=%s, %s)",
            name,
            mode,
            "whole" if units == [net] else f"{len(units)} blocks, each its own graph",
        )
        for unit in units:
            unit.compile(mode=mode, dynamic=False)
    return bool(names) and mode in INDUCTOR_CUDA_GRAPH_MODES


def prepare_networks(core: Any) -> bool:
    """channels_last and compile for the networks of `core` (a LightningModule in set-up); returns whether inductor
    captures CUDA graphs of its own. EMA copies are not compiled (see the module docstring)."""
    from pixelsmith.core.startup import compile_cache_note

    settings = core.core
    if settings.channels_last and core._fsdp is not None:
        # FSDP2 refuses non-contiguous parameters and gathers them contiguous anyway; convolutions still pick NHWC
        # kernels from channels_last inputs (prepare_images), so only the weights stay NCHW.
        log.info("strategy=fsdp: channels_last applies to activations only, weights stay contiguous.")
    networks = core.networks()
    averages = {id(ema.model) for _, ema, _ in core._ema_pairs}
    compiled = [name for name, net in networks.items() if id(net) not in averages] if settings.compile else []
    if compiled:
        core.startup.install()
        if core.global_rank == 0:
            log.info("%s", compile_cache_note(compile_cache_dir(), compiled))
    if settings.channels_last and core._fsdp is None:
        for net in networks.values():
            net.to(memory_format=torch.channels_last)
    return compile_networks(
        networks, compiled, settings.compile_mode, settings.cuda_graphs, settings.compile_scope
    )


def canonical_channels_last(images: torch.Tensor) -> torch.Tensor:
    """A 4-d tensor in channels_last with canonical strides. With one channel, channels_last and contiguous tensors
    address memory alike but differ in the channel stride, which `.contiguous()` leaves as it is: the NHWC view below
    sets it, with no copy and a backward that is a view too (as_strided's is a slow scatter)."""
    images = images.contiguous(memory_format=torch.channels_last)
    n, c, h, w = images.shape
    if images.stride() == (c * h * w, 1, w * c, c) or images.numel() == 0:
        return images
    return images.permute(0, 2, 3, 1).reshape(n, h * w * c).view(n, h, w, c).permute(0, 3, 1, 2)
