"""Style losses: Gram normalisation and float32 under autocast, TV, content, and the two loss modules."""

import pytest
import torch

from pixelsmith.style.loss_network import VGGFeatures
from pixelsmith.style.losses import (
    AdaINLoss,
    PerceptualStyleLoss,
    content_loss,
    gram_matrix,
    mean_std_loss,
    style_loss,
    total_variation_loss,
)
from pixelsmith.style.networks import AdaINNet

pytestmark = pytest.mark.filterwarnings(
    "ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"
)


def test_gram_is_normalised_by_c_h_w():
    features = torch.ones(2, 8, 5, 7)
    gram = gram_matrix(features)
    assert gram.shape == (2, 8, 8)
    torch.testing.assert_close(gram, torch.full((2, 8, 8), 1.0 / 8))  # sum over H*W of 1, divided by C*H*W
    x = torch.randn(1, 4, 6, 6, dtype=torch.float64)
    flat = x.reshape(1, 4, 36)
    torch.testing.assert_close(gram_matrix(x), (flat @ flat.transpose(1, 2) / (4 * 36)).float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gram_is_float32_under_autocast_and_does_not_overflow(dtype):
    torch.manual_seed(0)
    # VGG relu1_2-like magnitudes: the unnormalised sum over 64*64 positions reaches ~1e8, beyond fp16's 65504.
    features = (torch.rand(1, 16, 64, 64) * 300).to(dtype)
    with torch.autocast("cpu", dtype=dtype):
        gram = gram_matrix(features)
        naive = torch.bmm(features.reshape(1, 16, -1), features.reshape(1, 16, -1).transpose(1, 2))
    flat = features.double().reshape(1, 16, -1)
    reference = flat @ flat.transpose(1, 2) / (16 * 64 * 64)
    assert gram.dtype == torch.float32 and torch.isfinite(gram).all()
    torch.testing.assert_close(gram.double(), reference, rtol=1e-5, atol=0)
    if dtype == torch.float16:
        assert not torch.isfinite(naive).all()  # what the float32 region protects against


def test_style_and_content_losses_are_float32_under_bf16_autocast():
    a, b = torch.rand(2, 8, 16, 16), torch.rand(2, 8, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a16, b16 = a.bfloat16(), b.bfloat16()
        s = style_loss({"x": a16}, {"x": gram_matrix(b16)[:1]})
        c = content_loss(a16, b16)
        m = mean_std_loss(a16, b16)
    assert s.dtype == c.dtype == m.dtype == torch.float32
    assert style_loss({"x": a}, {"x": gram_matrix(a)}) == 0
    torch.testing.assert_close(c, torch.nn.functional.mse_loss(a16.float(), b16.float()))


def test_style_content_and_adain_losses_match_a_hand_computation():
    # Style: layer a, ones of 2 channels over 2x2 pixels: Gram = 4 / (2 * 2 * 2) = 0.5 everywhere; against a zero
    # target the mean squared difference is 0.25, weighted 3: 0.75. Layer b, one channel [2, 2] over 1x2: Gram
    # (4 + 4) / 2 = 4; against 1 it is 9, weight 1 (not given). Total 9.75.
    features = {"a": torch.ones(1, 2, 2, 2), "b": torch.full((1, 1, 1, 2), 2.0)}
    targets = {"a": torch.zeros(1, 2, 2), "b": torch.ones(1, 1, 1)}
    assert style_loss(features, targets, {"a": 3.0}).item() == pytest.approx(9.75)
    # Content: the mean squared error, (1 + 4) / 2.
    assert content_loss(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2)).item() == pytest.approx(2.5)
    # AdaIN's style term: channel [1, 3, 1, 3] has mean 2 and biased variance 1 (unbiased would be 4/3); against
    # zeros, (2 - 0)^2 + (sqrt(1 + 1e-5) - sqrt(1e-5))^2 = 4 + 0.993695.
    output = torch.tensor([1.0, 3.0, 1.0, 3.0]).reshape(1, 1, 1, 4)
    assert mean_std_loss(output, torch.zeros(1, 1, 1, 4)).item() == pytest.approx(4.993695, abs=1e-6)


def test_total_variation():
    assert total_variation_loss(torch.full((1, 3, 8, 8), 0.3)) == 0
    stripes = torch.zeros(1, 1, 4, 4)
    stripes[..., 1::2] = 1.0  # vertical stripes: every horizontal neighbour differs by 1, vertical ones by 0
    torch.testing.assert_close(total_variation_loss(stripes), torch.tensor(1.0))


def test_perceptual_style_loss_terms_and_gradients():
    torch.manual_seed(0)
    loss_net = VGGFeatures("vgg16", pretrained=False)
    criterion = PerceptualStyleLoss(loss_net, content_weight=2.0, style_weight=1e5, tv_weight=0.5)
    content = torch.rand(2, 3, 32, 32)
    output = torch.rand(2, 3, 32, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="set_style"):
        criterion(output, content)
    criterion.set_style([torch.rand(3, 40, 40), torch.rand(3, 24, 32)])  # two styles of different sizes
    assert criterion.target_grams["relu4_3"].shape == (1, 512, 512)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        terms = criterion(output, content)
    assert terms.total.dtype == torch.float32 and torch.isfinite(terms.total)
    expected = 2.0 * terms.content + 1e5 * terms.style + 0.5 * terms.tv
    torch.testing.assert_close(terms.total.detach(), expected, rtol=1e-5, atol=0)
    terms.total.backward()
    assert output.grad is not None and output.grad.abs().sum() > 0
    assert criterion(content, content).content == 0
    with pytest.raises(ValueError, match="relu5_3"):
        PerceptualStyleLoss(loss_net, content_layers=("relu5_3",))


def test_the_target_grams_follow_the_loss_module_to_its_device_and_dtype():
    """Like buffers: on an H200 the targets stayed on the CPU and every iteration copied them to the GPU (a host
    sync, and a CUDA graph refused to capture the copy). The meta device stands in for the GPU here."""
    criterion = PerceptualStyleLoss(VGGFeatures("vgg16", pretrained=False), style_weight=1e5)
    criterion.set_style(torch.rand(3, 32, 32))
    image = torch.rand(1, 3, 32, 32)
    assert criterion(image, image).style > 0  # the loss reads the targets as they are
    assert {g.device.type for g in criterion.target_grams.values()} == {"cpu"}
    criterion.to(torch.float64)
    assert {g.dtype for g in criterion.target_grams.values()} == {torch.float64}
    criterion.to("meta")
    assert {g.device.type for g in criterion.target_grams.values()} == {"meta"}


def test_adain_loss_is_zero_style_for_own_statistics_and_trains_decoder_only():
    torch.manual_seed(0)
    net = AdaINNet.build(pretrained=False, decoder={"width": 0.25})
    criterion = AdaINLoss(net, style_weight=10.0)
    content, style = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    output, target = net.forward_train(content, style)
    terms = criterion(output, target, style)
    assert terms.style > 0 and terms.content > 0
    terms.total.backward()
    assert all(p.grad is not None for p in net.decoder.parameters())
    assert criterion(style, target, style).style < 1e-6  # an output with the style's own statistics
    # The training step encodes the style once and shares it: same target, same loss as two separate passes.
    with torch.no_grad():
        shared = net.encoder(style)
    shared_output, shared_target = net.forward_train(content, style, shared)
    assert torch.equal(shared_target, target) and torch.equal(shared_output.detach(), output.detach())
    assert torch.equal(
        criterion(shared_output, shared_target, style, shared).total.detach(), terms.total.detach()
    )


def test_style_loss_of_the_style_module_is_this_gram_distance() -> None:
    """The training loss and the validation metric must not drift apart (one Gram implementation)."""
    from pixelsmith.metrics import gram_matrix, style_gram_distance
    from pixelsmith.style.losses import gram_matrix as style_module_gram_matrix
    from pixelsmith.style.losses import style_loss

    generator = torch.Generator().manual_seed(4)
    features = {"relu1_2": torch.randn(2, 4, 16, 16, generator=generator), "relu2_2": torch.randn(2, 8, 8, 8)}
    style_grams = {
        name: gram_matrix(torch.randn(1, *f.shape[1:], generator=generator)) for name, f in features.items()
    }
    torch.testing.assert_close(
        style_module_gram_matrix(features["relu1_2"]), gram_matrix(features["relu1_2"])
    )
    torch.testing.assert_close(
        style_loss(features, style_grams),
        style_gram_distance(list(features.values()), list(style_grams.values())),
    )
