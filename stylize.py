"""Stylize images with a trained Pixelsmith style model (any size, tiled): the entry point beside train.py.

    python stylize.py ckpt_path=RUN/checkpoints/last.ckpt input=IN output=OUT [key=value ...]

`python stylize.py --help` lists every option; the implementation is `pixelsmith.style.stylize`.
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.config.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from pixelsmith.style.stylize import main

if __name__ == "__main__":
    sys.exit(main())
