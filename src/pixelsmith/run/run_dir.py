"""A run dir belongs to one run at a time, and a second run never silently overwrites the first.

`claim_run_dir` runs before anything is written. On rank 0 it takes an exclusive lock on `<run dir>/.run.lock`
(filelock's `lock_descriptor`: `flock` on Linux and macOS, `LockFileEx` on Windows; the kernel drops it when the
process ends, even on kill -9, so a crash never leaves a stale lock),
and a second run started into the same dir while the first writes stops with one paragraph naming the first's pid.
A dir that already holds a run (its `config_resolved.yaml`) is resumed from its `checkpoints/last.ckpt` when
`train.auto_resume` is on and no `ckpt_path` is given (a requeued SLURM job, a restarted pod or torchrun worker, a
rerun with the same `hydra.run.dir`), and refused otherwise unless `train.overwrite=true`. Other ranks only follow
the same auto-resume decision: they run in rank 0's dir and must not lock it.

Under `python train.py` the claim is taken by a Hydra callback (`ClaimRunDirFirst`, conf/hydra/default.yaml) before
Hydra saves its `.hydra/` config into the dir, so a refused run changes nothing there; the run then takes it over.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from filelock import lock_descriptor
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pixelsmith.errors import PixelsmithError, check_writable_folder, why_unwritable
from pixelsmith.run.launch import global_rank

log = logging.getLogger(__name__)

LOCK_NAME = ".run.lock"
# Written by every run at start-up (pixelsmith.run.fit): its presence means the dir already holds a run.
RUN_MARKER = "config_resolved.yaml"


class RunDirError(PixelsmithError):
    """The run dir is in use by another run, or holds one that this run would overwrite."""


class RunDirClaim:
    """Holds the run dir's lock for the duration of a run; `release()` (or process exit) frees it."""

    def __init__(self, output_dir: Path, ckpt_path: str | None, lock_fd: int | None):
        self.output_dir = output_dir
        self.ckpt_path = ckpt_path  # the checkpoint to resume from (given, or found by auto-resume)
        self._lock_fd = lock_fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the lock
            self._lock_fd = None


def _lock(output_dir: Path) -> int:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(output_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:  # a read-only filesystem, /proc, a file where a folder should be
        raise RunDirError(
            f"The run dir {output_dir} cannot be created or written: {why_unwritable(err)} ({err}). Nothing was "
            "written. Give the run a writable place: hydra.run.dir=<a folder you can write>, or leave it unset for "
            "outputs/<task>/runs/<stamp> under a writable working directory."
        ) from err
    try:
        locked = lock_descriptor(fd, blocking=False)
    except OSError as err:  # a filesystem without flock (some Lustre and NFS mounts): run unlocked
        log.warning("Cannot lock the run dir %s (%s); running without the lock.", output_dir, err)
        return fd
    # The holder's pid@host follows a first byte of its own: Windows locks byte 0 against reads by other processes,
    # so a second run reads from byte 1 (os.pread/pwrite do not exist there).
    if locked:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"\n{os.getpid()}@{socket.gethostname()}\n".encode())
        return fd
    os.lseek(fd, 1, os.SEEK_SET)
    holder = os.read(fd, 128).decode(errors="replace").strip() or "unknown"
    os.close(fd)
    raise RunDirError(
        f"The run dir {output_dir} is in use by another run (pid@host {holder}); two runs writing one dir would "
        "mix their checkpoints and metrics. Wait for it to end, or give this run its own dir (leave hydra.run.dir "
        "unset for a fresh timestamped one)."
    )


# Claims taken by the Hydra callback below before Hydra wrote anything, handed to the run that follows.
_held: dict[Path, RunDirClaim] = {}


def claim_run_dir(output_dir: Path, ckpt_path: str | None, auto_resume: bool, overwrite: bool) -> RunDirClaim:
    """Lock the run dir (rank 0) and decide what to resume from; raises RunDirError for a dir another run owns."""
    held = _held.pop(output_dir.resolve(), None)
    if held is not None:
        return held
    last = output_dir / "checkpoints" / "last.ckpt"
    resume_last = ckpt_path is None and auto_resume and last.is_file()
    if global_rank() != 0:
        return RunDirClaim(output_dir, str(last) if resume_last else ckpt_path, None)
    fd = _lock(output_dir)
    try:
        if resume_last:
            log.info(
                "Resuming from %s: the run dir already holds this run (train.auto_resume; ckpt_path=... to choose "
                "another checkpoint, or a new hydra.run.dir to start afresh).",
                last,
            )
            return RunDirClaim(output_dir, str(last), fd)
        previous = (output_dir / RUN_MARKER).is_file()
        resuming_here = ckpt_path is not None and _inside(Path(ckpt_path), output_dir)
        restarted = _restart_count()
        if previous and not resuming_here and restarted:
            # A requeued or restarted job whose first attempt died before its first checkpoint: its own dir.
            log.warning(
                "This is restart %d of the job and its run dir %s holds no last.ckpt: starting afresh in it.",
                restarted,
                output_dir,
            )
        elif previous and not resuming_here:
            if not overwrite:
                reason = (
                    f"it has no checkpoints/last.ckpt to resume from and ckpt_path={ckpt_path} is another run's"
                    if ckpt_path is not None
                    else "it has no checkpoints/last.ckpt to resume from"
                    if auto_resume
                    else "train.auto_resume=false"
                )
                raise RunDirError(
                    f"The run dir {output_dir} already holds another run ({RUN_MARKER}, metrics, samples) and this "
                    f"run would overwrite it: {reason}. Give this run its own dir (leave hydra.run.dir unset for a "
                    "fresh timestamped one), resume the earlier run with its checkpoint, or pass train.overwrite=true "
                    "to start afresh in it."
                )
            log.warning(
                "train.overwrite=true: starting afresh in %s, which holds an earlier run.", output_dir
            )
        return RunDirClaim(output_dir, ckpt_path, fd)
    except BaseException:
        os.close(fd)
        raise


