"""The benchmarks' clocks time finished work: at the edges of the timed window they wait for the device before
reading the time (a replayed CUDA graph returns to the host long before its kernels end)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

# The plain loop is a GAN's: a fork without the GAN part (README "Removing a part") skips this file.
pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")

from benchmarks import harness  # noqa: E402
from benchmarks.harness import IterationClock, window_edges  # noqa: E402
from benchmarks.plain_loop import run_plain  # noqa: E402


def _recording(events: list[str]):
    """Mocks for CUDA's synchronize and the clock that record the order of the calls."""
    clock = iter(range(1000))

    def perf_counter():
        events.append("clock")
        return float(next(clock))

    return (
        mock.patch.object(torch.cuda, "is_available", return_value=True),
        mock.patch.object(torch.cuda, "is_initialized", return_value=True),
        mock.patch.object(torch.cuda, "synchronize", side_effect=lambda *a: events.append("sync")),
        mock.patch.object(harness.time, "perf_counter", side_effect=perf_counter),
    )


def _run_with(events, body):
    patches = _recording(events)
    with patches[0], patches[1], patches[2], patches[3]:
        body()


def test_template_clock_synchronises_at_the_window_start_and_end():
    events: list[str] = []
    IterationClock.synchronize_after = window_edges(warmup=2, steps=3)

    def five_iterations():
        clock = IterationClock()
        clock.on_train_start(None, None)
        for index in range(5):
            clock.on_train_batch_end(None, None, None, None, index)

    try:
        _run_with(events, five_iterations)
    finally:
        IterationClock.synchronize_after = frozenset()
    # The 2nd reading opens the window, the 5th (the last) closes it: each right after a synchronize.
    assert events == ["clock", "sync", "clock", "clock", "clock", "sync", "clock"]


def test_plain_loop_synchronises_at_the_window_end():
    events: list[str] = []

    class Step:
        def step(self, images):
            events.append("step")

    def run():
        with mock.patch("benchmarks.plain_loop.time.perf_counter", side_effect=harness.time.perf_counter):
            run_plain(Step(), [torch.zeros(1)], 4, window_edges(warmup=1, steps=3))

    _run_with(events, run)
    assert events[-3:] == ["step", "sync", "clock"]
    assert events.count("sync") == 2 and events[:3] == ["step", "sync", "clock"]
