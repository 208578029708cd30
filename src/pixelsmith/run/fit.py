"""Build and fit a run from a composed config: hardware settings -> backend switches -> data -> model -> Trainer.

`train.py` at the repository root is a thin Hydra wrapper around `run()`; tests call `run()` with configs composed
by `hydra.compose` so they exercise the same path as a user.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch._dynamo
from omegaconf import DictConfig, OmegaConf, open_dict

from pixelsmith.config.validate import validate_config
from pixelsmith.core.preemption import (
    RunPreempted,
    ctrl_c_stops_at_once,
    requeue_slurm_job,
    signal_number,
)
from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.settings import HardwareSettings, apply_hardware
from pixelsmith.loggers.csv import align_metrics_with_resume
from pixelsmith.loggers.run_config import attach_objective, log_run_config
from pixelsmith.perf import prepare_run as prepare_perf
from pixelsmith.reports.html import write_run_report
from pixelsmith.run.build import build_core_settings, build_datamodule, build_model, resolve_hardware
from pixelsmith.run.launch import die_with_parent, started_by_lightning_launcher, under_slurm_job
from pixelsmith.run.launch import global_rank as launch_global_rank
from pixelsmith.run.resume import (
    check_not_finished,
    check_same_model,
    check_weights_fit,
    continue_command,
    explain_load_error,
    open_checkpoint,
    refuse_converted,
)
from pixelsmith.run.run_dir import RUN_MARKER, claim_run_dir
from pixelsmith.run.trainer import build_trainer

log = logging.getLogger(__name__)


class DataExhaustedError(PixelsmithError, RuntimeError):
    """Training ended before max_steps without a reason of its own: the data loader ran out of batches."""

    def __init__(self, iteration: int, max_steps: int, start: int):
        trained = iteration - start
        super().__init__(
            f"Training ended at iteration {iteration} of max_steps={max_steps}, having trained {trained} "
            f"iteration{'s' if trained != 1 else ''} in this run: the data loader gave no more batches. A loader that "
            "keeps whole batches only (drop_last) gives none when the dataset holds fewer images than one batch "
            "(data.batch_size x accumulate): use a smaller data.batch_size, or more images. final_metrics.json says "
            "stop_reason: data_exhausted."
        )


def stop_reason(model, budget, metrics: dict[str, Any], max_steps: int) -> str:
    """Why training ended: a signal, the time budget, Optuna's pruning, max_steps, or else the data ran out (never
    "max_steps" for a run that did not get there)."""
    if model.preempted_by is not None:
        return "preempted"
    if budget.stopped_at_iteration is not None:
        return "time_budget"
    if "optuna/pruned_at" in metrics:
        return "pruned"
    if model.iteration >= max_steps:
        return "max_steps"
    return "data_exhausted"


def run_summary(metrics: dict[str, Any], max_steps: int, output_dir: Path, report: Path | None) -> str:
    """The one end-of-run paragraph on the console: why and where training stopped, the best evaluation, the files."""
    lines = [
        f"Run finished: {metrics['stop_reason']} at iteration {int(metrics['iteration'])} of "
        f"max_steps={max_steps}."
    ]
    best = {k: v for k, v in metrics.items() if k.startswith("eval/best_") and k != "eval/best_iteration"}
    for name, value in best.items():
        at = metrics.get("eval/best_iteration")
        where = f" at iteration {int(at)}" if isinstance(at, float) and at == at else ""
        lines.append(f"  best {name.removeprefix('eval/best_')}: {value:.4g}{where}")
    if not best:
        lines.append("  no evaluation (eval.every_n_steps=0, or the run ended before the first)")
    lines.append(f"  run dir: {output_dir}")
    lines.append(
        f"  report:  {report}" if report is not None else "  report:  not written (see the warning above)"
    )
    return "\n".join(lines)


class RankDiedError(PixelsmithError, RuntimeError):
    """Another rank of this run died; the collectives that waited for it failed. Names the rank."""

    def __init__(self, dead: list[tuple[int, int, int]], output_dir: Path, seen: BaseException):
        described = "; ".join(
            f"rank {rank} (pid {pid}) {_exit_description(code)}" for rank, pid, code in dead
        )
        last = output_dir / "checkpoints" / "last.ckpt"
        resume = f"resume with ckpt_path={last}" if last.is_file() else "no checkpoint had been written yet"
        first = (str(seen).strip().splitlines() or [""])[0][:200]
        super().__init__(
            f"A rank of this run died: {described} (rank 0 then saw {type(seen).__name__}: {first}). The other "
            "ranks were waiting for it in a collective and are "
            f"stopped. A rank killed by SIGKILL was most often ended by the out-of-memory killer (dmesg, or the "
            f"scheduler's log, says so): use a smaller data.batch_size or fewer data.num_workers; then {resume}."
        )


def _exit_description(code: int) -> str:
    if code < 0:
        import signal

        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def dead_ranks_of(trainer: L.Trainer) -> list[tuple[int, int, int]]:
    """(rank, pid, exit code) of the ranks Lightning's own launcher started that have ended with a failure."""
    procs = getattr(trainer.strategy.launcher, "procs", None) or []
    dead = []
    for rank, proc in enumerate(procs, start=1):
        try:
            proc.wait(timeout=2)  # a rank whose peer died fails fast; give the dead one's exit time to land
        except Exception:
            continue
        if proc.returncode:
            dead.append((rank, proc.pid, proc.returncode))
    return dead


