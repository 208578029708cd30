"""The stylize folder pipeline: bounded queues, codecs, failures, resume, devices, FLOPs and the summary.

CPU proves what it can: the device-JPEG path runs with torchvision's codec on the CPU (libjpeg-turbo there, nvJPEG
on CUDA: the same calls), `devices=2 device=cpu` runs the real two-process sharding and gather over gloo, and a
killed run is resumed with overwrite=false."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.perf.flops import count_flops
from pixelsmith.style.devices import DevicesError, resolve_devices
from pixelsmith.style.networks import TransformerNet
from pixelsmith.style.pipeline import (
    FolderSummary,
    PipelineOptions,
    decode_jpeg_on_device,
    jpeg_with_icc_profile,
    network_flops_per_pixel,
    run_pipeline,
    save_image,
)
from pixelsmith.style.stylize import main, plan_outputs
from tests.test_style_stylize import photo  # the same small smooth test photo

pytestmark = pytest.mark.filterwarnings(
    "ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"
)
SMALL = {"base_channels": 8, "num_residual_blocks": 1}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    net = TransformerNet(**SMALL)
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"stylizer.{k}": v for k, v in net.state_dict().items()},
            "pixelsmith_config": {"model": {"_target_": "x.Module", "stylizer": dict(SMALL)}},
        },
        path,
    )
    return path, net.eval()


def make_folder(folder: Path, count: int, suffix: str = ".png") -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for index in range(count):
        name = f"img{index:02d}{suffix}"
        Image.fromarray(photo(40 + 4 * (index % 3), 32, index)).save(folder / name)
        names.append(name)
    return names


class CountingPool:
    """A stand-in codec pool that runs each task when it is submitted and records how many were outstanding
    (submitted and not yet collected) at most: the pipeline's queue bound."""

    def __init__(self):
        self.outstanding: set[Future] = set()
        self.most = 0

    def submit(self, fn, *args):
        future = Future()
        future.set_result(fn(*args))
        self.outstanding.add(future)
        self.most = max(self.most, len(self.outstanding))
        original = future.result

        def result(timeout=None, future=future):
            self.outstanding.discard(future)
            return original(timeout)

        future.result = result
        return future


def test_the_queues_stay_bounded_whatever_the_folder_size(checkpoint, tmp_path):
    _, net = checkpoint
    make_folder(tmp_path / "in", 9)
    pairs = plan_outputs(tmp_path / "in", tmp_path / "out")
    pool = CountingPool()
    summary = run_pipeline(
        net, pairs, torch.device("cpu"), PipelineOptions(tile=32, overlap=8), pool, depth=2
    )
    assert len(summary.written) == 9 and not summary.failed
    # The image being stylized, `depth` decodes ahead of it and `depth` encodes behind: 5 of the 18 tasks at most,
    # whatever the folder's size.
    assert pool.most == 5
    assert summary.stage_seconds["decode"] > 0 and summary.stage_seconds["encode"] > 0


def test_worker_pool_writes_the_same_pixels_as_inline(checkpoint, tmp_path):
    path, _ = checkpoint
    make_folder(tmp_path / "in", 4)
    for workers in (0, 2):
        code = main(
            [f"ckpt_path={path}", f"input={tmp_path / 'in'}", f"output={tmp_path / f'out{workers}'}"]
            + ["tile=32", "overlap=8", "progress=false", "device=cpu", f"workers={workers}"]
        )
        assert code == 0
    for name in sorted(os.listdir(tmp_path / "in")):
        inline = np.asarray(Image.open(tmp_path / "out0" / name))
        pooled = np.asarray(Image.open(tmp_path / "out2" / name))
        assert np.array_equal(inline, pooled)


