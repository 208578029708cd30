"""`python -m benchmarks.gpu_check`: each stage's logic on a CPU, its table, and what a failing, hanging or
time-starved sub-step becomes (a row that says so, never a crash). The sub-steps that take minutes (GPU benchmark
cells, style training runs) are replaced by canned results here; the pytest, train and stylize paths run for real,
shrunk."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import Deadline, Environment, parse_pytest_output, run_bounded

pytestmark = pytest.mark.bench

CPU = Environment(
    device="cpu",
    device_name="Test CPU (2 logical CPUs)",
    torch="2.14.1",
    cuda=None,
    cudnn=None,
    driver=None,
    python="3.11.7",
)

# What `pytest -m gpu -v -ra --durations=20` printed on a GPU machine (shortened; the names are the GPU set's).
CANNED_PYTEST = """\
============================= test session starts ==============================
platform linux -- Python 3.12.3, pytest-8.3.4, pluggy-1.5.0 -- /usr/bin/python
pixelsmith test selection: gpu (`pytest --all` runs every test, as CI does)
rootdir: /app
configfile: pyproject.toml
collecting ... collected 40 items / 2 deselected / 4 selected

tests/test_gpu.py::test_gan_trains_on_the_gpu[auto] PASSED               [ 25%]
tests/test_gpu.py::test_gan_trains_on_the_gpu[auto-32-true] FAILED       [ 50%]
tests/test_gpu.py::test_gpu_memory_is_released_after_a_run SKIPPED (CUDA memory counters) [ 75%]
tests/test_gpu.py::test_a_sync_outside_the_step_fails_the_whole_loop_check[the batch fetch] ERROR [100%]

