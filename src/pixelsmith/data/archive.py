"""StyleGAN2-ADA dataset archives: `data=zip data.path=dataset.zip` (a zip made by NVlabs' `dataset_tool.py` or by
`python prepare.py`), or a folder holding the same layout (images and a `dataset.json`).

The layout, as NVlabs' `training/dataset.py` `ImageFolderDataset` reads it: image members anywhere in the archive
(png, jpg, jpeg, webp), taken in sorted name order, and an optional `dataset.json` at the root,
`{"labels": [["00000/img00000000.png", 6], ...]}` (null for unlabelled data), keyed by the member's name with `/`
separators. Integer labels are class indices (`batch.labels`, int64); list labels are vectors (float32). The zip is
read in place, never unpacked: each loader worker opens its own handle on first use (a zipfile handle shared across
fork() would interleave reads), and a dataset pickled to a worker carries no handle.

Bad data keeps the image folder's guarantees (`data/image_folder.py`): every member is decoded once at set-up, in
threads, and the verdicts are cached by (archive path, size, modification time); `data.on_corrupt=error` stops there
naming the members, `skip` warns once per member and leaves it out (counted in `data/skipped_files`). An archive
that is not a zip, a `dataset.json` that does not parse or names members the archive lacks, and an archive without
images each stop the run at set-up with one paragraph naming the file and the fix.

An archive is data from anywhere, read within limits: a member's declared size (`MAX_MEMBER_BYTES`) and compression
ratio (`MAX_RATIO`) are checked from the zip's directory before any byte of it is unpacked, only stored and deflated
members are unpacked (bzip2 and LZMA would unpack a whole read block at once, whatever was asked for), and the read
itself stops one byte past the declared size, so a member that lies about its size is refused too. A refused member
is an unreadable one (skipped and named, or the run stops with `on_corrupt=error`). `dataset.json` (at most
`MAX_LABELS_BYTES`) must be `{"labels": null}` or a list of `[member name, label]` pairs, every label a class index
in 0..MAX_CLASSES-1 or every label a list of the same number of finite numbers; anything else stops the run at
set-up in one paragraph.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset

from pixelsmith.data.base import ImageDataModule, MirroredDataset, seeded_batches
from pixelsmith.data.decode import DecodesOnDevice, decode_bytes, resolve_decoder
from pixelsmith.data.image_check import default_cache_dir
from pixelsmith.data.image_folder import DataFolderError
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")
LABELS_FILE = "dataset.json"
# Limits on a member before it is unpacked. A dataset image is a few MB at most (a 4096-px PNG); the loader checks
# 16 members at a time, so the size limit also bounds the set-up check's memory. Image formats are compressed
# already: a stored PNG or JPEG deflates by a few percent, so a ratio above MAX_RATIO on a member larger than
# _RATIO_FREE_BYTES is a zip bomb, not an image.
MAX_MEMBER_BYTES = 64 << 20
MAX_RATIO = 100
_RATIO_FREE_BYTES = 1 << 20
MAX_LABELS_BYTES = 128 << 20  # ImageNet's 1.28 M labels take some 45 MB
MAX_CLASSES = 100_000  # a class index, or a label vector's length, sizes a network's label input
_UNPACKED_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})


class ArchiveError(PixelsmithError, ValueError):
    pass


class ArchiveSource:
    """The members of a zip archive or of a folder with NVlabs' layout: `names` (sorted image members), `read(name)`
    (their bytes) and `labels` (name -> label, or None). Picklable; a zip handle is opened per process."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise ArchiveError(
                f"data.path={str(self.path)!r} does not exist. Point it at a dataset zip (NVlabs' dataset_tool.py or "
                "`python prepare.py source=... dest=out.zip`) or a folder with a dataset.json."
            )
        self.is_zip = self.path.is_file()
        if self.is_zip and not zipfile.is_zipfile(self.path):
            raise ArchiveError(
                f"data.path={str(self.path)!r} is not a zip archive (it may be truncated or another format). Rebuild "
                "it with `python prepare.py source=<your images> dest=<it>.zip`, or point data.path at the folder."
            )
        self._zip: zipfile.ZipFile | None = None
        self._zip_pid: int | None = None
        every = self._all_names()
        self.names = sorted(n for n in every if n.lower().endswith(IMAGE_EXTENSIONS))
        if not self.names:
            raise ArchiveError(
                f"data.path={str(self.path)!r} holds no images ({', '.join(IMAGE_EXTENSIONS)}). Check the path; "
                "`python prepare.py` turns a folder of images into such an archive."
            )
        self.labels = self._read_labels(LABELS_FILE in every)

    # ---- members -----------------------------------------------------------------------------------------------
    def _all_names(self) -> list[str]:
        if self.is_zip:
            return [n for n in self._archive().namelist() if not n.endswith("/")]
        return [p.relative_to(self.path).as_posix() for p in self.path.rglob("*") if p.is_file()]

    def _archive(self) -> zipfile.ZipFile:
        # One handle per process: a handle inherited through fork() shares its file offset with the parent's.
        if self._zip is None or self._zip_pid != os.getpid():
            self._zip = zipfile.ZipFile(self.path)
            self._zip_pid = os.getpid()
        return self._zip

    def read(self, name: str, limit: int | None = None, image: bool = True) -> bytes:
        """The bytes of member `name`, at most `limit` (MAX_MEMBER_BYTES) of them: ArchiveError for a member over the
        limits (module docstring) or one that does not unpack. `image`: its compression ratio is checked too (text
        such as dataset.json compresses far better than an image; its size limit bounds it)."""
        limit = MAX_MEMBER_BYTES if limit is None else limit
        if not self.is_zip:
            file = self.path / name
            if file.stat().st_size > limit:
                raise self._over_limit(name, f"is {file.stat().st_size:,} bytes", limit)
            with open(file, "rb") as handle:
                data = handle.read(limit + 1)  # bounded, should it grow meanwhile
            if len(data) > limit:
                raise self._over_limit(name, "grew while it was read", limit)
            return data
        archive = self._archive()
        try:
            info = archive.getinfo(name)
        except KeyError:
            raise ArchiveError(f"{self.path}!{name}: no such member in the archive.") from None
        self._check_member(info, limit, image)
        try:
            with archive.open(info) as member:
                data = member.read(info.file_size + 1)
        except (
            zipfile.BadZipFile,
            zlib.error,
            EOFError,
            NotImplementedError,
            RuntimeError,
            ValueError,
        ) as err:
            raise ArchiveError(
                f"{self.path}!{name} does not unpack ({type(err).__name__}: {err}). Rebuild the archive (python "
                "prepare.py skips and names unreadable images)."
            ) from None
        if len(data) != info.file_size:
            raise ArchiveError(
                f"{self.path}!{name} declares {info.file_size:,} bytes and unpacks to "
                f"{'more' if len(data) > info.file_size else f'{len(data):,}'}: the archive is corrupt or forged. "
                "Rebuild it (python prepare.py)."
            )
        return data

    def _check_member(self, info: zipfile.ZipInfo, limit: int, image: bool) -> None:
        """Refuse a member before any byte of it is unpacked: over the size limit, a ratio no image has, a method
        not unpacked here, or encrypted."""
        where = f"{self.path}!{info.filename}"
        if info.compress_type not in _UNPACKED_METHODS:
            raise ArchiveError(
                f"{where} is compressed with method {info.compress_type} (bzip2, LZMA or another), and archives are "
                "read stored or deflated only. Rebuild the archive with python prepare.py (or zip -Z store)."
            )
        if info.flag_bits & 0x1:
            raise ArchiveError(
                f"{where} is encrypted; archives are read unencrypted. Rebuild it without a password."
            )
        if info.file_size > limit:
            raise self._over_limit(info.filename, f"declares {info.file_size:,} bytes unpacked", limit)
        ratio = info.file_size / max(info.compress_size, 1)
        if image and info.file_size > _RATIO_FREE_BYTES and ratio > MAX_RATIO:
            raise ArchiveError(
                f"{where} declares {info.file_size:,} bytes packed into {info.compress_size:,} (a ratio of "
                f"{ratio:,.0f}:1, above the {MAX_RATIO}:1 no image reaches): a zip bomb, not an image. It is left "
                "unread; rebuild the archive from the images themselves (python prepare.py)."
            )

    def _over_limit(self, name: str, what: str, limit: int) -> ArchiveError:
        return ArchiveError(
            f"{self.path}{'!' if self.is_zip else '/'}{name} {what}, above the {limit:,} bytes this reader takes "
            "from one member; it is left unread. Resize the image, or remove it from the archive."
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_zip"] = state["_zip_pid"] = None  # a worker opens its own
        return state

    def stamp(self) -> str:
        """What identifies this archive's contents for the check cache: path, size and mtime (of dataset.json's
        folder for a folder source: its files are stamped one by one in the verdicts)."""
        stat = self.path.stat()
        return f"{self.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"

    # ---- labels ------------------------------------------------------------------------------------------------
    def _read_labels(self, present: bool) -> dict[str, Any] | None:
        if not present:
            return None
        where = f"{self.path}{'!' if self.is_zip else '/'}{LABELS_FILE}"
        try:
            document = json.loads(self.read(LABELS_FILE, limit=MAX_LABELS_BYTES, image=False))
        except (ValueError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nesting too deep
            raise ArchiveError(
                f"{where} does not parse as NVlabs' dataset.json ({type(err).__name__}: {str(err)[:200]}): it should "
                'read {"labels": [["00000/img00000000.png", 6], ...]} or {"labels": null}. Fix or remove it.'
            ) from None
        if not isinstance(document, dict):
            raise ArchiveError(
                f"{where} holds a JSON {type(document).__name__}, not NVlabs' object: it should read "
                '{"labels": [["00000/img00000000.png", 6], ...]} or {"labels": null}. Fix or remove it.'
            )
        table = document.get("labels")
        if table is None:
            return None
        labels = check_label_table(table, where)
        missing = [n for n in self.names if n not in labels]
        if missing:
            raise ArchiveError(
                f"{where} gives no label for {len(missing)} of the {len(self.names)} images (e.g. {missing[0]!r}). "
                "Label every image, or set its labels to null (unconditional data)."
            )
        return labels

    def image_size(self) -> tuple[str, tuple[int, int]] | None:
        """(member, its width and height) of the first image member whose header reads; None when none does (the
        member check names them). Reads headers only."""
        for name in self.names[:16]:
            try:
                with Image.open(io.BytesIO(self.read(name))) as image:
                    return name, image.size
            except Exception:  # Pillow raises many types for bad data; the set-up's member check reports them
                continue
        return None

    def label_tensor(self, names: list[str]) -> torch.Tensor | None:
        """The labels of `names` in order: int64 class indices, or float32 vectors."""
        if self.labels is None:
            return None
        values = [self.labels[n] for n in names]
        if all(isinstance(v, int) for v in values):
            return torch.tensor(values, dtype=torch.int64)
        return torch.tensor(values, dtype=torch.float32)


def _label_kind(value: Any) -> int | None:
    """-1 for a class index, the length for a label vector, None for anything else."""
    if type(value) is int:  # not bool: true is no class
        return -1 if 0 <= value < MAX_CLASSES else None
    if isinstance(value, list) and 0 < len(value) <= MAX_CLASSES:
        numbers = all(type(v) in (int, float) and math.isfinite(v) for v in value)
        return len(value) if numbers else None
    return None


def check_label_table(table: Any, where: str) -> dict[str, Any]:
    """dataset.json's labels as {member name: label}: a list of [name, label] pairs whose labels are all class
    indices (0..MAX_CLASSES-1) or all vectors of one length; one paragraph naming the first bad entry otherwise.
    Looks two levels deep, never further: the nesting of a hostile file costs nothing here."""
    fix = (
        'It should read {"labels": [["00000/img00000000.png", 6], ...]} (class indices from 0, or lists of numbers '
        'of one length) or {"labels": null}. Fix or remove it.'
    )
    if not isinstance(table, list):
        raise ArchiveError(
            f"{where}: its labels are a {type(table).__name__}, not a list of [name, label] pairs. {fix}"
        )
    labels: dict[str, Any] = {}
    first_kind: int | None = None
    for number, entry in enumerate(table):
        pair = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
        kind = _label_kind(entry[1]) if pair else None
        if kind is None or (first_kind is not None and kind != first_kind):
            why = (
                "is not a [name, label] pair"
                if not pair
                else f"has a label of another kind than the first entry's ({_kind_words(first_kind)})"
                if kind is not None
                else f"has a label that is neither a class index (0..{MAX_CLASSES - 1}) nor a list of numbers"
            )
            raise ArchiveError(f"{where}: entry {number} ({_describe(entry)}) {why}. {fix}")
        first_kind = kind
        labels[entry[0].replace("\\", "/")] = entry[1]
    return labels


def _describe(entry: Any) -> str:
    """A short, non-recursive description of a dataset.json entry (a hostile one may nest 100,000 deep)."""
    if not isinstance(entry, list):
        return f"a JSON {type(entry).__name__}"
    if len(entry) != 2 or not isinstance(entry[0], str):
        return f"a list of {len(entry)} items"
    label = entry[1]
    shown = (
        repr(label)
        if type(label) in (int, float, bool, type(None)) and len(str(label)) < 30
        else type(label).__name__
    )
    return f"{entry[0][:80]!r}, {shown}"


def _kind_words(kind: int | None) -> str:
    return "a class index" if kind == -1 else f"a list of {kind} numbers"


def check_members(
    source: ArchiveSource, decode: Callable[[str], object], cache_dir: Path | None = None
) -> dict[str, str]:
    """The members of `source` that do not decode, each with its reason: decoded once, in threads, and cached by the
    archive's stamp (a rebuilt or edited archive is checked again)."""
    key = hashlib.sha256(f"{source.stamp()}|{len(source.names)}".encode()).hexdigest()[:24]
    cache_file = (cache_dir or default_cache_dir()) / f"archive-{key}.json"
    try:
        return dict(json.loads(cache_file.read_text())["broken"])
    except (OSError, ValueError, KeyError):
        pass

    def verdict(name: str) -> tuple[str, str]:
        try:
            decode(name)
            return name, ""
        except MemoryError:
            raise
        except Exception as err:  # Pillow raises many types for bad data; all mean "unreadable"
            return name, f"{type(err).__name__}: {err}"[:300]

    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 1) + 4)) as pool:
        broken = {name: why for name, why in pool.map(verdict, source.names) if why}
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        partial = cache_file.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps({"broken": broken}))
        partial.replace(cache_file)
    except OSError as err:
        log.debug("Archive check cache %s not written (%s); the next run checks again.", cache_file, err)
    return broken


