"""Images out of a trained GAN or an NVlabs StyleGAN2 pickle: `python generate.py ckpt_path=X mode=...`.

    python generate.py ckpt_path=ffhq.pkl seeds=0-7 truncation_psi=0.7            # one PNG per seed
    python generate.py ckpt_path=RUN/checkpoints/last.ckpt mode=grid seeds=0-15
    python generate.py ckpt_path=ffhq.pkl mode=mixing mixing.row_seeds=[1,2] mixing.col_seeds=[3,4,5]
    python generate.py ckpt_path=ffhq.pkl mode=video seeds=[0,1,2] video.path=walk.mp4
    python generate.py ckpt_path=ffhq.pkl mode=project project.target=me.png

Thin Hydra wrapper (conf/generate.yaml) around `pixelsmith.gan.generate.run`; docs/pretrained.md has the details.
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

import hydra
from omegaconf import DictConfig

from pixelsmith.config.schema import register_configs
from pixelsmith.entry import guarded_run
from pixelsmith.hardware import register_detected_profile
from pixelsmith.paths import register_resolvers

register_configs()
register_resolvers()
register_detected_profile()


@hydra.main(version_base="1.3", config_path="conf", config_name="generate")
def main(cfg: DictConfig) -> float | None:
    from pixelsmith.gan.generate import run

    return guarded_run(run, cfg, objective="written", ends_process=True)


if __name__ == "__main__":
    sys.exit(main())
