"""GAN evaluation during training: FID/KID/precision-recall (and IS with Inception) every N iterations.

Each rank generates its slice of `num_samples` images with the EMA generator from one seeded set of latents, so
the number is reproducible and the same whatever the rank count; `GanMetrics` gathers the features across
ranks. Real statistics come from the on-disk cache (computed once per dataset, extractor, protocol and count).
The best value and its iteration are tracked (and restored on resume); `checkpoints/best.ckpt` is rewritten
atomically when the monitored metric improves. Iteration 0 is evaluated too, so every run shows how far it got.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from pixelsmith.metrics import GanMetrics, build_feature_extractor, load_or_compute_reference_stats

log = logging.getLogger(__name__)

# History entries carry these beside the scores: where in the run the evaluation was, not a score of it.
_NOT_SCORES = ("iteration", "kimg", "seconds")
LOWER_IS_BETTER = {"fid", "kid_mean"}


def build_gan_metric(
    datamodule,
    extractor: str | None,
    weights_path: str | None,
    metrics: list[str],
    reference_samples: int | None,
    cache_dir: str | None,
    device: torch.device,
    seed: int = 0,
    num_generated: int | None = None,
) -> GanMetrics:
    """The metric object for a datamodule that provides `reference_source(seed)`; shared with evaluate.py."""
    extractor = extractor or getattr(datamodule, "default_extractor", "inception")
    feature_extractor = build_feature_extractor(extractor, weights_path=weights_path, device=device)
    if not hasattr(datamodule, "reference_source"):
        raise TypeError(
            f"{type(datamodule).__name__} has no reference_source(): it cannot provide real statistics."
        )
    fingerprint, protocol, make_batches, available = datamodule.reference_source(seed)
    count = min(reference_samples or available, available)
    reference = load_or_compute_reference_stats(
        make_batches,
        extractor=feature_extractor,
        dataset_fingerprint=fingerprint,
        dataset_protocol=protocol,
        num_samples=count,
        cache_dir=cache_dir,
        keep_features=bool({"kid", "pr"} & set(metrics)),
    )
    wanted = [m for m in metrics if m != "is" or feature_extractor.num_logits is not None]
    return GanMetrics(
        feature_extractor, reference, metrics=wanted, kid_subset_size=min(1000, count, num_generated or count)
    ).to(device)


@torch.no_grad()
def generate_into(metric: GanMetrics, pl_module, num_samples: int, batch_size: int, seed: int) -> int:
    """Feed this rank's share of `num_samples` generated images into `metric`; returns how many it generated.

    The latents of all `num_samples` images are drawn from one generator seeded by `seed`, and rank r takes the
    r-th contiguous slice: the gathered set, in order, is the same for any number of processes, so a 2-process
    evaluation gives the number a single process gives.
    """
    world, rank = pl_module.world_size, pl_module.global_rank
    latents = torch.randn(num_samples, pl_module.z_dim, generator=torch.Generator().manual_seed(seed))
    share = latents.tensor_split(world)[rank]
    for z in share.split(batch_size):
        metric.update(pl_module.generate(z))
    return share.shape[0]


class GANEvaluation(Callback):
    def __init__(
        self,
        output_dir: str,
        every_n_steps: int = 500,
        num_samples: int = 2000,
        batch_size: int = 250,
        extractor: str | None = None,
        weights_path: str | None = None,
        metrics: tuple[str, ...] | list[str] = ("fid", "kid", "pr"),
        reference_samples: int | None = None,
        cache_dir: str | None = None,
        monitor: str = "fid",
        save_best: bool = True,
        seed: int = 0,
    ):
        self.output_dir = Path(output_dir)
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.extractor = extractor
        self.weights_path = weights_path
        self.metrics = list(metrics)
        self.reference_samples = reference_samples
        self.cache_dir = cache_dir
        self.monitor = monitor
        self.save_best = save_best
        self.seed = seed
        self.best_value: float | None = None
        self.best_iteration: int | None = None
        self._train_started: float | None = None
        self.history: list[dict[str, float]] = []
        self._metric: GanMetrics | None = None
        self._last_iteration: int | None = None
        self._applicable = True

    @property
    def enabled(self) -> bool:
        return self._applicable and self.every_n_steps > 0 and self.num_samples > 0

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.enabled and not callable(getattr(pl_module, "generate", None)):
            # FID/KID score generated samples; a model without `generate(z)` (e.g. a stylizer) has none. Turning
            # the callback off here lets such a model run without also writing `callbacks.evaluation=null`.
            log.info("%s has no generate(z): GAN evaluation is off for this run.", type(pl_module).__name__)
            self._applicable = False
        # Built before the first step: missing extractor weights stop the run here, not an hour in.
        if self.enabled and self._metric is None:
            datamodule = trainer.datamodule
            datamodule.setup("fit")
            self._metric = build_gan_metric(
                datamodule,
                self.extractor,
                self.weights_path,
                self.metrics,
                self.reference_samples,
                self.cache_dir,
                pl_module.device,
                self.seed,
                self.num_samples,
            )

    def _is_better(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best_value is None:
            return True
        lower = self.monitor in LOWER_IS_BETTER
        return value < self.best_value if lower else value > self.best_value

    def _evaluate(self, trainer, pl_module) -> None:
        iteration = int(pl_module.iteration)
        if iteration == self._last_iteration:
            return
        self._last_iteration = iteration
        metric = self._metric.to(pl_module.device)
        metric.reset()
        generate_into(metric, pl_module, self.num_samples, self.batch_size, self.seed)
        scores = metric.compute()
        scores["iteration"] = float(iteration)
        # Where in the run this was, for FID-against-time curves (benchmarks/quality.py); not logged as metrics.
        self.history.append(
            {
                **scores,
                "kimg": float(getattr(pl_module, "images_seen", 0)) / 1000.0,
                "seconds": round(time.monotonic() - (self._train_started or time.monotonic()), 2),
            }
        )
        for logger in trainer.loggers:
            logger.log_metrics(
                {f"eval/{k}": v for k, v in scores.items() if k != "iteration"}, step=iteration
            )
        value = scores.get(self.monitor, math.nan)
        if self._is_better(value):
            self.best_value, self.best_iteration = value, iteration
            if self.save_best and iteration > 0:
                self._save_best(trainer)
        if trainer.is_global_zero:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            summary = {
                "best": {self.monitor: self.best_value, "iteration": self.best_iteration},
                "history": self.history,
            }
            tmp = self.output_dir / ".eval_history.json.partial"
            tmp.write_text(json.dumps(summary, indent=2))
            os.replace(tmp, self.output_dir / "eval_history.json")
        log.info(
            "eval @ %d: %s (best %s=%.4g @ %s)",
            iteration,
            ", ".join(f"{k}={v:.4g}" for k, v in scores.items() if k not in ("iteration", "num_real")),
            self.monitor,
            self.best_value if self.best_value is not None else math.nan,
            self.best_iteration,
        )

    def final_metrics(self) -> dict[str, float]:
        """The last evaluation's scores as `eval/<name>` and the best as `eval/best_<monitor>` (for sweeps)."""
        if not self.history:
            return {}
        last = {f"eval/{k}": float(v) for k, v in self.history[-1].items() if k not in _NOT_SCORES}
        # NaN, not a crash, when no evaluation gave a finite monitored value (a diverged run, or a monitor that is
        # not among eval.metrics): the sweep records the job with a NaN objective.
        best = math.nan if self.best_value is None else float(self.best_value)
        at = math.nan if self.best_iteration is None else float(self.best_iteration)
        return {**last, f"eval/best_{self.monitor}": best, "eval/best_iteration": at}

    def _save_best(self, trainer) -> None:
        directory = self.output_dir / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / ".best.ckpt.partial"
        trainer.save_checkpoint(tmp, weights_only=False)
        if trainer.is_global_zero:
            os.replace(tmp, directory / "best.ckpt")

    def on_train_start(self, trainer, pl_module) -> None:
        self._train_started = time.monotonic()  # a history entry's "seconds" count from here (this process)
        if self.enabled and pl_module.iteration == 0:
            self._evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.enabled and pl_module.iteration % self.every_n_steps == 0:
            self._evaluate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        # Not after a preemption signal: the grace period is for last.ckpt, and an evaluation can outlast it.
        if self.enabled and getattr(pl_module, "preempted_by", None) is None:
            self._evaluate(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_iteration": self.best_iteration, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_value = state_dict.get("best_value")
        self.best_iteration = state_dict.get("best_iteration")
        self.history = list(state_dict.get("history", []))
