"""Style-transfer metrics: float32 Gram matrices, the Gram distance, SSIM/PSNR in [0, 1], LPIPS weight loading."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torchvision
from torchmetrics.functional.image import structural_similarity_index_measure

from pixelsmith.metrics import (
    LPIPS,
    ContentSSIM,
    ImagePSNR,
    MissingWeightsError,
    RandomWeightsWarning,
    StyleTransferMetrics,
    build_lpips_network,
    gram_matrix,
    style_gram_distance,
)
from tests.conftest import publish_test_weights


def test_gram_matrix_is_float32_and_does_not_overflow_in_half_precision() -> None:
    features = torch.full((1, 4, 64, 64), 200.0, dtype=torch.float16)  # sum of 4096 products = 1.6e8 > 65504
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        gram = gram_matrix(features)
    assert gram.dtype == torch.float32 and torch.isfinite(gram).all()
    torch.testing.assert_close(gram, torch.full((1, 4, 4), 200.0**2 / 4), rtol=1e-6, atol=0)
    random = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    expected = torch.einsum("bchw,bdhw->bcd", random, random) / (3 * 5 * 7)
    torch.testing.assert_close(gram_matrix(random), expected.float())


def test_style_gram_distance_matches_its_definition_and_is_differentiable() -> None:
    generator = torch.Generator().manual_seed(0)
    layers = [torch.randn(3, 4, 8, 8, generator=generator, requires_grad=True), torch.randn(3, 6, 4, 4)]
    style = [torch.randn(1, 4, 8, 8, generator=generator), torch.randn(1, 6, 4, 4, generator=generator)]
    style_grams = [gram_matrix(features) for features in style]
    per_sample = style_gram_distance(layers, style_grams, reduction="none")
    manual = sum(
        ((gram_matrix(f) - g) ** 2).mean(dim=(1, 2)) for f, g in zip(layers, style_grams, strict=True)
    )
    torch.testing.assert_close(per_sample, manual)
    assert per_sample.shape == (3,)
    style_gram_distance(layers, style_grams).backward()
    assert layers[0].grad is not None and layers[0].grad.abs().sum() > 0
    same = [features.expand(3, -1, -1, -1) for features in style]
    assert style_gram_distance(same, style_grams).item() == pytest.approx(0.0, abs=1e-12)


def test_ssim_and_psnr_work_in_unit_range() -> None:
    generator = torch.Generator().manual_seed(1)
    target = torch.rand(2, 3, 32, 32, generator=generator) * 2 - 1
    noisy = (target + 0.1 * torch.randn(2, 3, 32, 32, generator=generator)).clamp(-1, 1)
    ssim = ContentSSIM()
    ssim.update(noisy, target)
    expected = structural_similarity_index_measure((noisy + 1) / 2, (target + 1) / 2, data_range=1.0)
    assert float(ssim.compute()) == pytest.approx(float(expected), rel=1e-6)
    identical = ContentSSIM()
    identical.update(target, target)
    assert float(identical.compute()) == pytest.approx(1.0, abs=1e-6)

    psnr = ImagePSNR()
    psnr.update(noisy, target)
    per_image_mse = (((noisy + 1) / 2 - (target + 1) / 2) ** 2).mean(dim=(1, 2, 3))
    assert float(psnr.compute()) == pytest.approx(
        float((10 * torch.log10(1 / per_image_mse)).mean()), rel=1e-5
    )


def test_missing_lpips_backbone_names_file_directory_and_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    for net, file_name in (("alex", "alexnet-owt-7be5be79.pth"), ("vgg", "vgg16-397923af.pth")):
        with pytest.raises(MissingWeightsError) as error:
            LPIPS(net=net)
        message = str(error.value)
        assert file_name in message and str(tmp_path / "hub" / "checkpoints") in message
        assert (
            "`metrics.lpips_backbone_weights" in message and "https://download.pytorch.org/models/" in message
        )


def test_lpips_loads_the_backbone_file_from_torch_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # SqueezeNet keeps the written file small (5 MB); alex and vgg take the same code path.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    backbone = torchvision.models.squeezenet1_1(weights=None)
    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(backbone.state_dict(), checkpoints / "squeezenet1_1-b8a52dc0.pth")
    publish_test_weights(monkeypatch, "squeezenet1_1", checkpoints / "squeezenet1_1-b8a52dc0.pth")
    network = build_lpips_network("squeeze")
    torch.testing.assert_close(network.net.slices[0][0].weight, backbone.features[0].weight, rtol=0, atol=0)
    torch.testing.assert_close(
        network.net.slices[6][0].expand3x3.weight, backbone.features[12].expand3x3.weight
    )


def test_lpips_with_random_backbone_warns_loudly_and_still_behaves_like_a_distance() -> None:
    with pytest.warns(RandomWeightsWarning, match="RANDOM alexnet backbone"):
        metric = LPIPS(net="alex", pretrained=False)
    generator = torch.Generator().manual_seed(2)
    images = torch.rand(2, 3, 64, 64, generator=generator) * 2 - 1
    metric.update(images, images)
    assert float(metric.compute()) == pytest.approx(0.0, abs=1e-6)
    metric.reset()
    metric.update(images, images.flip(-1))
    assert float(metric.compute()) > 0


def test_style_transfer_metrics_report_every_value() -> None:
    with pytest.warns(RandomWeightsWarning):
        metrics = StyleTransferMetrics(lpips_pretrained=False)
    generator = torch.Generator().manual_seed(3)
    content = torch.rand(2, 3, 64, 64, generator=generator) * 2 - 1
    result = (content + 0.2 * torch.randn(2, 3, 64, 64, generator=generator)).clamp(-1, 1)
    features = [torch.randn(2, 8, 16, 16, generator=generator)]
    metrics.update(result, content, result_features=features, style_grams=[gram_matrix(features[0][:1])])
    values = metrics.compute()
    assert set(values) == {"content_ssim", "content_lpips", "content_psnr", "style_gram_distance"}
    assert 0 < values["content_ssim"] < 1 and values["content_lpips"] > 0
    assert math.isfinite(values["content_psnr"]) and values["style_gram_distance"] > 0
