"""Stylize on every device of a machine: one process per device, the file list sharded, one merged summary.

`python stylize.py ... devices=N` (or `devices=all`) starts N processes, one per device (`cuda:0` .. `cuda:N-1`;
with `device=cpu`, N CPU processes sharing the cores). Under `torchrun --nproc-per-node N stylize.py ...` the
processes are torchrun's, and each takes `cuda:LOCAL_RANK`. Every process plans the same sorted (input, output)
list and takes the pairs `rank::N`, so each file goes to exactly one process: none twice, none missed, and with
`overwrite=false` a rerun after a kill redoes only the missing outputs in every shard. The processes then gather
their summaries over a gloo process group (object collectives only: no NCCL needed, and the same code runs on CPU),
rank 0 prints the merged one, and every process exits with its status (non-zero when any file failed anywhere).
A process that fails as a whole (a checkpoint it cannot load, a device it cannot use) still joins the gather, with
its error as a failure, so the others never wait for it.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pixelsmith.style.pipeline import FolderSummary


class DevicesError(ValueError):
    """A `devices=` value this machine cannot serve; the message names what it has."""


def resolve_devices(devices: int | str, device: str) -> list[str]:
    """The device of each process: `devices` is a count or "all" (every CUDA device; a CPU counts as one)."""
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    available = torch.cuda.device_count() if on_cuda else 1
    if isinstance(devices, str) and devices.strip().lower() == "all":
        count = available
    else:
        try:
            count = int(devices)
        except (TypeError, ValueError):
            raise DevicesError(f"devices={devices!r}: a number of devices or all.") from None
        if count < 1:
            raise DevicesError(f"devices={count} must be at least 1 (or all).")
    if not on_cuda:
        return ["cpu"] * count
    if count == 1:
        return [device if device.startswith("cuda:") else "cuda:0"]
    if count > available:
        raise DevicesError(
            f"devices={count} but this machine has {available} CUDA device(s); use devices={available} or all."
        )
    return [f"cuda:{index}" for index in range(count)]


def torchrun_rank() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when started by torchrun with more than one process, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))


def run_rank(
    job: Callable[..., FolderSummary], options: Any, device: str, rank: int, world: int, init_method: str
) -> FolderSummary:
    """This process's shard of `job` (stylize.py's `run_job`, given by the caller: this module imports no job), then
    the gather: returns the summary merged over all processes."""

    if device == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // world))
    elif device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        try:
            summary = job(options, device, rank=rank, world_size=world)
        except Exception as error:  # noqa: BLE001  (joins the gather with its error: the others must not hang)
            summary = FolderSummary(devices=[device], failed={f"<rank {rank} on {device}>": f"{error}"})
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, summary.to_dict())
        return FolderSummary.merge(parts)
    finally:
        dist.destroy_process_group()


def _spawned(
    rank: int,
    world: int,
    job: Callable[..., FolderSummary],
    devices: list[str],
    options: Any,
    init_method: str,
    result: str,
) -> None:
    merged = run_rank(job, options, devices[rank], rank, world, init_method)
    if rank == 0:
        partial = Path(result).with_suffix(".partial")
        partial.write_text(json.dumps(merged.to_dict()))
        os.replace(partial, result)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(job: Callable[..., FolderSummary], options: Any, devices: list[str]) -> FolderSummary:
    """Start one process per device running `job` (a module-level function, so spawn can pickle it; spawned: CUDA
    cannot be forked), wait, and return the merged summary."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="pixelsmith-stylize-") as scratch:
        result = str(Path(scratch) / "summary.json")
        mp.start_processes(
            _spawned,
            args=(len(devices), job, devices, options, f"tcp://127.0.0.1:{_free_port()}", result),
            nprocs=len(devices),
            start_method="spawn",
            join=True,
        )
        return FolderSummary(**json.loads(Path(result).read_text()))
