"""The peer of style training's speed target: a plain loop written from the method that
pytorch/examples' fast_neural_style publishes, independent of the template's networks and loss.

The method: Johnson et al.'s TransformerNet (9x9 conv, two stride-2 convs, residual blocks, two nearest-upsample
convs, 9x9 output conv; reflection padding, affine instance norm, a linear output) trained on content crops whose
pixels are in [0, 255]; a frozen VGG16 cut at relu1_2, relu2_2, relu3_3 and relu4_3 sees the output and the content
after /255 and ImageNet mean/std normalisation; content loss 1e5 x MSE at relu2_2, style loss 1e10 x the summed MSE
between Gram matrices (normalised by C*H*W) of the output and of the style image; Adam at lr 1e-3; batch 4, 256 px;
fp32. Its loop reads both losses back every iteration for its running log (`.item()`), so this one does too.

Only the benchmark calls this (`benchmarks/style_bench.py`, kind "peer"): the content crops come from the same data
loader as the template's, and the process-wide switches (threads, cuDNN autotuning, TF32) from the same hardware
settings, so the two differ in the training loop only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The published method's numbers.
CONTENT_WEIGHT = 1e5
STYLE_WEIGHT = 1e10
LEARNING_RATE = 1e-3
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VGG16_CUTS = (
    4,
    9,
    16,
    23,
)  # torchvision's vgg16().features indices just past relu1_2, relu2_2, relu3_3, relu4_3


class _Conv(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, upsample: bool = False):
        layers: list[nn.Module] = [nn.Upsample(scale_factor=2, mode="nearest")] if upsample else []
        layers += [nn.ReflectionPad2d(kernel // 2), nn.Conv2d(cin, cout, kernel, stride)]
        super().__init__(*layers)


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block = nn.Sequential(
            _Conv(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
            nn.ReLU(),
            _Conv(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


def transformer_net(channels: int = 32, residual_blocks: int = 5) -> nn.Sequential:
    """The image transformation network of the method (32 channels and 5 residual blocks: the paper's)."""
    c = channels

    def norm_relu(n: int) -> list[nn.Module]:
        return [nn.InstanceNorm2d(n, affine=True), nn.ReLU()]

    return nn.Sequential(
        _Conv(3, c, 9),
        *norm_relu(c),
        _Conv(c, 2 * c, 3, stride=2),
        *norm_relu(2 * c),
        _Conv(2 * c, 4 * c, 3, stride=2),
        *norm_relu(4 * c),
        *[_Residual(4 * c) for _ in range(residual_blocks)],
        _Conv(4 * c, 2 * c, 3, upsample=True),
        *norm_relu(2 * c),
        _Conv(2 * c, c, 3, upsample=True),
        *norm_relu(c),
        _Conv(c, 3, 9),
    )


class _VGG16Slices(nn.Module):
    """torchvision's VGG16 features in four slices, frozen; random weights cost what ImageNet ones do."""

    def __init__(self):
        super().__init__()
        from torchvision.models import vgg16

        features = vgg16(weights=None).features
        starts = (0, *VGG16_CUTS[:-1])
        self.slices = nn.ModuleList(features[a:b] for a, b in zip(starts, VGG16_CUTS, strict=True))
        self.requires_grad_(False)

    def forward(self, x: Tensor) -> list[Tensor]:
        out = []
        for piece in self.slices:
            x = piece(x)
            out.append(x)
        return out  # relu1_2, relu2_2, relu3_3, relu4_3


def _gram(features: Tensor) -> Tensor:
    b, c, h, w = features.shape
    flat = features.reshape(b, c, h * w)
    return flat.bmm(flat.transpose(1, 2)) / (c * h * w)


def _normalise(images_0_255: Tensor) -> Tensor:
    mean = images_0_255.new_tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = images_0_255.new_tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (images_0_255 / 255.0 - mean) / std


def train(
    batches: Iterable[Tensor],
    style: Tensor,
    iterations: int,
    device: torch.device,
    channels: int = 32,
    residual_blocks: int = 5,
) -> list[float]:
    """Train for `iterations` on uint8 content crops from `batches` (cycled) with `style` (3, H, W) in [0, 1];
    returns each iteration's end time (perf_counter), read without waiting for the device beyond the method's own
    per-iteration loss reads."""
    net = transformer_net(channels, residual_blocks).to(device).train()
    vgg = _VGG16Slices().to(device).eval()
    optimizer = torch.optim.Adam(net.parameters(), lr=LEARNING_RATE)
    with torch.no_grad():
        style_grams = [_gram(f) for f in vgg(_normalise(style[None].to(device) * 255.0))]
    running = [0.0, 0.0]  # the method's running content and style losses (its log)
    ends: list[float] = []
    while len(ends) < iterations:
        for images in batches:
            content = images.to(device, non_blocking=True).float()  # [0, 255]
            optimizer.zero_grad()
            output = net(content)
            features_out = vgg(_normalise(output))
            features_in = vgg(_normalise(content))
            content_loss = CONTENT_WEIGHT * F.mse_loss(features_out[1], features_in[1])
            style_loss = sum(
                F.mse_loss(_gram(f), g.expand(f.shape[0], -1, -1))
                for f, g in zip(features_out, style_grams, strict=True)
            )
            style_loss = STYLE_WEIGHT * style_loss
            (content_loss + style_loss).backward()
            optimizer.step()
            running[0] += content_loss.item()
            running[1] += style_loss.item()
            ends.append(time.perf_counter())
            if len(ends) == iterations:
                break
    return ends
