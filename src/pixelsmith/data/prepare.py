"""`python prepare.py`: images -> a training dataset (a StyleGAN2-ADA zip, or streaming shards), as NVlabs'
`dataset_tool.py` does, in this template's `key=value` style. `python prepare.py --help` lists the options.

Sources: a folder (searched recursively; with `labels=auto`, images that all sit in first-level subfolders are
labelled by subfolder, the sorted folder names giving the class indices), a zip (its `dataset.json` labels kept),
or a text file listing image paths, one per line, optionally followed by a tab and an integer label.

Each image is decoded (EXIF-oriented), reduced to 8 bits (16-bit: scaled by 257, or stretched from its own min/max),
its transparency composited onto `background`, converted to `channels`, and fitted to a `resolution` square by
`transform`: center-crop (the shorter side to the resolution, the centre cut), center-crop-wide (NVlabs' 2:1 band in
a black square), pad (the whole image, the rest `background`) or none (every image must already be that square).
Unreadable images are skipped and named in the summary.

The output is deterministic (sorted inputs, fixed zip timestamps, the same encoder settings), so running twice gives
the same bytes; it is written beside the destination under a temporary name and renamed into place at the end, so a
crash or Ctrl-C leaves no half-written archive. An existing destination is replaced only with `overwrite=true`, and
only when it is an earlier output of prepare.py (the mark it writes: the zip's comment, or `written_by` in the shards'
`pixelsmith.json`, and nothing else inside): a folder of images, the working directory or another program's file
is never removed, and a destination that is, lies inside, or (when replaced) holds the source is refused
(`pixelsmith.owned_outputs`).
Zip: NVlabs' member names (`00000/img00000000.png`) and `dataset.json`; `data=zip data.path=...` reads it.
Shards: `litdata.optimize` chunks (`pip install -e ".[stream]"`); `data=shards data.path=...` streams them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import sys
import zipfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image, ImageColor, ImageOps, UnidentifiedImageError

from pixelsmith.config.argv_options import parse_key_values
from pixelsmith.data.archive import (
    IMAGE_EXTENSIONS,
    LABELS_FILE,
    MAX_CLASSES,
    ArchiveError,
    ArchiveSource,
)
from pixelsmith.data.image_folder import check_not_too_small, to_8bit
from pixelsmith.errors import PixelsmithError, UnwritableError, check_writable_folder, why_unwritable
from pixelsmith.owned_outputs import new_beside, overlap, remove_new, replace_with, zip_listing

TRANSFORMS = ("center-crop", "center-crop-wide", "pad", "none")
FILTERS = {
    "lanczos": Image.Resampling.LANCZOS,
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "box": Image.Resampling.BOX,
    "nearest": Image.Resampling.NEAREST,
}
HIGH_BIT_DEPTH = ("scale", "stretch")
FORMATS = ("auto", "zip", "shards")
ENCODINGS = ("png", "jpeg")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can store: no build time leaks into the bytes
# The mark on what prepare.py writes (a zip's comment; `written_by` in a shards folder's pixelsmith.json), and the
# names it writes there: overwrite=true replaces only an output that carries the mark and holds nothing else.
MARK = "pixelsmith prepare.py"
_ZIP_MEMBER = re.compile(r"\d{5}/img\d{8}\.(png|jpg)")
_SHARD_FILE = re.compile(r"chunk-\d+-\d+\.bin|index\.json|pixelsmith\.json")
_MAX_META_BYTES = 1 << 16


class PrepareError(PixelsmithError, ValueError):
    pass


@dataclasses.dataclass
class PrepareOptions:
    source: str | None = None
    dest: str | None = None
    resolution: int | None = None
    transform: str = "center-crop"
    filter: str = "lanczos"
    channels: int = 3
    background: str = "black"
    high_bit_depth: str = "scale"
    labels: str = "auto"
    format: str = "auto"
    encoding: str = "png"
    jpeg_quality: int = 95
    max_images: int | None = None
    chunk_mb: int = 64
    workers: int | str = "auto"
    overwrite: bool = False
    progress: bool = True


HELP = """\
Turn images into a training dataset: a StyleGAN2-ADA zip (data=zip) or streaming shards (data=shards).

