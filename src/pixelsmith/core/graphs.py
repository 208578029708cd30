"""The training core's iteration as CUDA graphs (`hardware.cuda_graphs`): captured once, replayed every iteration.

A GAN iteration at 32-64 px is hundreds of small kernels; launched from Python one by one, the GPU waits for the
host (the template measured 0.13x of the same step captured by hand on an H100). Here the whole device part of an
iteration (every phase's forwards and backwards, the all-reduce, unscale, finite check, clipping, the fused Adam
steps with their learning rate as a device tensor, the GradScaler update, the guard's counters, EMA and buffer
sync) is recorded once per *iteration plan* and replayed over a static batch buffer.

The plan (`TrainingCore.iteration_plan`) is what the host decides before an iteration: which phases run (lazy R1
every 16th iteration is a second graph), whether ADA adjusts p, the batch's shapes. Equal plans launch the same
kernels, so each distinct plan gets its graph after `warmup` eager runs of it (cuDNN autotuning, compilation,
optimizer state, lazily made tensors; on a side stream, as PyTorch's whole-network capture does). Everything the
host changes between iterations reaches the graph through device tensors written before the replay: the batch
(copied into the static buffer), the learning rates (`fill_` by the schedule), the EMA weight and the iteration
number (for the guard). Random numbers come from CUDA's generator, whose seed and offset a replay reads from the
generator's state: the core reseeds it per iteration exactly as in an eager run, so a graphed run draws the same
latents, noise and augmentation as an eager one.

With `capture=False` (CPU, or a run that cannot be captured) `run` executes the same iteration function on the same
static buffers every time: the code path the CPU tests compare with a plain eager run.

The contract a model follows to be captured (docs/cuda-graphs.md explains each rule; `CudaGraphSetup.blockers` in
core/graph_setup.py refuses at start-up what can be checked):
1. Opt in: `supports_cuda_graphs = True` and an `iteration_plan(batch)` that names every host decision of the
   iteration (the phases due, ADA's adjustment, any Python `if` the iteration takes): equal plans and batch shapes
   launch the same kernels. Host bookkeeping done once per iteration lives there, not in `train_iteration`.
2. `train_iteration` keeps the core's protocol: `loss_backward` per micro-batch, `step` once per optimizer, an
   `IterationResult` back.
3. What changes between iterations reaches the graph as a device tensor written in place before the replay: the
   learning rates and scheduled betas (the core's), `iteration_now` and `images_seen_now` (not `self.iteration`),
   the objective's own scalars (`scheduled_scalars()`, written by `model.schedules`), ADA's p (on the device).
4. Counters are updated in place (`tensor.add_`), never rebound; no tensor is built from Python numbers inside the
   iteration (make constants once, as buffers); no work is skipped on the host for a device value.
5. Random numbers come from torch's generators, which the core reseeds per iteration; host draws use
   `self.host_random` in `iteration_plan` and reach the graph through a static device buffer.
6. No host reads inside the iteration (`.item()`, `bool(tensor)`, `.tolist()`, `nonzero`, masks, `.cpu()`):
   `train.host_sync_check=error` checks it. Deliberate reads happen at logging iterations, in `host_reads_allowed()`.
7. Every optimizer is fused (`hardware.optimizer_impl=fused`); no `on_before_backward` / `on_after_backward` hooks
   in the model or a callback; no `strategy=fsdp` and no profiler (each blocks capture at start-up).
8. At most MAX_GRAPHS distinct (plan, batch signature) keys; beyond, the run gives up capturing and says so.
9. A failed capture calls the model's `abandon_iteration()` and runs the iteration eagerly: a model with host state
   of its own across an iteration overrides it (calling super()) to forget that state.
10. What a captured iteration returned is overwritten by every replay: read it in the same iteration or copy it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from pixelsmith.core.host_reads import host_reads_allowed

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # eager runs of a plan before it is captured (cuDNN autotuning, compilation, lazy state)
MAX_GRAPHS = (
    8  # more distinct plans than this means shapes or branches that vary: capture stops being worth it
)


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    result: (
        Any  # what the iteration function returned while capturing: tensors each replay overwrites in place
    )


class IterationGraphs:
    """One CUDA graph per distinct iteration plan over shared static batch buffers (see the module docstring)."""

    def __init__(self, capture: bool, warmup: int = WARMUP_RUNS, max_graphs: int = MAX_GRAPHS):
        self.capture = capture
        self.warmup = warmup
        self.max_graphs = max_graphs
        self._graphs: dict[Hashable, _Captured] = {}
        self._eager_runs: dict[Hashable, int] = {}
        self._static: dict[tuple, Any] = {}
        self.replays = 0
        self.captures = 0
        self.last_capture_s = 0.0  # the latest capture's wall time (it synchronises anyway)
        self.disabled_reason: str | None = None  # set when capture failed or was given up mid-run

    @property
    def graph_count(self) -> int:
        return len(self._graphs)

    def static_batch(self, batch: Any) -> Any:
        """The static copy of `batch` (tensors copied into buffers kept across iterations, other leaves as given)."""
        signature = _signature(batch)
        buffers = self._static.get(signature)
        if buffers is None:
            buffers = self._static[signature] = _clone(batch)
            return buffers
        _copy_into(buffers, batch)
        return buffers

    def run(
        self,
        plan: Hashable,
        batch: Any,
        iteration: Callable[[Any], Any],
        reset: Callable[[], None] | None = None,
    ) -> Any:
        """Run one iteration of `plan` on `batch`: replay its graph, or run `iteration(static_batch)` eagerly
        (capture off, or one of the plan's warm-up runs), or capture it and replay. Where a capture fails, `reset()`
        forgets the half-done iteration's host state, capture stops for the run (saying why) and the iteration runs
        eagerly."""
        key = (plan, _signature(batch))
        static = self.static_batch(batch)
        captured = self._graphs.get(key)
        if captured is not None:
            captured.graph.replay()
            self.replays += 1
            return captured.result
        if not self.capture:
            return iteration(static)
        runs = self._eager_runs.get(key, 0)
        if runs < self.warmup:
            self._eager_runs[key] = runs + 1
            return _on_side_stream(iteration, static)
        if len(self._graphs) >= self.max_graphs:
            self.give_up(
                f"more than {self.max_graphs} distinct iteration plans (varying shapes or branches), each of which "
                "would need a graph of its own"
            )
            return iteration(static)
        graph = torch.cuda.CUDAGraph()
        started = time.perf_counter()
        try:
            # Capturing synchronises on purpose (torch.cuda.graph waits for the device and empties the cache);
            # thread-local capture lets loader threads keep allocating pinned memory meanwhile.
            with host_reads_allowed(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                result = iteration(static)
        except Exception as error:  # noqa: BLE001 - any capture failure falls back to eager, named once
            if reset is not None:
                reset()
            self.give_up(f"capturing the iteration failed ({type(error).__name__}: {error})")
            return iteration(static)
        self._graphs[key] = _Captured(graph, result)
        self.captures += 1
        self.last_capture_s = time.perf_counter() - started
        graph.replay()
        return result

    def log_summary(self) -> None:
        if self.captures:
            log.info(
                "hardware.cuda_graphs: %d graph(s) captured, %d iterations replayed.",
                self.captures,
                self.replays,
            )

    def give_up(self, reason: str) -> None:
        """Stop capturing for the rest of the run (graphs already made are released), saying why once."""
        if self.disabled_reason is None:
            log.warning(
                "hardware.cuda_graphs: %s; the rest of the run launches its kernels eagerly (correct, slower).",
                reason,
            )
        self.disabled_reason = reason
        self.capture = False
        self._graphs.clear()


def _on_side_stream(fn: Callable[[Any], Any], arg: Any) -> Any:
    # PyTorch's recipe for whole-network capture: warm-up iterations on a side stream, so lazily initialised state
    # (cuDNN autotuning, optimizer moments, the autograd engine's streams) is made as the capture will see it.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = fn(arg)
    torch.cuda.current_stream().wait_stream(side)
    return result


def _signature(batch: Any) -> tuple:
    if isinstance(batch, torch.Tensor):
        return ("tensor", tuple(batch.shape), batch.dtype, batch.device, batch.is_contiguous())
    if isinstance(batch, list | tuple):
        return (type(batch).__name__, *(_signature(item) for item in batch))
    if isinstance(batch, dict):
        return ("dict", *((key, _signature(value)) for key, value in sorted(batch.items())))
    return ("leaf", type(batch).__name__)


def _clone(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.detach().clone()
    if isinstance(batch, list | tuple):
        return type(batch)(_clone(item) for item in batch)
    if isinstance(batch, dict):
        return {key: _clone(value) for key, value in batch.items()}
    return batch


def _copy_into(buffers: Any, batch: Any) -> None:
    if isinstance(buffers, torch.Tensor):
        buffers.copy_(batch, non_blocking=True)
    elif isinstance(buffers, list | tuple):
        for buffer, item in zip(buffers, batch, strict=True):
            _copy_into(buffer, item)
    elif isinstance(buffers, dict):
        for key, buffer in buffers.items():
            _copy_into(buffer, batch[key])
