"""A wall-clock budget for training (`train.time_budget_minutes`): the work a run does follows what the machine can do.

The clock starts when the run's settings are built (before data, model, Trainer and the iteration-0 evaluation, so
set-up and periodic evaluations count). `TrainingCore._end_iteration` asks `expired()` once per iteration and ends
training at the first iteration past the budget, the way it ends at `max_steps`: the callbacks' end-of-training work
(the final evaluation, sample grid and `last.ckpt`) then runs on that last trained iteration, after the budget. A
resumed run gets a fresh budget and continues from the checkpoint's iteration.

Under several processes (DDP, FSDP, torchrun, SLURM) each rank has its own clock, started when it built its settings
(rank 0 starts first: it launches the others), so the ranks disagree about when the budget is spent. They agree on
the stop instead: every rank all-reduces its "past the budget" flag at every iteration when a budget is set (one
scalar), whatever its own clock says, and all stop at the first iteration at which any rank is past. The all-reduce
must never depend on a rank's own clock or state: a rank that skipped it would leave the others waiting in it.
(The 2-process stop that "hung in CI" was not this: an in-process DDP/FSDP test had left LOCAL_RANK in os.environ,
so the next 2-process run believed a launcher had started it and waited for a second rank nobody started;
tests/conftest.py now restores the environment after each test.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


def clock() -> float:
    """Seconds on a monotonic clock; tests replace this function to control time."""
    return time.monotonic()


@dataclass
class TimeBudget:
    minutes: float | None = None  # None: no budget, training runs to max_steps
    # clock() when the budget was made; a run without a budget never reads the clock.
    started: float | None = None
    stopped_at_iteration: int | None = None  # set when the budget ended training
    elapsed_at_stop_s: float | None = None

    def __post_init__(self) -> None:
        if self.minutes is not None and self.started is None:
            self.started = clock()

    @property
    def enabled(self) -> bool:
        return self.minutes is not None

    def elapsed_s(self) -> float:
        return clock() - self.started

    def spent(self) -> bool:
        """This process's own clock says the budget is spent (no agreement with other ranks, no device)."""
        return self.minutes is not None and self.elapsed_s() >= self.minutes * 60.0

    def expired(
        self,
        world_size: int = 1,
        all_reduce: Callable[[torch.Tensor], object] | None = None,
        device: torch.device | str = "cpu",
    ) -> bool:
        """True once the budget is spent; with several ranks, True on all of them as soon as it is on one."""
        if self.minutes is None:
            return False
        past = self.spent()
        if world_size > 1 and all_reduce is not None:
            flag = torch.tensor(float(past), device=device)
            all_reduce(flag)  # a sum: > 0 when any rank is past
            past = bool(flag.item() > 0)
        return past

    def stop(self, iteration: int, max_steps: int) -> None:
        """Training ends at `iteration` for the budget: recorded for the run's summary, and said in the log."""
        self.stopped_at_iteration = iteration
        self.elapsed_at_stop_s = self.elapsed_s()
        log.info(
            "Time budget reached at iteration %d of max_steps=%d (%.2f min since the run started, "
            "train.time_budget_minutes=%g): training stops here; the final evaluation, samples and "
            "checkpoint are of iteration %d. Resume from checkpoints/last.ckpt to train further.",
            iteration,
            max_steps,
            self.elapsed_at_stop_s / 60.0,
            self.minutes,
            iteration,
        )
