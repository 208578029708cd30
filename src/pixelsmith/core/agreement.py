"""How several GPU processes agree to stop (the time budget, a preemption signal) without a device read.

Every rank must stop at the same iteration, so the ranks agree with an all-reduce (the maximum of each rank's
flags). On a GPU with NCCL the flag tensor lives on the device, and reading the reduced value with `.item()` would
make the host wait for every kernel queued before it. `RankAgreement` therefore posts the flags at one check
iteration (a pinned host buffer, copied to the device and back with `non_blocking=True`, an event recorded after)
and reads the result at the next check iteration, when the event is long complete: every rank reads the same
agreed value at the same iteration, one check interval after the flags were posted. On a CPU (gloo) nothing waits
for a device, and the core agrees at once (`core/budget.py`, `core/preemption.py`); the same code runs there in the
tests.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class RankAgreement:
    def __init__(self) -> None:
        self._send: list[
            torch.Tensor
        ] = []  # pinned host buffers, made at the first exchange (they need CUDA)
        self._recv: list[torch.Tensor] = []
        self._events: list = [None, None]
        self._posted: int | None = None  # the buffer index of the flags in flight
        self._next = 0

    def exchange(
        self, flags: list[float], reduce_max: Callable[[torch.Tensor], object], device: torch.device
    ) -> list[float] | None:
        """Post this check iteration's `flags` and return the maximum over ranks of the previous check's (None at
        the first). Called at the same iterations on every rank."""
        cuda = device.type == "cuda"
        if not self._send:
            made = [torch.zeros(len(flags), dtype=torch.float32) for _ in range(4)]
            made = [buffer.pin_memory() for buffer in made] if cuda else made
            self._send, self._recv = made[:2], made[2:]
        agreed = None
        if self._posted is not None:
            if self._events[self._posted] is not None:
                self._events[self._posted].synchronize()  # recorded a check interval ago: complete
            agreed = self._recv[self._posted].tolist()
        index = self._next
        self._next = 1 - index
        if self._events[index] is not None:
            self._events[index].synchronize()  # its buffers' last copies are done before they are rewritten
        self._send[index].copy_(torch.tensor(flags, dtype=torch.float32))
        on_device = self._send[index].to(device, non_blocking=True)
        reduce_max(on_device)
        self._recv[index].copy_(on_device, non_blocking=True)
        event = torch.cuda.Event() if cuda else None
        if event is not None:
            event.record()
        self._events[index] = event
        self._posted = index
        return agreed
