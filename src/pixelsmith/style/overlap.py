"""What the folder pipeline (`pipeline.run_pipeline`) asks of its device to overlap decode, network, download and
encode: CUDA streams and events on a GPU (`CudaStages`), the same calls as no-ops on a CPU (`HostStages`).

`run_pipeline` is a software pipeline: image i's network is queued on the compute stream, and while the GPU runs
it the host decodes image i+1 and finishes image i-1 (download and encode). Every stream, event and wait it needs
goes through one of these objects, so the tests on a CPU run the scheduling code a GPU runs (with a stand-in that
has a GPU's lag, `tests/test_style_overlap.py`).

The streams of `CudaStages`, one each per job:
- compute: every image's network, thumbnail, blend and uint8 conversion. It is a stream of its own, not the default
  stream, because torchvision's nvJPEG encoder copies its bytes out on the legacy default stream: with the networks
  there, each image's encoded bytes would wait for the next image's network.
- decode: nvJPEG (or nvImageCodec) decodes, each followed by a host wait on this stream only. pytorch/vision#9606:
  torchvision's CUDA decoder allocates its output on the caller's current stream but writes it from a stream of its
  own, without waiting for the caller's stream, so it can write into a block the caller's queued work still reads;
  the maintainers' harness shows that draining the caller's stream before the decode fixes it. Draining the compute
  stream would stop the overlap. Instead the decode runs with this stream current: the caching allocator keeps a
  pool per stream, so the decoder is given only blocks freed on the decode stream, which is synchronised after every
  decode and so never has work in flight. The decoded image is then read on the compute stream, so it is marked
  with `record_stream(compute)`: the allocator does not hand its memory to a later decode before the network that
  reads it has run.
- encode: after an image's network (an event recorded on the compute stream), either nvJPEG encodes it (on the
  main thread only: pytorch/vision#9060) or it is copied into pinned host memory for a host encoder, without the
  host waiting; an encoder thread waits for that copy's event only.

Stage times are read from CUDA events once an image is finished (`EventStageTimes`), never by making the host wait
for a stage: the folder's stages overlap, so they add up to more than the wall time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pixelsmith.style.tiling import StageTimes


class HostStages:
    """A CPU device: no streams and nothing to wait for. The network has run when `stylize_tiled` returns, so an
    image is finished right after its network (`lag` 0) and host encodes go to the codec processes, as they always
    have on a CPU (`threaded_encodes` False: the network has this process's cores)."""

    lag = 0  # images whose network is queued but that are not finished yet, at most
    threaded_encodes = False  # host encodes in this process's threads (else in the codec pool's processes)
    results_on_device = (
        False  # stylize_tiled leaves every result where the network ran (else only for nvJPEG)
    )

    def compute(self) -> AbstractContextManager[Any]:
        """Inside: work is queued on the compute stream."""
        return nullcontext()

    def decode(self) -> AbstractContextManager[Any]:
        """Inside: a device decode; on exit its output is complete (and nothing else was waited for)."""
        return nullcontext()

    def decoded(self, pixels: np.ndarray | Tensor) -> np.ndarray | Tensor:
        """A decoded image, handed to the compute stream."""
        return pixels

    def timer(self) -> StageTimes:
        """One image's stage times, for `stylize_tiled(times=...)`."""
        return StageTimes()

    def record_done(self) -> Any:
        """After an image's network is queued: a mark of its completion."""
        return None

    def encode(self, done: Any, result: Tensor) -> AbstractContextManager[Any]:
        """Inside: `result` (complete: its network is `done`) may be encoded on the device."""
        return nullcontext()

    def download(
        self, result: np.ndarray | Tensor, done: Any, timer: StageTimes
    ) -> tuple[np.ndarray, Any, Any]:
        """(the pixels as an array, what keeps its memory alive, the mark of the copy's completion) for a host
        encoder, started without waiting for the network."""
        array = result.numpy() if isinstance(result, Tensor) else result
        return array, result, None

    def wait_ready(self, ready: Any) -> None:
        """Wait (in any thread) until a download has landed."""

    def collect(self, timer: StageTimes, into: StageTimes) -> None:
        """Add a finished image's stage times to the job's."""
        into.add(timer)

    def close(self) -> None:
        """At the end of the job: the caller's stream follows everything queued."""


class EventStageTimes(StageTimes):
    """`StageTimes` whose stages are timed with CUDA events on the current stream, recorded as the work is queued
    and read by `resolve` once the image is finished: the host never waits for a stage to end. The device argument
    that `stylize_tiled` passes to `stage` (for a synchronised measurement) is ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def stage(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        start = torch.cuda.Event(enable_timing=True)
        start.record(torch.cuda.current_stream())
        try:
            yield
        finally:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream())
            self.pending.append((name, start, end))

    def resolve(self) -> None:
        """Add the recorded stages' durations (waits for the last one, normally long finished)."""
        for name, start, end in self.pending:
            end.synchronize()
            setattr(self, name, getattr(self, name) + start.elapsed_time(end) / 1000.0)
        self.pending.clear()


class CudaStages(HostStages):
    """A CUDA device: the compute, decode and encode streams of the module docstring, with a lag of one image."""

    lag = 1
    threaded_encodes = True  # the network runs on the GPU: this process's cores are free for the encoders
    results_on_device = True

    def __init__(self, device: torch.device):
        self.device = device
        self.caller = torch.cuda.current_stream(device)
        self.compute_stream = torch.cuda.Stream(device)
        self.decode_stream = torch.cuda.Stream(device)
        self.encode_stream = torch.cuda.Stream(device)
        # What the caller queued before the job (the weights' upload) comes before the first network.
        self.compute_stream.wait_stream(self.caller)

    def compute(self) -> AbstractContextManager[Any]:
        return torch.cuda.stream(self.compute_stream)

    @contextmanager
    def decode(self) -> Iterator[None]:
        try:
            with torch.cuda.stream(self.decode_stream):
                yield
        finally:
            # The decode only, never the compute stream: the network queued before it keeps running.
            self.decode_stream.synchronize()

    def decoded(self, pixels: np.ndarray | Tensor) -> np.ndarray | Tensor:
        if isinstance(pixels, Tensor) and pixels.is_cuda:
            pixels.record_stream(self.compute_stream)
        return pixels

    def timer(self) -> StageTimes:
        return EventStageTimes()

    def record_done(self) -> torch.cuda.Event:
        done = torch.cuda.Event()
        done.record(self.compute_stream)
        return done

    @contextmanager
    def encode(self, done: torch.cuda.Event, result: Tensor) -> Iterator[None]:
        with torch.cuda.stream(self.encode_stream):
            self.encode_stream.wait_event(done)
            result.record_stream(self.encode_stream)
            # torchvision's encoder reads its input on a stream of its own without waiting for the caller's: the
            # image must be complete when it is called. This waits for this image's network only (the next one is
            # queued behind it and keeps the GPU busy).
            self.encode_stream.synchronize()
            yield

    def download(
        self, result: Tensor, done: torch.cuda.Event, timer: StageTimes
    ) -> tuple[np.ndarray, Any, Any]:
        with torch.cuda.stream(self.encode_stream):
            self.encode_stream.wait_event(done)
            host = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
            with timer.stage("copy_out"):
                host.copy_(result, non_blocking=True)
            result.record_stream(self.encode_stream)
            ready = torch.cuda.Event()
            ready.record(self.encode_stream)
        return host.numpy(), host, ready

    def wait_ready(self, ready: torch.cuda.Event | None) -> None:
        if ready is not None:
            ready.synchronize()

    def collect(self, timer: StageTimes, into: StageTimes) -> None:
        if isinstance(timer, EventStageTimes):
            timer.resolve()
        into.add(timer)

    def close(self) -> None:
        self.caller.wait_stream(self.compute_stream)
        self.caller.wait_stream(self.encode_stream)


def stages_for(device: torch.device) -> HostStages:
    """The stages object for a job on `device`."""
    return CudaStages(device) if device.type == "cuda" else HostStages()
