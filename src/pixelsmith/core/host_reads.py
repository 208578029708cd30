"""Mark where reading a device value on the host is deliberate, so the host-sync check lets it pass.

An iteration that logs nothing must not make the host wait for the GPU (`train.host_sync_check`,
`callbacks/host_sync.py`). Some reads are on purpose: the core's logging and guard reads at a logging iteration
or at a last iteration that no one could predict (the time budget's), or a CPU-only path where there is no device
to wait for (ADA's row selection). Code wraps them in `host_reads_allowed()`; inside it the dispatch-mode counter
ignores what it sees and CUDA's sync debug mode is paused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_state = threading.local()


def host_reads_are_allowed() -> bool:
    return getattr(_state, "allowed", False)


@contextmanager
def host_reads_allowed() -> Iterator[None]:
    previous = host_reads_are_allowed()
    _state.allowed = True
    cuda_mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_initialized() else 0
    if cuda_mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        _state.allowed = previous
        if cuda_mode:
            torch.cuda.set_sync_debug_mode(cuda_mode)
