"""The image protocol every metric in Pixelsmith follows: how float images become the uint8 pixels we measure.

FID and friends are only comparable when everybody turns images into pixels the same way. We follow
torch-fidelity (and through it the original TensorFlow FID code): the feature extractor sees *uint8* images,
obtained from the generator's [-1, 1] output by rounding, never by truncation. Real and generated images go
through exactly the same function, so a difference in the score is a difference in the images.
"""

from __future__ import annotations

import torch

# Written into every reference-statistics cache key and into the README section, so a change here invalidates
# cached statistics instead of silently mixing protocols.
QUANTIZE_PROTOCOL = "uint8=floor(clamp(x*127.5+128,0,255)) from x in [-1,1] (round half up)"


def quantize_to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Turn generator output in [-1, 1] into uint8 pixels by rounding (uint8 input is returned unchanged).

    x*127.5 + 128 followed by floor is round-half-up of (x+1)*127.5, the same value torchvision's ``save_image``
    writes to a PNG; a plain ``.to(torch.uint8)`` of (x+1)*127.5 would truncate and bias every pixel down by half
    a level. Clamping happens before the cast because casting negative floats to uint8 is undefined.
    """
    if images.dtype == torch.uint8:
        return images
    if not images.is_floating_point():
        raise TypeError(f"expected float images in [-1, 1] or uint8 images, got dtype {images.dtype}")
    # float32 even under autocast: in fp16 128+127.5*x has a resolution of 0.125 near 255, enough to flip a level.
    scaled = images.detach().float() * 127.5 + 128.0
    return scaled.clamp_(0.0, 255.0).floor_().to(torch.uint8)


def uint8_to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels back to float32 in [-1, 1] (the inverse of :func:`quantize_to_uint8` up to rounding)."""
    return images.float() / 127.5 - 1.0
