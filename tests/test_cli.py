"""The entry point as users type it: DDP on 2 CPU processes (gloo), multirun, and a failing sweep job that does
not end the sweep."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import SMALL_DCGAN, eval_overrides, run_cli

EVAL = eval_overrides()


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_keeps_ranks_identical_and_one_output_dir(tmp_path):
    run_dir = tmp_path / "ddp_run"
    result = run_cli(
        [
            "train.py",
            "debug=ddp",
            "hardware=cpu",
            "precision=32-true",
            "accumulate=2",
            "max_steps=6",
            "train.checkpoint_every_n_steps=3",
            "callbacks.ddp_check.every_n_steps=3",
            *SMALL_DCGAN,
            *EVAL,
            f"hydra.run.dir={run_dir}",
        ],
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((run_dir / "ddp_consistency.json").read_text())
    assert report["world_size"] == 2 and report["iteration"] == 6
    assert report["max_abs_diff"] == 0.0  # parameters AND buffers identical on both ranks
    # One gradient all-reduce per optimizer step (G and D, 6 iterations); none on the accumulation micro-steps.
    assert report["grad_allreduce_calls_per_rank"] == [12, 12]
    # One output dir for the run, not one per rank.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp_run"]
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["pixelsmith"]["iteration"] == 6
    assert state["pixelsmith"]["images_seen"] == 6 * 16 * 2  # global micro-batch 16 x accumulate 2

    # Evaluation under DDP (each rank generates half, features gathered) == one process on the same checkpoint.
    history = json.loads((run_dir / "eval_history.json").read_text())["history"]
    assert [h["iteration"] for h in history] == [0.0, 3.0, 6.0]
    eval_dir = tmp_path / "eval_run"
    result = run_cli(
        [
            "evaluate.py",
            f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
            "hardware=cpu",
            *EVAL,
            f"hydra.run.dir={eval_dir}",
        ]
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    single = json.loads((eval_dir / "metrics.json").read_text())["metrics"]
    assert single["num_generated"] == history[-1]["num_generated"] == 200
    assert single["fid"] == pytest.approx(history[-1]["fid"], rel=1e-6)
    assert single["precision"] == pytest.approx(history[-1]["precision"], abs=1e-9)


# Values that change nothing in a 2-step run, long enough together to exceed a 255-byte file name.
LONG_OVERRIDES = [
    ("nonfinite_max_consecutive", 21),
    ("keep_checkpoints", 4),
    ("sample_every_n_steps", 1000),
    ("checkpoint_every_n_steps", 1000),
    ("log_every_n_steps", 10),
    ("host_sync_check", "off"),
    ("auto_resume", "true"),
    ("overwrite", "false"),
    ("preemption.requeue", "true"),
    ("time_budget_minutes", "null"),
    ("clip_grad_norm", "null"),
    ("progress_bar", "false"),
]


@pytest.mark.slow
def test_multirun_runs_each_job_in_its_own_dir_and_survives_a_failing_job(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_cli(
        [
            "train.py",
            "-m",
            "debug=fast",
            "hardware=cpu",
            "precision=32-true,bf16-mixed",
            "max_steps=2,0",
            *SMALL_DCGAN,
            # A path value and many overrides: job dirs named from the overrides nested on the first and hit
            # "File name too long" on the second. Job dirs are numbered; the overrides are recorded inside.
            f"paths.root_dir={tmp_path}/some/nested/root",
            *[f"train.{key}={value}" for key, value in LONG_OVERRIDES],
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 4
    ok = [j for j in jobs if (j / "result.json").exists()]
    failed = [j for j in jobs if (j / "failed.json").exists()]
    assert len(ok) == 2 and len(failed) == 2
    assert sorted(j.name for j in jobs) == ["0", "1", "2", "3"]
    for job in ok:
        assert (job / "checkpoints" / "last.ckpt").exists()
        assert "max_steps=2" in json.loads((job / "result.json").read_text())["overrides"]
        assert "max_steps=2" in (job / ".hydra" / "overrides.yaml").read_text()
    for job in failed:
        assert "max_steps=0 must be at least 1" in json.loads((job / "failed.json").read_text())["error"]
    results = [json.loads((j / "result.json").read_text()) for j in ok]
    assert {r["metrics"].get("iteration") for r in results} == {2.0}
    # The sweep objective (conf/train.yaml `objective`) is the best FID of the job's evaluations, not a loss.
    for r in results:
        assert r["objective"] == "eval/best_fid" and r["value"] == r["metrics"]["eval/best_fid"] > 0
    assert "eval/best_fid" in (sweep / "summary.md").read_text()
    # The sweep's report.html compares the jobs and links each finished job's own report.
    report = (sweep / "report.html").read_text()
    assert report.count('/report.html">report</a>') == 2 and "eval/best_fid per job" in report
    assert "sweep summary" in result.stdout + result.stderr


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_bad_resume_path_names_the_fix(tmp_path):
    result = run_cli(["train.py", "hardware=cpu", "ckpt_path=/nope/last.ckpt", f"hydra.run.dir={tmp_path}/r"])
    assert result.returncode == 2
    text = result.stdout + result.stderr
    assert "ckpt_path='/nope/last.ckpt' does not exist" in text and "checkpoints/last.ckpt" in text
    assert "Traceback" not in text


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_a_run_and_its_resume_print_lightning_once_and_no_library_warnings(tmp_path):
    """Lightning's messages appeared twice (its own console handler and Hydra's); CSVLogger warned that it would
    delete the logs; a resume warned about weights_only."""
    common = [
        "train.py",
        "debug=fast",
        "hardware=cpu",
        "precision=32-true",
        *SMALL_DCGAN,
        f"hydra.run.dir={tmp_path}/r",
    ]
    for steps in (2, 3):  # the second run resumes the first (train.auto_resume)
        result = run_cli([*common, f"max_steps={steps}"])
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-3000:]
        assert output.count("GPU available") == 1, output[-3000:]
        assert "will be deleted" not in output and "weights_only" not in output, output[-3000:]
    assert "Resuming from" in output