=================================== FAILURES ===================================
___________________ test_gan_trains_on_the_gpu[auto-32-true] ___________________
E       AssertionError: nothing was compiled | counters empty
============================= slowest 20 durations =============================
48.31s call     tests/test_gpu.py::test_gan_trains_on_the_gpu[auto]
12.02s setup    tests/test_gpu.py::test_a_sync_outside_the_step_fails_the_whole_loop_check[the batch fetch]
0.51s teardown tests/test_gpu.py::test_gan_trains_on_the_gpu[auto]
=========================== short test summary info ============================
SKIPPED [1] tests/test_gpu.py:214: CUDA memory counters
FAILED tests/test_gpu.py::test_gan_trains_on_the_gpu[auto-32-true] - AssertionError: nothing was compiled | counters
ERROR tests/test_gpu.py::test_a_sync_outside_the_step_fails_the_whole_loop_check[the batch fetch] - RuntimeError: boom
====== 1 failed, 1 passed, 1 skipped, 2 deselected, 3 warnings, 1 error in 301.55s (0:05:01) ======
"""


def test_the_pytest_parser_reads_counts_failures_and_the_slowest_tests():
    summary = parse_pytest_output(CANNED_PYTEST)
    assert summary.counts == {
        "failed": 1,
        "passed": 1,
        "skipped": 1,
        "deselected": 2,
        "warnings": 3,
        "errors": 1,
    }
    assert summary.seconds == 301.55
    assert summary.failures == [
        ("FAILED", "tests/test_gpu.py::test_gan_trains_on_the_gpu[auto-32-true]", "AssertionError: nothing was compiled | counters"),
        ("ERROR", "tests/test_gpu.py::test_a_sync_outside_the_step_fails_the_whole_loop_check[the batch fetch]", "RuntimeError: boom"),
    ]  # fmt: skip
    assert summary.slowest[0] == (48.31, "call", "tests/test_gpu.py::test_gan_trains_on_the_gpu[auto]")
    assert [s[1] for s in summary.slowest] == ["call", "setup", "teardown"]
    assert summary.outcomes["tests/test_gpu.py::test_gpu_memory_is_released_after_a_run"] == "SKIPPED"
    assert summary.running is None  # the run finished


def test_a_pytest_run_cut_off_is_counted_from_its_lines_and_names_the_test_it_was_in():
    cut_off = (
        "\n".join(CANNED_PYTEST.splitlines()[:9])
        + "\ntests/test_gpu.py::test_evaluate_and_stylize_run_on_cuda "
    )
    summary = parse_pytest_output(cut_off)
    assert summary.counts == {"passed": 1, "failed": 1} and summary.seconds is None
    assert summary.running == "tests/test_gpu.py::test_evaluate_and_stylize_run_on_cuda"


def test_a_sub_step_that_hangs_is_killed_with_its_children_at_its_limit(tmp_path):
    """A child whose own child holds the output open (a compile or loader worker) is no reason to wait."""
    hang = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
    hang += "print('started', flush=True); time.sleep(120)"
    started = time.monotonic()
    outcome = run_bounded([sys.executable, "-c", hang], 3.0, tmp_path / "hang.log")
    assert time.monotonic() - started < 30
    assert outcome.timed_out and outcome.returncode is None and not outcome.ok
    assert "started" in outcome.output and outcome.problem().startswith("timed out after 3 s")
    failing = run_bounded(
        [sys.executable, "-c", "raise SystemExit('bad value: x=3')"], 60.0, tmp_path / "f.log"
    )
    assert failing.returncode == 1 and failing.problem() == "exit 1: bad value: x=3"


def test_the_deadline_cuts_each_sub_step_to_what_is_left():
    now = [0.0]
    deadline = Deadline(100.0, clock=lambda: now[0])
    assert deadline.timeout_for(60.0) == 60.0
    now[0] = 50.0
    assert deadline.timeout_for(60.0) == 100.0 - 50.0 - gpu_check.RESERVE_SECONDS
    now[0] = 100.0 - gpu_check.RESERVE_SECONDS - gpu_check.MIN_STEP_SECONDS + 1
    assert deadline.timeout_for(60.0) is None  # too little left: skipped, and said


def test_without_cuda_the_device_is_a_cpu_dry_run_and_cuda_is_refused(monkeypatch, tmp_path):
    probe = json.dumps({"torch": "2.14.1", "cuda": None, "cuda_available": False, "python": "3.11.7"})

    def fake_run(command, timeout, log_path, env=None):
        return gpu_check.StepOutcome(0, False, 0.1, log_path, probe + "\n")

    monkeypatch.setattr(gpu_check, "run_bounded", fake_run)
    env = gpu_check.probe_environment("auto", tmp_path)
    assert env.device == "cpu" and env.dry_run and "logical CPUs" in env.device_name
    with pytest.raises(gpu_check.NoCudaError, match="--device cuda, but torch sees no CUDA device"):
        gpu_check.probe_environment("cuda", tmp_path)


@pytest.fixture
def cpu_here(monkeypatch):
    """The environment probe (a child that imports torch: seconds) answered at once."""
    monkeypatch.setattr(gpu_check, "probe_environment", lambda choice, work: CPU)


def _table(out: Path, stage: str) -> tuple[str, dict]:
    return (out / f"{stage}.md").read_text(), json.loads((out / f"{stage}.json").read_text())


def _header_is_complete(markdown: str, stage: str) -> None:
    assert markdown.startswith(f"# GPU check: {stage}\n")
    assert "**Test CPU (2 logical CPUs)** (cpu)" in markdown and "torch 2.14.1" in markdown
    assert f"`python -m benchmarks.gpu_check --stage {stage}" in markdown
    assert "CPU dry-run numbers, not GPU figures" in markdown
    assert markdown.count("\n|---") == 1  # one table


FAKE_TESTS = """
import time, pytest

def test_passes():
    time.sleep(0.05)  # above pytest's durations-min: listed among the slowest

def test_fails():
    time.sleep(0.05)
    assert 1 == 2, "one is not two"

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

