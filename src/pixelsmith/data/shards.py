"""Streaming shards for data beyond one disk: `data=shards data.path=DIR|s3://bucket/prefix`, written by
`python prepare.py ... format=shards` (litdata's `optimize`), read with litdata's StreamingDataset.

Why litdata (Lightning's own) over WebDataset: it splits the chunks between ranks and loader workers itself (each
sample once per epoch, no duplicates, `drop_last` aside), shuffles chunks and samples per epoch from a seed, reads
local folders and object stores alike (s3://, gs://, azure:// through its downloader with a local chunk cache), and
its `StreamingDataLoader` has a `state_dict()`, which Lightning checkpoints and restores: a resumed run continues the
stream where it stopped. WebDataset is lighter but has no resume of its own (we would count and skip samples by
hand). The cost is its dependencies (boto3, obstore), so it is an optional extra: `pip install -e ".[stream]"`.

Each sample is `{"index": int, "image": encoded bytes (png or jpeg), "label": int (-1: none)}`; decoding happens in
the loader workers (`DecodingStreamingDataset.__getitem__`), as for the other sources, into uint8 CHW squares. Bad
data keeps the other sources' guarantees: a sample that does not decode is replaced by the worker's last good one
and flagged (counted in `data/skipped_files`) with `data.on_corrupt=skip`, or stops the run naming the shard folder
and the sample's index with `error`; a folder without litdata's `index.json` stops at set-up naming the fix.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pixelsmith.data.base import ImageDataModule, per_rank_batch, worker_ignoring_ctrl_c
from pixelsmith.data.decode import DecodesOnDevice, decode_bytes
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


class ShardsError(PixelsmithError, ValueError):
    pass


def _litdata():
    try:
        import litdata
    except ImportError:
        raise ShardsError(
            'data=shards streams litdata shards, and litdata is not installed: pip install -e ".[stream]" (or '
            "pip install litdata). Without it, use data=zip."
        ) from None
    return litdata


try:  # an optional extra: without it the class below is never built (`_litdata()` says what to install)
    from litdata import StreamingDataset as _StreamingDataset
except ImportError:  # pragma: no cover - the dev install has it
    _StreamingDataset = object


# What prepare.py stores (`{"index": int, "image": bytes, "label": int}`). litdata also has serializers that unpickle
# ("pickle", "graph:pickle", ...): an index.json naming one would have every loader worker unpickle chunk bytes, which
# can run any code they carry, so shards whose index declares anything else are refused before a chunk is read.
DATA_ONLY_FORMATS = frozenset({"int", "bytes"})


def _read_json(path: Path, data_path: str, resolution: int) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ShardsError(
            f"{path} (of data.path={data_path!r}) does not read as JSON ({type(err).__name__}: {err}). Rebuild the "
            f"shards: python prepare.py source=<your images> dest={data_path} format=shards resolution={resolution} "
            "overwrite=true."
        ) from None
    if not isinstance(value, dict):
        raise ShardsError(f"{path} (of data.path={data_path!r}) holds no JSON object; rebuild the shards.")
    return value


def check_index(index_file: Path, data_path: str, resolution: int) -> None:
    """Refuse shards whose litdata index declares fields stored other than as data (DATA_ONLY_FORMATS)."""
    config = _read_json(index_file, data_path, resolution).get("config") or {}
    formats = config.get("data_format") or []
    unsafe = sorted({str(f) for f in formats} - DATA_ONLY_FORMATS) if isinstance(formats, list) else ["?"]
    if unsafe or config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
        raise ShardsError(
            f"The shards in {data_path} declare fields stored as {', '.join(unsafe) or config.get('item_loader')} "
            f"({index_file}): reading them would unpickle chunk data, which can run any code it carries, so they "
            "are refused. Pixelsmith's shards hold integers and encoded image bytes only; write them with: python "
            f"prepare.py source=<your images> dest=<folder> format=shards resolution={resolution}."
        )


class DecodingStreamingDataset(_StreamingDataset):
    """litdata's StreamingDataset whose samples come out decoded: `(image, skipped_flag[, label])`. At module level so
    loader workers started by spawn can unpickle it."""

    def __init__(
        self,
        *args,
        resolution: int,
        channels: int,
        labels: bool,
        on_corrupt: str,
        decoder: str = "pil",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        # A remote source's index.json is in the local cache now, and no chunk has been read yet.
        index_file = Path(self.input_dir.path or "") / "index.json"
        if self.input_dir.path and index_file.is_file():
            check_index(index_file, str(self.input_dir.url or self.input_dir.path), resolution)
        self.resolution, self.channels, self.decoder = resolution, channels, decoder
        self.use_labels, self.on_corrupt = labels, on_corrupt
        self._last_good: tuple[torch.Tensor, torch.Tensor] | None = None

    def __getitem__(self, index: Any):
        sample = super().__getitem__(index)
        label = torch.tensor(int(sample["label"]), dtype=torch.int64)
        flag = 0
        try:
            if self.decoder == "nvjpeg":  # decoded on the device a batch at a time (on_before_batch_transfer)
                image = torch.frombuffer(bytearray(sample["image"]), dtype=torch.uint8)
            else:
                image = decode_bytes(sample["image"], self.resolution, self.channels, self.decoder)
            self._last_good = (image, label)
        except Exception as err:  # Pillow raises many types for bad data; all mean "unreadable"
            where = (
                f"sample {sample.get('index')} of the shards in {self.input_dir.path or self.input_dir.url}"
            )
            if self.on_corrupt == "error" or self._last_good is None:
                raise ShardsError(
                    f"Cannot decode {where}: {err}. Rebuild the shards with `python prepare.py ... format=shards` "
                    "(it skips and names unreadable images), or set data.on_corrupt=skip."
                ) from err
            log.warning("Skipping undecodable %s (%s); repeating this worker's previous image.", where, err)
            image, label = self._last_good
            flag = 1
        if self.use_labels:
            return image, flag, label
        return image, flag


def check_cache_size(value: str) -> str:
    """`data.max_cache_size` as litdata reads it: a size with its unit ("50GB", "500MB"). A fraction of the free disk,
    which litdata also takes, is refused: litdata works it out, and logs it, again at every epoch."""
    text = str(value).strip()
    try:
        from litdata.utilities.format import _convert_bytes_to_int

        if text.isdigit() or _convert_bytes_to_int(text) <= 0:
            raise ValueError(text)
    except ImportError:
        return text  # without litdata, set-up stops at _litdata() naming what to install
    except (ValueError, KeyError, TypeError):
        raise ShardsError(
            f"data.max_cache_size={value!r}: give the most disk litdata's chunk cache may take, with its unit, "
            "e.g. data.max_cache_size=50GB (or 500MB)."
        ) from None
    return text


def _dataset_class():
    _litdata()
    return DecodingStreamingDataset


class ShardsDataModule(DecodesOnDevice, ImageDataModule):
    """`data=shards`: litdata shards from a local folder or an object-store URL; see the module docstring."""

    default_extractor = "inception"

    def __init__(
        self,
        path: str | None,
        resolution: int = 64,
        channels: int = 3,
        labels: bool = False,
        on_corrupt: str = "skip",
        shuffle: bool = True,
        cache_dir: str | None = None,
        limit: int | None = None,
        decoder: str = "auto",
        max_cache_size: str = "50GB",
        **loader_kwargs,
    ):
        super().__init__(**loader_kwargs)
        self.decoder = decoder
        if path is None:
            raise ShardsError("data=shards needs data.path=/path/to/shards (or s3://bucket/prefix).")
        if on_corrupt not in ("skip", "error"):
            raise ValueError(f"data.on_corrupt={on_corrupt!r}: choose skip or error.")
        self.path, self.resolution, self.channels = str(path), resolution, channels
        self.use_labels, self.on_corrupt, self.shuffle = labels, on_corrupt, shuffle
        self.cache_dir, self.limit = cache_dir, limit
        self.max_cache_size = check_cache_size(max_cache_size)
        self._loader = None

    @property
    def is_local(self) -> bool:
        return "://" not in self.path or self.path.startswith("local:")

    def _check_local(self) -> None:
        folder = Path(self.path.removeprefix("local:")).expanduser()
        if not (folder / "index.json").is_file():
            raise ShardsError(
                f"data.path={self.path!r} holds no litdata shards (no index.json). Write them with `python "
                f"prepare.py source=<images> dest={self.path} format=shards resolution={self.resolution}`."
            )
        check_index(folder / "index.json", self.path, self.resolution)
        meta_file = folder / "pixelsmith.json"
        if meta_file.is_file():
            meta = _read_json(meta_file, self.path, self.resolution)
            stored = meta.get("resolution")
            if isinstance(stored, int) and stored != self.resolution:
                raise ShardsError(
                    f"The shards in {self.path} hold {stored}x{stored} images, and data.resolution={self.resolution}"
                    f": every image would be resized on every draw. Train at data.resolution={stored}, or write "
                    f"shards at this resolution: python prepare.py source=<your images> dest=<new folder> "
                    f"format=shards resolution={self.resolution}."
                )
            if self.use_labels and not meta.get("labelled"):
                raise ShardsError(
                    f"data.labels=true, but the shards in {self.path} were written without labels. Prepare them "
                    "from labelled images (class subfolders, a labelled zip), or set data.labels=false."
                )
        chunks = _read_json(folder / "index.json", self.path, self.resolution).get("chunks") or []
        images = sum(int(chunk.get("chunk_size", 0)) for chunk in chunks if isinstance(chunk, dict))
        self.check_fits_one_batch(min(images, self.limit or images), self._where(), drops_partial=True)

    def prepare_data(self) -> None:
        _litdata()
        if self.is_local:
            self._check_local()

    def check_data(self) -> None:
        """The set-up's checks, before the run writes anything (ImageDataModule.check_data)."""
        self.prepare_data()

    def label_classes(self) -> int | None:
        if not self.use_labels:
            return 0
        meta_file = Path(self.path.removeprefix("local:")).expanduser() / "pixelsmith.json"
        if not (self.is_local and meta_file.is_file()):
            return None  # remote shards: known only once read
        classes = _read_json(meta_file, self.path, self.resolution).get("classes")
        return int(classes) if isinstance(classes, int) else None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.prepare_data()
        litdata = _litdata()
        input_dir = self.path.removeprefix("local:")
        if self.cache_dir is not None:
            input_dir = litdata.streaming.resolver.Dir(path=self.cache_dir, url=self.path)
        self.set_decoder(self.choose_decoder(self.decoder, self._stores_jpeg()))
        self.train_set = self._dataset(input_dir)
        world = self.trainer.world_size if self.trainer is not None else 1
        total = len(self.train_set) * world  # litdata's length is this rank's share
        if self.limit and self.limit < total:  # a fraction of the shards (litdata's subsample)
            self.train_set = self._dataset(input_dir, subsample=self.limit / total)
            total = len(self.train_set) * world
        # Known here only for a remote path (check_data counted a local folder's index before anything was written).
        self.check_fits_one_batch(total, self._where(), drops_partial=True)
        log.info(
            "data=shards: %d images in %s; litdata's chunk cache holds at most %s (data.max_cache_size)%s.",
            total,
            self.path,
            self.max_cache_size,
            f" in {self.cache_dir}" if self.cache_dir else "",
        )

    def _where(self) -> str:
        return f"data.path={self.path!r}" + (f" with data.limit={self.limit}" if self.limit else "")

    def _stores_jpeg(self) -> bool:
        meta_file = Path(self.path.removeprefix("local:")).expanduser() / "pixelsmith.json"
        if self.is_local and meta_file.is_file():
            return _read_json(meta_file, self.path, self.resolution).get("encoding") == "jpeg"
        return False  # unknown (a remote path): the loader workers decode whatever it is

    def _dataset(self, input_dir: Any, **extra: Any):
        return _dataset_class()(
            input_dir,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=True,  # every rank the same number of batches: a rank that ran dry would hang the others
            resolution=self.resolution,
            channels=self.channels,
            labels=self.use_labels,
            on_corrupt=self.on_corrupt,
            decoder=self.decoder_used,
            # A size, not litdata's default (None): that one is worked out, and logged, again at every epoch.
            max_cache_size=self.max_cache_size,
            **extra,
        )

    def train_dataloader(self):
        litdata = _litdata()
        trainer = self.trainer
        world = trainer.world_size if trainer is not None else 1
        rank = trainer.global_rank if trainer is not None else 0
        batch = per_rank_batch(self.batch_size, world, self.accumulate)
        workers = self.num_workers
        self._loader = litdata.StreamingDataLoader(
            self.train_set,
            batch_size=batch,
            num_workers=workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            drop_last=True,
            worker_init_fn=partial(worker_ignoring_ctrl_c, rank=rank) if workers > 0 else None,
            **({"collate_fn": self.collate_fn} if self.collate_fn is not None else {}),
        )
        return self._loader

    @property
    def skipped_file_count(self) -> int:
        return 0  # nothing is checked ahead: undecodable samples are counted as they are met

    def reference_source(self, seed: int = 0, batch_size: int = 64):
        """(fingerprint, protocol, batch factory, image count) for FID reference statistics: the shards' images in
        their stored order (the first `reference_samples` of them), decoded as for training."""
        dataset_class = _dataset_class()
        reader = dataset_class(
            self.path.removeprefix("local:"),
            shuffle=False,
            resolution=self.resolution,
            channels=self.channels,
            labels=False,
            on_corrupt="skip",
            max_cache_size=self.max_cache_size,
        )
        # Every image, whatever rank builds the statistics: litdata would read only this rank's share.
        from litdata.utilities.env import _DistributedEnv

        reader.distributed_env = _DistributedEnv(1, 0, 1)
        fingerprint = f"shards:{self.path}:{len(reader)}:seed={seed}"
        protocol = f"shards: ImageOps.fit LANCZOS to {self.resolution}px, {self.channels} ch"

        def make_batches():
            for start in range(0, len(reader), batch_size):
                yield torch.stack([reader[i][0] for i in range(start, min(start + batch_size, len(reader)))])

        return fingerprint, protocol, make_batches, len(reader)
