"""A PNG encoder that spreads one image over several cores: filtered rows in strips, each strip deflated by a thread.

Why: Pillow encodes an 8K frame (100 MB of RGB) at its default level 6 in about 7 s of one core, and a folder's
encode stage then caps the whole job. Deflate itself is serial, but a zlib stream may be cut into pieces that are
compressed independently and joined (what pigz does): every piece but the last ends with a sync flush (a byte-aligned,
non-final block), each piece starts from the previous piece's last 32 KiB as its dictionary (so the ratio barely
drops), and the stream's Adler-32 is computed over all the bytes. The result is one ordinary zlib stream in ordinary
IDAT chunks: any PNG reader (Pillow, libpng, browsers) reads it, bit-exact.

Filtering is PNG's per-row filter type 4 (Paeth) on every row, vectorised with numpy over a whole strip (the filter
looks at the unfiltered neighbours only, so rows do not depend on each other's output); Paeth is the filter natural
photos compress best with, and it costs one pass. numpy and zlib release the GIL, so threads give the speed-up.

Deflate backends: `zlib` (the standard library), `zlib-ng` (PyPI `zlib-ng`, the same levels about 2-3x faster) and
`isal` (PyPI `isal`, Intel ISA-L, levels 0-3, faster still, larger files); `auto` takes zlib-ng where installed,
else zlib. `benchmarks/png_encoders.py` measures them against Pillow, imagecodecs and fpng.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DEFLATE_BACKENDS = ("auto", "zlib", "zlib-ng", "isal")
WINDOW = 32768  # deflate's history: each strip is primed with this much of the data before it
MIN_STRIP_BYTES = 1 << 20  # smaller strips lose ratio (one dictionary restart each) for no speed


class PngBackendUnavailableError(RuntimeError):
    """A deflate backend was asked for by name but its package is not installed."""


def _backend_module(name: str) -> Any:
    if name == "zlib":
        return zlib
    if name == "auto":
        try:
            return _backend_module("zlib-ng")
        except PngBackendUnavailableError:
            return zlib
    package = {"zlib-ng": ("zlib_ng", "zlib_ng"), "isal": ("isal", "isal_zlib")}.get(name)
    if package is None:
        raise PngBackendUnavailableError(
            f"deflate backend {name!r}: choose one of {', '.join(DEFLATE_BACKENDS)}."
        )
    try:
        module = __import__(f"{package[0]}.{package[1]}", fromlist=[package[1]])
    except ImportError:
        raise PngBackendUnavailableError(
            f"deflate backend {name!r} is not installed: `pip install {name}` (or `pip install "
            f"'pixelsmith[png]'`), or choose zlib (the standard library's, always there)."
        ) from None
    return module


def backend_name(name: str) -> str:
    """The backend `name` resolves to here (`auto` -> zlib-ng or zlib)."""
    module = _backend_module(name)
    return {"zlib": "zlib", "zlib_ng.zlib_ng": "zlib-ng", "isal.isal_zlib": "isal"}.get(module.__name__, name)


def _level_for(module: Any, level: int) -> int:
    # ISA-L has levels 0-3 only: 1-3 map to its 1, 4-6 to 2, 7-9 to 3 (0 stays stored).
    if module.__name__.startswith("isal"):
        return 0 if level == 0 else min(3, (level + 2) // 3)
    return level


def _paeth(rows: np.ndarray, above_first: np.ndarray, bpp: int) -> np.ndarray:
    """Paeth-filtered `rows` ((n, stride) uint8) with `above_first` the row above the first one; (n, 1 + stride)."""
    x = rows.astype(np.int16)
    b = np.empty_like(x)  # up
    b[0] = above_first
    b[1:] = x[:-1]
    a = np.zeros_like(x)  # left
    a[:, bpp:] = x[:, :-bpp]
    c = np.zeros_like(x)  # up-left
    c[:, bpp:] = b[:, :-bpp]
    p = a + b - c
    pa = np.abs(p - a)
    pb = np.abs(p - b)
    pc = np.abs(p - c)
    predictor = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    out = np.empty((rows.shape[0], rows.shape[1] + 1), np.uint8)
    out[:, 0] = 4
    out[:, 1:] = (x - predictor).astype(np.uint8)  # mod 256, as PNG defines it
    return out


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def encode_png(
    rgb: np.ndarray,
    alpha: np.ndarray | None = None,
    icc_profile: bytes | None = None,
    level: int = 6,
    threads: int | None = None,
    backend: str = "auto",
) -> bytes:
    """An 8-bit RGB (or RGBA with `alpha`) PNG of `rgb` ((H, W, 3) uint8), as bytes.

    level: deflate level 0-9 (6: Pillow's default). threads: strips deflated at once (None: the cores this process
    may use). backend: auto | zlib | zlib-ng | isal (module docstring). icc_profile: written as an iCCP chunk."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"encode_png takes (H, W, 3) uint8, got {rgb.dtype} {tuple(rgb.shape)}")
    if not 0 <= level <= 9:
        raise ValueError(f"level={level} must be in 0..9")
    module = _backend_module(backend)
    pixels = rgb if alpha is None else np.concatenate([rgb, alpha[..., None].astype(np.uint8)], axis=2)
    pixels = np.ascontiguousarray(pixels)
    height, width, channels = pixels.shape
    rows = pixels.reshape(height, width * channels)
    if threads is None:
        threads = _cores()
    stride = width * channels
    # Enough strips to keep every thread busy (2 per thread evens out uneven content), none below MIN_STRIP_BYTES.
    strips = max(1, min(2 * max(1, threads), (height * stride) // MIN_STRIP_BYTES, height))
    bounds = [height * i // strips for i in range(strips + 1)]
    zero_row = np.zeros(stride, np.uint8)

    def filtered(i: int) -> bytes:
        start, stop = bounds[i], bounds[i + 1]
        return _paeth(rows[start:stop], rows[start - 1] if start else zero_row, channels).tobytes()

    def deflate(i: int, data: bytes, primer: bytes) -> bytes:
        # The previous strip's tail as history: matches reach back across the cut, as in one serial stream.
        # (ISA-L's compressobj takes no dictionary: its strips start empty, a little larger.)
        primed = {"zdict": primer} if primer and level > 0 and not module.__name__.startswith("isal") else {}
        compressor = module.compressobj(_level_for(module, level), zlib.DEFLATED, -15, **primed)
        body = compressor.compress(data)
        return body + compressor.flush(zlib.Z_FINISH if i == strips - 1 else zlib.Z_SYNC_FLUSH)

    run: Callable
    if threads <= 1 or strips == 1:
        run = map
        pool = None
    else:
        pool = ThreadPoolExecutor(max_workers=threads)
        run = pool.map
    try:
        data = list(run(filtered, range(strips)))
        primers = [b""] + [d[-WINDOW:] for d in data[:-1]]
        parts = list(run(deflate, range(strips), data, primers))
    finally:
        if pool is not None:
            pool.shutdown()
    adler = 1
    for d in data:
        adler = zlib.adler32(d, adler)
    # zlib header: deflate with a 32 KiB window (0x78); FLEVEL 2 (default) and the FCHECK bits that make it % 31 == 0.
    stream = b"\x78\x9c" + b"".join(parts) + struct.pack(">I", adler)
    header = struct.pack(">IIBBBBB", width, height, 8, 6 if alpha is not None else 2, 0, 0, 0)
    out = [PNG_SIGNATURE, _chunk(b"IHDR", header)]
    if icc_profile:
        out.append(_chunk(b"iCCP", b"ICC Profile\x00\x00" + zlib.compress(icc_profile)))
    limit = 1 << 30  # IDAT chunks well under PNG's 2^31-1 byte limit
    out += [_chunk(b"IDAT", stream[i : i + limit]) for i in range(0, len(stream), limit)]
    out.append(_chunk(b"IEND", b""))
    return b"".join(out)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
