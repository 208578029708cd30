"""Content images for style-transfer training: random square crops from an image folder (COCO in real use, the
embedded photos in data/style/content by default), on the resumable IterationSampler of `ImageDataModule`.

Reproducible crops: a DataLoader worker's global RNG depends on the worker count and restarts on resume, so the crop
of each item is drawn from a generator seeded by (data seed, position in the global sample stream). The sampler here
yields `(image index, stream position)` pairs; a straight run and one resumed at any iteration see the very same
crops, whatever `num_workers` is. Decoding and resizing happen in the loader workers; the items are uint8.

An unreadable file is skipped with a warning and replaced by the next readable one (each item carries a 0/1 flag
the model sums into `data/skipped_files`), or stops the run with its path under `data.on_corrupt=error`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from pixelsmith.data.base import ImageDataModule
from pixelsmith.data.sampler import IterationSampler
from pixelsmith.errors import PixelsmithError
from pixelsmith.style.data import (
    EMBEDDED_CONTENT_DIR,
    IMAGE_EXTENSIONS,
    ContentImageDataset,
    ImageReadError,
)

log = logging.getLogger(__name__)

# Decoded images are cached per worker for small folders only (the embedded set, a few styles' worth of photos):
# COCO's 118k images at 256 px would need ~30 GB per worker.
CACHE_MAX_IMAGES = 2000


class ContentDataError(PixelsmithError, ValueError):
    pass


def _crop_seed(seed: int, position: int) -> int:
    # Distinct per (seed, position), reproducible, and inside the generator's 64-bit seed range.
    return (seed * 1_000_003 + position * 7_919 + 17) % (2**63 - 1)


class PositionTaggedSampler(IterationSampler):
    """IterationSampler whose items are `(index, global stream position)`: the same indices in the same order
    (the base class walks the stream), plus the position that seeds each item's random crop."""

    def _positions(self) -> Iterator[int]:
        global_batch = self.batch_per_rank * self.world_size
        for iteration in range(self.start, self.start + self.num_iterations):
            first = iteration * global_batch + self.rank * self.batch_per_rank
            yield from range(first, first + self.batch_per_rank)

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        return zip(super().__iter__(), self._positions(), strict=True)


class SeededContentCrops(ContentImageDataset):
    """`ContentImageDataset` indexed by `(index, position)`: the crop comes from a generator seeded by the position.

    Items are `(uint8 (3, crop, crop), skipped flag)`.
    """

    def __init__(
        self,
        root: str | Path,
        crop_size: int,
        resize_shorter: int | None,
        seed: int,
        on_corrupt: str = "skip",
        limit: int | None = None,
    ):
        if on_corrupt not in ("skip", "error"):
            raise ContentDataError(f"data.on_corrupt={on_corrupt!r}: choose skip or error.")
        super().__init__(root, crop_size, resize_shorter, samples_per_epoch=None, cache=False)
        if limit:
            self.paths = self.paths[:limit]
        self.samples_per_epoch = len(self.paths)
        self.cache = {} if len(self.paths) <= CACHE_MAX_IMAGES else None
        self.seed = seed
        self.on_corrupt = on_corrupt

    def __getitem__(self, key: tuple[int, int]) -> tuple[Tensor, int]:  # type: ignore[override]
        index, position = key
        for attempt in range(len(self.paths)):
            path_index = (index + attempt) % len(self.paths)
            try:
                image = self._load(path_index)
                break
            except ImageReadError as err:
                if self.on_corrupt == "error":
                    raise ContentDataError(
                        f"Cannot read content image {self.paths[path_index]}: {err}. Remove or fix the file, or "
                        "set data.on_corrupt=skip to skip unreadable files with a warning."
                    ) from err
                log.warning("Skipping unreadable content image %s (%s).", self.paths[path_index], err)
        else:
            raise ContentDataError("No content image in the folder could be read; see the warnings above.")
        generator = torch.Generator().manual_seed(_crop_seed(self.seed, position))
        height, width = image.shape[-2:]
        top = int(torch.randint(0, height - self.crop_size + 1, (), generator=generator))
        left = int(torch.randint(0, width - self.crop_size + 1, (), generator=generator))
        crop = image[:, top : top + self.crop_size, left : left + self.crop_size].contiguous()
        return crop, int(attempt > 0)


class StyleContentDataModule(ImageDataModule):
    """`data=style_content`: `resolution` is the crop side; images are first resized so their shorter side is
    `resize_shorter` (default: the crop side, so a crop spans the image's shorter side)."""

    def __init__(
        self,
        root: str | None = None,
        resolution: int = 256,
        resize_shorter: int | None = None,
        channels: int = 3,
        on_corrupt: str = "skip",
        limit: int | None = None,
        **loader_kwargs,
    ):
        super().__init__(**loader_kwargs)
        if channels != 3:
            raise ContentDataError(f"data.channels={channels}: style transfer trains on RGB images (3).")
        if resize_shorter is not None and resize_shorter < resolution:
            raise ContentDataError(
                f"data.resize_shorter={resize_shorter} is smaller than the crop data.resolution={resolution}; "
                f"use data.resize_shorter>={resolution} or null (= the crop size)."
            )
        self.root = Path(root).expanduser() if root else EMBEDDED_CONTENT_DIR
        self.resolution = resolution
        self.resize_shorter = resize_shorter
        self.on_corrupt = on_corrupt
        self.limit = limit

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise ContentDataError(
                f"data.root={str(self.root)!r} is not a folder. Point it at a folder of content photos (COCO "
                f"train2014 in the paper), e.g. data.root=/path/to/coco/train2014; subfolders are searched."
            )
        # Stop at the first image: a full listing of COCO's 118k files happens once, in the dataset.
        if not any(p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() for p in self.root.rglob("*")):
            raise ContentDataError(
                f"data.root={str(self.root)!r} holds no images ({', '.join(IMAGE_EXTENSIONS)}), searched "
                "recursively. Check the path."
            )

    def prepare_data(self) -> None:
        self._check_root()  # before any process group or output exists

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self._check_root()
        self.train_set = SeededContentCrops(
            self.root, self.resolution, self.resize_shorter, self.seed, self.on_corrupt, self.limit
        )

    def train_dataloader(self) -> DataLoader:
        # The base class decides the per-rank batch, the start iteration and the worker settings; only the sampler
        # is swapped for the position-tagged one (same indices, same order).
        base = super().train_dataloader()
        s = base.sampler
        sampler = PositionTaggedSampler(
            s.n, s.batch_per_rank, s.seed, s.start, s.num_iterations, rank=s.rank, world_size=s.world_size
        )
        return DataLoader(
            base.dataset,
            batch_size=base.batch_size,
            sampler=sampler,
            num_workers=base.num_workers,
            pin_memory=base.pin_memory,
            persistent_workers=base.persistent_workers,
            prefetch_factor=base.prefetch_factor,
            worker_init_fn=base.worker_init_fn,  # workers ignore Ctrl-C (data/base.py)
            drop_last=False,
        )
