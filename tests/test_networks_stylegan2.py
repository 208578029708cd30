"""Tests for the StyleGAN2 generator and discriminator (src/pixelsmith/gan/networks/stylegan2.py).

All on CPU with small channel counts; the whole file runs in well under 30 s on 2 cores.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from pixelsmith.gan.networks.fir import fir_downsample_2x, fir_kernel_2d
from pixelsmith.gan.networks.stylegan2 import (
    D_ARCHITECTURES,
    DiscriminatorBlock,
    ModulatedConv2d,
    StyleGAN2Discriminator,
    StyleGAN2Generator,
    channels_at_resolution,
    minibatch_stddev,
)
from tests.conftest import torch_threads

TINY = {"channel_base": 256, "channel_max": 32}


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    with torch_threads(1):  # the tensors are tiny: threading overhead would dominate
        yield


def tiny_pair(resolution: int = 32, channels: int = 1, **kwargs):
    generator = StyleGAN2Generator(
        resolution=resolution, channels=channels, z_dim=32, w_dim=32, mapping_layers=2, **TINY, **kwargs
    )
    discriminator = StyleGAN2Discriminator(resolution=resolution, channels=channels, **TINY, **kwargs)
    return generator, discriminator


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("resolution", [32, 64, 128])
def test_output_shapes_and_dtypes(resolution: int, channels: int):
    generator, discriminator = tiny_pair(resolution, channels)
    images = generator(torch.randn(3, generator.z_dim))
    assert images.shape == (3, channels, resolution, resolution)
    assert images.dtype == torch.float32
    assert torch.isfinite(images).all()
    # Roughly unit scale at init (no tanh, but demodulation keeps activations normalised).
    assert 0.05 < images.std().item() < 10.0
    logits = discriminator(images)
    assert logits.shape == (3,)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_resolution_256_shapes_with_tiny_channels():
    generator = StyleGAN2Generator(
        resolution=256, channels=3, z_dim=16, w_dim=16, channel_base=512, channel_max=8
    )
    discriminator = StyleGAN2Discriminator(resolution=256, channels=3, channel_base=512, channel_max=8)
    with torch.no_grad():
        images = generator(torch.randn(1, 16))
        assert images.shape == (1, 3, 256, 256)
        assert discriminator(images).shape == (1,)


def test_channel_counts_follow_channel_base_over_resolution():
    generator = StyleGAN2Generator(resolution=64, channel_base=1024, channel_max=128)
    discriminator = StyleGAN2Discriminator(resolution=64, channel_base=1024, channel_max=128)
    expected = [128, 128, 64, 32, 16]  # at 4, 8, 16, 32, 64: min(1024 // res, 128)
    assert [channels_at_resolution(r, 1024, 128) for r in (4, 8, 16, 32, 64)] == expected
    assert [block.conv1.conv.weight.shape[0] for block in generator.synthesis.blocks] == expected
    assert discriminator.from_image.weight.shape[0] == 16
    assert [block.conv1.weight.shape[0] for block in discriminator.blocks] == [32, 64, 128, 128]


@pytest.mark.parametrize("resolution", [8, 24, 48])
def test_invalid_resolution_is_rejected(resolution: int):
    with pytest.raises(ValueError, match="power of two"):
        StyleGAN2Generator(resolution=resolution)
    with pytest.raises(ValueError, match="power of two"):
        StyleGAN2Discriminator(resolution=resolution)


def reference_modulated_conv(x, weight, styles, demodulate, upsample):
    """The paper's formulation: one demodulated weight per sample, applied with a grouped convolution."""
    batch, in_channels = x.shape[:2]
    per_sample = weight[None] * styles[:, None, :, None, None]
    if demodulate:
        per_sample = per_sample * torch.rsqrt(per_sample.square().sum(dim=(2, 3, 4), keepdim=True) + 1e-8)
    if upsample == "bilinear":  # the "fir" path: tests/test_networks_stylegan2_resampling.py
        x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
    kernel = weight.shape[-1]
    out = F.conv2d(
        x.reshape(1, batch * in_channels, *x.shape[2:]),
        per_sample.reshape(-1, in_channels, kernel, kernel),
        padding=kernel // 2,
        groups=batch,
    )
    return out.reshape(batch, -1, *out.shape[2:])


