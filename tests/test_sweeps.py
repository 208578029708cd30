"""Optuna sweeps (hparams_search=gan_optuna) on the pixelsmith_optuna sweeper (src/hydra_plugins): trials run as jobs,
the study persists in SQLite so an interrupted sweep resumes, evaluations prune bad trials, and summary.md gets the
study with a plot and parameter importance.

The sweeper's own bookkeeping (continuing a study, failing stale trials, recording pruned and failed jobs, the search
space) is tested in-process with a stand-in launcher whose "jobs" act on the study as the training jobs do; the slow
tests run the real command end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_plugins.pixelsmith_optuna_sweeper.optuna_sweeper import (
    PRUNED_AT_ATTR,
    TRIAL_NUMBER_ENV,
    OptunaSweeper,
    search_space,
)
from pixelsmith.config.paths import REPO_ROOT

optuna = pytest.importorskip("optuna", minversion="4.0")  # the range pyproject.toml declares
FloatDistribution = optuna.distributions.FloatDistribution
IntDistribution = optuna.distributions.IntDistribution
CategoricalDistribution = optuna.distributions.CategoricalDistribution
TrialState = optuna.trial.TrialState
LOG_LR = FloatDistribution(1e-5, 1e-2, log=True)

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


def _sweep_args(tmp_path: Path, name: str, trials: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(REPO_ROOT / "train.py"),
        "-m",
        "hparams_search=gan_optuna",
        f"hydra.sweeper.n_trials={trials}",
        f"hydra.sweeper.storage=sqlite:///{tmp_path}/studies/gan.db",  # its folder is created by the sweep
        *TINY,
        *extra,
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
    # Every job found its own trial and reported both evaluations to it (what pruning decides on).
    assert all(sorted(t.intermediate_values) == [2, 4] for t in trials if t.state.name == "COMPLETE")
    # The continued sampler does not replay the first sweep's random start-up draws.
    first_of_second = next(t for t in trials[1:] if t.state.name == "COMPLETE")
    assert first_of_second.params != trials[0].params
    summary = (tmp_path / "second" / "summary.md").read_text()
    assert "## Optuna study `gan_optuna`" in summary and "importance" in summary
    assert f"| {trials[0].number} | complete |" in summary  # the whole study, not only this invocation
    assert (tmp_path / "second" / "optuna_objective.png").stat().st_size > 1000
    for job in ("0", "1"):  # each trial a job dir with its result
        assert (tmp_path / "second" / job / "result.json").is_file()
    best = OmegaConf.load(tmp_path / "second" / "optimization_results.yaml")
    assert best.best_value == min(t.value for t in trials if t.state.name == "COMPLETE")


@pytest.mark.slow
def test_a_sweep_job_worse_than_the_median_stops_and_its_trial_is_recorded_pruned(tmp_path):
    # An earlier complete trial that reached FID 0 at iteration 2: any real job is worse there and is pruned.
    (tmp_path / "studies").mkdir()
    study = optuna.create_study(study_name="gan_optuna", storage=f"sqlite:///{tmp_path}/studies/gan.db")
    study.add_trial(optuna.trial.create_trial(value=0.0, intermediate_values={2: 0.0, 4: 0.0}))
    args = _sweep_args(tmp_path, "sweep", 1, "callbacks.optuna_pruning.n_startup_trials=1")
    result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    pruned = _study(tmp_path).trials[1]
    assert pruned.state.name == "PRUNED" and pruned.user_attrs == {PRUNED_AT_ATTR: 2}
    assert pruned.value == pruned.intermediate_values[2] and list(pruned.intermediate_values) == [2]
    assert '"optuna/pruned_at": 2.0' in (tmp_path / "sweep" / "0" / "result.json").read_text()
    assert (
        '"stop_reason": "pruned"' in (tmp_path / "sweep" / "0" / "result.json").read_text()
    )  # not max_steps
    assert f"| {pruned.number} | pruned |" in (tmp_path / "sweep" / "summary.md").read_text()


def test_a_trial_worse_than_the_median_is_pruned_at_its_evaluation(tmp_path):
    from pixelsmith.callbacks.optuna_pruning import OptunaPruning, find_trial

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=storage)
    for value in (10.0, 12.0, 14.0):  # three earlier trials reported these at iteration 2
        trial = study.ask({"lr": LOG_LR})
        trial.report(value, step=2)
        study.tell(trial, value)
    running = study.ask({"lr": LOG_LR})
    lr = running.params["lr"]
    assert find_trial(study, running.number, []).number == running.number  # named by our sweeper
    assert find_trial(study, 0, []) is None  # finished: nothing to report to
    # A sweeper that names no trial (Hydra's own): the running trial whose values are among the job's overrides.
    assert find_trial(study, None, ["max_steps=4", f"lr={lr}"]).number == running.number
    assert find_trial(study, None, ["max_steps=4", "lr=0.5"]) is None

    def evaluate(fid: float) -> SimpleNamespace:
        running = study.ask({"lr": LOG_LR})  # a new trial
        pruning = OptunaPruning(storage, "s", n_startup_trials=3)
        pruning.trial = optuna.trial.Trial(
            optuna.load_study(study_name="s", storage=storage, pruner=optuna.pruners.MedianPruner(3)),
            running._trial_id,
        )
        evaluation = SimpleNamespace(monitor="fid", history=[{"iteration": 2.0, "fid": fid}])
        trainer = SimpleNamespace(callbacks=[evaluation], world_size=1, should_stop=False)
        pruning.on_train_batch_end(trainer, SimpleNamespace(iteration=2), None, None, 0)
        attrs = optuna.load_study(study_name="s", storage=storage).trials[running.number].user_attrs
        return SimpleNamespace(stopped=trainer.should_stop, metrics=pruning.final_metrics(), attrs=attrs)

    better = evaluate(11.0)  # better than the median (12): trains on
    assert better.stopped is False and better.attrs == {}
    worse = evaluate(50.0)
    assert worse.stopped and worse.metrics == {"optuna/pruned_at": 2.0}
    assert worse.attrs == {PRUNED_AT_ATTR: 2}  # what makes the sweeper record it as pruned


def test_the_pruning_callback_takes_the_trial_the_sweeper_names_in_the_environment(tmp_path, monkeypatch):
    from pixelsmith.callbacks.optuna_pruning import OptunaPruning

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=storage)
    study.ask({"lr": LOG_LR})
    second = study.ask({"lr": LOG_LR})
    trainer = SimpleNamespace(is_global_zero=True)
    monkeypatch.setenv(TRIAL_NUMBER_ENV, str(second.number))
    pruning = OptunaPruning(storage, "s")
    pruning.setup(trainer, None, "fit")
    assert pruning.trial is not None and pruning.trial.number == second.number
    monkeypatch.setenv(TRIAL_NUMBER_ENV, "0")
    study.tell(0, 1.0)
    finished = OptunaPruning(storage, "s")  # its trial finished meanwhile: nothing to report to
    finished.setup(trainer, None, "fit")
    assert finished.trial is None
    monkeypatch.delenv(TRIAL_NUMBER_ENV)
    alone = OptunaPruning(storage, "s")  # a run no sweep started (no -m)
    alone.setup(trainer, None, "fit")
    assert alone.trial is None


class StandInLauncher:
    """Runs each "job" as a function of its trial's study and overrides, in-process, as Hydra's launcher would run
    train.py: the job finds its trial by the number in its overrides' env_set, and returns a JobReturn."""

    def __init__(self, storage: str, job):
        self.storage, self.job, self.launched = storage, job, []

    def launch(self, job_overrides, initial_job_idx):
        returns = []
        for overrides in job_overrides:
            self.launched.append(list(overrides))
            prefix = f"+hydra.job.env_set.{TRIAL_NUMBER_ENV}="
            (number,) = [int(o[len(prefix) :]) for o in overrides if o.startswith(prefix)]
            study = optuna.load_study(study_name="s", storage=self.storage)
            trial = optuna.trial.Trial(study, study.trials[number]._trial_id)
            try:
                returns.append(
                    JobReturn(status=JobStatus.COMPLETED, _return_value=self.job(trial, overrides))
                )
            except Exception as err:  # as Hydra's run_job records a job that raised
                returns.append(JobReturn(status=JobStatus.FAILED, _return_value=err))
        return returns


