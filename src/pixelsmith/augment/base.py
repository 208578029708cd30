"""Common base for the differentiable GAN augmentations (DiffAugment, ADA) and the helpers they share.

The GAN module augments real and fake images the same way right before D, every iteration, so everything here is
written for the accelerator: no host-device synchronisation in `forward`, no work for ops that are off (ADA at
p=0 returns its input), and gradients that flow back to the generator (and, for R1, through the augmentation
twice).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

from pixelsmith.core.host_reads import host_reads_allowed

# Half-precision grids are off by more than half a pixel at 256 px and CPU half grid_sample is unreliable, and
# the colour statistics (means, matrix products) lose digits in bf16; so augmentation always runs in float32
# and hands back the caller's dtype.
_LOW_PRECISION = (torch.float16, torch.bfloat16)


class GANAugment(nn.Module):
    """Interface the GAN LightningModule calls; subclasses implement `_augment`.

    `forward(images)` takes float NCHW images in [-1, 1] (any memory format, device or dtype, also under
    autocast) and returns a tensor of the same shape and dtype that is differentiable w.r.t. `images`. Autocast
    is switched off inside: augmentation is cheap elementwise/resampling work whose precision matters more than
    its speed, and a bf16 sampling grid visibly misplaces pixels.
    """

    def forward(self, images: Tensor) -> Tensor:
        if images.ndim != 4:
            raise ValueError(f"{type(self).__name__} expects NCHW images, got shape {tuple(images.shape)}.")
        if not images.is_floating_point():
            raise TypeError(
                f"{type(self).__name__} expects float images in [-1, 1], got dtype {images.dtype}; "
                "convert with images.float() / 127.5 - 1 first."
            )
        if images.shape[0] == 0:
            return images
        compute_dtype = torch.float32 if images.dtype in _LOW_PRECISION else images.dtype
        with autocast_disabled(images.device.type):
            augmented = self._augment(images.to(compute_dtype))
        return augmented.to(images.dtype)

    def _augment(self, images: Tensor) -> Tensor:
        raise NotImplementedError

    def observe_real_logits(self, logits: Tensor) -> None:
        """Record D's raw logits on (augmented) real images from the D step. Only adaptive policies use them."""

    def update(self, num_images: int, all_reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        """Advance by one training iteration in which D saw `num_images` images summed over all ranks.

        `all_reduce` must SUM a tensor over ranks (in place or by return value); None on a single process.
        The same as `apply_update(num_images, advance(num_images), all_reduce)`.
        """
        self.apply_update(num_images, self.advance(num_images), all_reduce)

    def advance(self, num_images: int) -> bool:
        """The host's half of `update`, made before the iteration runs: True where this iteration adapts the policy
        (part of the iteration's plan, core/graphs.py). Fixed policies never adapt."""
        del num_images
        return False

    def apply_update(
        self, num_images: int, adjust: bool, all_reduce: Callable[[Tensor], Tensor] | None = None
    ) -> None:
        """The device's half of `update`, inside the iteration, after D's last step."""

    def discard_pending(self) -> None:
        """Forget what an unfinished iteration observed (a failed CUDA-graph capture)."""

    @property
    def probability(self) -> float:
        """Current augmentation probability, for logging."""
        return 1.0

    def stats(self) -> dict[str, float]:
        """Python floats for logging; may read the device, so the GAN module calls it at logging iterations only."""
        return {"p": self.probability}


def autocast_disabled(device_type: str) -> contextlib.AbstractContextManager:
    """Context that turns autocast off for `device_type` (a no-op where autocast does not exist)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def apply_to_selected_rows(
    images: Tensor,
    selected: Tensor,
    transform: Callable[[Tensor, Tensor | None], Tensor],
    gather_rows: bool,
) -> Tensor:
    """Return `images` with `transform` applied to the rows where the bool vector `selected` is True.

    `transform(rows, index)` gets the images to transform and the batch indices they came from (None meaning
    all rows, in order), so it can pick the matching per-sample parameters. Rows not selected come back bit-exact.

    `gather_rows=True` transforms only the selected rows: work proportional to how many are selected, but
    `nonzero()` makes the host wait for the device, so callers use it on CPU only. `gather_rows=False` transforms
    the whole batch and keeps the unselected rows with `torch.where`: no synchronisation, which on a GPU is worth
    more than the saved work. Both give identical values for identical random parameters.
    """
    if gather_rows:
        with host_reads_allowed():  # a CPU-only path (see the docstring): nothing to wait for
            index = selected.nonzero().squeeze(1)
        if index.numel() == 0:
            return images
        if index.numel() == images.shape[0]:
            return transform(images, None)
        transformed = transform(images.index_select(0, index), index)
        return images.index_copy(0, index, transformed.to(images.dtype))
    transformed = transform(images, None)
    return torch.where(selected.view(-1, 1, 1, 1), transformed, images)
