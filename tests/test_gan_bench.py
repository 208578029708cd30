"""bench.py end to end on a tiny matrix: fresh-process runs of the template and the plain loop, bench.json records
with medians, overhead ratio, FLOPs and MFU, plus bench.md and the plot; its runs without the main job's time
budget (and the cause named when a run ends early anyway), bf16 cells skipped where a CPU only emulates bf16, and an
implausible CPU peak measured again instead of an MFU above 100%."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import pytest
from PIL import Image

from benchmarks import gan_bench
from benchmarks.arguments import CommandLineError
from benchmarks.gan_bench import (
    DEFAULT_CELLS,
    Cell,
    bench_kinds,
    build_cells,
    child_config,
    parse_args,
    runnable_cells,
    targets_markdown,
)
from benchmarks.harness import RunEndedEarly, require_every_iteration
from pixelsmith.hardware import settings as hardware
from pixelsmith.perf import flops as flops_mod
from pixelsmith.perf.flops import cpu_peak_flops
from tests.conftest import compose_config, run_cli

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


def test_bench_report_checks_the_targets_on_the_profile_default_cell(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_prefers_bf16", lambda: True)  # the cpu profile trains bf16-mixed

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
    # Without AMX the cpu profile trains 32-true: that cell holds its defaults.
    report["cells"][0]["settings"]["channels_last"] = True
    monkeypatch.setattr(hardware, "cpu_prefers_bf16", lambda: False)
    assert "the cpu profile's defaults (fp32)" in "\n".join(targets_markdown(report))


def _spec(tmp_path, kind: str = "template", **extra) -> dict:
    """One bench run's spec as the parent hands it to a child: a tiny DCGAN cell, 1 warm-up + 2 timed iterations."""
    return {
        "hardware": "cpu",
        "resolution": 16,
        "warmup": 1,
        "steps": 2,
        "threads": None,
        "extra_overrides": ["model.generator.ngf=8", "model.discriminator.ndf=8", "data.limit=32"],
        "kind": kind,
        "cell": asdict(Cell("dcgan", "32-true", False, False, 8, "fused")),
        "output_dir": str(tmp_path / kind),
        **extra,
    }


def test_bench_runs_never_inherit_the_main_jobs_time_budget(tmp_path):
    # What train.py composes has the 4.5-minute budget; every run bench.py starts has none.
    assert compose_config(["~local"], tmp_path / "main").train.time_budget_minutes == 4.5
    for kind in ("template", "plain", "graphed"):
        assert child_config(_spec(tmp_path, kind)).train.time_budget_minutes is None, kind
    breakdown = _spec(tmp_path, run_overrides=["profiler=breakdown", "profiler.warmup_steps=1"])
    assert child_config(breakdown).train.time_budget_minutes is None
    # A budget the user asks for explicitly still wins (and is named when it cuts a run short, below).
    asked = _spec(tmp_path, extra_overrides=["train.time_budget_minutes=2"])
    assert child_config(asked).train.time_budget_minutes == 2.0


def test_a_template_run_cut_short_names_its_cause(tmp_path):
    # A budget of 6 ms ends training after the first iteration: 1 of the 4 the bench runs (1 + 2 timed + 1).
    spec = _spec(tmp_path, run_overrides=["train.time_budget_minutes=0.0001"])
    with pytest.raises(RunEndedEarly) as caught:
        gan_bench.child_main(spec)
    message = str(caught.value)
    assert "stopped at iteration 1 of 4" in message and "train.time_budget_minutes=0.0001" in message
    assert "its time budget ended it" in message and "remove it" in message
    assert "iteration times" not in message


@pytest.mark.parametrize(
    "metrics, expected_words",
    [
        (
            {"iteration": 4.0, "stop_reason": "preempted"},
            ["stopped at iteration 4 of 13", "a signal stopped it"],
        ),
        ({"iteration": 0.0, "stop_reason": "max_steps"}, ["stopped at iteration 0 of 13", "'max_steps'"]),
        (
            {"iteration": 8.0, "stop_reason": "time_budget", "train/time_budget_minutes": 4.5},
            ["stopped at iteration 8 of 13", "train.time_budget_minutes=4.5"],
        ),
    ],
)
def test_every_early_stop_is_named(metrics, expected_words):
    with pytest.raises(RunEndedEarly) as caught:
        require_every_iteration(metrics, 13)
    assert all(word in str(caught.value) for word in expected_words), str(caught.value)
    require_every_iteration({**metrics, "iteration": 13.0}, 13)  # a complete run passes