Usage:
  {prog} source=IN dest=OUT.zip resolution=N [key=value ...]
  {prog} source=IN dest=OUT_DIR format=shards resolution=N [key=value ...]

Examples:
  {prog} source=~/photos dest=datasets/photos64.zip resolution=64
  {prog} source=~/animals dest=datasets/animals.zip resolution=128 labels=subfolders
  {prog} source=ffhq.zip dest=/data/ffhq64 format=shards resolution=64 encoding=jpeg

Options (key=value, defaults in brackets):
  source          a folder (recursive), a zip, or a .txt list of image paths (a tab and a label may follow)
  dest            the output on a local disk: a .zip, or a folder for format=shards (for an object store,
                  write a local folder and copy it to the bucket; data=shards reads s3://... itself)
  resolution      the output square's side in pixels (required)
  transform       center-crop | center-crop-wide | pad | none [center-crop]
  filter          lanczos | bicubic | bilinear | box | nearest: the resize filter [lanczos]
  channels        1 (grayscale) | 3 (RGB) [3]
  background      what transparent pixels (RGBA, LA, P with transparency) are composited onto, and pad's
                  border: a colour name or #rrggbb [black]
  high_bit_depth  scale | stretch: 16-bit images divided by 257, or stretched from their own min..max [scale]
  labels          auto | subfolders | none: auto labels a folder by its first-level subfolders when every
                  image sits in one, keeps a zip's dataset.json labels and a list's labels [auto]
  format          auto | zip | shards: auto picks zip for a dest ending in .zip, shards otherwise [auto]
  encoding        png | jpeg: how each image is stored (jpeg: smaller, lossy, decodable on the GPU) [png]
  jpeg_quality    1-100 with encoding=jpeg [95]
  max_images      stop after this many inputs (sorted order), at least 1 [all]
  chunk_mb        shard chunk size with format=shards [64]
  workers         decode processes, or auto (the cores) [auto]
  overwrite       true: replace an existing dest that an earlier prepare.py run wrote (nothing else) [false]
  progress        true | false: a progress bar [true]
"""


@dataclasses.dataclass(frozen=True)
class Item:
    """One input: where its bytes come from (a path, or a member of `archive`) and its label (None: unlabelled)."""

    name: str
    path: str | None = None
    archive: ArchiveSource | None = None
    label: Any = None

    def read(self) -> bytes:
        if self.archive is not None:
            return self.archive.read(self.name)
        return Path(self.path).read_bytes()


# ---- inputs -------------------------------------------------------------------------------------------------------
def list_inputs(source: str, labels: str) -> tuple[list[Item], list[str] | None]:
    """The inputs in sorted order and, for subfolder labels, the class names (index = label)."""
    path = Path(source).expanduser()
    if not path.exists():
        raise PrepareError(
            f"source={source!r} does not exist: give a folder of images, a zip, or a .txt list."
        )
    if path.is_file() and path.suffix.lower() == ".txt":
        return _list_file(path, labels), None
    if path.is_file() or (path / LABELS_FILE).is_file():
        archive = ArchiveSource(path)
        keep = labels != "none" and archive.labels is not None
        if labels == "subfolders":
            raise PrepareError(
                "labels=subfolders needs a folder source; a zip brings its own dataset.json labels."
            )
        return [
            Item(n, archive=archive, label=archive.labels[n] if keep else None) for n in archive.names
        ], None
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise PrepareError(
            f"source={source!r} holds no images ({', '.join(IMAGE_EXTENSIONS)}), searched recursively."
        )
    parts = [f.relative_to(path).parts for f in files]
    in_subfolders = all(len(p) >= 2 for p in parts)
    if labels == "subfolders" and not in_subfolders:
        loose = next(f for f, p in zip(files, parts, strict=True) if len(p) < 2)
        raise PrepareError(
            f"labels=subfolders: {loose} is not inside a class subfolder of {path}. Move it into one, or use "
            "labels=none."
        )
    if labels in ("auto", "subfolders") and in_subfolders and len({p[0] for p in parts}) > 0:
        classes = sorted({p[0] for p in parts})
        index = {name: i for i, name in enumerate(classes)}
        return [
            Item(f.relative_to(path).as_posix(), str(f), label=index[p[0]])
            for f, p in zip(files, parts, strict=True)
        ], classes
    return [Item(f.relative_to(path).as_posix(), str(f)) for f in files], None


def _list_file(path: Path, labels: str) -> list[Item]:
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        file, _, label = line.partition("\t")
        value = None
        if label.strip() and labels != "none":
            try:
                value = int(label)
            except ValueError:
                raise PrepareError(f"{path}:{number}: the label {label!r} is not an integer.") from None
            if not 0 <= value < MAX_CLASSES:
                raise PrepareError(
                    f"{path}:{number}: the label {value} is no class index: labels are 0, 1, 2, ... (below "
                    f"{MAX_CLASSES}). Number the classes from 0, or drop the labels (labels=none)."
                )
        items.append(Item(file.strip(), file.strip(), label=value))
    if not items:
        raise PrepareError(
            f"{path} lists no image paths (one per line, optionally a tab and an integer label)."
        )
    return sorted(items, key=lambda item: item.name)


# ---- one image ----------------------------------------------------------------------------------------------------
def convert_image(data: bytes, options: PrepareOptions) -> Image.Image:
    """Decode and fit one image as the module docstring says; raises for an unreadable or unfit one."""
    background = ImageColor.getrgb(options.background)
    with Image.open(io.BytesIO(data)) as opened:
        opened.load()
        image = ImageOps.exif_transpose(opened)
    check_not_too_small(*image.size, options.resolution)  # skipped and counted, as an unreadable one
    image = to_8bit(image, stretch=options.high_bit_depth == "stretch")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        image = Image.alpha_composite(canvas, rgba)
    image = image.convert("L" if options.channels == 1 else "RGB")
    fill = background if options.channels == 3 else ImageColor.getcolor(options.background, "L")
    size, resample = options.resolution, FILTERS[options.filter]
    if options.transform == "none":
        if image.size != (size, size):
            raise ValueError(f"is {image.size[0]}x{image.size[1]}, not {size}x{size} (transform=none)")
        return image
    if options.transform == "center-crop":
        return ImageOps.fit(image, (size, size), method=resample)
    if options.transform == "pad":
        return ImageOps.pad(image, (size, size), method=resample, color=fill)
    # center-crop-wide (NVlabs): a 2:1 band, size x size/2, centred in a square of black (not `background`: NVlabs')
    band = ImageOps.fit(image, (size, size // 2), method=resample)
    square = Image.new(image.mode, (size, size), 0)
    square.paste(band, (0, (size - size // 2) // 2))
    return square


def encode_image(image: Image.Image, options: PrepareOptions) -> bytes:
    buffer = io.BytesIO()
    if options.encoding == "jpeg":
        image.save(
            buffer,
            format="JPEG",
            quality=options.jpeg_quality,
            subsampling=0 if options.jpeg_quality >= 90 else 2,
        )
    else:
        image.save(buffer, format="PNG", compress_level=6)  # no timestamps in a PIL PNG: deterministic
    return buffer.getvalue()


def process(item: Item, options: PrepareOptions) -> tuple[bytes | None, str]:
    """(encoded image, "") or (None, why it was skipped)."""
    try:
        data = item.read()
    except (OSError, ArchiveError) as err:  # unreadable, or an archive member over the reader's limits
        return None, f"{type(err).__name__}: {err}"[:200]
    return process_data(data, options)


def process_data(data: bytes, options: PrepareOptions) -> tuple[bytes | None, str]:
    try:
        return encode_image(convert_image(data, options), options), ""
    except MemoryError:
        raise
    except UnidentifiedImageError:
        return None, "UnidentifiedImageError: not an image format Pillow reads (or a truncated header)"
    except Exception as err:  # Pillow raises many types for bad files; each means this image is skipped
        return None, f"{type(err).__name__}: {err}"[:200]


def _process_job(job: tuple[bytes | str, PrepareOptions]) -> tuple[bytes | None, str]:
    data, options = job
    return (None, data) if isinstance(data, str) else process_data(data, options)


# ---- outputs ------------------------------------------------------------------------------------------------------
def member_name(index: int, encoding: str) -> str:
    return f"{index // 1000:05d}/img{index:08d}.{'jpg' if encoding == 'jpeg' else 'png'}"


class Summary:
    def __init__(self):
        self.written = 0
        self.skipped: list[tuple[str, str]] = []
        self.labels: list[Any] = []

    def lines(self, options: PrepareOptions, dest: Path, classes: list[str] | None) -> list[str]:
        labelled = [label for label in self.labels if label is not None]
        label_text = (
            f", {len(set(map(str, labelled)))} classes"
            + (f" ({', '.join(classes[:8])}{'...' if len(classes) > 8 else ''})" if classes else "")
            if labelled
            else ", unlabelled"
        )
        out = [
            f"wrote {self.written} images to {dest} ({options.resolution}x{options.resolution}, "
            f"{options.channels} channel{'s' if options.channels > 1 else ''}, {options.encoding}{label_text})"
        ]
        if self.skipped:
            reasons = Counter(why.split(":")[0] for _, why in self.skipped)
            out.append(
                f"skipped {len(self.skipped)}: "
                + ", ".join(f"{count} {reason}" for reason, count in reasons.most_common())
            )
            out += [f"  {name}: {why}" for name, why in self.skipped[:20]]
            if len(self.skipped) > 20:
                out.append(f"  ... and {len(self.skipped) - 20} more")
        return out


# Inputs read in this process a block at a time and sent to the workers as bytes: an Item of a zip source carries the
# whole archive listing, which pickling per job would send N times; a block bounds the bytes held in memory.
_BLOCK = 256


def _results(items: list[Item], options: PrepareOptions):
    """(item, encoded or None, why) in input order, decoded in worker processes."""
    workers = (os.cpu_count() or 1) if str(options.workers) == "auto" else int(options.workers)
    if workers <= 1:
        for item in items:
            yield item, *process(item, options)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(items), _BLOCK):
            block = items[start : start + _BLOCK]
            jobs = [(_read_or_reason(item), options) for item in block]
            for item, result in zip(block, pool.map(_process_job, jobs, chunksize=16), strict=True):
                yield item, *result


def _read_or_reason(item: Item) -> bytes | str:
    try:
        return item.read()
    except (OSError, ArchiveError) as err:
        return f"{type(err).__name__}: {err}"[:200]


def _progress(total: int, enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("prepare"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=True,
    )


def _accepted(items: list[Item], options: PrepareOptions, summary: Summary, bar):
    """The images that converted, in input order, as (item, encoded bytes); the others go to the summary."""
    task = bar.add_task("images", total=len(items))
    for item, data, why in _results(items, options):
        bar.advance(task)
        if data is None:
            summary.skipped.append((item.name, why))
        else:
            yield item, data


def write_zip(items: list[Item], options: PrepareOptions, partial: Path) -> Summary:
    summary = Summary()
    labels: list[list[Any]] = []
    with (
        zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as archive,
        _progress(len(items), options.progress) as bar,
    ):
        for item, data in _accepted(items, options, summary, bar):
            name = member_name(summary.written, options.encoding)
            archive.writestr(zipfile.ZipInfo(name, date_time=_ZIP_TIME), data)
            labels.append([name, item.label])
            summary.labels.append(item.label)
            summary.written += 1
        has_labels = summary.written and all(label is not None for _, label in labels)
        table = {"labels": labels if has_labels else None}
        archive.writestr(zipfile.ZipInfo(LABELS_FILE, date_time=_ZIP_TIME), json.dumps(table))
        archive.comment = MARK.encode()
    return summary


def write_shards(items: list[Item], options: PrepareOptions, partial: Path) -> Summary:
    """litdata's chunk format, written in this process by its `BinaryWriter` as images arrive (memory stays one chunk;
    `litdata.optimize` would start worker processes and force the interpreter's multiprocessing start method)."""
    try:
        from litdata.streaming.writer import BinaryWriter
    except ImportError:
        raise PrepareError(
            'format=shards writes litdata shards: pip install -e ".[stream]" (litdata), or use format=zip.'
        ) from None
    summary = Summary()
    writer = BinaryWriter(str(partial), chunk_bytes=options.chunk_mb * 1_000_000)
    with _progress(len(items), options.progress) as bar:
        for item, data in _accepted(items, options, summary, bar):
            if item.label is not None and not isinstance(item.label, int):
                raise PrepareError(
                    f"format=shards stores class indices; {item.name}'s label {item.label!r} is not one. Use "
                    "format=zip for vector labels, or labels=none."
                )
            label = -1 if item.label is None else item.label
            writer[summary.written] = {"index": summary.written, "image": data, "label": label}
            summary.labels.append(item.label)
            summary.written += 1
    if not summary.written:
        return summary
    writer.done()
    writer.merge()
    _stamp_index_by_content(partial)
    (partial / "pixelsmith.json").write_text(
        json.dumps(
            {
                "written_by": MARK,
                "resolution": options.resolution,
                "channels": options.channels,
                "encoding": options.encoding,
                "images": summary.written,
                "labelled": all(label is not None for label in summary.labels),
                # What a conditional model's c_dim must cover (largest class index + 1), checked at start-up.
                "classes": max((label + 1 for label in summary.labels if label is not None), default=0),
            }
        )
    )
    return summary


def _stamp_index_by_content(folder: Path) -> None:
    """litdata stamps index.json with the build time (`updated_at`, which keys its cache of remote chunks); a stamp
    from the chunks' contents keeps two builds of the same images byte-identical, and still changes with them."""
    index_file = folder / "index.json"
    index = json.loads(index_file.read_text())
    digest = hashlib.sha256()
    for chunk in index["chunks"]:
        digest.update((folder / chunk["filename"]).read_bytes())
    index["updated_at"] = str(int(digest.hexdigest()[:12], 16))
    index_file.write_text(json.dumps(index, sort_keys=True))


def check_options(options: PrepareOptions) -> str:
    if options.source is None or options.dest is None:
        raise PrepareError("source=... and dest=... are required (see python prepare.py --help).")
    if options.resolution is None or options.resolution < 4:
        raise PrepareError(
            f"resolution={options.resolution}: give the output square's side, at least 4 (e.g. 64)."
        )
    if options.resolution & (options.resolution - 1):
        lower = 1 << (options.resolution.bit_length() - 1)
        raise PrepareError(
            f"resolution={options.resolution} is no power of two, and every model here trains at one (DCGAN and "
            f"StyleGAN2 from 16 px, R3GAN from 4): an archive at {options.resolution} px would be refused at "
            f"training. Use resolution={lower} or resolution={2 * lower}."
        )
    for name, value, allowed in (
        ("transform", options.transform, TRANSFORMS),
        ("filter", options.filter, tuple(FILTERS)),
        ("high_bit_depth", options.high_bit_depth, HIGH_BIT_DEPTH),
        ("labels", options.labels, ("auto", "subfolders", "none")),
        ("format", options.format, FORMATS),
        ("encoding", options.encoding, ENCODINGS),
    ):
        if value not in allowed:
            raise PrepareError(f"{name}={value!r}; choose one of {', '.join(allowed)}.")
    if options.channels not in (1, 3):
        raise PrepareError(f"channels={options.channels}: 1 (grayscale) or 3 (RGB).")
    try:
        ImageColor.getrgb(options.background)
    except ValueError:
        raise PrepareError(
            f"background={options.background!r} is not a colour: a name (black, white) or #rrggbb."
        ) from None
    if not 1 <= options.jpeg_quality <= 100:
        raise PrepareError(f"jpeg_quality={options.jpeg_quality} must be in 1..100.")
    if options.max_images is not None and options.max_images < 1:
        raise PrepareError(
            f"max_images={options.max_images} would take no image: give how many inputs to take (at least 1), or "
            "leave max_images out to take them all."
        )
    if options.chunk_mb < 1:
        raise PrepareError(
            f"chunk_mb={options.chunk_mb}: give the shard chunk size in MB, at least 1 (e.g. 64)."
        )
    if str(options.workers) != "auto" and not (isinstance(options.workers, int) and options.workers >= 1):
        raise PrepareError(
            f"workers={options.workers}: give the number of decode processes (at least 1), or workers=auto for one "
            "per core."
        )
    fmt = options.format
    if fmt == "auto":
        fmt = "zip" if options.dest.lower().endswith(".zip") else "shards"
    check_local_dest(options.dest, fmt)
    return fmt


def check_local_dest(dest: str, fmt: str) -> None:
    """Refuse an object-store URL as dest (s3://, gs://, ...): written as a path it became a local folder named
    after the scheme (`s3:/bucket/x`), and the run still said it wrote the images."""
    scheme, separator, rest = dest.partition("://")
    if not separator:
        return
    if fmt == "zip":
        raise PrepareError(
            f"dest={dest!r} is a URL, and data=zip reads an archive from a local path only: write the zip to a "
            "local disk (dest=datasets/<name>.zip). For data in an object store, write shards (format=shards) and "
            "copy them there."
        )
    local = f"datasets/{Path(rest).name or 'shards'}"
    copy = {"s3": f"aws s3 sync {local} {dest}", "gs": f"gcloud storage rsync -r {local} {dest}"}.get(
        scheme, f"copy {local} to {dest} with the store's own tool"
    )
    raise PrepareError(
        f"dest={dest!r} is an object-store URL, and shards are written to a local disk only (nothing was written). "
        f"Write them to a local folder (dest={local} format=shards), copy it to the bucket ({copy}), and train "
        f"from the URL: python train.py data=shards data.path={dest} (data=shards streams from the object stores "
        "litdata reads: s3://, gs://, ...)."
    )


def not_an_earlier_output(dest: Path, fmt: str) -> str | None:
    """Why `dest` is not an earlier `format=fmt` output of prepare.py; None when it is one (carries MARK and holds
    only what prepare.py writes), which overwrite=true may replace."""
    if dest.is_symlink():
        return f"it is a symbolic link (to {os.path.realpath(dest)})"
    if fmt == "zip":
        if dest.is_dir():
            return "it is a folder, and a zip never replaces a folder"
        listing = zip_listing(dest)
        if listing is None or listing[0] != MARK.encode():
            return "it is not a zip that prepare.py wrote (its comment carries no prepare.py mark)"
        stray = next((n for n in listing[1] if n != LABELS_FILE and not _ZIP_MEMBER.fullmatch(n)), None)
        return None if stray is None else f"it holds {stray!r}, which prepare.py does not write"
    if not dest.is_dir():
        return "it is not a folder, and shards (a folder) never replace a file"
    meta = dest / "pixelsmith.json"
    try:
        if meta.is_symlink() or meta.stat().st_size > _MAX_META_BYTES:
            raise ValueError("not prepare.py's pixelsmith.json")
        written_by = json.loads(meta.read_text())["written_by"]
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        written_by = None
    if written_by != MARK:
        return "it is not a folder of shards that prepare.py wrote (no pixelsmith.json naming prepare.py)"
    with os.scandir(dest) as entries:
        for entry in entries:
            if not (_SHARD_FILE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)):
                return f"it holds {entry.name!r}, which prepare.py does not write"
    return None