@pytest.mark.parametrize(
    ("kernel", "demodulate", "upsample"), [(3, True, None), (3, True, "bilinear"), (1, False, None)]
)
def test_modulated_conv_matches_per_sample_weight_formulation(
    kernel: int, demodulate: bool, upsample: str | None
):
    layer = ModulatedConv2d(6, 5, kernel, w_dim=7, demodulate=demodulate, upsample=upsample).double()
    x = torch.randn(4, 6, 8, 8, dtype=torch.float64)
    w = torch.randn(4, 7, dtype=torch.float64)
    styles = layer.affine(w)
    expected = reference_modulated_conv(x, layer.weight * layer.weight_gain, styles, demodulate, upsample)
    torch.testing.assert_close(layer(x, w), expected, rtol=1e-9, atol=1e-9)


def test_w_avg_tracks_training_mode_and_truncation_psi_zero_collapses_to_it():
    generator = StyleGAN2Generator(**TINY, z_dim=32, w_dim=32, mapping_layers=2, use_noise=False)
    assert torch.count_nonzero(generator.mapping.w_avg) == 0

    generator.train()
    z = torch.randn(16, 32)
    with torch.no_grad():
        ws = generator.mapping(z)
    assert ws.shape == (16, generator.num_ws, 32)
    # w_avg averages w itself (one per latent), not its per-layer copies; beta 0.995 as NVlabs' w_avg_beta.
    torch.testing.assert_close(generator.mapping.w_avg, (1 - 0.995) * ws[:, 0].mean(dim=0))
    for _ in range(3):
        generator(torch.randn(16, 32))
    w_avg = generator.mapping.w_avg.clone()
    assert w_avg.abs().sum() > 0

    generator.eval()
    with torch.no_grad():
        w_truncated = generator.mapping(torch.randn(5, 32), truncation_psi=0.0)
        images_a = generator(torch.randn(4, 32), truncation_psi=0.0)
        images_b = generator(torch.randn(4, 32), truncation_psi=0.0)
        images_free = generator(torch.randn(4, 32))
    torch.testing.assert_close(generator.mapping.w_avg, w_avg, rtol=0, atol=0)  # no update in eval mode
    torch.testing.assert_close(w_truncated, w_avg.expand(5, generator.num_ws, -1), rtol=0, atol=0)
    torch.testing.assert_close(images_a, images_b, rtol=0, atol=0)
    torch.testing.assert_close(images_a, images_a[:1].expand_as(images_a), rtol=0, atol=0)
    assert (images_free - images_free[:1]).abs().amax() > 1e-3  # without truncation, z matters


@pytest.mark.parametrize(("resolution", "num_ws"), [(16, 6), (32, 8), (256, 14)])
def test_num_ws_counts_one_w_per_conv_plus_the_last_torgb_as_nvlabs(resolution: int, num_ws: int):
    """NVlabs `SynthesisNetwork.num_ws` (training/networks.py): sum of the blocks' num_conv (1 at 4x4, else 2) plus the
    last block's num_torgb (1): 2 * log2(resolution) - 2 (14 at 256 px, as their paper256 G)."""
    generator = StyleGAN2Generator(resolution=resolution, z_dim=8, w_dim=8, channel_base=256, channel_max=4)
    assert generator.num_ws == num_ws == 2 * int(math.log2(resolution)) - 2
    assert generator.mapping(torch.randn(2, 8)).shape == (2, num_ws, 8)


