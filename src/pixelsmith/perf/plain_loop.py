"""The GAN iteration written as a plain PyTorch loop: the yardstick for the template's overhead in `bench.py`.

Same networks (instantiated from the same composed config, same seed), same losses (`pixelsmith.gan.losses`), same
batch, precision (autocast dtype, a GradScaler for fp16), memory format, compilation, Adam implementation, lazy R1
and generator EMA (the same `EMA` arithmetic) as `GANModule` — and nothing else: no Lightning loop, no callbacks,
no logging, no non-finite guard, no gradient-norm computation, no per-iteration reseeding. What the template does
on top of this is what the benchmark's overhead ratio measures.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader

from pixelsmith.core.ema import EMA
from pixelsmith.core.module import eager
from pixelsmith.core.precision import AUTOCAST_DTYPES
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

    def step(self, images: torch.Tensor) -> None:
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

        if self.r1_gamma > 0 and self.iteration % self.r1_interval == 0:
            real = reals.detach().requires_grad_(True)
            scale = self.scaler.get_scale() if self.scaler is not None else 1.0
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


def build_plain_gan(cfg: DictConfig, plan: RuntimePlan, optimizer_impl: str) -> PlainGAN:
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


def plain_loader(cfg: DictConfig, plan: RuntimePlan) -> DataLoader:
    """The same dataset and loader settings as the template's datamodule, with a plain shuffling sampler."""
    from pixelsmith.train import build_datamodule

    datamodule = build_datamodule(cfg, plan)
    datamodule.setup("fit")
    workers = datamodule.num_workers
    return DataLoader(
        datamodule.train_set,
        batch_size=int(cfg.data.batch_size or plan.batch_size),
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=datamodule.pin_memory,
        persistent_workers=datamodule.persistent_workers and workers > 0,
        prefetch_factor=datamodule.prefetch_factor if workers > 0 else None,
    )


def endless(loader: DataLoader) -> Iterator[torch.Tensor]:
    while True:
        for batch in loader:
            yield batch[0] if isinstance(batch, list | tuple) else batch


def run_plain(gan: PlainGAN, loader: DataLoader, iterations: int) -> tuple[list[float], list[float]]:
    """Run `iterations` iterations; returns perf_counter and process_time at the end of each (the template's
    clock takes the same readings)."""
    ends, cpu_ends = [], []
    batches = endless(loader)
    for _ in range(iterations):
        gan.step(next(batches))
        ends.append(time.perf_counter())
        cpu_ends.append(time.process_time())
    return ends, cpu_ends
