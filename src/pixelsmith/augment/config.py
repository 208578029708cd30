"""Schemas of the augment group's options (`augment=diffaugment`, `augment=ada`), beside the augmentations."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DiffAugmentConfig:
    """`augment=diffaugment` (pixelsmith.augment.DiffAugment)."""

    _target_: str = "pixelsmith.augment.DiffAugment"
    policy: str = "color,translation,cutout"  # comma-separated ops: color, translation, cutout
    translation_ratio: float = 0.125
    cutout_ratio: float = 0.5


@dataclass
class AdaptiveAugmentConfig:
    """`augment=ada` (pixelsmith.augment.AdaptiveAugment): p driven by the sign of D's outputs on reals."""

    _target_: str = "pixelsmith.augment.AdaptiveAugment"
    target: float = 0.6  # E[sign(D(real))] that p is steered towards
    interval: int = 4  # iterations between p adjustments
    speed_kimg: float = 500.0  # images for p to go from 0 to 1
    initial_p: float = 0.0
    max_p: float = 1.0
    xflip: bool = True
    rotate90: bool = True
    translate: float = 0.125
    scale_std: float = 0.2
    rotate_max_deg: float = 180.0
    brightness: float = 0.2
    contrast: float = 0.5
    saturation: float = 1.0
    hue: float = 0.0