def test_each_layer_reads_its_own_w_with_torgb_sharing_the_next_conv_s():
    """NVlabs' block slicing: block k reads ws[first : first + num_conv + 1] and `first` advances by num_conv, so the
    4x4 block's conv1 and toRGB read ws[0] and ws[1], the 8x8 block's conv0, conv1, toRGB ws[1], ws[2], ws[3], ...
    Recorded here by hooking every modulated conv's affine layer and comparing the w it saw with the ws given."""
    generator = StyleGAN2Generator(**TINY, z_dim=8, w_dim=8, mapping_layers=1, use_noise=False)
    seen: dict[str, torch.Tensor] = {}
    for name, module in generator.synthesis.named_modules():
        if name.endswith("affine"):
            module.register_forward_hook(lambda mod, args, out, name=name: seen.__setitem__(name, args[0]))
    ws = torch.randn(3, generator.num_ws, 8)
    generator.synthesis(ws)
    expected = {"blocks.0.conv1": 0, "blocks.0.to_image": 1}
    for block in range(1, len(generator.synthesis.blocks)):
        first = 2 * block - 1
        expected |= {
            f"blocks.{block}.conv0": first,
            f"blocks.{block}.conv1": first + 1,
            f"blocks.{block}.to_image": first + 2,
        }
    assert expected[f"blocks.{len(generator.synthesis.blocks) - 1}.to_image"] == generator.num_ws - 1
    assert sorted(name.rsplit(".conv.affine", 1)[0] for name in seen) == sorted(expected)
    for layer, index in expected.items():
        torch.testing.assert_close(seen[f"{layer}.conv.affine"], ws[:, index], rtol=0, atol=0, msg=layer)
    # One w for all layers (a [N, w_dim] tensor) is the broadcast of it: the same images.
    generator.eval()
    w = torch.randn(3, 8)
    torch.testing.assert_close(
        generator.synthesis(w),
        generator.synthesis(w[:, None].expand(-1, generator.num_ws, -1)),
        rtol=0,
        atol=0,
    )


def test_truncation_cutoff_truncates_only_the_first_layers():
    generator = StyleGAN2Generator(**TINY, z_dim=8, w_dim=8, mapping_layers=1).eval()
    generator.mapping.w_avg.normal_()
    z = torch.randn(4, 8)
    ws = generator.mapping(z)
    cut = generator.mapping(z, truncation_psi=0.5, truncation_cutoff=3)
    # NVlabs: ws[:, :cutoff] = w_avg.lerp(ws[:, :cutoff], psi), i.e. w_avg + psi * (w - w_avg); the rest untouched.
    torch.testing.assert_close(
        cut[:, :3], generator.mapping.w_avg + 0.5 * (ws[:, :3] - generator.mapping.w_avg)
    )
    torch.testing.assert_close(cut[:, 3:], ws[:, 3:], rtol=0, atol=0)


def test_class_conditioning_concatenates_the_normalised_label_embedding_to_z():
    """NVlabs `MappingNetwork` with c_dim > 0: x = normalize_2nd_moment(z), y = normalize_2nd_moment(embed(c)),
    the MLP reads cat([x, y]). Checked against that computation written out with the layers' effective weights."""
    generator = StyleGAN2Generator(**TINY, z_dim=6, w_dim=5, mapping_layers=1, c_dim=3).eval()
    mapping = generator.mapping
    z = torch.randn(4, 6, dtype=torch.float64)
    c = F.one_hot(torch.tensor([0, 2, 1, 2]), 3).double()
    mapping.double()

    def unit_mean_square(v):
        return v / torch.sqrt(v.square().mean(dim=1, keepdim=True) + 1e-8)

    embed, layer = mapping.embed, mapping.layers[0]
    y = c @ (embed.weight * embed.weight_gain).T + embed.bias * embed.bias_gain
    x = torch.cat([unit_mean_square(z), unit_mean_square(y)], dim=1)
    w = F.leaky_relu(
        x @ (layer.weight * layer.weight_gain).T + layer.bias * layer.bias_gain, 0.2
    ) * math.sqrt(2)
    torch.testing.assert_close(
        mapping(z, c), w[:, None].expand(-1, generator.num_ws, -1), rtol=1e-12, atol=1e-12
    )
    assert layer.weight.shape == (5, 6 + 5)  # z_dim + embed features (w_dim) in
    with pytest.raises(ValueError, match="conditional"):
        mapping(z)
    generator.float()
    labels = F.one_hot(torch.tensor([0, 1, 2, 0]), 3).float()
    images = generator(torch.randn(4, 6), labels)
    assert images.shape == (4, 1, 32, 32)


def _mixing_generator(prob: float) -> StyleGAN2Generator:
    return StyleGAN2Generator(**TINY, z_dim=8, w_dim=8, mapping_layers=1, style_mixing_prob=prob).train()


