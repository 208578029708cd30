"""Peak memory and time of tiled stylization at 2K/4K/8K on CPU: `python -m benchmarks.style_tiling`.

Each size runs in a fresh child process (so one size's allocator high-water mark cannot hide another's) that
loads a random-weight TransformerNet, stylizes a JPEG of that size file-to-file through `stylize_paths`, and reports
`ru_maxrss` (peak RSS), the RSS before the image was read (interpreter + torch + model), and the wall time.
Random weights cost exactly what trained ones do. The expected shape of the result: peak RSS = baseline +
~2 x 3 bytes/pixel (the uint8 input and output images) + a constant set by tile size, tile batch and thumbnail.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.child import child_env

SIZES = {"2k": (2048, 1080), "4k": (3840, 2160), "8k": (7680, 4320)}


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def synthetic_photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth colour fields plus grain: compresses and stylizes like a photo, not like white noise."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(
        rng.integers(0, 256, (max(2, height // 120), max(2, width // 120), 3), dtype=np.uint8)
    )
    image = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC)).astype(np.int16)
    for y in range(0, height, 512):  # banded so the parent stays small too
        image[y : y + 512] += rng.integers(-12, 13, image[y : y + 512].shape, dtype=np.int16)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def child(args: argparse.Namespace) -> None:
    import torch

    from pixelsmith.style.networks import TransformerNet
    from pixelsmith.style.stylize import stylize_paths

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TransformerNet(base_channels=args.base_channels)
    baseline = current_rss_mb()
    start = time.perf_counter()
    stylize_paths(
        model,
        args.input,
        args.output,
        tile=int(args.tile) if args.tile.isdigit() else args.tile,
        overlap=args.overlap,
        precision=args.precision,
        device="cpu",
        tile_batch=args.tile_batch,
        thumbnail=args.thumbnail,
        progress=False,
    )
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = usage.ru_maxrss / 1024  # Linux reports KiB
    cpu = usage.ru_utime + usage.ru_stime  # on a shared machine CPU time is steadier than wall time
    print(
        json.dumps({"peak_rss_mb": peak, "baseline_rss_mb": baseline, "seconds": seconds, "cpu_seconds": cpu})
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument(
        "--tile", default="auto", help="pixels, or auto (the largest the memory budget holds)"
    )
    parser.add_argument("--overlap", type=int, default=64)
    parser.add_argument("--tile-batch", type=int, default=4)
    parser.add_argument("--base-channels", type=int, default=32, help="TransformerNet width (32 = Johnson's)")
    parser.add_argument("--thumbnail", type=int, default=1024)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return

    rows = []
    with tempfile.TemporaryDirectory(prefix="pixelsmith-bench-") as tmp:
        for name in args.sizes:
            width, height = SIZES[name]
            source = Path(tmp) / f"{name}.jpg"
            synthetic_photo(width, height).save(source, quality=92)
            command = [sys.executable, "-m", "benchmarks.style_tiling", "--child"]
            command += ["--input", str(source), "--output", str(Path(tmp) / f"{name}_out.jpg")]
            command += [
                "--tile",
                str(args.tile),
                "--overlap",
                str(args.overlap),
                "--tile-batch",
                str(args.tile_batch),
            ]
            command += [
                "--thumbnail",
                str(args.thumbnail),
                "--precision",
                args.precision,
                "--threads",
                str(args.threads),
                "--base-channels",
                str(args.base_channels),
            ]
            finished = subprocess.run(command, capture_output=True, text=True, check=False, env=child_env())
            if finished.returncode != 0:
                raise SystemExit(f"{name} failed:\n{finished.stderr}")
            result = json.loads(finished.stdout.strip().splitlines()[-1])
            image_mb = width * height * 3 / 2**20
            rows.append((name, width, height, image_mb, result))
            print(f"{name} done: {result}", file=sys.stderr)
            source.unlink()

    print(
        f"\ntile={args.tile} overlap={args.overlap} tile_batch={args.tile_batch} thumbnail={args.thumbnail} "
        f"precision={args.precision} threads={args.threads}, "
        f"TransformerNet({args.base_channels} ch, 5 residual blocks), random weights\n"
    )
    print(
        "| size | pixels | uint8 image | baseline RSS | peak RSS | peak - baseline - 2 x image | wall time | CPU time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, width, height, image_mb, r in rows:
        rest = r["peak_rss_mb"] - r["baseline_rss_mb"] - 2 * image_mb
        print(
            f"| {name} | {width}x{height} | {image_mb:.0f} MB | {r['baseline_rss_mb']:.0f} MB | "
            f"{r['peak_rss_mb']:.0f} MB | {rest:.0f} MB | {r['seconds']:.1f} s | {r['cpu_seconds']:.1f} s |"
        )


if __name__ == "__main__":
    main()