def _sweeper(tmp_path: Path, job, n_trials: int, **settings) -> OptunaSweeper:
    storage = f"sqlite:///{tmp_path}/studies/s.db"
    sweeper = OptunaSweeper(
        direction=settings.pop("direction", "minimize"),
        study_name="s",
        storage=storage,
        n_trials=n_trials,
        n_jobs=settings.pop("n_jobs", 1),
        sampler={"_target_": "optuna.samplers.TPESampler", "seed": 7},
        params={"lr": "tag(log, interval(0.00001, 0.01))", "width": "choice(16, 32, 64)"},
    )
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    sweeper.launcher = StandInLauncher(storage, job)
    return sweeper


def _loss(trial, overrides) -> float:
    trial.report(1.0, step=2)
    return trial.params["lr"] * 1000 + trial.params["width"]


def test_the_sweeper_continues_a_study_from_sqlite_and_fails_the_trial_left_running(tmp_path):
    _sweeper(tmp_path, _loss, n_trials=2).sweep(["max_steps=4"])
    storage = f"sqlite:///{tmp_path}/studies/s.db"
    optuna.load_study(study_name="s", storage=storage).ask()  # trial 2: its sweep was killed while it ran

    again = _sweeper(tmp_path, _loss, n_trials=2)  # the same command again: a new process, the same storage
    again.sweep(["max_steps=4"])
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] + [
        TrialState.COMPLETE
    ] * 2
    assert [t.value for t in trials[3:]] == [t.params["lr"] * 1000 + t.params["width"] for t in trials[3:]]
    # Each job's overrides: its sampled values, the command line's, and its trial's number (numbering continues).
    first = again.launcher.launched[0]
    assert first[-2:] == ["max_steps=4", f"+hydra.job.env_set.{TRIAL_NUMBER_ENV}=3"]
    assert first[:2] == [f"lr={trials[3].params['lr']}", f"width={trials[3].params['width']}"]
    # The seeded sampler continues rather than restarting: no repeat of the first invocation's draws.
    assert trials[3].params != trials[0].params and trials[4].params != trials[1].params
    best = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert best.best_value == min(t.value for t in trials if t.state == TrialState.COMPLETE)


