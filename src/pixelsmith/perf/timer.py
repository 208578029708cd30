"""Region timer: exclusive time per named region of a training iteration, kept as a timeline of marks.

A *mark* says "from now on, time belongs to <label>". Regions nest (`augment` inside `D_fwd`): entering a region marks
its name, leaving it marks the enclosing region again, so every interval belongs to exactly one label and the labels
of one iteration partition its wall time: exclusive times, nothing counted twice, and the per-region times add up to
the iteration time by construction (tests check that total against an independent clock).

Outside `training_step` the loop clock (`pixelsmith.perf.breakdown.LoopClock`) marks the loop's own regions:
`data_wait` (the loader's `next()`), `h2d` (Lightning's batch-transfer hooks; the module's `h2d` region adds the
in-step copy and conversion) and `other_loop` (Lightning's loop, callbacks, loggers). Inside `training_step`, time
in no region is `other_in_step` (latents, bookkeeping, `self.log`).

Clocks:
- CPU: `time.perf_counter()`. CPU kernels run synchronously on the calling thread (intra-op worker threads join
  before an op returns), so a reading taken when Python leaves a region is the end of that region's compute.
- CUDA: a CUDA event recorded on the current stream per mark, resolved only once it has completed (no
  synchronisation inside the step). Intervals are then GPU-timeline time: a region is charged for its kernels, and
  `data_wait` is the time the GPU sat idle while the host fetched a batch (a fetch hidden behind queued kernels
  costs nothing). The host readings are kept too (`host_iterations`), to see how far ahead the CPU runs.

The timer's own cost is one `perf_counter` (plus one event record on CUDA) and a list append per mark; it is
measured by `measure_overhead()` and reported with every breakdown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

DATA_WAIT = "data_wait"
H2D = "h2d"
OTHER_IN_STEP = "other_in_step"
OTHER_LOOP = "other_loop"
LOOP_LABELS = (DATA_WAIT, H2D, OTHER_LOOP)


class _Region:
    """Context for one region name; stateless (the timer keeps the stack), so one instance serves nested uses."""

    __slots__ = ("_name", "_timer")

    def __init__(self, timer: StepTimer, name: str):
        self._timer = timer
        self._name = name

    def __enter__(self):
        self._timer.enter(self._name)
        return self

    def __exit__(self, *exc) -> bool:
        self._timer.exit()
        return False


class _AnnotatedRegion:
    """A region that is also a `torch.profiler.record_function` range, so it shows up named in a Chrome trace."""

    __slots__ = ("_name", "_range", "_timer")

    def __init__(self, timer: StepTimer, name: str):
        self._timer = timer
        self._name = name
        self._range = torch.profiler.record_function(name)

    def __enter__(self):
        self._range.__enter__()
        if self._timer.timing:
            self._timer.enter(self._name)
        return self

    def __exit__(self, *exc) -> bool:
        if self._timer.timing:
            self._timer.exit()
        self._range.__exit__(*exc)
        return False


@dataclass
class _RawIteration:
    labels: list[str]
    host: list[float]  # perf_counter per mark, the last one closes the iteration
    events: list = field(default_factory=list)  # CUDA events per mark (empty on CPU)


class StepTimer:
    """Attach as `module._region_timer`; the core's `self.region(name)` then calls `timer(name)`.

    `timing=False, annotate=True` only names the regions for `torch.profiler` (no marks are kept).
    """

    def __init__(self, device: torch.device | str = "cpu", timing: bool = True, annotate: bool = False):
        self.cuda = torch.device(device).type == "cuda"
        self.timing = timing
        self.annotate = annotate
        self._stack: list[str] = []
        self._base = OTHER_LOOP
        self._labels: list[str] = []
        self._host: list[float] = []
        self._events: list = []
        self._pending: list[_RawIteration] = []
        self._contexts: dict[str, _Region] = {}
        self.iterations: list[dict[str, float]] = []  # resolved, seconds per label; GPU timeline on CUDA
        self.host_iterations: list[dict[str, float]] = []  # host clock (identical source to the above on CPU)
        self.marks: list[int] = []  # marks per resolved iteration (for the overhead estimate)
        self.region_names: list[str] = []  # in first-seen order

    # ---- what the module's regions call ------------------------------------------------------------------------
    def __call__(self, name: str):
        if self.annotate:
            return _AnnotatedRegion(self, name)
        context = self._contexts.get(name)
        if context is None:
            context = self._contexts[name] = _Region(self, name)
        return context

    def enter(self, name: str) -> None:
        self._stack.append(name)
        self._mark(name)

    def exit(self) -> None:
        self._stack.pop()
        self._mark(self._stack[-1] if self._stack else self._base)

    # ---- what the loop clock calls ----------------------------------------------------------------------------
    def set_region(self, label: str) -> None:
        """The loop entered `label` (a LOOP_LABELS entry or OTHER_IN_STEP); open regions keep the time."""
        self._base = label
        if not self._stack:
            self._mark(label)

    def begin_iteration(self) -> None:
        """Called when the loader is asked for the next batch: closes the previous iteration, opens the next."""
        if not self.timing:
            return
        self._stack.clear()
        self._base = DATA_WAIT
        if not self._labels:
            self._mark(DATA_WAIT)
            return
        self._close_and_restart(DATA_WAIT)

    def end(self, close_open: bool = True) -> None:
        """Close the running iteration now (or drop it: `close_open=False`) and resolve everything."""
        if self.timing and self._labels:
            if close_open:
                self._close_and_restart(None)
            else:
                self._labels, self._host, self._events = [], [], []
        self._stack.clear()
        self.resolve(wait=True)

    # ---- internals --------------------------------------------------------------------------------------------
    def _mark(self, label: str) -> None:
        if not self.timing:
            return
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)
        self._host.append(time.perf_counter())
        self._labels.append(label)

    def _close_and_restart(self, next_label: str | None) -> None:
        closing_host = time.perf_counter()
        closing_event = None
        if self.cuda:
            closing_event = torch.cuda.Event(enable_timing=True)
            closing_event.record()
        raw = _RawIteration(
            self._labels, self._host + [closing_host], self._events + ([closing_event] if self.cuda else [])
        )
        self._pending.append(raw)
        self._labels, self._host, self._events = [], [], []
        if next_label is not None:
            # The closing mark is also the first mark of the next iteration: no gap between iterations.
            self._labels.append(next_label)
            self._host.append(closing_host)
            if self.cuda:
                self._events.append(closing_event)
        self.resolve(wait=False)

    def drain(self) -> tuple[list[dict[str, float]], list[dict[str, float]], list[int]]:
        """Hand over the resolved iterations and forget them (a long run must not keep one dict per step)."""
        out = (self.iterations, self.host_iterations, self.marks)
        self.iterations, self.host_iterations, self.marks = [], [], []
        return out

    def resolve(self, wait: bool = False) -> None:
        """Turn closed iterations into per-label seconds; on CUDA only those whose events completed (or all)."""
        while self._pending:
            raw = self._pending[0]
            if raw.events and not wait and not raw.events[-1].query():
                return
            if raw.events:
                raw.events[-1].synchronize()
            self._pending.pop(0)
            host = _durations(raw.labels, [b - a for a, b in zip(raw.host, raw.host[1:], strict=False)])
            if raw.events:
                gpu = [a.elapsed_time(b) / 1000.0 for a, b in zip(raw.events, raw.events[1:], strict=False)]
                device = _durations(raw.labels, gpu)
            else:
                device = host
            for label in raw.labels:
                if label not in self.region_names:
                    self.region_names.append(label)
            self.iterations.append(device)
            self.host_iterations.append(host)
            self.marks.append(len(raw.labels))


def _durations(labels: list[str], intervals: list[float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for label, seconds in zip(labels, intervals, strict=True):
        out[label] = out.get(label, 0.0) + seconds
    out["total"] = sum(intervals)
    return out


def measure_overhead(device: torch.device | str = "cpu", repeats: int = 2000) -> float:
    """Seconds one region (enter + exit: two marks) costs, measured on a scratch timer; median of 5 batches."""
    per_region = []
    for _ in range(5):
        timer = StepTimer(device)
        timer.begin_iteration()
        start = time.perf_counter()
        for _ in range(repeats):
            with timer("overhead_probe"):
                pass
        per_region.append((time.perf_counter() - start) / repeats)
    per_region.sort()
    return per_region[len(per_region) // 2]
