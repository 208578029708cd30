"""A check shared by the GAN and the style performance tests (test_perf_flops_models.py, test_style_perf.py): a
`profiler=breakdown` run reports FLOPs and MFU. Kept apart from both so either part can be deleted from a fork."""

from __future__ import annotations

import json

import pytest

from pixelsmith.run.fit import run
from tests.conftest import compose_config

BATCH = 4  # images per iteration in the breakdown runs of both parts


def assert_breakdown_run_reports_flops_and_mfu(
    tmp_path, model: str, overrides: list[str], expected_common_flops: float | None = None
) -> None:
    """A `profiler=breakdown` run of `model` (6 iterations, FLOPs counted at iteration 1) writes FLOPs, TFLOP/s and
    MFU to perf/throughput.json and metrics.csv; `expected_common_flops`: the count by hand, where a test has one."""
    cfg = compose_config(
        [
            *overrides,
            "precision=32-true",
            "max_steps=6",
            "profiler=breakdown",
            "profiler.every_n_steps=2",
            "profiler.peak_tflops=0.5",  # no CPU GEMM measurement in tests
            # A sample grid at the end of iteration 2, right after the counted iteration 1: it must not be counted.
            "train.sample_every_n_steps=2",
        ],
        tmp_path / "run",
    )
    run(cfg)
    summary = json.loads((tmp_path / "run" / "perf" / "throughput.json").read_text())
    kinds = summary["flops_by_iteration_kind"]
    common = kinds["common"]["flops"]
    assert common > 0 and summary["flops_counted_at_iteration"] == 1
    assert summary["mfu"] > 0 and summary["achieved_tflops"] > 0
    timed = summary["timed_iterations_by_kind"]
    if model == "stylegan2":
        # Iterations 0-5, R1 at even ones: 0 (warm-up, R1 counted: nothing compiled), 1 (common counted), 2-5
        # timed, two of them with R1.
        assert kinds["r1"]["counted_at_iteration"] == 0 and kinds["r1"]["flops"] > common
        assert timed == {"common": 2, "r1": 2} and summary["r1_interval"] == 2
        assert summary["flops_per_iteration"] == pytest.approx((common + kinds["r1"]["flops"]) / 2)
        assert summary["flops_per_iteration_amortised"] == summary["flops_per_iteration"]
    else:
        assert list(kinds) == ["common"] and timed == {"common": 4}
        assert summary["flops_per_iteration"] == common
    if expected_common_flops is not None:
        assert common == pytest.approx(expected_common_flops, rel=0.01)
    metrics = (tmp_path / "run" / "metrics.csv").read_text()
    assert "perf/mfu" in metrics and "perf/tflops" in metrics
