"""GAN metrics end to end with the offline MNIST extractor, the uint8 protocol, and the missing-weights messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pixelsmith.data.mnist import load_mnist
from pixelsmith.metrics import (
    INCEPTION_WEIGHTS_CONFIG_KEY,
    INCEPTION_WEIGHTS_FILE,
    GanMetrics,
    InceptionFeatureExtractor,
    MissingWeightsError,
    MnistFeatureExtractor,
    build_feature_extractor,
    load_or_compute_reference_stats,
    make_random_fid_inception_weights,
    mnist_reference,
    quantize_to_uint8,
)
from pixelsmith.metrics.protocol import uint8_to_unit_range
from pixelsmith.metrics.train_mnist_extractor import load_split
from tests.conftest import publish_test_weights

MNIST_NPZ = Path(__file__).resolve().parents[1] / "data" / "mnist_5k.npz"


def test_quantization_rounds_half_up_and_clamps() -> None:
    levels = torch.tensor([0.0, 0.49, 0.5, 0.51, 127.5, 254.49, 254.5, 255.0])
    images = (levels / 127.5 - 1.0).double().reshape(1, 1, 1, -1)
    expected = torch.tensor([0, 0, 1, 1, 128, 254, 255, 255], dtype=torch.uint8)
    assert torch.equal(quantize_to_uint8(images).flatten(), expected)
    assert torch.equal(
        quantize_to_uint8(torch.tensor([-3.0, 3.0]).reshape(1, 1, 1, 2)).flatten(),
        torch.tensor([0, 255], dtype=torch.uint8),
    )
    pixels = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    assert quantize_to_uint8(pixels) is pixels  # uint8 input passes through
    assert torch.equal(quantize_to_uint8(pixels.float() / 127.5 - 1.0), pixels)  # exact round trip


def test_mnist_extractor_accuracy_on_the_held_out_digits() -> None:
    extractor = MnistFeatureExtractor()
    _, _, test_pixels, test_labels = load_split(MNIST_NPZ)
    assert test_pixels.shape == (1000, 1, 32, 32) and torch.bincount(test_labels).tolist() == [100] * 10
    features, logits = extractor(test_pixels)
    accuracy = float((logits.argmax(1) == test_labels).float().mean())
    assert accuracy >= 0.97
    # ...and it is the number recorded in the weights file (and in the README).
    assert accuracy == pytest.approx(extractor.test_accuracy, abs=1e-6)
    assert features.shape == (1000, 128) and features.dtype == torch.float32
    assert extractor.weights_path.stat().st_size < 1_000_000
    extractor.train()
    assert not extractor.training and not extractor.net.training  # Lightning's .train() cannot flip it


def test_gan_metrics_rank_real_digits_far_above_degraded_ones(tmp_path: Path) -> None:
    extractor = build_feature_extractor("mnist")
    fingerprint, protocol, make_batches = mnist_reference(MNIST_NPZ, seed=0, batch_size=500)
    reference = load_or_compute_reference_stats(
        make_batches,
        extractor=extractor,
        dataset_fingerprint=fingerprint,
        dataset_protocol=protocol,
        num_samples=1000,
        cache_dir=tmp_path,
    )
    digits, _ = load_mnist(32, MNIST_NPZ)
    order = torch.randperm(5000, generator=torch.Generator().manual_seed(0))  # mnist_reference's permutation
    held_out = uint8_to_unit_range(digits[order[2000:3000]])  # disjoint from the 1000 reference digits
    noise = torch.randn(held_out.shape, generator=torch.Generator().manual_seed(1)).clamp(-1, 1)
    blurred = F.avg_pool2d(held_out, 5, stride=1, padding=2) * 0.7 + 0.3 * noise

    scores = {}
    for label, images in (("real", held_out), ("degraded", blurred.clamp(-1, 1))):
        metric = GanMetrics(extractor, reference, kid_subset_size=500, kid_subsets=20)
        for batch in images.split(250):
            metric.update(batch)
        scores[label] = metric.compute()
    real, degraded = scores["real"], scores["degraded"]
    assert real["num_generated"] == 1000 and real["num_real"] == 1000
    assert real["fid"] < degraded["fid"] / 10
    assert abs(real["kid_mean"]) < degraded["kid_mean"] / 10
    assert real["precision"] > 0.8 and real["recall"] > 0.8 and degraded["recall"] < 0.1
    # At most 10 for 10 balanced classes; ~7.9 here because the classifier was trained with label smoothing.
    assert real["is_mean"] > 7.0 > 2.0 > degraded["is_mean"]


def test_gan_metrics_refuse_statistics_of_another_extractor(tmp_path: Path) -> None:
    extractor = MnistFeatureExtractor()
    fingerprint, protocol, make_batches = mnist_reference(MNIST_NPZ, seed=0, batch_size=100)
    reference = load_or_compute_reference_stats(
        make_batches,
        extractor=extractor,
        dataset_fingerprint=fingerprint,
        dataset_protocol=protocol,
        num_samples=100,
        cache_dir=tmp_path,
    )
    reference.key = {**reference.key, "weights_sha256": "0123456789abcdef"}
    with pytest.raises(ValueError, match="another extractor or protocol"):
        GanMetrics(extractor, reference)
    with pytest.raises(TypeError, match="uint8"):
        extractor(torch.zeros(1, 1, 32, 32))


def test_missing_inception_weights_names_file_directory_key_and_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    with pytest.raises(MissingWeightsError) as error:
        InceptionFeatureExtractor()
    message = str(error.value)
    assert "\n" not in message  # one paragraph
    assert INCEPTION_WEIGHTS_FILE in message
    assert str(tmp_path / "torch_home" / "hub" / "checkpoints") in message
    assert f"`{INCEPTION_WEIGHTS_CONFIG_KEY}" in message
    # torch-fidelity's address, which the download uses; offline (as every test runs) nothing is fetched.
    assert "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/" in message
    assert "PIXELSMITH_OFFLINE=1 forbids downloading it" in message

    with pytest.raises(MissingWeightsError, match=r"eval\.weights_path=/nowhere/inception\.pth` does not"):
        InceptionFeatureExtractor(weights_path="/nowhere/inception.pth")


def test_inception_weights_are_found_in_torch_home_under_either_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    checkpoints = tmp_path / "hub" / "checkpoints"
    weights = make_random_fid_inception_weights(checkpoints / "weights-inception-2015-12-05-6726825d.pth")
    publish_test_weights(monkeypatch, "inception-v3-fid", weights)
    extractor = InceptionFeatureExtractor(feature_layer=64, with_logits=False)
    assert extractor.weights_path == weights and extractor.name == "inception-v3-fid/64"
    weights.rename(checkpoints / INCEPTION_WEIGHTS_FILE)
    extractor = InceptionFeatureExtractor(feature_layer=64, with_logits=False)
    assert extractor.weights_path == checkpoints / INCEPTION_WEIGHTS_FILE
    features, logits = extractor(torch.randint(0, 256, (2, 1, 16, 16), dtype=torch.uint8))  # gray -> RGB
    assert features.shape == (2, 64) and logits is None
