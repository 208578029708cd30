"""DiffAugment (Zhao et al. 2020, "Differentiable Augmentation for Data-Efficient GAN Training").

Every op is applied to every image with fresh per-sample randomness, on images in [-1, 1], exactly as the
reference implementation (github.com/mit-han-lab/data-efficient-gans, DiffAugment_pytorch.py):

- color: brightness x + U(-0.5, 0.5); saturation (x - mean_c) * U(0, 2) + mean_c with mean_c the per-pixel mean
  over channels; contrast (x - mean) * U(0.5, 1.5) + mean with mean over C, H, W. No clamping.
- translation: integer shift by up to round(ratio * size) pixels per axis, zero padding (0 is mid-grey in [-1, 1]).
- cutout: zero a square of round(ratio * size) whose centre is uniform over the image (clipped at the borders).

The caller applies the same policy (independent draws) to reals and fakes, in the D and the G steps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pixelsmith.augment.base import GANAugment

POLICY_OPS = ("color", "translation", "cutout")


class DiffAugment(GANAugment):
    """Differentiable augmentation applied with probability 1, e.g. `DiffAugment("color,translation,cutout")`.

    Grayscale (1-channel) images get brightness and contrast only: saturation around the channel mean is the
    identity on one channel, so it is skipped rather than computed.
    """

    def __init__(
        self,
        policy: str = "color,translation,cutout",
        translation_ratio: float = 0.125,
        cutout_ratio: float = 0.5,
    ):
        super().__init__()
        self.ops = tuple(op.strip() for op in policy.split(",") if op.strip())
        unknown = [op for op in self.ops if op not in POLICY_OPS]
        if unknown:
            raise ValueError(
                f"Unknown DiffAugment op(s) {unknown} in policy {policy!r}; choose from {POLICY_OPS}."
            )
        if not 0.0 <= translation_ratio <= 1.0 or not 0.0 <= cutout_ratio <= 1.0:
            raise ValueError(
                f"translation_ratio and cutout_ratio must be in [0, 1], got {translation_ratio}, {cutout_ratio}."
            )
        self.policy = ",".join(self.ops)
        self.translation_ratio = translation_ratio
        self.cutout_ratio = cutout_ratio

    def extra_repr(self) -> str:
        return f"policy={self.policy!r}, translation_ratio={self.translation_ratio}, cutout_ratio={self.cutout_ratio}"

    @property
    def probability(self) -> float:
        return 1.0 if self.ops else 0.0

    def _augment(self, images: Tensor) -> Tensor:
        for op in self.ops:
            if op == "color":
                images = random_color(images)
            elif op == "translation":
                images = random_translation(images, self.translation_ratio)
            else:
                images = random_cutout(images, self.cutout_ratio)
        return images


def random_color(images: Tensor) -> Tensor:
    """Brightness, then saturation (skipped on 1 channel, where it is the identity), then contrast, in one pass.

    kornia's RandomBrightness(clip_output=False) is the same brightness op, but kornia's RandomSaturation (HSV,
    clamped to [0, 1]) and RandomContrast (a product about 0, not about the image mean) are not the reference ops.
    Composed, the three reference ops are one per-sample affine map, computed here in a single pass:
        brightness  x1 = x + b                           b ~ U(-0.5, 0.5)
        saturation  x2 = s * x1 + (1 - s) * mean_c(x1)   s ~ U(0, 2)
        contrast    x3 = c * x2 + (1 - c) * mean(x2)     c ~ U(0.5, 1.5)
    with mean(x2) = mean(x) + b (the mean over C, H, W of the channel mean is the image mean), so
        x3 = c s x + c (1 - s) mean_c(x) + (1 - c) mean(x) + b.
    On 64x3x64x64 this takes ~40% of the time of kornia's brightness followed by the two written-out ops.
    """
    n, channels = images.shape[:2]
    brightness, saturation, contrast = torch.rand(3, n, 1, 1, 1, device=images.device, dtype=images.dtype)
    brightness = brightness - 0.5
    saturation = saturation * 2 if channels > 1 else torch.ones_like(saturation)
    contrast = contrast + 0.5
    channel_mean = images.mean(dim=1, keepdim=True)
    image_mean = channel_mean.mean(dim=(2, 3), keepdim=True)
    shift = torch.addcmul((1 - contrast) * image_mean + brightness, channel_mean, contrast * (1 - saturation))
    return torch.addcmul(shift, images, contrast * saturation)


def random_translation(images: Tensor, ratio: float) -> Tensor:
    """Shift each image by integers uniform in [-round(ratio*H), round(ratio*H)] x [..W..], zero padding.

    kornia's RandomTranslate/RandomAffine draw sub-pixel shifts and resample bilinearly (blurring every image);
    the reference op moves whole pixels, which an index gather does exactly.
    """
    n, _, height, width = images.shape
    max_dy, max_dx = int(height * ratio + 0.5), int(width * ratio + 0.5)
    shift_y = torch.randint(-max_dy, max_dy + 1, (n,), device=images.device)
    shift_x = torch.randint(-max_dx, max_dx + 1, (n,), device=images.device)
    return translate_integer(images, shift_y, shift_x)


def translate_integer(images: Tensor, shift_y: Tensor, shift_x: Tensor) -> Tensor:
    """Move the content of image i down by shift_y[i] and right by shift_x[i] pixels; vacated pixels become 0."""
    n, channels, height, width = images.shape
    source_rows = torch.arange(height, device=images.device).view(1, height, 1) - shift_y.view(n, 1, 1)
    source_cols = torch.arange(width, device=images.device).view(1, 1, width) - shift_x.view(n, 1, 1)
    inside = ((source_rows >= 0) & (source_rows < height)) & ((source_cols >= 0) & (source_cols < width))
    flat_index = source_rows.clamp(0, height - 1) * width + source_cols.clamp(0, width - 1)  # (n, H, W)
    flat_index = flat_index.view(n, 1, height * width).expand(n, channels, height * width)
    moved = images.reshape(n, channels, height * width).gather(2, flat_index).view(n, channels, height, width)
    # Multiplying by the 0/1 mask rather than torch.where: same values and gradient, ~6x faster on CPU.
    return moved * inside.unsqueeze(1).to(images.dtype)


def random_cutout(images: Tensor, ratio: float) -> Tensor:
    """Zero a round(ratio*H) x round(ratio*W) rectangle centred uniformly over each image, clipped at the edges.

    kornia's RandomErasing samples area and aspect ratio and keeps the box inside the image, a different
    distribution; the reference op's centre sampling (including its even/odd size rule) is reproduced here.
    """
    n, _, height, width = images.shape
    cut_h, cut_w = int(height * ratio + 0.5), int(width * ratio + 0.5)
    centre_y = torch.randint(0, height + (1 - cut_h % 2), (n, 1, 1), device=images.device)
    centre_x = torch.randint(0, width + (1 - cut_w % 2), (n, 1, 1), device=images.device)
    top, left = centre_y - cut_h // 2, centre_x - cut_w // 2
    rows = torch.arange(height, device=images.device).view(1, height, 1)
    cols = torch.arange(width, device=images.device).view(1, 1, width)
    cut = ((rows >= top) & (rows < top + cut_h)) & ((cols >= left) & (cols < left + cut_w))
    return images * (~cut).unsqueeze(1).to(images.dtype)