def test_style_mixing_off_is_the_unmixed_generator_bit_for_bit():
    mixing, plain = _mixing_generator(0.0), _mixing_generator(0.9)
    plain.load_state_dict(mixing.state_dict())
    plain.style_mixing_prob = 0.0
    z = torch.randn(4, 8)
    torch.manual_seed(1)
    images, ws = mixing(z, return_ws=True)
    torch.manual_seed(1)
    images_plain, ws_plain = plain(z, return_ws=True)
    torch.testing.assert_close(images, images_plain, rtol=0, atol=0)
    torch.testing.assert_close(ws, ws_plain, rtol=0, atol=0)
    # At p = 0 every layer holds the latent's own w.
    torch.testing.assert_close(ws, ws[:, :1].expand_as(ws), rtol=0, atol=0)


def test_style_mixing_at_p_one_takes_the_layers_after_the_cutoff_from_a_second_latent():
    """NVlabs `StyleGAN2Loss.run_G`: cutoff ~ U[1, num_ws), ws[:, cutoff:] = mapping(randn_like(z))[:, cutoff:],
    without a w_avg update for the second latent. Replayed here from the same random stream: the cutoff is the
    first draw, the coin the second, the second latent the third."""
    generator = _mixing_generator(1.0)
    num_ws = generator.num_ws
    z = torch.randn(5, 8)
    cutoffs = set()
    for seed in range(12):
        torch.manual_seed(seed)
        w_avg = generator.mapping.w_avg.clone()
        _, ws = generator(z, return_ws=True)
        w_avg_after = generator.mapping.w_avg.clone()
        torch.manual_seed(seed)
        cutoff = int(torch.randint(1, num_ws, ()))
        torch.rand(())
        second_z = torch.randn_like(z)
        own = generator.mapping.eval()(z)
        second = generator.mapping(second_z)
        generator.mapping.train()
        assert 1 <= cutoff < num_ws
        torch.testing.assert_close(ws[:, :cutoff], own[:, :cutoff], rtol=0, atol=0)
        torch.testing.assert_close(ws[:, cutoff:], second[:, cutoff:], rtol=0, atol=0)
        assert (second[:, 0] - own[:, 0]).abs().amax() > 1e-3  # the two latents do differ
        # w_avg moved once, by the first latent's w only.
        torch.testing.assert_close(w_avg_after, own[:, 0].mean(dim=0).lerp(w_avg, 0.995))
        cutoffs.add(cutoff)
    assert len(cutoffs) > 3  # the cutoff is drawn, not fixed
    # Evaluation mode never mixes.
    generator.eval()
    _, ws = generator(z, return_ws=True)
    torch.testing.assert_close(ws, ws[:, :1].expand_as(ws), rtol=0, atol=0)


def test_style_mixing_happens_with_probability_p_and_a_uniform_cutoff():
    generator = _mixing_generator(0.9)
    num_ws = generator.num_ws
    z = torch.randn(2, 8)
    calls, mixed, cutoffs = 2000, 0, torch.zeros(num_ws + 1)
    with torch.no_grad():
        for _ in range(calls):
            ws = generator.mapping.eval()(z)
            generator.mapping.train()
            ws = generator.mix_styles(z, None, ws)
            differs = (ws != ws[:, :1]).any(dim=2).any(dim=0)  # layers that are not the first latent's
            cutoff = int(differs.nonzero()[0]) if differs.any() else num_ws
            mixed += cutoff < num_ws
            cutoffs[cutoff] += 1
    # Binomial(2000, 0.9): std 13.4, so +-60 is 4.5 sigma.
    assert abs(mixed - 0.9 * calls) < 60
    # Each cutoff in [1, num_ws) about equally often: expected 0.9 * 2000 / 7 = 257 each, std ~15.
    expected = 0.9 * calls / (num_ws - 1)
    assert cutoffs[0] == 0
    assert all(abs(float(n) - expected) < 5 * math.sqrt(expected) for n in cutoffs[1:num_ws])


def test_style_mixing_makes_no_host_sync(monkeypatch):
    """A CUDA graph captures the step: mixing reads no tensor on the host (a .item() or a Python branch on a random
    value would show here as a tensor-to-Python conversion)."""
    generator = _mixing_generator(0.9)
    z = torch.randn(2, 8)
    ws = generator.mapping(z)
    conversions = []
    for method in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
        original = getattr(torch.Tensor, method)

        def spy(self, *args, _original=original, _method=method):
            conversions.append(_method)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, method, spy)
    mixed = generator.mix_styles(z, None, ws)
    monkeypatch.undo()
    assert conversions == []
    assert mixed.shape == (2, generator.num_ws, 8)


