"""Auto batch size: the largest micro-batch that fits a memory budget, then backed off by a safety margin.

Search (per process): try the configured batch; halve until it fits, else double until it does not (or
`max_batch`); binary-search between the last fit and the first failure to within 5%; finally take
`floor(best * (1 - margin))`. The margin (default 15%) is there because the edge of OOM is not a place to train
(Lightning's BatchSizeFinder picks it, #20231/#21154): allocator fragmentation grows over a run, and iterations that
differ from the probed one (a larger R1 graph, a sample grid, a checkpoint) need headroom. When `max_batch` itself
fits, memory is not the limit and no margin is taken.

A trial is one real training iteration (both networks, forward, backward, optimizer steps with their freshly
allocated Adam state, EMA; StyleGAN2's first iteration includes lazy R1, its most memory-hungry step) of a fresh
model on the real data at that batch, in this process:
- CUDA: fits when it does not raise OOM and the allocator's peak reservation stays within
  `gpu_budget_fraction` of the device memory (after `hardware.memory_fraction`).
- CPU: fits when the process's RSS before the search plus the trial's own growth (VmHWM, reset before each trial,
  minus the RSS just before it) stays within `ram_budget_gb`. A trial whose linear extrapolation from the ones already measured is 20% over the budget is
  not run at all: on a CPU, exceeding RAM means swapping or the OOM killer, not a catchable error.

Under DDP every rank would search again when Lightning relaunches the script; rank 0 passes its result to the
relaunched ranks in `PIXELSMITH_AUTO_BATCH` (keyed by a hash of the config), so all ranks use the same batch.
With `scale_lr`, every `*optimizer.lr` in the model config is multiplied by new_batch / reference_batch (the linear
scaling rule, Goyal et al. 2017; for GANs a starting point, not a law).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.settings import HardwareSettings
from pixelsmith.perf import memory

log = logging.getLogger(__name__)

ENV_KEY = "PIXELSMITH_AUTO_BATCH"
PREDICTION_SLACK = 1.2  # skip a CPU trial predicted to need more than 120% of the budget


@dataclass
class Trial:
    batch: int
    fits: bool
    peak_mb: float | None = None
    measured: bool = True
    note: str = ""


@dataclass
class SearchResult:
    best_fit: int
    chosen: int
    margin: float
    budget_mb: float | None
    memory_limited: bool
    trials: list[Trial] = field(default_factory=list)
    baseline_mb: float | None = None  # CPU: RSS before the first measured trial


def _round_down(value: int, multiple: int) -> int:
    return max(multiple, (int(value) // multiple) * multiple)


def search_batch_size(
    probe: Callable[[int], Trial],
    start: int,
    max_batch: int,
    margin: float = 0.15,
    multiple: int = 1,
    precision: float = 0.05,
    budget_mb: float | None = None,
) -> SearchResult:
    """Doubling, then binary search, then back off by `margin`. `probe(batch)` says whether a batch fits."""
    if not 0.0 <= margin < 1.0:
        raise PixelsmithError(f"auto_batch.margin={margin} must be in [0, 1).")
    trials: list[Trial] = []

    def run(batch: int) -> Trial:
        trial = probe(batch)
        trials.append(trial)
        log.info(
            "auto batch: %d -> %s (%s)",
            batch,
            "fits" if trial.fits else "too large",
            f"peak {trial.peak_mb:.0f} MB" if trial.peak_mb is not None else trial.note,
        )
        return trial

    batch = _round_down(min(start, max_batch), multiple)
    hi: int | None = None
    while not run(batch).fits:
        hi = batch
        if batch <= multiple:
            raise PixelsmithError(
                f"auto batch: even a batch of {batch} does not fit the memory budget "
                f"({budget_mb:.0f} MB). Raise auto_batch.ram_budget_gb / gpu_budget_fraction, use a smaller model, "
                "or turn on the networks' gradient checkpointing where the model has it (docs/stylegan2.md)."
                if budget_mb
                else f"auto batch: even a batch of {batch} does not fit."
            )
        batch = _round_down(batch // 2, multiple)
    lo = batch
    if hi is None:
        while lo < max_batch:
            candidate = min(lo * 2, max_batch)
            candidate = _round_down(candidate, multiple)
            if candidate <= lo:
                break
            if run(candidate).fits:
                lo = candidate
            else:
                hi = candidate
                break
    if hi is not None:
        while hi - lo > max(multiple, int(lo * precision)):
            mid = _round_down((lo + hi) // 2, multiple)
            if mid <= lo:
                break
            if run(mid).fits:
                lo = mid
            else:
                hi = mid
    memory_limited = hi is not None
    chosen = _round_down(int(lo * (1.0 - margin)), multiple) if memory_limited else lo
    return SearchResult(lo, chosen, margin, budget_mb, memory_limited, trials)


class MemoryProbe:
    """Runs `trial(batch)` and judges it against a memory budget (RSS on CPU, allocator peak on CUDA)."""

    def __init__(self, trial: Callable[[int], None], device: torch.device, budget_mb: float):
        self.trial = trial
        self.device = device
        self.budget_mb = budget_mb
        self.points: list[tuple[int, float]] = []
        memory.release_free_memory()
        # CPU: the process's resident size before any measured trial. A trial is judged as this baseline plus its
        # own growth (peak - RSS just before it), so the few MB each trial leaves behind (oneDNN primitives cached
        # per shape, allocator slack) are not charged to the next one.
        self.baseline_mb = (memory.rss_mb() or 0.0) if device.type != "cuda" else 0.0

    def predicted_mb(self, batch: int) -> float | None:
        if len(self.points) < 2:
            return None
        (b0, m0), (b1, m1) = sorted(self.points)[-2:]
        if b1 == b0:
            return None
        slope = max(0.0, (m1 - m0) / (b1 - b0))
        return m1 + slope * (batch - b1)

    def __call__(self, batch: int) -> Trial:
        if self.device.type == "cuda":
            return self._cuda(batch)
        return self._cpu(batch)

    def _cpu(self, batch: int) -> Trial:
        predicted = self.predicted_mb(batch)
        if predicted is not None and predicted > self.budget_mb * PREDICTION_SLACK:
            return Trial(batch, False, None, False, f"predicted {predicted:.0f} MB > budget, not run")
        memory.release_free_memory()
        before = memory.rss_mb() or 0.0
        memory.reset_peak_rss()
        self.trial(batch)
        peak = self.baseline_mb + memory.peak_rss_since_reset_mb() - before
        memory.release_free_memory()
        self.points.append((batch, peak))
        return Trial(batch, peak <= self.budget_mb, peak)

    def _cuda(self, batch: int) -> Trial:
        memory.release_free_memory()
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            self.trial(batch)
        except torch.OutOfMemoryError:
            memory.release_free_memory()
            return Trial(batch, False, None, True, "CUDA out of memory")
        peak = torch.cuda.max_memory_reserved(self.device) / 2**20
        memory.release_free_memory()
        self.points.append((batch, peak))
        return Trial(batch, peak <= self.budget_mb, peak)


def default_budget_mb(
    cfg_auto: DictConfig, hardware: HardwareSettings, memory_fraction: float | None
) -> float:
    if hardware.accelerator == "cuda":
        device = int(os.environ.get("LOCAL_RANK", 0))
        total = torch.cuda.get_device_properties(device).total_memory / 2**20
        return total * (memory_fraction or 1.0) * float(cfg_auto.gpu_budget_fraction)
    if cfg_auto.ram_budget_gb is not None:
        return float(cfg_auto.ram_budget_gb) * 1024.0
    available = _meminfo_mb("MemAvailable")
    current = memory.rss_mb() or 0.0
    if available is None:
        raise PixelsmithError("auto_batch on CPU needs auto_batch.ram_budget_gb (no /proc/meminfo here).")
    # Default: this process may grow into 80% of what is available now.
    return current + 0.8 * available


def _meminfo_mb(key: str) -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _config_key(cfg: DictConfig) -> str:
    parts = {
        k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "data", "hardware", "precision")
    }
    parts["accumulate"] = cfg.accumulate
    parts["auto_batch"] = OmegaConf.to_container(cfg.auto_batch, resolve=True)
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_training_trial(cfg: DictConfig, hardware: HardwareSettings) -> Callable[[int], None]:
    """One real training iteration of a fresh model at a given per-process micro-batch, on one device."""
    import lightning as L

    from pixelsmith.run.build import build_core_settings, build_datamodule, build_model

    trial_cfg = copy.deepcopy(cfg)
    with open_dict(trial_cfg):
        trial_cfg.max_steps = 1
        trial_cfg.accumulate = 1
        trial_cfg.data.num_workers = 0  # worker processes' memory is not this process's RSS
        trial_cfg.data.batch_size = 1
    single = HardwareSettings(**{**hardware.__dict__, "devices": 1, "num_nodes": 1, "strategy": "auto"})
    datamodule = build_datamodule(trial_cfg, single)

    def trial(batch: int) -> None:
        datamodule.batch_size = batch
        model = build_model(trial_cfg, build_core_settings(trial_cfg, single))
        trainer = L.Trainer(
            accelerator=hardware.accelerator,
            devices=[int(os.environ.get("LOCAL_RANK", 0))] if hardware.accelerator == "cuda" else 1,
            precision="32-true",
            max_epochs=-1,
            max_steps=-1,
            logger=False,
            callbacks=[],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            use_distributed_sampler=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        )
        trainer.fit(model, datamodule=datamodule)
        del trainer, model

    return trial


def choose_batch_size(
    cfg: DictConfig, hardware: HardwareSettings, memory_fraction: float | None
) -> int | None:
    """When `auto_batch.enabled`, search, set `cfg.data.batch_size` (global) and optionally scale the lrs."""
    auto = cfg.get("auto_batch")
    if auto is None or not auto.enabled:
        return None
    world = hardware.world_size
    configured = int(cfg.data.batch_size or hardware.batch_size)
    key = _config_key(cfg)
    inherited = os.environ.get(ENV_KEY, "")
    if inherited.startswith(key + ":"):
        chosen_global = int(inherited.split(":", 1)[1])
        log.info("auto batch: using batch %d found by rank 0", chosen_global)
    else:
        if hardware.accelerator == "mps":
            raise PixelsmithError(
                "auto_batch measures CUDA's allocator or the process RSS; an Apple GPU's memory is neither, so it "
                "is not searched there: set data.batch_size by hand."
            )
        if hardware.accelerator == "cpu" and not memory.can_reset_peak_rss():
            raise PixelsmithError(
                "auto_batch on CPU measures peak RSS through /proc/self/clear_refs, which this system lacks; "
                "set data.batch_size by hand."
            )
        device = (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            if hardware.accelerator == "cuda"
            else torch.device("cpu")
        )
        budget = default_budget_mb(auto, hardware, memory_fraction)
        trial = make_training_trial(cfg, hardware)
        start = int(auto.start or max(1, configured // world))
        # One unmeasured iteration first: one-time allocations (oneDNN/cuDNN primitives and workspaces, lazy
        # module state, Lightning internals) would otherwise be charged to the first measured batch.
        trial(min(start, 2))
        probe = MemoryProbe(trial, device, budget)
        result = search_batch_size(probe, start, int(auto.max_batch), float(auto.margin), 1, budget_mb=budget)
        result.baseline_mb = probe.baseline_mb or None
        chosen_global = result.chosen * world
        os.environ[ENV_KEY] = f"{key}:{chosen_global}"
        log.info(
            "auto batch: largest fitting micro-batch %d per process (budget %.0f MB); using %d (margin %.0f%%) "
            "x %d process(es) = data.batch_size=%d",
            result.best_fit,
            budget,
            result.chosen,
            100 * result.margin if result.memory_limited else 0.0,
            world,
            chosen_global,
        )
        _write_report(cfg, result, chosen_global)
    reference = int(auto.reference_batch or configured)
    with open_dict(cfg):
        cfg.data.batch_size = chosen_global
        if auto.scale_lr and chosen_global != reference:
            scale_learning_rates(cfg.model, chosen_global / reference)
    return chosen_global


def scale_learning_rates(model_cfg: DictConfig, factor: float) -> list[str]:
    """Multiply `lr` of every node named `*optimizer` in the model config by `factor`; returns the keys changed."""
    changed = []
    for key in list(model_cfg.keys()):
        node = model_cfg[key]
        if isinstance(node, DictConfig) and str(key).endswith("optimizer") and node.get("lr") is not None:
            node.lr = float(node.lr) * factor
            changed.append(f"model.{key}.lr")
    if changed:
        log.info("auto batch: linear lr scaling x%.3f on %s", factor, ", ".join(changed))
    return changed


def _write_report(cfg: DictConfig, result: SearchResult, chosen_global: int) -> None:
    if int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0))) != 0:
        return
    try:
        out = Path(cfg.paths.output_dir) / "perf"
        out.mkdir(parents=True, exist_ok=True)
        payload = {**asdict(result), "data.batch_size": chosen_global}
        (out / "auto_batch.json").write_text(json.dumps(payload, indent=2))
    except (OSError, ValueError) as err:  # the run dir is an interpolation outside Hydra in some tests
        log.debug("auto batch report not written: %s", err)
