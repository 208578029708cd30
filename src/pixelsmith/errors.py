"""The one exception family for problems a user fixes by changing a config key, a path or a file.

Entry points print these as one paragraph, without a traceback, and exit non-zero (a multirun job records the
failure and the sweep goes on). Each message names the cause and the fix. Also here: the start-up check that a
destination can be written (`check_writable_folder`), shared by train.py's run dir, stylize.py's output and
prepare.py's dest, so an unwritable place stops a run before its work, not after it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


class PixelsmithError(Exception):
    """A user-fixable problem; the message says what to change."""


class ConfigError(PixelsmithError, ValueError):
    """A config value a part refuses where it is built (a network's resolution); a ValueError for callers that
    catch those."""


class UnwritableError(PixelsmithError, OSError):
    """A destination this process cannot create or write in (read-only, a file in the way, a full disk)."""


def why_unwritable(err: OSError) -> str:
    """The cause of a failed write or mkdir, in words a user acts on."""
    if err.errno == errno.ENOSPC:
        return "the disk is full"
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "it is read-only for this process"
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a part of the path is a file, not a folder"
    if err.errno == errno.ENOENT:
        return "it cannot be created there (a special filesystem such as /proc)"
    return os.strerror(err.errno) if err.errno else str(err)


def check_writable_folder(folder: str | Path, key: str, fix: str, given: str | Path | None = None) -> None:
    """Refuse, in one paragraph naming `key` (with the value the user `given`, by default the folder) and `fix`, a
    folder this process could not create or write a file in. Creates nothing: the nearest existing ancestor is
    probed with an unnamed temporary file (root passes permission bits, so only a real write tells a read-only
    filesystem or /proc apart)."""
    folder = Path(folder).expanduser()
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe))
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as err:
        detail = os.strerror(err.errno) if err.errno else str(err)  # not the probe's own temporary name
        raise UnwritableError(
            f"{key}={given or folder} cannot be written: {why_unwritable(err)} ({detail} at {probe}). Nothing was "
            f"done. Fix: {fix}"
        ) from err
