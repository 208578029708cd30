"""FID arithmetic: agreement with the float64 NumPy/SciPy reference and torchmetrics, and the few-samples case."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance

from pixelsmith.metrics import FewSamplesWarning, features_to_stats, fid_from_features, frechet_distance


def _correlated_features(rng: np.random.Generator, count: int, dim: int, shift: float) -> np.ndarray:
    mixing = rng.normal(size=(dim, dim)) / np.sqrt(dim)
    return rng.normal(size=(count, dim)) @ mixing + shift * rng.normal(size=dim)


def _scipy_reference_fid(features1: np.ndarray, features2: np.ndarray) -> float:
    """The classic TTUR/pytorch-fid computation: np.cov and scipy.linalg.sqrtm of the product, float64."""
    mu1, mu2 = features1.mean(axis=0), features2.mean(axis=0)
    sigma1, sigma2 = np.cov(features1, rowvar=False), np.cov(features2, rowvar=False)
    covmean = scipy.linalg.sqrtm(sigma1 @ sigma2)
    assert np.abs(covmean.imag).max() < 1e-8 if np.iscomplexobj(covmean) else True
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean.real))


@pytest.mark.parametrize("dim", [16, 64])
def test_fid_equals_scipy_reference_within_1e_6(dim: int) -> None:
    rng = np.random.default_rng(dim)
    real = _correlated_features(rng, 600, dim, shift=0.0)
    fake = _correlated_features(rng, 500, dim, shift=0.5)
    reference = _scipy_reference_fid(real, fake)
    ours = fid_from_features(real, fake)
    assert reference > 1.0  # a real distance, not a cancellation to ~0
    assert ours == pytest.approx(reference, rel=1e-6)
    # Our statistics are numpy's: float64 mean and the N-1 covariance.
    stats = features_to_stats(torch.from_numpy(real).float())
    assert stats.mean.dtype == np.float64 and stats.cov.dtype == np.float64
    np.testing.assert_allclose(
        stats.cov, np.cov(real.astype(np.float32).astype(np.float64), rowvar=False), rtol=1e-12
    )


def test_fid_equals_torchmetrics_on_identical_features() -> None:
    """torchmetrics' FrechetInceptionDistance fed the same features (identity extractor, float64) agrees."""

    class Identity(nn.Module):
        num_features = 32

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return features

    rng = np.random.default_rng(1)
    real = torch.from_numpy(_correlated_features(rng, 400, 32, 0.0))
    fake = torch.from_numpy(_correlated_features(rng, 300, 32, 0.3))
    reference = FrechetInceptionDistance(feature=Identity())
    reference.update(real, real=True)
    reference.update(fake, real=False)
    assert fid_from_features(real, fake) == pytest.approx(float(reference.compute()), rel=1e-6)


def test_identical_statistics_give_zero_not_a_negative_number() -> None:
    rng = np.random.default_rng(2)
    stats = features_to_stats(_correlated_features(rng, 300, 32, 0.0))
    assert frechet_distance(stats, stats) == pytest.approx(0.0, abs=1e-9 * np.trace(stats.cov))
    assert frechet_distance(stats, stats) >= 0.0


def test_fewer_samples_than_dimensions_warns_and_gives_the_exact_finite_value() -> None:
    rng = np.random.default_rng(3)
    dim = 64
    real = _correlated_features(rng, 40, dim, 0.0)
    fake = _correlated_features(rng, 25, dim, 0.4)
    with pytest.warns(FewSamplesWarning) as record:
        ours = fid_from_features(real, fake)
    messages = [str(warning.message) for warning in record]
    assert any("40 samples for 64 feature dimensions" in message for message in messages)
    assert any("25 samples for 64 feature dimensions" in message for message in messages)
    assert isinstance(ours, float) and np.isfinite(ours) and ours > 0
    # Independent exact value: with S1 = A^T A and S2 = B^T B (A, B the centred features over sqrt(N-1)),
    # Tr sqrt(S1 S2) is the sum of the singular values of A B^T, an n1 x n2 matrix with no singular structure.
    centred_real = (real - real.mean(0)) / np.sqrt(len(real) - 1)
    centred_fake = (fake - fake.mean(0)) / np.sqrt(len(fake) - 1)
    trace_sqrt = np.linalg.svd(centred_real @ centred_fake.T, compute_uv=False).sum()
    diff = real.mean(0) - fake.mean(0)
    exact = diff @ diff + (centred_real**2).sum() + (centred_fake**2).sum() - 2 * trace_sqrt
    assert ours == pytest.approx(exact, rel=1e-8)


def test_enough_samples_do_not_warn() -> None:
    rng = np.random.default_rng(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FewSamplesWarning)
        fid_from_features(_correlated_features(rng, 65, 64, 0.0), _correlated_features(rng, 65, 64, 0.1))


def test_non_finite_features_are_an_error_not_a_nan_score() -> None:
    features = np.ones((10, 4))
    features[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        fid_from_features(features, np.random.default_rng(5).normal(size=(10, 4)))
    with pytest.raises(ValueError, match="at least 2 samples"):
        fid_from_features(np.ones((1, 4)), np.ones((5, 4)))
