"""GAN losses (computed in float32 whatever the autocast dtype) and the R1 gradient penalty."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pixelsmith.config.schema import GAN_LOSSES


def discriminator_loss(kind: str, real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    real, fake = real_logits.float(), fake_logits.float()
    if kind == "non_saturating":
        return F.softplus(-real).mean() + F.softplus(fake).mean()
    if kind == "hinge":
        return F.relu(1.0 - real).mean() + F.relu(1.0 + fake).mean()
    raise ValueError(f"model.loss={kind!r} is unknown; choose one of {', '.join(GAN_LOSSES)}.")


def generator_loss(kind: str, fake_logits: torch.Tensor) -> torch.Tensor:
    fake = fake_logits.float()
    if kind == "non_saturating":
        return F.softplus(-fake).mean()
    if kind == "hinge":
        return -fake.mean()
    raise ValueError(f"model.loss={kind!r} is unknown; choose one of {', '.join(GAN_LOSSES)}.")


def r1_penalty(
    real_logits: torch.Tensor, real_images: torch.Tensor, loss_scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Mean over the batch of ||dD(x)/dx||^2 at real images (Mescheder et al. 2018), differentiable w.r.t. D.

    Under fp16 the logits are multiplied by the GradScaler's scale before autograd.grad so small gradients do not
    flush to zero, and the gradients are divided by it again here.
    """
    (grads,) = torch.autograd.grad(real_logits.float().sum() * loss_scale, real_images, create_graph=True)
    grads = grads.float() / loss_scale
    return grads.square().sum(dim=[1, 2, 3]).mean()
