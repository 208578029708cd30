"""Optuna pruning from inside a sweep job: report each evaluation to the job's trial, stop a trial that is doing worse.

The `pixelsmith_optuna` sweeper (src/hydra_plugins/pixelsmith_optuna_sweeper) asks the study for trials, runs one
job per trial, and tells the study each job's outcome; it hands each job its trial's number in the environment
(TRIAL_NUMBER_ENV). This callback (added by `hparams_search=gan_optuna`) opens the same study from its storage, takes
that trial, reports the monitored score of every evaluation (`eval.monitor`, FID by default) at its iteration, and
asks a median pruner (worse than the median of earlier complete trials at the same iteration, after
`n_startup_trials` complete ones and `n_warmup_steps` iterations). A pruned trial stops training there and marks its
trial (PRUNED_AT_ATTR): its final evaluation and checkpoint still run, and the sweeper records the trial as PRUNED,
with the score of the evaluation that pruned it. Under several processes rank 0 decides and the others follow (a
broadcast at evaluation iterations only).

Under a sweeper that passes no trial number (Hydra's own hydra-optuna-sweeper, the day it replaces ours), the job's
trial is the running one whose sampled values are all among its overrides, and a pruned trial is recorded complete
with the job's best score (that sweeper knows only complete and failed).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning.pytorch.callbacks import Callback

from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


def find_trial(study: Any, number: int | None, overrides: list[str]) -> Any | None:
    """The running trial this job trains: the one the pixelsmith_optuna sweeper named by its number; for a sweeper
    that names none (Hydra's own hydra-optuna-sweeper, once it runs on current Optuna), the one whose sampled values
    are all among this job's overrides ("name=value", as both sweepers write them). None: no such running trial."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if number is not None:
        return next((trial for trial in running if trial.number == number), None)
    given = set(overrides)
    return next(
        (
            t
            for t in running
            if t.params and all(f"{name}={value}" in given for name, value in t.params.items())
        ),
        None,
    )


class OptunaPruning(Callback):
    def __init__(
        self,
        storage: str,
        study_name: str,
        n_startup_trials: int = 3,
        n_warmup_steps: int = 0,
        monitor: str = "fid",
    ):
        self.storage = storage
        self.study_name = study_name
        self.n_startup_trials = n_startup_trials
        self.n_warmup_steps = n_warmup_steps
        self.monitor = monitor
        self.trial = None
        self.pruned_at: int | None = None
        self._reported: set[int] = set()
        self._evaluation = None  # the evaluation callback whose history is reported (False: the run has none)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero or self.trial is not None:
            return
        try:
            import optuna
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            from hydra_plugins.pixelsmith_optuna_sweeper.optuna_sweeper import TRIAL_NUMBER_ENV
        except ImportError as err:
            raise PixelsmithError(
                'hparams_search needs the sweeps extra (Optuna): pip install -e ".[sweeps]".'
            ) from err
        number = os.environ.get(TRIAL_NUMBER_ENV)
        try:
            in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
            overrides = list(HydraConfig.get().overrides.task)
        except ValueError:  # not run by Hydra (tests)
            in_sweep, overrides = number is not None, []
        if not in_sweep:
            log.warning("Optuna pruning: not a sweep job (hparams_search runs with -m); no pruning.")
            return
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(
            study_name=self.study_name,
            storage=self.storage,
            pruner=optuna.pruners.MedianPruner(
                n_startup_trials=self.n_startup_trials, n_warmup_steps=self.n_warmup_steps
            ),
        )
        frozen = find_trial(study, None if number is None else int(number), overrides)
        if frozen is None:
            log.warning(
                "Optuna pruning: study %s has no running trial %s for this job (finished or failed meanwhile); no "
                "pruning.",
                self.study_name,
                "" if number is None else number,
            )
            return
        self.trial = optuna.trial.Trial(study, frozen._trial_id)
        log.info("Optuna pruning: this job is trial %d of study %s.", frozen.number, self.study_name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        iteration = int(pl_module.iteration)
        if self._evaluation is None:  # found once: this hook runs every iteration
            self._evaluation = next(
                (c for c in trainer.callbacks if hasattr(c, "history") and hasattr(c, "monitor")), False
            )
        evaluation = self._evaluation
        latest = evaluation.history[-1] if evaluation and evaluation.history else None
        if latest is None or int(latest["iteration"]) != iteration or iteration in self._reported:
            return  # no evaluation at this iteration: nothing to report, no collective
        self._reported.add(iteration)
        prune = False
        if self.trial is not None and self.monitor in latest:
            self.trial.report(float(latest[self.monitor]), step=iteration)
            prune = self.trial.should_prune()
        if trainer.world_size > 1:
            prune = bool(trainer.strategy.broadcast(prune, src=0))
        if prune:
            self.pruned_at = iteration
            if (
                self.trial is not None
            ):  # rank 0: tells the sweeper to record the trial as pruned, not complete
                from hydra_plugins.pixelsmith_optuna_sweeper.optuna_sweeper import PRUNED_AT_ATTR

                self.trial.set_user_attr(PRUNED_AT_ATTR, iteration)
            log.info(
                "Optuna pruning: trial stopped at iteration %d (%s=%.4g is worse than the median of earlier trials).",
                iteration,
                self.monitor,
                latest[self.monitor],
            )
            trainer.should_stop = True

    def final_metrics(self) -> dict[str, float]:
        return {"optuna/pruned_at": float(self.pruned_at)} if self.pruned_at is not None else {}
