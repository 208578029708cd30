"""What every Hydra entry point does around its job: one-paragraph errors, and multirun jobs that fail alone.

A PixelsmithError (bad config value, missing file or weights, impossible hardware request) is logged as its message,
without a traceback, and the process exits with status 2. A run ended by a preemption signal or Ctrl-C
(core/preemption.py) exits with 128 + the signal's number once its last.ckpt is written (130 for Ctrl-C, also where a
Ctrl-C stopped it at once, without waiting for any clean-up), printing the command that resumes; a resume of a checkpoint already at max_steps says so
and exits with 0 (pixelsmith.run.resume). In a multirun the failing job writes
`failed.json` in its dir and returns NaN so the other jobs still run; `pixelsmith.reports.sweep_summary` tabulates them at the
end. A multirun job whose `hardware=auto` was detected on another machine (a SLURM job composed on the login node)
stops naming the profile to give (`pixelsmith.hardware.settings.check_detected_here`). A run started inside one checkout
with another's code and configs (an installed pixelsmith) says which trees it uses (`pixelsmith.config.paths`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from pixelsmith.config.paths import describe_trees
from pixelsmith.core.preemption import RunPreempted, StoppedAtOnce, allow_forced_exit, exit_now
from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.settings import check_detected_here
from pixelsmith.run.launch import global_rank, started_by_lightning_launcher
from pixelsmith.run.resume import AlreadyFinished, checkpoint_iteration, continue_command

log = logging.getLogger("pixelsmith")


def _is_multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # HydraConfig not set: called outside @hydra.main (tests)
        return False


class GPUFailureError(PixelsmithError, RuntimeError):
    """A compiler error or an out-of-memory, explained: the message names the key that avoids it."""


# Where a traceback passes when the failure is torch.compile's (tracing, AOTAutograd, inductor's generated code).
_COMPILER_PATHS = ("/torch/_dynamo/", "/torch/_inductor/", "/torch/_functorch/", "torchinductor_")


# torch's messages when a DataLoader worker process ends abnormally (killed, segfault, exit).
_DEAD_WORKER = re.compile(r"DataLoader worker \(pid\(?s?\)? [\d, ]+\)[^\n]*")


def _frames(err: BaseException) -> list[str]:
    return [frame.filename for frame in traceback.extract_tb(err.__traceback__)]


def _is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _checkpoints_note(output_dir: Path) -> str:
    written = sorted(p.name for p in (output_dir / "checkpoints").glob("*.ckpt"))
    if not written:
        return " No checkpoint had been written yet."
    return f" The checkpoints written before it are intact ({', '.join(written)} in {output_dir / 'checkpoints'})."


def _gradient_checkpointing_hint(cfg: DictConfig) -> str:
    """The model's own gradient-checkpointing switches, read from its config (general code names no model)."""
    model = OmegaConf.select(cfg, "model") or {}
    keys = (
        [
            f"model.{name}.gradient_checkpointing=true"
            for name, section in model.items_ex(resolve=False)
            if isinstance(section, DictConfig) and "gradient_checkpointing" in section
        ]
        if isinstance(model, DictConfig)
        else []
    )
    if not keys:
        return "model.*.gradient_checkpointing=true where a model has it (this one has none)"
    return " and ".join(keys) + " (recomputes activations in the backward: less memory, more time)"


def explain_failure(err: BaseException, cfg: DictConfig) -> GPUFailureError | None:
    """Turn a compiler error or an out-of-memory into one paragraph naming the key that avoids it (None for any
    other exception). The full traceback goes to `<run dir>/error_traceback.txt` for a bug report."""
    output_dir = Path(cfg.paths.output_dir)
    root = err
    # torch.compile wraps the real error (BackendCompilerFailed.inner_exception, or a chained cause).
    while (
        inner := getattr(root, "inner_exception", None) or root.__cause__
    ) is not None and inner is not root:
        root = inner
    first_line = (str(root).strip().splitlines() or [""])[0][:300]
    cause = type(err).__name__ if root is err else f"{type(err).__name__} <- {type(root).__name__}"
    worker = _DEAD_WORKER.search(str(err))
    if worker is not None:
        message = (
            f"A data-loader worker died: {worker.group(0).rstrip('. ')} ({type(err).__name__}). Workers load and "
            "decode the training images in processes of their own (data.num_workers); one that is killed (SIGKILL "
            "is most often the out-of-memory killer: each worker holds its own copy of the dataset's buffers) ends "
            "the run. Fix: fewer workers (data.num_workers=1, or 0 to load in the training process and see the "
            "real error), or a smaller data.batch_size; a worker that crashed on one file shows that file with "
            "data.num_workers=0."
        )
    elif _is_out_of_memory(err):
        batch = OmegaConf.select(cfg, "data.batch_size")
        accumulate = OmegaConf.select(cfg, "accumulate", default=1)
        message = (
            f"Out of memory ({cause}: {first_line}). Use a smaller micro-batch: data.batch_size="
            f"{max(1, batch // 2) if batch else '<smaller>'} with accumulate={2 * accumulate} keeps the effective "
            "batch; or auto_batch.enabled=true to find the largest batch that fits; or "
            f"{_gradient_checkpointing_hint(cfg)}. "
            "On a shared GPU check hardware.memory_fraction and what else runs (nvidia-smi)."
        )
    elif any(marker in name for name in _frames(err) for marker in _COMPILER_PATHS):
        message = (
            f"torch.compile failed ({cause}: {first_line}). Train without it: hardware.compile=false "
            "(the same model, eager, slower); if it fails only with channels_last, hardware.channels_last=false "
            "keeps compile on. Please report it with the traceback."
        )
    else:
        return None
    message += _checkpoints_note(output_dir)
    if global_rank() == 0 and output_dir.is_dir():
        trace = "".join(traceback.format_exception(err))
        (output_dir / "error_traceback.txt").write_text(trace)
        message += f" Full traceback: {output_dir / 'error_traceback.txt'}."
    return GPUFailureError(message)


