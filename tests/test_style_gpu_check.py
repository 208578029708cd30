"""benchmarks/gpu_check.py's style stage (8K stylize, style training against the plain loop, the no-sync runs), with
the canned children and table helpers of test_gpu_check.py; stylize runs for real."""

from __future__ import annotations

import pytest

from benchmarks import gpu_check
from tests.test_gpu_check import CPU, _header_is_complete, _table

pytestmark = pytest.mark.bench


@pytest.fixture
def cpu_here(monkeypatch):
    """The environment probe (a child that imports torch: seconds) answered at once."""
    monkeypatch.setattr(gpu_check, "probe_environment", lambda choice, work: CPU)


def test_the_style_stage_stylizes_for_real_and_tables_training_and_the_no_sync_runs(
    tmp_path, cpu_here, monkeypatch
):
    from benchmarks import style_bench

    def style_child(spec, timeout):
        if spec["kind"] == "plain":
            raise SystemExit("style bench child failed (plain 32-true):\nRuntimeError: the plain loop broke")
        assert (
            spec["kind"] != "peer" or spec["precision"] == "32-true"
        )  # fast_neural_style as published: fp32
        rate = {"template_graphed": 15.0, "peer": 10.0}.get(spec["kind"], 12.5)
        graphs = "uncaptured (no CUDA device)" if spec["kind"] == "template_graphed" else "eager"
        return {
            "kind": spec["kind"],
            "precision": spec["precision"],
            "img_per_s": rate,
            "median_iteration_ms": 80,
            "graphs": graphs,
        }

    real_run = gpu_check.run_bounded

    def no_sync_runs(command, timeout, log_path, env=None):
        if "train.py" not in command:
            if "benchmarks.style_folder" in command:
                # The peer timed once on fewer images; the stage's children share one compile cache.
                assert "--peer-once" in command and command[command.index("--peer-images") + 1] == "1"
                assert env is not None and env["PIXELSMITH_CACHE"]
            return real_run(command, timeout, log_path, env)  # the stylize child runs for real
        assert "train.host_sync_check=error" in command and "train.time_budget_minutes=null" in command
        if "model=stylegan2" in command:
            message = "RuntimeError: called a synchronizing CUDA operation\n"
            return gpu_check.StepOutcome(
                1, False, 5.0, log_path, "Traceback (most recent call last):\n" + message
            )
        if "experiment=style_fast" in command:
            return gpu_check.StepOutcome(None, True, timeout, log_path, "Training ...")
        return gpu_check.StepOutcome(0, False, 5.0, log_path, "done")

    monkeypatch.setattr(style_bench, "run_child", style_child)
    monkeypatch.setattr(gpu_check, "run_bounded", no_sync_runs)
    out = tmp_path / "out"
    assert gpu_check.main(["--stage", "style", "--out", str(out)]) == 1
    markdown, table = _table(out, "style")
    _header_is_complete(markdown, "style")
    rows = {r["step"]: r for r in table["rows"]}
    for fmt in ("PNG", "JPG"):
        stylized = rows[f"stylize 256x144 (tile=auto, 32-true) -> {fmt}"]
        assert stylized["status"] == "ok" and set(stylized["data"]["stages"]) == {
            "decode", "copy_in", "network", "blend", "copy_out", "encode",
        }  # fmt: skip
        assert stylized["data"]["stages"]["network"] > 0 and "network" in stylized["value"]
    assert "256x144 on cpu: the whole image" in rows["stylize 256x144 (tile=auto, 32-true)"]["value"]
    for fmt in (
        "JPG",
        "PNG",
    ):  # the folder benchmark ran for real, ours and the peer loop, with its target named
        folder = rows[f"stylize folder 128x96 (pipeline vs fast_neural_style) -> {fmt}"]
        assert folder["status"] == "ok" and "target >= " in folder["value"] and "TFLOP/s" in folder["value"]
    assert rows["style training 64 px b2 32-true, template"]["value"] == 12.5
    graphed = [
        r
        for r in table["rows"]
        if r["step"] == "style training 64 px b2 32-true, template, hardware.cuda_graphs=true"
    ]
    assert [r["value"] for r in graphed] == [15.0, "uncaptured (no CUDA device)"]  # the rate, and how it ran
    assert (
        rows["style training 64 px b2 32-true, fast_neural_style's method (fp32, as published)"]["value"]
        == 10.0
    )
    target = [
        r for r in table["rows"] if r["measure"].startswith("template with cuda_graphs / fast_neural_style")
    ]
    assert [(r["measure"], r["value"], r["status"]) for r in target] == [
        ("template with cuda_graphs / fast_neural_style (target >= 1.5)", "1.500", "info")
    ]  # the target as a ratio; a dry run's is information only
    plain = rows["style training 64 px b2 32-true, plain"]
    assert plain["status"] == "fail" and plain["value"] == "RuntimeError: the plain loop broke"
    assert rows["no host sync: main job (DCGAN, data on the device)"]["status"] == "ok"
    synced = rows["no host sync: StyleGAN2, lazy R1 through ADA"]
    assert synced["status"] == "fail" and "called a synchronizing CUDA operation" in synced["value"]
    assert rows["no host sync: style_fast (a DataLoader)"]["status"] == "timeout"
