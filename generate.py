"""Images out of a trained GAN or an NVlabs StyleGAN2 pickle: `python generate.py ckpt_path=X mode=...`.

    python generate.py ckpt_path=ffhq.pkl seeds=0-7 truncation_psi=0.7            # one PNG per seed
    python generate.py ckpt_path=RUN/checkpoints/last.ckpt mode=grid seeds=0-15
    python generate.py ckpt_path=ffhq.pkl mode=mixing mixing.row_seeds=[1,2] mixing.col_seeds=[3,4,5]
    python generate.py ckpt_path=ffhq.pkl mode=video seeds=[0,1,2] video.path=walk.mp4
    python generate.py ckpt_path=ffhq.pkl mode=project project.target=me.png

Thin Hydra wrapper (conf/generate.yaml) around `pixelsmith.gan.generate`; docs/pretrained.md has the details.
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.config.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from pixelsmith.gan.generate import main

if __name__ == "__main__":
    main()
