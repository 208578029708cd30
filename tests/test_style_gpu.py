"""The style models on the GPU: `pytest -m gpu` (the style part's half of test_gpu.py, whose helpers it uses).

Each style model trains for a few iterations with the profiles' own settings, `stylize.py device=cuda` runs on the
result, quiet iterations never synchronise (compiled, and across the whole Lightning loop with a DataLoader), and an
8K photo is stylized with automatic tiles, including a real out-of-memory halving. `PIXELSMITH_GPU_TESTS_ON_CPU=1`
runs the CPU dry run, as for test_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from pixelsmith.config.paths import DATA_DIR
from pixelsmith.style.stylize import main as stylize
from tests.test_gpu import (
    ON_CPU,
    _config,
    _train,
    assert_no_host_sync_across_the_loop,
    assert_quiet_iterations_never_synchronise,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() or ON_CPU), reason="needs a CUDA GPU (pytest -m gpu on a GPU machine)"
    ),
]

STYLE_CASES = {
    "style_fast": ["experiment=style_fast"],
    "style_fast-16-mixed": ["experiment=style_fast", "precision=16-mixed"],
    "style_adain": ["experiment=style_adain"],
    "style_fast-reduce-overhead": [
        "experiment=style_fast",
        "hardware.compile_mode=reduce-overhead",
        "hardware.cuda_graphs=false",
    ],
}


OFFLINE_STYLE = ["model.loss_net.pretrained=false"]  # no VGG weights on the test machines (LPIPS follows it)


@pytest.mark.parametrize("case", list(STYLE_CASES))
def test_style_model_trains_on_the_gpu(case, tmp_path):
    _train([*STYLE_CASES[case], *OFFLINE_STYLE], tmp_path / "run")


def test_stylize_runs_on_cuda(tmp_path):
    device = "cpu" if ON_CPU else "cuda"
    style = tmp_path / "style"
    _train(["experiment=style_fast", *OFFLINE_STYLE], style)

    photo = DATA_DIR / "style" / "content" / "chelsea.jpg"
    for precision in ("32-true", "bf16-mixed"):
        output = tmp_path / f"stylized_{precision}.png"
        code = stylize(
            [
                f"ckpt_path={style / 'checkpoints' / 'last.ckpt'}",
                f"input={photo}",
                f"output={output}",
                f"device={device}",
                f"precision={precision}",
                "tile=128",
                "overlap=16",
            ]
        )
        assert code == 0 and Image.open(output).size == Image.open(photo).size


def test_quiet_style_iterations_never_synchronise(tmp_path, monkeypatch):
    assert_quiet_iterations_never_synchronise(
        [*STYLE_CASES["style_fast"], *OFFLINE_STYLE], tmp_path, monkeypatch
    )


def test_no_host_sync_across_the_whole_lightning_loop_of_a_style_run_with_a_data_loader(
    tmp_path, monkeypatch
):
    """Workers and pinned memory; eager (the compiled style step is the test above's)."""
    overrides = [
        *STYLE_CASES["style_fast"],
        *OFFLINE_STYLE,
        "hardware=auto",
        "hardware.compile=false",
        "data.num_workers=2",
    ]
    assert_no_host_sync_across_the_loop(overrides, tmp_path, monkeypatch)


# ---- 8K stylize with tile=auto, and a real out-of-memory halving -----------------------------------------------
# The CPU dry run stylizes 1024x576 and simulates the out-of-memory error: a CPU has no allocator cap to run into.
STYLIZE_SIZE = (1024, 576) if ON_CPU else (7680, 4320)
STYLIZE_DEVICE = "cpu" if ON_CPU else "cuda"
# The cap for the halving test: far below what the 8K image takes in one pass (≈ 12 GB for TransformerNet 32/5 in
# fp32), above what the tile batch of 960-px tiles takes with the image on the device (≈ 1.5 GB).
HALVING_CAP_BYTES = 3 << 30
# The CPU dry run's stand-in for that cap: a forward pass larger than this a side "runs out of memory".
SIMULATED_LIMIT_SIDE = 512


def _synthetic_photo(path, size):
    """Smooth colour fields plus grain, saved as a JPEG: it stylizes like a photo, not like white noise."""
    import numpy as np
    from PIL import Image

    width, height = size
    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 256, (height // 120 + 2, width // 120 + 2, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)).astype(
        np.int16
    )
    image += rng.integers(-12, 13, image.shape, dtype=np.int16)
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path, quality=92)
    return path


def _stylizer():
    from pixelsmith.style.networks import TransformerNet

    torch.manual_seed(0)
    return TransformerNet(
        base_channels=32
    ).eval()  # Johnson's width; random weights cost what trained ones do


def _tiling_messages(caplog, part: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pixelsmith.style.tiling" and part in r.getMessage()
    ]


