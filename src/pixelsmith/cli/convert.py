"""`pixelsmith-convert source=NETWORK.pkl dest=OUT.ckpt`: `python convert.py` for an installed package.

Registers the config schemas (the checkpoint's run config is composed from the packaged tree), then runs the GAN
part's converter, reached by its dotted path as general code reaches a part (README "Removing a part").
"""

import sys

from hydra.utils import get_method

from pixelsmith.config.schema import register_configs
from pixelsmith.hardware import register_detected_profile
from pixelsmith.paths import register_resolvers


def main() -> int:
    register_configs()
    register_resolvers()
    register_detected_profile()
    return get_method("pixelsmith.gan.convert.main")()


if __name__ == "__main__":
    sys.exit(main())