def test_gradients_reach_every_generator_parameter_through_the_discriminator_loss():
    generator, discriminator = tiny_pair()
    generator_loss = F.softplus(-discriminator(generator(torch.randn(4, generator.z_dim)))).mean()
    generator_loss.backward()
    for name, parameter in generator.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name

    discriminator.zero_grad()
    real = torch.randn(4, 1, 32, 32)
    fake = generator(torch.randn(4, generator.z_dim)).detach()
    discriminator_loss = F.softplus(-discriminator(real)).mean() + F.softplus(discriminator(fake)).mean()
    discriminator_loss.backward()
    for name, parameter in discriminator.named_parameters():
        assert parameter.grad is not None, name
        assert parameter.grad.abs().sum() > 0, name


def r1_penalty_and_grads(discriminator, real):
    real = real.detach().clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(discriminator(real).sum(), real, create_graph=True)
    penalty = gradient.square().sum(dim=(1, 2, 3)).mean()
    discriminator.zero_grad()
    penalty.backward()
    return penalty.detach(), {name: p.grad for name, p in discriminator.named_parameters()}


@pytest.mark.parametrize("batch", [1, 5, 8])
def test_r1_double_backward_reaches_discriminator_weights(batch: int):
    _, discriminator = tiny_pair()
    penalty, grads = r1_penalty_and_grads(discriminator, torch.randn(batch, 1, 32, 32))
    assert penalty > 0
    # The output bias shifts the logit but not its gradient w.r.t. the input, so R1 cannot depend on it.
    assert grads.pop("out.bias") is None
    for name, grad in grads.items():
        assert grad is not None, name
        assert torch.isfinite(grad).all(), name
        # Biases reach dD/dx only through second derivatives, which are zero for (leaky) ReLU; they get an
        # R1 gradient only through the minibatch-std layer, so only before it and only when it groups >1 samples
        # (batch 1 and the prime batch 5 fall back to groups of one).
        must_be_nonzero = name.endswith("weight") or (batch == 8 and not name.startswith(("epilogue", "out")))
        assert (grad.abs().sum() > 0) == must_be_nonzero, name


