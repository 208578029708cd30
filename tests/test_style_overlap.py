"""The stylize folder pipeline's overlapped schedule (`pipeline.run_pipeline` with `overlap.CudaStages`' lag), run on
a CPU through stand-ins for the CUDA stages object: the order of network, decode and finish, the bound on encodes in
flight, encodes in threads, outputs bit-identical to the sequential loop, and no per-image device reads or probes."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.style import pipeline, tiling
from pixelsmith.style.data import read_image
from pixelsmith.style.networks import TransformerNet
from pixelsmith.style.overlap import HostStages
from pixelsmith.style.pipeline import PipelineOptions, run_pipeline, save_image
from pixelsmith.style.stylize import plan_outputs
from pixelsmith.style.tiling import stylize_tiled
from tests.test_style_stylize import photo  # the same small smooth test photo

pytestmark = pytest.mark.filterwarnings(
    "ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"
)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def net() -> TransformerNet:
    torch.manual_seed(0)
    return TransformerNet(base_channels=8, num_residual_blocks=1).eval()


class LaggedStages(HostStages):
    """The CUDA stages' schedule without a GPU: a lag of one image and host encodes in threads; the streams are
    no-ops. `log` receives ("decode" | "finish", image height) in the order the pipeline asks for them."""

    lag = 1
    threaded_encodes = True

    def __init__(self, log: list | None = None):
        self.log = log if log is not None else []

    def decoded(self, pixels):
        self.log.append(("decode", pixels.shape[0]))
        return pixels

    def download(self, result, done, timer):
        self.log.append(("finish", result.shape[0]))
        return super().download(result, done, timer)

    def encode(self, done, result):
        self.log.append(("finish", result.shape[0]))
        return super().encode(done, result)


class InlinePool:
    """A codec pool that runs each task when it is submitted; `submitted` names the functions it was given."""

    def __init__(self):
        self.submitted: list[str] = []

    def submit(self, fn, *args):
        self.submitted.append(fn.__name__)
        future: Future = Future()
        future.set_result(fn(*args))
        return future


def make_folder(folder: Path, heights: list[int], suffix: str = ".png") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index, height in enumerate(heights):
        Image.fromarray(photo(36, height, index)).save(folder / f"img{index}{suffix}", quality=95)


def test_each_network_is_queued_before_the_next_decode_and_the_previous_finish(net, tmp_path, monkeypatch):
    heights = [40, 44, 48, 52]  # an image is known by its height
    make_folder(tmp_path / "in", heights)
    log: list[tuple[str, int]] = []
    original_stylize = pipeline.stylize_tiled

    def network(model, image, **kwargs):
        log.append(("network", image.shape[0]))
        return original_stylize(model, image, **kwargs)

    outstanding, most, lock = [0], [0], threading.Lock()
    original_save = pipeline.save_image

    class Stages(LaggedStages):
        def download(self, result, done, timer):
            with lock:
                outstanding[0] += 1  # downloaded, its encode not finished: the memory the bound is about
                most[0] = max(most[0], outstanding[0])
            return super().download(result, done, timer)

    def slow_save(*args, **kwargs):
        time.sleep(0.3)  # slower than a network here: without the bound, downloads would pile up
        original_save(*args, **kwargs)
        with lock:
            outstanding[0] -= 1

    monkeypatch.setattr(pipeline, "stylize_tiled", network)
    monkeypatch.setattr(pipeline, "save_image", slow_save)
    done: list[Path | None] = []
    pairs = plan_outputs(tmp_path / "in", tmp_path / "out")
    summary = run_pipeline(
        net,
        pairs,
        CPU,
        PipelineOptions(tile=32, overlap=8),
        InlinePool(),
        depth=2,
        on_image_done=lambda source, target: done.append(target),
        stages=Stages(log),
    )
    assert not summary.failed and len(summary.written) == 4
    position = {entry: index for index, entry in enumerate(log)}
    for i, height in enumerate(heights):
        assert [kind for kind, h in log if h == height] == ["decode", "network", "finish"]  # each once
        if i + 1 < len(heights):
            assert position["network", height] < position["decode", heights[i + 1]]
        if i > 0:
            assert position["network", height] < position["finish", heights[i - 1]]
    assert [h for kind, h in log if kind == "finish"] == heights  # finished in order
    assert done == [target for _, target in pairs]  # reported once each, in order
    assert most[0] == 2  # at most `depth` encodes in flight, and the encodes do overlap


@pytest.mark.parametrize(("codec", "output"), [("pil", "png"), ("pil", "jpg"), ("torchvision", "jpg")])
def test_overlapped_outputs_are_bit_identical_to_the_sequential_loop(net, tmp_path, codec, output):
    """The lagged schedule with threaded encodes writes exactly the sequential loop's files, a broken file among them
    is named and the others written. With jpeg_codec=torchvision the JPEGs are decoded and encoded by torchvision on
    the CPU, the calls nvJPEG makes on CUDA."""
    folder = tmp_path / "in"
    make_folder(folder, [40, 48], ".jpg")
    make_folder(folder / "more", [44], ".png")
    (folder / "broken.jpg").write_text("not an image")
    options = {"tile": 32, "overlap": 8, "jpeg_codec": codec}
    summaries = {}
    for kind, stages, pool in (("sequential", None, None), ("overlapped", LaggedStages(), InlinePool())):
        pairs = plan_outputs(folder, tmp_path / kind, output)
        summaries[kind] = run_pipeline(net, pairs, CPU, PipelineOptions(**options), pool, stages=stages)
    for summary in summaries.values():
        assert list(summary.failed) == [str(folder / "broken.jpg")]
        assert len(summary.written) == 3
    for written in summaries["sequential"].written:
        twin = Path(written.replace(str(tmp_path / "sequential"), str(tmp_path / "overlapped")))
        assert np.array_equal(np.asarray(Image.open(written)), np.asarray(Image.open(twin)))
        if output == "jpg":
            assert Path(written).read_bytes() == twin.read_bytes()
    if codec == "pil":  # the sequential loop is still stylize_tiled then save_image, image by image
        for source, target in plan_outputs(folder, tmp_path / "reference", output):
            if source.name == "broken.jpg":
                continue
            image = read_image(source)
            save_image(
                stylize_tiled(net, image.rgb, tile=32, overlap=8, channels_last=False), None, target, None
            )
            assert np.array_equal(
                np.asarray(Image.open(target)),
                np.asarray(Image.open(tmp_path / "overlapped" / target.relative_to(tmp_path / "reference"))),
            )


def test_png_encodes_of_a_folder_run_in_threads_and_read_back_exactly(net, tmp_path, monkeypatch):
    make_folder(tmp_path / "in", [40, 44, 48])
    calls: list[tuple[bool, int]] = []
    original_save = pipeline.save_image

    def spy(*args, **kwargs):
        calls.append((threading.current_thread() is threading.main_thread(), os.getpid()))
        original_save(*args, **kwargs)

    monkeypatch.setattr(pipeline, "save_image", spy)
    pool = InlinePool()
    pairs = plan_outputs(tmp_path / "in", tmp_path / "out")
    summary = run_pipeline(net, pairs, CPU, PipelineOptions(tile=32, overlap=8), pool, stages=LaggedStages())
    assert len(summary.written) == 3 and summary.stage_seconds["encode"] > 0
    assert calls == [(False, os.getpid())] * 3  # in threads of this process
    assert "encode_on_host" not in pool.submitted and "encode_in_thread" not in pool.submitted
    for source, target in pairs:
        expected = stylize_tiled(net, read_image(source).rgb, tile=32, overlap=8, channels_last=False)
        assert np.array_equal(np.asarray(Image.open(target)), expected)


def test_stylize_tiled_reads_nothing_back_from_the_device(net, monkeypatch):
    """The blending windows are summed on the host from host windows (a device read makes the host wait for every
    network queued): no `.cpu()` before the result, even with the device pipeline."""
    sums: list[str] = []
    original_sum = tiling.window_sum

    def window_sum(starts, windows, length):
        sums.extend(window.device.type for window in windows)
        return original_sum(starts, windows, length)

    reads: list[tuple] = []
    original_cpu = torch.Tensor.cpu

    def cpu(self, *args, **kwargs):
        reads.append(tuple(self.shape))
        return original_cpu(self, *args, **kwargs)

    monkeypatch.setattr(tiling, "window_sum", window_sum)
    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    image = photo(80, 64)
    result = stylize_tiled(
        net, image, tile=32, overlap=8, pipeline="device", return_tensor=True, channels_last=False
    )
    assert tuple(result.shape) == (64, 80, 3)
    assert sums and set(sums) == {"cpu"}
    assert reads == []


def test_tile_auto_measures_the_network_once_per_job(net, tmp_path, monkeypatch):
    make_folder(tmp_path / "in", [40, 44, 48])
    counts = {"bytes_per_pixel": 0, "memory_budget": 0}
    for name in counts:
        original = getattr(tiling, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(tiling, name, spy)
    pairs = plan_outputs(tmp_path / "in", tmp_path / "out")
    for stages in (None, LaggedStages()):
        counts.update(dict.fromkeys(counts, 0))
        summary = run_pipeline(net, pairs, CPU, PipelineOptions(tile="auto"), None, stages=stages)
        assert len(summary.written) == 3
        assert counts == {"bytes_per_pixel": 1, "memory_budget": 1}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pytest -m gpu on a GPU machine)")
@pytest.mark.parametrize("output", ["jpg", "png"])
def test_gpu_overlapped_folder_writes_what_the_sequential_loop_writes(tmp_path, output):
    """On CUDA: the three streams (nvJPEG decode on its own stream, networks on the compute stream, downloads and
    nvJPEG encodes on the encode stream) write the files the one-stage-at-a-time loop writes on the same GPU, with
    network times from events."""
    torch.manual_seed(0)
    model = TransformerNet(base_channels=16, num_residual_blocks=2).eval()
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(6):
        Image.fromarray(photo(640 + 32 * index, 360, index)).save(folder / f"{index}.jpg", quality=92)
    device = torch.device("cuda")
    options = {"tile": "auto", "precision": "bf16-mixed", "compile": "false"}
    summaries = {}
    for kind, stages in (("sequential", HostStages()), ("overlapped", None)):
        pairs = plan_outputs(folder, tmp_path / kind, output)
        summaries[kind] = run_pipeline(
            model, pairs, device, PipelineOptions(**options), InlinePool(), stages=stages
        )
        assert len(summaries[kind].written) == 6 and not summaries[kind].failed
    assert summaries["overlapped"].stage_seconds["network"] > 0
    for written in summaries["sequential"].written:
        twin = written.replace(str(tmp_path / "sequential"), str(tmp_path / "overlapped"))
        assert np.array_equal(np.asarray(Image.open(written)), np.asarray(Image.open(twin)))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_device_decode_is_turned_upright_as_pillow_turns_it(orientation):
    """torchvision's CUDA JPEG decoder ignores apply_exif_orientation: the pipeline applies the EXIF orientation
    itself (`exif_oriented`), and must agree with Pillow's `ImageOps.exif_transpose` for each of the 8 values."""
    from PIL import ImageOps

    from pixelsmith.style.pipeline import EXIF_ORIENTATION, exif_oriented

    pixels = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)  # not square
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[EXIF_ORIENTATION] = orientation
    image.info["exif"] = exif.tobytes()
    expected = np.asarray(ImageOps.exif_transpose(image))
    turned = exif_oriented(torch.from_numpy(pixels).permute(2, 0, 1), orientation).permute(1, 2, 0)
    assert np.array_equal(turned.numpy(), expected)


