"""DCGAN generator and discriminator (Radford et al. 2016) for square images of any power-of-two size >= 16."""

from __future__ import annotations

import math

import torch
from torch import nn

from pixelsmith.errors import ConfigError


def _stages(resolution: int) -> int:
    stages = int(math.log2(resolution)) - 2
    if resolution < 16 or 2 ** (stages + 2) != resolution:
        raise ConfigError(
            f"DCGAN needs a power-of-two resolution >= 16, got {resolution}: set data.resolution="
            f"{max(16, 1 << max(resolution, 1).bit_length() - 1)} (a dataset prepared at it: python prepare.py ... "
            "resolution=<the same>)."
        )
    return stages


def _init_weights(module: nn.Module) -> None:
    # The DCGAN paper's initialisation: N(0, 0.02) for convolutions, N(1, 0.02) for BatchNorm scales.
    if isinstance(module, nn.Conv2d | nn.ConvTranspose2d | LatentProjection):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def _norm(kind: str, width: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(width)
    if kind == "instance":
        return nn.InstanceNorm2d(width, affine=True)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"DCGAN norm={kind!r}: choose batch, instance or none.")


class LatentProjection(nn.Module):
    """DCGAN's first layer, z -> (width, 4, 4): the paper's 4x4 transposed convolution of a 1x1 input, written as
    the matrix product it is (out[n, c, i, j] = sum_k z[n, k] W[k, c, i, j]).

    Why not `nn.ConvTranspose2d` on z viewed as (N, z_dim, 1, 1): a 1x1 feature map is both NCHW- and
    NHWC-contiguous, and with channels_last weights torch.compile's stride prediction for that convolution's
    weight gradient (channels_last) disagreed with what cuDNN returned, so the compiled backward failed its
    stride assertion at the first iteration on every GPU profile. A matmul has no memory format to disagree on,
    and its weight is 2-D, so `Module.to(memory_format=...)` leaves it alone. The weight keeps the transposed
    convolution's layout (z_dim, width * 16), and checkpoints holding the 4-D (z_dim, width, 4, 4) weight load.
    """

    def __init__(self, z_dim: int, width: int, bias: bool):
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.empty(z_dim, width * 16))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = (z @ self.weight).view(z.shape[0], self.width, 4, 4)
        return out if self.bias is None else out + self.bias.view(1, -1, 1, 1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None and weight.ndim == 4:  # a ConvTranspose2d checkpoint: same numbers, 2-D view
            state_dict[prefix + "weight"] = weight.reshape(weight.shape[0], -1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class DCGANGenerator(nn.Module):
    """`norm`: batch (the paper), instance, or none (no batch-dependent statistics: exact accumulation)."""

    def __init__(
        self, resolution: int = 32, channels: int = 1, z_dim: int = 100, ngf: int = 64, norm: str = "batch"
    ):
        super().__init__()
        self.z_dim = z_dim
        stages = _stages(resolution)
        width = ngf * 2 ** (stages - 1)
        layers: list[nn.Module] = [
            LatentProjection(z_dim, width, bias=norm == "none"),
            _norm(norm, width),
            nn.ReLU(True),
        ]
        for _ in range(stages - 1):
            layers += [
                nn.ConvTranspose2d(width, width // 2, 4, 2, 1, bias=norm == "none"),
                _norm(norm, width // 2),
                nn.ReLU(True),
            ]
            width //= 2
        layers += [nn.ConvTranspose2d(width, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)
        self.apply(_init_weights)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z.reshape(z.shape[0], self.z_dim))


class DCGANDiscriminator(nn.Module):
    """`norm`: batch (the paper), instance, or none (exact gradient accumulation; no batch-dependent statistics)."""

    def __init__(self, resolution: int = 32, channels: int = 1, ndf: int = 64, norm: str = "batch"):
        super().__init__()
        stages = _stages(resolution)
        layers: list[nn.Module] = [nn.Conv2d(channels, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)]
        width = ndf
        for _ in range(stages - 1):
            layers += [
                nn.Conv2d(width, width * 2, 4, 2, 1, bias=norm == "none"),
                _norm(norm, width * 2),
                nn.LeakyReLU(0.2, True),
            ]
            width *= 2
        layers.append(nn.Conv2d(width, 1, 4, 1, 0, bias=False))
        self.main = nn.Sequential(*layers)
        self.apply(_init_weights)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.main(images).reshape(-1)
