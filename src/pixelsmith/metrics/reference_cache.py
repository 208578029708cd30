"""Real-data reference statistics, computed once per key and cached on disk as .npz.

The key is (dataset fingerprint, extractor name + feature dim + weights sha256 prefix + input protocol, the
dataset-side preprocessing, sample count). Change any part and the statistics are recomputed; keep all of them
and every run, resume and sweep job reuses the same file. A file holds float64 mean and covariance, the count,
and (unless disabled) the raw float32 features and the k-NN radii that KID and precision/recall need.

Files are written atomically (temporary file in the cache directory, then ``os.replace``), so concurrent sweep
jobs never read a half-written file; the last writer wins with identical content. Under torch.distributed, rank
0 computes first and the other ranks read its file after a barrier (the cache directory must be shared; if it is
not, the other ranks simply compute the same statistics themselves).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pixelsmith.metrics.extractors import FeatureExtractor
from pixelsmith.metrics.feature_metrics import knn_radii
from pixelsmith.metrics.fid import GaussianStats, features_to_stats
from pixelsmith.metrics.protocol import quantize_to_uint8

CACHE_FORMAT_VERSION = 1
CACHE_ENV_VAR = "PIXELSMITH_CACHE"
DEFAULT_PR_K = 3


def default_cache_dir() -> Path:
    """``$PIXELSMITH_CACHE/fid_stats`` if that variable is set, else ``~/.cache/pixelsmith/fid_stats``."""
    root = os.environ.get(CACHE_ENV_VAR)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "pixelsmith"
    return base / "fid_stats"


@dataclass
class ReferenceStats:
    """Statistics of the real images for one cache key."""

    mean: np.ndarray  # float64 [D]
    cov: np.ndarray  # float64 [D, D]
    count: int
    key: dict
    features: np.ndarray | None = None  # float32 [N, D], for KID and precision/recall
    knn_radii: dict[int, np.ndarray] = field(default_factory=dict)  # k -> float32 [N]
    path: Path | None = None
    recomputed: bool = False  # True when this call extracted features (a cache miss)

    @property
    def gaussian(self) -> GaussianStats:
        return GaussianStats(mean=self.mean, cov=self.cov, count=self.count)


def reference_key(
    extractor: FeatureExtractor, dataset_fingerprint: str, dataset_protocol: str, num_samples: int
) -> dict:
    """The cache key as a JSON-able dict (stored in the file and hashed into its name)."""
    return {
        "format": CACHE_FORMAT_VERSION,
        "dataset": dataset_fingerprint,
        "dataset_protocol": dataset_protocol,
        "num_samples": int(num_samples),
        **extractor.cache_identity,
    }


def reference_cache_path(key: dict, cache_dir: str | os.PathLike | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(key["extractor"]))
    directory = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return directory / f"{readable}-n{key['num_samples']}-{digest}.npz"


def extract_features(
    extractor: FeatureExtractor, batches: Iterable[torch.Tensor], num_samples: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``extractor`` over image batches (float in [-1, 1] or uint8), stopping after ``num_samples`` images."""
    features, logits, seen = [], [], 0
    for batch in batches:
        if num_samples is not None:
            batch = batch[: num_samples - seen]
        batch_features, batch_logits = extractor(quantize_to_uint8(batch))
        features.append(batch_features.float().cpu())
        if batch_logits is not None:
            logits.append(batch_logits.float().cpu())
        seen += batch.shape[0]
        if num_samples is not None and seen >= num_samples:
            break
    if num_samples is not None and seen < num_samples:
        raise ValueError(f"the reference data yielded {seen} images, fewer than the {num_samples} requested")
    if not features:
        raise ValueError("no images to extract features from")
    return torch.cat(features), (torch.cat(logits) if logits else None)


def load_or_compute_reference_stats(
    make_batches: Callable[[], Iterable[torch.Tensor]],
    *,
    extractor: FeatureExtractor,
    dataset_fingerprint: str,
    num_samples: int,
    dataset_protocol: str = "",
    cache_dir: str | os.PathLike | None = None,
    keep_features: bool = True,
    pr_k: int = DEFAULT_PR_K,
    use_cache: bool = True,
) -> ReferenceStats:
    """Return the real-data statistics for this key, from the cache or by extracting ``num_samples`` images.

    ``make_batches`` is only called on a cache miss; it must return an iterable of image batches ([B, C, H, W],
    float in [-1, 1] or uint8) in a *deterministic* order, because the first ``num_samples`` images are used.
    ``dataset_fingerprint`` identifies the data and the subset (e.g. file hash + shuffling seed);
    ``dataset_protocol`` describes the dataset-side preprocessing (resize, crop) that precedes quantization.
    """
    key = reference_key(extractor, dataset_fingerprint, dataset_protocol, num_samples)
    path = reference_cache_path(key, cache_dir)
    rank, world_size = _distributed_rank()
    if world_size > 1 and rank != 0:
        torch.distributed.barrier()  # wait for rank 0 to compute and write the statistics
    try:
        stats = _load(path, key, keep_features) if use_cache else None
        if stats is None:
            features, _ = extract_features(extractor, make_batches(), num_samples)
            stats = _stats_from_features(features, key, keep_features, pr_k)
            if use_cache:
                _save_atomically(stats, path)
                stats.path = path
    finally:
        if world_size > 1 and rank == 0:
            torch.distributed.barrier()
    return stats


def _stats_from_features(features: torch.Tensor, key: dict, keep_features: bool, pr_k: int) -> ReferenceStats:
    gaussian = features_to_stats(features, "reference features")
    stats = ReferenceStats(
        mean=gaussian.mean, cov=gaussian.cov, count=gaussian.count, key=key, recomputed=True
    )
    if keep_features:
        stats.features = features.numpy().astype(np.float32)
        stats.knn_radii[pr_k] = knn_radii(features, pr_k).numpy()
    return stats


def _save_atomically(stats: ReferenceStats, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "key_json": np.array(json.dumps(stats.key, sort_keys=True)),
        "mean": stats.mean,
        "cov": stats.cov,
        "count": np.array(stats.count, dtype=np.int64),
    }
    if stats.features is not None:
        arrays["features"] = stats.features
    for k, radii in stats.knn_radii.items():
        arrays[f"knn_radii_k{k}"] = radii
    temporary_name = None
    try:
        with tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp", delete=False
        ) as handle:
            temporary_name = handle.name
            np.savez(handle, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary_name, path)
    except BaseException:
        if temporary_name is not None and os.path.exists(temporary_name):
            os.remove(temporary_name)
        raise


def _load(path: Path, key: dict, need_features: bool) -> ReferenceStats | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            stored_key = json.loads(str(data["key_json"]))
            if (
                stored_key != key
            ):  # a hash collision or a hand-copied file: never use statistics of another key
                warnings.warn(f"reference statistics {path} belong to another key; recomputing", stacklevel=3)
                return None
            if need_features and "features" not in data.files:
                return None
            stats = ReferenceStats(
                mean=data["mean"].astype(np.float64),
                cov=data["cov"].astype(np.float64),
                count=int(data["count"]),
                key=stored_key,
                features=data["features"] if "features" in data.files else None,
                path=path,
            )
            for name in data.files:
                if name.startswith("knn_radii_k"):
                    stats.knn_radii[int(name[len("knn_radii_k") :])] = data[name]
            return stats
    # A truncated or foreign file (BadZipFile, EOFError, ...) is recomputed and overwritten.
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        warnings.warn(f"could not read reference statistics {path} ({error}); recomputing", stacklevel=3)
        return None


def _distributed_rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
