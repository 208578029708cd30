"""The stylize speed paths on a CPU: the threaded PNG encoder, the encoder and decoder choices, compile only where it
pays back (and from the cache), and the zero-padded 3-channel convolutions.

What needs a GPU (nvJPEG/nvImageCodec speed, TFLOP/s, CUDA graphs) is measured by the benchmarks, not here."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import pixelsmith.style.png as png
from pixelsmith.style.fuse import PaddedConv2d, pad_rgb_convolutions, resolve_pad_channels
from pixelsmith.style.networks import TransformerNet
from pixelsmith.style.pipeline import (
    CPU_COMPILE_MIN_IMAGES,
    CUDA_COMPILE_MIN_IMAGES,
    check_jpeg_codec,
    compile_decision,
    nvimgcodec_package,
    save_image,
)
from pixelsmith.style.stylize import main
from tests.test_style_pipeline import SMALL, make_folder
from tests.test_style_stylize import photo

pytestmark = pytest.mark.filterwarnings(
    "ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"
)
REPO = Path(__file__).resolve().parents[1]


def decoded(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


@pytest.mark.parametrize("backend", ["zlib", "zlib-ng"])
def test_the_threaded_png_is_a_standard_png_pillow_reads_back_bit_exactly(monkeypatch, backend):
    """Many strips (MIN_STRIP_BYTES lowered), each deflated by its own thread and joined into one zlib stream: Pillow
    decodes RGB and RGBA exactly, keeps the ICC profile, and the strip count does not change the pixels."""
    if backend != "zlib":
        pytest.importorskip("zlib_ng")
    monkeypatch.setattr(png, "MIN_STRIP_BYTES", 1000)
    rgb = photo(160, 120)
    alpha = (np.arange(160 * 120) % 253).astype(np.uint8).reshape(120, 160)
    one = png.encode_png(rgb, threads=1, backend=backend)
    many = png.encode_png(rgb, threads=4, backend=backend)
    assert np.array_equal(decoded(one), rgb) and np.array_equal(decoded(many), rgb)
    with_alpha = png.encode_png(rgb, alpha, icc_profile=b"profile bytes", threads=3, backend=backend)
    with Image.open(io.BytesIO(with_alpha)) as image:
        assert image.mode == "RGBA" and image.info["icc_profile"] == b"profile bytes"
        assert np.array_equal(np.asarray(image), np.dstack([rgb, alpha]))
    # The level is honoured: 9 is smaller than 1, the pixels the same.
    fast, small = (png.encode_png(rgb, level=lv, threads=2, backend=backend) for lv in (1, 9))
    assert len(small) < len(fast) and np.array_equal(decoded(fast), decoded(small))


def test_save_image_writes_the_same_pixels_with_every_png_encoder(tmp_path):
    rgb = photo(96, 64)
    encoders = ["pil", "threaded", "auto"] + (["fpng"] if _installed("fpng") else [])
    for encoder in encoders:
        save_image(rgb, None, tmp_path / f"{encoder}.png", None, png_encoder=encoder, png_threads=2)
        assert np.array_equal(np.asarray(Image.open(tmp_path / f"{encoder}.png")), rgb), encoder


def _installed(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def test_an_encoder_or_decoder_that_is_not_installed_is_refused_at_start_up_with_the_fix(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(sys.modules, "fpng", None)  # as if not installed
    code = main(["ckpt_path=x.ckpt", "input=a.jpg", f"output={tmp_path / 'o.png'}", "png_encoder=fpng"])
    assert code == 2
    err = capsys.readouterr().err
    assert "png_encoder=fpng" in err and "pip install fpng" in err and "png_encoder=auto" in err

    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    with pytest.raises(ValueError, match="decodes on a CUDA GPU.*device=cuda"):
        check_jpeg_codec("nvimgcodec", torch.device("cpu"))
    with pytest.raises(ValueError) as refused:
        check_jpeg_codec("nvimgcodec", torch.device("cuda"))
    assert f"pip install {nvimgcodec_package()}" in str(refused.value)
    assert nvimgcodec_package() == f"nvidia-nvimgcodec-cu{(torch.version.cuda or '12').split('.')[0]}"
    check_jpeg_codec("auto", torch.device("cpu"))  # the default needs nothing
    for bad, said in (("png_threads=0", "png_threads=0"), ("compile_mode=fast", "compile_mode='fast'")):
        assert main(["ckpt_path=x.ckpt", "input=a.jpg", f"output={tmp_path / 'o.png'}", bad]) == 2
        assert said in capsys.readouterr().err


def test_compile_auto_pays_the_compile_only_where_it_pays_back():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    compiled, reason = compile_decision("auto", cuda, 1)
    assert not compiled and "not compiled, 1 image(s) would not repay" in reason
    assert compile_decision("auto", cuda, CUDA_COMPILE_MIN_IMAGES)[0]
    assert not compile_decision("auto", cpu, CPU_COMPILE_MIN_IMAGES - 1)[0]
    assert compile_decision("auto", cpu, CPU_COMPILE_MIN_IMAGES)[0]
    compiled, reason = compile_decision("auto", cuda, 1, cached=True)
    assert compiled and "from the compile cache" in reason
    assert not compile_decision("false", cuda, 100, cached=True)[0]
    assert compile_decision("true", cpu, 1)[0]


def test_compile_mode_auto_autotunes_on_a_gpu_only_where_it_pays_back():
    """max-autotune-no-cudagraphs (the 8K stylizer at 131 against 74 TFLOP/s on an H200, after ~50 s of autotuning)
    from CUDA_AUTOTUNE_MIN_IMAGES images or an autotuned compile in the cache; the default mode otherwise, and on a
    CPU always; a mode the user names is kept."""
    from pixelsmith.style.pipeline import AUTOTUNE_MODE, CUDA_AUTOTUNE_MIN_IMAGES, compile_mode_decision

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert AUTOTUNE_MODE == "max-autotune-no-cudagraphs"
    mode, reason = compile_mode_decision("auto", cuda, CUDA_AUTOTUNE_MIN_IMAGES - 1)
    assert (
        mode == "default" and f"{CUDA_AUTOTUNE_MIN_IMAGES - 1} image(s) would not repay autotuning" in reason
    )
    assert compile_mode_decision("auto", cuda, CUDA_AUTOTUNE_MIN_IMAGES)[0] == AUTOTUNE_MODE
    mode, reason = compile_mode_decision("auto", cuda, 1, autotuned_cached=True)
    assert mode == AUTOTUNE_MODE and "from the compile cache" in reason
    assert compile_mode_decision("auto", cpu, 10**6, autotuned_cached=True)[0] == "default"
    assert compile_mode_decision("reduce-overhead", cpu, 1) == (
        "reduce-overhead",
        "compile_mode=reduce-overhead",
    )


# A stylize.py run that prints inductor's FX-graph cache hits and misses after it.
COUNTING_RUN = """
import sys
from torch._dynamo.utils import counters
from pixelsmith.style.stylize import main
code = main(sys.argv[1:])
print("fxgraph hits", counters["inductor"]["fxgraph_cache_hit"], "misses", counters["inductor"]["fxgraph_cache_miss"])
sys.exit(code)
"""


@pytest.mark.slow
def test_one_image_skips_the_compile_until_a_run_has_cached_it(tmp_path, capsys):
    """One image with an empty cache: eager, and the log says why. A run that compiled (compile=true) leaves its
    graphs and a mark in the cache; a second process given one image then compiles from the cache (the log says so,
    and inductor's FX-graph cache hits) and writes the same pixels."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    net = TransformerNet(**SMALL)
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"stylizer.{k}": v for k, v in net.state_dict().items()},
            "pixelsmith_config": {"model": {"stylizer": dict(SMALL)}},
        },
        ckpt,
    )
    Image.fromarray(photo(96, 64)).save(tmp_path / "photo.png")
    cache = tmp_path / "cache"
    common = [f"ckpt_path={ckpt}", f"input={tmp_path / 'photo.png'}", "tile=32", "overlap=8", "device=cpu"]
    common += ["progress=false", "precision=32-true", f"compile_cache_dir={cache}", "thumbnail=16"]

    counters.clear()
    assert main([*common, f"output={tmp_path / 'eager.png'}"]) == 0
    assert "compile=auto: not compiled, 1 image(s) would not repay" in capsys.readouterr().err
    assert counters["stats"]["unique_graphs"] == 0  # Dynamo compiled nothing
    assert not (cache / "stylize").exists()

    def counting_run(*args: str) -> subprocess.CompletedProcess:
        # Each compiling run is a fresh process: inductor's FX-graph cache key holds the process's settings, which
        # other tests in a pytest process may have changed.
        return subprocess.run(
            [sys.executable, "-c", COUNTING_RUN, *common, *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
        )

    first_run = counting_run(f"output={tmp_path / 'first.png'}", "compile=true")
    assert first_run.returncode == 0, first_run.stderr
    assert "compile=true (compile cache" in first_run.stderr
    assert len(list((cache / "stylize").glob("*.done"))) == 1

    second = counting_run(f"output={tmp_path / 'second.png'}")
    assert second.returncode == 0, second.stderr
    assert "compile=auto: compiled, from the compile cache an earlier run left" in second.stderr
    hits, misses = (int(v) for v in second.stdout.split("fxgraph hits")[1].split()[::2][:2])
    assert hits >= 1 and misses == 0, second.stdout
    first, again = (np.asarray(Image.open(tmp_path / n)) for n in ("first.png", "second.png"))
    assert np.array_equal(first, again)
    eager = np.asarray(Image.open(tmp_path / "eager.png")).astype(int)
    assert (
        np.abs(eager - first.astype(int)).mean() <= 1.0
    )  # compiled within one 8-bit level of eager, on average


def test_padded_rgb_convolutions_give_the_same_output():
    torch.manual_seed(0)
    net = TransformerNet(**SMALL).eval()
    padded = pad_rgb_convolutions(net, 8)
    wrapped = [m for m in padded.modules() if isinstance(m, PaddedConv2d)]
    assert [(m.conv.in_channels, m.conv.out_channels) for m in wrapped] == [(8, 8), (8, 8)]  # first and last
    assert pad_rgb_convolutions(net, 0) is net
    x = torch.rand(2, 3, 40, 56)
    with torch.inference_mode():
        assert torch.equal(net(x), padded(x))  # the added terms are exact zeros
        last = torch.channels_last
        y = padded.to(memory_format=last)(x.contiguous(memory_format=last))
        assert torch.allclose(net(x), y, atol=1e-6)
    assert resolve_pad_channels("auto", torch.device("cuda")) == 8
    assert resolve_pad_channels("auto", torch.device("cpu")) == 0
    with pytest.raises(ValueError, match="pad_channels='3'"):
        resolve_pad_channels("3", torch.device("cpu"))


def test_a_folder_through_threaded_png_and_padded_convolutions_writes_every_image_as_the_plain_path(
    tmp_path, capsys
):
    """Codec workers encoding PNGs on 2 threads each, convolutions padded: every file written, each pixel-equal to
    the plain path's (Pillow inline, no padding)."""
    torch.manual_seed(0)
    net = TransformerNet(**SMALL)
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"stylizer.{k}": v for k, v in net.state_dict().items()},
            "pixelsmith_config": {"model": {"stylizer": dict(SMALL)}},
        },
        ckpt,
    )
    names = make_folder(tmp_path / "in", 5)
    common = [f"ckpt_path={ckpt}", f"input={tmp_path / 'in'}", "tile=32", "overlap=8", "device=cpu"]
    common += ["progress=false", "precision=32-true", "compile=false", f"compile_cache_dir={tmp_path / 'c'}"]
    assert (
        main([*common, f"output={tmp_path / 'plain'}", "png_encoder=pil", "workers=0", "pad_channels=0"]) == 0
    )
    fast = ["png_encoder=threaded", "png_threads=2", "workers=2", "pad_channels=8"]
    assert main([*common, f"output={tmp_path / 'fast'}", *fast]) == 0
    assert "stylized 5 image(s)" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "fast").iterdir()) == sorted(names)
    for name in names:
        assert np.array_equal(
            np.asarray(Image.open(tmp_path / "plain" / name)),
            np.asarray(Image.open(tmp_path / "fast" / name)),
        )


