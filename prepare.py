"""Turn images into a training dataset (a StyleGAN2-ADA zip for data=zip, or streaming shards for data=shards): the
entry point beside train.py.

    python prepare.py source=IN dest=OUT.zip resolution=N [key=value ...]

`python prepare.py --help` lists every option; the implementation is `pixelsmith.data.prepare`.
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment (as train.py).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from pixelsmith.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
