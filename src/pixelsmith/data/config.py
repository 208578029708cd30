"""Schemas of the data group's options (`conf/data/mnist.yaml`, `image_folder.yaml`; a model part's own data, such as
style transfer's content photos, has its schema in that part), beside the datamodules: each holds only the keys its
datamodule takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from omegaconf import MISSING

from pixelsmith.config.choices import choice


class Decoder(StrEnum):  # data.decoder of data=zip / data=shards (data/decode.py)
    AUTO = "auto"
    PIL = "pil"
    SIMPLEJPEG = "simplejpeg"
    NVJPEG = "nvjpeg"


class OnCorrupt(StrEnum):  # an unreadable image file: skip it (warn, count) or stop with its path
    SKIP = "skip"
    ERROR = "error"


@dataclass
class DataConfig:
    """The loader keys every datamodule takes (pixelsmith.data.base.ImageDataModule); `data/_schema`.

    Each option of `conf/data/` has a schema of its own below (a subclass with only the keys its datamodule takes), so
    a key the datamodule would ignore (`data=mnist data.extensions=[png]`) fails at composition. A fork's datamodule
    adds its own subclass, registered in `register_configs` (or, untyped, a YAML option without `_schema`)."""

    _target_: str = MISSING
    name: str = MISSING
    batch_size: int | None = None  # global micro-batch summed over ranks; None = hardware profile default
    num_workers: int | None = None  # None = hardware profile default
    pin_memory: bool | None = None
    persistent_workers: bool = True
    prefetch_factor: int = 2
    limit: int | None = None  # use only the first N items (debugging)


@dataclass
class MNISTDataConfig(DataConfig):
    """`data=mnist` (pixelsmith.data.mnist.MNISTDataModule): the embedded digits, held in memory."""

    _target_: str = "pixelsmith.data.mnist.MNISTDataModule"
    name: str = "mnist"
    resolution: int = 32
    channels: int = 1  # 1 (grey) or 3 (repeated)
    # keep the images on the training device and slice batches there (data/on_device.py)
    on_device: bool = False
    mirror: bool = False  # x-flipped copies doubling the dataset (NVlabs' --mirror)
    labels: bool = False  # yield the digit labels (batch.labels) for class-conditional objectives


@dataclass
class ImageFolderDataConfig(DataConfig):
    """`data=image_folder` (pixelsmith.data.image_folder.ImageFolderDataModule): your images, searched recursively."""

    _target_: str = "pixelsmith.data.image_folder.ImageFolderDataModule"
    name: str = "image_folder"
    root: str | None = None
    resolution: int = 64
    channels: int = 3
    extensions: list[str] = field(default_factory=lambda: ["jpg", "jpeg", "png", "webp"])
    on_corrupt: str = choice(OnCorrupt, "skip")  # skip (warn and count) | error
    mirror: bool = False  # x-flipped copies doubling the dataset (NVlabs' --mirror)


@dataclass
class ZipDataConfig(DataConfig):
    """`data=zip` (pixelsmith.data.archive.ZipDataModule): a StyleGAN2-ADA dataset archive (dataset_tool.py's zip, or
    `python prepare.py`'s), or a folder with its layout, read in place."""

    _target_: str = "pixelsmith.data.archive.ZipDataModule"
    name: str = "zip"
    path: str | None = None
    resolution: int = 64
    channels: int = 3
    labels: bool = False  # the archive's dataset.json labels as batch.labels (class-conditional training)
    on_corrupt: str = choice(OnCorrupt, "skip")  # skip (warn and count) | error
    mirror: bool = False  # x-flipped copies doubling the dataset (NVlabs' --mirror)
    decoder: str = choice(Decoder, "auto")  # auto | pil | simplejpeg | nvjpeg (data/decode.py)


@dataclass
class ShardsDataConfig(DataConfig):
    """`data=shards` (pixelsmith.data.shards.ShardsDataModule): litdata shards written by `python prepare.py ...
    format=shards`, streamed from a local folder or an object store (s3://...). Needs the `stream` extra."""

    _target_: str = "pixelsmith.data.shards.ShardsDataModule"
    name: str = "shards"
    path: str | None = None
    resolution: int = 64
    channels: int = 3
    labels: bool = False  # the shards' labels as batch.labels (class-conditional training)
    on_corrupt: str = choice(OnCorrupt, "skip")  # skip (repeat the worker's last image, count) | error
    shuffle: bool = True  # chunks and samples shuffled per epoch from the run's seed
    cache_dir: str | None = None  # where chunks of a remote path are cached (null: litdata's default)
    decoder: str = choice(Decoder, "auto")  # auto | pil | simplejpeg | nvjpeg (data/decode.py)
    max_cache_size: str = "50GB"  # the most disk litdata's chunk cache may take (a size with its unit)