def test_8k_stylize_with_auto_tiles_writes_png_and_jpeg_of_the_input_size(tmp_path, caplog):
    """`stylize.py device=cuda tile=auto` on a 7680x4320 photo, to PNG and to JPEG: the plan fits the free memory
    (no retry), the outputs have the input's size, and every stage of the device pipeline is timed."""
    import logging

    import numpy as np
    from PIL import Image

    from pixelsmith.style.stylize import stylize_paths
    from pixelsmith.style.tiling import StageTimes

    source = _synthetic_photo(tmp_path / "photo.jpg", STYLIZE_SIZE)
    model = _stylizer()
    caplog.set_level(logging.INFO, logger="pixelsmith.style.tiling")
    for suffix in (".png", ".jpg"):
        times = StageTimes()
        (written,) = stylize_paths(
            model, source, tmp_path / f"out{suffix}", device=STYLIZE_DEVICE, progress=False, times=times
        )
        with Image.open(written) as result:
            assert result.size == STYLIZE_SIZE and result.mode == "RGB"
            assert np.asarray(result).std() > 1  # a picture, not a flat fill
        assert min(times.decode, times.network, times.blend, times.encode) > 0, times
        if not ON_CPU:  # the device pipeline: the image goes to the GPU once and comes back once
            assert times.copy_in > 0, times
            # A PNG comes back as pixels; a JPEG is encoded on the GPU (nvJPEG) and only its bytes come back, timed
            # with the encode (on the H200, 2026-11-26: copy_out 0, encode 0.35 s).
            assert (times.copy_out > 0) == (suffix == ".png"), times
    plans = _tiling_messages(caplog, "tile=auto for")
    assert len(plans) == 2 and all(
        f"{STYLIZE_SIZE[0]}x{STYLIZE_SIZE[1]} on {STYLIZE_DEVICE}" in p for p in plans
    )
    assert _tiling_messages(caplog, "ran out of memory") == []


def test_8k_stylize_halves_an_auto_tile_that_runs_out_of_memory_under_the_memory_fraction(
    tmp_path, caplog, monkeypatch
):
    """`hardware.memory_fraction` caps the process's CUDA allocator at 3 GB, while tile=auto plans from the
    device's free memory (the whole 8K image on an 80 GB GPU): a real out-of-memory error, then halved tiles
    until they fit. The result has the input's size and is the image a run with the final tile size gives."""
    import logging
    import re

    import numpy as np
    from PIL import Image

    from pixelsmith.hardware.settings import apply_hardware
    from pixelsmith.run.build import resolve_hardware
    from pixelsmith.style.tiling import stylize_tiled

    with Image.open(_synthetic_photo(tmp_path / "photo.jpg", STYLIZE_SIZE)) as opened:
        image = np.asarray(opened.convert("RGB")).copy()
    model = _stylizer()
    options = {"device": STYLIZE_DEVICE, "thumbnail_size": SIMULATED_LIMIT_SIDE if ON_CPU else 1024}
    overrides = ["hardware=auto", "train.time_budget_minutes=null"]
    if ON_CPU:
        original = model.forward

        def forward(x):
            if max(x.shape[-2:]) > SIMULATED_LIMIT_SIDE:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated by the CPU dry run)")
            return original(x)

        monkeypatch.setattr(model, "forward", forward)
    else:
        fraction = HALVING_CAP_BYTES / torch.cuda.get_device_properties(0).total_memory
        overrides.append(f"hardware.memory_fraction={fraction:.6f}")
    caplog.set_level(logging.INFO, logger="pixelsmith.style.tiling")
    try:
        apply_hardware(
            resolve_hardware(_config(overrides, tmp_path / "run"))
        )  # what a run with this profile sets
        if not ON_CPU:
            torch.cuda.empty_cache()  # memory earlier tests left cached would count against the cap
        halved = stylize_tiled(model, image, tile="auto", **options)
    finally:
        if not ON_CPU:
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()
    retries = _tiling_messages(caplog, "ran out of memory")
    assert retries, (
        f"the cap did not make tile=auto run out of memory: {_tiling_messages(caplog, 'tile=auto')}"
    )
    sides = [int(re.search(r"retrying with (\d+)-px tiles", message).group(1)) for message in retries]
    assert all(later < earlier for earlier, later in zip(sides, sides[1:], strict=False)), sides
    assert halved.shape == image.shape and halved.std() > 1
    final = sides[-1]
    reference = stylize_tiled(model, image, tile=final, overlap=min(64, final // 4), **options)
    # The failed passes leave nothing behind: the same pixels as a run planned at the final tile (cuDNN may pick
    # another algorithm for a shape: at most one 8-bit level apart).
    assert np.abs(halved.astype(np.int16) - reference.astype(np.int16)).max() <= 1


# ---- no host sync across the whole Lightning loop ---------------------------------------------------------------
# A callback that reads a device value at every batch end, planted after the check (tests/test_host_sync.py).