def test_a_failed_write_is_named_and_the_rest_go_on(checkpoint, tmp_path, capsys):
    path, _ = checkpoint
    make_folder(tmp_path / "in", 3)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "img01.png").mkdir()  # a folder where the output file must go: the rename fails
    code = main(
        [f"ckpt_path={path}", f"input={tmp_path / 'in'}", f"output={tmp_path / 'out'}"]
        + ["tile=32", "overlap=8", "progress=false", "device=cpu", "workers=1"]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert (tmp_path / "out" / "img00.png").is_file() and (tmp_path / "out" / "img02.png").is_file()
    assert "FAILED: 1 file(s)" in captured.err and "img01.png" in captured.err
    assert "stylized 2 image(s)" in captured.out
    assert not list((tmp_path / "out").glob(".*.partial"))


def test_png_compress_level_changes_the_size_not_the_pixels(tmp_path):
    rgb = photo(96, 64)
    save_image(rgb, None, tmp_path / "fast.png", None, png_compress_level=1)
    save_image(rgb, None, tmp_path / "small.png", None, png_compress_level=9)
    assert (tmp_path / "fast.png").stat().st_size > (tmp_path / "small.png").stat().st_size
    assert np.array_equal(
        np.asarray(Image.open(tmp_path / "fast.png")), np.asarray(Image.open(tmp_path / "small.png"))
    )


@pytest.mark.parametrize(("suffix", "encoder"), [(".png", "pil"), (".jpg", "auto"), (".png", "threaded")])
def test_a_write_that_fails_midway_leaves_no_partial_image_under_the_final_name(
    tmp_path, monkeypatch, suffix, encoder
):
    """The encoder writes part of the image, then fails (a full disk, a killed worker): nothing stands under the
    output's name, and an earlier image there is kept whole (overwrite=false would take a partial one for done).
    Pillow writes into the temporary file's stream; the threaded PNG encoder's bytes go through
    `write_bytes_atomically`, into a stream of its own."""
    written: list[int] = []

    def half_then_fail(image, fp, filename):
        fp.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 500)  # the start of a file, as an encoder writes it
        fp.flush()
        written.append(500)
        raise OSError(28, "No space left on device")

    real_fdopen = os.fdopen

    class HalfThenFail(io.RawIOBase):
        """The temporary file's stream, writing 500 bytes of what it is given and then failing."""

        def __init__(self, fd, mode):
            self.file = real_fdopen(fd, mode)

        def write(self, data):
            self.file.write(bytes(data)[:500])
            self.file.flush()
            written.append(500)
            raise OSError(28, "No space left on device")

        def close(self):
            self.file.close()
            super().close()

    def break_writes():
        if encoder == "threaded":
            monkeypatch.setattr(os, "fdopen", HalfThenFail)
        else:
            monkeypatch.setitem(Image.SAVE, Image.registered_extensions()[suffix], half_then_fail)

    break_writes()
    rgb = photo(32, 24)
    fresh = tmp_path / f"fresh{suffix}"
    with pytest.raises(OSError, match="No space left"):
        save_image(rgb, None, fresh, None, png_encoder=encoder)
    assert written and not fresh.exists()

    earlier = tmp_path / f"earlier{suffix}"
    monkeypatch.undo()
    save_image(np.zeros_like(rgb), None, earlier, None, png_encoder=encoder)
    before = earlier.read_bytes()
    break_writes()
    with pytest.raises(OSError, match="No space left"):
        save_image(rgb, None, earlier, None, png_encoder=encoder)
    assert earlier.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [earlier.name]  # no temporary file left beside it


def test_device_jpeg_path_keeps_orientation_and_colour_profile_and_matches_pillow(checkpoint, tmp_path):
    path, _ = checkpoint
    (tmp_path / "in").mkdir()
    icc = b"\x00\x00\x02\x0cfake-profile-bytes" * 4000  # 76 KB: needs two APP2 segments
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(photo(48, 32)).save(tmp_path / "in" / "cam.jpg", quality=95, exif=exif, icc_profile=icc)
    decoded = decode_jpeg_on_device(tmp_path / "in" / "cam.jpg", torch.device("cpu"))
    assert tuple(decoded.shape) == (48, 32, 3)  # upright: the EXIF turn applied
    for codec in ("pil", "torchvision"):
        code = main(
            [f"ckpt_path={path}", f"input={tmp_path / 'in'}", f"output={tmp_path / codec}"]
            + ["tile=64", "overlap=16", "progress=false", "device=cpu", f"jpeg_codec={codec}"]
        )
        assert code == 0
    pil_out, device_out = (Image.open(tmp_path / codec / "cam.jpg") for codec in ("pil", "torchvision"))
    assert device_out.size == pil_out.size == (32, 48)
    assert device_out.info.get("icc_profile") == icc == pil_out.info.get("icc_profile")
    # Two JPEG encoders (Pillow at 4:4:4, torchvision at 4:2:0) of the same stylized pixels: equal in luma.
    luma = [np.asarray(image.convert("L"), dtype=int) for image in (pil_out, device_out)]
    assert np.abs(luma[0] - luma[1]).mean() < 2.0


