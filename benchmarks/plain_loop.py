"""The GAN iteration written as a plain PyTorch loop: the yardstick for the template's overhead in `bench.py`.

Same networks (instantiated from the same composed config, same seed), the same objective object
(`pixelsmith.gan.objectives`: its phase table and losses, so this loop cannot drift from the template's), same
batch, precision (autocast dtype, a GradScaler for fp16), memory format, compilation, optimizer and implementation,
lazy regularisation and generator EMA (the same `EMA` arithmetic) as `GANModule` — and nothing else: no Lightning
loop, no callbacks, no logging, no non-finite guard, no gradient-norm computation, no per-iteration reseeding, no
micro-batches. What the template does on top of this is what the benchmark's overhead ratio measures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader

from pixelsmith.core.compile import eager
from pixelsmith.core.ema import EMA
from pixelsmith.core.optim import build_optimizer, optimizer_factory
from pixelsmith.core.precision import AUTOCAST_DTYPES
from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.module import build_objective
from pixelsmith.gan.objectives import GANBatch, GANObjective, Phase
from pixelsmith.hardware.settings import HardwareSettings


@dataclass
class PlainGAN:
    """The objective's phases run by hand; implements `pixelsmith.gan.objectives.GANLoop` for the objective."""

    G: nn.Module
    D: nn.Module
    objective: GANObjective
    ema: EMA | None
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    dtype: torch.dtype | None
    device: torch.device
    channels_last: bool
    z_dim: int
    iteration: int = 0
    images_seen: int = 0

    # ---- GANLoop ---------------------------------------------------------------------------------------------
    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    def G_forward(self, z: torch.Tensor, *conditions: torch.Tensor, grad: bool = True) -> torch.Tensor:
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()), self.autocast():
            return self.G(z, *conditions)

    def D_forward(self, images: torch.Tensor, *conditions: torch.Tensor, reals: bool = False) -> torch.Tensor:
        with self.autocast():
            return self.D(images, *conditions)

    def loss_scale(self) -> torch.Tensor | float:
        return self.scaler.scale(torch.ones((), device=self.device)) if self.scaler is not None else 1.0

    def mean_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    # ---- the iteration ---------------------------------------------------------------------------------------------
    def _backward_step(self, loss: torch.Tensor, opt: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(opt)
            self.scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)

    def _phase(self, phase: Phase, reals: torch.Tensor, draw: int = 0) -> None:
        trained, frozen = (self.G, self.D) if phase.network == "G" else (self.D, self.G)
        frozen.requires_grad_(False)
        trained.requires_grad_(True)
        inputs = self.objective.sample_inputs(phase, GANBatch(reals, draw=draw), self.z_dim)
        # As GANModule.run_phase: one autocast region per main phase; eager networks where a phase differentiates
        # a gradient (a compiled backward is not differentiable).
        with eager(trained) if phase.double_backward else self.autocast():
            loss = self.objective.loss(phase, self, inputs).loss
        self._backward_step(loss * phase.interval, self.opt_g if phase.network == "G" else self.opt_d)
        frozen.requires_grad_(True)

    def step(self, images: torch.Tensor, phase_names: tuple[str, ...] | None = None) -> None:
        """One iteration: the objective's phases due at this iteration, or exactly `phase_names` (a captured graph
        fixes its phase set)."""
        reals = images.to(self.device, non_blocking=True).float().mul_(1.0 / 127.5).sub_(1.0)
        if self.channels_last:
            reals = reals.contiguous(memory_format=torch.channels_last)
        phases = self.objective.phases()
        if phase_names is None:
            phases = [p for p in phases if p.runs_at(self.iteration)]
        else:
            phases = [p for p in phases if p.name in phase_names]
        for phase in phases:
            for draw in range(
                phase.repeats
            ):  # as GANModule: a repeated phase (WGAN-GP's critic) on its own draws
                self._phase(phase, reals, draw)
        images = self.objective.images_per_iteration(reals.shape[0])
        self.images_seen += images
        if self.ema is not None:
            self.ema.update(self.G, images, self.images_seen)
        self.iteration += 1

    def phase_sets(self) -> list[tuple[str, ...]]:
        """The distinct phase sets over one cycle of the lazy intervals, in the order of first use; the cycle's
        length is the product of the intervals' lcm."""
        phases = self.objective.phases()
        cycle = math.lcm(*(p.interval for p in phases))
        sets: list[tuple[str, ...]] = []
        for iteration in range(cycle):
            names = tuple(p.name for p in phases if p.runs_at(iteration))
            if names not in sets:
                sets.append(names)
        return sets


