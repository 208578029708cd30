"""Loading the files a user gives us (checkpoints, weights files): as data only, never as code.

`torch.load(weights_only=True)` reads tensors, numbers, strings and plain containers and refuses every other object,
so a file crafted to run code when it is unpickled (a `__reduce__` that calls `os.system`) is refused, not run. There
is no fallback to full unpickling anywhere in Pixelsmith: a file that does not load this way stops the run in one
paragraph naming the key that gave it, why it does not load, and what to give instead. Every checkpoint train.py
writes loads this way (tests/conftest.py `last_checkpoint` reads them so).

`build_to_fit` builds a network that a file's stored config sizes (a width, a count of blocks) without trusting
the sizes: first on the meta device, which allocates nothing, with the number of submodules bounded by the tensors
the file holds, then for real only if every parameter shape matches the file's own weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

from pixelsmith.errors import PixelsmithError


class UnloadableFileError(PixelsmithError):
    """A file a key names does not load as data only (it would need full unpickling), or is truncated or corrupt."""


def needs_full_unpickling(err: BaseException) -> bool:
    """True when torch.load(weights_only=True) refused the file's contents (objects other than data, or not a pickle
    at all), as opposed to a file that ends early."""
    return "weights_only" in str(err) or "Unpickl" in type(err).__name__ or isinstance(err, KeyError)


def _reason(err: BaseException) -> str:
    """The line of torch's message that names what was refused ("unsupported GLOBAL posix.system ..."): its first
    lines advise re-running with weights_only=False, advice a user must not be given for a file of unknown origin."""
    if isinstance(err, KeyError):  # the unpickler met a byte that is no pickle opcode: text, an image, ...
        return "not a pickle at all"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    specific = [line for line in lines if "GLOBAL" in line or "Unsupported" in line or "load key" in line]
    chosen = specific[0] if specific else (lines[0] if lines and "Weights only" not in lines[0] else "")
    return f"{type(err).__name__}: {chosen[:200]}" if chosen else type(err).__name__


def not_data_only_message(key: str, path: Path, err: BaseException, advice: str) -> str:
    return (
        f"{key}={path} does not load as data only (torch.load(weights_only=True) refused it: {_reason(err)}). It "
        "holds objects other than tensors, numbers, strings and plain containers, or is not a PyTorch file at all; "
        "loading it fully would unpickle it, which can run any code the file carries, so Pixelsmith never does. "
        + advice
    )


def load_data_only(path: str | Path, key: str, advice: str, mmap: bool = False) -> Any:
    """The file's contents, loaded with weights_only=True (on the CPU), or one paragraph saying why not. `key` is the
    config key or option that named the file; `advice` says what to give instead."""
    path = Path(path).expanduser()
    try:
        with warnings.catch_warnings():
            # "Detected pickle protocol 4": noise beside the refusal that follows for such a file.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError as err:
        raise UnloadableFileError(f"{key}={path} does not exist. {advice}") from err
    except Exception as err:
        if needs_full_unpickling(err):
            raise UnloadableFileError(not_data_only_message(key, path, err, advice)) from err
        first_line = (str(err).strip().splitlines() or [""])[0].split(". ")[0][:200]
        raise UnloadableFileError(
            f"{key}={path} looks truncated or corrupt: it does not read as a complete PyTorch file "
            f"({path.stat().st_size} bytes; {type(err).__name__}: {first_line}). {advice}"
        ) from err


class NetworkMismatchError(UnloadableFileError):
    """A file's stored network config does not build the network its own weights belong to."""


# A network has at most a few submodules per parameter tensor (activations, containers): a config asking for more
# than this many per tensor of the file's weights cannot be the network those weights came from.
SUBMODULES_PER_TENSOR = 4


class _TooManyModules(Exception):
    pass


def _check_tensors_hold_their_bytes(state: dict[str, Any], source: str, what: str) -> None:
    """Each tensor of `state` is backed by bytes of the file: a view that declares more values than its storage
    holds (an expanded, stride-0 tensor) or many full-size views of one storage would let a small file pass a shape
    check for a network of any size."""
    declared = 0
    storages: dict[int, int] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        size = tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage()
        if storage.nbytes() < size:
            raise NetworkMismatchError(
                f"{source}: its {what} weight {name} declares {size} bytes over a storage of {storage.nbytes()} "
                "(a stretched view, not weights). Nothing was built from it; the file is damaged or was edited."
            )
        declared += size
        storages[storage.data_ptr()] = storage.nbytes()
    if sum(storages.values()) < declared:
        raise NetworkMismatchError(
            f"{source}: its {what} weights declare {declared} bytes but the file holds {sum(storages.values())} for "
            "them (tensors sharing one storage). Nothing was built from it; the file is damaged or was edited."
        )


def build_to_fit(
    build: Callable[[], nn.Module], state: dict[str, Any], source: str, what: str, check_only: bool = False
) -> nn.Module | None:
    """`build()` with `state` loaded, refused (NetworkMismatchError) when the network `build` makes would not hold
    exactly the tensors of `state`, checked before any memory is taken for it. `check_only`: the check alone (the
    caller builds the network as part of something larger); returns None."""
    _check_tensors_hold_their_bytes(state, source, what)
    budget = SUBMODULES_PER_TENSOR * len(state) + 64
    created = [0]  # submodules registered plus parameters created: each is counted the moment it exists

    def count(*_args: Any) -> None:
        created[0] += 1
        if created[0] > budget:
            raise _TooManyModules

    handles = [
        register_module_module_registration_hook(count),
        register_module_parameter_registration_hook(count),
    ]
    try:
        with torch.device("meta"):
            shape_only = build()
    except Exception as err:  # noqa: BLE001 (a network refusing its arguments, whatever it raises)
        if created[0] > budget:  # the budget's own stop, also when a config instantiator wrapped it
            raise NetworkMismatchError(
                f"{source}: its stored {what} config asks for a network of more than {budget} modules and "
                f"parameters, far more than its {len(state)} weight tensors could fill. Nothing was allocated for "
                "it; the file is damaged or was edited."
            ) from None
        cause = err.__cause__ if err.__cause__ is not None else err
        detail = (str(cause).strip().splitlines() or [""])[0][:300]
        raise NetworkMismatchError(
            f"{source}: its stored {what} config does not build a network ({type(cause).__name__}: {detail}). "
            "The file is damaged or was edited."
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    expected = {k: tuple(v.shape) for k, v in shape_only.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    # Every tensor the config makes must be in the file at the file's shape. Tensors only the file has size nothing
    # here (a network may take optional buffers when loading, such as StyleGAN2's fixed noise); the strict load
    # below refuses any it does not take.
    differ = sorted(k for k in expected if expected[k] != found.get(k))
    if differ:
        first = differ[0]
        raise NetworkMismatchError(
            f"{source}: its {what} weights do not fit its own stored config ({len(differ)} tensor(s) differ, first "
            f"{first}: the config gives {expected.get(first)}, the file {found.get(first)}). Nothing was allocated "
            "for it; the file is damaged or was edited."
        )
    if check_only:
        return None
    network = build()
    try:
        network.load_state_dict(state, strict=True)
    except RuntimeError as err:
        detail = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()), str(err))[:300]
        raise NetworkMismatchError(
            f"{source}: its {what} weights do not fit its own stored config ({detail}). The file is damaged or was "
            "edited."
        ) from None
    return network
