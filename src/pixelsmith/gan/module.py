"""GANModule: one training iteration as named phases (D_main, D_reg, G_main, EMA) on the shared TrainingCore.

Per iteration (StyleGAN2-ADA's order): D_main on real vs detached fakes; D_reg (lazy R1) every `r1_interval`
iterations with its loss scaled by the interval; G_main with D frozen; then the generator EMA (run by the core's
`end_iteration`, after buffers are synced across ranks). Each phase runs over
`accumulate` micro-batches and ends in exactly one optimizer step. Augmentation (DiffAugment/ADA) is applied to
real and fake images alike, inside the step, on the batch's device, and G's gradients flow through it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn
from torchvision.utils import make_grid

from pixelsmith.config.schema import GAN_LOSSES, EMAConfig, OptimizerConfig
from pixelsmith.core.module import CoreSettings, OptimizerDefinition, TrainingCore
from pixelsmith.gan.losses import discriminator_loss, generator_loss, r1_penalty

log = logging.getLogger(__name__)


def _as_dataclass(cls, value):
    if value is None or isinstance(value, cls):
        return value or cls()
    return cls(**dict(value))


class GANModule(TrainingCore):
    def __init__(
        self,
        core: CoreSettings,
        generator: Any,
        discriminator: Any,
        name: str = "gan",
        loss: str = "non_saturating",
        r1_gamma: float = 0.0,
        r1_interval: int = 16,
        g_optimizer: Any = None,
        d_optimizer: Any = None,
        ema: Any = None,
        sample_grid_size: int = 64,
        augment: nn.Module | None = None,
        _target_: str | None = None,  # accepted so a config node can be passed whole
    ):
        super().__init__(core)
        if loss not in GAN_LOSSES:
            raise ValueError(f"model.loss={loss!r} is unknown; choose one of {', '.join(GAN_LOSSES)}.")
        if r1_interval < 1:
            raise ValueError(f"model.r1_interval={r1_interval} must be >= 1.")
        self.model_name = name
        self.loss_kind = loss
        self.r1_gamma = r1_gamma
        self.r1_interval = r1_interval
        self.g_opt_cfg = _as_dataclass(OptimizerConfig, g_optimizer)
        self.d_opt_cfg = _as_dataclass(OptimizerConfig, d_optimizer)
        ema_cfg = _as_dataclass(EMAConfig, ema)
        self.generator = generator if isinstance(generator, nn.Module) else instantiate(generator)
        self.discriminator = (
            discriminator if isinstance(discriminator, nn.Module) else instantiate(discriminator)
        )
        self.augment = augment
        self.z_dim = int(self.generator.z_dim)
        self.G_ema = self.add_ema("G", self.generator, ema_cfg)
        # Fixed latents for sample grids: a buffer, so a resumed run draws the very same grid.
        gen = torch.Generator().manual_seed(core.seed)
        self.register_buffer("sample_z", torch.randn(sample_grid_size, self.z_dim, generator=gen))

    # ---- TrainingCore contract -----------------------------------------------------------------------------------
    def networks(self) -> dict[str, nn.Module]:
        nets = {"G": self.generator, "D": self.discriminator}
        if self.G_ema is not None:
            nets["G_ema"] = self.G_ema.model
        return nets

    def optimizer_definitions(self) -> list[OptimizerDefinition]:
        # Lazy regularisation gives D (interval+1) steps per `interval` iterations; StyleGAN2 rescales lr and betas
        # so the effective Adam dynamics match a non-lazy run.
        ratio = self.r1_interval / (self.r1_interval + 1) if self.r1_gamma > 0 else 1.0
        return [
            OptimizerDefinition("G", list(self.generator.parameters()), self.g_opt_cfg),
            OptimizerDefinition("D", list(self.discriminator.parameters()), self.d_opt_cfg, ratio, ratio),
        ]

    # ---- training ----------------------------------------------------------------------------------------------
    def _augment(self, images: torch.Tensor) -> torch.Tensor:
        if self.augment is None:
            return images
        with self.phase("augment"):
            return self.augment(images)

    def _sample_latents(self, count: int) -> torch.Tensor:
        return torch.randn(count, self.z_dim, device=self.device)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        images = batch[0] if isinstance(batch, list | tuple) else batch
        if isinstance(batch, list | tuple) and len(batch) > 1:
            self.count_skipped_files(batch[1])
        with self.phase("h2d"):
            reals = self.prepare_images(images)
        batch_size = reals.shape[0]
        G, D = self.generator, self.discriminator
        logs: dict[str, torch.Tensor] = {}

        # D_main: real vs detached fakes.
        z_d = self._sample_latents(batch_size)
        D.requires_grad_(True)
        loss_d_total = torch.zeros((), device=self.device)
        for real, z in zip(self.micro_batches(reals), self.micro_batches(z_d), strict=True):
            with self.phase("G_fwd"), torch.no_grad(), self.autocast():
                fake = G(z)
            with self.phase("D_fwd"), self.autocast():
                real_logits = D(self._augment(real))
                fake_logits = D(self._augment(fake))
                loss_d = discriminator_loss(self.loss_kind, real_logits, fake_logits)
            if self.augment is not None:
                self.augment.observe_real_logits(real_logits.detach())
            with self.phase("D_bwd"):
                self.loss_backward(loss_d, "D")
            loss_d_total += loss_d.detach() / self.core.accumulate
        with self.phase("opt_step"):
            self.step("D")
        logs["loss/D"] = loss_d_total
        logs["logits/real"] = real_logits.detach().float().mean()
        logs["logits/fake"] = fake_logits.detach().float().mean()

        # D_reg: lazy R1 on real images (augmented as D sees them).
        if self.r1_gamma > 0 and self.iteration % self.r1_interval == 0:
            # The GradScaler's scale as a device tensor (scale() of a one): get_scale() would make the host wait.
            loss_scale = self.mixed_precision.scale(torch.ones((), device=self.device))
            r1_total = torch.zeros((), device=self.device)
            with self.double_backward(
                D
            ):  # eager D (compiled backward is not differentiable), gathered under FSDP
                for real in self.micro_batches(reals):
                    # One breakdown row for R1 (StyleGAN2-ADA's Dreg): its forward, gradient penalty (a first
                    # backward) and double backward, so its cost is visible apart from D_main's.
                    with self.phase("D_reg"):
                        real = real.detach().requires_grad_(True)
                        with self.autocast():
                            logits = D(self._augment(real))
                        penalty = r1_penalty(logits, real, loss_scale)
                        self.loss_backward(penalty * (self.r1_gamma / 2) * self.r1_interval, "D")
                    r1_total += penalty.detach() / self.core.accumulate
            with self.phase("opt_step"):
                self.step("D")
            logs["loss/r1"] = r1_total

        if self.augment is not None:
            self.augment.update(
                batch_size * self.world_size, self.world_all_reduce if self.world_size > 1 else None
            )

        # G_main: D frozen so G's backward leaves D's gradients untouched (and skips computing them).
        D.requires_grad_(False)
        z_g = self._sample_latents(batch_size)
        loss_g_total = torch.zeros((), device=self.device)
        for z in self.micro_batches(z_g):
            with self.phase("G_fwd"), self.autocast():
                fake = G(z)
            with self.phase("D_fwd"), self.autocast():
                loss_g = generator_loss(self.loss_kind, D(self._augment(fake)))
            with self.phase("G_bwd"):
                self.loss_backward(loss_g, "G")
            loss_g_total += loss_g.detach() / self.core.accumulate
        with self.phase("opt_step"):
            self.step("G")
        D.requires_grad_(True)
        logs["loss/G"] = loss_g_total

        self.end_iteration(batch_size, logs)

    def logging_values(self) -> dict[str, float]:
        # ADA's p and r_t live on the device; read them only when the iteration logs.
        if self.augment is None:
            return {}
        return {f"augment/{k}": v for k, v in self.augment.stats().items()}

    # ---- sampling ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, z: torch.Tensor, use_ema: bool = True) -> torch.Tensor:
        """Images in [-1, 1] from latents, with the EMA generator when there is one."""
        net = self.G_ema.model if (use_ema and self.G_ema is not None) else self.generator
        was_training = net.training
        net.eval()
        try:
            with self.autocast():
                return net(z.to(self.device)).float().clamp(-1, 1)
        finally:
            net.train(was_training)

    def sample_grid(self) -> torch.Tensor:
        """A [C, H, W] grid in [0, 1] from the fixed latents; used by the sample-grid callback."""
        images = self.generate(self.sample_z)
        nrow = max(1, int(round(images.shape[0] ** 0.5)))
        return make_grid(images.add(1).div(2), nrow=nrow, padding=2, pad_value=1.0).cpu()