@pytest.mark.bench
def test_the_network_bench_prints_tflops_and_the_error_per_variant(capsys):
    from benchmarks import style_network

    argv = [
        "--size",
        "64x48",
        "--tile",
        "32",
        "--tile-batch",
        "2",
        "--base-channels",
        "4",
        "--residual-blocks",
        "1",
    ]
    argv += [
        "--variants",
        "eager_fp32",
        "eager_bf16_cl",
        "padded",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--device",
        "cpu",
    ]
    results = style_network.main(argv)
    assert [(r["variant"], r["shape"]) for r in results] == [
        (v, s) for s in ("whole 64x48", "tiles 2x32px") for v in ("eager_fp32", "eager_bf16_cl", "padded")
    ]
    for r in results:
        assert r["tflops"] > 0 and r["error"] <= 1.0  # within one 8-bit level of fp32 on average
    assert results[0]["error"] == 0.0
    assert "| padded | whole 64x48 |" in capsys.readouterr().out


def test_the_png_encoder_bench_prints_every_installed_encoder_and_pillow_reads_each_back():
    from benchmarks import png_encoders

    results = png_encoders.main(["--size", "96x64", "--repeats", "1", "--threads", "2"])
    names = [r["name"] for r in results]
    assert "Pillow level 6 (default)" in names and "ours zlib level 6, 2 thread(s)" in names
    assert all(r["exact"] for r in results) and all(r["bytes"] > 0 for r in results)
