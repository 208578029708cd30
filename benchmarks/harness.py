"""What every benchmark here shares: composing the real config tree with the outputs in a chosen dir, and
`IterationClock`, the callback that stamps the end of every training iteration of a template run.

A template run names the clock as a config entry (`cfg.callbacks.bench_clock`, `CLOCK_TARGET`), so Hydra
instantiates it like any other callback; the benchmark reads the class-level lists after `pixelsmith.train.run`.
"""

from __future__ import annotations

import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

CLOCK_TARGET = "benchmarks.harness.IterationClock"


class IterationClock(Callback):
    """Wall clock and process CPU time at the end of every training iteration (class-level, read by the bench
    child after run())."""

    ends: list[float] = []
    cpu_ends: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        IterationClock.ends = []
        IterationClock.cpu_ends = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        IterationClock.ends.append(time.perf_counter())
        IterationClock.cpu_ends.append(time.process_time())


def compose(overrides: list[str], output_dir: Path):
    """The training config as `train.py` composes it (the repository's `conf/`, the typed schemas), with
    `paths.output_dir` set to `output_dir`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from pixelsmith.config.schema import register_configs
    from pixelsmith.hardware import register_detected_profile
    from pixelsmith.paths import CONF_DIR

    register_configs()
    register_detected_profile()  # what `hardware=auto` composes
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
    return cfg
