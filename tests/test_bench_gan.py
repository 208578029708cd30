"""bench.py end to end on a tiny matrix: fresh-process runs of the template and the plain loop, bench.json records
with medians, overhead ratio, FLOPs and MFU, plus bench.md and the plot."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from benchmarks.gan_bench import DEFAULT_CELLS, build_cells, parse_args, targets_markdown
from pixelsmith.perf.flops import cpu_peak_flops
from tests.conftest import run_cli

pytestmark = pytest.mark.bench


def test_matrix_is_the_product_of_the_axes_given():
    assert build_cells(parse_args([])) == DEFAULT_CELLS
    assert DEFAULT_CELLS[0].optimizer == "foreach" and not DEFAULT_CELLS[0].channels_last  # "no switches"
    cells = build_cells(
        parse_args(["--precisions", "32-true", "bf16-mixed", "--channels-last", "false", "true"])
    )
    assert len(cells) == 4 and {(c.precision, c.channels_last) for c in cells} == {
        ("32-true", False),
        ("32-true", True),
        ("bf16-mixed", False),
        ("bf16-mixed", True),
    }
    assert all(c.model == "dcgan" and c.batch_size == 64 and not c.compile for c in cells)
    full = build_cells(parse_args(["--full"]))
    assert len(full) == 2 * 2 * 2 * 2 * 3 and {c.model for c in full} == {"dcgan", "stylegan2"}


@pytest.mark.slow
def test_bench_runs_a_tiny_matrix_end_to_end(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path / "cache"))
    cpu_peak_flops("fp32", measure=lambda dtype: 50e9)  # a cached peak: the bench must not measure one again
    result = run_cli(
        [
            "bench.py",
            "--models", "dcgan",
            "--precisions", "32-true",
            "--channels-last", "true",
            "--batch-sizes", "8",
            "--resolution", "16",
            "--repeats", "1",
            "--warmup", "1",
            "--steps", "2",
            "--no-breakdown",
            "--override", "model.generator.ngf=8", "model.discriminator.ndf=8", "data.limit=32",
            "--out", str(out),
        ],
        timeout=600,
        env_extra={"PIXELSMITH_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    assert report["machine"]["load_average_start"] is not None
    cells = report["cells"]
    assert [c["settings"]["channels_last"] for c in cells] == [True]
    for cell in cells:
        assert not cell["errors"], cell["errors"]
        for key in ("template_img_per_s", "plain_img_per_s"):
            stats = cell[key]
            assert stats["n"] == 1 and stats["min"] <= stats["median"] <= stats["max"] and stats["median"] > 0
        ratio = cell["plain_img_per_s"]["median"] / cell["template_img_per_s"]["median"] - 1
        assert cell["overhead"]["median"] == pytest.approx(ratio)
        assert cell["template_img_per_cpu_s"]["median"] > 0 and cell["overhead_cpu_time"]["n"] == 1
        assert cell["flops_per_iteration"] > 0 and cell["peak_flops"] == 50e9
        iterations_per_s = cell["template_img_per_s"]["median"] / 8
        assert cell["mfu"] == pytest.approx(cell["flops_per_iteration"] * iterations_per_s / 50e9)
        assert cell["peak_rss_mb"]["median"] > 100
    speedup = report["speedups"][cells[0]["name"]]
    assert speedup == {"vs": cells[0]["name"], "speedup": 1.0, "speedup_best_iteration": 1.0}
    best = cells[0]["best_iteration_img_per_s"]
    medians = cells[0]["median_iteration_ms"]
    assert cells[0]["overhead_median_iteration"] == pytest.approx(medians["template"] / medians["plain"] - 1)
    # The best iteration is no slower than the median one.
    assert 1000 * 8 / best["template"] <= medians["template"]
    assert best["template"] >= cells[0]["template_img_per_s"]["max"] and best["plain"] > 0
    # The report is rebuilt from the run dirs alone (an interrupted benchmark keeps its results).
    (out / "bench.json").unlink()
    rebuilt = run_cli(
        ["bench.py", "--report-from", str(out), "--models", "dcgan", "--precisions", "32-true",
         "--channels-last", "true", "--batch-sizes", "8", "--resolution", "16", "--warmup", "1", "--steps", "2"],
        timeout=300,
    )  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    again = json.loads((out / "bench.json").read_text())["cells"][0]
    assert again["template_img_per_s"] == cells[0]["template_img_per_s"]
    assert "cached GEMM peak" in cells[0]["peak_source"]
    md = (out / "bench.md").read_text()
    assert "| dcgan b8 32-true channels_last eager fused-adam |" in md and "Load average" in md
    assert Image.open(out / "bench.png").size[0] > 300
    assert (out / "runs" / cells[0]["name"].replace(" ", "_") / "0-template" / "metrics.csv").exists()


def test_bench_report_checks_the_targets_on_the_profile_default_cell():
    def record(name, precision, channels_last, overhead):
        settings = {
            "precision": precision,
            "channels_last": channels_last,
            "compile": False,
            "optimizer": "fused",
        }
        return {"name": name, "settings": settings, "overhead_median_iteration": overhead}

    report = {
        "settings": {"hardware": "cpu", "repeats": 3, "steps": 10},
        "cells": [record("fp32", "32-true", False, 0.001), record("defaults", "bf16-mixed", True, 0.05)],
        "speedups": {"defaults": {"vs": "fp32", "speedup": 2.5, "speedup_best_iteration": 2.6}},
        "breakdown": {"cell": "defaults", "rows": [{"phase": "data_wait", "share": "0.005"}]},
    }
    text = "\n".join(targets_markdown(report))
    assert "the cpu profile's defaults (defaults)" in text
    assert "2.50x img/s" in text and "target >= 1.7x: **met**" in text
    assert "+5.0% over 30 timed iterations" in text and "**not met**" in text and "--repeats 7" in text
    assert "data wait: 0.5% of the step, target < 5%: **met**" in text
    report["cells"][1]["overhead_median_iteration"] = 0.01
    report["settings"]["steps"] = 40
    text = "\n".join(targets_markdown(report))
    assert (
        "+1.0% over 120 timed iterations per side, target <= 3%: **met**" in text
        and "--repeats 7" not in text
    )
