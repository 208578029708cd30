"""`python -m benchmarks.png_encoders`: PNG encoders for the stylize pipeline's output, side by side on one image.

    python -m benchmarks.png_encoders                     # 8K (7680x4320), every encoder installed
    python -m benchmarks.png_encoders --size 1920x1080 --repeats 1

The image is a photo (data/style/content/astronaut.jpg) resized to the size asked for, plus a little sensor-like
grain: a plain upscale would be smoother, and compress faster and smaller, than a real 8K photo. Each row encodes it
`--repeats` times (the median is printed) and prints wall seconds, CPU seconds (all threads: the one-core cost),
bytes, the ratio to Pillow level 6's wall time, and whether Pillow reads the file back bit-exactly (a row that does
not is marked and never eligible as the pipeline's encoder). Rows:
- Pillow at compress_level 1 and 6 (6 is Pillow's default and the pipeline's `png_compress_level` default);
- imagecodecs' png_encode (libpng + zlib-ng, when `imagecodecs` is installed) at levels 1 and 6;
- fpng (`pip install fpng`: one fixed fast setting, ~level-1 files);
- ours (`pixelsmith.style.png.encode_png`) with one thread and with `--threads` (default: this machine's cores),
  per deflate backend installed (zlib always; zlib-ng, isal when installed), levels 6 and 1;
- Pillow level 6 on `--threads` images at once in a thread pool (Pillow releases the GIL while it deflates): the
  per-image time when a folder keeps every core encoding.
An encoder that is not installed gets a line saying so. Timings on a shared or loaded machine are noisy: compare rows
of one run, never across machines.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from pixelsmith.style.png import PngBackendUnavailableError, backend_name, encode_png

PHOTO = Path(__file__).resolve().parents[1] / "data" / "style" / "content" / "astronaut.jpg"


def test_image(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A natural-looking (H, W, 3) uint8 image: a photo resized to width x height, plus grain (sigma 2 levels)."""
    photo = Image.open(PHOTO).convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    grain = np.random.default_rng(seed).normal(0.0, 2.0, (height, width, 3))
    return np.clip(np.asarray(photo, np.float32) + grain, 0, 255).astype(np.uint8)


def pillow_png(image: np.ndarray, level: int | None) -> bytes:
    buffer = io.BytesIO()
    options = {} if level is None else {"compress_level": level}
    Image.fromarray(image).save(buffer, format="PNG", **options)
    return buffer.getvalue()


def reads_back(data: bytes, image: np.ndarray) -> bool:
    with Image.open(io.BytesIO(data)) as decoded:
        return decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), image)


def candidates(image: np.ndarray, threads: int) -> tuple[list[tuple[str, Callable[[], bytes]]], list[str]]:
    """(name, encode) rows for the encoders installed here, and a line for each one that is not."""
    rows: list[tuple[str, Callable[[], bytes]]] = [
        ("Pillow level 1", lambda: pillow_png(image, 1)),
        ("Pillow level 6 (default)", lambda: pillow_png(image, 6)),
    ]
    missing: list[str] = []
    try:
        import imagecodecs

        for level in (1, 6):
            rows.append(
                (
                    f"imagecodecs png level {level}",
                    lambda level=level: imagecodecs.png_encode(image, level=level),
                )
            )
    except ImportError:
        missing.append("imagecodecs: not installed (pip install imagecodecs)")
    try:
        import fpng

        rows.append(("fpng", lambda: fpng.from_ndarray(np.ascontiguousarray(image))))
    except ImportError:
        missing.append("fpng: not installed (pip install fpng)")
    for backend in ("zlib", "zlib-ng", "isal"):
        try:
            backend_name(backend)
        except PngBackendUnavailableError:
            missing.append(f"ours with {backend}: not installed (pip install {backend})")
            continue
        for level in (6, 1):
            for count in sorted({1, threads}):
                rows.append(
                    (
                        f"ours {backend} level {level}, {count} thread(s)",
                        lambda b=backend, lv=level, n=count: encode_png(
                            image, level=lv, threads=n, backend=b
                        ),
                    )
                )
    return rows, missing


def timed(encode: Callable[[], bytes], repeats: int) -> tuple[float, float, bytes]:
    walls, cpus = [], []
    data = b""
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        data = encode()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), data


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="7680x4320", help="WxH [7680x4320: 8K]")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    image = test_image(width, height)
    print(
        f"PNG encoders on one {width}x{height} RGB image ({image.nbytes / 1e6:.0f} MB raw), {args.threads} "
        f"thread(s) where threaded, median of {args.repeats}; CPU s = all threads' CPU time"
    )
    rows, missing = candidates(image, args.threads)
    results = []
    for name, encode in rows:
        wall, cpu, data = timed(encode, args.repeats)
        results.append(
            {
                "name": name,
                "seconds": wall,
                "cpu_seconds": cpu,
                "bytes": len(data),
                "exact": reads_back(data, image),
            }
        )
    # A folder's view: --threads images encoded by Pillow at once, each on its own thread.
    with ThreadPoolExecutor(args.threads) as pool:
        start = time.perf_counter()
        outputs = list(pool.map(lambda _: pillow_png(image, 6), range(args.threads)))
        wall = (time.perf_counter() - start) / args.threads
    results.append(
        {
            "name": f"Pillow level 6, {args.threads} images at once (per image)",
            "seconds": wall,
            "cpu_seconds": float("nan"),
            "bytes": len(outputs[0]),
            "exact": reads_back(outputs[0], image),
        }
    )
    reference = next(r["seconds"] for r in results if r["name"].startswith("Pillow level 6"))
    print(
        f"{'encoder':<52} {'wall s':>8} {'CPU s':>8} {'MB':>8} {'vs Pillow 6':>11}  Pillow reads back exactly"
    )
    for r in results:
        print(
            f"{r['name']:<52} {r['seconds']:8.3f} {r['cpu_seconds']:8.3f} {r['bytes'] / 1e6:8.2f} "
            f"{reference / r['seconds']:10.2f}x  {'yes' if r['exact'] else 'NO'}"
        )
    for line in missing:
        print(f"skipped: {line}")
    return results


if __name__ == "__main__":
    main()
