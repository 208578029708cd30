"""R3GAN's generator and discriminator (Huang et al., "The GAN is Dead; Long Live the GAN! A Modern GAN Baseline",
NeurIPS 2024; reference code `brownvc/R3GAN`, `R3GAN/Networks.py`), written from the paper and that file's structure.

A stage is a transition (G: a learned 4x4 basis or a 2x upsample; D: a 2x downsample or the final basis) and
`blocks` residual blocks. A block is 1x1 conv C -> eC, bias + LeakyReLU(0.2), grouped kxk conv (eC / groups
channels a group), bias + LeakyReLU, 1x1 conv eC -> C, added to its input: no normalisation anywhere. The
initialisation is Fix-up-like: every conv ~ N(0, gain^2 / fan_in) with gain = LeakyReLU's He gain x L^(-1/4) over the
network's L blocks, and each block's last 1x1 starts at zero, so the network starts as its transitions alone.
Resampling is the [1, 3, 3, 1] FIR (`fir.py`, dense double backward for R1/R2); every other conv, grouped and
depthwise included, is `conv_input_grad.conv2d`, whose double backward makes no call per group; width changes are 1x1
convs outside the residual branches (before G's upsample, after D's downsample). G maps z (64) through Linear to the 4x4 basis'
per-channel scales; D ends in a depthwise 4x4 conv and a Linear. Class conditioning (`c_dim` > 0, as the
reference's `ConditionDimension`): G concatenates a bias-free Linear embedding of the one-hot label (z's size) to z;
D's head then gives `c_embed_dim` features (the 4x4 stage's width) whose dot product with the label's embedding
(gain 1 / sqrt(c_embed_dim)) is the logit: a projection discriminator. Labels are one-hot [N, c_dim] or class
indices [N].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pixelsmith.errors import ConfigError
from pixelsmith.gan.networks.conv_input_grad import conv2d
from pixelsmith.gan.networks.fir import fir_downsample_2x, fir_kernel_2d, fir_upsample_2x

NEGATIVE_SLOPE = 0.2
ACTIVATION_GAIN = math.sqrt(2.0 / (1.0 + NEGATIVE_SLOPE**2))  # He gain of LeakyReLU(0.2)


def _msr_init_(weight: Tensor, gain: float) -> Tensor:
    """N(0, gain^2 / fan_in): the reference's MSRInitializer (gain 0 gives zeros)."""
    fan_in = weight.shape[1] * weight[0][0].numel()
    with torch.no_grad():
        return weight.normal_(0.0, gain / math.sqrt(fan_in)) if gain else weight.zero_()


class Conv(nn.Module):
    """A bias-free convolution, 'same' padding, MSR-initialised with `gain`."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, groups: int = 1, gain: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, kernel, kernel))
        _msr_init_(self.weight, gain)
        self.groups = groups
        self.padding = (kernel - 1) // 2

    def forward(self, x: Tensor) -> Tensor:
        return conv2d(x, self.weight.to(x.dtype), padding=self.padding, groups=self.groups)


class BiasedLeakyReLU(nn.Module):
    """A per-channel bias (starts at zero) then LeakyReLU(0.2): the reference's BiasedActivation."""

    def __init__(self, channels: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x + self.bias.to(x.dtype).view(1, -1, 1, 1), NEGATIVE_SLOPE)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, groups: int, expansion: int, kernel: int, total_blocks: int):
        super().__init__()
        expanded = channels * expansion
        if expanded % groups:
            raise ValueError(f"R3GAN block: {expanded} expanded channels do not split into {groups} groups.")
        # Fix-up: 3 linear layers a branch, so each of the 2 scaled ones gets L^(-1 / (2 * 3 - 2)) = L^(-1/4).
        gain = ACTIVATION_GAIN * total_blocks ** (-1.0 / 4.0)
        self.expand = Conv(channels, expanded, 1, gain=gain)
        self.act1 = BiasedLeakyReLU(expanded)
        self.grouped = Conv(expanded, expanded, kernel, groups=groups, gain=gain)
        self.act2 = BiasedLeakyReLU(expanded)
        self.project = Conv(expanded, channels, 1, gain=0.0)  # zero: the block starts as the identity

    def forward(self, x: Tensor) -> Tensor:
        return x + self.project(self.act2(self.grouped(self.act1(self.expand(x)))))


