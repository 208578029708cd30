"""Style-transfer validation every N iterations on the model's fixed content/style pairs.

Logged as `val/content_ssim` (result vs content, torchmetrics SSIM), `val/content_psnr` (torchmetrics PSNR, dB), `val/content_lpips` (torchmetrics LPIPS, when
`model.validation.lpips` is on) and `val/style_gram_distance` (the Gram distance of `pixelsmith.metrics` at the loss
network's style layers: the very function the fast model's style loss is made of), to every logger at the model's
iteration, into `trainer.callback_metrics`, and appended to `<run>/style_validation.json`.

LPIPS follows the rule of the VGG loss network: its backbone weights are read from `model.validation.lpips_weights`
or `$TORCH_HOME/hub/checkpoints/`, where they are downloaded on first use (`pixelsmith.metrics.weights`); offline
(`PIXELSMITH_OFFLINE=1`) or after a failed download the run stops before the first step with a message naming the
file and the fix. The model configs default `model.validation.lpips` to
`model.loss_net.pretrained`, so an offline run with random VGG weights (whose numbers mean nothing anyway) leaves
LPIPS out without a second switch.

The model provides `validation_results()`, `validation_content`, `style_features(images)` and
`validation_target_grams()` (see `pixelsmith.style.module.StyleTransferModule`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from pixelsmith.core.precision import NO_FLOAT64_DEVICES
from pixelsmith.errors import PixelsmithError
from pixelsmith.metrics.image_metrics import LPIPS, ContentSSIM, ImagePSNR, StyleGramDistance
from pixelsmith.metrics.weights import MissingWeightsError

log = logging.getLogger(__name__)
LPIPS_CONFIG_KEY = "model.validation.lpips_weights"


class StyleValidation(Callback):
    def __init__(self, output_dir: str | None = None, every_n_steps: int = 250):
        self.output_dir = Path(output_dir) if output_dir else None
        self.every_n_steps = every_n_steps
        self.history: list[dict[str, float]] = []
        self._metrics: dict[str, Any] | None = None
        self._last_iteration: int | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.every_n_steps <= 0 or self._metrics is not None:
            return
        if not hasattr(pl_module, "validation_results"):
            raise PixelsmithError(
                f"callbacks.style_validation needs a style-transfer model; {type(pl_module).__name__} is not one. "
                "Remove it with callbacks.style_validation=null."
            )
        settings = pl_module.validation
        metrics: dict[str, Any] = {
            "content_ssim": ContentSSIM(),
            "content_psnr": ImagePSNR(),
            "style_gram_distance": StyleGramDistance(),
        }
        if settings.lpips:
            try:
                metrics["content_lpips"] = LPIPS(
                    settings.lpips_net, settings.lpips_weights, pretrained=True, config_key=LPIPS_CONFIG_KEY
                )
            except MissingWeightsError as err:
                raise MissingWeightsError(
                    f"{err} LPIPS is a validation metric only: to train without it, set model.validation.lpips=false."
                ) from err
            except ValueError as err:  # an unknown lpips_net
                raise PixelsmithError(f"model.validation.lpips_net: {err}.") from err
        self._metrics = metrics

    @torch.no_grad()
    def _validate(self, trainer, pl_module) -> None:
        iteration = int(pl_module.iteration)
        if iteration == self._last_iteration:
            return
        self._last_iteration = iteration
        results = pl_module.validation_results()
        content = pl_module.validation_content.float()
        scores: dict[str, float] = {}
        for name, metric in self._metrics.items():
            if pl_module.device.type in NO_FLOAT64_DEVICES and any(
                torch.is_tensor(state) and state.dtype == torch.float64
                for state in metric.metric_state.values()
            ):
                metric.set_dtype(
                    torch.float32
                )  # its float64 sums, in float32 where the device has no float64
            metric = self._metrics[name] = metric.to(pl_module.device)
            metric.reset()
            if name == "style_gram_distance":
                metric.update(pl_module.style_features(results), pl_module.validation_target_grams())
            else:  # the metrics library works on [-1, 1] images
                metric.update(results * 2 - 1, content * 2 - 1)
            scores[name] = float(metric.compute())
        for logger in trainer.loggers:
            logger.log_metrics({f"val/{k}": v for k, v in scores.items()}, step=iteration)
        for key, value in scores.items():
            trainer.callback_metrics[f"val/{key}"] = torch.tensor(value)
        self.history.append({"iteration": float(iteration), **scores})
        log.info("validation @ %d: %s", iteration, ", ".join(f"{k}={v:.4g}" for k, v in scores.items()))
        if trainer.is_global_zero and self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.output_dir / ".style_validation.json.partial"
            tmp.write_text(json.dumps(self.history, indent=2))
            os.replace(tmp, self.output_dir / "style_validation.json")

    def on_train_start(self, trainer, pl_module) -> None:
        if self.every_n_steps > 0:
            self._validate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every_n_steps > 0 and int(pl_module.iteration) % self.every_n_steps == 0:
            self._validate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        # Not after a preemption signal: the grace period is for last.ckpt.
        if self.every_n_steps > 0 and getattr(pl_module, "preempted_by", None) is None:
            self._validate(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
