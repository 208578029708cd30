"""Frozen VGG loss network: taps and shapes, frozen/eval/channels_last, weight loading and the missing-weights error."""

import warnings

import pytest
import torch

from pixelsmith.style.loss_network import (
    LossNetworkWeightsNotFoundError,
    RandomLossNetworkWeightsWarning,
    VGGFeatures,
    build_vgg_features,
    layer_names,
)
from tests.conftest import publish_test_weights

pytestmark = pytest.mark.filterwarnings(
    "ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"
)


@pytest.fixture
def empty_torch_home(tmp_path, monkeypatch):
    """TORCH_HOME pointing at an empty folder, and any download attempt turned into a test failure."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))

    def no_download(*args, **kwargs):
        raise AssertionError(f"a network download was attempted: {args[:1]}")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    return tmp_path / "torch_home"


def test_vgg16_and_vgg19_taps_shapes_and_frozen_state():
    x = torch.rand(2, 3, 64, 48)
    vgg16 = VGGFeatures("vgg16", pretrained=False)
    out = vgg16(x)
    assert list(out) == ["relu1_2", "relu2_2", "relu3_3", "relu4_3"]
    assert [tuple(t.shape[1:]) for t in out.values()] == [
        (64, 64, 48),
        (128, 32, 24),
        (256, 16, 12),
        (512, 8, 6),
    ]
    assert all(t.is_contiguous(memory_format=torch.channels_last) for t in out.values())
    vgg19 = VGGFeatures("vgg19", pretrained=False)
    assert [tuple(t.shape[1:3]) for t in vgg19(x).values()] == [(64, 64), (128, 32), (256, 16), (512, 8)]
    assert len(vgg19.features) == 21  # truncated right after relu4_1: no unused layers
    for net in (vgg16, vgg19):
        net.train()  # Lightning calls this on the whole module tree every epoch
        assert not net.training and not any(p.requires_grad for p in net.parameters())
    assert vgg16(x, layers=("relu2_2",)).keys() == {"relu2_2"}


def test_layer_names_follow_torchvision_indices():
    names = layer_names("vgg19")
    assert names.index("relu4_1") == 20 and names.index("relu1_1") == 1 and names.index("pool1") == 4
    assert layer_names("vgg16").index("relu4_3") == 22
    with pytest.raises(ValueError, match="relu9_9"):
        VGGFeatures("vgg16", layers=("relu9_9",), pretrained=False)


def test_random_weights_warn_loudly():
    with pytest.warns(RandomLossNetworkWeightsWarning, match="model.loss_net.pretrained=false"):
        VGGFeatures("vgg16", layers=("relu1_2",), pretrained=False)


def test_missing_weights_error_names_file_directory_and_both_config_keys(empty_torch_home):
    with pytest.raises(LossNetworkWeightsNotFoundError) as info:
        VGGFeatures("vgg16", pretrained=True)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert "vgg16-397923af.pth" in message
    assert str((empty_torch_home / "hub" / "checkpoints").resolve()) in message
    assert "model.loss_net.weights_path=" in message and "model.loss_net.pretrained=false" in message
    assert "\n" not in message  # one paragraph
    with pytest.raises(LossNetworkWeightsNotFoundError, match="vgg19-dcbb9e9d.pth"):
        VGGFeatures("vgg19", pretrained=True)


def test_missing_explicit_weights_path_is_named(empty_torch_home, tmp_path):
    missing = tmp_path / "nowhere" / "vgg19.pth"
    with pytest.raises(LossNetworkWeightsNotFoundError, match="model.loss_net.weights_path=") as info:
        VGGFeatures("vgg19", pretrained=True, weights_path=missing)
    assert str(missing) in str(info.value)


def _fake_torchvision_state(arch: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    features = build_vgg_features(arch, len(layer_names(arch)) - 1)
    state = {f"features.{k}": v for k, v in features.state_dict().items()}
    state["classifier.0.weight"] = torch.zeros(2, 2)  # a full torchvision file also has the classifier
    return state


def test_weights_load_from_torchvision_cache_without_download(empty_torch_home, monkeypatch):
    state = _fake_torchvision_state("vgg19")
    checkpoints = empty_torch_home / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(state, checkpoints / "vgg19-dcbb9e9d.pth")
    publish_test_weights(monkeypatch, "vgg19", checkpoints / "vgg19-dcbb9e9d.pth")
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error", RandomLossNetworkWeightsWarning
        )  # pretrained: no random-weights warning
        net = VGGFeatures("vgg19", pretrained=True)
    torch.testing.assert_close(net.features[19].weight, state["features.19.weight"])


def test_weights_load_from_explicit_path_with_features_only_keys(tmp_path):
    state = {
        k.removeprefix("features."): v for k, v in _fake_torchvision_state("vgg16").items() if "features" in k
    }
    path = tmp_path / "my_vgg16.pth"
    torch.save(state, path)
    net = VGGFeatures("vgg16", pretrained=True, weights_path=path)
    torch.testing.assert_close(net.features[0].weight, state["0.weight"])
    torch.save({"0.weight": torch.zeros(1)}, path)
    with pytest.raises(RuntimeError, match="lacks"):
        VGGFeatures("vgg16", pretrained=True, weights_path=path)
