"""Batches of an in-memory dataset that lives on the training device (`data.on_device=true`, MNIST's default).

A DataLoader hands each batch over as B Python indices, a collate and a host-to-device copy; for 5,000 digits of
32x32 (5 MB) that is all overhead. Here the uint8 images are copied to the device once, and each iteration is one
`index_select` with a slice of the epoch's permutation that is already there: no worker, no copy, nothing the
host waits for. The index stream is `IterationSampler`'s (same seed, epochs, rank shares), so a run draws the very
same batches as through the DataLoader, and resuming at iteration k continues the stream exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from pixelsmith.data.sampler import IterationSampler


class DeviceResidentBatches:
    """An iterable of `num_iterations` batches (uint8 [B, C, H, W] on `images.device`) for iterations from `start`;
    with `labels`, `(images, skipped_flags, labels)` as a labelled DataLoader yields."""

    def __init__(self, images: torch.Tensor, sampler: IterationSampler, labels: torch.Tensor | None = None):
        self.images = images
        self.labels = None if labels is None else labels.to(images.device)
        self.sampler = sampler
        self._epoch = -1
        self._permutation: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.sampler.num_iterations

    def _epoch_permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            permutation = self.sampler.permutation(epoch)
            if self.images.device.type == "cuda":
                # Pinned, so the copy is queued instead of waiting for the GPU (once per epoch).
                permutation = permutation.pin_memory()
            self._permutation = permutation.to(self.images.device, non_blocking=True)
            self._epoch = epoch
        return self._permutation

    def indices(self, iteration: int) -> torch.Tensor:
        """This rank's dataset indices for `iteration`, as slices of the epoch permutations on the device."""
        sampler = self.sampler
        n, per_rank = sampler.n, sampler.batch_per_rank
        position = iteration * per_rank * sampler.world_size + sampler.rank * per_rank
        end = position + per_rank
        pieces = []
        while position < end:  # a batch can span the end of one epoch and the start of the next (or more)
            epoch, offset = divmod(position, n)
            take = min(end - position, n - offset)
            pieces.append(self._epoch_permutation(epoch)[offset : offset + take])
            position += take
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def __iter__(self) -> Iterator[torch.Tensor]:
        start = self.sampler.start
        for iteration in range(start, start + self.sampler.num_iterations):
            index = self.indices(iteration)
            if self.labels is None:
                yield self.images.index_select(0, index)
            else:  # the GAN loop's labelled batch: (images, skipped flags (none), labels)
                flags = torch.zeros(index.shape[0], dtype=torch.bool, device=index.device)
                yield self.images.index_select(0, index), flags, self.labels.index_select(0, index)
