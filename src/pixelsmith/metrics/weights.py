"""Finding pretrained weight files offline, and the error a user sees when one is missing.

Pixelsmith never downloads weights on its own: runs happen on clusters without internet, and a silent download
of the wrong file is how FID numbers stop being comparable. A weights file is taken from an explicit path (a
config key) or from torch hub's cache directory, ``$TORCH_HOME/hub/checkpoints/`` (``~/.cache/torch/hub/
checkpoints/`` by default), which is where torchvision and torch-fidelity put the files they download.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from pixelsmith.errors import PixelsmithError


class MissingWeightsError(PixelsmithError, FileNotFoundError):
    """A pretrained weights file is not on disk; the message says which file, where to put it, and the key."""


def hub_checkpoints_dir() -> Path:
    """``$TORCH_HOME/hub/checkpoints`` as torch resolves it (honours $TORCH_HOME and $XDG_CACHE_HOME)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def resolve_weights_file(
    *,
    what: str,
    file_names: tuple[str, ...],
    config_path: str | os.PathLike | None,
    config_key: str,
    source: str,
) -> Path:
    """Return the weights file to load, or raise :class:`MissingWeightsError` with a one-paragraph explanation.

    ``config_path`` wins when given (and must exist); otherwise each of ``file_names`` is looked up in the hub
    checkpoints directory, in order. ``source`` tells the user where the file comes from (a URL, a command).
    """
    if config_path is not None and str(config_path) != "":
        path = Path(config_path).expanduser()
        if path.is_file():
            return path
        raise MissingWeightsError(
            f"The {what} weights file given by `{config_key}={config_path}` does not exist. "
            f"Point `{config_key}` at a copy of {file_names[0]} (it comes from {source}), or unset it to use "
            f"{hub_checkpoints_dir() / file_names[0]}."
        )
    checkpoints = hub_checkpoints_dir()
    for name in file_names:
        candidate = checkpoints / name
        if candidate.is_file():
            return candidate
    also = f" (also accepted there: {', '.join(file_names[1:])})" if len(file_names) > 1 else ""
    raise MissingWeightsError(
        f"The {what} weights file {file_names[0]} was not found in {checkpoints}{also}, and no path was given "
        f"with the config key `{config_key}`. Pixelsmith does not download weights by itself: get the file from "
        f"{source} and either copy it into {checkpoints} (that directory is $TORCH_HOME/hub/checkpoints; "
        f"$TORCH_HOME defaults to ~/.cache/torch) or pass its location with `{config_key}=/path/to/{file_names[0]}`."
    )
