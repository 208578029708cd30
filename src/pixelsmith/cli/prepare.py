"""`pixelsmith-prepare source=IN dest=OUT resolution=N [key=value ...]`: `python prepare.py` for an installed package.

Same job as `prepare.py` at the repository root (`pixelsmith.data.prepare`): a wheel or Docker install turns images
into a zip (data=zip) or streaming shards (data=shards) without a clone. `pixelsmith-prepare --help` lists the options.
"""

import sys

from pixelsmith.data.prepare import main as prepare_main


def main() -> int:
    return prepare_main(prog="pixelsmith-prepare")


if __name__ == "__main__":
    sys.exit(main())
