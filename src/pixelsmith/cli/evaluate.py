"""`pixelsmith-evaluate ckpt_path=RUN/checkpoints/last.ckpt [eval.num_samples=N ...]`: `python evaluate.py` for an
installed package.

Same job as `evaluate.py` at the repository root, composed from the packaged config tree
(`pixelsmith.config.paths.CONF_DIR`) so it runs from any working directory; writes metrics.json and metrics.md into its
run dir under `./outputs/`.
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


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="evaluate")
def _hydra_main(cfg: DictConfig) -> float | None:
    from pixelsmith.run.evaluate import evaluate

    return guarded_run(evaluate, cfg, objective="fid", ends_process=True)


def main() -> float | None:
    """The console script: Hydra's composition errors are one paragraph with exit status 2 (`config.hydra_errors`)."""
    return report_composition_errors(_hydra_main)


if __name__ == "__main__":
    sys.exit(main())