class FakeCuda:
    """Stand-ins for the CUDA primitives `overlap.CudaStages` uses, so its own code runs on a CPU: streams and events
    that record what is asked of them, a no-op `record_stream`, and `torch.empty(pin_memory=True)` as plain memory.
    `calls` lists ("stream" | "event" ..., name) in order."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, str]] = []
        self.current = "caller"
        fake = self

        class Stream:
            count = 0

            def __init__(self, device=None):
                Stream.count += 1
                self.name = f"stream{Stream.count}"

            def synchronize(self):
                fake.calls.append(("synchronize", self.name))

            def wait_event(self, event):
                fake.calls.append(("wait_event", self.name))

            def wait_stream(self, other):
                fake.calls.append(("wait_stream", self.name))

        class Event:
            def __init__(self, enable_timing=False):
                self.recorded = False

            def record(self, stream=None):
                self.recorded = True

            def synchronize(self):
                assert self.recorded, "an event waited for before it was recorded"

            def elapsed_time(self, end):
                return 2.0  # milliseconds

        @contextmanager
        def stream(chosen):
            before, fake.current = fake.current, chosen.name
            try:
                yield
            finally:
                fake.current = before

        caller = Stream()
        caller.name = "caller"
        empty = torch.empty

        def unpinned_empty(*args, pin_memory=False, **kwargs):
            return empty(*args, **kwargs)

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: caller)
        monkeypatch.setattr(
            torch.Tensor, "record_stream", lambda self, s: fake.calls.append(("record", s.name))
        )
        monkeypatch.setattr(torch, "empty", unpinned_empty)


@pytest.mark.parametrize("output", ["png", "jpg"])
def test_the_cuda_stages_code_runs_on_a_cpu_with_stand_in_streams(net, tmp_path, monkeypatch, output):
    """`CudaStages` itself (not a stand-in of the schedule): its streams, events, pinned downloads and event-timed
    stages, with CUDA's primitives faked. The folder's files equal the sequential loop's; each download waits for its
    image's network on the encode stream; the stage times come from the events."""
    from pixelsmith.style.overlap import CudaStages

    folder = tmp_path / "in"
    make_folder(folder, [40, 44, 48])
    sequential = run_pipeline(
        net,
        plan_outputs(folder, tmp_path / "sequential", output),
        CPU,
        PipelineOptions(tile=32, overlap=8),
        None,
    )
    fake = FakeCuda(monkeypatch)
    times = tiling.StageTimes()
    overlapped = run_pipeline(
        net,
        plan_outputs(folder, tmp_path / "overlapped", output),
        CPU,
        PipelineOptions(tile=32, overlap=8),
        InlinePool(),
        times=times,
        stages=CudaStages(CPU),
    )
    assert not overlapped.failed and len(overlapped.written) == len(sequential.written) == 3
    for written in sequential.written:
        twin = Path(written.replace(str(tmp_path / "sequential"), str(tmp_path / "overlapped")))
        assert np.array_equal(np.asarray(Image.open(written)), np.asarray(Image.open(twin)))
    # compute, decode, encode: made once; every download waits on the encode stream for its network's event.
    encode_stream = "stream4"
    assert fake.calls.count(("wait_event", encode_stream)) == 3
    assert fake.calls.count(("record", encode_stream)) == 3  # each result kept alive for the encode stream
    # Two tile rows an image (32-px tiles on 40-48 px), one batch each: six network stages of 2 ms by the events.
    assert times.network == pytest.approx(6 * 2.0 / 1000.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pytest -m gpu on a GPU machine)")
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_gpu_decoded_jpegs_come_out_upright_as_the_cpu_decoder_gives_them(tmp_path, orientation):
    """The device decode plus `exif_oriented` gives the CPU decoder's upright image (torchvision's CPU decoder
    honours EXIF orientation, its CUDA one does not): this also fails, by turning the image twice, if a torchvision
    release starts honouring it on CUDA."""
    from pixelsmith.style.pipeline import EXIF_ORIENTATION, decode_jpeg_on_device

    pixels = photo(48, 32, 1)  # not square
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[EXIF_ORIENTATION] = orientation
    path = tmp_path / "oriented.jpg"
    image.save(path, quality=95, exif=exif.tobytes())
    on_cpu = decode_jpeg_on_device(path, CPU)
    on_gpu = decode_jpeg_on_device(path, torch.device("cuda")).cpu()
    unturned = torch.from_numpy(pixels).int()
    # The CPU decoder did turn it: another shape (6, 8), or the same shape with other pixels (3: upside down).
    assert on_cpu.shape != unturned.shape or (on_cpu.int() - unturned).abs().float().mean() > 10
    assert on_gpu.shape == on_cpu.shape
    assert (on_gpu.int() - on_cpu.int()).abs().float().mean() < 2.0  # nvJPEG and libjpeg-turbo round alike
