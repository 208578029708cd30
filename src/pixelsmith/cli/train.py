"""`pixelsmith-train [group=option ...] [key=value ...]`: `python train.py` for an installed package.

Same job as `train.py` at the repository root (see its docstring and the README), composed from the packaged
config tree (`pixelsmith.config.paths.CONF_DIR`) so it runs from any working directory; runs go to `./outputs/`.
"""

import sys

import hydra
from omegaconf import DictConfig

from pixelsmith.config.hydra_errors import report_composition_errors
from pixelsmith.config.paths import CONF_DIR, register_resolvers
from pixelsmith.config.schema import register_configs
from pixelsmith.hardware.settings import register_detected_profile
from pixelsmith.run.entry import guarded_run

register_configs()
register_resolvers()
register_detected_profile()  # hardware=auto composes this machine's profile (conf/hardware/auto.yaml)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    from pixelsmith.run.fit import run

    return guarded_run(run, cfg, objective=cfg.objective, ends_process=True)


def main() -> float | None:
    """The console script: Hydra's composition errors are one paragraph with exit status 2 (`config.hydra_errors`)."""
    return report_composition_errors(_hydra_main)


if __name__ == "__main__":
    sys.exit(main())
