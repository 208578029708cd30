"""The overhead attribution tool (`benchmarks/overhead.py`) runs every variant and the plain loop, without the main
job's time budget; its variants really remove what they say (no self.log means no logged metrics) and none of them
touches Lightning's classes."""

from __future__ import annotations

import lightning as L
import pytest

from benchmarks import overhead

pytestmark = pytest.mark.bench


def test_overhead_tool_measures_every_variant(tmp_path):
    log, log_dict = L.LightningModule.log, L.LightningModule.log_dict
    times = overhead.measure(iterations=8, repeats=1, workdir=tmp_path)
    assert set(times) == {*overhead.VARIANTS, "plain", overhead.NORM}
    assert all(
        len(times[v]) == 8 - 2 - 1 and all(t > 0 for t in times[v]) for v in [*overhead.VARIANTS, "plain"]
    )
    assert times[overhead.NORM] and all(t > 0 for t in times[overhead.NORM])
    table = overhead.report(times)
    assert "Fixed template cost" in table and "without self.log" in table and overhead.NORM in table
    # The no_log variant logged nothing through Lightning: its CSV has no loss column.
    assert (tmp_path / "0-template" / "metrics.csv").read_text().count("loss/D") == 1
    assert (
        not (tmp_path / "0-no_log" / "metrics.csv").exists()
        or "loss/D" not in (tmp_path / "0-no_log" / "metrics.csv").read_text()
    )
    # Subclasses, not patches: Lightning's methods are the ones it shipped.
    assert L.LightningModule.log is log and L.LightningModule.log_dict is log_dict


def test_variant_classes_subclass_the_configured_model():
    from hydra.utils import get_class

    from pixelsmith.gan.module import GANModule

    target = overhead.variant_target("pixelsmith.gan.module.GANModule", "none")
    cls = get_class(target)
    assert issubclass(cls, GANModule) and cls.log is overhead.WithoutLog.log
    assert cls.on_train_batch_start is overhead.WithoutReseed.on_train_batch_start
    assert overhead.variant_target("pixelsmith.gan.module.GANModule", "none") == target  # made once


def test_overhead_runs_never_inherit_the_main_jobs_time_budget(tmp_path):
    configs = {v: overhead.variant_config(v, 120, tmp_path / v) for v in [*overhead.VARIANTS, "plain"]}
    for variant, cfg in configs.items():
        assert cfg.train.time_budget_minutes is None and cfg.max_steps == 120, variant
    # Each variant is the config it claims to be.
    assert configs["template"].logger and not configs["no_loggers"].logger
    assert configs["template"].model._target_ == "pixelsmith.gan.module.GANModule"
    assert configs["none"].model._target_ == overhead.variant_target(
        "pixelsmith.gan.module.GANModule", "none"
    )
    assert "bench_clock" in configs["template"].callbacks and "bench_clock" not in configs["plain"].callbacks
