"""Reference-statistics cache: computed once per key, reused, recomputed when any part of the key changes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pixelsmith.metrics import (
    FeatureExtractor,
    MnistFeatureExtractor,
    default_cache_dir,
    load_or_compute_reference_stats,
    mnist_reference,
)
from pixelsmith.metrics.extractors import MNIST_EXTRACTOR_WEIGHTS

MNIST_NPZ = Path(__file__).resolve().parents[1] / "data" / "mnist_5k.npz"


class CountingExtractor(FeatureExtractor):
    """Wraps an extractor, keeps its identity (name, weights hash, protocol), counts forward calls."""

    def __init__(self, inner: FeatureExtractor, protocol_suffix: str = "") -> None:
        super().__init__()
        self.inner = inner
        self.name, self.feature_dim, self.num_logits = inner.name, inner.feature_dim, inner.num_logits
        self.weights_sha256 = inner.weights_sha256
        self.protocol = inner.protocol + protocol_suffix
        self.calls = 0

    def forward(self, images_uint8: torch.Tensor):
        self.calls += 1
        return self.inner(images_uint8)


@pytest.fixture(scope="module")
def mnist_extractor() -> MnistFeatureExtractor:
    return MnistFeatureExtractor()


def _reference(extractor, cache_dir, num_samples=300, seed=0, factory_calls=None):
    fingerprint, protocol, make_batches = mnist_reference(MNIST_NPZ, seed=seed, batch_size=100)

    def counted_batches():
        if factory_calls is not None:
            factory_calls.append(1)
        return make_batches()

    return load_or_compute_reference_stats(
        counted_batches,
        extractor=extractor,
        dataset_fingerprint=fingerprint,
        dataset_protocol=protocol,
        num_samples=num_samples,
        cache_dir=cache_dir,
    )


def test_second_call_reuses_the_file_and_a_changed_key_recomputes(
    mnist_extractor: MnistFeatureExtractor, tmp_path: Path
) -> None:
    extractor = CountingExtractor(mnist_extractor)
    factory_calls: list[int] = []
    first = _reference(extractor, tmp_path, factory_calls=factory_calls)
    assert first.recomputed and extractor.calls == 3 and len(factory_calls) == 1
    assert first.path is not None and first.path.parent == tmp_path
    assert first.mean.dtype == np.float64 and first.cov.dtype == np.float64 and first.count == 300
    assert first.features.shape == (300, 128) and first.knn_radii[3].shape == (300,)

    second = _reference(extractor, tmp_path, factory_calls=factory_calls)
    assert not second.recomputed
    assert extractor.calls == 3 and len(factory_calls) == 1  # no extraction, the data was not even loaded
    np.testing.assert_array_equal(second.mean, first.mean)
    np.testing.assert_array_equal(second.cov, first.cov)
    np.testing.assert_array_equal(second.features, first.features)
    np.testing.assert_array_equal(second.knn_radii[3], first.knn_radii[3])

    # Each part of the key, changed on its own, forces a recomputation into a new file.
    changed_count = _reference(extractor, tmp_path, num_samples=200)
    assert changed_count.recomputed and extractor.calls == 5
    changed_data = _reference(extractor, tmp_path, seed=1)  # another subset of the dataset
    assert changed_data.recomputed and extractor.calls == 8
    changed_protocol = CountingExtractor(mnist_extractor, protocol_suffix="; resize=nearest")
    assert _reference(changed_protocol, tmp_path).recomputed and changed_protocol.calls == 3
    paths = {first.path, changed_count.path, changed_data.path}
    assert len(paths) == 3 and len(list(tmp_path.glob("*.npz"))) == 4
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporary files behind


def test_changed_extractor_weights_recompute(tmp_path: Path) -> None:
    checkpoint = torch.load(MNIST_EXTRACTOR_WEIGHTS, weights_only=True)
    checkpoint["state_dict"]["head.2.bias"] = checkpoint["state_dict"]["head.2.bias"] + 1.0
    other_weights = tmp_path / "other_mnist_extractor.pt"
    torch.save(checkpoint, other_weights)
    original = CountingExtractor(MnistFeatureExtractor())
    retrained = CountingExtractor(MnistFeatureExtractor(other_weights))
    assert original.weights_sha256 != retrained.weights_sha256
    _reference(original, tmp_path / "cache", num_samples=100)
    assert _reference(retrained, tmp_path / "cache", num_samples=100).recomputed and retrained.calls == 1


def test_corrupt_cache_file_is_recomputed_with_a_warning(
    mnist_extractor: MnistFeatureExtractor, tmp_path: Path
) -> None:
    first = _reference(mnist_extractor, tmp_path, num_samples=100)
    first.path.write_bytes(b"not an npz file")
    with pytest.warns(UserWarning, match="could not read reference statistics"):
        again = _reference(mnist_extractor, tmp_path, num_samples=100)
    assert again.recomputed
    np.testing.assert_allclose(again.mean, first.mean, rtol=0, atol=0)


def test_default_cache_dir_follows_pixelsmith_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIXELSMITH_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "fid_stats"
    monkeypatch.delenv("PIXELSMITH_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "pixelsmith" / "fid_stats"