def _restart_count() -> int:
    """How many times SLURM (requeue) or torchrun (--max-restarts) has restarted this job; 0 for a first start."""
    counts = (os.environ.get("SLURM_RESTART_COUNT"), os.environ.get("TORCHELASTIC_RESTART_COUNT"))
    return max((int(c) for c in counts if c and c.isdigit()), default=0)


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.expanduser().resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True


class ClaimRunDirFirst(Callback):
    """Hydra callback: claim the run dir before Hydra writes its `.hydra/` config into it (`hydra.run.dir` of a
    single run; sweep jobs get fresh numbered dirs). A refusal is one paragraph on stderr and exit status 2."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        auto_resume = OmegaConf.select(config, "train.auto_resume")
        if auto_resume is None:  # not a training config
            return
        output_dir = Path(str(config.hydra.run.dir))
        try:
            claim = claim_run_dir(
                output_dir,
                OmegaConf.select(config, "ckpt_path"),
                bool(auto_resume),
                bool(OmegaConf.select(config, "train.overwrite", default=False)),
            )
        except RunDirError as err:
            print(f"[pixelsmith] {err}", file=sys.stderr)  # Hydra's logging is not set up yet
            sys.exit(2)
        _held[output_dir.resolve()] = claim

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra creates the sweep dir itself; one it cannot create would end the sweep in an OSError traceback.
        try:
            check_writable_folder(
                str(config.hydra.sweep.dir),
                "hydra.sweep.dir",
                "give the sweep a folder you can write (hydra.sweep.dir=...), or leave it unset for outputs/<task>/"
                "multiruns/<stamp> under a writable working directory.",
            )
        except PixelsmithError as err:
            print(f"[pixelsmith] {err}", file=sys.stderr)
            sys.exit(2)


def check_new_run_dir(output_dir: Path, record_subdir: str | None, command: str) -> None:
    """Refuse, before Hydra writes into it, a run dir that already holds another command's record: a training run
    (its config_resolved.yaml, checkpoints) or any earlier command's Hydra record (`.hydra/`, the command line that
    made what is there). Hydra replaces that record unconditionally, and evaluate.py's and generate.py's outputs have
    fixed names, so such a dir is refused rather than shared: a fresh timestamped dir is the default and costs
    nothing. Also refuses a dir that cannot be created or written."""
    found = [
        name for name in (record_subdir, RUN_MARKER, "checkpoints") if name and (output_dir / name).exists()
    ]
    if found:
        raise RunDirError(
            f"hydra.run.dir={output_dir} already holds another command's outputs ({', '.join(found)}: "
            f"{'a training run' if RUN_MARKER in found else 'an earlier run'}); {command} would replace its "
            f"record of the command that made it{f' ({record_subdir}/)' if record_subdir else ''}. Nothing was "
            f"written. Leave hydra.run.dir unset for a fresh timestamped dir, or give a new folder."
        )
    check_writable_folder(
        output_dir,
        "hydra.run.dir",
        "leave hydra.run.dir unset for a fresh dir under a writable working directory, or give a folder you can write.",
    )


class NewRunDirOnly(ClaimRunDirFirst):
    """Hydra callback of the commands that write a run dir of their own without training (evaluate.py,
    generate.py): `check_new_run_dir` before Hydra writes its `.hydra/` record; a refusal is one paragraph on
    stderr and exit status 2. A sweep's dir is checked as training's (`ClaimRunDirFirst.on_multirun_start`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if global_rank() != 0:  # a launcher's other ranks share rank 0's new dir, which rank 0 checked
            return
        subdir = OmegaConf.select(config, "hydra.output_subdir")
        try:
            check_new_run_dir(
                Path(str(config.hydra.run.dir)),
                None if subdir is None else str(subdir),
                Path(sys.argv[0]).name,
            )
        except PixelsmithError as err:
            print(f"[pixelsmith] {err}", file=sys.stderr)  # Hydra's logging is not set up yet
            sys.exit(2)
