"""Convert an NVlabs StyleGAN2 network pickle into a Pixelsmith checkpoint, read as data (no code from it runs):

    python convert.py source=ffhq.pkl dest=ffhq.ckpt

`python convert.py --help` lists the options; the implementation is `pixelsmith.gan.convert` (docs/pretrained.md).
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from pixelsmith.gan.convert import main

if __name__ == "__main__":
    sys.exit(main())
