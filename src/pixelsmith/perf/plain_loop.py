"""The GAN iteration written as a plain PyTorch loop: the yardstick for the template's overhead in `bench.py`.

Same networks (instantiated from the same composed config, same seed), same losses (`pixelsmith.gan.losses`), same
batch, precision (autocast dtype, a GradScaler for fp16), memory format, compilation, Adam implementation, lazy R1
and generator EMA (the same `EMA` arithmetic) as `GANModule` — and nothing else: no Lightning loop, no callbacks,
no logging, no non-finite guard, no gradient-norm computation, no per-iteration reseeding. What the template does
on top of this is what the benchmark's overhead ratio measures.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader

from pixelsmith.core.ema import EMA
from pixelsmith.core.module import eager
from pixelsmith.core.precision import AUTOCAST_DTYPES
from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.losses import discriminator_loss, generator_loss, r1_penalty
from pixelsmith.hardware import RuntimePlan
from pixelsmith.perf.switches import adam_implementation


@dataclass
class PlainGAN:
    G: nn.Module
    D: nn.Module
    ema: EMA | None
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    dtype: torch.dtype | None
    device: torch.device
    channels_last: bool
    loss_kind: str
    r1_gamma: float
    r1_interval: int
    z_dim: int
    iteration: int = 0
    images_seen: int = 0

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    def _backward_step(self, loss: torch.Tensor, opt: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(opt)
            self.scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)

    def step(self, images: torch.Tensor, with_r1: bool | None = None) -> None:
        """One iteration; `with_r1` None runs lazy R1 every `r1_interval` iterations (a captured graph fixes it)."""
        G, D = self.G, self.D
        reals = images.to(self.device, non_blocking=True).float().mul_(1.0 / 127.5).sub_(1.0)
        if self.channels_last:
            reals = reals.contiguous(memory_format=torch.channels_last)
        batch = reals.shape[0]

        D.requires_grad_(True)
        with torch.no_grad(), self.autocast():
            fake = G(torch.randn(batch, self.z_dim, device=self.device))
        with self.autocast():
            loss_d = discriminator_loss(self.loss_kind, D(reals), D(fake))
        self._backward_step(loss_d, self.opt_d)

        if with_r1 is None:
            with_r1 = self.r1_gamma > 0 and self.iteration % self.r1_interval == 0
        if with_r1:
            real = reals.detach().requires_grad_(True)
            scale = self.scaler.scale(torch.ones((), device=self.device)) if self.scaler is not None else 1.0
            with self.autocast(), eager(D):  # a compiled backward is not differentiable (core.module.eager)
                logits = D(real)
            penalty = r1_penalty(logits, real, scale)
            self._backward_step(penalty * (self.r1_gamma / 2) * self.r1_interval, self.opt_d)

        D.requires_grad_(False)
        with self.autocast():
            loss_g = generator_loss(self.loss_kind, D(G(torch.randn(batch, self.z_dim, device=self.device))))
        self._backward_step(loss_g, self.opt_g)
        D.requires_grad_(True)

        self.images_seen += batch
        if self.ema is not None:
            self.ema.update(G, batch, self.images_seen)
        self.iteration += 1


def build_plain_gan(
    cfg: DictConfig, plan: RuntimePlan, optimizer_impl: str, capturable: bool = False
) -> PlainGAN:
    device = torch.device("cuda" if plan.accelerator == "cuda" else "cpu")
    model = cfg.model
    G = instantiate(model.generator).to(device)
    D = instantiate(model.discriminator).to(device)
    if plan.channels_last:
        G.to(memory_format=torch.channels_last)
        D.to(memory_format=torch.channels_last)
    ema = EMA(G, model.ema.half_life_kimg, model.ema.rampup) if model.ema.enabled else None
    if plan.compile:
        G.compile(mode=plan.compile_mode)
        D.compile(mode=plan.compile_mode)
    ratio = model.r1_interval / (model.r1_interval + 1) if model.r1_gamma > 0 else 1.0

    def adam(params, opt_cfg, scale):
        params = list(params)
        return torch.optim.Adam(
            params,
            lr=opt_cfg.lr * scale,
            betas=tuple(b**scale for b in opt_cfg.betas),
            eps=opt_cfg.eps,
            weight_decay=opt_cfg.weight_decay,
            **adam_implementation(optimizer_impl, params),
            # CUDA-graph capture needs Adam's step counts on the device (`StaticGraphStep`).
            **({"capturable": True} if capturable else {}),
        )

    dtype = AUTOCAST_DTYPES[plan.precision]
    return PlainGAN(
        G=G,
        D=D,
        ema=ema,
        opt_g=adam(G.parameters(), model.g_optimizer, 1.0),
        opt_d=adam(D.parameters(), model.d_optimizer, ratio),
        scaler=torch.amp.GradScaler(device.type) if plan.precision == "16-mixed" else None,
        dtype=dtype,
        device=device,
        channels_last=plan.channels_last,
        loss_kind=model.loss,
        r1_gamma=float(model.r1_gamma),
        r1_interval=int(model.r1_interval),
        z_dim=int(G.z_dim),
    )


def plain_loader(cfg: DictConfig, plan: RuntimePlan) -> Iterable[torch.Tensor]:
    """The same dataset and loader settings as the template's datamodule, with a plain shuffling sampler; with
    `data.on_device` (MNIST) the images live on the device and each epoch is a device-side permutation, as a user
    who keeps a small dataset on the GPU would write it."""
    from pixelsmith.train import build_datamodule

    datamodule = build_datamodule(cfg, plan)
    datamodule.setup("fit")
    batch_size = int(cfg.data.batch_size or plan.batch_size)
    images = getattr(datamodule.train_set, "images", None)
    if datamodule.on_device and isinstance(images, torch.Tensor):
        return _DeviceEpochs(images.to("cuda" if plan.accelerator == "cuda" else "cpu"), batch_size)
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
    gan: PlainGAN | GraphedPlainGAN, loader: Iterable, iterations: int
) -> tuple[list[float], list[float]]:
    """Run `iterations` iterations; returns perf_counter and process_time at the end of each (the template's
    clock takes the same readings)."""
    ends, cpu_ends = [], []
    batches = endless(loader)
    for _ in range(iterations):
        gan.step(next(batches))
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
    """The plain GAN iteration as CUDA graphs: one without R1 and one with it (lazy R1 runs every `r1_interval`
    iterations, StyleGAN2-ADA's Dreg), both over the same static batch buffer. The EMA's beta is fixed at its value
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
        self.main = StaticGraphStep(lambda x: gan.step(x, with_r1=False), example, capture)
        self.with_r1 = (
            StaticGraphStep(lambda x: gan.step(x, with_r1=True), example, capture)
            if gan.r1_gamma > 0
            else None
        )

    def step(self, images: torch.Tensor) -> None:
        lazy_r1 = self.with_r1 is not None and self.iteration % self.gan.r1_interval == 0
        (self.with_r1 if lazy_r1 else self.main)(images)
        self.iteration += 1