def build_plain_gan(
    cfg: DictConfig, hardware: HardwareSettings, optimizer_impl: str, capturable: bool = False
) -> PlainGAN:
    device = torch.device("cuda" if hardware.accelerator == "cuda" else "cpu")
    model = cfg.model
    G = instantiate(model.generator).to(device)
    D = instantiate(model.discriminator).to(device)
    objective = build_objective(model.objective).to(device)
    if hardware.channels_last:
        G.to(memory_format=torch.channels_last)
        D.to(memory_format=torch.channels_last)
    ema = EMA(G, model.ema.half_life_kimg, model.ema.rampup) if model.ema.enabled else None
    if hardware.compile:
        G.compile(mode=hardware.compile_mode)
        D.compile(mode=hardware.compile_mode)

    def optimizer(params, node: DictConfig, network: str) -> torch.optim.Optimizer:
        factory = optimizer_factory(
            OmegaConf.to_container(node, resolve=True), f"model.{network.lower()}_optimizer"
        )
        if (
            capturable
        ):  # CUDA-graph capture needs the optimizer's step counts on the device (`StaticGraphStep`)
            factory.keywords["capturable"] = True
        ratio = objective.lazy_ratio(network)
        return build_optimizer(factory, list(params), ratio, ratio, optimizer_impl)

    dtype = AUTOCAST_DTYPES[hardware.precision]
    return PlainGAN(
        G=G,
        D=D,
        objective=objective,
        ema=ema,
        opt_g=optimizer(G.parameters(), model.g_optimizer, "G"),
        opt_d=optimizer(D.parameters(), model.d_optimizer, "D"),
        scaler=torch.amp.GradScaler(device.type) if hardware.precision == "16-mixed" else None,
        dtype=dtype,
        device=device,
        channels_last=hardware.channels_last,
        z_dim=int(G.z_dim),
    )


def plain_loader(cfg: DictConfig, hardware: HardwareSettings) -> Iterable[torch.Tensor]:
    """The same dataset and loader settings as the template's datamodule, with a plain shuffling sampler; with
    `data.on_device` (MNIST) the images live on the device and each epoch is a device-side permutation, as a user
    who keeps a small dataset on the GPU would write it."""
    from pixelsmith.run.build import build_datamodule

    datamodule = build_datamodule(cfg, hardware)
    datamodule.setup("fit")
    batch_size = int(cfg.data.batch_size or hardware.batch_size)
    images = getattr(datamodule.train_set, "images", None)
    if datamodule.on_device and isinstance(images, torch.Tensor):
        return _DeviceEpochs(images.to("cuda" if hardware.accelerator == "cuda" else "cpu"), batch_size)
    workers = datamodule.num_workers
    return DataLoader(
        datamodule.train_set,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=datamodule.pin_memory,
        persistent_workers=datamodule.persistent_workers and workers > 0,
        prefetch_factor=datamodule.prefetch_factor if workers > 0 else None,
    )


class _DeviceEpochs:
    """One shuffled epoch of full batches per iteration over a tensor that already lives on the device."""

    def __init__(self, images: torch.Tensor, batch_size: int):
        self.images, self.batch_size = images, batch_size

    def __iter__(self) -> Iterator[torch.Tensor]:
        order = torch.randperm(self.images.shape[0], device=self.images.device)
        for start in range(0, self.images.shape[0] - self.batch_size + 1, self.batch_size):
            yield self.images.index_select(0, order[start : start + self.batch_size])


