"""`pixelsmith-convert source=NETWORK.pkl dest=OUT.ckpt`: `python convert.py` for an installed package.

Registers the config schemas (the checkpoint's run config is composed from the packaged tree), then runs the
converter a part offers (the GAN part's, `COMMANDS` in its part.py): general code never names a part (README
"Removing a part"), and a fork without it gets one sentence saying so.
"""

import sys

from hydra.utils import get_method

from pixelsmith.config.paths import register_resolvers
from pixelsmith.config.schema import register_configs
from pixelsmith.hardware.settings import register_detected_profile
from pixelsmith.parts import contributed


def main() -> int:
    register_configs()
    register_resolvers()
    register_detected_profile()
    commands = dict(contributed("COMMANDS"))
    if "convert" not in commands:
        print(
            "convert: no part of this install converts networks (it is the GAN part's command).",
            file=sys.stderr,
        )
        return 2
    return get_method(commands["convert"])()


if __name__ == "__main__":
    sys.exit(main())
