"""Differentiable GPU-side GAN augmentation: DiffAugment (fixed policy) and ADA (adaptive probability).

Both share the `GANAugment` interface the GAN module calls: `forward(images)`, `observe_real_logits(logits)`,
`update(num_images, all_reduce)`, `probability` and `stats()`.
"""

from pixelsmith.augment.ada import AdaptiveAugment
from pixelsmith.augment.base import GANAugment
from pixelsmith.augment.diffaugment import DiffAugment

__all__ = ["AdaptiveAugment", "DiffAugment", "GANAugment"]
