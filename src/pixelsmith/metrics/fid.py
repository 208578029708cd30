"""Fréchet distance between two Gaussians fitted to features, in float64, defined even with few samples.

FID = |mu1 - mu2|^2 + Tr(S1) + Tr(S2) - 2 Tr((S1 S2)^(1/2)).

The reference implementations take ``sqrtm(S1 @ S2)`` (SciPy) or complex eigenvalues of the non-symmetric product
(torch-fidelity, torchmetrics). Both can produce complex or NaN values when a covariance is singular, which it is
whenever there are fewer samples than feature dimensions. We use the identity
Tr((S1 S2)^(1/2)) = Tr((A S2 A)^(1/2)) with A = S1^(1/2): A S2 A is symmetric positive semi-definite, so its
eigenvalues are real; eigenvalues below the float64 rounding level (including slightly negative ones) are set
to zero. The
result is always a finite real number, equal to the SciPy reference to ~1e-12 when the covariances are full rank.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch


class FewSamplesWarning(UserWarning):
    """Fewer samples than feature dimensions: the covariance is singular and FID is biased (but still defined)."""


@dataclass(frozen=True)
class GaussianStats:
    """Mean and covariance (float64) of a feature set, and how many samples they came from."""

    mean: np.ndarray
    cov: np.ndarray
    count: int


def features_to_stats(features: torch.Tensor | np.ndarray, name: str = "features") -> GaussianStats:
    """Float64 mean and unbiased covariance (divided by N-1, as numpy.cov and torch-fidelity) of [N, D] features.

    The features are centred in float64 before the product, which avoids the cancellation of the
    sum-of-squares formula (E[x x^T] - mu mu^T) used by streaming implementations.
    """
    if isinstance(features, torch.Tensor):
        features = features.detach().cpu().double().numpy()
    features = np.asarray(features, dtype=np.float64)
    if features.ndim != 2:
        raise ValueError(f"{name}: expected features [N, D], got shape {features.shape}")
    count, dim = features.shape
    if count < 2:
        raise ValueError(f"{name}: need at least 2 samples to estimate a covariance, got {count}")
    if not np.isfinite(features).all():
        raise ValueError(f"{name}: features contain NaN or inf; the extractor or the images are broken")
    mean = features.mean(axis=0)
    centred = features - mean
    cov = centred.T @ centred / (count - 1)
    return GaussianStats(mean=mean, cov=cov, count=count)


def _clamp_numerical_zeros(eigenvalues: np.ndarray) -> np.ndarray:
    """Eigenvalues below the rounding level of the largest one are zero (the rank cut-off numpy.linalg uses).

    Without this a singular covariance's ~1e-16 rounding noise becomes ~1e-8 after the square root, once per
    missing rank, which is visible in the FID of small sample sets.
    """
    tolerance = eigenvalues.shape[0] * np.finfo(np.float64).eps * max(float(np.abs(eigenvalues).max()), 0.0)
    return np.where(eigenvalues > tolerance, eigenvalues, 0.0)


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    eigenvalues, eigenvectors = np.linalg.eigh(matrix)
    return (eigenvectors * np.sqrt(_clamp_numerical_zeros(eigenvalues))) @ eigenvectors.T


def frechet_distance(stats1: GaussianStats, stats2: GaussianStats) -> float:
    """FID between two feature Gaussians, float64, always finite and >= 0.

    Warns with :class:`FewSamplesWarning` when either side has no more samples than feature dimensions (its
    covariance is then rank-deficient); the value is still the exact Fréchet distance of the two estimated
    Gaussians, computed without complex numbers.
    """
    mean1, cov1 = np.asarray(stats1.mean, np.float64), np.asarray(stats1.cov, np.float64)
    mean2, cov2 = np.asarray(stats2.mean, np.float64), np.asarray(stats2.cov, np.float64)
    dim = mean1.shape[0]
    if mean2.shape != (dim,) or cov1.shape != (dim, dim) or cov2.shape != (dim, dim):
        raise ValueError(
            f"feature dimensions differ: mean {mean1.shape} vs {mean2.shape}, cov {cov1.shape} vs {cov2.shape}"
        )
    for label, array in (("mean 1", mean1), ("cov 1", cov1), ("mean 2", mean2), ("cov 2", cov2)):
        if not np.isfinite(array).all():
            raise ValueError(f"FID statistics contain NaN or inf ({label})")
    for label, count in (("first", stats1.count), ("second", stats2.count)):
        if count <= dim:
            warnings.warn(
                f"FID: the {label} set has {count} samples for {dim} feature dimensions, so its covariance is "
                f"singular and the score is biased upwards; it is still computed exactly (eigenvalues of a "
                f"symmetric PSD matrix, rounding-level ones set to 0), but compare it only with scores made with the "
                f"same sample count. Use more samples than {dim} for a standard FID.",
                FewSamplesWarning,
                stacklevel=2,
            )
    # Symmetrise: covariances loaded from disk or accumulated in another order can be asymmetric by 1 ulp.
    cov1 = (cov1 + cov1.T) / 2
    cov2 = (cov2 + cov2.T) / 2
    sqrt_cov1 = _sqrt_psd(cov1)
    middle = sqrt_cov1 @ cov2 @ sqrt_cov1
    eigenvalues = np.linalg.eigvalsh((middle + middle.T) / 2)
    trace_sqrt_product = float(np.sqrt(_clamp_numerical_zeros(eigenvalues)).sum())
    diff = mean1 - mean2
    fid = float(diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * trace_sqrt_product)
    # The true distance is >= 0; a tiny negative value is rounding on (near-)identical statistics.
    return max(fid, 0.0)


def fid_from_features(features1: torch.Tensor | np.ndarray, features2: torch.Tensor | np.ndarray) -> float:
    """FID between two raw feature sets [N1, D] and [N2, D] (float64 throughout)."""
    return frechet_distance(
        features_to_stats(features1, "features 1"), features_to_stats(features2, "features 2")
    )
