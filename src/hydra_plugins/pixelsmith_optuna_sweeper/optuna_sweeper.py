"""Hydra sweeper `pixelsmith_optuna`: an Optuna study driven through its ask/tell API, one Hydra job per trial.

`conf/hparams_search/gan_optuna.yaml` selects it (`override /hydra/sweeper: pixelsmith_optuna`). It keeps the
configuration of Hydra's own hydra-optuna-sweeper (direction, study_name, storage, n_trials, n_jobs, sampler, params
written in Hydra's sweep syntax: `choice(...)`, `range(...)`, `interval(...)`, `tag(log, interval(...))`), so that
moving to that plugin, once a stable Hydra 1.4 ships it on current Optuna, is a change of the sweeper's name (and of
the sampler's: a config group there, a `_target_` config here).

Per invocation: the study is created or, when its storage already holds it, continued (`load_if_exists`); trials an
interrupted invocation left running are marked failed; then `n_trials` more trials, `n_jobs` asked at a time, each
launched as a job with the sampled values as overrides. A job's return value is told to the study: a finite number
completes the trial, NaN or an exception fails it (Pixelsmith's jobs return NaN after recording their error), and a
job whose pruner stopped it (it sets the trial's user attribute PRUNED_AT_ATTR) is told PRUNED, which is what
Optuna's pruners and TPE expect of a pruned trial.

The contract with the jobs (`pixelsmith.callbacks.optuna_pruning`): each job runs with its trial's number in the
environment variable TRIAL_NUMBER_ENV (set through `hydra.job.env_set`, so it reaches jobs any launcher runs), and
reports its evaluations to that trial through the same storage. Only this module and that callback know the two
names.

Importing this module is cheap and needs no Optuna (Hydra imports every plugin at every start-up); Optuna is imported
when a sweep starts. No `from __future__ import annotations` here: Hydra's plugin scan runs this module before it is
in sys.modules, where `dataclasses` would look to resolve string annotations.
"""

import copy
import logging
import math
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

TRIAL_NUMBER_ENV = "PIXELSMITH_OPTUNA_TRIAL"  # each job runs with its trial's number in this variable
PRUNED_AT_ATTR = "pruned_at_iteration"  # user attribute a job sets on its trial when its pruner stops it


class Direction(Enum):
    minimize = 1
    maximize = 2


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.pixelsmith_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    # The sampler stays a config until the sweep starts: instantiating it with the sweeper would import Optuna before
    # a missing one can be reported in a sentence, and its seed is adjusted when a study is continued.
    _recursive_: bool = False
    direction: Direction = Direction.minimize
    study_name: str | None = None
    # sqlite:///path/optuna.db (or any SQLAlchemy URL Optuna takes) keeps the study across invocations; null: memory.
    storage: str | None = None
    n_trials: int = 20  # trials this invocation adds to the study
    # Trials asked at once and handed to the launcher together (run in parallel by a parallel launcher).
    n_jobs: int = 1
    sampler: Any = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler"})
    params: dict[str, str] = field(default_factory=dict)  # name: Hydra sweep expression


ConfigStore.instance().store(
    group="hydra/sweeper", name="pixelsmith_optuna", node=OptunaSweeperConf, provider="pixelsmith"
)


def refuse(message: str) -> None:
    """Stop the sweep with one paragraph (no traceback): the cause and the fix."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        refuse(
            "The pixelsmith_optuna sweeper (hparams_search=gan_optuna) needs Optuna, which is not installed. Install "
            'the sweeps extra: pip install -e ".[sweeps]" (or `pip install "optuna>=4,<6"`).'
        )
    if int(optuna.__version__.split(".")[0]) < 4:
        refuse(
            f"The pixelsmith_optuna sweeper needs Optuna 4 or newer; this environment has {optuna.__version__} (the "
            "sweeps extra of earlier versions installed 2.10 with hydra-optuna-sweeper). Update it: pip install -c "
            'constraints.txt -e ".[sweeps]" (or `pip install "optuna>=4,<6"`), and upgrade an existing study once '
            "with `optuna storage upgrade --storage <its URL>`."
        )
    return optuna


def distribution(override: Override) -> Any:
    """The Optuna distribution of a sweep override, or None for a plain override (passed to every job as given).

    choice(a, b, ...) and shuffle(range(...)) are categorical; range(start, stop, step) takes the values Hydra's own
    sweeper would iterate (stop excluded), with their step; interval(low, high) is uniform, tag(log, interval(...))
    log-uniform. Hydra parses interval bounds as floats: tag(int, interval(...)) samples integers."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not override.is_sweep_override():
        return None
    sweep = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and sweep.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if override.is_range_sweep():
        values = list(override.sweep_iterator())
        if not values:
            refuse(
                f"The sweep override {override.input_line} is an empty range: give start < stop for a step > 0."
            )
        low, high, step = min(values), max(values), abs(sweep.step)
        if all(isinstance(v, int) for v in (sweep.start, sweep.stop, sweep.step)):
            return IntDistribution(int(low), int(high), step=int(step))
        return FloatDistribution(float(low), float(high), step=float(step))
    if override.is_interval_sweep():
        log_scale = "log" in sweep.tags
        if "int" in sweep.tags:
            return IntDistribution(math.ceil(sweep.start), math.floor(sweep.end), log=log_scale)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log_scale)
    refuse(
        f"The sweep override {override.input_line} is not one the Optuna sweeper can sample: use choice(...), "
        "range(...), interval(...) or tag(log, interval(...)) (glob(...) is for grid sweeps: run those without "
        "hparams_search)."
    )
    return None


