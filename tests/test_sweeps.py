"""Optuna sweeps (hparams_search=gan_optuna): trials run as jobs, the study persists in SQLite so an interrupted
sweep resumes, evaluations prune bad trials, and summary.md gets the study with a plot and parameter importance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pixelsmith.paths import REPO_ROOT

optuna = pytest.importorskip("optuna")
pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")

TINY = [
    "hardware=cpu",
    "precision=32-true",
    "max_steps=4",
    "eval.every_n_steps=2",
    "eval.num_samples=200",
    "eval.reference_samples=1000",
    "data.limit=256",
    "train.progress_bar=false",
    "logger=csv",
    "model.generator.ngf=16",
    "model.discriminator.ndf=16",
]


def _sweep_args(tmp_path: Path, name: str, trials: int) -> list[str]:
    return [
        sys.executable,
        str(REPO_ROOT / "train.py"),
        "-m",
        "hparams_search=gan_optuna",
        f"hydra.sweeper.n_trials={trials}",
        f"hydra.sweeper.storage=sqlite:///{tmp_path}/studies/gan.db",  # its folder is created by the sweep
        *TINY,
        f"hydra.sweep.dir={tmp_path / name}",
    ]


def _study(tmp_path: Path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="gan_optuna", storage=f"sqlite:///{tmp_path}/studies/gan.db")


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_from_its_storage(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    # The first sweep is killed while its second trial trains: trial 0 is complete, trial 1 left running.
    proc = subprocess.Popen(
        _sweep_args(tmp_path, "first", 5),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not (tmp_path / "first" / "0" / "result.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    while not (tmp_path / "first" / "1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    states = [t.state.name for t in _study(tmp_path).trials]
    assert states[0] == "COMPLETE" and "RUNNING" in states[1:]

    result = subprocess.run(
        _sweep_args(tmp_path, "second", 2), cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials].count("COMPLETE") == 3  # the first sweep's trial counts too
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in trials)  # the stale one marked failed
    summary = (tmp_path / "second" / "summary.md").read_text()
    assert "## Optuna study `gan_optuna`" in summary and "importance" in summary
    assert f"| {trials[0].number} | complete |" in summary  # the whole study, not only this invocation
    assert (tmp_path / "second" / "optuna_objective.png").stat().st_size > 1000
    for job in ("0", "1"):  # each trial a job dir with its result
        assert (tmp_path / "second" / job / "result.json").is_file()


def test_a_trial_worse_than_the_median_is_pruned_at_its_evaluation(tmp_path):
    from pixelsmith.callbacks.optuna_pruning import OptunaPruning, find_trial

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=storage)
    for value in (10.0, 12.0, 14.0):  # three earlier trials reported these at iteration 2
        trial = study.ask({"lr": optuna.distributions.LogUniformDistribution(1e-5, 1e-2)})
        trial.report(value, step=2)
        study.tell(trial, value)
    running = study.ask({"lr": optuna.distributions.LogUniformDistribution(1e-5, 1e-2)})
    lr = running.params["lr"]
    assert find_trial(study, ["max_steps=4", f"lr={lr}"]).number == running.number
    assert find_trial(study, ["max_steps=4", "lr=0.5"]) is None

    def evaluate(fid: float) -> SimpleNamespace:
        running = study.ask({"lr": optuna.distributions.LogUniformDistribution(1e-5, 1e-2)})  # a new trial
        pruning = OptunaPruning(storage, "s", n_startup_trials=3)
        pruning.trial = optuna.trial.Trial(
            optuna.load_study(study_name="s", storage=storage, pruner=optuna.pruners.MedianPruner(3)),
            running._trial_id,
        )
        evaluation = SimpleNamespace(monitor="fid", history=[{"iteration": 2.0, "fid": fid}])
        trainer = SimpleNamespace(callbacks=[evaluation], world_size=1, should_stop=False)
        pruning.on_train_batch_end(trainer, SimpleNamespace(iteration=2), None, None, 0)
        return SimpleNamespace(stopped=trainer.should_stop, metrics=pruning.final_metrics())

    assert evaluate(11.0).stopped is False  # better than the median (12): trains on
    worse = evaluate(50.0)
    assert worse.stopped and worse.metrics == {"optuna/pruned_at": 2.0}


def test_rank_correlation_importance_finds_the_parameter_that_matters():
    from pixelsmith.optuna_report import importances

    trials = [
        {
            "value": 100.0 - 10 * i,
            "params": {"lr": 1e-4 * (i + 1), "noise": [3, 1, 2, 0, 4][i], "opt": "ab"[i % 2]},
        }
        for i in range(5)
    ]
    weights = importances(trials)
    assert max(weights, key=weights.get) == "lr" and weights["lr"] > 0.5
    assert sum(weights.values()) == pytest.approx(1.0)
    assert importances(trials[:2]) == {}  # too few trials to say
