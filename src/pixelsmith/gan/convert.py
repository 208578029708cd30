"""`python convert.py source=NETWORK.pkl dest=OUT.ckpt`: an NVlabs StyleGAN2 network pickle as a Pixelsmith checkpoint.

The pickle is read as data (`pixelsmith.gan.nvlabs`: no code it carries runs); G, D and G_ema are mapped onto
Pixelsmith's StyleGAN2 at the pickle's widths and written as the checkpoint a training run writes at iteration 0,
with the run config of `experiment=stylegan2_finetune` at those settings. `evaluate.py ckpt_path=OUT.ckpt`,
`generate.py ckpt_path=OUT.ckpt` and `train.py experiment=stylegan2_finetune model.init_from=OUT.ckpt` take it
(each also takes the .pkl itself). Bad input stops in one paragraph with exit 2 and writes nothing.

`dest` is checked before the pickle is read: a folder, a symbolic link, the source itself, or a place that cannot be
written is refused; an existing file is replaced (`overwrite=true`) only when it is a checkpoint convert.py wrote,
recognised by the mark in its zip comment (`pixelsmith.owned_outputs`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from pixelsmith.config.argv_options import parse_key_values
from pixelsmith.errors import PixelsmithError, UnwritableError, check_writable_folder, why_unwritable
from pixelsmith.owned_outputs import is_within, zip_listing

HELP = (
    __doc__
    + """
Options (key=value):
  source=PATH   an NVlabs network pickle (stylegan2-ada-pytorch, or stylegan3 --cfg=stylegan2)
  dest=PATH     the checkpoint to write (.ckpt); refused if it exists unless overwrite=true
  overwrite=BOOL  true: replace a dest that convert.py wrote before (never another file, never a folder)
"""
)


class ConvertError(PixelsmithError):
    """Bad options for convert.py; the message says what to give instead."""


# The comment on the zip torch.save writes: what overwrite=true recognises as convert.py's own output.
MARK = b"pixelsmith convert.py"


def _torch_layout(names: list[str]) -> bool:
    """Whether zip member `names` are those of a file torch.save wrote (one top folder holding data.pkl, version and
    the tensors' data/N), and nothing else."""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) != 1:
        return False
    top = tops.pop()
    allowed = re.compile(
        rf"{re.escape(top)}/(data\.pkl|version|byteorder|\.format_version|\.storage_alignment|\.data/serialization_id|data/\d+)"
    )
    return f"{top}/data.pkl" in names and all(allowed.fullmatch(name) for name in names)


def check_dest(source: str, dest: str, out: Path, overwrite: bool) -> None:
    """Before the pickle is read: refuse a dest that is the source, a folder, a link, another program's file (or
    any existing file without overwrite=true), or a place this process cannot write."""
    if out.suffix.lower() == ".pkl":
        raise ConvertError(f"dest={out}: Pixelsmith checkpoints are torch files, name it .ckpt.")
    if os.path.lexists(Path(source).expanduser()) and is_within(out, Path(source).expanduser()):
        raise ConvertError(
            f"dest={dest} is the source pickle itself: convert.py never writes over its input. Give another "
            f"path, e.g. dest={Path(source).expanduser().with_suffix('.ckpt')}."
        )
    if out.is_dir() and not out.is_symlink():
        raise ConvertError(
            f"dest={dest} is a folder: give the checkpoint's file name, e.g. dest={out / 'converted.ckpt'}. "
            "convert.py never replaces a folder."
        )
    if os.path.lexists(out):
        listing = None if out.is_symlink() else zip_listing(out)
        ours = listing is not None and listing[0] == MARK and _torch_layout(listing[1])
        if not ours:
            what = "a symbolic link" if out.is_symlink() else "not a checkpoint convert.py wrote"
            raise ConvertError(
                f"dest={dest} exists and is {what}: convert.py replaces only its own earlier output (with "
                "overwrite=true), so nothing was written. Give another path, or move that file away yourself."
            )
        if not overwrite:
            raise ConvertError(
                f"dest={dest} exists (a checkpoint convert.py wrote): give another path, or overwrite=true to "
                "replace it."
            )
    check_writable_folder(out.parent, "dest", "choose a .ckpt path on a disk you can write (dest=...).", dest)


@dataclasses.dataclass
class ConvertOptions:
    source: str | None = None
    dest: str | None = None
    overwrite: bool = False


def convert(source: str, dest: str, overwrite: bool = False) -> list[str]:
    """Write the checkpoint; the lines convert.py prints (what was mapped, the settings that build it)."""
    from pixelsmith.gan.pretrained import checkpoint_from_pickle, save_atomically

    out = Path(dest).expanduser()
    check_dest(source, dest, out, overwrite)
    checkpoint, converted = checkpoint_from_pickle(source, key="source")
    if os.path.lexists(out):  # checked again: it may have changed while the pickle was converted
        check_dest(source, dest, out, overwrite)
    try:
        save_atomically(checkpoint, out, zip_comment=MARK)
    except OSError as err:
        raise UnwritableError(
            f"dest={dest}: writing the checkpoint failed, {why_unwritable(err)} ({err}). Nothing was left behind. "
            "Free space there or choose another dest=..., and run it again."
        ) from err
    settings = " ".join(checkpoint["converted_from"]["overrides"])
    return [
        f"{source}: StyleGAN2, {converted.generator['resolution']} px, {converted.generator['channels']} channels, "
        f"D architecture {converted.discriminator['architecture']}",
        *(f"  mapped {line}" for line in converted.report),
        f"wrote {out}",
        f"settings: {settings}",
        f"fine-tune: python train.py experiment=stylegan2_finetune model.init_from={out} data.root=... {settings}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help", "help") for a in argv):
        print(HELP)
        return 0
    try:
        options = parse_key_values(argv, ConvertOptions, ConvertError, "convert.py")
        if not options.source or not options.dest:
            raise ConvertError(
                "source=... (an NVlabs network pickle) and dest=... (the .ckpt to write) are required."
            )
        for line in convert(options.source, options.dest, options.overwrite):
            print(line)
    except PixelsmithError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
