"""Dataset fingerprints: the part of a reference-statistics cache key that says which real images were used (a
data file's content hash, or an image folder's paths, sizes and modification times). Data modules compute them in
`reference_source()`; `pixelsmith.metrics.reference_cache` only stores what they return."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pixelsmith.hashing import file_sha256


def fingerprint_file(path: str | os.PathLike) -> str:
    """Content fingerprint of one data file (name + sha256 prefix)."""
    return f"{Path(path).name}:sha256={file_sha256(path)[:16]}"


def fingerprint_image_folder(root: str | os.PathLike, extensions=(".png", ".jpg", ".jpeg", ".webp")) -> str:
    """Cheap fingerprint of an image folder: relative paths, sizes and modification times of its images.

    Hashing every byte of a large folder would take minutes; any added, removed, resized or re-saved file changes
    this fingerprint. Touching a file without changing it also does (a harmless recomputation).
    """
    root = Path(root)
    digest = hashlib.sha256()
    count = 0
    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in extensions and p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        count += 1
    return f"folder:{root.name}:{count}files:sha256={digest.hexdigest()[:16]}"
