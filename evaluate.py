"""Evaluate a trained GAN: `python evaluate.py ckpt_path=RUN/checkpoints/last.ckpt [eval.num_samples=N ...]`.

Thin Hydra wrapper around `pixelsmith.run.evaluate.evaluate`; writes metrics.json and metrics.md into its run dir.
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.config.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

import hydra
from omegaconf import DictConfig

from pixelsmith.config.hydra_errors import report_composition_errors
from pixelsmith.config.paths import register_resolvers
from pixelsmith.config.schema import register_configs
from pixelsmith.hardware.settings import register_detected_profile
from pixelsmith.run.entry import guarded_run

register_configs()
register_resolvers()  # ${pixelsmith.data_dir:} in conf/paths/default.yaml
register_detected_profile()  # hardware=auto composes this machine's profile (conf/hardware/auto.yaml)


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    from pixelsmith.run.evaluate import evaluate

    return guarded_run(evaluate, cfg, objective="fid", ends_process=True)


if __name__ == "__main__":
    sys.exit(report_composition_errors(main))
