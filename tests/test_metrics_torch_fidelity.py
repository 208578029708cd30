"""Agreement with torch-fidelity 0.4.0: same Inception weights file, same images -> same FID; same features ->
same KID, Inception Score and precision/recall.

The weights file is a randomly initialised FID Inception-v3 written to tmp_path (no download on this machine); the
loading and forward code paths are the ones the real pt_inception-2015-12-05-6726825d.pth takes. FID is compared
at the 64-d layer: the images go through the identical protocol (uint8 rounding, TF1-bilinear resize to 299,
(x-128)/128, the Inception stem) and the forward pass stops after the stem, which makes 2 x 160 images affordable
on a CPU (~40 img/s instead of ~12). A separate test checks that the full-depth 2048-d features and logits are
identical to torch-fidelity's, so nothing beyond the stem differs either.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch_fidelity
from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
from torch_fidelity.metric_isc import isc_features_to_metric
from torch_fidelity.metric_kid import kid_features_to_metric
from torch_fidelity.metric_prc import prc_features_to_metric

from benchmarks.metrics_bench import Uint8Images
from pixelsmith.metrics import (
    GanMetrics,
    InceptionFeatureExtractor,
    inception_score,
    kernel_inception_distance,
    load_or_compute_reference_stats,
    make_random_fid_inception_weights,
    precision_recall,
    quantize_to_uint8,
)


def _smooth_images(count: int, seed: int, contrast: float, brightness: float) -> torch.Tensor:
    """Float RGB images in [-1, 1], 32x32: upsampled 4x4 noise (structure at several scales)."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(count, 3, 4, 4, generator=generator)
    fine = torch.randn(count, 3, 32, 32, generator=generator) * 0.1
    images = F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False) + fine
    return (contrast * images + brightness).tanh()


@pytest.fixture(scope="module")
def inception_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_fid_inception_weights(tmp_path_factory.mktemp("weights") / "random_fid_inception.pth")


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_fid_equals_torch_fidelity_with_the_same_weights_file(
    inception_weights: Path, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    real = _smooth_images(80, seed=1, contrast=0.8, brightness=0.0)
    fake = _smooth_images(80, seed=2, contrast=1.2, brightness=0.2)

    extractor = InceptionFeatureExtractor(inception_weights, feature_layer=64, with_logits=False)
    reference = load_or_compute_reference_stats(
        lambda: real.split(40),
        extractor=extractor,
        dataset_fingerprint="synthetic-smooth-seed1",
        num_samples=real.shape[0],
        cache_dir=tmp_path,
        keep_features=False,
    )
    metric = GanMetrics(extractor, reference, metrics=("fid",))
    for batch in fake.split(40):
        metric.update(batch)
    ours = metric.compute()["fid"]

    theirs = torch_fidelity.calculate_metrics(
        input1=Uint8Images(quantize_to_uint8(fake)),
        input2=Uint8Images(quantize_to_uint8(real)),
        fid=True,
        feature_extractor="inception-v3-compat",
        feature_layer_fid="64",
        feature_extractor_weights_path=str(inception_weights),
        batch_size=40,
        cuda=False,
        cache=False,
        save_cpu_ram=True,
        verbose=False,
    )["frechet_inception_distance"]
    assert theirs > 1e-3  # the two image sets really differ
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_full_depth_features_and_logits_equal_torch_fidelity(inception_weights: Path) -> None:
    images = quantize_to_uint8(_smooth_images(2, seed=3, contrast=1.0, brightness=0.0))
    ours_features, ours_logits = InceptionFeatureExtractor(inception_weights, feature_layer=2048)(images)
    reference = FeatureExtractorInceptionV3(
        "inception-v3-compat",
        ["2048", "logits_unbiased"],
        feature_extractor_weights_path=str(inception_weights),
    )
    with torch.no_grad():
        their_features, their_logits = reference(images)
    assert ours_features.std() > 0  # the random network does not collapse to constant features
    torch.testing.assert_close(ours_features, their_features, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_logits, their_logits, rtol=1e-5, atol=1e-5)


def test_kid_is_and_precision_recall_equal_torch_fidelity_on_the_same_features() -> None:
    generator = torch.Generator().manual_seed(7)
    real = torch.randn(300, 24, generator=generator).abs()
    fake = (torch.randn(260, 24, generator=generator) * 1.1 + 0.1).abs()
    common = {"verbose": False, "rng_seed": 2020}

    theirs_kid = kid_features_to_metric(fake, real, kid_subsets=20, kid_subset_size=100, **common)
    for method in ("full", "subsets"):  # both ways of summing the kernels
        ours_kid = kernel_inception_distance(real, fake, subsets=20, subset_size=100, method=method)
        # torch-fidelity's kernels are float32, ours float64: agreement to float32 rounding of an MMD estimate.
        assert ours_kid[0] == pytest.approx(theirs_kid["kernel_inception_distance_mean"], rel=1e-4)
        assert ours_kid[1] == pytest.approx(theirs_kid["kernel_inception_distance_std"], rel=1e-3)

    precision, recall = precision_recall(real, fake, k=3)
    theirs_prc = prc_features_to_metric(
        fake, real, prc_neighborhood=3, prc_batch_size=10000, save_cpu_ram=False, **common
    )
    assert (precision, recall) == (theirs_prc["precision"], theirs_prc["recall"])
    assert 0.0 < precision < 1.0 and 0.0 < recall < 1.0

    logits = torch.randn(200, 10, generator=generator) * 3
    ours_is = inception_score(logits, splits=10)
    theirs_is = isc_features_to_metric(logits, splits=10, shuffle=True, rng_seed=2020)
    assert ours_is[0] == pytest.approx(theirs_is["inception_score_mean"], rel=1e-12)
    assert ours_is[1] == pytest.approx(theirs_is["inception_score_std"], rel=1e-9)