def _refuse_to_replace(options: PrepareOptions, why_not: str) -> PrepareError:
    return PrepareError(
        f"dest={options.dest} exists and is not an earlier output of prepare.py: {why_not}. prepare.py replaces "
        "only what it wrote (with overwrite=true), so nothing was written or removed. Choose another dest=..., or "
        "move that one away yourself if you mean to replace it."
    )


def check_dest(options: PrepareOptions, fmt: str, dest: Path) -> None:
    """Before any input is read: refuse a dest that overlaps the source, and an existing dest that overwrite=true
    may not replace (or that it was not given)."""
    source = Path(options.source).expanduser()
    exists = os.path.lexists(dest)
    clash = overlap(dest, options.dest, [(f"source={options.source}", source)], exists and options.overwrite)
    if clash:
        beside = Path(os.path.realpath(source))
        stem = beside.stem if beside.is_file() else beside.name
        suggestion = beside.with_name(f"{stem}-{options.resolution}px{'.zip' if fmt == 'zip' else ''}")
        raise PrepareError(
            f"{clash}: prepare.py never writes over what it reads, so nothing was written or removed. Write the "
            f"dataset outside the source, e.g. dest={suggestion}."
        )
    if not exists:
        return
    why_not = not_an_earlier_output(dest, fmt)
    if why_not is not None:
        raise _refuse_to_replace(options, why_not)
    if not options.overwrite:
        raise PrepareError(
            f"dest={options.dest} exists (an earlier output of prepare.py); set overwrite=true to replace it (the "
            "old one is removed only once the new one is whole), or choose another dest=..."
        )


