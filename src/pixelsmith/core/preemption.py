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

"At once" is bounded, whatever the phase: Python runs a signal handler only when the main thread is back in Python
code, so one that sits in a long native call (a checkpoint write, an evaluation's forward, a compile, a collective),
or a clean-up that hangs (loader workers, compile workers), would make the stop wait for it. Under an entry point
(`allow_forced_exit`) a watchdog thread learns of every signal from the interpreter's wakeup fd, which its C-level
handler writes at once, and when a Ctrl-C is one that stops at once, it gives the main thread FORCED_EXIT_GRACE_S to
leave the run, then prints the same paragraph and ends the process with status 130 (`os._exit`: a checkpoint being
written stays a `.partial` file that the next run removes; the previous `last.ckpt` is intact). The entry point itself
then exits without waiting for clean-up either (`exit_now`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, NoReturn

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
    (pixelsmith.run.entry) says which checkpoint is intact and exits with 130."""

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


OUTSIDE_THE_LOOP = "Ctrl-C came outside the training loop (during set-up, or after the last iteration)"
SECOND_CTRL_C = "a second Ctrl-C came before the first one's checkpoint was complete"


def _stop_at_once_outside_the_loop(signum: int, frame) -> None:
    raise StoppedAtOnce(OUTSIDE_THE_LOOP)


# ---- a stop at once that cannot hang --------------------------------------------------------------------------------
FORCED_EXIT_GRACE_S = 1.5  # the main thread's time to leave the run after a stop-at-once Ctrl-C

# Set by an entry point (pixelsmith.run.entry): this process is its to end, and this makes the paragraph it would print.
# Unset (a run started from Python, a test), nothing ever ends the process from outside the main thread.
_forced_exit_message: Callable[[str], str] | None = None


def allow_forced_exit(message: Callable[[str], str]) -> None:
    """Let a stop-at-once Ctrl-C end this process when the main thread does not leave the run in time; `message(when)`
    is the paragraph to print then."""
    global _forced_exit_message
    _forced_exit_message = message


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once the logs and the terminal have what was written: no waiting for threads,
    loader or compile workers, or atexit clean-up, which a stop at once must not wait for."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


class _Watchdog:
    """Reads the signals the interpreter's C-level handler reports on its wakeup fd (at once, whatever the main thread
    is doing) and decides as the Python handlers do whether a Ctrl-C stops at once; if it does and the main thread has
    not left the run `grace` seconds later, `force(when)` ends the process."""

    def __init__(self, grace: float, force: Callable[[str], None]):
        self.grace, self.force = grace, force
        self._lock = threading.Lock()
        self._in_loop = False
        self._loop_signals: set[int] = set()
        self._training_over: Callable[[], bool] = lambda: False
        self._first_seen = False
        self._timer: threading.Timer | None = None
        self._stopping = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="pixelsmith-ctrl-c-watchdog", daemon=True)
        self._thread.start()

    def enter_loop(self, signals: Sequence[int], training_over: Callable[[], bool]) -> None:
        with self._lock:
            self._in_loop, self._loop_signals, self._training_over = True, set(signals), training_over

    def leave_loop(self) -> None:
        with self._lock:
            self._in_loop = False

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if self._stopping or not data:
                return
            for signum in data:
                self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        with self._lock:
            if self._in_loop and not self._first_seen and signum in self._loop_signals:
                over = False
                try:
                    over = bool(self._training_over())
                except Exception:  # the trainer is being torn down: treat it as over
                    over = True
                if not over:
                    self._first_seen = True  # the iteration ends and last.ckpt is written: not at once
                    return
            if signum != signal.SIGINT or self._timer is not None:
                return
            if not self._in_loop:
                when = OUTSIDE_THE_LOOP
            elif self._first_seen:
                when = SECOND_CTRL_C
            else:
                when = "Ctrl-C came after the last iteration (during the final checkpoint, evaluation or samples)"
            self._timer = threading.Timer(self.grace, self._fire, args=(when,))
            self._timer.daemon = True
            self._timer.start()

    def _fire(self, when: str) -> None:
        if not self._stopping:
            self.force(when)

    def stop(self) -> None:
        """The main thread left the run: nothing more to watch (the entry point exits without waiting)."""
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
        signal.set_wakeup_fd(self._previous_fd)
        with suppress(OSError):
            os.write(self._write_fd, b"\0")  # wakes the reader, which sees _stopping and returns
        self._thread.join(timeout=1.0)
        for fd in (self._read_fd, self._write_fd):
            with suppress(OSError):
                os.close(fd)


_watchdog: _Watchdog | None = None


def _force_exit(when: str) -> None:
    """The watchdog's end of a run the main thread did not leave in time: the paragraph, then status 130."""
    message = _forced_exit_message
    try:
        text = message(when) if message is not None else f"Stopped at once: {when}."
    except Exception:  # reading the run dir failed: the cause is still worth saying
        text = f"Stopped at once: {when}; nothing more was written."
    try:
        os.write(2, (text + "\n").encode())
    finally:
        os._exit(128 + signal.SIGINT)


@contextmanager
def ctrl_c_stops_at_once(enabled: bool) -> Iterator[None]:
    """Within the block (a run's set-up and its end), Ctrl-C stops at once with StoppedAtOnce; the training loop
    installs its own handler over this one (PreemptionSignals). Under an entry point (`allow_forced_exit`) the stop
    is bounded by the watchdog, in the loop too."""
    global _watchdog
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _stop_at_once_outside_the_loop)
    watchdog = _watchdog = (
        _Watchdog(FORCED_EXIT_GRACE_S, _force_exit) if _forced_exit_message is not None else None
    )
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.stop()
            _watchdog = None
        signal.signal(signal.SIGINT, previous)


