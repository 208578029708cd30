"""HostSyncCheck: prove that a training iteration which logs nothing never makes the host wait for the device.

A GPU iteration is fast only while Python runs ahead of the kernels it queues; every `.item()`, `bool(tensor)`,
`.cpu()` or data-dependent shape (`nonzero`, boolean indexing) stops the host until the GPU has caught up. The
core keeps its non-finite guard, GradScaler skip, clipping, EMA, lazy R1, ADA and schedules on the device and reads
values only at logging iterations (`train.log_every_n_steps`); `train.host_sync_check=warn|error` checks that.

The window of an iteration that will not log (`train.host_sync_scope`):
- `loop` (the default): the whole Lightning loop of that iteration, from `on_train_batch_start` through
  `training_step`, every callback's `on_train_batch_end` (progress bar, loggers' hooks), Lightning's bookkeeping
  after them (the logger connector, the step's end) and the fetch of the next batch, up to the next
  `on_train_batch_start`. At an iteration where another callback does its every-N-iterations work (samples,
  evaluation, checkpoints: `every_n_steps`) or that turns out to be the last, the window closes at this
  callback's own batch end: those read the device on purpose.
- `step`: from `on_train_batch_start` to this callback's `on_train_batch_end` (it is first in the list): the
  module's step only.
Inside the window:
- on CUDA, `torch.cuda.set_sync_debug_mode` makes every synchronising CUDA call warn or raise (the real proof);
- on other devices, a dispatch mode counts the aten ops that synchronise on CUDA (`SYNCING_OPS`, boolean-mask
  indexing) and the value reads that are device-to-host copies on CUDA (`.tolist()`, `.numpy()`, `.cpu()`), so
  CPU CI exercises the same check on the same code. It cannot tell a tensor that lives on the host on purpose (an
  optimizer's CPU step count) from one that would be on the GPU; warn mode lists them with their lines. What a
  DataLoader's sampler, dataset and collate do is host work by design and is not counted.
Logging iterations and the last one are outside the window: they read the device on purpose. The first iteration
of a fit is left out too (it creates the device-side state).
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

import lightning as L
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pixelsmith.core.config import HOST_SYNC_MODES, HOST_SYNC_SCOPES
from pixelsmith.core.host_reads import host_reads_are_allowed
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)

# Ops whose result the host needs (a value, or an output size that depends on values) before it can go on.
SYNCING_OPS = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), float(t), int(t), bool(t), if t: ...
        "aten.is_nonzero",
        "aten.equal",
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.repeat_interleave",  # without output_size
    }
)


class HostSyncError(PixelsmithError, RuntimeError):
    """An iteration that logs nothing made the host wait for the device (train.host_sync_check=error)."""


class SyncCounter(TorchDispatchMode):
    """Counts (and, with `raise_on_sync`, refuses) the ops that make a CUDA host wait, on any device."""

    def __init__(self, raise_on_sync: bool = False):
        super().__init__()
        self.raise_on_sync = raise_on_sync
        self.events: list[tuple[str, str]] = []  # (op name, innermost Pixelsmith/user frame)

    # Reads of a tensor's values that dispatch no aten op on a CPU tensor (on CUDA they are device-to-host copies).
    _HOST_READS = ("tolist", "numpy", "cpu")

    def __enter__(self):
        self._originals = {name: getattr(torch.Tensor, name) for name in self._HOST_READS}
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, self._recording(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def _recording(self, name, original):
        def read(tensor, *args, **kwargs):
            if not host_reads_are_allowed():
                self._found(f"Tensor.{name}")
            return original(tensor, *args, **kwargs)

        return read

    def _found(self, name: str) -> None:
        if _in_host_data_loading():
            return
        where = _caller()
        self.events.append((name, where))
        if self.raise_on_sync:
            raise HostSyncError(
                f"{name} made the host wait for the device during an iteration that logs nothing (at {where}). "
                "Keep the value on the device (torch.where instead of `if`, a tensor instead of .item()) or "
                "read it only at logging iterations (TrainingCore.logging_values); "
                "train.host_sync_check=warn reports without stopping."
            )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        syncs = name in SYNCING_OPS or (name.startswith("aten.index") and _has_bool_index(args))
        if name == "aten.repeat_interleave" and kwargs.get("output_size") is not None:
            syncs = False
        if syncs and not host_reads_are_allowed():
            self._found(name)
        return func(*args, **kwargs)


def _has_bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], list | tuple) else ()
    return any(torch.is_tensor(i) and i.dtype == torch.bool for i in indices)


def _in_host_data_loading() -> bool:
    # A DataLoader's sampler, dataset and collate work on host tensors by design (in the main process when it has
    # no workers): on a GPU they run before the batch is copied to the device and cannot wait for it. Batches that
    # live on the device (data/on_device.py) are no DataLoader and stay checked.
    frame = sys._getframe(2)
    while frame is not None:
        if _DATA_LOADING in frame.f_code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back
    return False


_DATA_LOADING = "/torch/utils/data/"


def _caller() -> str:
    # The innermost frame outside torch and this file: the line a user would change.
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "unknown"


class HostSyncCheck(L.Callback):
    """Check iterations that do not log for host-device synchronisation; `mode` is "warn" or "error", `scope`
    "loop" (the whole Lightning loop of such an iteration) or "step" (the module's step): see the module docstring.

    `checked` counts the iterations checked and `events` holds (iteration, op, location) of every sync found (on a
    CPU; on CUDA the sync debug mode warns or raises itself). Put it first in the callback list.
    """

    def __init__(self, mode: str = "error", scope: str = "loop"):
        if mode not in ("warn", "error"):
            raise PixelsmithError(
                f"train.host_sync_check={mode!r} is unknown; choose one of {', '.join(HOST_SYNC_MODES)}."
            )
        if scope not in HOST_SYNC_SCOPES:
            raise PixelsmithError(
                f"train.host_sync_scope={scope!r} is unknown; choose one of {', '.join(HOST_SYNC_SCOPES)}."
            )
        self.mode = mode
        self.scope = scope
        self.checked = 0
        self.events: list[tuple[int, str, str]] = []
        self._counter: SyncCounter | None = None
        self._cuda_mode_before: int | None = None
        self._iteration = 0
        self._first_batch = True

    def _logs_this_iteration(self, module: Any) -> bool:
        core = module.core
        coming = module.iteration + 1
        return coming % core.log_every_n_steps == 0 or coming >= core.max_steps

    @staticmethod
    def _periodic_work_now(trainer, pl_module) -> bool:
        """Whether another callback does its every-N-iterations work at the iteration just finished (it reads the
        device on purpose: a sample grid, an evaluation, a checkpoint)."""
        iteration = int(pl_module.iteration)
        for callback in trainer.callbacks:
            every = getattr(callback, "every_n_steps", None)
            if isinstance(every, int) and every > 0 and iteration % every == 0:
                return True
        return False

    def on_train_start(self, trainer, pl_module) -> None:
        self._first_batch = True
        if self.scope == "loop" and trainer.world_size > 1:
            # Lightning 2.6 broadcasts its SIGTERM flag and reads it with `.item()` at the start of every
            # iteration under several processes (`_TrainingEpochLoop._broadcast_sigterm_tensor`): a sync the loop
            # scope would report on every iteration, and not the template's to remove.
            log.warning(
                "train.host_sync_scope=loop under %d processes: Lightning reads a broadcast SIGTERM flag on the "
                "host at the start of every iteration; checking from on_train_batch_start to this check's "
                "on_train_batch_end only (host_sync_scope=step).",
                trainer.world_size,
            )
            self.scope = "step"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # The first iteration of a fit (fresh or resumed) is left out: it creates the device-side state (guard
        # counters, the scaler's scale) and compiles. The reads of the core's own logging (and of a last iteration
        # the time budget decides) are marked deliberate (`core/host_reads.py`) and pass.
        first, self._first_batch = self._first_batch, False
        if first or self._logs_this_iteration(pl_module):
            self._close()
            return
        self._open(pl_module)
        self._drain()  # what the window saw since the previous iteration's step: its loop tail and this fetch
        self._iteration = pl_module.iteration
        self.checked += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # In loop scope the window stays open through the other callbacks, Lightning's bookkeeping and the next
        # fetch; the next `on_train_batch_start` (or the epoch's end) closes it if that iteration logs.
        # An iteration that turned out to be the last (the time budget, a preemption signal) logs: close too.
        if self.scope == "step" or trainer.should_stop or self._periodic_work_now(trainer, pl_module):
            self._close()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._close()  # epoch-end hooks and metrics may read the device on purpose

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close()

    def _open(self, pl_module: Any) -> None:
        if self._cuda_mode_before is not None or self._counter is not None:
            return  # still open since the previous iteration (loop scope)
        if pl_module.device.type == "cuda":
            # CUDA's own check sees every synchronising call, copies included; a dispatch mode on top would only
            # slow the iteration down and make torch.compile'd networks recompile under it.
            self._cuda_mode_before = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(self.mode)
            return
        self._counter = SyncCounter(raise_on_sync=self.mode == "error")
        self._counter.__enter__()

    def _drain(self) -> None:
        if self._counter is None:
            return
        for op, where in self._counter.events:
            self.events.append((self._iteration, op, where))
            log.warning(
                "Iteration %d: %s made the host wait for the device (at %s).", self._iteration, op, where
            )
        self._counter.events = []

    def _close(self) -> None:
        if self._cuda_mode_before is not None:
            torch.cuda.set_sync_debug_mode(self._cuda_mode_before)
            self._cuda_mode_before = None
        if self._counter is None:
            return
        self._drain()
        counter, self._counter = self._counter, None
        counter.__exit__(None, None, None)