def check_listed_inputs(options: PrepareOptions, dest: Path, items: list[Item]) -> None:
    """A .txt source names its images one by one: none may be the dest, or lie inside a dest being replaced."""
    if not os.path.lexists(dest) or not options.source.lower().endswith(".txt"):
        return  # a dest that does not exist is no listed image, and replaces nothing
    listed = [(f"{item.path} (listed in source={options.source})", Path(item.path)) for item in items]
    clash = overlap(dest, options.dest, listed, options.overwrite)
    if clash:
        raise PrepareError(
            f"{clash}: prepare.py never writes over what it reads, so nothing was written or removed. Choose a "
            "dest outside the listed images' folders."
        )


def prepare(options: PrepareOptions) -> tuple[Summary, Path, list[str] | None]:
    """Build the dataset; returns the summary, the destination and the class names (subfolder labels)."""
    fmt = check_options(options)
    dest = Path(options.dest).expanduser()
    check_dest(options, fmt, dest)
    # Before any image is read: the dataset is written beside dest under a temporary name, then renamed.
    check_writable_folder(
        dest.parent,
        "dest",
        "choose a destination you can write (dest=<path on a writable disk>).",
        options.dest,
    )
    try:
        items, classes = list_inputs(options.source, options.labels)
    except ArchiveError as err:
        raise PrepareError(str(err)) from None
    check_listed_inputs(options, dest, items)
    if options.max_images is not None:
        items = items[: options.max_images]
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = new_beside(dest, folder=fmt == "shards")
    try:
        try:
            summary = (write_zip if fmt == "zip" else write_shards)(items, options, partial)
        except OSError as err:  # the disk filled up, or the destination went away, part-way
            raise UnwritableError(
                f"dest={dest}: writing the dataset failed, {why_unwritable(err)} ({err}). Nothing was left behind "
                "(the partial file is removed). Free space there or choose another dest=..., and run it again."
            ) from err
        if summary.written == 0:
            raise PrepareError(
                f"None of the {len(items)} images could be prepared; nothing was written. The first: "
                f"{summary.skipped[0][0]}: {summary.skipped[0][1]}"
                if summary.skipped
                else "No inputs."
            )
        # Checked again: the dest may have changed while the images were prepared.
        if os.path.lexists(dest) and (why_not := not_an_earlier_output(dest, fmt)) is not None:
            raise _refuse_to_replace(options, why_not)
        try:
            replace_with(partial, dest)  # an old output goes only once the new one is whole
        except OSError as err:
            raise UnwritableError(
                f"dest={dest}: putting the new dataset in place failed, {why_unwritable(err)} ({err}). Any earlier "
                "output there is kept as it was, and the new one is removed. Fix that and run it again."
            ) from err
    finally:
        remove_new(partial)
    return summary, dest, classes


def main(argv: Sequence[str] | None = None, prog: str = "python prepare.py") -> int:
    """The command line of `python prepare.py` and of the installed `pixelsmith-prepare` (`prog` names it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help", "help") for a in argv):
        print(HELP.format(prog=prog))
        return 0
    name = prog.split()[-1]
    try:
        options = parse_key_values(argv, PrepareOptions, PrepareError, name)
        summary, dest, classes = prepare(options)
    except PixelsmithError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    for line in summary.lines(options, dest, classes):
        print(line)
    return 0