def test_the_sweeper_records_pruned_failed_and_interrupted_jobs_as_such(tmp_path):
    outcomes = iter(["pruned", "nan", "raises", "ok"])

    def job(trial, overrides):
        outcome = next(outcomes)
        trial.report(40.0, step=2)
        if outcome == "pruned":  # what the pruning callback does when its pruner stops the job
            trial.set_user_attr(PRUNED_AT_ATTR, 2)
            return 35.0  # the best score it saw, as a pruned training job returns
        if outcome == "raises":
            raise RuntimeError("out of memory")
        return float("nan") if outcome == "nan" else 30.0  # NaN: Pixelsmith's job recorded its error

    _sweeper(tmp_path, job, n_trials=4, n_jobs=2).sweep([])
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/s.db").trials
    assert [t.state for t in trials] == [
        TrialState.PRUNED,
        TrialState.FAIL,
        TrialState.FAIL,
        TrialState.COMPLETE,
    ]
    assert trials[0].value == 40.0  # Optuna's rule for a pruned trial: its last reported value
    assert trials[3].value == 30.0

    def interrupted(trial, overrides):
        raise KeyboardInterrupt  # Ctrl-C while a job trains: not an Exception, ends the sweep

    with pytest.raises(KeyboardInterrupt):
        _sweeper(tmp_path, interrupted, n_trials=2, n_jobs=2).sweep([])
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/s.db").trials
    assert [t.state for t in trials[4:]] == [TrialState.FAIL, TrialState.FAIL]  # none left running


