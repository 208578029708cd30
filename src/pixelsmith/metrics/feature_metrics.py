"""KID, Inception Score and improved precision/recall computed from features, with torch-fidelity's conventions.

Feature extraction happens once (see :class:`pixelsmith.metrics.GanMetrics`); these functions only do the
arithmetic. KID uses torchmetrics' polynomial kernel and unbiased MMD estimator (with a faster way of summing
the subsets' kernel blocks when all kernels fit in memory); the Inception Score and precision/recall
(Kynkäänniemi et al. 2019, "Improved Precision and Recall Metric for Assessing Generative Models", k=3) are not
available from torchmetrics as functions on features, so they are written here, following torch-fidelity 0.4.0
line by line (subset sampling with ``numpy.random.RandomState(seed)``, split boundaries, k-th neighbour
including the point itself) so that identical features give identical numbers.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torchmetrics.image.kid import maximum_mean_discrepancy, poly_kernel

# torch-fidelity's default rng_seed: with it our KID subsets and IS shuffling are the ones torch-fidelity draws.
DEFAULT_SEED = 2020
# Above this many float64 kernel entries, KID is computed per subset instead of from full kernel matrices.
_FULL_KERNEL_MAX_ENTRIES = 128 * 1024 * 1024  # 1 GiB of float64


def kernel_inception_distance(
    real_features: torch.Tensor,
    fake_features: torch.Tensor,
    subsets: int = 100,
    subset_size: int = 1000,
    seed: int = DEFAULT_SEED,
    degree: int = 3,
    gamma: float | None = None,
    coef: float = 1.0,
    method: str = "auto",
) -> tuple[float, float]:
    """KID mean and (population) std over random subsets, polynomial kernel (x.y/d + 1)^3, float64.

    Subsets are drawn as torch-fidelity draws them (generated first, then real, ``RandomState(seed).choice``
    without replacement), and each subset's estimate is the unbiased MMD^2 of torchmetrics/torch-fidelity. When
    there are fewer samples than ``subset_size`` the subset size shrinks, with a warning.

    ``method``: "subsets" computes three kernel matrices per subset (torchmetrics' ``poly_mmd`` path);
    "full" computes the three kernels over all samples once and gets every subset's sums as v^T K v with 0/1
    selection vectors, one matrix product for all subsets; "auto" (default) picks "full" when it is cheaper
    and the kernels fit in 1 GiB. Both give the same numbers up to float64 rounding.
    """
    real = real_features.detach().cpu().double()
    fake = fake_features.detach().cpu().double()
    n_real, n_fake = real.shape[0], fake.shape[0]
    size = min(subset_size, n_real, n_fake)
    if size < 2:
        raise ValueError(f"KID needs at least 2 real and 2 generated samples, got {n_real} and {n_fake}")
    if size < subset_size:
        warnings.warn(
            f"KID: subset size reduced from {subset_size} to {size} ({n_real} real, {n_fake} generated samples); "
            f"only compare with KIDs computed at the same subset size.",
            UserWarning,
            stacklevel=2,
        )
    rng = np.random.RandomState(seed)
    draws = [
        (rng.choice(n_fake, size, replace=False), rng.choice(n_real, size, replace=False))
        for _ in range(subsets)
    ]
    if method == "auto":
        full_entries = n_real * n_real + n_fake * n_fake + n_real * n_fake
        cheaper = full_entries < subsets * 3 * size * size
        method = "full" if cheaper and full_entries <= _FULL_KERNEL_MAX_ENTRIES else "subsets"
    if method == "full":
        scores = _subset_mmds_from_full_kernels(real, fake, draws, size, degree, gamma, coef)
    elif method == "subsets":
        scores = np.zeros(subsets)
        for i, (fake_idx, real_idx) in enumerate(draws):
            f_real, f_fake = real[torch.from_numpy(real_idx)], fake[torch.from_numpy(fake_idx)]
            k_xx = poly_kernel(f_real, f_real, degree, gamma, coef)
            k_yy = poly_kernel(f_fake, f_fake, degree, gamma, coef)
            k_xy = poly_kernel(f_real, f_fake, degree, gamma, coef)
            scores[i] = float(maximum_mean_discrepancy(k_xx, k_xy, k_yy))
    else:
        raise ValueError(f"method must be 'auto', 'full' or 'subsets', got {method!r}")
    return float(scores.mean()), float(scores.std())


def _subset_mmds_from_full_kernels(real, fake, draws, size, degree, gamma, coef) -> np.ndarray:
    """Unbiased MMD^2 of every subset from kernels over all samples, without gathering sub-matrices.

    With v a 0/1 column selecting a subset, the sum of the subset's kernel block is v^T K v and its trace is
    diag(K).v; stacking all subsets' v as columns makes this one matrix product per kernel.
    """
    k_real = poly_kernel(real, real, degree, gamma, coef)
    k_fake = poly_kernel(fake, fake, degree, gamma, coef)
    k_cross = poly_kernel(real, fake, degree, gamma, coef)
    real_select = torch.zeros(real.shape[0], len(draws), dtype=torch.float64)
    fake_select = torch.zeros(fake.shape[0], len(draws), dtype=torch.float64)
    for column, (fake_idx, real_idx) in enumerate(draws):
        real_select[torch.from_numpy(real_idx), column] = 1.0
        fake_select[torch.from_numpy(fake_idx), column] = 1.0
    real_sum = ((k_real @ real_select) * real_select).sum(0) - k_real.diagonal() @ real_select
    fake_sum = ((k_fake @ fake_select) * fake_select).sum(0) - k_fake.diagonal() @ fake_select
    cross_sum = ((k_cross @ fake_select) * real_select).sum(0)
    mmd = (real_sum + fake_sum) / (size * (size - 1)) - 2 * cross_sum / (size * size)
    return mmd.numpy()


def inception_score(logits: torch.Tensor, splits: int = 10, seed: int = DEFAULT_SEED) -> tuple[float, float]:
    """Inception Score mean and std over ``splits`` chunks of shuffled logits, float64 (torch-fidelity's recipe)."""
    logits = logits.detach().cpu()
    count = logits.shape[0]
    if count < splits:
        raise ValueError(f"Inception Score with {splits} splits needs at least {splits} samples, got {count}")
    logits = logits[torch.from_numpy(np.random.RandomState(seed).permutation(count))].double()
    probs = logits.softmax(dim=1)
    log_probs = logits.log_softmax(dim=1)
    scores = []
    for i in range(splits):
        chunk = slice(i * count // splits, (i + 1) * count // splits)
        p_chunk, log_p_chunk = probs[chunk], log_probs[chunk]
        marginal = p_chunk.mean(dim=0, keepdim=True)
        kl = (p_chunk * (log_p_chunk - marginal.log())).sum(dim=1).mean()
        scores.append(float(kl.exp()))
    return float(np.mean(scores)), float(np.std(scores))


def knn_radii(features: torch.Tensor, k: int = 3, batch_size: int = 10000) -> torch.Tensor:
    """Distance of every sample to its k-th nearest neighbour in the same set (itself excluded), float32."""
    features = features.detach().float().cpu()
    if features.shape[0] <= k:
        raise ValueError(f"precision/recall with k={k} needs more than {k} samples, got {features.shape[0]}")
    radii = [
        torch.cdist(batch, features).kthvalue(k + 1, dim=1).values for batch in features.split(batch_size)
    ]
    return torch.cat(radii)


def precision_recall(
    real_features: torch.Tensor,
    fake_features: torch.Tensor,
    k: int = 3,
    real_radii: torch.Tensor | None = None,
    batch_size: int = 10000,
) -> tuple[float, float]:
    """Improved precision and recall (Kynkäänniemi et al. 2019) with k-nearest-neighbour balls.

    Precision: the fraction of generated samples inside at least one real sample's k-NN ball. Recall: the fraction
    of real samples inside at least one generated sample's ball. ``real_radii`` (from :func:`knn_radii`) can come
    from the reference cache, which saves the O(N_real^2) neighbour search on every evaluation.
    """
    real = real_features.detach().float().cpu()
    fake = fake_features.detach().float().cpu()
    if real_radii is None:
        real_radii = knn_radii(real, k, batch_size)
    fake_radii = knn_radii(fake, k, batch_size)
    fake_covered = torch.zeros(fake.shape[0], dtype=torch.bool)
    real_covered = []
    start = 0
    # Same orientation as torch-fidelity (rows real, columns generated) so identical features give identical flags.
    for real_batch in real.split(batch_size):
        dist = torch.cdist(real_batch, fake)
        radii_batch = real_radii[start : start + real_batch.shape[0]]
        fake_covered |= (dist <= radii_batch[:, None]).any(dim=0)
        real_covered.append((dist <= fake_radii[None, :]).any(dim=1))
        start += real_batch.shape[0]
    precision = fake_covered.float().mean().item()
    recall = torch.cat(real_covered).float().mean().item()
    return precision, recall
