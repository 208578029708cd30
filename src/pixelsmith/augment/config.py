"""Schemas of the augment group's options (`augment=diffaugment`, `augment=ada`), beside the augmentations."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pixelsmith.config.choices import choice


@dataclass
class DiffAugmentConfig:
    """`augment=diffaugment` (pixelsmith.augment.DiffAugment)."""

    _target_: str = "pixelsmith.augment.DiffAugment"
    policy: str = "color,translation,cutout"  # comma-separated ops: color, translation, cutout
    translation_ratio: float = 0.125
    cutout_ratio: float = 0.5


class AdaWarp(StrEnum):
    LOWPASS = "lowpass"  # NVlabs' 2x-oversampled symlet-6 resampling
    BILINEAR = "bilinear"  # one bilinear gather at the image's resolution (cheaper, blurrier, aliased)


@dataclass
class AdaptiveAugmentConfig:
    """`augment=ada` (pixelsmith.augment.AdaptiveAugment): NVlabs' AugmentPipe, p driven by the sign of D's outputs
    on reals. Defaults: the paper's `bgc` pipeline and constants (stylegan2-ada-pytorch, training/augment.py)."""

    _target_: str = "pixelsmith.augment.AdaptiveAugment"
    # E[sign(D(real))] that p is steered towards; null: p is not adapted (set by model.schedules.augment_p)
    target: float | None = 0.6
    interval: int = 4  # iterations between p adjustments
    speed_kimg: float = 500.0  # images for p to go from 0 to 1
    initial_p: float = 0.0
    max_p: float = 1.0
    # NVlabs' pipeline name (blit, geom, color, bg, bgc) or a comma-separated list of ops (xflip, rotate90, xint,
    # scale, rotate, aniso, xfrac, brightness, contrast, lumaflip, hue, saturation), each with multiplier 1
    pipeline: str = "bgc"
    multipliers: dict[str, float] = field(default_factory=dict)  # per-op overrides, e.g. {lumaflip: 0}
    warp: str = choice(AdaWarp, "lowpass")
    xint_max: float = 0.125  # integer translation: U(-1, 1) * xint_max * size, rounded
    scale_std: float = 0.2  # isotropic scale 2^N(0, scale_std)
    rotate_max: float = 1.0  # rotations U(-1, 1) * pi * rotate_max (1: any angle)
    aniso_std: float = 0.2  # anisotropic scale 2^N(0, aniso_std) in x, its inverse in y
    xfrac_std: float = 0.125  # fractional translation N(0, xfrac_std) * size
    brightness_std: float = 0.2  # + N(0, brightness_std) on [-1, 1] values
    contrast_std: float = 0.5  # x 2^N(0, contrast_std)
    hue_max: float = 1.0  # hue rotation U(-1, 1) * pi * hue_max about the luma axis
    saturation_std: float = 1.0  # chroma x 2^N(0, saturation_std)
    cutout_size: float = 0.5  # op `cutout`: a square of this fraction of the image's side, zeroed