class ArchiveDataset(Dataset):
    """Members of an archive decoded to uint8 CHW squares; items `(image, skipped_flag)`, or `(image, skipped_flag,
    label)` with labels. A member that breaks after the set-up check is replaced by the next readable one (flag 1),
    or stops the run with `on_corrupt=error`."""

    def __init__(
        self,
        source: ArchiveSource,
        names: list[str],
        resolution: int,
        channels: int,
        on_corrupt: str = "skip",
        labels: torch.Tensor | None = None,
        decoder: str = "pil",
    ):
        self.source, self.names, self.labels = source, names, labels
        self.resolution, self.channels, self.on_corrupt = resolution, channels, on_corrupt
        self.decoder = decoder  # pil | simplejpeg, or nvjpeg: items carry the encoded bytes (data/decode.py)

    def __len__(self) -> int:
        return len(self.names)

    def decode(self, name: str) -> torch.Tensor:
        data = self.source.read(name)
        if (
            self.decoder == "nvjpeg"
        ):  # decoded on the device a batch at a time (ZipDataModule.on_before_batch_transfer)
            return torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return decode_bytes(data, self.resolution, self.channels, self.decoder)

    def __getitem__(self, index: int):
        for attempt in range(len(self.names)):
            position = (index + attempt) % len(self.names)
            name = self.names[position]
            try:
                image = self.decode(name)
            except Exception as err:
                if self.on_corrupt == "error":
                    raise ArchiveError(
                        f"Cannot read {name} in {self.source.path}: {err}. Rebuild the archive (python prepare.py "
                        "skips and names unreadable files), or set data.on_corrupt=skip."
                    ) from err
                log.warning(
                    "Skipping unreadable %s in %s (%s); using the next image.", name, self.source.path, err
                )
                continue
            flag = int(attempt > 0)
            if self.labels is None:
                return image, flag
            return image, flag, self.labels[position]
        raise ArchiveError(f"No image in {self.source.path} could be read; see the warnings above.")


