"""One torchmetrics Metric computing FID, KID, Inception Score and precision/recall for generated images.

Usage (a Lightning callback or a script)::

    extractor = build_feature_extractor("mnist")                    # or "inception"
    fingerprint, protocol, batches = mnist_reference("data/mnist_5k.npz")
    reference = load_or_compute_reference_stats(batches, extractor=extractor, dataset_fingerprint=fingerprint,
                                                dataset_protocol=protocol, num_samples=5000)
    metric = GanMetrics(extractor, reference)
    for images in generated_batches:        # each DDP rank feeds its own share, float in [-1, 1] or uint8
        metric.update(images)
    scores = metric.compute()               # syncs across ranks; {"fid": ..., "kid_mean": ..., ...}
    metric.reset()

Why not three torchmetrics objects (FrechetInceptionDistance, KernelInceptionDistance, InceptionScore)? Each one
runs its own Inception forward pass on every image, which would make evaluation 3x slower than torch-fidelity, and
each keeps its own copy of the real side, which we load from the cache instead. So the images go through the
extractor once, the generated features accumulate in a ``dist_reduce_fx="cat"`` state (torchmetrics gathers it
across ranks on ``compute``), and the arithmetic reuses torchmetrics (KID kernel/MMD, the Inception module) and our
float64 Fréchet distance.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from pixelsmith.metrics.extractors import FeatureExtractor
from pixelsmith.metrics.feature_metrics import (
    DEFAULT_SEED,
    inception_score,
    kernel_inception_distance,
    precision_recall,
)
from pixelsmith.metrics.fid import features_to_stats, frechet_distance
from pixelsmith.metrics.protocol import quantize_to_uint8
from pixelsmith.metrics.reference_cache import DEFAULT_PR_K, ReferenceStats

ALL_GAN_METRICS = ("fid", "kid", "is", "pr")


class GanMetrics(Metric):
    """FID / KID / IS / precision-recall of generated images against cached real statistics.

    ``compute()`` returns a dict of floats: ``fid``, ``kid_mean``, ``kid_std``, ``is_mean``, ``is_std``,
    ``precision``, ``recall`` (those requested in ``metrics``), plus ``num_generated`` and ``num_real``.
    Lower is better for FID and KID, higher for the others. Call ``update``/``compute``; calling the object
    itself only updates (a per-batch FID would be meaningless and slow).
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(
        self,
        extractor: FeatureExtractor,
        reference: ReferenceStats,
        metrics: Sequence[str] = ALL_GAN_METRICS,
        kid_subsets: int = 100,
        kid_subset_size: int = 1000,
        is_splits: int = 10,
        pr_k: int = DEFAULT_PR_K,
        seed: int = DEFAULT_SEED,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        unknown = set(metrics) - set(ALL_GAN_METRICS)
        if unknown:
            raise ValueError(f"unknown GAN metrics {sorted(unknown)}; choose from {ALL_GAN_METRICS}")
        identity = extractor.cache_identity
        mismatched = {name: (reference.key.get(name), value) for name, value in identity.items()}
        mismatched = {name: pair for name, pair in mismatched.items() if pair[0] != pair[1]}
        if mismatched:
            raise ValueError(
                f"the reference statistics were made with another extractor or protocol: {mismatched} "
                f"(stored, current); recompute them with this extractor"
            )
        if {"kid", "pr"} & set(metrics) and reference.features is None:
            raise ValueError(
                "KID and precision/recall need the reference's raw features (keep_features=True)"
            )
        if "is" in metrics and extractor.num_logits is None:
            raise ValueError(
                f"the Inception Score needs class logits, which extractor {extractor.name} lacks"
            )
        self.extractor = extractor
        self.reference = reference
        self.metrics = tuple(metrics)
        self.kid_subsets = kid_subsets
        self.kid_subset_size = kid_subset_size
        self.is_splits = is_splits
        self.pr_k = pr_k
        self.seed = seed
        self._real_features = torch.from_numpy(reference.features) if reference.features is not None else None
        self._real_radii = (
            torch.from_numpy(reference.knn_radii[pr_k]) if pr_k in reference.knn_radii else None
        )
        self.add_state("generated_features", default=[], dist_reduce_fx="cat")
        if "is" in self.metrics:
            self.add_state("generated_logits", default=[], dist_reduce_fx="cat")

    def forward(self, images: torch.Tensor) -> None:  # type: ignore[override]
        self.update(images)

    def update(self, images: torch.Tensor) -> None:
        """Add generated images [B, C, H, W] (float in [-1, 1], quantized here, or uint8)."""
        features, logits = self.extractor(quantize_to_uint8(images))
        self.generated_features.append(features.float())
        if "is" in self.metrics:
            self.generated_logits.append(logits.float())

    def compute(self) -> dict[str, float]:
        generated = dim_zero_cat(self.generated_features).cpu()
        results: dict[str, float] = {
            "num_generated": float(generated.shape[0]),
            "num_real": float(self.reference.count),
        }
        if "fid" in self.metrics:
            results["fid"] = frechet_distance(
                self.reference.gaussian, features_to_stats(generated, "generated")
            )
        if "kid" in self.metrics:
            results["kid_mean"], results["kid_std"] = kernel_inception_distance(
                self._real_features, generated, self.kid_subsets, self.kid_subset_size, self.seed
            )
        if "is" in self.metrics:
            logits = dim_zero_cat(self.generated_logits).cpu()
            results["is_mean"], results["is_std"] = inception_score(logits, self.is_splits, self.seed)
        if "pr" in self.metrics:
            results["precision"], results["recall"] = precision_recall(
                self._real_features, generated, self.pr_k, real_radii=self._real_radii
            )
        return results
