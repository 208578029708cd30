"""Users' own images: a recursive folder of jpg/png/webp, decoded to uint8 in loader workers, resized (shorter side,
antialiased) and center-cropped to a square resolution.

Every file is decoded once at set-up (`data/image_check.py`, parallel, cached by path + mtime + size): with
`data.on_corrupt=skip` the broken ones are warned about once each and left out, and `data/skipped_files` counts
them (distinct files); with `error` the run stops there, before the first iteration, naming them. A file that
breaks after the check is still skipped with a warning and replaced by the next readable one so every batch keeps
its size (each item carries a 0/1 flag the model adds to `data/skipped_files`). An empty or missing folder is an
error at set-up. Large non-JPEG images are decoded once to the training size and cached on disk
(`decode_cached`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset

from pixelsmith.data.base import ImageDataModule, MirroredDataset, seeded_batches
from pixelsmith.data.fingerprint import fingerprint_image_folder
from pixelsmith.data.image_check import check_images, default_cache_dir
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


class DataFolderError(PixelsmithError, ValueError):
    pass


# An image whose shorter side is below 1/SMALL_IMAGE_FACTOR of the training resolution is "far smaller" than it:
# upscaled more than 4x, it trains as a blur (a 1x1 file became a solid square). The check (set-up of an image folder,
# prepare.py's inputs) leaves such images out with a warning that counts them, or stops with data.on_corrupt=error.
SMALL_IMAGE_FACTOR = 4


class ImageTooSmallError(ValueError):
    """An image far smaller than the resolution it would be trained at (SMALL_IMAGE_FACTOR)."""


def check_not_too_small(width: int, height: int, resolution: int) -> None:
    if min(width, height) * SMALL_IMAGE_FACTOR < resolution:
        raise ImageTooSmallError(
            f"{width}x{height} px, far smaller than the {resolution}-px training square (shorter side under "
            f"{-(-resolution // SMALL_IMAGE_FACTOR)} px: upscaled more than {SMALL_IMAGE_FACTOR}x)"
        )


def list_images(root: str | Path, extensions: list[str]) -> list[Path]:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataFolderError(
            f"data.root={str(root)!r} is not a folder. Point it at a folder of images, e.g. "
            "data=image_folder data.root=/path/to/images (subfolders are searched too)."
        )
    suffixes = {"." + e.lower().lstrip(".") for e in extensions}
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    if not files:
        raise DataFolderError(
            f"data.root={str(root)!r} holds no images with extensions {sorted(suffixes)} (searched recursively). "
            "Check the path, or set data.extensions=[...] to match your files."
        )
    return files


# Integer modes wider than 8 bits (16-bit PNG/TIFF grey): Pillow's convert("L") clips them to 255 (a 16-bit image
# at mid-grey came out pure white); they are scaled to 8 bits instead.
_WIDE_INTEGER_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def to_8bit(img: Image.Image, stretch: bool = False) -> Image.Image:
    """A wide grey image as 8-bit L: divided by 257, or (`stretch`, prepare.py's `high_bit_depth=stretch`) spread
    from its own min..max over 0..255. Other modes pass through."""
    if img.mode not in _WIDE_INTEGER_MODES:
        return img
    values = np.asarray(img, dtype=np.float64)
    if stretch:
        low, high = float(values.min()), float(values.max())
        values = (values - low) * (255.0 / max(high - low, 1e-12))
    else:
        values = values / 257.0
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), mode="L")


def decode_square(path: Path, resolution: int, channels: int) -> torch.Tensor:
    """uint8 CHW: EXIF-oriented, converted to L/RGB (16-bit scaled, not clipped), shorter side resized to
    `resolution`, center-cropped."""
    with Image.open(path) as img:
        # JPEG can decode at 1/2, 1/4 or 1/8 scale: a 144-megapixel photo for a 64 px model then costs a few MB.
        img.draft("RGB" if channels == 3 else "L", (2 * resolution, 2 * resolution))
        img = ImageOps.exif_transpose(img)
        img = to_8bit(img).convert("L" if channels == 1 else "RGB")
        if img.size != (resolution, resolution):  # a prepared archive's images are already the square
            img = ImageOps.fit(img, (resolution, resolution), method=Image.Resampling.LANCZOS)
        pixels = np.asarray(img).reshape(resolution, resolution, channels)
    # HWC -> CHW in numpy: torch's permute().contiguous() of a small uint8 image took ~10x longer (its threads).
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy())  # a C-ordered copy: Pillow's array is read-only


# Above this many pixels a non-JPEG file (JPEG decodes at a reduced scale anyway) is decoded once: its training square
# is kept in $PIXELSMITH_CACHE/decoded/ and read from there on every later draw. A 144-megapixel PNG took 2.2 GB and
# a full decode on every draw, in every loader worker.
LARGE_IMAGE_PIXELS = 4_000_000


def decoded_cache_dir() -> Path:
    return default_cache_dir().parent / "decoded"


def decode_cached(path: Path, resolution: int, channels: int, cache_dir: Path | None = None) -> torch.Tensor:
    """`decode_square`, with large images' squares cached on disk (keyed by path, mtime, size and output shape)."""
    with Image.open(path) as img:  # reads the header only
        large = img.width * img.height > LARGE_IMAGE_PIXELS and img.format != "JPEG"
    if not large:
        return decode_square(path, resolution, channels)
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_mtime_ns}|{stat.st_size}|{resolution}|{channels}"
    cached = (cache_dir or decoded_cache_dir()) / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npy"
    try:
        array = np.load(cached, allow_pickle=False)
        if array.shape == (channels, resolution, resolution) and array.dtype == np.uint8:
            return torch.from_numpy(array)
    except (OSError, ValueError):
        pass  # not cached yet, or unreadable: decode again
    square = decode_square(path, resolution, channels)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
        with open(partial, "wb") as handle:
            np.save(handle, square.numpy())
        os.replace(partial, cached)  # several workers may write the same square: each write is whole
    except OSError as err:
        log.debug("Could not cache the decoded square of %s: %s", path, err)
    return square


