"""Where this process sits in a multi-process launch (torchrun, SLURM, Lightning's own), read from the environment.

Three launchers start Pixelsmith's ranks:
- Lightning's own (`python train.py hardware.devices=2`): the user's process is rank 0 and starts the others with
  `hydra.run.dir` set to its own run dir, so they share it.
- torchrun (`torchrun --nnodes N --nproc-per-node P train.py ...`): every rank runs Hydra itself.
- SLURM (`srun python train.py ...` in an sbatch script, or hydra-submitit-launcher): every task runs Hydra itself.

With the last two, each rank would stamp its own run dir with its own clock (two run dirs for one run). The
`${pixelsmith.run_stamp:}` resolver gives every rank of one launch the same stamp: under SLURM the job id (a
requeued job keeps it, so it comes back to the same dir and resumes from its last.ckpt), under torchrun one stamp
agreed through the launcher's own key-value store (the one the ranks rendezvous with). Ranks other than 0 write no
`.hydra/` (`${pixelsmith.hydra_subdir:}`) and log to `train_rank<N>.log` (`${pixelsmith.log_name:...}`).

`launch_topology()` gives the nodes and processes per node the launcher started, which win over
`hardware.devices`/`hardware.num_nodes`, so the same config runs under any launcher.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta

from omegaconf import OmegaConf

log = logging.getLogger(__name__)

# Lightning treats a SLURM allocation whose job name is one of these as an interactive shell, not a training job.
_INTERACTIVE_SLURM_NAMES = ("bash", "interactive")


@dataclass(frozen=True)
class LaunchTopology:
    launcher: str  # torchrun | slurm
    num_nodes: int
    processes_per_node: int

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.processes_per_node


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "WORLD_SIZE" in os.environ


def under_slurm_tasks() -> bool:
    """A SLURM job step whose tasks are the ranks (srun), as Lightning's SLURMEnvironment.detect() reads it."""
    return (
        "SLURM_NTASKS" in os.environ
        and os.environ.get("SLURM_JOB_NAME") not in _INTERACTIVE_SLURM_NAMES
        and not under_torchrun()
    )


def under_slurm_job() -> bool:
    """Inside a SLURM batch job (not an interactive allocation): requeueing it makes sense."""
    return "SLURM_JOB_ID" in os.environ and os.environ.get("SLURM_JOB_NAME") not in _INTERACTIVE_SLURM_NAMES


def launch_topology() -> LaunchTopology | None:
    """The processes an external launcher started, or None when this process starts the others (or is alone)."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return LaunchTopology("torchrun", max(1, world // per_node), per_node)
    if under_slurm_tasks():
        tasks = int(os.environ["SLURM_NTASKS"])
        nodes = int(os.environ.get("SLURM_NNODES", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
        if tasks <= 1:
            return None
        return LaunchTopology("slurm", nodes, max(1, tasks // nodes))
    return None


def global_rank() -> int:
    """This process's rank before any process group exists (0 for the user's own process)."""
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ and (key != "SLURM_PROCID" or under_slurm_tasks()):
            return int(os.environ[key])
    # Lightning's own launcher gives its children LOCAL_RANK (and NODE_RANK) only.
    return int(os.environ.get("LOCAL_RANK", 0))


def started_by_lightning_launcher() -> bool:
    """A rank > 0 that Lightning's subprocess launcher started (its parent is rank 0, which watches it)."""
    return not under_torchrun() and not under_slurm_tasks() and int(os.environ.get("LOCAL_RANK", 0)) > 0


def die_with_parent() -> None:
    """Linux: have the kernel kill this process when its parent dies (a rank Lightning's launcher started, whose
    rank 0 was killed, would otherwise wait in a collective until the process-group timeout)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    except (OSError, AttributeError):  # no libc prctl: the process-group timeout still ends the wait
        return
    if os.getppid() == 1:  # the parent died before the call: nobody will signal us
        os.kill(os.getpid(), signal.SIGKILL)


def _clock_stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")


def _slurm_stamp() -> str:
    """slurm-<job>[_<array task>][.<step>]: every srun step of a job script its own dir; a requeued job (same id,
    same steps) its old one."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
    step = os.environ.get("SLURM_STEP_ID", "")
    # The batch step itself has no step id (or a sentinel above 4e9 in some versions): no suffix.
    suffix = f".{step}" if step.isdigit() and int(step) < 4_000_000_000 else ""
    return f"slurm-{job}{suffix}"


def _torchrun_stamp() -> str:
    """One stamp for all ranks of this torchrun launch: the first rank to ask sets it in torchrun's store."""
    from torch.distributed import TCPStore

    mine = _clock_stamp()
    try:
        store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
        )
        key = f"pixelsmith/run_stamp/{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
        return store.compare_set(key, "", mine).decode()
    except Exception as err:  # a store we cannot reach: say so, the run itself still works
        log.warning(
            "Could not agree on one run dir with the other torchrun ranks (%s: %s); each rank stamps its own. "
            "Set hydra.run.dir=<dir> (the same on every rank) to get one run dir.",
            type(err).__name__,
            err,
        )
        return mine


def run_stamp() -> str:
    """The run dir's name under outputs/<task>/runs/: $PIXELSMITH_RUN_STAMP, the SLURM job, torchrun's, or the clock.
    Registered with OmegaConf's per-config cache: one value for the whole of one run's config."""
    if os.environ.get("PIXELSMITH_RUN_STAMP"):
        return os.environ["PIXELSMITH_RUN_STAMP"]
    if under_slurm_job():
        return _slurm_stamp()
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        return _torchrun_stamp()
    return _clock_stamp()


def hydra_subdir() -> str | None:
    """`.hydra` on rank 0; none on other ranks, so they do not rewrite rank 0's saved config."""
    return ".hydra" if global_rank() == 0 else None


def log_name(job_name: str) -> str:
    rank = global_rank()
    return job_name if rank == 0 else f"{job_name}_rank{rank}"


def register_launch_resolvers() -> None:
    if not OmegaConf.has_resolver("pixelsmith.run_stamp"):
        OmegaConf.register_new_resolver("pixelsmith.run_stamp", run_stamp, use_cache=True)
    for name, fn in (("pixelsmith.hydra_subdir", hydra_subdir), ("pixelsmith.log_name", log_name)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