def guarded_run(
    job: Callable[[DictConfig], dict[str, Any]], cfg: DictConfig, objective: str, ends_process: bool = False
) -> float | None:
    """Run `job` as an entry point does (module docstring). `ends_process`: this process is the job's (train.py,
    evaluate.py), so a stop at once may end it without waiting for clean-up; a caller in a longer-lived process (a
    test) leaves it False and gets StoppedAtOnce's SystemExit instead."""
    output_dir = Path(cfg.paths.output_dir)
    if ends_process:
        # A stop-at-once Ctrl-C that the main thread cannot act on in time (a long native call, a clean-up that
        # hangs) ends the process from the watchdog with the paragraph below (core/preemption.py).
        allow_forced_exit(lambda when: stopped_at_once_message(StoppedAtOnce(when), cfg))
    # Run from inside one checkout with another's code and configs (an installed pixelsmith): say so, once.
    if global_rank() == 0 and (trees := describe_trees()) is not None:
        log.warning("%s", trees)
    try:
        try:
            # A multirun job on another machine than the one that composed it (SLURM) must not run its profile.
            check_detected_here(OmegaConf.select(cfg, "hardware.name", default="auto"))
            metrics = job(cfg)
        except PixelsmithError:
            raise
        except Exception as err:
            explained = explain_failure(err, cfg)
            if explained is None:
                raise
            raise explained from err
    except StoppedAtOnce as err:
        log.warning("%s", stopped_at_once_message(err, cfg))
        if _is_multirun():
            _record(output_dir, {"status": "failed", "error": f"stopped at once: {err.when}"})
        code = 0 if started_by_lightning_launcher() else err.exit_code
        if ends_process:  # at once means now: not after loader or compile workers, threads or atexit clean-up
            exit_now(code)
        sys.exit(code)
    except AlreadyFinished as err:
        log.warning("%s", err)
        if _is_multirun():
            _record(output_dir, {"status": "failed", "error": str(err)})
            return math.nan
        sys.exit(err.exit_code)
    except RunPreempted as err:
        log.warning("%s", err)
        if _is_multirun():
            _record(output_dir, {"status": "preempted", "error": str(err)})
        # A rank Lightning's own launcher started exits 0: rank 0 watches its children and kills every process when
        # one exits non-zero, which could cut rank 0's last writes short. Rank 0 carries the status.
        sys.exit(0 if started_by_lightning_launcher() else err.exit_code)
    except PixelsmithError as err:
        log.error("%s", err)
        if _is_multirun():
            _record(output_dir, {"status": "failed", "error": str(err)})
            return math.nan
        sys.exit(2)
    except Exception as err:
        if not _is_multirun():
            raise
        # One job's crash (an OOM, an invalid combination) must not end the sweep: record it and go on.
        log.error("Job failed: %s\n%s", err, traceback.format_exc())
        _record(output_dir, {"status": "failed", "error": f"{type(err).__name__}: {err}"})
        return math.nan
    value = metrics.get(objective, math.nan)
    if objective not in metrics and _is_multirun() and global_rank() == 0:
        log.warning(
            "objective=%s is not among this run's final metrics (%s); the sweep sees NaN. Set objective= to one "
            "of them (e.g. objective=loss/G when evaluation is off).",
            objective,
            ", ".join(sorted(metrics)),
        )
    if _is_multirun():
        _record(output_dir, {"status": "ok", "objective": objective, "value": value, "metrics": metrics})
    return value


def stopped_at_once_message(err: StoppedAtOnce, cfg: DictConfig) -> str:
    """One paragraph for a run Ctrl-C stopped at once: why at once, which checkpoint is intact, how to go on."""
    output_dir = Path(cfg.paths.output_dir)
    last = output_dir / "checkpoints" / "last.ckpt"
    iteration = checkpoint_iteration(last) if last.is_file() else None
    if iteration is not None:
        kept = f"{last} (iteration {iteration}) is intact"
    else:
        given = OmegaConf.select(cfg, "ckpt_path")
        kept = "no checkpoint of this run had been written" + (f"; {given} is untouched" if given else "")
    command = continue_command(output_dir, bool(OmegaConf.select(cfg, "train.auto_resume", default=True)))
    go_on = f" Go on with: {command}" if command else ""
    return (
        f"Stopped at once: {err.when}, so nothing more was written (a checkpoint being written was discarded, "
        f"never left half-written); {kept}. Exiting with status {err.exit_code} (128 + SIGINT).{go_on}"
    )


def _record(output_dir: Path, payload: dict[str, Any]) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:
        overrides = []
    payload["overrides"] = overrides
    name = "failed.json" if payload["status"] == "failed" else "result.json"
    (output_dir / name).write_text(json.dumps(payload, indent=2, default=str))
