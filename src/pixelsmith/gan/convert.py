"""`python convert.py source=NETWORK.pkl dest=OUT.ckpt`: an NVlabs StyleGAN2 network pickle as a Pixelsmith checkpoint.

The pickle is read as data (`pixelsmith.gan.nvlabs`: no code it carries runs); G, D and G_ema are mapped onto
Pixelsmith's StyleGAN2 at the pickle's widths and written as the checkpoint a training run writes at iteration 0,
with the run config of `experiment=stylegan2_finetune` at those settings. `evaluate.py ckpt_path=OUT.ckpt`,
`generate.py ckpt_path=OUT.ckpt` and `train.py experiment=stylegan2_finetune model.init_from=OUT.ckpt` take it
(each also takes the .pkl itself). Bad input stops in one paragraph with exit 2 and writes nothing.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from pixelsmith.config.argv_options import parse_key_values
from pixelsmith.errors import PixelsmithError

HELP = (
    __doc__
    + """
Options (key=value):
  source=PATH   an NVlabs network pickle (stylegan2-ada-pytorch, or stylegan3 --cfg=stylegan2)
  dest=PATH     the checkpoint to write (.ckpt); refused if it exists unless overwrite=true
  overwrite=BOOL
"""
)


class ConvertError(PixelsmithError):
    """Bad options for convert.py; the message says what to give instead."""


@dataclasses.dataclass
class ConvertOptions:
    source: str | None = None
    dest: str | None = None
    overwrite: bool = False


def convert(source: str, dest: str, overwrite: bool = False) -> list[str]:
    """Write the checkpoint; the lines convert.py prints (what was mapped, the settings that build it)."""
    from pixelsmith.gan.pretrained import checkpoint_from_pickle, save_atomically

    out = Path(dest).expanduser()
    if out.exists() and not overwrite:
        raise ConvertError(f"dest={out} exists: give another path, or overwrite=true to replace it.")
    if out.suffix.lower() == ".pkl":
        raise ConvertError(f"dest={out}: Pixelsmith checkpoints are torch files, name it .ckpt.")
    checkpoint, converted = checkpoint_from_pickle(source, key="source")
    save_atomically(checkpoint, out)
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