class ImageFolderDataset(Dataset):
    def __init__(self, files: list[Path], resolution: int, channels: int, on_corrupt: str = "skip"):
        if on_corrupt not in ("skip", "error"):
            raise ValueError(f"data.on_corrupt={on_corrupt!r}: choose skip or error.")
        self.files = files
        self.resolution = resolution
        self.channels = channels
        self.on_corrupt = on_corrupt

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        for attempt in range(len(self.files)):
            path = self.files[(index + attempt) % len(self.files)]
            try:
                return decode_cached(path, self.resolution, self.channels), int(attempt > 0)
            except Exception as err:  # PIL raises many types for bad files; all mean "unreadable"
                if self.on_corrupt == "error":
                    raise DataFolderError(
                        f"Cannot read image {path}: {err}. Remove or fix the file, or set data.on_corrupt=skip to "
                        "skip unreadable files with a warning."
                    ) from err
                log.warning("Skipping unreadable image %s (%s); using the next file instead.", path, err)
        raise DataFolderError("No image in the folder could be read; see the warnings above for each file.")


class ImageFolderDataModule(ImageDataModule):
    default_extractor = "inception"  # the standard FID network; its weights file must be on disk

    def __init__(
        self,
        root: str | None,
        resolution: int = 64,
        channels: int = 3,
        extensions: list[str] | None = None,
        on_corrupt: str = "skip",
        limit: int | None = None,
        mirror: bool = False,
        **loader_kwargs,
    ):
        super().__init__(**loader_kwargs)
        self.mirror = mirror
        if root is None:
            raise DataFolderError("data=image_folder needs data.root=/path/to/images.")
        self.root = root
        self.resolution = resolution
        self.channels = channels
        self.extensions = list(extensions or ["jpg", "jpeg", "png", "webp"])
        self.on_corrupt = on_corrupt
        self.limit = limit
        self.broken_files: dict[Path, str] = {}
        self._usable: list[Path] | None = None  # check_data's verdict, reused by setup()

    def prepare_data(self) -> None:
        # Once per machine, before any process group or output exists: list (an empty folder fails here) and check
        # every file, so each rank's setup() below reads the same verdicts from the cache instead of decoding all.
        self._check(self._files())

    def check_data(self) -> None:
        """The set-up's checks, run by train.py before the run writes anything: a missing or empty folder, broken or
        far too small images under data.on_corrupt=error, no usable image at all. setup() reuses the verdicts."""
        self._usable = self._usable_files()
        self._check_batch(self._usable)

    def _check_batch(self, usable: list[Path]) -> None:
        where = f"data.root={self.root!r}" + (f" with data.limit={self.limit}" if self.limit else "")
        where += " (and data.mirror's flipped copies)" if self.mirror else ""
        # The usable images only: the ones the check above left out were named in its warnings.
        self.check_fits_one_batch(len(usable) * (2 if self.mirror else 1), where)

    def _files(self) -> list[Path]:
        files = list_images(self.root, self.extensions)
        return files[: self.limit] if self.limit else files

    def _check(self, files: list[Path]) -> dict[Path, str]:
        return check_images(self.root, files, self._decode_checked, context=f"{self.resolution}")

    def _decode_checked(self, path: Path) -> torch.Tensor:
        with Image.open(path) as img:  # the header: the stored size, before any draft-mode reduction
            check_not_too_small(*img.size, self.resolution)
        return decode_cached(path, self.resolution, self.channels)

    def _usable_files(self) -> list[Path]:
        files = self._files()
        self.broken_files = self._check(files)
        small = {
            p: why for p, why in self.broken_files.items() if why.startswith(ImageTooSmallError.__name__)
        }
        unreadable = {p: why for p, why in self.broken_files.items() if p not in small}
        if unreadable and self.on_corrupt == "error":
            shown = "; ".join(f"{path} ({why})" for path, why in list(unreadable.items())[:5])
            more = f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else ""
            raise DataFolderError(
                f"{len(unreadable)} of {len(files)} images in data.root={self.root!r} cannot be read: "
                f"{shown}{more}. Remove or fix them, or set data.on_corrupt=skip to train on the readable ones "
                "(each broken file is then reported once and counted in data/skipped_files)."
            )
        if small:
            example, why = next(iter(small.items()))
            size = why.split(": ", 1)[-1].split(",")[0]
            what = (
                f"{len(small)} of {len(files)} images in data.root={self.root!r} are far smaller than "
                f"data.resolution={self.resolution} (shorter side under "
                f"{-(-self.resolution // SMALL_IMAGE_FACTOR)} px, e.g. {example}: {size}): each would be upscaled "
                f"more than {SMALL_IMAGE_FACTOR}x into a blur"
            )
            if self.on_corrupt == "error":
                raise DataFolderError(
                    f"{what}. Remove them or lower data.resolution, or set data.on_corrupt=skip to leave them out "
                    "with a warning."
                )
            log.warning(
                "%s; they are left out of training (counted in data/skipped_files). Remove them, or lower "
                "data.resolution to train on them; data.on_corrupt=error stops instead.",
                what,
            )
        for path, why in unreadable.items():
            log.warning("Skipping unreadable image %s (%s); it is left out of training.", path, why)
        readable = [f for f in files if f not in self.broken_files]
        if not readable:
            raise DataFolderError(
                f"None of the {len(files)} images in data.root={self.root!r} can be used (see the warnings above)."
            )
        return readable

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        readable = self._usable if self._usable is not None else self._usable_files()
        self._check_batch(readable)
        dataset = ImageFolderDataset(readable, self.resolution, self.channels, self.on_corrupt)
        self.train_set = MirroredDataset(dataset) if self.mirror else dataset

    @property
    def skipped_file_count(self) -> int:
        """Distinct files left out because they do not decode (the `data/skipped_files` metric starts here)."""
        return len(self.broken_files)

    def reference_source(self, seed: int = 0, batch_size: int = 64):
        """(fingerprint, protocol, batch factory, image count) of the real images for FID reference statistics,
        decoded exactly as for training, in a seeded order so any prefix is a random subset. The folder's own images
        (data.mirror's flipped copies are an augmentation of them, not more of the distribution to match)."""
        dataset = getattr(self.train_set, "source", self.train_set)
        fingerprint = (
            f"{fingerprint_image_folder(self.root, tuple('.' + e for e in self.extensions))}:seed={seed}"
        )
        protocol = (
            f"image_folder: exif_transpose, ImageOps.fit LANCZOS to {self.resolution}px, {self.channels} ch"
        )

        def make_batches():
            return seeded_batches(dataset, seed, batch_size)

        return fingerprint, protocol, make_batches, len(dataset)
