"""Convert an NVlabs StyleGAN2 network pickle into a Pixelsmith checkpoint, read as data (no code from it runs):

    python convert.py source=ffhq.pkl dest=ffhq.ckpt

`python convert.py --help` lists the options; the implementation is `pixelsmith.gan.convert` (docs/pretrained.md).
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.config.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from pixelsmith.config.paths import register_resolvers
from pixelsmith.config.schema import register_configs
from pixelsmith.gan.convert import main
from pixelsmith.hardware.settings import register_detected_profile

register_configs()  # the checkpoint's run config is composed from conf/, as train.py composes it
register_resolvers()
register_detected_profile()

if __name__ == "__main__":
    sys.exit(main())