class PreemptionSignals:
    """Records the first preemption signal; `requested()` tells the training loop to stop after this iteration."""

    def __init__(self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1", "SIGUSR2")):
        self.signals = [n for n in (signal_number(name) for name in signals) if n is not None]
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._training_over: Callable[[], bool] = lambda: False

    def start_training(self, trainer: Any, world_size: int) -> None:
        """At the start of training, after the Trainer's own handlers (registered just before; they are restored
        after fit): ours end the run at an iteration boundary with last.ckpt instead of Lightning's mid-iteration
        stop, and after the last iteration a Ctrl-C, having no iteration to finish, stops at once."""
        if getattr(trainer, "received_sigterm", False) and signal.SIGTERM in self.signals:
            self.received = signal.SIGTERM  # it came during set-up, to Lightning's handler
        self.install(training_over=lambda: trainer.should_stop)
        epoch_loop = trainer.fit_loop.epoch_loop
        if (
            signal.SIGTERM in self.signals
            and world_size > 1
            and hasattr(epoch_loop, "_broadcast_sigterm_tensor")
        ):
            # Lightning 2.6 broadcasts its SIGTERM flag and reads it back on every batch under several processes: a
            # host-device sync per iteration. Its flag is never set with our handler in place; ours agree at logging
            # iterations instead.
            epoch_loop._broadcast_sigterm_tensor = lambda: None

    def install(self, training_over: Callable[[], bool] | None = None) -> None:
        """`training_over()`: True once the last iteration has ended (a Ctrl-C then has none to finish)."""
        if threading.current_thread() is not threading.main_thread():
            return  # Python only lets the main thread set handlers (a test running fit in a thread)
        self._training_over = training_over or (lambda: False)
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)
        if _watchdog is not None:
            _watchdog.enter_loop(self.signals, self._training_over)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if _watchdog is not None:
            _watchdog.leave_loop()

    def _record(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.received is not None:
            raise StoppedAtOnce(SECOND_CTRL_C)
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


# POSIX signals Windows does not have. The default train.preemption.signals name SIGUSR1 and SIGUSR2 (SLURM's and
# submitit's warnings): where a platform lacks one, it is left out instead of stopping the run at start-up.
POSIX_ONLY_SIGNALS = frozenset(
    {"SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCONT", "SIGXCPU", "SIGPWR", "SIGWINCH"}
)


def signal_number(name: str) -> int | None:
    """The number of a signal name (SIGTERM, TERM, sigterm); None for a POSIX signal this platform lacks."""
    upper = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
    try:
        return int(signal.Signals[upper])
    except KeyError as err:
        if upper in POSIX_ONLY_SIGNALS:
            log.debug("%s does not exist on this platform (%s): not watched.", upper, sys.platform)
            return None
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