class Resample(nn.Module):
    """The FIR 2x resampling, with a 1x1 to the new width (when it changes) outside it: before G's upsample, after
    D's downsample, so the convolution runs at the lower resolution either way."""

    def __init__(self, in_channels: int, out_channels: int, up: bool):
        super().__init__()
        self.up = up
        self.width = Conv(in_channels, out_channels, 1) if in_channels != out_channels else None
        self.register_buffer("kernel", fir_kernel_2d(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.up:
            x = self.width(x) if self.width is not None else x
            return fir_upsample_2x(x, self.kernel)
        x = fir_downsample_2x(x, self.kernel)
        return self.width(x) if self.width is not None else x


class GenerativeBasis(nn.Module):
    """A learned C x 4 x 4 basis, each channel scaled by Linear(z)."""

    def __init__(self, z_dim: int, channels: int):
        super().__init__()
        self.basis = nn.Parameter(torch.randn(channels, 4, 4))
        self.linear = nn.Parameter(torch.empty(channels, z_dim))
        _msr_init_(self.linear, 1.0)

    def forward(self, z: Tensor) -> Tensor:
        scales = F.linear(z, self.linear.to(z.dtype))
        return self.basis.to(scales.dtype).unsqueeze(0) * scales[:, :, None, None]


class DiscriminativeBasis(nn.Module):
    """A depthwise 4x4 conv (4x4 -> 1x1 per channel), then Linear to one logit (or `outputs` features)."""

    def __init__(self, channels: int, outputs: int = 1):
        super().__init__()
        self.depthwise = nn.Parameter(torch.empty(channels, 1, 4, 4))
        _msr_init_(self.depthwise, 1.0)
        self.linear = nn.Parameter(torch.empty(outputs, channels))
        _msr_init_(self.linear, 1.0)

    def forward(self, x: Tensor) -> Tensor:
        x = conv2d(x, self.depthwise.to(x.dtype), groups=x.shape[1]).flatten(1)
        return F.linear(x, self.linear.to(x.dtype))


def _one_hot(labels: Tensor, c_dim: int, dtype: torch.dtype) -> Tensor:
    if labels.ndim == 1:  # class indices
        return F.one_hot(labels.long(), c_dim).to(dtype)
    return labels.to(dtype)


def _stages(
    resolution: int,
    widths: Sequence[int],
    groups: Sequence[int],
    blocks: int | Sequence[int],
    net: str = "generator",
):
    stages = int(round(math.log2(resolution))) - 1
    if resolution < 4 or 2 ** (stages + 1) != resolution:
        raise ConfigError(
            f"R3GAN: resolution {resolution} must be a power of 2, at least 4: set data.resolution="
            f"{max(4, 1 << max(resolution, 1).bit_length() - 1)} (a dataset prepared at it)."
        )
    blocks = [blocks] * stages if isinstance(blocks, int) else list(blocks)
    if not len(widths) == len(groups) == len(blocks) == stages:
        # The lists are per stage, so they fix the resolution: a preset's lists with another data.resolution.
        preset = 2 ** (len(widths) + 1)
        raise ConfigError(
            f"R3GAN at data.resolution={resolution} has {stages} stages (4x4 up to {resolution}x{resolution}), so "
            f"model.{net}.widths {list(widths)}, model.{net}.groups {list(groups)} and model.{net}.blocks {blocks} "
            f"must each list {stages} values, one per stage from 4x4 up. Give {stages} of each (e.g. "
            f"model.{net}.widths=[{','.join([str(widths[0] if widths else 768)] * stages)}] "
            f"model.{net}.groups=[{','.join([str(groups[0] if groups else 96)] * stages)}]), or the resolution these "
            "lists are for"
            + (f" (data.resolution={preset})." if widths and len(widths) == len(groups) else ".")
        )
    return list(widths), list(groups), blocks


class R3GANGenerator(nn.Module):
    """z [N, z_dim] -> images [N, channels, resolution, resolution] (no output squashing, as the reference).

    widths / groups / blocks: per stage from 4x4 up (the reference's WidthPerStage, CardinalityPerStage,
    BlocksPerStage); expansion: the blocks' width factor (2 in every preset); kernel: the grouped conv's size."""

    def __init__(
        self,
        resolution: int = 32,
        channels: int = 3,
        z_dim: int = 64,
        widths: Sequence[int] = (768, 768, 768, 768),
        groups: Sequence[int] = (96, 96, 96, 96),
        blocks: int | Sequence[int] = 2,
        expansion: int = 2,
        kernel: int = 3,
        c_dim: int = 0,
        c_embed_dim: int | None = None,
    ):
        super().__init__()
        widths, groups, blocks = _stages(resolution, widths, groups, blocks)
        total = sum(blocks)
        self.z_dim = z_dim
        self.c_dim = int(c_dim)
        self.resolution = resolution
        embed = (z_dim if c_embed_dim is None else int(c_embed_dim)) if self.c_dim else 0
        if self.c_dim:  # the reference's EmbeddingLayer: Linear(c_dim -> z's size), no bias, gain 1
            self.embedding = nn.Parameter(torch.empty(embed, self.c_dim))
            _msr_init_(self.embedding, 1.0)
        layers: list[nn.Module] = []
        for index, (width, group, count) in enumerate(zip(widths, groups, blocks, strict=True)):
            layers.append(
                GenerativeBasis(z_dim + embed, width)
                if index == 0
                else Resample(widths[index - 1], width, up=True)
            )
            layers += [ResidualBlock(width, group, expansion, kernel, total) for _ in range(count)]
        self.main = nn.Sequential(*layers)
        self.to_image = Conv(widths[-1], channels, 1)

    def compile_units(self) -> list[nn.Module]:
        """Each stage's layers, compiled one by one (`hardware.compile_scope=blocks`): a stage's residual blocks
        share their shapes, so one compiled graph serves them all."""
        return [*self.main, self.to_image]

    def forward(self, z: Tensor, c: Tensor | None = None) -> Tensor:
        z = z.reshape(z.shape[0], self.z_dim)
        if self.c_dim:
            if c is None:
                raise ValueError(
                    f"This R3GAN generator is conditional (c_dim={self.c_dim}): pass the labels as c."
                )
            z = torch.cat([z, F.linear(_one_hot(c, self.c_dim, z.dtype), self.embedding.to(z.dtype))], dim=1)
        return self.to_image(self.main(z))


class R3GANDiscriminator(nn.Module):
    """images -> one logit each. widths / groups / blocks as G's, listed from 4x4 up too (the reference passes G's
    lists reversed to D, whose stages run from the image down; here D reverses them itself)."""

    def __init__(
        self,
        resolution: int = 32,
        channels: int = 3,
        widths: Sequence[int] = (768, 768, 768, 768),
        groups: Sequence[int] = (96, 96, 96, 96),
        blocks: int | Sequence[int] = 2,
        expansion: int = 2,
        kernel: int = 3,
        c_dim: int = 0,
        c_embed_dim: int | None = None,
    ):
        super().__init__()
        widths, groups, blocks = (
            list(reversed(v)) for v in _stages(resolution, widths, groups, blocks, "discriminator")
        )
        total = sum(blocks)
        self.c_dim = int(c_dim)
        embed = (widths[-1] if c_embed_dim is None else int(c_embed_dim)) if self.c_dim else 1
        if self.c_dim:  # the reference's projection: Linear(c_dim -> embed), gain 1 / sqrt(embed)
            self.embedding = nn.Parameter(torch.empty(embed, self.c_dim))
            _msr_init_(self.embedding, 1.0 / math.sqrt(embed))
        self.from_image = Conv(channels, widths[0], 1)
        layers: list[nn.Module] = []
        for index, (width, group, count) in enumerate(zip(widths, groups, blocks, strict=True)):
            layers += [ResidualBlock(width, group, expansion, kernel, total) for _ in range(count)]
            last = index == len(widths) - 1
            layers.append(
                DiscriminativeBasis(width, embed) if last else Resample(width, widths[index + 1], up=False)
            )
        self.main = nn.Sequential(*layers)

    def compile_units(self) -> list[nn.Module]:
        """As the generator's: fromRGB and each layer of the stages, one graph per distinct shape."""
        return [self.from_image, *self.main]

    def forward(self, images: Tensor, c: Tensor | None = None) -> Tensor:
        features = self.main(self.from_image(images))
        if not self.c_dim:
            return features.reshape(-1)
        if c is None:
            raise ValueError(
                f"This R3GAN discriminator is conditional (c_dim={self.c_dim}): pass the labels as c."
            )
        projection = F.linear(_one_hot(c, self.c_dim, features.dtype), self.embedding.to(features.dtype))
        return (features * projection).sum(dim=1)
