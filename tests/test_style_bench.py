"""The style-training bench runs both kinds (template, plain loop) in fresh interpreters and prints their ratio,
without the main job's time budget."""

from __future__ import annotations

import re

import pytest

from benchmarks import style_bench

pytestmark = pytest.mark.bench


@pytest.mark.slow
def test_the_style_bench_prints_template_and_plain_side_by_side(capsys):
    tiny = ["--resolution", "32", "--base-channels", "4", "--residual-blocks", "1", "--batch-size", "2"]
    assert (
        style_bench.main([*tiny, "--steps", "2", "--warmup", "1", "--repeats", "1", "--hardware", "cpu"]) == 0
    )
    out = capsys.readouterr()
    assert "template:" in out.err and "plain:" in out.err  # both kinds ran
    row = re.search(r"\| 32-true \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", out.out)
    assert row is not None, out.out
    template, plain, ratio = (float(x) for x in row.groups())
    assert template > 0 and plain > 0 and ratio == pytest.approx(template / plain, abs=2e-3)


def test_style_bench_runs_never_inherit_the_main_jobs_time_budget(tmp_path):
    spec = {
        "hardware": "cpu",
        "precision": "32-true",
        "batch_size": 2,
        "resolution": 32,
        "base_channels": 4,
        "residual_blocks": 1,
        "warmup": 1,
        "steps": 2,
        "threads": None,
    }
    for kind in ("template", "plain"):
        cfg = style_bench.child_config({**spec, "kind": kind, "output_dir": str(tmp_path / kind)})
        assert cfg.train.time_budget_minutes is None and cfg.max_steps == 3, kind
