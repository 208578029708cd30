"""What `overwrite=true` may replace: only an earlier output of the same command, recognised by the mark it wrote.

`prepare.py` and `convert.py` mark what they write (a zip comment naming the command, on a dataset zip and on a
checkpoint, which torch writes as a zip; a `pixelsmith.json` naming it in a folder of shards), and each checks a
destination against its own mark before it reads any input. A destination without the mark (the working directory, a
folder of the user's images, a file another program wrote, a symbolic link) is never replaced, whatever `overwrite`
says. Inputs and outputs never overlap: an output that is, or lies inside, an input is refused, and so is an
output that holds an input and would be replaced.

The new output is written beside the destination under a temporary name (`new_beside`) and put in place by
`replace_with`: a file by one atomic rename; a folder by moving the old one aside, renaming the new one in, and
removing the old one last, so a failure at any step leaves one whole output under the destination's name.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

# A zip's comment is read from its end record without reading any member; anything longer than this is no mark.
_MAX_MARK = 256


def zip_listing(path: Path) -> tuple[bytes, list[str]] | None:
    """(comment, member names) of the zip at `path`, read from its central directory; None when `path` is not a
    regular file holding a zip."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        with open(path, "rb") as handle:
            # A zip reader accepts bytes before the archive (a self-extractor, or a file of the user's with a zip
            # appended): what is marked must be the whole file, from its first byte.
            if handle.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):
                return None
        with zipfile.ZipFile(path) as archive:
            if min((info.header_offset for info in archive.infolist()), default=0) != 0:
                return None
            return archive.comment[:_MAX_MARK], archive.namelist()
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path.expanduser()))


def is_within(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder` or lies below it, after both are resolved (links followed, `..` removed)."""
    return _resolved(path).is_relative_to(_resolved(folder))


def overlap(output: Path, output_given: str, inputs: list[tuple[str, Path]], replaces: bool) -> str | None:
    """Why `output` may not be written, given the command's `inputs` ((the key=value the user typed, the path)
    pairs), or None. `replaces`: an existing output would be removed (then an input inside it is refused too)."""
    for given, path in inputs:
        if _resolved(output) == _resolved(path):
            return f"dest={output_given} is the input {given} itself"
        if is_within(output, path):
            return f"dest={output_given} lies inside the input {given}"
        if replaces and is_within(path, output):
            return (
                f"dest={output_given} holds the input {given}, and overwrite=true would remove it with the old "
                "output"
            )
    return None


def new_beside(dest: Path, folder: bool) -> Path:
    """A new, uniquely named empty file or folder beside `dest` (hidden, ending in `.partial`), with the permissions
    a plain create would give (the temporary-file calls make them private to this user)."""
    if folder:
        path = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    else:
        handle, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        os.close(handle)
        path = Path(name)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if folder else 0o666) & ~mask)
    return path


def remove_new(path: Path) -> None:
    """Remove what `new_beside` made (after a failure): this command's own temporary output, nothing else."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def replace_with(new: Path, dest: Path) -> None:
    """Put the finished output `new` at `dest`. The caller has checked that whatever is at `dest` is its own earlier
    output. A file replaces a file in one atomic rename; otherwise the old output is moved aside first and removed
    only once the new one is in place (moved back if that rename fails)."""
    if not os.path.lexists(dest) or (new.is_file() and dest.is_file() and not dest.is_symlink()):
        os.replace(new, dest)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
    old = aside / dest.name
    os.replace(dest, old)
    try:
        os.replace(new, dest)
    except BaseException:
        os.replace(old, dest)
        aside.rmdir()
        raise
    # The new output is whole and in place; a failure to remove the old one leaves a hidden folder, never an error.
    shutil.rmtree(aside, ignore_errors=True)
