"""Preemption: SIGTERM (Kubernetes, cloud spot machines, torchrun, a preempting SLURM), SIGUSR1 (sbatch
`--signal=USR1@90`) or SIGUSR2 (submitit's warning before the time limit) ends the run cleanly at the end of the
current iteration.

The signal handler only records the signal (a handler interrupts the main thread between two bytecodes; the
iteration must not be cut in half). `TrainingCore._end_iteration` asks `requested()`: on one process every iteration
(a host flag, free), under several processes every `train.preemption.check_every_n_steps` iterations (default: the
logging iterations, where a host-device sync is allowed), where the ranks agree with one all-reduce (the highest
signal number any rank got) so that every rank stops at the same iteration; the grace period must cover that many
iterations plus writing the checkpoint; SLURM and torchrun signal every
rank, Lightning's own launcher only the first, and the all-reduce covers both. Training then ends the way it ends at
`max_steps`: `last.ckpt` is written atomically (the final evaluation is skipped: it can take longer than the grace
period), and the entry point exits with `128 + signal number` (143 for SIGTERM, 138 for SIGUSR1, 140 for SIGUSR2),
the status of a process the signal ended, which schedulers read as "interrupted, run again". Under SLURM, for the signals in
`train.preemption.requeue_on` (SLURM's and submitit's warnings, not SIGTERM: `scancel` sends that and a cancelled job
must stay cancelled) the job first requeues itself (`scontrol requeue`); the requeued job keeps its id, so its run dir
(`outputs/train/runs/slurm-<id>`) and `train.auto_resume` bring it back to `last.ckpt`.

Ctrl-C (SIGINT, in `train.preemption.signals` by default) takes the same path and exits 130, with the command that
resumes. Ctrl-C where there is no iteration to finish stops at once instead (`StoppedAtOnce`): during set-up, after
the last iteration (the final checkpoint, evaluation and report), or a second Ctrl-C while the first one's iteration
ends or its checkpoint is written. Every checkpoint is written next to its final name and renamed into place
(callbacks/checkpoint.py), so stopping in the middle of one leaves the previous `last.ckpt` as it was.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from pixelsmith.core.host_reads import host_reads_allowed
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


class RunPreempted(PixelsmithError):
    """Training stopped on a preemption signal or Ctrl-C after writing last.ckpt; the process exits with 128 + signal.
    `resume` is the command that resumes (None where it is unknown: a run started from Python)."""

    def __init__(self, signum: int, iteration: int, checkpoint: str, resume: str | None = None):
        self.signum = signum
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        # The command last, with no full stop after it, so that it can be copied as it stands.
        how = (
            f"Resume with: {resume}" if resume else f"Resume with the same command and ckpt_path={checkpoint}"
        )
        if signum == signal.SIGINT:
            super().__init__(
                f"Interrupted by Ctrl-C (SIGINT): training stopped at the end of iteration {iteration} and wrote "
                f"{checkpoint}; exiting with status {self.exit_code} (128 + SIGINT). {how}"
            )
            return
        super().__init__(
            f"Preempted by {name}: training stopped at the end of iteration {iteration} and wrote {checkpoint}. "
            f"Exiting with status {self.exit_code} (128 + {name}) so the scheduler runs the job again; the new run "
            f"resumes from that checkpoint by itself when it uses the same run dir (train.auto_resume). {how}"
        )


class StoppedAtOnce(BaseException):
    """Ctrl-C with no iteration left to finish, or a second one: the run stops where it is, writing nothing more.

    A BaseException, as KeyboardInterrupt is, so that no `except Exception` on its way swallows it; not a
    KeyboardInterrupt, which Lightning's `fit` turns into "graceful shutdown" and exit status 1. The entry point
    (pixelsmith.entry) says which checkpoint is intact and exits with 130."""

    exit_code = 128 + signal.SIGINT

    def __init__(self, when: str):
        super().__init__(when)
        self.when = when


def stop_message(signum: int, iteration: int) -> str:
    """The line logged at the end of the iteration a signal stops."""
    if signum == signal.SIGINT:
        return (
            f"Ctrl-C received: training stops at the end of iteration {iteration} and writes checkpoints/last.ckpt. "
            "Ctrl-C again stops at once without it (the checkpoints written before stay as they are)."
        )
    name = signal.Signals(signum).name
    return (
        f"{name} received: training stops at the end of iteration {iteration} to write checkpoints/last.ckpt "
        "(train.preemption)."
    )


def _stop_at_once_outside_the_loop(signum: int, frame) -> None:
    raise StoppedAtOnce("Ctrl-C came outside the training loop (during set-up, or after the last iteration)")


@contextmanager
def ctrl_c_stops_at_once(enabled: bool) -> Iterator[None]:
    """Within the block (a run's set-up and its end), Ctrl-C stops at once with StoppedAtOnce; the training loop
    installs its own handler over this one (PreemptionSignals)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _stop_at_once_outside_the_loop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class PreemptionSignals:
    """Records the first preemption signal; `requested()` tells the training loop to stop after this iteration."""

    def __init__(self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1", "SIGUSR2")):
        self.signals = [signal_number(name) for name in signals]
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._training_over: Callable[[], bool] = lambda: False

    def install(self, training_over: Callable[[], bool] | None = None) -> None:
        """`training_over()`: True once the last iteration has ended (a Ctrl-C then has none to finish)."""
        if threading.current_thread() is not threading.main_thread():
            return  # Python only lets the main thread set handlers (a test running fit in a thread)
        self._training_over = training_over or (lambda: False)
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _record(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.received is not None:
            raise StoppedAtOnce("a second Ctrl-C came before the first one's checkpoint was complete")
        if signum == signal.SIGINT and self._training_over():
            raise StoppedAtOnce(
                "Ctrl-C came after the last iteration (during the final checkpoint, evaluation or samples)"
            )
        if self.received is None:
            self.received = signum

    def requested(
        self,
        world_size: int,
        max_reduce: Callable[[torch.Tensor], object],
        device: torch.device | str,
        may_sync: bool,
    ) -> int | None:
        """The signal to stop for (agreed over ranks: the highest number any rank got), or None. With several ranks
        it is read only where `may_sync`, so every rank stops at the same iteration."""
        if world_size == 1:
            return self.received
        if not may_sync:
            return None
        with host_reads_allowed():  # a deliberate read, at check iterations only (train.host_sync_check)
            flag = torch.tensor(float(self.received or 0), device=device)
            max_reduce(flag)
            agreed = int(flag.item())
        return agreed or None


def signal_number(name: str) -> int:
    try:
        return int(signal.Signals[name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"])
    except KeyError as err:
        raise PixelsmithError(
            f"train.preemption.signals: {name!r} is not a signal name; use e.g. [SIGTERM, SIGUSR1, SIGUSR2]."
        ) from err


def requeue_slurm_job() -> bool:
    """`scontrol requeue <this job>` (rank 0 only); True when SLURM accepted it."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ.get("SLURM_JOB_ID")
    if not job:
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        log.warning("Cannot requeue SLURM job %s: scontrol is not on PATH.", job)
        return False
    if result.returncode != 0:
        log.warning("scontrol requeue %s failed (%d): %s", job, result.returncode, result.stderr.strip())
        return False
    log.info("Requeued SLURM job %s; it resumes from last.ckpt in the same run dir.", job)
    return True
