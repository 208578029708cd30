"""Check an image folder once, before the first iteration: which files decode, and which are broken and why.

Loader workers used to find broken files during training, on every epoch and in every worker: the same 5 files were
re-decoded, re-warned and re-counted (84 "skipped files" after 10 iterations), and `data.on_corrupt=error` stopped
only after training had started. Here every file is decoded once at set-up, in a thread pool (Pillow releases the
GIL while it decodes), and the verdicts are cached by (path, modification time, size) in a JSON file, so a re-run
over the same folder checks nothing again. Training then reads only the files that passed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_VERSION = 1


def default_cache_dir() -> Path:
    return Path(os.environ.get("PIXELSMITH_CACHE") or Path.home() / ".cache" / "pixelsmith") / "image_checks"


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_mtime_ns, stat.st_size]


def check_images(
    root: str | Path,
    files: list[Path],
    decode: Callable[[Path], object],
    cache_dir: Path | None = None,
    workers: int | None = None,
    context: str = "",
) -> dict[Path, str]:
    """The broken files among `files`, each with its reason; `decode(path)` raises for a broken file.

    Verdicts are cached per folder and `context` (what else the verdict depends on: the image folder's is the
    training resolution, which decides whether an image is too small) in `cache_dir` (default
    `$PIXELSMITH_CACHE/image_checks`); a file whose modification time or size changed is checked again. A cache that
    cannot be written only costs a re-check.
    """
    cache_dir = cache_dir or default_cache_dir()
    folder = str(Path(root).expanduser().resolve())
    key = hashlib.sha256((f"{folder}|{context}" if context else folder).encode()).hexdigest()[:16]
    cache_file = cache_dir / f"{key}.json"
    try:
        cached = json.loads(cache_file.read_text())
        if cached.get("version") != CACHE_VERSION:
            cached = {}
    except (OSError, ValueError):
        cached = {}
    verdicts: dict[str, list] = cached.get("files", {})

    def verdict(path: Path) -> tuple[str, list]:
        try:
            stamp = _stamp(path)
        except OSError as err:  # deleted or unreadable since it was listed
            return str(path), [0, 0, f"{type(err).__name__}: {err}"[:300]]
        known = verdicts.get(str(path))
        if known is not None and known[:2] == stamp:
            return str(path), known
        try:
            decode(path)
            return str(path), [*stamp, ""]
        except MemoryError:
            raise  # the machine's state, not the file's: never cache it as "broken"
        except Exception as err:  # Pillow raises many types for bad files; all mean "unreadable"
            return str(path), [*stamp, f"{type(err).__name__}: {err}"[:300]]

    with ThreadPoolExecutor(max_workers=workers or min(16, (os.cpu_count() or 1) + 4)) as pool:
        results = dict(pool.map(verdict, files))
    if results != {str(f): verdicts.get(str(f)) for f in files}:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            partial = cache_file.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(json.dumps({"version": CACHE_VERSION, "files": {**verdicts, **results}}))
            partial.replace(cache_file)  # atomic: a concurrent run reads the old or the new cache, never half
        except OSError as err:
            log.debug("Image-check cache %s not written (%s); the next run checks again.", cache_file, err)
    return {Path(path): result[2] for path, result in results.items() if result[2]}