def search_space(arguments: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Distributions by parameter name, and the plain overrides every job gets. A later override of the same key
    replaces an earlier one, so a command-line `key=value` fixes a parameter the config's params would sample."""
    by_key: dict[str, tuple[str, Any]] = {}
    for override in OverridesParser.create().parse_overrides(arguments):
        assert override.input_line is not None
        found = None if override.is_delete() else distribution(override)
        by_key.pop(override.get_key_element(), None)  # the later one takes its own place in the order
        by_key[override.get_key_element()] = (override.input_line, found)
    space = {key: found for key, (_, found) in by_key.items() if found is not None}
    plain = [line for line, found in by_key.values() if found is None]
    return space, plain


def fail_stale_trials(study: Any) -> list[int]:
    """Trials still RUNNING when an invocation starts were left by one that was interrupted: their jobs are gone and
    will never report. Marked failed, so that the sampler and the summary do not count them as in flight (one study is
    driven by one sweep at a time; run trials in parallel with n_jobs). Returns their numbers."""
    from optuna.trial import TrialState

    stale = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    for number in stale:
        study.tell(number, state=TrialState.FAIL)
    if stale:
        log.warning(
            "Study %s resumes: trial(s) %s, left running by an interrupted sweep, are marked failed.",
            study.study_name,
            ", ".join(map(str, stale)),
        )
    return stale


class OptunaSweeper(Sweeper):
    def __init__(
        self,
        direction: Direction | str,
        study_name: str | None,
        storage: str | None,
        n_trials: int,
        n_jobs: int,
        sampler: Any,
        params: Any,
    ) -> None:
        self.direction = direction if isinstance(direction, Direction) else Direction[str(direction)]
        self.study_name = study_name
        self.storage = storage
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.sampler = sampler
        self.params = dict(params or {})
        if n_trials < 0 or n_jobs < 1:
            refuse(
                f"hydra.sweeper.n_trials={n_trials} and hydra.sweeper.n_jobs={n_jobs}: n_trials is how many trials "
                "this invocation adds (0 or more), n_jobs how many run at once (1 or more)."
            )
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.job_idx = 0

    def open_study(self, optuna: Any) -> Any:
        """Create the study, or continue the one the storage holds, with the configured sampler."""
        from sqlalchemy.exc import SQLAlchemyError  # Optuna's storage layer (a dependency of Optuna)

        try:
            if self.storage and self.storage.startswith("sqlite:///"):
                # SQLite creates the database file but not its folder (outputs/<task>/ on a first sweep).
                Path(self.storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
            study = optuna.create_study(
                study_name=self.study_name,
                storage=self.storage,
                direction=self.direction.name,
                load_if_exists=True,  # Optuna's default sampler until the configured one is made, below
            )
        except (SQLAlchemyError, ImportError, OSError, ValueError) as err:
            # A URL no database driver takes (notadb://x), a driver not installed, a folder that cannot be made, a
            # server that does not answer: before any trial ran.
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            refuse(
                f"hydra.sweeper.storage={self.storage} cannot be opened as the study's storage ({type(err).__name__}: "
                f"{first}). Nothing was run. Give a database URL Optuna takes, e.g. hydra.sweeper.storage=sqlite:///"
                "outputs/train/optuna.db (a file it creates), or hydra.sweeper.storage=null to keep the study in "
                "memory (it ends with the sweep)."
            )
        except RuntimeError as err:
            if "storage upgrade" not in str(err):
                raise
            # A study written by an older Optuna: hydra-optuna-sweeper 1.2 (this template's sweeper before) ran 2.10.
            refuse(
                f"The study storage {self.storage} was written by an older Optuna than this one ({optuna.__version__}"
                f"): {err} Upgrade it once (back the file up first: the upgrade is one-way) with `optuna storage "
                f"upgrade --storage {self.storage}`, then run the sweep again; or start a new study with another "
                "hydra.sweeper.storage."
            )
        if study.direction.name.lower() != self.direction.name:
            refuse(
                f"The study {study.study_name} in {self.storage} was created to {study.direction.name.lower()}, "
                f"and this sweep says direction={self.direction.name}. Give this sweep another "
                "hydra.sweeper.study_name (or storage), or set the direction the study has."
            )
        earlier = len(study.get_trials(deepcopy=False))
        # Hydra hands the sampler's config over resolved (${seed} and the like); tests give a plain dict.
        sampler = (
            OmegaConf.to_container(self.sampler, resolve=True)
            if isinstance(self.sampler, DictConfig)
            else copy.deepcopy(self.sampler)
        )
        if isinstance(sampler, dict) and sampler.get("seed") is not None and earlier:
            # A seeded sampler restarted with its seed would draw the first invocation's random start-up points
            # again; offset by the trials so far keeps a continued study reproducible without repeating them.
            sampler["seed"] = int(sampler["seed"]) + earlier
        if sampler is not None:
            from hydra.utils import instantiate

            study.sampler = instantiate(sampler)
        log.info(
            "Optuna study %s (%s, %s): %d earlier trial(s); this sweep runs %d more with %s.",
            study.study_name,
            self.storage or "in memory",
            self.direction.name,
            earlier,
            self.n_trials,
            type(study.sampler).__name__,
        )
        return study

    def job_overrides(self, trial: Any, plain: list[str]) -> list[str]:
        sampled = [f"{name}={value}" for name, value in trial.params.items()]
        return [*sampled, *plain, f"+hydra.job.env_set.{TRIAL_NUMBER_ENV}={trial.number}"]

    def tell(self, study: Any, trial: Any, job: Any) -> None:
        """Record one job's outcome on its trial."""
        from optuna.trial import TrialState

        try:
            value = float(job.return_value)  # JobReturn re-raises the job's exception here
        except Exception as err:
            log.warning("Trial %d failed: %s: %s", trial.number, type(err).__name__, err)
            study.tell(trial, state=TrialState.FAIL)
            return
        # The job wrote its attribute through the storage; the Trial object here holds a copy from before the job.
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        current = next((t for t in running if t.number == trial.number), None)
        if current is None:  # finished by someone else meanwhile (another sweep failed it as stale): leave it
            log.warning(
                "Trial %d was finished outside this sweep; its job's value %s is not recorded.",
                trial.number,
                value,
            )
        elif PRUNED_AT_ATTR in current.user_attrs:
            study.tell(trial, state=TrialState.PRUNED)  # its value: the last evaluation it reported
        elif math.isfinite(value):
            study.tell(trial, value)
        else:
            log.warning("Trial %d failed: its job returned %s (see its failed.json).", trial.number, value)
            study.tell(trial, state=TrialState.FAIL)

    def sweep(self, arguments: list[str]) -> None:
        assert self.config is not None and self.launcher is not None, "setup() runs before sweep()"
        optuna = import_optuna()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # its per-trial lines repeat what the jobs log
        from optuna.trial import TrialState

        space, plain = search_space(
            [f"{name}={value}" for name, value in self.params.items()] + list(arguments)
        )
        study = self.open_study(optuna)
        fail_stale_trials(study)
        remaining = self.n_trials
        while remaining > 0:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, remaining))]
            try:
                jobs = self.launcher.launch(
                    [self.job_overrides(t, plain) for t in trials], initial_job_idx=self.job_idx
                )
            except BaseException:
                # Interrupted (Ctrl-C) or the launcher failed: these trials will not finish; say so in the study now.
                for trial in trials:
                    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                raise
            self.job_idx += len(jobs)
            for trial, job in zip(trials, jobs, strict=True):
                self.tell(study, trial, job)
            remaining -= len(trials)
        self.save_results(study)

    def save_results(self, study: Any) -> None:
        """optimization_results.yaml in the sweep dir, as Hydra's Optuna sweeper writes it: the best trial so far."""
        from optuna.trial import TrialState

        assert self.config is not None
        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            log.warning("Study %s has no complete trial yet.", study.study_name)
            return
        best = study.best_trial
        log.info("Best trial so far: %d, value %.6g, with %s", best.number, best.value, best.params)
        results = {
            "name": "optuna",
            "best_trial": best.number,
            "best_params": best.params,
            "best_value": best.value,
        }
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(results), sweep_dir / "optimization_results.yaml")