def test_sleeps_if_asked():
    import os
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
"""


def test_the_tests_stage_runs_pytest_and_tables_counts_failures_and_durations(tmp_path, cpu_here):
    tests = tmp_path / "test_fake.py"
    tests.write_text(FAKE_TESTS)
    out = tmp_path / "out"
    code = gpu_check.main(["--stage", "tests", "--out", str(out), "--pytest-args", str(tests)])
    assert code == 1  # a test failed
    markdown, table = _table(out, "tests")
    _header_is_complete(markdown, "tests")
    assert table["columns"] == ["row", "what", "result", "detail", "status"]
    rows = table["rows"]
    assert rows[0]["row"] == "pytest" and rows[0]["result"] == "1 failed, 2 passed, 1 skipped"
    assert rows[0]["status"] == "fail" and rows[0]["data"]["counts"]["failed"] == 1
    (failed,) = [r for r in rows if r["row"] == "failed"]
    assert failed["what"].endswith("test_fake.py::test_fails") and "one is not two" in failed["detail"]
    assert {r["what"].rsplit("::", 1)[-1] for r in rows if r["row"] == "slow"} >= {
        "test_passes",
        "test_fails",
    }


def test_a_pytest_selection_that_selects_nothing_fails_the_tests_stage(tmp_path, cpu_here):
    """pytest exits 5 when no test is selected: tabled as a failure saying so, never "ok"."""
    tests = tmp_path / "test_fake.py"
    tests.write_text(FAKE_TESTS)
    out = tmp_path / "out"
    code = gpu_check.main(
        ["--stage", "tests", "--out", str(out), "--pytest-args", f"{tests} -k nothingmatches"]
    )
    assert code == 1
    (row,) = _table(out, "tests")[1]["rows"]
    assert row["status"] == "fail" and row["data"]["returncode"] == 5
    assert row["result"].startswith("no test was selected:") and "4 deselected" in row["result"]


def test_a_pytest_run_past_the_stage_limit_becomes_a_timeout_row_naming_the_test(
    tmp_path, cpu_here, monkeypatch
):
    tests = tmp_path / "test_fake.py"
    tests.write_text(FAKE_TESTS)
    monkeypatch.setenv("FAKE_SLEEP", "120")
    out = tmp_path / "out"
    limit = gpu_check.RESERVE_SECONDS + 12  # 12 s for pytest itself
    code = gpu_check.main(
        ["--stage", "tests", "--out", str(out), "--pytest-args", str(tests), "--time-limit", str(limit)]
    )
    assert code == 1
    rows = _table(out, "tests")[1]["rows"]
    assert rows[0]["status"] == "timeout" and re.match(
        r"timed out after 1\d s; before that:", rows[0]["result"]
    )
    assert "1 passed" in rows[0]["result"] and "1 failed" in rows[0]["result"]
    (running,) = [r for r in rows if r["row"] == "running at the time limit"]
    assert running["what"].endswith("test_fake.py::test_sleeps_if_asked")


def test_the_train_stage_tables_the_main_job_shrunk_for_a_cpu(tmp_path, cpu_here):
    out = tmp_path / "out"
    assert gpu_check.main(["--stage", "train", "--out", str(out)]) == 0
    markdown, table = _table(out, "train")
    _header_is_complete(markdown, "train")
    rows = {r["measure"]: r for r in table["rows"]}
    assert "train.time_budget_minutes=null" in rows["command"]["value"]
    assert rows["process"]["status"] == "ok"
    assert rows["iterations, stop reason"]["value"] == "4 of 4, max_steps"
    curve = rows["FID curve (iteration: FID, eval_history.json)"]["data"]["fid_curve"]
    assert [iteration for iteration, _ in curve] == [0, 2, 4] and all(fid > 0 for _, fid in curve)
    assert any(key.startswith("img/s") for key in rows) and not any("target" in key for key in rows)


def test_a_train_run_that_fails_becomes_rows_that_say_so(tmp_path, cpu_here, monkeypatch):
    def failing_run(command, timeout, log_path, env=None):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return gpu_check.StepOutcome(
            1, False, 4.0, log_path, "Traceback ...\nRuntimeError: CUDA error: boom\n"
        )

    monkeypatch.setattr(gpu_check, "run_bounded", failing_run)
    out = tmp_path / "out"
    assert gpu_check.main(["--stage", "train", "--out", str(out)]) == 1
    rows = {r["measure"]: r for r in _table(out, "train")[1]["rows"]}
    assert rows["process"] == {
        "measure": "process",
        "value": "exit 1: RuntimeError: CUDA error: boom",
        "status": "fail",
        "data": rows["process"]["data"],
    }
    assert rows["iterations, stop reason"]["value"] == "no result"
    assert rows["FID curve (iteration: FID, eval_history.json)"]["status"] == "fail"


def _canned_gan_child(times_out: set[str], fails: set[str]):
    """A stand-in for `gan_bench.run_child`: img/s by kind (template half the graph's), a failure and a hang."""
    rates = {"template": 1000.0, "plain": 1020.0, "graphed": 2000.0}

    def run_child(spec, timeout):
        # gan_bench's kind for the template with its own CUDA graphs; the stage's own name for it is template_graphs
        kind = "template_graphs" if spec["kind"] == "template_graphed" else spec["kind"]
        cell = spec["cell"]
        assert "train.time_budget_minutes=null" in spec["extra_overrides"]
        if f"{cell['precision']} {kind}" in times_out:
            raise subprocess.TimeoutExpired("python -m benchmarks.gan_bench --child", timeout)
        if f"{cell['precision']} {kind}" in fails:
            return {
                "kind": spec["kind"],
                "cell": cell,
                "error": "exit 1: Traceback\nRuntimeError: capture failed",
            }
        rate = rates.get(kind, 1500.0) * (2.0 if cell["precision"] == "bf16-mixed" else 1.0)
        result = {"kind": spec["kind"], "cell": cell, "img_per_s": rate}
        if spec["count_flops"]:
            result["flops_per_iteration"] = 4e9
        if spec["kind"].startswith("template"):  # the run's start-up metrics
            result["startup"] = {"captures": 2.0, "replays": 58.0, "recompiles": 1.0, "graphs_given_up": 0.0}
        if spec["profile_iterations"]:  # what harness.profile_summary gives on a GPU
            top = [
                {"name": "sm90_xmma_fprop", "calls": 3.0, "us": 400.0},
                {"name": "adam", "calls": 2.0, "us": 9.5},
            ]
            result["profile"] = {
                "timed": "device kernels",
                "ms_per_iteration": 1.5,
                "count_per_iteration": 212.0,
                "top": top,
                "wall_ms_per_iteration": 2.25,
                "python_top": [
                    {
                        "function": "lightning/x.py:9(advance)",
                        "calls": 1.0,
                        "self_us": 41.0,
                        "total_us": 900.0,
                    }
                ],
            }
        return result

    return run_child


def test_the_bench_stage_tables_every_cell_mfu_and_the_targets_ratios(tmp_path, cpu_here, monkeypatch):
    from benchmarks import gan_bench

    monkeypatch.setattr(
        gan_bench, "run_child", _canned_gan_child({"32-true graphed"}, {"bf16-mixed template_graphs"})
    )
    monkeypatch.setattr(gpu_check, "peak_flops", lambda precision, env: (1e12, "test peak"))
    out = tmp_path / "out"
    assert gpu_check.main(["--stage", "bench", "--out", str(out)]) == 1  # a failed and a timed-out cell
    markdown, table = _table(out, "bench")
    _header_is_complete(markdown, "bench")
    assert table["columns"] == [
        "cell", "kind", "img_per_s", "ms_per_iteration", "kernels_per_iteration", "mfu", "gflop_per_iteration",
        "result", "status",
    ]  # fmt: skip
    rows = {(r["cell"], r["kind"]): r for r in table["rows"]}
    bf16, fp32 = "DCGAN-32 b8 bf16-mixed", "DCGAN-32 b8 32-true"
    template = rows[bf16, "template"]
    assert template["img_per_s"] == 2000.0 and template["status"] == "ok"
    assert template["mfu"] == f"{100 * 4e9 * 2000.0 / 8 / 1e12:.1f}%"  # FLOPs x iterations/s / peak
    assert template["gflop_per_iteration"] == 4.0
    # The DCGAN runs profile iterations after their window: the device's work per iteration, costliest kernels first.
    assert template["kernels_per_iteration"] == (
        "1.50 ms in 212 kernels; costliest: sm90_xmma_fprop 400 us; adam 10 us"
    )
    assert rows["StyleGAN2-32 tiny b4 bf16-mixed", "plain loop"]["kernels_per_iteration"] is None
    # And where the eager kinds' host time goes, in the notes (the graphed kinds' host only launches graphs).
    host = "an iteration under the profilers): `lightning/x.py:9(advance)` 41 us."
    assert f"Host, DCGAN-32 b8 bf16-mixed, plain loop (2.2 ms {host}" in markdown
    assert f"Host, DCGAN-32 b8 32-true, template (2.2 ms {host}" in markdown
    assert "Host, DCGAN-32 b8 32-true, hand-captured" not in markdown
    # What the run did besides training: graphs and replays for the graphed kinds, recompiles for the template's.
    graphed = rows[fp32, "template, hardware.cuda_graphs=true"]["result"]
    assert graphed.endswith("timed iterations; 2 graph(s) captured, 58 replays, 1 recompile(s)")
    assert template["result"].endswith("timed iterations; 1 recompile(s)")
    failed = rows[bf16, "template, hardware.cuda_graphs=true"]
    assert failed["status"] == "fail" and "RuntimeError: capture failed" in failed["result"]
    hung = rows[fp32, "hand-captured graph (plain step)"]
    assert hung["status"] == "fail" and hung["result"] == "timed out after 240 s (killed)"
    assert rows["StyleGAN2-32 tiny b4 bf16-mixed", "plain loop"]["status"] == "ok"
    ratios = {r["kind"]: r for r in table["rows"] if r["cell"] == "ratio"}
    assert ratios["bf16 / fp32, template (target >= 1)"]["result"] == "2.000"
    assert ratios["bf16 / fp32, plain loop (target >= 1)"]["result"] == "2.000"
    missing_fp32 = ratios["bf16 / fp32, hand-captured graph (target >= 1)"]  # the fp32 graph timed out
    assert missing_fp32["result"] == "n/a (a run is missing)"
    # Iteration time ratio = plain img/s / template img/s: 1530 / 1500.
    assert ratios["iteration time, template eager / plain loop (bf16; target <= 1.15)"]["result"] == "1.020"
    missing = ratios["template with cuda_graphs / hand-captured graph (bf16; target >= 0.9)"]
    assert missing["result"] == "n/a (a run is missing)" and missing["status"] == "n/a"
    assert all(r["status"] in ("info", "n/a") for r in ratios.values())  # a dry run checks no target


def test_bench_cells_past_the_stage_limit_are_rows_saying_no_time_was_left(tmp_path, cpu_here, monkeypatch):
    from benchmarks import gan_bench

    now = [0.0]
    canned = _canned_gan_child(set(), set())

    def slow_child(spec, timeout):
        now[0] += 100.0  # every cell takes 100 s of the stage's 540
        return canned(spec, timeout)

    monkeypatch.setattr(gan_bench, "run_child", slow_child)
    monkeypatch.setattr(gpu_check, "Deadline", lambda seconds: Deadline(seconds, clock=lambda: now[0]))
    monkeypatch.setattr(gpu_check, "peak_flops", lambda precision, env: (1e12, "test peak"))
    out = tmp_path / "out"
    gpu_check.main(["--stage", "bench", "--out", str(out)])
    rows = [r for r in _table(out, "bench")[1]["rows"] if r["cell"] != "ratio"]
    ran = [r for r in rows if r["status"] == "ok"]
    skipped = [r for r in rows if r["status"] == "skip"]
    assert len(ran) == 6 and len(ran) + len(skipped) == len(rows) == 11
    assert all(r["result"] == "skipped: no time left in the stage's 540 s" for r in skipped)
    # The first cell's five kinds ran first (the DCGAN ratios need them), then the later cells' graphed templates.
    assert {(r["cell"], r["kind"]) for r in ran} == {
        ("DCGAN-32 b8 bf16-mixed", kind) for kind in gpu_check.KIND_LABELS.values()
    } | {("DCGAN-32 b8 32-true", "template, hardware.cuda_graphs=true")}


# ---- --all and the startup stage ------------------------------------------------------------------------------------
def test_all_runs_every_stage_in_priority_order_within_its_share_and_summarises_targets(
    tmp_path, cpu_here, monkeypatch
):
    calls = []

    def fake(stage, rows):
        def runner(args, env, report, deadline):
            calls.append((stage, round(args.time_limit), args.pytest_args, args.only))
            for row in rows:
                report.add(**row)

        return runner

    monkeypatch.setattr(
        gpu_check,
        "RUNNERS",
        {
            "tests": fake("tests", [{"row": "pytest", "what": "x", "result": "3 passed", "status": "ok"}]),
            "train": fake(
                "train", [{"measure": "target: img/s", "value": "0.50x of it", "status": "not met"}]
            ),
            "bench": fake("bench", []),
            "startup": fake(
                "startup",
                [
                    {
                        "preset": "stylegan2_paper256",
                        "cache": "cold",
                        "first_iteration": "41.0 s",
                        "status": "met",
                    }
                ],
            ),
            "style": fake(
                "style", [{"step": "8K", "measure": "folder", "value": "timed out", "status": "timeout"}]
            ),
        },
    )
    out = tmp_path / "out"
    code = gpu_check.main(["--all", "--time-limit", "1000", "--out", str(out)])
    assert code == 1  # the style row timed out
    assert [c[0] for c in calls] == ["tests", "train", "bench", "startup", "style"]
    # Shares of the limit: 30% for the fix tests, 15% main job, 15% DCGAN, 25% start-up; style gets what is left.
    assert [c[1] for c in calls[:4]] == [300, 150, 150, 250] and calls[4][1] > 100
    assert "reduce-overhead" in calls[0][2] and "r3gan" in calls[0][2] and "jpeg_zip" in calls[0][2]
    assert calls[3][3] and "stylegan2_paper256" in calls[3][3]
    summary = (out / "all.md").read_text()
    assert "| train | target: img/s | 0.50x of it | not met |" in summary
    assert "| startup | stylegan2_paper256 cold | 41.0 s | met |" in summary
    assert "| style | 8K folder | timed out | timeout |" in summary
    assert (out / "tests.md").is_file() and (out / "startup.md").is_file()  # each stage keeps its own table


def test_all_with_too_little_time_says_which_stages_were_skipped(tmp_path, cpu_here, monkeypatch):
    ran = []
    monkeypatch.setattr(
        gpu_check,
        "RUNNERS",
        {stage: (lambda args, env, report, deadline, s=stage: ran.append(s)) for stage in gpu_check.STAGES},
    )
    out = tmp_path / "out"
    assert gpu_check.main(["--all", "--time-limit", "60", "--out", str(out)]) == 0
    summary = json.loads((out / "all.json").read_text())
    skipped = [r["stage"] for r in summary if r["status"] == "skipped for time"]
    # 60 s: the fix tests get their 30% (18 s); the main job's and DCGAN's 15% (9 s) are too short to start.
    assert ran[0] == "tests" and {"train", "bench"} <= set(skipped) and set(skipped).isdisjoint(ran)


def test_the_startup_stage_tables_each_preset_cold_and_warm_against_the_targets(tmp_path, monkeypatch):
    from benchmarks import startup

    gpu = Environment("cuda", "NVIDIA H100", "2.14.1", "13.0", 91000, "580", "3.12")
    monkeypatch.setattr(gpu_check, "probe_environment", lambda choice, work: gpu)

    def canned(rows, caches, work, timeout, deadline=None):
        seconds = {"cold": 75.0, "warm": 12.0}
        for row in rows[:1]:
            for state in caches:
                metrics = {
                    "startup/first_iteration_s": seconds[state],
                    "startup/compile_s": 50.0,
                    "startup/compile_s/G": 30.0,
                    "startup/compile_s/D": 20.0,
                    "startup/graphs": 4.0,
                    "startup/recompiles": 2.0,
                    "startup/graph_breaks": 0.0,
                    "img/s": 300.0,
                }
                yield row, state, {"label": row.label, "metrics": metrics}
        for row in rows[1:2]:
            yield row, "cold", {"label": row.label, "problem": "skipped: no time left"}

    monkeypatch.setattr(startup, "measure", canned)
    out = tmp_path / "out"
    gpu_check.main(["--stage", "startup", "--out", str(out)])
    _, table = _table(out, "startup")
    rows = table["rows"]
    assert [(r["preset"], r["cache"], r["status"]) for r in rows] == [
        ("stylegan2_paper256", "cold", "not met"),  # 75 s > 60 s from an empty cache
        ("stylegan2_paper256", "warm", "met"),  # 12 s <= 20 s
        ("r3gan_ffhq64", "cold", "skip"),
    ]
    assert rows[0]["counts"] == "4 / 2 / 0" and "G 30.0 s" in rows[0]["compile"]


def test_the_bench_stage_tables_stylegan2_per_phase_against_nvlabs_networks(tmp_path, monkeypatch):
    """With --nvlabs-path, sg2_reference's result line becomes one row per phase with the ratio against the 1.5x
    target; a failed reference run becomes a row that says so."""
    from benchmarks.sg2_reference import RESULT_PREFIX

    gpu = Environment("cuda", "NVIDIA H100", "2.14.1", "13.0", 91000, "580", "3.12")
    report = gpu_check.StageReport("bench", gpu_check.COLUMNS["bench"], gpu, "cmd", 100, tmp_path, tmp_path)
    rates = {
        "ours (fir)": {"Gmain": 300.0, "Dmain": 150.0, "R1": 90.0},
        "NVlabs": {"Gmain": 100.0, "Dmain": 100.0, "R1": 100.0},
    }
    seen = {}

    def reference_run(command, timeout, log_path, env=None):
        seen["command"] = command
        output = (
            "table\n"
            + RESULT_PREFIX
            + json.dumps({"rates": rates, "header": "NVlabs' custom CUDA ops built"})
        )
        return gpu_check.StepOutcome(0, False, 12.0, log_path, output)

    monkeypatch.setattr(gpu_check, "run_bounded", reference_run)
    args = type("Args", (), {"nvlabs_path": "/x/nvlabs", "step_limit": 100.0, "only": None})()
    gpu_check._nvlabs_phases(args, gpu, report, Deadline(100.0))
    assert (
        "--nvlabs-fp16" in seen["command"] and "16384" in seen["command"] and "--compile" in seen["command"]
    )
    assert [(r["kind"], r["status"]) for r in report.rows] == [
        ("Gmain", "met"),
        ("Dmain", "met"),
        ("R1", "not met"),
    ]
    assert report.rows[2]["result"].startswith("0.90x NVlabs' 100.0 img/s")

    def failing(command, timeout, log_path, env=None):
        return gpu_check.StepOutcome(
            1, False, 3.0, log_path, "Traceback\nImportError: no training/networks.py"
        )

    monkeypatch.setattr(gpu_check, "run_bounded", failing)
    report.rows = []
    gpu_check._nvlabs_phases(args, gpu, report, Deadline(100.0))
    assert report.rows[0]["status"] == "fail" and "ImportError" in report.rows[0]["result"]


def test_the_iteration_profile_finds_the_logging_iterations_and_the_steady_pace():
    # Warm-up 9: the window's first iteration is 10, a logging one (BENCH_LOG_EVERY = 10), as is the 11th (20).
    cell = gpu_check.BenchCell("c", "dcgan", "bf16-mixed", 8, 32, gpu_check.ALL_KINDS, warmup=9, steps=20)
    seconds = [0.010 if index % 10 == 0 else 0.001 for index in range(20)]
    profile = gpu_check.iteration_profile(seconds, cell, "template_graphs")
    assert profile["mean"] == pytest.approx((2 * 10.0 + 18 * 1.0) / 20)
    assert profile["median"] == pytest.approx(1.0) and profile["logging"] == pytest.approx(10.0)
    assert profile["max"] == pytest.approx(10.0) and profile["steady"] == pytest.approx(1.0)
    # The plain loop and the quiet kind log nothing: no logging column for them.
    assert gpu_check.iteration_profile(seconds, cell, "plain")["logging"] is None
    assert gpu_check.iteration_profile(seconds, cell, "template_graphs_quiet")["logging"] is None


def test_a_logging_iterations_cost_comes_from_the_quiet_graphed_run(tmp_path, cpu_here, monkeypatch):
    """The quiet kind runs with train.log_every_n_steps past the window; its rate against the logging run's gives
    a logging iteration's wall time in ordinary iterations: 1 + (quiet / logging - 1) x 10."""
    from benchmarks import gan_bench

    seen_overrides = {}

    def run_child(spec, timeout):
        quiet = "train.log_every_n_steps=4" in spec["extra_overrides"]  # the dry-run cell: 1 + 2 + 1
        kind = "template_graphs_quiet" if quiet else spec["kind"]
        seen_overrides[kind, spec["cell"]["precision"]] = spec["extra_overrides"]
        rate = {"template_graphed": 1000.0, "template_graphs_quiet": 1100.0}.get(kind, 500.0)
        return {"kind": spec["kind"], "cell": spec["cell"], "img_per_s": rate}

    monkeypatch.setattr(gan_bench, "run_child", run_child)
    monkeypatch.setattr(gpu_check, "peak_flops", lambda precision, env: (1e12, "test peak"))
    out = tmp_path / "out"
    gpu_check.main(["--stage", "bench", "--out", str(out)])
    assert "train.log_every_n_steps=10" in seen_overrides["template_graphed", "bf16-mixed"]
    ratios = {r["kind"]: r for r in _table(out, "bench")[1]["rows"] if r["cell"] == "ratio"}
    cost = ratios[
        "a logging iteration, in ordinary iterations (template with cuda_graphs, bf16; target <= 1.5)"
    ]
    assert cost["result"] == "2.000"


def test_a_main_job_without_rates_in_metrics_csv_takes_final_metrics_and_says_so(
    tmp_path, cpu_here, monkeypatch
):
    def finished_run(command, timeout, log_path, env=None):
        run_dir = Path(next(a for a in command if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.csv").write_text("loss/D,step\n0.5,9\n")  # no img/s column
        (run_dir / "final_metrics.json").write_text(
            json.dumps({"img/s": 1234.0, "iteration": 4, "stop_reason": "max_steps"})
        )
        (run_dir / "config_resolved.yaml").write_text("data:\n  batch_size: 16\nmax_steps: 4\n")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return gpu_check.StepOutcome(0, False, 1.0, log_path, "")

    monkeypatch.setattr(gpu_check, "run_bounded", finished_run)
    out = tmp_path / "out"
    gpu_check.main(["--stage", "train", "--out", str(out)])
    rows = {r["measure"]: r for r in _table(out, "train")[1]["rows"]}
    assert rows["img/s source"]["value"] == "final_metrics.json (metrics.csv: columns loss/D, step)"
    assert rows["img/s (median of the logged rates after the first two; it/s)"]["value"].startswith(
        "1,234 img/s"
    )