def test_on_cuda_the_template_also_runs_with_its_own_cuda_graphs(tmp_path, monkeypatch):
    """Four kinds on a CUDA machine: the template eager and with hardware.cuda_graphs, the plain loop eager and
    captured by hand, so each template column has a plain counterpart in the same execution mode."""
    monkeypatch.setattr(gan_bench, "_cuda_available", lambda: True)
    assert bench_kinds(parse_args([])) == ["template", "plain", "template_graphed", "graphed"]
    assert bench_kinds(parse_args(["--no-plain"])) == ["template", "template_graphed"]
    monkeypatch.setattr(gan_bench, "_cuda_available", lambda: False)
    assert bench_kinds(parse_args([])) == ["template", "plain"]
    assert child_config(_spec(tmp_path, "template_graphed")).hardware.cuda_graphs is True
    # The run's last iteration (which reads its logs at once) is past the window and the profiled iterations.
    assert child_config(_spec(tmp_path, "template")).max_steps == 1 + 2 + 1
    assert child_config(_spec(tmp_path, "template", profile_iterations=5)).max_steps == 1 + 2 + 5 + 1
    assert child_config(_spec(tmp_path, "template")).hardware.cuda_graphs is False


def _without_native_bf16(monkeypatch, native: bool, cuda: bool = False) -> None:
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(gan_bench, "_cuda_available", lambda: cuda)


def test_bf16_cells_are_skipped_where_the_cpu_only_emulates_bf16(monkeypatch):
    _without_native_bf16(monkeypatch, native=False)
    cells, skipped, reason = runnable_cells(parse_args([]))
    assert [c.precision for c in cells] == ["32-true"] * 3 and cells == DEFAULT_CELLS[:3]
    assert skipped == DEFAULT_CELLS[3:] and all(c.precision == "bf16-mixed" for c in skipped)
    assert "no native bf16" in reason and "AVX512-BF16" in reason and "--emulated-bf16" in reason
    # --emulated-bf16 runs them anyway.
    assert runnable_cells(parse_args(["--emulated-bf16"])) == (DEFAULT_CELLS, [], None)
    # A GPU run (hardware=auto with CUDA) is not the CPU's business.
    _without_native_bf16(monkeypatch, native=False, cuda=True)
    assert runnable_cells(parse_args(["--hardware", "auto"])) == (DEFAULT_CELLS, [], None)


def test_bf16_cells_run_where_the_cpu_has_native_bf16(monkeypatch):
    _without_native_bf16(monkeypatch, native=True)
    assert runnable_cells(parse_args([])) == (DEFAULT_CELLS, [], None)


def test_the_skip_reason_is_printed_once_and_reported(tmp_path, monkeypatch, capsys):
    _without_native_bf16(monkeypatch, native=False)
    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path / "cache"))
    cpu_peak_flops("fp32", measure=lambda dtype: 50e9)  # cached: the matrix does not measure a peak
    asked: list[str] = []

    def no_child(spec, timeout):  # records which cells would run; no process is started
        asked.append(spec["cell"]["precision"])
        return {"kind": spec["kind"], "cell": spec["cell"], "error": "not run in this test"}

    monkeypatch.setattr(gan_bench, "run_child", no_child)
    args = parse_args(["--repeats", "2", "--no-breakdown", "--out", str(tmp_path / "bench")])
    gan_bench.run_matrix(args)
    printed = capsys.readouterr().out
    assert printed.count("skipping 2 bf16-mixed cell(s)") == 1 and "--emulated-bf16" in printed
    assert set(asked) == {"32-true"} and len(asked) == 3 * 2 * 2  # 3 cells x 2 repeats x template and plain
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert report["skipped"]["cells"] == [c.name for c in DEFAULT_CELLS[3:]]
    assert (
        "Not run: dcgan b64 bf16-mixed contiguous eager fused-adam"
        in (tmp_path / "bench" / "bench.md").read_text()
    )
    # A matrix of bf16 cells only has nothing left to run: said so, with the way out.
    with pytest.raises(CommandLineError, match="--emulated-bf16"):
        gan_bench.run_matrix(parse_args(["--precisions", "bf16-mixed", "--out", str(tmp_path / "none")]))


def _record_with_peak(tmp_path, monkeypatch, cached: float, remeasured: float) -> dict:
    """A cell record (1 template run at 80 img/s, batch 8 -> 10 iterations/s of 1 GFLOP: 10 GFLOP/s achieved)
    against a cached fp32 CPU peak of `cached` FLOP/s; a new measurement gives `remeasured`."""
    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(flops_mod, "_REMEASURED", set())
    cpu_peak_flops("fp32", measure=lambda dtype: cached)
    monkeypatch.setattr(flops_mod, "measure_gemm_flops", lambda dtype: remeasured)
    cell = Cell("dcgan", "32-true", False, False, 8, "fused")
    runs = {"template": [{"img_per_s": 80.0, "iteration_seconds": [0.1, 0.1]}]}
    args = argparse.Namespace(resolution=16, hardware="cpu")
    return gan_bench._cell_record(cell, runs, 1e9, args)