def test_icc_segments_follow_the_jfif_header():
    buffer = io.BytesIO()
    Image.fromarray(photo(16, 16)).save(buffer, format="JPEG")
    with_profile = jpeg_with_icc_profile(buffer.getvalue(), b"p" * 70000)
    assert with_profile[:2] == b"\xff\xd8" and with_profile.count(b"ICC_PROFILE\x00") == 2
    assert Image.open(io.BytesIO(with_profile)).info["icc_profile"] == b"p" * 70000
    assert jpeg_with_icc_profile(b"\xff\xd8rest", None) == b"\xff\xd8rest"


def test_flops_per_pixel_times_pixels_is_the_whole_image_forward(checkpoint):
    _, net = checkpoint
    per_pixel = network_flops_per_pixel(net, probe_side=64)
    image = torch.rand(1, 3, 96, 160)
    with torch.inference_mode():
        whole = count_flops(lambda: net(image))
    assert per_pixel * 96 * 160 == pytest.approx(whole, rel=0.01)


def test_summaries_merge_and_report_throughput_flops_and_mfu():
    first = FolderSummary(
        devices=["cuda:0"],
        written=["a", "b"],
        pixels=2_000_000,
        wall_seconds=2.0,
        stage_seconds={"network": 1.0},
        flops_per_pixel=300_000.0,
        peak_flops=1e12,
        peak_source="bf16 peak: datasheet",
    )
    second = FolderSummary(
        devices=["cuda:1"], written=["c"], existing=4, failed={"d.png": "OSError: disk full"}
    )
    second.pixels, second.wall_seconds, second.peak_flops = 1_000_000, 4.0, 1e12
    merged = FolderSummary.merge([first.to_dict(), second])
    assert (
        merged.written == ["a", "b", "c"]
        and merged.existing == 4
        and merged.failed == {"d.png": "OSError: disk full"}
    )
    assert merged.wall_seconds == 4.0 and merged.peak_flops == 2e12
    text = "\n".join(merged.lines())
    # 3 images / 4 s; 3e6 px * 3e5 FLOP/px = 9e11 FLOP over 4 s = 0.225 TFLOP/s, 11.2% of 2 TFLOP/s.
    assert "0.75 images/s" in text and "225.0 GFLOP/s over the run" in text and "MFU 11.2%" in text
    assert "already there (overwrite=false): 4" in text and "d.png: OSError: disk full" in text


