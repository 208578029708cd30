"""Optuna pruning from inside a sweep job: report each evaluation to the job's trial, stop a trial that is doing worse.

hydra-optuna-sweeper asks the study for trials, runs one job per trial and tells the study the job's final value; it
never hands the trial to the job. This callback (added by `hparams_search=gan_optuna`) opens the same study from its
storage, finds its own trial (the running trial whose parameters are exactly this job's overrides, formatted as the
sweeper formats them), reports the monitored score of every evaluation (`eval.monitor`, FID by default) at its
iteration, and asks the study's pruner (a median pruner: worse than the median of earlier trials at the same
iteration, after `n_startup_trials` complete ones and `n_warmup_steps` iterations). A pruned trial stops training
there; its final evaluation and checkpoint still run, and the value the sweeper records is its best score so far
(the sweeper can only record a trial as complete or failed). Under several processes rank 0 decides and the others
follow (a broadcast at evaluation iterations only).
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import Callback

from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


def find_trial(study: Any, overrides: list[str]) -> Any | None:
    """The running trial whose parameters are among `overrides` ("name=value", as the sweeper writes them)."""
    from optuna.trial import TrialState

    given = set(overrides)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.params and all(f"{name}={value}" in given for name, value in trial.params.items()):
            return trial
    return None


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
        except ImportError as err:
            raise PixelsmithError(
                'hparams_search needs the sweeps extra: pip install -e ".[sweeps]" (hydra-optuna-sweeper).'
            ) from err
        study = optuna.load_study(
            study_name=self.study_name,
            storage=self.storage,
            pruner=optuna.pruners.MedianPruner(
                n_startup_trials=self.n_startup_trials, n_warmup_steps=self.n_warmup_steps
            ),
        )
        frozen = find_trial(study, list(HydraConfig.get().overrides.task))
        if frozen is None:
            log.warning(
                "Optuna pruning: no running trial of study %s matches this job; no pruning.", self.study_name
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
            log.info(
                "Optuna pruning: trial stopped at iteration %d (%s=%.4g is worse than the median of earlier trials).",
                iteration,
                self.monitor,
                latest[self.monitor],
            )
            trainer.should_stop = True

    def final_metrics(self) -> dict[str, float]:
        return {"optuna/pruned_at": float(self.pruned_at)} if self.pruned_at is not None else {}