class ZipDataModule(DecodesOnDevice, ImageDataModule):
    """`data=zip`: a StyleGAN2-ADA dataset archive (or a folder with its layout); see the module docstring."""

    default_extractor = "inception"

    def __init__(
        self,
        path: str | None,
        resolution: int = 64,
        channels: int = 3,
        labels: bool = False,
        on_corrupt: str = "skip",
        limit: int | None = None,
        mirror: bool = False,
        decoder: str = "auto",
        **loader_kwargs,
    ):
        super().__init__(**loader_kwargs)
        if path is None:
            raise ArchiveError(
                "data=zip needs data.path=/path/to/dataset.zip (or a folder with a dataset.json)."
            )
        self.decoder = decoder
        if on_corrupt not in ("skip", "error"):
            raise ValueError(f"data.on_corrupt={on_corrupt!r}: choose skip or error.")
        self.path, self.resolution, self.channels = path, resolution, channels
        self.use_labels, self.on_corrupt, self.limit, self.mirror = labels, on_corrupt, limit, mirror
        self.broken: dict[str, str] = {}
        self._readable: list[str] | None = None  # check_data's verdict, reused by setup()

    def _source(self) -> ArchiveSource:
        source = ArchiveSource(self.path)
        if self.use_labels and source.labels is None:
            raise ArchiveError(
                f"data.labels=true, but {self.path} has no labels (no dataset.json, or its labels are null). Build "
                "it with `python prepare.py source=<folder of class subfolders> dest=...`, or set data.labels=false."
            )
        return source

    def prepare_data(self) -> None:
        source = self._source()
        check_members(source, ArchiveDataset(source, source.names, self.resolution, self.channels).decode)

    def check_data(self) -> None:
        """The set-up's checks, before the run writes anything (ImageDataModule.check_data)."""
        self._readable = self._readable_names()
        self._check_batch(self._readable)

    def _check_batch(self, readable: list[str]) -> None:
        where = f"data.path={str(self.path)!r}" + (f" with data.limit={self.limit}" if self.limit else "")
        where += " (and data.mirror's flipped copies)" if self.mirror else ""
        self.check_fits_one_batch(len(readable) * (2 if self.mirror else 1), where)

    def label_classes(self) -> int | None:
        if not self.use_labels:
            return 0
        source = self._source()
        labels = source.label_tensor(source.names)
        return int(labels.max()) + 1 if labels is not None and labels.dtype == torch.int64 else None

    def _check_resolution(self, source: ArchiveSource) -> None:
        found = source.image_size()
        if found is None or found[1] == (self.resolution, self.resolution):
            return
        name, (width, height) = found
        at = f"train at data.resolution={width}, or " if width == height else ""
        direction = "up" if min(width, height) < self.resolution else "down"
        raise ArchiveError(
            f"data.path={str(self.path)!r} holds {width}x{height} images (e.g. {name}), and data.resolution="
            f"{self.resolution}: every image would be {direction}scaled on every draw. Fix: {at}prepare the "
            f"archive at this resolution: python prepare.py source={self.path} dest=<new>.zip "
            f"resolution={self.resolution}."
        )

    def _readable_names(self) -> list[str]:
        source = self._source()
        self._check_resolution(source)
        names = source.names[: self.limit] if self.limit else source.names
        probe = ArchiveDataset(source, names, self.resolution, self.channels)
        self.broken = {n: why for n, why in check_members(source, probe.decode).items() if n in set(names)}
        if self.broken and self.on_corrupt == "error":
            shown = "; ".join(f"{n} ({why})" for n, why in list(self.broken.items())[:5])
            more = f" and {len(self.broken) - 5} more" if len(self.broken) > 5 else ""
            raise ArchiveError(
                f"{len(self.broken)} of {len(names)} images in {self.path} cannot be read: {shown}{more}. Rebuild "
                "the archive with `python prepare.py` (it skips and names them), or set data.on_corrupt=skip to "
                "train on the readable ones (each counted in data/skipped_files)."
            )
        for name, why in self.broken.items():
            log.warning(
                "Skipping unreadable %s in %s (%s); it is left out of training.", name, self.path, why
            )
        readable = [n for n in names if n not in self.broken]
        if not readable:
            raise DataFolderError(f"None of the {len(names)} images in {self.path} can be read (see above).")
        return readable

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        readable = self._readable if self._readable is not None else self._readable_names()
        self._check_batch(readable)
        source = self._source()
        labels = source.label_tensor(readable) if self.use_labels else None
        self.set_decoder(self._choose_decoder(readable))
        dataset = ArchiveDataset(
            source, readable, self.resolution, self.channels, self.on_corrupt, labels, self.decoder_used
        )
        self.train_set = MirroredDataset(dataset) if self.mirror else dataset

    def _choose_decoder(self, names: list[str]) -> str:
        stores_jpeg = all(n.lower().endswith((".jpg", ".jpeg")) for n in names)
        chosen = self.choose_decoder(self.decoder, stores_jpeg)
        if chosen == "nvjpeg" and self.mirror:
            if self.decoder == "nvjpeg":
                raise ArchiveError(
                    "data.decoder=nvjpeg with data.mirror=true: the x-flipped copies are made from decoded images "
                    "in the loader workers. Use data.decoder=auto with mirror, or prepare the archive mirrored."
                )
            chosen = resolve_decoder("auto", "cpu", stores_jpeg)
        log.info("data=zip decodes with %s (data.decoder=%s).", chosen, self.decoder)
        return chosen

    @property
    def skipped_file_count(self) -> int:
        return len(self.broken)

    def reference_source(self, seed: int = 0, batch_size: int = 64):
        """(fingerprint, protocol, batch factory, image count) for FID reference statistics: the archive's readable
        images decoded as for training, in a seeded order."""
        trained = self.train_set.source if isinstance(self.train_set, MirroredDataset) else self.train_set
        source = trained.source
        # Decoded by Pillow whatever the training decoder (nvjpeg items are encoded bytes), as FID's protocol says.
        dataset = ArchiveDataset(source, trained.names, self.resolution, self.channels, decoder="pil")
        fingerprint = f"zip:{hashlib.sha256(source.stamp().encode()).hexdigest()[:16]}:seed={seed}"
        protocol = f"zip: ImageOps.fit LANCZOS to {self.resolution}px, {self.channels} ch"

        def make_batches():
            return seeded_batches(dataset, seed, batch_size)

        return fingerprint, protocol, make_batches, len(dataset)