@pytest.mark.parametrize(
    ("batch", "group_size", "expected_group"), [(8, 4, 4), (6, 4, 3), (7, 4, 1), (1, 4, 1), (2, 4, 2)]
)
def test_minibatch_stddev_groups_fall_back_to_a_divisor(batch: int, group_size: int, expected_group: int):
    x = torch.randn(batch, 3, 4, 4, dtype=torch.float64)
    out = minibatch_stddev(x, group_size)
    assert out.shape == (batch, 4, 4, 4)
    torch.testing.assert_close(out[:, :3], x)
    groups = x.reshape(expected_group, batch // expected_group, 3, 4, 4)
    std = (groups.var(dim=0, unbiased=False) + 1e-8).sqrt().mean(dim=(1, 2, 3))
    for sample in range(batch):
        expected = std[sample % (batch // expected_group)].expand(4, 4)
        torch.testing.assert_close(out[sample, 3], expected)


def test_discriminator_accepts_channels_last_inputs():
    _, discriminator = tiny_pair(channels=3)
    images = torch.randn(4, 3, 32, 32)
    logits = discriminator(images)
    logits_cl = discriminator(images.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(logits_cl, logits, rtol=1e-4, atol=1e-4)


def test_bf16_autocast_forward_and_backward_are_finite():
    generator, discriminator = tiny_pair(channels=3)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        images = generator(torch.randn(4, generator.z_dim))
        logits = discriminator(images.contiguous(memory_format=torch.channels_last))
    assert images.dtype == torch.float32 and logits.dtype == torch.float32
    assert torch.isfinite(images).all() and torch.isfinite(logits).all()
    z = torch.randn(4, generator.z_dim)
    with torch.no_grad():
        reference_images = generator(z)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            bf16_images = generator(z)
    # Noise is random per call, so compare statistics rather than pixels.
    assert abs(bf16_images.std().item() - reference_images.std().item()) < 0.2 * reference_images.std().item()
    F.softplus(-logits).mean().backward()
    for name, parameter in [*generator.named_parameters(), *discriminator.named_parameters()]:
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name

    real = torch.randn(4, 3, 32, 32, requires_grad=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        real_logits = discriminator(real)
    (gradient,) = torch.autograd.grad(real_logits.sum(), real, create_graph=True)
    discriminator.zero_grad()
    gradient.square().sum().backward()
    assert gradient.abs().sum() > 0
    for name, parameter in discriminator.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name


def saved_activation_bytes(fn):
    """Bytes of distinct storages that autograd keeps for the backward pass while running fn()."""
    storages: dict[int, int] = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn()
    return out, sum(storages.values())


def test_gradient_checkpointing_gives_identical_results_with_less_saved_memory():
    kwargs = {"resolution": 64, "channels": 3, "channel_base": 512, "channel_max": 32}
    generator = StyleGAN2Generator(**kwargs, z_dim=32, w_dim=32, mapping_layers=2)
    discriminator = StyleGAN2Discriminator(**kwargs)
    generator_ckpt = StyleGAN2Generator(
        **kwargs, z_dim=32, w_dim=32, mapping_layers=2, gradient_checkpointing=True
    )
    discriminator_ckpt = StyleGAN2Discriminator(**kwargs, gradient_checkpointing=True)
    generator_ckpt.load_state_dict(generator.state_dict())
    discriminator_ckpt.load_state_dict(discriminator.state_dict())
    z = torch.randn(4, 32)

    results = []
    for gen, disc in [(generator, discriminator), (generator_ckpt, discriminator_ckpt)]:
        torch.manual_seed(1)  # same noise draws; checkpointing must replay them identically on recompute
        images, generator_bytes = saved_activation_bytes(lambda gen=gen: gen(z))
        logits, discriminator_bytes = saved_activation_bytes(lambda disc=disc, images=images: disc(images))
        F.softplus(-logits).mean().backward()
        grads = {f"G.{n}": p.grad.clone() for n, p in gen.named_parameters()}
        grads |= {f"D.{n}": p.grad.clone() for n, p in disc.named_parameters()}
        penalty, r1_grads = r1_penalty_and_grads(disc, images)
        results.append((images, logits, grads, penalty, r1_grads, generator_bytes, discriminator_bytes))

    plain, ckpt = results
    torch.testing.assert_close(ckpt[0], plain[0], rtol=0, atol=0)
    torch.testing.assert_close(ckpt[1], plain[1], rtol=0, atol=0)
    torch.testing.assert_close(ckpt[2], plain[2], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ckpt[3], plain[3], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ckpt[4], plain[4], rtol=1e-5, atol=1e-7)
    assert ckpt[5] < 0.25 * plain[5], (ckpt[5], plain[5])  # generator: only block inputs are kept
    assert ckpt[6] < 0.5 * plain[6], (ckpt[6], plain[6])  # discriminator: fromRGB output still kept


# ---- D architectures (NVlabs `training/networks.py` DiscriminatorBlock / DiscriminatorEpilogue, commit d72cc7d) -----
# resnet: fromrgb at the top block only, skip(x, gain=sqrt(0.5)) + conv1(conv0(x), gain=sqrt(0.5)); orig: the same
# fromrgb, conv1(conv0(x)) with no skip and no gain; skip: orig's convs, plus in every block below the top and in the
# epilogue `x + fromrgb(img)` with img = downsample2d(img) after each block (the epilogue's fromrgb has no conv_clamp).
# Beyond these tests, a scratch script loaded NVlabs' weights into ours at 32 px for each architecture: fp32 logits
# agreed to 6e-6 (not committed: it needs their checkout).
SHARED_D_KEYS = [
    "from_image.weight",
    "from_image.bias",
    *(f"blocks.{i}.{conv}.{p}" for i in (0, 1) for conv in ("conv0", "conv1") for p in ("weight", "bias")),
    *(f"{layer}.{p}" for layer in ("epilogue_conv", "epilogue_fc", "out") for p in ("weight", "bias")),
]
D_KEYS = {
    # resnet: the names checkpoints written before the switch have (so they load as they are).
    "resnet": {*SHARED_D_KEYS, "blocks.0.skip.weight", "blocks.1.skip.weight"},
    "orig": set(SHARED_D_KEYS),
    # NVlabs' b8.fromrgb and b4.fromrgb; the top block's (b16.fromrgb) is `from_image` in every architecture.
    "skip": {
        *SHARED_D_KEYS,
        *(f"{m}.{p}" for m in ("blocks.1.from_image", "epilogue_from_image") for p in ("weight", "bias")),
    },
}


def tiny_discriminator(
    architecture: str, resolution: int = 16, channels: int = 3, **kwargs
) -> StyleGAN2Discriminator:
    return StyleGAN2Discriminator(
        resolution=resolution, channels=channels, architecture=architecture, **TINY, **kwargs
    )


@pytest.mark.parametrize("architecture", D_ARCHITECTURES)
def test_each_d_architecture_has_nvlabs_layers_and_resnet_keeps_its_names(architecture: str):
    assert set(tiny_discriminator(architecture).state_dict()) == D_KEYS[architecture]
    # The default, so a config from before the switch builds the network it trained.
    assert StyleGAN2Discriminator().architecture == "resnet"


def test_orig_block_is_the_residual_blocks_main_branch_without_its_gain():
    """NVlabs: resnet's conv1 runs with gain sqrt(0.5), orig's with none; leaky ReLU is positively homogeneous, so with
    the same weights resnet(x) - skip(x) == sqrt(0.5) * orig(x) exactly (no clamp in fp64)."""
    resnet = DiscriminatorBlock(4, 6, architecture="resnet").double()
    orig = DiscriminatorBlock(4, 6, architecture="orig").double()
    missing, unexpected = orig.load_state_dict(resnet.state_dict(), strict=False)
    assert (missing, unexpected) == ([], ["skip.weight"])
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            resnet(x) - resnet.skip(x), math.sqrt(0.5) * orig(x), rtol=1e-12, atol=1e-12
        )
        torch.testing.assert_close(orig(x), orig.conv1(orig.conv0(x)), rtol=0, atol=0)


@pytest.mark.parametrize("downsampling", ["fir", "avg_pool"])
def test_skip_d_adds_a_fromrgb_of_the_downsampled_image_at_every_lower_resolution(downsampling: str):
    discriminator = tiny_discriminator("skip", downsampling=downsampling).double()
    images = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    if downsampling == "fir":  # NVlabs upfirdn2d.downsample2d with [1, 3, 3, 1]
        kernel = fir_kernel_2d().double()

        def down(image):
            return fir_downsample_2x(image, kernel)
    else:

        def down(image):
            return F.avg_pool2d(image, 2)

    first, second = discriminator.blocks
    image8, image4 = down(images), down(down(images))
    x = first.conv1(first.conv0(discriminator.from_image(images)))
    x = second.conv1(second.conv0(x + second.from_image(image8)))
    x = minibatch_stddev(x + discriminator.epilogue_from_image(image4), discriminator.mbstd_group_size)
    expected = discriminator.out(
        discriminator.epilogue_fc(discriminator.epilogue_conv(x).flatten(1))
    ).squeeze(1)
    with torch.no_grad():
        torch.testing.assert_close(discriminator(images), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("architecture", ["orig", "skip"])
def test_orig_and_skip_ds_train_every_parameter_and_r1_reaches_every_weight(architecture: str):
    discriminator = tiny_discriminator(architecture)
    real, fake = torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16)
    (F.softplus(-discriminator(real)).mean() + F.softplus(discriminator(fake)).mean()).backward()
    for name, parameter in discriminator.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    penalty, grads = r1_penalty_and_grads(discriminator, real)
    assert penalty > 0
    for name, grad in grads.items():
        if name.endswith("weight"):
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


@pytest.mark.parametrize("architecture", D_ARCHITECTURES)
def test_compile_units_hold_every_parameter_once_in_every_architecture(architecture: str):
    """`hardware.compile_scope=blocks` compiles exactly these: a layer left out would run eagerly, one listed twice
    (inside a listed block and on its own) would be compiled twice."""
    discriminator = tiny_discriminator(architecture)
    units = discriminator.compile_units()
    unit_params = [id(p) for unit in units for p in unit.parameters()]
    assert len(unit_params) == len(set(unit_params))
    assert set(unit_params) == {id(p) for p in discriminator.parameters()}
    assert all(block in units for block in discriminator.blocks)


@pytest.mark.parametrize("architecture", ["orig", "skip"])
def test_gradient_checkpointing_leaves_orig_and_skip_ds_unchanged(architecture: str):
    plain = tiny_discriminator(architecture)
    checkpointed = tiny_discriminator(architecture, gradient_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(4, 3, 16, 16)
    results = []
    for discriminator in (plain, checkpointed):
        logits = discriminator(images)
        logits.sum().backward()
        results.append((logits, {n: p.grad for n, p in discriminator.named_parameters()}))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-7)


def test_a_skip_block_called_without_the_image_says_so():
    with pytest.raises(ValueError, match="takes the image too"):
        DiscriminatorBlock(4, 4, architecture="skip", from_image_channels=3)(torch.randn(1, 4, 8, 8))


def gaussian_blobs(count: int = 8, resolution: int = 32) -> torch.Tensor:
    """Fixed 'dataset': one bright blob per image at a random position, in [-1, 1]."""
    generator = torch.Generator().manual_seed(123)
    yy, xx = torch.meshgrid(torch.arange(float(resolution)), torch.arange(float(resolution)), indexing="ij")
    centers = torch.rand(count, 2, generator=generator) * (resolution / 2) + resolution / 4
    squared_distance = (yy - centers[:, 0, None, None]) ** 2 + (xx - centers[:, 1, None, None]) ** 2
    return (torch.exp(-squared_distance / 20) * 2 - 1)[:, None]


def test_tiny_pair_fits_a_single_batch():
    generator, discriminator = tiny_pair()
    untrained_generator = copy.deepcopy(generator)
    real = gaussian_blobs()
    z = torch.randn(8, generator.z_dim)
    adam = {"lr": 2e-3, "betas": (0.0, 0.99)}
    generator_opt = torch.optim.Adam(generator.parameters(), **adam)
    discriminator_opt = torch.optim.Adam(discriminator.parameters(), **adam)

    def distances_to_real(gen):
        with torch.no_grad():
            fake = gen(z)
        mean_image_gap = (fake.mean(dim=0) - real.mean(dim=0)).square().mean().item()
        nearest_real = torch.cdist(fake.flatten(1), real.flatten(1)).min(dim=1).values.mean().item()
        return mean_image_gap, nearest_real, fake

    for _ in range(30):
        fake = generator(z)
        discriminator_loss = (
            F.softplus(-discriminator(real)).mean() + F.softplus(discriminator(fake.detach())).mean()
        )
        discriminator_opt.zero_grad()
        discriminator_loss.backward()
        discriminator_opt.step()
        generator_loss = F.softplus(-discriminator(fake)).mean()
        generator_opt.zero_grad()
        generator_loss.backward()
        generator_opt.step()

    gap_before, nearest_before, _ = distances_to_real(untrained_generator)
    gap_after, nearest_after, fake = distances_to_real(generator)
    # Over 6 seeds: mean-image gap shrank 15-40x and the nearest-real distance 2.3-4.2x.
    assert gap_after < gap_before / 5, (gap_before, gap_after)
    assert nearest_after < nearest_before / 1.5, (nearest_before, nearest_after)
    assert math.isfinite(generator_loss.item()) and math.isfinite(discriminator_loss.item())

    # A fresh discriminator overfits the fixed real/fake split: its loss falls from ~log(4) to well below it.
    fresh_discriminator = StyleGAN2Discriminator(resolution=32, channels=1, **TINY)
    fresh_opt = torch.optim.Adam(fresh_discriminator.parameters(), **adam)
    losses = []
    for _ in range(60):
        loss = F.softplus(-fresh_discriminator(real)).mean() + F.softplus(fresh_discriminator(fake)).mean()
        fresh_opt.zero_grad()
        loss.backward()
        fresh_opt.step()
        losses.append(loss.item())
    assert losses[0] > 1.0 and losses[-1] < 0.9, losses