def _wrote_checkpoint(output_dir: Path) -> bool:
    return any((output_dir / "checkpoints").glob("*.ckpt"))


def _quiet_library_logging() -> None:
    # Lightning installs its own console handler; under Hydra the root logger already prints (and writes train.log),
    # so each Lightning message appeared twice. Route them through the root logger only.
    # The top-level "lightning" package adds a console handler of its own too ("INFO: GPU available ...").
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        library_logger = logging.getLogger(name)
        library_logger.handlers.clear()
        library_logger.propagate = (
            True  # set False by Lightning when it was imported before logging was set up
        )
    # The EMA generator is in eval mode on purpose (BatchNorm statistics are copied, not updated).
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*is deprecated")
    # Lightning compares the loader's length with log_every_n_steps; ours is the iterations left to train (a resume
    # near max_steps, or max_steps below the interval), and the module logs the last iteration whatever the interval.
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches .* is smaller than the logging interval"
    )
    # Lightning's advertisement for its cloud logger, printed at every Trainer construction.
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropAdvertisement) for f in rank_zero_logger.filters):
        rank_zero_logger.addFilter(_DropAdvertisement())


class _DropAdvertisement(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.msg)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Fit one run; returns the final logged metrics (floats, and `stop_reason`) for sweepers and tests."""
    threads = torch.get_num_threads()
    recompile_limit = torch._dynamo.config.recompile_limit
    try:
        return _fit(cfg)
    finally:
        # hardware.num_threads and Dynamo's recompile limit (raised for compile_scope=blocks) are process-wide: the
        # next run of an in-process sweep (or test) starts as this did.
        torch.set_num_threads(threads)
        torch._dynamo.config.recompile_limit = recompile_limit


def _fit(cfg: DictConfig) -> dict[str, Any]:
    if started_by_lightning_launcher():
        die_with_parent()  # rank 0 watches its ranks; this makes them follow rank 0 if it dies
    _quiet_library_logging()
    validate_config(cfg)  # ranges, before anything is written
    hardware = resolve_hardware(cfg)
    output_dir = Path(cfg.paths.output_dir)
    # Ctrl-C in set-up (or after the last iteration) stops at once; in the loop it ends the iteration and saves.
    with ctrl_c_stops_at_once("SIGINT" in {str(name).upper() for name in cfg.train.preemption.signals}):
        # Before anything is written: lock the run dir, refuse one another run owns, or resume the run it holds.
        claim = claim_run_dir(output_dir, cfg.get("ckpt_path"), cfg.train.auto_resume, cfg.train.overwrite)
        try:
            auto_resumed = cfg.get("ckpt_path") is None and claim.ckpt_path is not None
            return _fit_in(cfg, hardware, output_dir, claim.ckpt_path, auto_resumed)
        finally:
            claim.release()


def _fit_in(
    cfg: DictConfig, hardware: HardwareSettings, output_dir: Path, ckpt_path: str | None, auto_resumed: bool
) -> dict[str, Any]:
    # The resume checkpoint is checked before anything is written: it loads, it is not finished, its weights fit.
    checkpoint = resume_iteration = None
    if ckpt_path is not None:
        path, checkpoint = open_checkpoint(ckpt_path, auto_resumed)
        refuse_converted(ckpt_path, checkpoint)
        ckpt_path, resume_iteration = str(path), int(checkpoint["pixelsmith"].get("iteration", 0))
        check_same_model(checkpoint, path, cfg, auto_resumed)  # another model's iteration says nothing here
        check_not_finished(path, resume_iteration, cfg.max_steps, auto_resumed)
    apply_hardware(hardware)  # the hardware settings' process-wide switches, the one place they are set
    if hardware.compile:
        # Dynamo's caches outlive a run: in an in-process sweep, later jobs' networks would hit the recompile limit
        # and run eager without a word. Each run compiles afresh (inductor's on-disk cache keeps that cheap).
        torch._dynamo.reset()
    prepare_perf(cfg, hardware)  # auto batch size may rewrite cfg.data.batch_size
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    core = build_core_settings(cfg, hardware)
    datamodule = build_datamodule(cfg, hardware)
    if checkpoint is not None and cfg.model.get("init_from"):
        # A resume loads the checkpoint's own weights: model.init_from's file is not read again (it may be gone).
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.model.init_from = None
    model = build_model(cfg, core)
    # The data's own checks (a missing or empty folder, broken or far too small files under data.on_corrupt=error, an
    # archive at another resolution) and whether the model can take its labels: refused here, the run dir holds
    # nothing of this run yet and the corrected command can use it. setup() reuses the verdicts.
    check_data = getattr(datamodule, "check_data", None)
    if callable(check_data):
        check_data()
    check_model_data = getattr(model, "check_data", None)
    if callable(check_model_data):
        check_model_data(datamodule)
    if checkpoint is not None:
        check_weights_fit(model, checkpoint, Path(ckpt_path), cfg, auto_resumed)
        del checkpoint  # memory-mapped: Lightning loads it again
    if launch_global_rank() == 0:
        # Before any logger opens it: metrics.csv holds this run's history up to the resumed iteration only.
        align_metrics_with_resume(output_dir / "metrics.csv", resume_iteration)
    trainer = build_trainer(cfg, hardware)
    marker = output_dir / RUN_MARKER
    claimed_here = trainer.is_global_zero and not marker.exists()
    if trainer.is_global_zero:
        output_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(OmegaConf.to_yaml(OmegaConf.create(core.run_config)))
        log.info(
            "Hardware settings: profile=%s device=%s precision=%s strategy=%s nodes=%d devices=%d batch=%s accumulate=%d "
            "-> %s",
            hardware.profile,
            hardware.device_name,
            hardware.precision,
            hardware.strategy,
            hardware.num_nodes,
            hardware.devices,
            cfg.data.batch_size or hardware.batch_size,
            cfg.accumulate,
            output_dir,
        )
        if core.time_budget.enabled:
            log.info(
                "Time budget: training ends at max_steps=%d or at the first iteration past %g min, whichever "
                "comes first (train.time_budget_minutes; null for no budget).",
                cfg.max_steps,
                core.time_budget.minutes,
            )
    if trainer.is_global_zero:
        log_run_config(trainer.loggers, core.run_config)  # TensorBoard's HParams, W&B's and MLflow's config
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except PixelsmithError:
        # Refused in Lightning's set-up, before a first iteration of this run and a checkpoint: the dir must not
        # count as holding a run (run_dir.RUN_MARKER), or the corrected command would be refused too.
        if claimed_here and model.iteration == (resume_iteration or 0) and not _wrote_checkpoint(output_dir):
            marker.unlink(missing_ok=True)
        raise
    except Exception as err:
        # Only an error that may be the echo of another rank's death (a failed collective); this rank's own error
        # (a bad value, an out-of-memory) is the one to show.
        dead = [] if isinstance(err, PixelsmithError | MemoryError) else dead_ranks_of(trainer)
        if not dead:
            explained = explain_load_error(err, ckpt_path, cfg)  # a mismatch only the load itself found
            if explained is not None:
                raise explained from err
            raise
        raise RankDiedError(dead, output_dir, err) from err
    metrics = {
        k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1
    }
    metrics["iteration"] = float(model.iteration)
    metrics.update(
        model.startup.metrics()
    )  # launch to first iteration, compile and capture (core/startup.py)
    budget = core.time_budget
    if budget.enabled:
        metrics["train/time_budget_minutes"] = float(budget.minutes)
    if budget.elapsed_at_stop_s is not None:
        metrics["train/minutes_at_stop"] = budget.elapsed_at_stop_s / 60.0
    for callback in trainer.callbacks:
        # Callbacks that log outside Lightning's callback_metrics (GAN evaluation) report their final numbers
        # here, so a sweep can optimise e.g. `objective=eval/best_fid`.
        if callable(getattr(callback, "final_metrics", None)):
            metrics.update(callback.final_metrics())
    # Why training ended, next to how far it got (train.time_budget_minutes, Optuna's pruning, a signal).
    metrics["stop_reason"] = stop_reason(model, budget, metrics, cfg.max_steps)
    if trainer.is_global_zero:
        # Whole or not at all: a Ctrl-C here stops at once (core/preemption.py).
        partial = output_dir / ".final_metrics.json.partial"
        partial.write_text(json.dumps(metrics, indent=2, sort_keys=True))
        os.replace(partial, output_dir / "final_metrics.json")
        report = output_dir / "report.html"
        try:
            write_run_report(output_dir)  # report.html: curves, samples, perf, config in one offline page
        except Exception as err:  # a report must never cost a finished run its result
            log.warning("Could not write report.html (%s: %s).", type(err).__name__, err)
        attach_objective(trainer.loggers, core.run_config, cfg.get("objective"), metrics)
        log.info("%s", run_summary(metrics, cfg.max_steps, output_dir, report if report.is_file() else None))
    if metrics["stop_reason"] == "data_exhausted":
        raise DataExhaustedError(int(model.iteration), cfg.max_steps, resume_iteration or 0)
    if model.preempted_by is not None:
        requeue_on = {signal_number(name) for name in cfg.train.preemption.requeue_on}
        requeue = cfg.train.preemption.requeue and model.preempted_by in requeue_on
        if trainer.is_global_zero and requeue and under_slurm_job():
            requeue_slurm_job()
        raise RunPreempted(
            model.preempted_by,
            model.iteration,
            str(output_dir / "checkpoints" / "last.ckpt"),
            continue_command(output_dir, cfg.train.auto_resume),
        )
    return metrics
