"""Style networks: TransformerNet and AdaIN shapes, the AdaIN op's statistics, alpha, and a tiny overfit run."""

import pytest
import torch

from pixelsmith.style.loss_network import VGGFeatures
from pixelsmith.style.losses import PerceptualStyleLoss
from pixelsmith.style.networks import (
    AdaINDecoder,
    AdaINNet,
    AdaptiveInstanceNorm,
    TransformerNet,
    adain,
    channel_mean_var,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"
)


@pytest.fixture(scope="module")
def adain_net() -> AdaINNet:
    torch.manual_seed(0)
    return AdaINNet.build(pretrained=False, decoder={"width": 0.25}).eval()


def test_transformer_net_is_johnson_sized_and_keeps_any_input_size():
    net = TransformerNet()
    assert sum(p.numel() for p in net.parameters()) == pytest.approx(1.68e6, rel=0.01)  # the paper's 1.7M
    kinds = [type(m).__name__ for m in net.modules()]
    assert kinds.count("InstanceNorm2d") == 5 + 2 * 5 and kinds.count("ReflectionPad2d") == 16
    assert all(m.affine for m in net.modules() if isinstance(m, torch.nn.InstanceNorm2d))
    assert [m.stride for m in net.modules() if isinstance(m, torch.nn.Conv2d)].count((2, 2)) == 2
    small = TransformerNet(base_channels=8, num_residual_blocks=1).eval()
    for height, width in [(37, 50), (64, 64), (9, 13)]:
        with torch.no_grad():
            y = small(torch.rand(2, 3, height, width))
        assert y.shape == (2, 3, height, width)
        assert y.min() >= 0.0 and y.max() <= 1.0  # sigmoid output


def test_transformer_net_config_keys_are_checked():
    assert TransformerNet.from_config({"base_channels": 8, "_target_": "x"}).config["base_channels"] == 8
    with pytest.raises(ValueError, match="num_res_blocks"):
        TransformerNet.from_config({"num_res_blocks": 3})


def test_adain_op_gives_the_style_statistics():
    torch.manual_seed(0)
    content = torch.randn(2, 16, 20, 24) * 3 + 1
    style = torch.randn(2, 16, 12, 10) * 0.5 - 2
    style_mean, style_var = channel_mean_var(style)
    out = adain(content, style_mean, torch.sqrt(style_var + 1e-5))
    out_mean, out_var = channel_mean_var(out)
    torch.testing.assert_close(out_mean, style_mean, atol=1e-4, rtol=0)
    torch.testing.assert_close(out_var.sqrt(), style_var.sqrt(), atol=1e-3, rtol=1e-3)
    # The layer form (used by the network and by tiling) agrees with the function.
    layer = AdaptiveInstanceNorm()
    torch.testing.assert_close(
        layer(content, style_mean, torch.sqrt(style_var + 1e-5)), out, atol=1e-5, rtol=1e-5
    )


def test_adain_net_alpha_one_matches_style_statistics_and_alpha_zero_decodes_content(adain_net):
    torch.manual_seed(1)
    content, style = torch.rand(1, 3, 64, 72), torch.rand(1, 3, 48, 48)
    captured = {}
    hook = adain_net.adain.register_forward_hook(lambda m, args, out: captured.update(out=out))
    try:
        with torch.no_grad():
            out = adain_net(content, style, alpha=1.0)
            style_mean, style_std = adain_net.style_statistics(style)
    finally:
        hook.remove()
    assert out.shape == content.shape
    got_mean, got_var = channel_mean_var(captured["out"])
    torch.testing.assert_close(got_mean, style_mean, atol=1e-4, rtol=1e-4)
    # A content channel that is constant (a dead ReLU of the random VGG) cannot take on the style's spread.
    with torch.no_grad():
        _, content_var = channel_mean_var(adain_net.encoder(content)["relu4_1"])
    live = content_var > 1e-4
    assert live.float().mean() > 0.5
    torch.testing.assert_close(got_var.sqrt()[live], style_std[live], atol=1e-3, rtol=1e-2)

    with torch.no_grad():
        reconstruction = adain_net(content, style, alpha=0.0)
        expected = adain_net.decoder(adain_net.encoder(content)["relu4_1"])
        halfway = adain_net(content, style, alpha=0.5)
    torch.testing.assert_close(reconstruction, expected, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(halfway, reconstruction, atol=1e-4) and not torch.allclose(
        halfway, out, atol=1e-4
    )


def test_adain_decoder_mirrors_vgg_and_training_pass_has_gradients_only_in_decoder(adain_net):
    decoder = AdaINDecoder()
    assert sum(isinstance(m, torch.nn.Upsample) for m in decoder.modules()) == 3
    assert sum(isinstance(m, torch.nn.ReflectionPad2d) for m in decoder.modules()) == 9
    assert decoder(torch.rand(1, 512, 4, 5)).shape == (1, 3, 32, 40)
    output, target = adain_net.forward_train(torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32))
    output.mean().backward()
    assert all(p.grad is not None for p in adain_net.decoder.parameters())
    assert all(p.grad is None and not p.requires_grad for p in adain_net.encoder.parameters())
    assert target.shape == (2, 512, 4, 4) and not target.requires_grad


def test_adain_requires_a_vgg19_relu4_1_encoder():
    with pytest.raises(ValueError, match="VGG19"):
        AdaINNet(VGGFeatures("vgg16", pretrained=False))


def test_transformer_net_overfits_a_style_on_a_tiny_image(one_thread):
    torch.manual_seed(0)
    loss_net = VGGFeatures("vgg16", layers=("relu1_2", "relu2_2", "relu3_3"), pretrained=False)
    criterion = PerceptualStyleLoss(loss_net, content_weight=0.0, style_weight=1e6)
    criterion.set_style(torch.rand(3, 32, 32))
    net = TransformerNet(base_channels=8, num_residual_blocks=1)
    optimizer = torch.optim.Adam(net.parameters(), lr=2e-2)
    content = torch.rand(1, 3, 32, 32)
    history = []
    for _ in range(20):
        terms = criterion(net(content), content)
        optimizer.zero_grad()
        terms.total.backward()
        optimizer.step()
        history.append(terms.style.item())
    # Measured: 4.7e-7 -> 2.6e-7 in 15 steps; a broken gradient path leaves it flat or growing.
    assert sum(history[-3:]) / 3 < 0.7 * history[0], history
