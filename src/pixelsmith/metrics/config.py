"""Schema of the `eval` node (GAN evaluation during training and in `evaluate.py`), beside the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pixelsmith.config.choices import choice


class Extractor(StrEnum):  # eval.extractor (None = the data's default)
    MNIST = "mnist"
    INCEPTION = "inception"


@dataclass
class EvalConfig:
    """GAN evaluation, shared by the training callback and `evaluate.py` (see README "Evaluation")."""

    every_n_steps: int = 500  # 0 disables evaluation during training
    num_samples: int = 2000  # generated images per evaluation (split across ranks)
    batch_size: int = 250
    # mnist (offline, digits) | inception (standard FID); None = the data's default
    extractor: str | None = choice(Extractor, None)
    weights_path: str | None = None  # explicit extractor weights file; else $TORCH_HOME/hub/checkpoints/
    metrics: list[str] = field(default_factory=lambda: ["fid", "kid", "pr"])  # + "is" with inception
    reference_samples: int | None = None  # real images in the reference statistics; None = all of the dataset
    cache_dir: str | None = (
        None  # reference statistics cache; None = $PIXELSMITH_CACHE or ~/.cache/pixelsmith
    )
    monitor: str = "fid"
    save_best: bool = True  # keep checkpoints/best.ckpt for the best monitored value
    seed: int = 0  # latents of the evaluation samples
