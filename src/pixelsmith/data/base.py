"""Base datamodule: global batch -> per-rank loader batch, the resumable sampler, and the loader settings
(workers, pinned memory, persistent workers, prefetch) that the hardware profile chooses. Loader workers ignore
Ctrl-C, which the training process handles for them (`worker_ignoring_ctrl_c`). `data.mirror` doubles a dataset
with its x-flipped copies (`MirroredDataset`; MNIST and the image folder take it), as NVlabs' `--mirror`."""

from __future__ import annotations

import os
import signal
from functools import partial

import lightning as L
import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import DataLoader, Dataset

from pixelsmith.data.on_device import DeviceResidentBatches
from pixelsmith.data.sampler import IterationSampler
from pixelsmith.errors import PixelsmithError


class BatchSizeError(PixelsmithError, ValueError):
    pass


def flip_x(item):
    """An item with its image mirrored left-right (the last axis); a (image, *extras) tuple keeps its extras."""
    if isinstance(item, tuple):
        return (item[0].flip(-1), *item[1:])
    return item.flip(-1)


class MirroredDataset(Dataset):
    """`source` followed by its x-flipped copies: item i < n is source[i], item n + i is source[i] mirrored (NVlabs'
    `Dataset(xflip=True)` order: the raw indices tiled twice, the second half flipped). Flipping happens where the
    item is read (in the loader workers), so the doubled dataset costs no memory."""

    def __init__(self, source: Dataset):
        self.source = source
        self.source_len = len(source)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return 2 * self.source_len

    def __getitem__(self, index: int):
        if index < 0:
            index += len(self)
        if index >= self.source_len:
            return flip_x(self.source[index - self.source_len])
        return self.source[index]


def worker_ignoring_ctrl_c(worker_id: int, rank: int) -> None:
    """A loader worker's start. Ctrl-C in a terminal reaches every process of the group, workers included, and a
    worker ends on it; the training process would then fail on a dead worker instead of finishing its iteration
    and writing last.ckpt (core/preemption.py). The workers leave it to the training process, which ends them.
    Then Lightning's own per-worker seeding, which it adds only to a loader without a `worker_init_fn`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id, rank=rank)


def per_rank_batch(global_batch: int, world_size: int, accumulate: int) -> int:
    """Images one rank loads per iteration: its share of the global micro-batch, times the micro-batch count."""
    if global_batch < world_size or global_batch % world_size:
        suggestion = max(world_size, (global_batch // world_size) * world_size)
        raise BatchSizeError(
            f"data.batch_size={global_batch} (the global micro-batch, summed over processes) does not divide across "
            f"{world_size} processes (hardware.devices x hardware.num_nodes). Use a multiple of {world_size}, "
            f"e.g. data.batch_size={suggestion}."
        )
    return global_batch // world_size * accumulate


def seeded_batches(dataset: Dataset, seed: int, batch_size: int):
    """Batches of a dataset's images (item[0]) in a seeded order, so any prefix is a random subset: the real images of
    FID reference statistics (`reference_source` of the image folder and the zip)."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()  # type: ignore[arg-type]
    for start in range(0, len(order), batch_size):
        yield torch.stack([dataset[i][0] for i in order[start : start + batch_size]])


class ImageDataModule(L.LightningDataModule):
    """Subclasses build `self.train_set` in `setup()`; items are uint8 CHW tensors (decoding stays in workers).

    `on_device=True` serves a dataset that holds all its images in one tensor (`train_set.images`, e.g. MNIST's
    `TensorImageDataset`) from the training device instead of a DataLoader (`data/on_device.py`); other datasets
    ignore it."""

    def __init__(
        self,
        batch_size: int,
        accumulate: int = 1,
        max_steps: int = 1000,
        seed: int = 42,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        prefetch_factor: int = 2,
        on_device: bool = False,
    ):
        super().__init__()
        self.batch_size = batch_size
        self.accumulate = accumulate
        self.max_steps = max_steps
        self.seed = seed
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.on_device = on_device
        self.train_set: Dataset | None = None
        self.collate_fn = None  # a subclass's batch maker (encoded images for decoding on the device)

    def check_data(self) -> None:
        """The data's own start-up checks (a missing folder, unreadable files under data.on_corrupt=error, an archive
        at another resolution), which train.py runs before the run writes anything, so a refusal leaves the run dir
        free for the corrected command. Nothing to check here; a source that can fail overrides it."""

    def check_fits_one_batch(self, count: int, where: str, drops_partial: bool = False) -> None:
        """Refuse a dataset with fewer images than one iteration draws (`data.batch_size` x `accumulate`).

        The shards' loader keeps whole batches only (drop_last: every rank and worker must yield the same number), so
        such a dataset gives no batch at all and the run would end at once having trained nothing; the other sources
        would fill every batch with repeats of the same few images. Either way it is refused here, at set-up."""
        needed = self.batch_size * self.accumulate
        if count >= needed:
            return
        per_iteration = f"data.batch_size={self.batch_size}" + (
            f" x accumulate={self.accumulate} = {needed} images" if self.accumulate > 1 else ""
        )
        if drops_partial:
            consequence = (
                "Its loader keeps whole batches only (drop_last, so that every process and loader worker yields "
                "the same number), so not one batch would come and the run would train 0 iterations."
            )
        else:
            consequence = "Every batch would repeat the same images several times."
        largest = count // self.accumulate
        fix = (
            f"Use data.batch_size={largest} or smaller"
            if largest >= 1
            else f"Use a smaller accumulate (at most {count})"
        )
        raise BatchSizeError(
            f"{where} holds {count} image{'s' if count != 1 else ''}, fewer than one iteration takes "
            f"({per_iteration}). {consequence} {fix}, or train on more images."
        )

    def label_classes(self) -> int | None:
        """The classes the loader's integer labels span (largest + 1), which a conditional model's c_dim must
        cover; 0 when it yields no labels, None when that is unknown before reading the data (vector labels)."""
        return 0

    def _start_iteration(self) -> int:
        trainer = self.trainer
        module = trainer.lightning_module if trainer is not None else None
        return int(getattr(module, "iteration", 0))

    def train_dataloader(self) -> DataLoader | DeviceResidentBatches:
        assert self.train_set is not None, "setup() must build train_set"
        trainer = self.trainer
        rank = trainer.global_rank if trainer is not None else 0
        world = trainer.world_size if trainer is not None else 1
        batch = per_rank_batch(self.batch_size, world, self.accumulate)
        start = self._start_iteration()
        sampler = IterationSampler(
            len(self.train_set), batch, self.seed, start, self.max_steps - start, rank=rank, world_size=world
        )
        images = getattr(self.train_set, "images", None)
        if self.on_device and isinstance(images, torch.Tensor):
            device = trainer.strategy.root_device if trainer is not None else images.device
            return DeviceResidentBatches(images.to(device), sampler, getattr(self.train_set, "labels", None))
        workers = self.num_workers
        return DataLoader(
            self.train_set,
            batch_size=batch,
            sampler=sampler,
            num_workers=workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            worker_init_fn=partial(worker_ignoring_ctrl_c, rank=rank) if workers > 0 else None,
            drop_last=False,
            collate_fn=self.collate_fn,
        )
