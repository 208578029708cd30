"""Train a Pixelsmith model: `python train.py [group=option ...] [key=value ...]` (see README for the groups).

Thin on purpose: Hydra composes `conf/train.yaml`, `pixelsmith.run.fit.run` builds and fits. A user-fixable problem
(PixelsmithError) is printed as one paragraph without a traceback; in a multirun the failed job is recorded in its
dir and the sweep goes on.
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.config.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

import logging

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
log = logging.getLogger("pixelsmith")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from pixelsmith.run.fit import run

    return guarded_run(run, cfg, objective=cfg.objective, ends_process=True)


if __name__ == "__main__":
    sys.exit(report_composition_errors(main))
