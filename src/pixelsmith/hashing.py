"""Content hashes of files, memoised per (path, size, modification and change times, inode): the one sha256 of a
file that weights checks, dataset fingerprints and cache keys share, at the bottom of the package (standard library
only)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_SHA256_CACHE: dict[tuple[str, int, int, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """Full sha256 hex digest of a file's bytes, memoised so a run hashes each file once. The change time and inode
    are in the key too: a file rewritten with its old modification time put back (os.utime, touch -d), or another
    file moved over it, is hashed again (a weights check depends on it)."""
    path = Path(path).resolve()
    stat = path.stat()
    memo_key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if memo_key not in _SHA256_CACHE:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _SHA256_CACHE[memo_key] = digest.hexdigest()
    return _SHA256_CACHE[memo_key]