def test_devices_are_resolved_or_refused_with_what_the_machine_has(monkeypatch):
    assert resolve_devices(2, "cpu") == ["cpu", "cpu"]
    assert resolve_devices("all", "cpu") == ["cpu"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert resolve_devices("all", "auto") == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert resolve_devices(1, "cuda:2") == ["cuda:2"]
    with pytest.raises(DevicesError, match="devices=8 but this machine has 4 CUDA device"):
        resolve_devices(8, "cuda")
    with pytest.raises(DevicesError, match="at least 1"):
        resolve_devices(0, "cpu")


@pytest.mark.slow
def test_two_cpu_processes_share_a_folder_each_file_once_with_one_merged_summary(
    checkpoint, tmp_path, capsys
):
    path, _ = checkpoint
    names = make_folder(tmp_path / "in", 7)
    (tmp_path / "in" / "broken.png").write_text("not an image")
    code = main(
        [f"ckpt_path={path}", f"input={tmp_path / 'in'}", f"output={tmp_path / 'out'}"]
        + ["tile=32", "overlap=8", "progress=false", "device=cpu", "devices=2", "workers=0"]
    )
    captured = capsys.readouterr()
    assert code == 1  # the broken file, on whichever rank had it
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == names
    assert "stylized 7 image(s) on 2 device(s) (cpu, cpu)" in captured.out
    assert "FAILED: 1 file(s)" in captured.err and "broken.png" in captured.err
    # The merged summary equals what one process writes for the same folder (rank::2 shards, none twice).
    single = main(
        [f"ckpt_path={path}", f"input={tmp_path / 'in'}", f"output={tmp_path / 'single'}"]
        + ["tile=32", "overlap=8", "progress=false", "device=cpu", "workers=0"]
    )
    assert single == 1
    for name in names:
        assert np.array_equal(
            np.asarray(Image.open(tmp_path / "out" / name)),
            np.asarray(Image.open(tmp_path / "single" / name)),
        )


# Runs stylize.py (argv[1:]) with its writer killed by SIGKILL once the third image is on disk.
KILL_AFTER_THIRD_WRITE = """
import os, runpy, signal, sys
import pixelsmith.style.pipeline as pipeline
original, written = pipeline.save_image, []
def save_then_die(*args, **kwargs):
    original(*args, **kwargs)
    written.append(args)
    if len(written) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
pipeline.save_image = save_then_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_killed_job_rerun_with_overwrite_false_does_only_the_missing_files(checkpoint, tmp_path):
    path, _ = checkpoint
    names = make_folder(tmp_path / "in", 12)
    arguments = [f"ckpt_path={path}", f"input={tmp_path / 'in'}", f"output={tmp_path / 'out'}", "tile=32"]
    arguments += ["overlap=8", "progress=false", "device=cpu", "overwrite=false", "workers=0", "thumbnail=16"]
    command = [sys.executable, str(REPO / "stylize.py"), *arguments]
    # The kill lands right after the third image is written, whatever the machine's speed (a fault injected at the
    # write, not a race against a clock: small images stylize faster than a poll could stop them).
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_THIRD_WRITE, str(REPO / "stylize.py"), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    done_before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*.png")}
    assert 3 <= len(done_before) < len(names), "the kill should land mid-folder"
    for done in done_before:  # every file there is a whole image: writes are atomic
        Image.open(tmp_path / "out" / done).load()
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == names
    assert f"already there (overwrite=false): {len(done_before)} image(s)" in rerun.stdout
    assert f"stylized {len(names) - len(done_before)} image(s)" in rerun.stdout
    for name, mtime in done_before.items():
        assert (tmp_path / "out" / name).stat().st_mtime_ns == mtime  # not redone
    assert not list((tmp_path / "out").glob(".*.partial"))


def test_format_writes_a_folder_in_another_format_and_refuses_unknown_ones(checkpoint, tmp_path, capsys):
    path, _ = checkpoint
    names = make_folder(tmp_path / "in", 2)
    args = [
        f"ckpt_path={path}",
        f"input={tmp_path / 'in'}",
        f"output={tmp_path / 'out'}",
        "tile=32",
        "overlap=8",
    ]
    assert main([*args, "progress=false", "device=cpu", "format=jpg", "workers=0"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [n.replace(".png", ".jpg") for n in names]
    assert main([*args, "format=gif"]) == 2
    assert "format=gif: choose same or one of jpg, jpeg, png" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pytest -m gpu on a GPU machine)")
def test_gpu_folder_with_nvjpeg_matches_pillow_and_uses_every_device(checkpoint, tmp_path, capsys):
    """On CUDA: JPEG decoded and encoded by nvJPEG equals the Pillow path in luma; devices=all shards the folder."""
    path, _ = checkpoint
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(4):
        Image.fromarray(photo(1920, 1080, index)).save(folder / f"{index}.jpg", quality=92)
    common = [f"ckpt_path={path}", f"input={folder}", "progress=false", "device=cuda", "precision=bf16-mixed"]
    assert main([*common, f"output={tmp_path / 'nvjpeg'}", "jpeg_codec=auto", "devices=all"]) == 0
    out = capsys.readouterr().out
    assert f"on {torch.cuda.device_count()} device(s)" in out and "MFU" in out
    assert main([*common, f"output={tmp_path / 'pil'}", "jpeg_codec=pil"]) == 0
    for index in range(4):
        luma = [
            np.asarray(Image.open(tmp_path / kind / f"{index}.jpg").convert("L"), dtype=int)
            for kind in ("nvjpeg", "pil")
        ]
        assert np.abs(luma[0] - luma[1]).mean() < 2.0
