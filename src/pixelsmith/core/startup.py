"""Start-up accounting: how long a run took from its launch to its first finished iteration, and where that time went.

A compiled StyleGAN2 at 256 px spends its first minute or two in torch.compile and CUDA-graph capture, and a user sees
only a silent progress bar. `StartupReport` says, in the log and in `final_metrics.json` (`startup/*`):
- torch.compile's time per network (Dynamo's start/end callbacks, attributed to the network whose forward is on the
  stack, or whose frame a lazily compiled backward belongs to), with the number of graphs and recompiles;
- each iteration plan's first run (eager or compiling) and its CUDA-graph capture, and when it happened;
- the first iteration's end and the last start-up event (the last plan captured), in seconds since the launch;
- Dynamo's graph breaks.

Nothing here waits for the device on a steady iteration: a plan's first run and a capture already wait (compilation,
`torch.cuda.graph`), and only those are timed with a device synchronisation.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


def _process_start_time() -> float:
    """The wall-clock time this process started (Linux: /proc; elsewhere this module's import, a little later)."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as uptime:
            seconds_since_boot = float(uptime.read().split()[0])
        started_after_boot = int(fields[19]) / ticks  # field 22 of stat, counted after the command's ")"
        return time.time() - (seconds_since_boot - started_after_boot)
    except (OSError, ValueError, IndexError):
        return time.time()


PROCESS_START = _process_start_time()


def since_launch() -> float:
    return time.time() - PROCESS_START


@dataclass
class PlanTiming:
    first_run_s: float | None = None  # the plan's first iteration (compiling what it calls the first time)
    compile_s: float = 0.0  # of which torch.compile (the rest: eager kernels, cuDNN autotuning, allocations)
    first_run_at_s: float | None = None  # seconds since launch when that iteration ended
    capture_s: float | None = None  # its CUDA-graph capture
    captured_at_s: float | None = None


def plan_label(plan: Any) -> str:
    """A readable name for an iteration plan: the GAN's ((phases...), adapts) reads "Gmain+Dmain (+ADA)"."""
    if isinstance(plan, tuple) and len(plan) == 2 and isinstance(plan[0], tuple):
        phases, adapts = plan
        return "+".join(phases) + (" (ADA adjusts)" if adapts else "")
    return "iteration" if plan is None else str(plan)


class StartupReport:
    """Collects the start-up figures of one run (see the module docstring). `install()` hooks Dynamo; `network(name)`
    marks whose forward runs; the core calls `plan_started/plan_ran/plan_captured` and `iteration_done`."""

    def __init__(self) -> None:
        self.compile_s: dict[str, float] = defaultdict(float)
        self.graphs: dict[str, int] = defaultdict(int)
        self.recompiles: dict[str, int] = defaultdict(int)
        self.plans: dict[str, PlanTiming] = {}
        self.first_iteration_at_s: float | None = None
        self.last_event_at_s: float | None = None  # the last compile, first run or capture
        self._networks: list[str] = []
        self._frame_network: dict[str, str] = {}
        self._open: list[tuple[float, str]] = []
        self._graph_breaks_before = 0
        self._installed = False
        self._plan_clock: float | None = None
        self._compile_at_plan_start = 0.0
        self._seen_plans: set = set()
        # At the end of training under hardware.cuda_graphs: iterations replayed, and why capture stopped (if it did).
        self.replays = 0
        self.graphs_given_up: str | None = None

    # ---- Dynamo's callbacks ----------------------------------------------------------------------------------------
    def install(self) -> None:
        if self._installed:
            return
        handler = torch._dynamo.callback_handler
        handler.register_start_callback(self._compile_started)
        handler.register_end_callback(self._compile_ended)
        self._graph_breaks_before = _graph_breaks()
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        handler = torch._dynamo.callback_handler
        for remove, callback in (
            (handler.remove_start_callback, self._compile_started),
            (handler.remove_end_callback, self._compile_ended),
        ):
            with suppress(
                ValueError
            ):  # already cleared (torch._dynamo.reset() in a later run of the process)
                remove(callback)
        self._installed = False

    @contextmanager
    def network(self, name: str) -> Iterator[None]:
        """Compiles inside the block are this network's."""
        self._networks.append(name)
        try:
            yield
        finally:
            self._networks.pop()

    def _compile_started(self, args: Any) -> None:
        frame, _, count = str(getattr(args, "compile_id", "")).lstrip("!").partition("/")
        trigger = getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")
        if trigger == "DYNAMO":
            name = self._networks[-1] if self._networks else "other"
            self._frame_network[frame] = name
            self.graphs[name] += 1
            if count.split("/")[-1] not in ("", "0"):
                self.recompiles[name] += 1
        else:  # a backward compiled at its first call, or inductor's own graph recording: the frame's network
            name = self._frame_network.get(frame, self._networks[-1] if self._networks else "other")
        self._open.append((time.perf_counter(), name))

    def _compile_ended(self, args: Any) -> None:
        del args
        if self._open:
            started, name = self._open.pop()
            self.compile_s[name] += time.perf_counter() - started
            self.last_event_at_s = since_launch()

    # ---- the iteration's events ------------------------------------------------------------------------------------
    def plan_is_new(self, plan: Any) -> bool:
        # Keyed on the plan itself: formatting its label every iteration would be host work for nothing.
        return plan not in self._seen_plans

    @contextmanager
    def first_run(self, plan: Any, device: torch.device) -> Iterator[None]:
        """Around an iteration: a plan's first run (compiling what it calls, and waiting anyway) is timed, with a
        device synchronisation at both ends (deliberate reads); every later run of the plan costs nothing here."""
        if not self.plan_is_new(plan):
            yield
            return
        from pixelsmith.core.host_reads import host_reads_allowed

        with host_reads_allowed():
            self.plan_started(device)
        yield
        with host_reads_allowed():
            self.plan_ran(plan, device)

    def plan_started(self, device: torch.device) -> None:
        _synchronize(device)
        self._plan_clock = time.perf_counter()
        self._compile_at_plan_start = sum(self.compile_s.values())

    def plan_ran(self, plan: Any, device: torch.device) -> None:
        _synchronize(device)
        seconds = time.perf_counter() - (self._plan_clock or time.perf_counter())
        self._seen_plans.add(plan)
        timing = self.plans.setdefault(plan_label(plan), PlanTiming())
        timing.first_run_s, timing.first_run_at_s = seconds, since_launch()
        timing.compile_s = sum(self.compile_s.values()) - self._compile_at_plan_start
        self.last_event_at_s = timing.first_run_at_s
        # What is not compilation is the device's first time through: cuDNN's autotuning of every new convolution
        # (hardware.cudnn_benchmark), lazy allocations, and the eager phases themselves.
        # Said where it matters (a second or more: compilation, autotuning); a plain CPU run's first iterations
        # take milliseconds and the line would only be noise.
        log.log(
            logging.INFO if seconds >= 1.0 else logging.DEBUG,
            "Start-up: plan %s ran for the first time in %.1f s: torch.compile %.1f s, the rest (first kernels, "
            "cuDNN autotuning, allocations) %.1f s; %.1f s after launch.",
            plan_label(plan),
            seconds,
            timing.compile_s,
            max(seconds - timing.compile_s, 0.0),
            timing.first_run_at_s,
        )

    def graphs_ended(self, replays: int, given_up: str | None) -> None:
        """The run's CUDA graphs at the end of training: how many iterations were replays, and the reason capture
        was given up mid-run (None: it never was)."""
        self.replays, self.graphs_given_up = replays, given_up

    def plan_captured(self, plan: Any, seconds: float) -> None:
        timing = self.plans.setdefault(plan_label(plan), PlanTiming())
        timing.capture_s, timing.captured_at_s = seconds, since_launch()
        self.last_event_at_s = timing.captured_at_s
        log.info(
            "Start-up: plan %s captured as a CUDA graph in %.2f s (%.1f s after launch).",
            plan_label(plan),
            seconds,
            timing.captured_at_s,
        )

    def iteration_done(self, iteration: int) -> None:
        if iteration == 1 and self.first_iteration_at_s is None:
            self.first_iteration_at_s = since_launch()
            log.info(
                "Start-up: first iteration done %.1f s after launch%s.",
                self.first_iteration_at_s,
                self._compile_summary(prefix="; torch.compile so far: "),
            )

    # ---- the report ------------------------------------------------------------------------------------------------
    def graph_breaks(self) -> int:
        return _graph_breaks() - self._graph_breaks_before

    def _compile_summary(self, prefix: str) -> str:
        if not self.graphs:
            return ""
        parts = [
            f"{name} {self.compile_s[name]:.1f} s ({self.graphs[name]} graph(s), {self.recompiles[name]} recompile(s))"
            for name in sorted(self.graphs)
        ]
        return prefix + ", ".join(parts)

    def summary(self) -> str:
        plans = "; ".join(
            f"{label}: first run {t.first_run_s:.1f} s (compile {t.compile_s:.1f} s)"
            + (f", captured in {t.capture_s:.2f} s" if t.capture_s is not None else "")
            for label, t in self.plans.items()
            if t.first_run_s is not None
        )
        first = f"{self.first_iteration_at_s:.1f} s" if self.first_iteration_at_s is not None else "never"
        last = f"{self.last_event_at_s:.1f} s" if self.last_event_at_s is not None else "-"
        return (
            f"Start-up: first iteration {first} after launch, last compile/capture {last} after launch"
            f"{self._compile_summary(prefix='; torch.compile: ')}; graph breaks: {self.graph_breaks()}"
            + (f"; plans: {plans}" if plans else "")
            + "."
        )

    def metrics(self) -> dict[str, float]:
        """`startup/*` floats for final_metrics.json (benchmarks read them)."""
        out: dict[str, float] = {}
        if self.first_iteration_at_s is not None:
            out["startup/first_iteration_s"] = self.first_iteration_at_s
        if self.last_event_at_s is not None:
            out["startup/last_compile_or_capture_s"] = self.last_event_at_s
        out["startup/compile_s"] = float(sum(self.compile_s.values()))
        out["startup/graphs"] = float(sum(self.graphs.values()))
        out["startup/recompiles"] = float(sum(self.recompiles.values()))
        out["startup/graph_breaks"] = float(self.graph_breaks())
        for name, seconds in self.compile_s.items():
            out[f"startup/compile_s/{name}"] = seconds
        first_runs = [t for t in self.plans.values() if t.first_run_s is not None]
        out["startup/first_runs_s"] = float(sum(t.first_run_s for t in first_runs))
        out["startup/first_runs_not_compile_s"] = float(
            sum(max(t.first_run_s - t.compile_s, 0.0) for t in first_runs)
        )
        out["startup/captures"] = float(sum(t.capture_s is not None for t in self.plans.values()))
        out["startup/capture_s"] = float(sum(t.capture_s or 0.0 for t in self.plans.values()))
        out["startup/replays"] = float(self.replays)
        out["startup/graphs_given_up"] = float(self.graphs_given_up is not None)
        return out


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compile_cache_note(cache_dir: str, networks: list[str]) -> str:
    """What the first iterations will cost, said before they start: an empty cache means minutes on a large model."""
    size = 0
    for root, _, files in os.walk(cache_dir):
        for name in files:
            with suppress(OSError):
                size += os.path.getsize(os.path.join(root, name))
    state = f"warm, {size / 2**20:.0f} MB" if size else "empty"
    expect = (
        "the networks' graphs load from it: seconds to tens of seconds"
        if size
        else "every graph compiles from scratch: a StyleGAN2 at 256 px takes a minute or more on a GPU, a small "
        "model tens of seconds; later runs reuse the cache"
    )
    return (
        f"torch.compile of {', '.join(networks)}: compile cache {cache_dir} ({state}); {expect}. "
        "hardware.compile=false starts at once (slower iterations); delete the folder to clear the cache."
    )