def test_a_cached_cpu_peak_below_the_achieved_flops_is_measured_again(tmp_path, monkeypatch):
    # Cached under load: 5 GFLOP/s, half of what the cell achieved (MFU 200%); measured again: 40 GFLOP/s.
    record = _record_with_peak(tmp_path, monkeypatch, cached=5e9, remeasured=40e9)
    assert record["achieved_tflops"] == pytest.approx(0.01)
    assert record["peak_flops"] == 40e9 and record["mfu"] == pytest.approx(0.25) and record["mfu"] <= 1.0
    assert "re-measured" in record["peak_source"] and "cached 5.0 GFLOP/s" in record["peak_source"]
    assert cpu_peak_flops("fp32")[0] == 40e9  # the cache holds the new peak
    # A plausible cached peak is used as it is (no measurement).
    monkeypatch.setattr(flops_mod, "measure_gemm_flops", lambda dtype: pytest.fail("measured again"))
    record = gan_bench._cell_record(
        Cell("dcgan", "32-true", False, False, 8, "fused"),
        {"template": [{"img_per_s": 80.0}]},
        1e9,
        argparse.Namespace(resolution=16, hardware="cpu"),
    )
    assert record["mfu"] == pytest.approx(0.25) and "cached GEMM peak" in record["peak_source"]


def test_no_mfu_when_even_a_new_measurement_is_below_the_achieved_flops(tmp_path, monkeypatch):
    record = _record_with_peak(tmp_path, monkeypatch, cached=5e9, remeasured=6e9)
    assert "mfu" not in record and record["peak_flops"] is None
    assert (
        record["peak_source"].startswith("fp32: no plausible peak") and "6.0 GFLOP/s" in record["peak_source"]
    )
    report = {
        "created": "now",
        "machine": {
            "cpu": "a CPU",
            "cpu_count": 2,
            "torch": "x",
            "load_average_start": None,
            "load_average_end": None,
        },
        "settings": {"hardware": "cpu", "resolution": 16, "warmup": 1, "steps": 2, "repeats": 1},
        "cells": [record],
        "speedups": {},
    }
    text = gan_bench.bench_markdown(report)
    assert "no plausible peak" in text and "MFU above 100%" not in text


@pytest.mark.parametrize("kind", ["template", "plain"])
def test_iterations_profiled_after_the_window_say_where_an_iteration_went(tmp_path, kind):
    """`profile_iterations` runs that many iterations after the timed window under torch.profiler: on a CPU the
    host's operators (on a GPU the device's kernels, a replayed graph's included) per iteration, with the costliest
    first, and the window's figures as they were."""
    spec = _spec(tmp_path, kind, profile_iterations=2)
    result = gan_bench.child_main(spec)
    profile = result["profile"]
    assert profile["timed"] == "host operators"
    # A DCGAN iteration is two convolution stacks forward and backward: dozens of operators, some convolutions.
    assert profile["count_per_iteration"] > 50 and profile["ms_per_iteration"] > 0
    tops = [row["us"] for row in profile["top"]]
    assert tops == sorted(tops, reverse=True) and len(tops) == 8
    assert any("conv" in row["name"] for row in profile["top"])
    # The host's Python over the same iterations: its costliest functions, each within its own total.
    python = profile["python_top"]
    assert len(python) == 15 and profile["wall_ms_per_iteration"] > 0
    assert [r["self_us"] for r in python] == sorted((r["self_us"] for r in python), reverse=True)
    assert all(r["total_us"] >= r["self_us"] > 0 and r["calls"] > 0 for r in python)
    assert any("backward" in r["function"] or "conv" in r["function"] for r in python)
    assert (
        len(result["iteration_seconds"]) == spec["steps"]
    )  # the window is untouched by the profiled iterations
    if kind == "template":  # and what the run did besides training (nothing is captured on a CPU)
        assert result["startup"] == {
            "captures": 0.0,
            "replays": 0.0,
            "recompiles": 0.0,
            "graphs_given_up": 0.0,
        }


def test_a_run_ending_inside_its_profiled_iterations_leaves_no_profiler_on():
    """Profiling started at the first profiled iteration; the run raises before the last: torch.profiler and
    cProfile stop (on Python 3.12+ a second cProfile could not even start while one runs), with no summary."""
    import sys

    from benchmarks.harness import KernelProfile

    profile = KernelProfile()
    KernelProfile.first, KernelProfile.count = 1, 3
    try:
        profile.on_train_start(None, None)
        profile.on_train_batch_start(None, None, None, 0)
        assert KernelProfile._profiling is not None and sys.getprofile() is not None
        profile.on_exception(None, None, RuntimeError("a failed iteration"))
        assert KernelProfile._profiling is None and sys.getprofile() is None and KernelProfile.summary is None
    finally:
        KernelProfile.count = 0
        KernelProfile.discard()