def test_search_space_follows_hydra_sweep_syntax():
    space, plain = search_space(
        [
            "lr=tag(log, interval(0.00005, 0.001))",
            "gamma=interval(0.0, 10.0)",
            "width=tag(int, interval(16, 128))",  # Hydra's interval bounds are floats: int is a tag
            "scale=tag(int, log, interval(1, 64))",
            "layers=range(1, 5)",  # Hydra's range excludes its stop: 1, 2, 3, 4
            'betas=choice("[0.0,0.99]", "[0.5,0.999]")',
            "model=choice(dcgan, stylegan2)",
            "batch=choice(32, 64)",
            "max_steps=4",
            "batch=64",  # given after the config's params: fixed, no longer sampled
        ]
    )
    assert space == {
        "lr": FloatDistribution(0.00005, 0.001, log=True),
        "gamma": FloatDistribution(0.0, 10.0),
        "width": IntDistribution(16, 128),
        "scale": IntDistribution(1, 64, log=True),
        "layers": IntDistribution(1, 4),
        "betas": CategoricalDistribution(["[0.0,0.99]", "[0.5,0.999]"]),
        "model": CategoricalDistribution(["dcgan", "stylegan2"]),
    }
    assert plain == ["max_steps=4", "batch=64"]


def test_a_study_made_for_the_other_direction_is_refused_in_one_paragraph(tmp_path, capsys):
    (tmp_path / "studies").mkdir()
    optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/s.db", direction="maximize")
    with pytest.raises(SystemExit) as stopped:
        _sweeper(tmp_path, _loss, n_trials=1).sweep([])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "created to maximize" in message and "direction=minimize" in message and "study_name" in message


@pytest.mark.parametrize("storage", ["notadb://x", "not a url", "sqlite:///{tmp}/a_file/s.db"])
def test_a_storage_that_cannot_be_opened_is_refused_before_any_trial(tmp_path, capsys, storage):
    """A URL no driver takes, one SQLAlchemy cannot parse, a SQLite file under a file: one paragraph naming
    hydra.sweeper.storage, exit status 2, and no job launched (the stand-in launcher would record it)."""
    (tmp_path / "a_file").write_text("not a folder")
    sweeper = _sweeper(tmp_path, _loss, n_trials=1)
    sweeper.storage = storage.format(tmp=tmp_path)
    with pytest.raises(SystemExit) as stopped:
        sweeper.sweep([])
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert f"hydra.sweeper.storage={sweeper.storage} cannot be opened" in said and said.count("\n") == 1
    assert "Traceback" not in said and sweeper.launcher.launched == []


def test_an_older_optuna_in_the_environment_is_refused_with_the_install_command(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(optuna, "__version__", "2.10.1")  # what the sweeps extra installed before
    with pytest.raises(SystemExit) as stopped:
        _sweeper(tmp_path, _loss, n_trials=1).sweep([])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "has 2.10.1" in message and 'pip install -c constraints.txt -e ".[sweeps]"' in message


def test_a_study_stored_by_an_older_optuna_is_refused_with_the_upgrade_command(tmp_path, capsys):
    import sqlite3

    (tmp_path / "studies").mkdir()
    optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/s.db")
    with sqlite3.connect(
        tmp_path / "studies" / "s.db"
    ) as db:  # the schema Optuna 2.10 (our sweeps before) left
        db.execute("UPDATE alembic_version SET version_num = 'v2.6.0.a'")
    with pytest.raises(SystemExit) as stopped:
        _sweeper(tmp_path, _loss, n_trials=1).sweep([])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert f"optuna storage upgrade --storage sqlite:///{tmp_path}/studies/s.db" in message


def test_rank_correlation_importance_finds_the_parameter_that_matters():
    from pixelsmith.reports.optuna import importances

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
