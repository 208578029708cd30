"""Pretrained weight files: found on disk, else fetched once from their published address, and checked by their full
SHA-256 and length before anything loads them.

A weights file is taken from an explicit path (a config key, used as is, never fetched or checked: the user chose that
file) or from torch hub's cache directory, ``$TORCH_HOME/hub/checkpoints/`` (``~/.cache/torch/hub/checkpoints/`` by
default). That directory, not Pixelsmith's own cache, because torchvision and torch-fidelity (and torchmetrics through
it) look there under the same file names: a file one of them fetched is reused, and one fetched here is theirs too,
instead of a second copy.

Every file in that directory is checked against :data:`PUBLISHED` (its full SHA-256 and its length) before it is
returned, however it got there. A file that fails is refused in one paragraph naming the file, the digest expected and
the one found, and the fix; it is never loaded, replaced or deleted. A check reads the whole file once; a file that
passes gets a small stamp beside it (``.<name>.verified``: the digest it was checked against, its size, modification
and change times and inode), so later runs hash it again only when one of those changed: a replaced or altered file is
checked again, and refused.

A file that is not there is downloaded from the address in :data:`PUBLISHED` into that directory: to a temporary name
beside it (``.<name>.<random>.partial``), read up to one byte past the published length (an endless or longer body is
cut there and refused), checked, then renamed into place with ``os.replace``, so an interrupted, truncated, overlong
or altered download never stands under the real name. Processes of one machine (a run's ranks) take a file lock beside
the file (``.<name>.lock``) for the check and the download; under it, ``.partial`` files a killed download left are
removed. ``PIXELSMITH_OFFLINE=1`` turns the download off (a cluster without internet); then, as after a failed
download, the error names the file, its address and where to put it.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import json
import logging
import os
import re
import stat
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from pixelsmith.errors import PixelsmithError
from pixelsmith.hashing import file_sha256

log = logging.getLogger(__name__)

OFFLINE_ENV = "PIXELSMITH_OFFLINE"
# A stalled connection (a firewall that drops packets) must end in the error paragraph, not hang the run.
DOWNLOAD_TIMEOUT_S = 60.0
_CHUNK = 1 << 20
_FULL_SHA256 = re.compile(r"[0-9a-f]{64}")
STAMP_SUFFIX = ".verified"
# A stamp is a few hundred bytes of JSON; anything larger is not one of ours and is ignored (the file is re-hashed).
_STAMP_MAX_BYTES = 4096


@dataclass(frozen=True)
class PublishedWeights:
    """One pretrained file as its publisher serves it."""

    file_name: str  # the name in the hub checkpoints directory: the name torchvision / torch-fidelity give it
    url: str
    # The file's full SHA-256 (64 hex digits). A shorter value is taken as the leading digits, for a file whose full
    # digest nobody publishes; every file in the table below has its full digest.
    sha256: str
    size: int  # the file's length in bytes
    also_named: tuple[
        str, ...
    ] = ()  # other names the same bytes go by in that directory (accepted when present)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.file_name, *self.also_named)

    @property
    def has_full_digest(self) -> bool:
        return _FULL_SHA256.fullmatch(self.sha256.lower()) is not None

    def matches(self, sha256: str, size: int) -> bool:
        """Whether bytes of this digest and length are the published file."""
        expected = self.sha256.lower()
        digest_ok = sha256 == expected if self.has_full_digest else sha256.startswith(expected)
        return digest_ok and size == self.size

    def describe(self) -> str:
        """The published digest and length, as a refusal states them."""
        if self.has_full_digest:
            return f"{self.sha256.lower()} ({self.size} bytes)"
        return f"one beginning {self.sha256.lower()} ({self.size} bytes; only those digits are published)"


# Every pretrained file Pixelsmith loads, by the name its callers use. The addresses are the ones the installed
# torch-fidelity (feature_extractor_inceptionv3.URL_INCEPTION_V3) and torchvision (the IMAGENET1K_V1 weights enums)
# download from; tests/test_weights_download.py checks that they still agree, and that each length agrees with the
# size torchvision's weights metadata gives (`_file_size`, in MiB).
#
# The publishers put only the leading hex digits of each SHA-256 into the file names. The full digests and lengths
# below are the ones public records of these exact files give, each found in at least two independent repositories
# (they cannot be computed here without downloading the files):
# - Inception (torch-fidelity's file; pytorch-fid's pt_inception-... is the same bytes): ADIOCLASSMATE/unified-mm,
#   scripts/validate_ascend_imagenet100_assets.py (torch-fidelity's file), and yluo5820/flow_matching,
#   docs/official_imbdiff_matrix.md (pytorch-fid's file); length: hu-jy-0406/SiT-Complementary, workflow/h20_common.sh.
# - VGG16: LibreYOLO/libreyolo, docs/provenance/vgg.md; nampluskr/roi-corner-detection-ver2,
#   docs/references/backbones.md; plai-group/ubc_primitives, primitives/cnn/cnn.py (digest).
# - VGG19: LibreYOLO/libreyolo, docs/provenance/vgg.md; nampluskr/roi-corner-detection-ver2,
#   docs/references/backbones.md.
# - AlexNet: nampluskr/roi-corner-detection-ver2, docs/references/backbones.md; nishide-dev/h3fast,
#   src/h3fast/benchmarks/perceptual_video.py (digest).
# - SqueezeNet 1.1: nampluskr/roi-corner-detection-ver2, docs/references/backbones.md; NERDDISCO/vj0,
#   docs/performance/2026-09-18/nvfp4/PLAN.md.
PUBLISHED: dict[str, PublishedWeights] = {
    # The FID Inception-v3 (TensorFlow's 2015-12-05 graph converted to PyTorch). pytorch-fid publishes the same
    # weights as pt_inception-...; torch-fidelity's name is the one torchmetrics finds in the cache.
    "inception-v3-fid": PublishedWeights(
        "weights-inception-2015-12-05-6726825d.pth",
        "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/weights-inception-2015-12-05-6726825d.pth",
        "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2",
        95_628_359,
        also_named=("pt_inception-2015-12-05-6726825d.pth",),
    ),
    "vgg16": PublishedWeights(
        "vgg16-397923af.pth",
        "https://download.pytorch.org/models/vgg16-397923af.pth",
        "397923af8e79cdbb6a7127f12361acd7a2f83e06b05044ddf496e83de57a5bf0",
        553_433_881,
    ),
    "vgg19": PublishedWeights(
        "vgg19-dcbb9e9d.pth",
        "https://download.pytorch.org/models/vgg19-dcbb9e9d.pth",
        "dcbb9e9dad569fff7a846263a77324fc34978fea2bfb039c012d710e1776ae44",
        574_673_361,
    ),
    "alexnet": PublishedWeights(
        "alexnet-owt-7be5be79.pth",
        "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
        "7be5be791159472b1fbf3c69796f7cb30dca7ad8466c2df70058c37116cdee02",
        244_408_911,
    ),
    "squeezenet1_1": PublishedWeights(
        "squeezenet1_1-b8a52dc0.pth",
        "https://download.pytorch.org/models/squeezenet1_1-b8a52dc0.pth",
        "b8a52dc049b60e4b6ab68ad0df457362afab8b6304b2febdc1650a5dab4d7e7b",
        4_958_839,
    ),
}


class MissingWeightsError(PixelsmithError, FileNotFoundError):
    """A pretrained weights file is not on disk and could not be fetched; the message says which file, where to put
    it, and the key."""


class WeightsDownloadError(OSError):
    """A download that did not give the published file (no connection, an HTTP error, cut short, too long, another
    digest)."""


def hub_checkpoints_dir() -> Path:
    """``$TORCH_HOME/hub/checkpoints`` as torch resolves it (honours $TORCH_HOME and $XDG_CACHE_HOME)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def offline() -> bool:
    """Whether ``PIXELSMITH_OFFLINE`` forbids downloads (1, true, yes or on)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def stamp_path(path: Path) -> Path:
    """Where the record that ``path`` passed its check is kept."""
    return path.with_name(f".{path.name}{STAMP_SUFFIX}")


def _stamp_for(path: Path, entry: PublishedWeights, status: os.stat_result) -> dict[str, object]:
    # The change time and inode are in it too: a file put back with its old modification time (os.utime, touch -d)
    # still gets a new change time, and a file copied over this one a new inode or change time.
    return {
        "file": path.name,
        "sha256": entry.sha256.lower(),
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        "ctime_ns": status.st_ctime_ns,
        "inode": status.st_ino,
    }


def _read_stamp(path: Path) -> object:
    """The stamp beside ``path`` as JSON data, or None: a missing, unreadable, oversized or malformed stamp only
    means the file is hashed again. Nothing in it is more than compared."""
    try:
        # Non-blocking and regular files only: a FIFO under the stamp's name must not hang the run.
        descriptor = os.open(stamp_path(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as stream:
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return None
            raw = stream.read(_STAMP_MAX_BYTES + 1)
        except OSError:
            return None
    if len(raw) > _STAMP_MAX_BYTES:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _write_stamp(path: Path, record: dict[str, object]) -> None:
    stamp = stamp_path(path)
    temporary = stamp.with_name(f"{stamp.name}.{uuid.uuid4().hex}.tmp")
    try:
        temporary.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(temporary, stamp)
    except OSError as err:  # a read-only cache still works: the file is then hashed on every run
        log.debug("Could not record the check of %s (%s)", path, err)
    finally:
        temporary.unlink(missing_ok=True)


@dataclass(frozen=True)
class WeightsMismatch:
    """The digest and length of a file that is not the published one."""

    sha256: str
    size: int


def verify_weights_file(
    path: Path, entry: PublishedWeights, *, record: bool = True
) -> WeightsMismatch | None:
    """None when ``path`` is the published file (by its stamp, else by hashing it, then stamped when ``record``),
    else its digest and length."""
    before = path.stat()
    expected_stamp = _stamp_for(path, entry, before)
    if before.st_size == entry.size and _read_stamp(path) == expected_stamp:
        return None
    sha256 = file_sha256(path)
    if not entry.matches(sha256, before.st_size):
        return WeightsMismatch(sha256, before.st_size)
    # A file that changed while it was read is not stamped: the next run reads it again.
    if record and _stamp_for(path, entry, path.stat()) == expected_stamp:
        _write_stamp(path, expected_stamp)
    return None


@contextmanager
def _entry_lock(directory: Path, name: str, *, for_download: bool) -> Iterator[bool]:
    """Hold ``.<name>.lock`` in ``directory`` (yielding True) and remove the ``.partial`` files a killed download
    of ``name`` left there. A directory this process cannot write is only read: no lock, no stamps (yielding False),
    and a download there fails with :class:`WeightsDownloadError`."""
    from filelock import FileLock

    if for_download:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise WeightsDownloadError(f"{directory} cannot be written ({err})") from err
    lock = FileLock(str(directory / f".{name}.lock"))
    try:
        if not os.access(directory, os.W_OK):
            raise PermissionError(f"{directory} is read-only for this process")
        lock.acquire()
        locked = True
    except OSError as err:
        if for_download:
            raise WeightsDownloadError(f"{directory} cannot be written ({err})") from err
        locked = False
    if not locked:
        yield False
        return
    try:
        # Only the holder of this lock downloads `name`, so any partial file of it is what a killed process left.
        for stale in directory.glob(f".{glob.escape(name)}.*.partial"):
            stale.unlink(missing_ok=True)
        yield True
    finally:
        lock.release()


def download_verified(
    entry: PublishedWeights, destination: Path, timeout: float = DOWNLOAD_TIMEOUT_S
) -> Path:
    """Fetch ``entry`` to ``destination`` and stamp it, or raise :class:`WeightsDownloadError` leaving nothing under
    that name. The caller holds the entry's lock.

    The bytes go to a temporary name in the same directory; only a download of exactly the published length and
    digest is renamed into place (``os.replace``: atomic, and on Windows too where the name exists).
    """
    partial = destination.with_name(f".{destination.name}.{uuid.uuid4().hex}.partial")
    try:
        sha256, size = _fetch(entry.url, partial, entry.size, timeout)
        if size < entry.size:
            # http.client returns a short body without an error when the connection closes early.
            raise WeightsDownloadError(f"the connection closed after {size} of {entry.size} bytes")
        if not entry.matches(sha256, size):
            raise WeightsDownloadError(
                f"the {size} bytes received have the SHA-256 {sha256}, not the published {entry.describe()}"
            )
        try:
            os.replace(partial, destination)
        except OSError as err:  # a folder in the way, say
            raise WeightsDownloadError(f"{destination} cannot be replaced ({err})") from err
    finally:
        partial.unlink(missing_ok=True)
    _write_stamp(destination, _stamp_for(destination, entry, destination.stat()))
    return destination


def _fetch(url: str, partial: Path, size: int, timeout: float) -> tuple[str, int]:
    """Write at most ``size + 1`` bytes of ``url`` to ``partial``; their SHA-256 and count."""
    digest, received = hashlib.sha256(), 0
    limit = size + 1  # one byte past the published length tells a longer or endless body from the file
    request = urllib.request.Request(url, headers={"User-Agent": "pixelsmith"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(partial, "xb") as out:
            announced = (response.headers.get("Content-Length") or "").strip()
            if announced.isdigit() and int(announced) != size:
                raise WeightsDownloadError(
                    f"the server announced {int(announced)} bytes, but the published file has {size}"
                )
            while received < limit:
                # read1: what has arrived, so a slow body is written as it comes.
                chunk = response.read1(min(_CHUNK, limit - received))
                if not chunk:
                    break
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
            out.flush()
            os.fsync(out.fileno())
    except WeightsDownloadError:
        raise
    except urllib.error.HTTPError as err:
        raise WeightsDownloadError(f"the server answered HTTP {err.code} {err.reason}") from err
    except (OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", None) or err
        raise WeightsDownloadError(f"{type(err).__name__}: {reason}") from err
    if received > size:
        raise WeightsDownloadError(
            f"the server sent more than the {size} bytes of the published file (stopped reading at {received})"
        )
    return digest.hexdigest(), received


def resolve_weights_file(
    *,
    what: str,
    published: str,
    config_path: str | os.PathLike | None,
    config_key: str,
    also: str = "",
    error: type[PixelsmithError] = MissingWeightsError,
) -> Path:
    """Return the weights file to load, fetching it on first use, or raise ``error`` with a one-paragraph message.

    ``config_path`` wins when given: it is used as is and must exist (nothing is fetched or checked for it).
    Otherwise each of the file's names is looked up in the hub checkpoints directory; a file found there is checked
    (:func:`verify_weights_file`) and refused unless it is the published one, and a missing file is downloaded there
    from ``PUBLISHED[published]`` unless ``PIXELSMITH_OFFLINE`` is set. ``also`` is a sentence appended to the
    message (another way out, such as a switch that turns the feature off).
    """
    entry = PUBLISHED[published]
    tail = f" {also}" if also else ""
    if config_path is not None and str(config_path) != "":
        path = Path(config_path).expanduser()
        if path.is_file():
            return path
        raise error(
            f"The {what} weights file given by `{config_key}={config_path}` does not exist (resolved: "
            f"{path.resolve()}). Point `{config_key}` at a copy of {entry.file_name} (published at {entry.url}), or "
            f"unset it to use {hub_checkpoints_dir() / entry.file_name}, which is downloaded there on first use."
            f"{tail}"
        )
    checkpoints = hub_checkpoints_dir()

    def on_disk() -> Path | None:
        return next((checkpoints / name for name in entry.names if (checkpoints / name).is_file()), None)

    found = on_disk()
    why = f"{OFFLINE_ENV}={os.environ.get(OFFLINE_ENV)} forbids downloading it"
    if found is not None or not offline():
        try:
            with _entry_lock(checkpoints, entry.file_name, for_download=found is None) as locked:
                found = on_disk()  # another process may have fetched it while this one waited
                if found is not None:
                    try:
                        mismatch = verify_weights_file(found, entry, record=locked)
                    except OSError as err:
                        raise error(
                            f"The {what} weights file {found} cannot be read ({err}). Make it readable, or delete it "
                            f"and run again to download it from {entry.url}.{tail}"
                        ) from err
                    if mismatch is None:
                        return found
                    raise error(_refusal(what, found, entry, mismatch, config_key, tail))
                # Offline, a file that went away while this process waited for the lock is missing like any other.
                if not offline():
                    log.info(
                        "Downloading the %s weights from %s to %s",
                        what,
                        entry.url,
                        checkpoints / entry.file_name,
                    )
                    return download_verified(entry, checkpoints / entry.file_name)
        except WeightsDownloadError as err:
            why = f"downloading it from {entry.url} failed ({err}; nothing was kept)"
    also_named = (
        f" (also accepted there under the name {', '.join(entry.also_named)})" if entry.also_named else ""
    )
    raise error(
        f"The {what} weights file {entry.file_name} was not found in {checkpoints}{also_named}, no path was given "
        f"with the config key `{config_key}`, and {why}. Get the file from {entry.url} (on a machine with internet "
        f"access) and either copy it into {checkpoints} (that directory is $TORCH_HOME/hub/checkpoints; $TORCH_HOME "
        f"defaults to ~/.cache/torch) or pass its location with `{config_key}=/path/to/{entry.file_name}`.{tail}"
    )


def _refusal(
    what: str, path: Path, entry: PublishedWeights, found: WeightsMismatch, config_key: str, tail: str
) -> str:
    return (
        f"The {what} weights file {path} is not the published {entry.file_name}: its SHA-256 is {found.sha256} "
        f"({found.size} bytes), the published file's is {entry.describe()}. It was not loaded. Delete it and run "
        f"again to download the file from {entry.url} into {path.parent}; on a machine without internet access, "
        f"fetch it from that address elsewhere and place it by hand in {path.parent}, or pass a copy you trust with "
        f"`{config_key}=/path/to/{entry.file_name}`.{tail}"
    )
