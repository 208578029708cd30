"""`python -m benchmarks.loader_bench`: decoded images/s per core for each data source and decoder, beside the
training step's images/s on the same profile, so a reader sees whether loading keeps up.

    python -m benchmarks.loader_bench                                    # 64, 256 and 1024 px on this machine
    python -m benchmarks.loader_bench --sizes 64 256 --images 256 --repeats 5 --hardware auto

For each size a synthetic photo-like JPEG set (smooth colour fields plus grain, stored at that size, as `python
prepare.py ... encoding=jpeg` stores a dataset) is written three ways: a folder of .jpg files (`data=image_folder`),
a dataset zip (`data=zip`) and litdata shards (`data=shards`, when litdata is installed). Each (source, decoder) cell
reads every image through the same dataset class training uses, in this one process with no loader workers, so the
figure is images/s *per core* (a loader with W workers does about W times as many). Decoders: pil (Pillow, draft
mode), simplejpeg (when installed) and, on CUDA, nvjpeg (batched on the GPU: images/s of the device, not per core).
Each cell is timed `--repeats` times after a warm-up pass; medians are printed.

Beside them: the training step's images/s for the default GAN at that resolution on `--hardware` (DCGAN at 64 px,
StyleGAN2 above, both narrow on a CPU), from the plain benchmark loop on random batches, and the loader workers that
step needs: step img/s / per-core decode img/s (the figure to compare with `hardware.num_workers`).
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.arguments import (
    Parser,
    at_least,
    check_hardware_here,
    conf_names,
    one_of,
    power_of_two,
    refusals_exit_2,
)
from benchmarks.harness import compose
from pixelsmith.data.archive import ArchiveDataset, ArchiveSource
from pixelsmith.data.decode import collate_encoded, decode_batch_on_device, simplejpeg_available
from pixelsmith.data.image_folder import ImageFolderDataset
from pixelsmith.data.prepare import PrepareOptions, prepare


def synthetic_jpeg(size: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    low = rng.random((4, 4, 3)) * 255
    field = np.asarray(
        Image.fromarray(low.astype(np.uint8)).resize((size, size), Image.Resampling.BICUBIC), float
    )
    grain = rng.normal(0, 6, (size, size, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(field + grain, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_sources(root: Path, size: int, count: int) -> dict[str, Path]:
    folder = root / f"folder{size}"
    folder.mkdir(parents=True)
    for i in range(count):
        (folder / f"{i:05d}.jpg").write_bytes(synthetic_jpeg(size, i))
    sources = {"folder": folder}
    common = dict(
        resolution=size, transform="none", encoding="jpeg", jpeg_quality=90, workers=1, progress=False
    )
    sources["zip"] = prepare(PrepareOptions(str(folder), str(root / f"zip{size}.zip"), **common))[1]
    try:
        import litdata  # noqa: F401

        sources["shards"] = prepare(
            PrepareOptions(str(folder), str(root / f"shards{size}"), format="shards", **common)
        )[1]
    except ImportError:
        print("litdata is not installed: no shards cells (pip install -e '.[stream]').")
    return sources


def dataset_for(source: str, path: Path, size: int, decoder: str):
    if source == "folder":
        files = sorted(path.glob("*.jpg"))
        return ImageFolderDataset(files, size, 3)  # Pillow only: EXIF orientation needs it
    if source == "zip":
        archive = ArchiveSource(path)
        return ArchiveDataset(
            archive, archive.names, size, 3, decoder="nvjpeg" if decoder == "nvjpeg" else decoder
        )
    from pixelsmith.data.shards import DecodingStreamingDataset

    return DecodingStreamingDataset(
        str(path),
        shuffle=False,
        resolution=size,
        channels=3,
        labels=False,
        on_corrupt="skip",
        decoder=decoder,
    )


def time_cell(dataset, size: int, decoder: str, repeats: int, batch: int = 64) -> float:
    """Median images/s of reading every item (one process); nvjpeg: bytes read here, batches decoded on CUDA."""
    count = len(dataset)

    def one_pass() -> float:
        start = time.perf_counter()
        if decoder == "nvjpeg":
            for first in range(0, count, batch):
                items = [dataset[i] for i in range(first, min(first + batch, count))]
                decode_batch_on_device(collate_encoded(items)[0], size, 3, torch.device("cuda"))
            torch.cuda.synchronize()
        else:
            for i in range(count):
                dataset[i]
        return count / (time.perf_counter() - start)

    one_pass()  # warm-up: file cache, decoder state, CUDA context
    return statistics.median(one_pass() for _ in range(repeats))


def step_images_per_second(size: int, hardware: str, steps: int = 6) -> tuple[str, float]:
    from benchmarks.plain_loop import build_plain_gan
    from pixelsmith.run.build import resolve_hardware

    model = ["model=dcgan"] if size <= 64 else ["model=stylegan2"]
    narrow = (
        ["model.generator.ngf=32", "model.discriminator.ndf=32"]
        if size <= 64
        else [
            "model.generator.channel_base=2048",
            "model.generator.channel_max=64",
            "model.discriminator.channel_base=2048",
            "model.discriminator.channel_max=64",
        ]
    )
    overrides = [
        f"hardware={hardware}",
        *model,
        f"data.resolution={size}",
        "data.channels=3",
        "data=image_folder",
        "data.root=/tmp",
    ]
    if hardware == "cpu":
        overrides += narrow
    with tempfile.TemporaryDirectory() as out:
        cfg = compose(overrides, Path(out))
        hw = resolve_hardware(cfg)
        gan = build_plain_gan(cfg, hw, hw.optimizer_impl)
        batch = hw.batch_size
        images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
        gan.step(images)
        if hw.accelerator == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            gan.step(images)
        if hw.accelerator == "cuda":
            torch.cuda.synchronize()
        return cfg.model.name, steps * batch / (time.perf_counter() - start)


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="python -m benchmarks.loader_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # prepare.py writes the zip and shards sources at a power of two, the side every model trains at.
    parser.add_argument("--sizes", type=power_of_two(4), nargs="+", default=[64, 256, 1024])
    parser.add_argument("--images", type=at_least(1), default=None, help="per size (default: 512 / 128 / 32)")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument(
        "--hardware", type=one_of(conf_names("hardware"), "hardware profile of conf/hardware"), default="auto"
    )
    parser.add_argument("--no-step", action="store_true", help="skip the training-step column")
    args = parser.parse_args(argv)
    if not args.no_step:
        check_hardware_here(args.hardware)  # the training-step column trains on it
    torch.set_num_threads(1)  # per core: one decode at a time, as one loader worker
    decoders = (
        ["pil"]
        + (["simplejpeg"] if simplejpeg_available() else [])
        + (["nvjpeg"] if torch.cuda.is_available() else [])
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            count = args.images or {64: 512, 256: 128}.get(size, 32)
            sources = write_sources(Path(tmp), size, count)
            for source, path in sources.items():
                for decoder in decoders:
                    if source == "folder" and decoder != "pil":
                        continue
                    rate = time_cell(dataset_for(source, path, size, decoder), size, decoder, args.repeats)
                    rows.append((size, source, decoder, rate))
                    print(
                        f"{size:>5} px  {source:<7} {decoder:<11} {rate:10.0f} img/s{' (GPU)' if decoder == 'nvjpeg' else ' per core'}",
                        flush=True,
                    )
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print()
    print(
        "| px | source | decoder | decoded img/s (per core; nvjpeg: the GPU) | training step img/s | workers to keep up |"
    )
    print("|---:|---|---|---:|---:|---:|")
    steps: dict[int, tuple[str, float]] = {}
    if not args.no_step:
        torch.set_num_threads(torch.get_num_threads())
        for size in args.sizes:
            if size > 256 and not torch.cuda.is_available():
                print(f"(no training step at {size} px on a CPU: minutes per iteration)")
                continue
            try:
                steps[size] = step_images_per_second(size, args.hardware)
            except Exception as err:  # a size the profile cannot train here: the column says so
                print(f"(no training step at {size} px: {type(err).__name__}: {err})")
    for size, source, decoder, rate in rows:
        model, step = steps.get(size, ("-", float("nan")))
        need = (
            "-"
            if step != step
            else (f"{step / rate:.2f}" if decoder != "nvjpeg" else ("keeps up" if rate >= step else "no"))
        )
        step_text = "-" if step != step else f"{step:.0f} ({model})"
        print(f"| {size} | {source} | {decoder} | {rate:.0f} | {step_text} | {need} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
