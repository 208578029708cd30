"""Pretrained weight files: found on disk, else fetched once from their published address and checked.

A weights file is taken from an explicit path (a config key, used as is, never fetched) or from torch hub's cache
directory, ``$TORCH_HOME/hub/checkpoints/`` (``~/.cache/torch/hub/checkpoints/`` by default). That directory, not
Pixelsmith's own cache, because torchvision and torch-fidelity (and torchmetrics through it) look there under the same
file names: a file one of them fetched is reused, and one fetched here is theirs too, instead of a second copy.

A file that is in neither place is downloaded from the address in :data:`PUBLISHED` into that directory: to a
temporary name beside it, checked against its SHA-256, then renamed into place with ``os.replace``, so an interrupted,
truncated or altered download never stands under the real name. The digests are the hash prefixes the publishers
put into the file names (torch hub's convention, ``name-<first hex digits of the SHA-256>.ext``; torch.hub's
``check_hash`` verifies the same way): no full digest is published with these files. ``PIXELSMITH_OFFLINE=1``
turns the download off (a cluster without internet); then, as after a failed download, the error names the file,
its address and where to put it.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)

OFFLINE_ENV = "PIXELSMITH_OFFLINE"
# A stalled connection (a firewall that drops packets) must end in the error paragraph, not hang the run.
DOWNLOAD_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PublishedWeights:
    """One pretrained file as its publisher serves it."""

    file_name: str  # the name in the hub checkpoints directory: the name torchvision / torch-fidelity give it
    url: str
    # The SHA-256 of the published file, or its leading hex digits where only those are published (in the name).
    sha256: str
    also_named: tuple[
        str, ...
    ] = ()  # other names the same bytes go by in that directory (accepted when present)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.file_name, *self.also_named)


# Every pretrained file Pixelsmith loads, by the name its callers use. The addresses are the ones the installed
# torch-fidelity (feature_extractor_inceptionv3.URL_INCEPTION_V3) and torchvision (the IMAGENET1K_V1 weights enums)
# download from; tests/test_weights_download.py checks that they still agree.
PUBLISHED: dict[str, PublishedWeights] = {
    # The FID Inception-v3 (TensorFlow's 2015-12-05 graph converted to PyTorch). pytorch-fid publishes the same
    # weights as pt_inception-...; torch-fidelity's name is the one torchmetrics finds in the cache.
    "inception-v3-fid": PublishedWeights(
        "weights-inception-2015-12-05-6726825d.pth",
        "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/weights-inception-2015-12-05-6726825d.pth",
        "6726825d",
        also_named=("pt_inception-2015-12-05-6726825d.pth",),
    ),
    "vgg16": PublishedWeights(
        "vgg16-397923af.pth", "https://download.pytorch.org/models/vgg16-397923af.pth", "397923af"
    ),
    "vgg19": PublishedWeights(
        "vgg19-dcbb9e9d.pth", "https://download.pytorch.org/models/vgg19-dcbb9e9d.pth", "dcbb9e9d"
    ),
    "alexnet": PublishedWeights(
        "alexnet-owt-7be5be79.pth", "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth", "7be5be79"
    ),
    "squeezenet1_1": PublishedWeights(
        "squeezenet1_1-b8a52dc0.pth",
        "https://download.pytorch.org/models/squeezenet1_1-b8a52dc0.pth",
        "b8a52dc0",
    ),
}


class MissingWeightsError(PixelsmithError, FileNotFoundError):
    """A pretrained weights file is not on disk and could not be fetched; the message says which file, where to put
    it, and the key."""


class WeightsDownloadError(OSError):
    """A download that did not give the published file (no connection, an HTTP error, cut short, another digest)."""


def hub_checkpoints_dir() -> Path:
    """``$TORCH_HOME/hub/checkpoints`` as torch resolves it (honours $TORCH_HOME and $XDG_CACHE_HOME)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def offline() -> bool:
    """Whether ``PIXELSMITH_OFFLINE`` forbids downloads (1, true, yes or on)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def download_verified(url: str, destination: Path, sha256: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Fetch ``url`` to ``destination``, or raise :class:`WeightsDownloadError` leaving nothing under that name.

    The bytes go to a temporary name in the same directory; only a download whose length matches the server's
    Content-Length and whose SHA-256 starts with ``sha256`` is renamed into place (``os.replace``: atomic, and on
    Windows too where the name exists). Processes of one machine (a run's ranks) wait on a file lock, and the second
    finds the first one's file.
    """
    from filelock import FileLock

    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(destination.parent / f".{destination.name}.lock"))
        lock.acquire()
    except OSError as err:
        raise WeightsDownloadError(f"{destination.parent} cannot be written ({err})") from err
    try:
        if destination.is_file():
            return destination
        partial = destination.with_name(f".{destination.name}.{uuid.uuid4().hex}.partial")
        try:
            _fetch(url, partial, sha256.lower(), timeout)
            os.replace(partial, destination)
        finally:
            partial.unlink(missing_ok=True)
        return destination
    finally:
        lock.release()


def _fetch(url: str, partial: Path, sha256: str, timeout: float) -> None:
    digest, received = hashlib.sha256(), 0
    request = urllib.request.Request(url, headers={"User-Agent": "pixelsmith"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(partial, "wb") as out:
            length = response.headers.get("Content-Length")
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
            out.flush()
            os.fsync(out.fileno())
    except urllib.error.HTTPError as err:
        raise WeightsDownloadError(f"the server answered HTTP {err.code} {err.reason}") from err
    except (OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", None) or err
        raise WeightsDownloadError(f"{type(err).__name__}: {reason}") from err
    # http.client returns a short body without an error when the connection closes early; the length tells.
    if length is not None and length.isdigit() and received != int(length):
        raise WeightsDownloadError(f"the connection closed after {received} of {int(length)} bytes")
    got = digest.hexdigest()
    if not got.startswith(sha256):
        raise WeightsDownloadError(
            f"the {received} bytes received have the SHA-256 {got}, not the published one (which begins {sha256})"
        )


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

    ``config_path`` wins when given: it is used as is and must exist (nothing is fetched for it). Otherwise each of
    the file's names is looked up in the hub checkpoints directory, and a missing file is downloaded there from
    ``PUBLISHED[published]`` unless ``PIXELSMITH_OFFLINE`` is set. ``also`` is a sentence appended to the message
    (another way out, such as a switch that turns the feature off).
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
    for name in entry.names:
        candidate = checkpoints / name
        if candidate.is_file():
            return candidate
    if offline():
        why = f"{OFFLINE_ENV}={os.environ.get(OFFLINE_ENV)} forbids downloading it"
    else:
        log.info("Downloading the %s weights from %s to %s", what, entry.url, checkpoints / entry.file_name)
        try:
            return download_verified(entry.url, checkpoints / entry.file_name, entry.sha256)
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
