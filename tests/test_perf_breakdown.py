"""Step-time breakdown: nested regions get exclusive time, the regions of a real GAN run add up to the step time
(checked against an independent clock), scalars reach the loggers every N iterations, and the table, CSV, JSON and
bar chart land in the run dir."""

from __future__ import annotations

import csv
import json
import time

import pytest
from PIL import Image

from benchmarks.harness import CLOCK_TARGET, IterationClock
from pixelsmith.perf.breakdown import REGION_TOLERANCE
from pixelsmith.perf.timer import DATA_WAIT, OTHER_IN_STEP, OTHER_LOOP, StepTimer, measure_overhead
from pixelsmith.run.fit import run
from tests.conftest import FAST, SMALL, compose_config, metrics_rows

GAN_REGIONS = ["data_wait", "h2d", "augment", "G_fwd", "D_fwd", "D_bwd", "D_reg", "G_bwd", "opt_step", "ema"]


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_nested_regions_get_exclusive_time_and_partition_the_iteration():
    timer = StepTimer("cpu")
    timer.begin_iteration()
    _busy(0.002)
    timer.set_region(OTHER_IN_STEP)
    t0 = time.perf_counter()
    with timer("D_fwd"):
        _busy(0.004)
        t1 = time.perf_counter()
        with timer("augment"):
            _busy(0.006)
        t2 = time.perf_counter()
        _busy(0.003)
    t3 = time.perf_counter()
    timer.set_region(OTHER_LOOP)
    timer.begin_iteration()  # closes iteration 0
    (it,), _, (marks,) = timer.drain()
    # What the test's own clock saw, +-0.5 ms for the marks taken a few instructions apart.
    assert it["augment"] == pytest.approx(t2 - t1, abs=5e-4)
    assert it["D_fwd"] == pytest.approx((t3 - t0) - (t2 - t1), abs=5e-4)  # augment's time is not in D_fwd
    assert it[DATA_WAIT] >= 0.002
    assert sum(v for k, v in it.items() if k != "total") == pytest.approx(it["total"], rel=1e-9)
    assert marks == 7


def test_timer_overhead_is_measured_and_small():
    per_region = measure_overhead("cpu", repeats=500)
    assert (
        0 < per_region < 50e-6
    )  # a region costs microseconds, not tens of microseconds, even on a loaded machine


@pytest.fixture(scope="module")
def breakdown_run(tmp_path_factory):
    """One short DCGAN run with DiffAugment and lazy R1 (so every GAN region occurs), shared by the tests below."""
    out = tmp_path_factory.mktemp("breakdown") / "run"
    cfg = compose_config(
        [
            *FAST,
            *SMALL["dcgan"],
            "precision=32-true",
            "augment=diffaugment",
            "model.objective.regularizers.r1.gamma=1.0",
            "model.objective.regularizers.r1.interval=4",
            "max_steps=10",
            "profiler=breakdown",
            "profiler.every_n_steps=2",
            "profiler.peak_tflops=1.0",  # no CPU GEMM measurement in tests
            "train.sample_every_n_steps=0",
            "eval.every_n_steps=0",  # no FID at start/end: not what these tests measure
            f"+callbacks.clock._target_={CLOCK_TARGET}",
        ],
        out,
    )
    run(cfg)
    return out


def test_breakdown_of_a_real_run_sums_to_the_step_time(breakdown_run):
    summary = json.loads((breakdown_run / "perf" / "breakdown.json").read_text())
    rows = {r["phase"]: r for r in summary["rows"]}
    for region in GAN_REGIONS + [OTHER_IN_STEP, OTHER_LOOP]:
        assert rows[region]["mean_ms"] > 0, region
    assert summary["iterations"] == 8  # 10 minus 2 warm-up
    # Stated tolerance: the rows add up to the step within 1% (exactly, on CPU, as the marks partition the time).
    assert sum(r["mean_ms"] for r in summary["rows"]) == pytest.approx(
        summary["step_mean_ms"], rel=REGION_TOLERANCE
    )
    # Independent clock: perf_counter at each on_train_batch_end. Over the same 8 iterations the sums differ only by
    # the two boundary gaps (callbacks after training_step), a few ms.
    ends = IterationClock.ends
    assert len(ends) == 10
    independent = ends[9] - ends[1]
    measured = summary["step_mean_ms"] * summary["iterations"] / 1000.0
    assert measured == pytest.approx(independent, rel=0.05, abs=0.01)
    # The timer's own cost is stated and negligible next to a step.
    assert 0 < summary["timer_overhead_us_per_phase"] < 50
    assert summary["timer_overhead_share"] < 0.01


def test_breakdown_outputs_and_scalars(breakdown_run):
    out = breakdown_run / "perf"
    md = (out / "breakdown.md").read_text()
    assert "| D_bwd |" in md and "Measurement overhead" in md and "tolerance 1%" in md
    with open(out / "breakdown.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["phase"] for r in rows][:3] == ["data_wait", "h2d", "augment"] and rows[-1]["phase"] == "total"
    image = Image.open(out / "breakdown.png").convert("L")
    assert image.size[0] > 300 and image.size[1] > 150
    assert min(image.getdata()) < 128  # bars and text were drawn
    metrics = metrics_rows(breakdown_run)
    logged_at = sorted(int(r["step"]) for r in metrics if r.get("perf/share/D_bwd"))
    # Every 2 iterations once warm-up iterations are out of the window (iteration k is resolved at fetch k+1).
    assert logged_at == [4, 6, 8, 10]
    shares = [
        float(r[f"perf/share/{p}"]) for r in metrics if r.get("perf/share/D_bwd") for p in ("G_fwd", "D_bwd")
    ]
    assert all(0 < s < 1 for s in shares)


def test_rows_put_the_models_declared_regions_between_the_loops_own():
    """The model's `breakdown_regions` order its rows (general code names no model's regions); a region it recorded
    without declaring follows them, in the order it appeared."""
    from pixelsmith.perf.breakdown import ordered_labels

    labels = [
        "other_loop",
        "opt_step",
        "b",
        "undeclared",
        "a",
        "h2d",
        "data_wait",
        "other_in_step",
        "ema",
        "total",
    ]
    assert ordered_labels(labels, ("a", "b", "never_recorded")) == [
        *("data_wait", "h2d", "a", "b", "undeclared", "opt_step", "ema", "other_in_step", "other_loop")
    ]