def endless(loader: Iterable) -> Iterator[torch.Tensor]:
    while True:
        for batch in loader:
            yield batch[0] if isinstance(batch, list | tuple) else batch


def run_plain(
    gan: PlainGAN | GraphedPlainGAN,
    loader: Iterable,
    iterations: int,
    synchronize_after: frozenset[int] = frozenset(),
) -> tuple[list[float], list[float]]:
    """Run `iterations` iterations; returns perf_counter and process_time at the end of each (the template's
    clock takes the same readings), synchronising the device first after the iterations in `synchronize_after`
    (1-based, `harness.window_edges`)."""
    from benchmarks.harness import synchronize_device

    ends, cpu_ends = [], []
    batches = endless(loader)
    for done in range(1, iterations + 1):
        gan.step(next(batches))
        if done in synchronize_after:
            synchronize_device()
        ends.append(time.perf_counter())
        cpu_ends.append(time.process_time())
    return ends, cpu_ends


class StaticGraphStep:
    """One training step over a static input buffer, captured once as a CUDA graph and replayed every iteration.

    The pattern of PyTorch's "whole network capture": warm-up iterations on a side stream (cuDNN autotuning,
    optimizer state, lazy initialisation), gradients set to None before capture so backward allocates them from the
    graph's private pool, then `torch.cuda.graph`. Each call copies the batch into the static buffer (so the caller
    may reuse its tensor at once) and replays. Random latents stay fresh per replay: CUDA's generator advances its
    Philox offset for captured graphs. `capture=False` runs the same step eagerly on the same static buffer: the
    code path CPU tests check.
    """

    def __init__(self, step, example: torch.Tensor, capture: bool, warmup_steps: int = 3):
        self.step = step
        self.static_images = example.detach().clone()
        self.graph: torch.cuda.CUDAGraph | None = None
        if capture:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup_steps):
                    step(self.static_images)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                step(self.static_images)

    def __call__(self, images: torch.Tensor) -> None:
        self.static_images.copy_(images, non_blocking=True)
        if self.graph is None:
            self.step(self.static_images)
        else:
            self.graph.replay()


class GraphedPlainGAN:
    """The plain GAN iteration as CUDA graphs, one per distinct phase set of the objective (e.g. without and with
    lazy R1, StyleGAN2-ADA's Dreg, every `interval` iterations), each over its own static batch buffer. The EMA's beta is fixed at its value
    at capture time (a few iterations in, still in the ramp-up): only the EMA's values differ from the plain loop,
    not the work per iteration, which is what the benchmark times. fp16's GradScaler is not capture-safe (it decides on the
    host whether to step), so graphs run in bf16-mixed or 32-true."""

    def __init__(self, gan: PlainGAN, example: torch.Tensor, capture: bool):
        if gan.scaler is not None:
            raise PixelsmithError(
                "The CUDA-graph step cannot capture precision=16-mixed: its GradScaler decides on the host whether "
                "an optimizer step is skipped. Capture precision=bf16-mixed (or 32-true) instead."
            )
        self.gan = gan
        self.iteration = 0
        example = example.to(gan.device)
        # One graph per distinct phase set (without and with each lazy regulariser), all over one static buffer.
        self.graphs = {
            names: StaticGraphStep(lambda x, names=names: gan.step(x, names), example, capture)
            for names in gan.phase_sets()
        }
        self.phases = gan.objective.phases()
        plain = tuple(p.name for p in self.phases if p.interval == 1)
        self.main = self.graphs.get(plain) or next(iter(self.graphs.values()))
        regularized = [step for names, step in self.graphs.items() if names != plain]
        self.regularized = regularized[0] if len(regularized) == 1 else None  # the usual case: lazy R1 alone

    def step(self, images: torch.Tensor) -> None:
        names = tuple(p.name for p in self.phases if p.runs_at(self.iteration))
        self.graphs[names](images)
        self.iteration += 1
