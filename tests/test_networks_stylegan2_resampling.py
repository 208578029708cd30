"""Tests for StyleGAN2's NVlabs-faithful pieces: FIR resampling (src/pixelsmith/gan/networks/fir.py), the transposed
conv + blur up path, fp16 routing with `num_fp16_res` and `conv_clamp`, and the resume check for old checkpoints.

The references are written here, in numpy/scipy, from NVlabs' stylegan2-ada-pytorch definitions:
- `torch_utils/ops/upfirdn2d.py` `_upfirdn2d_ref` (zero-insertion upsampling, padding, *convolution* with the filter,
  keeping every `down`-th pixel), `setup_filter` (outer product of [1, 3, 3, 1], normalised to sum 1, times
  gain ** (ndim / 2)), `upsample2d` (padding [2, 1] for 4 taps, gain 4) and `downsample2d` (padding [1, 1], gain 1);
- `torch_utils/ops/conv2d_resample.py` `conv2d_resample`: up=2 pads the zero-upsampled input by 3 before / 2 after
  (= padding 1 + (4 + 2 - 1) // 2, 1 + (4 - 2) // 2), filters with gain 4, then a valid conv; down=2 with a 3x3 weight
  pads by 2 before the filter and convolves at stride 2; a 1x1 weight downsamples first;
- `training/networks.py` `modulated_conv2d` (per-sample weight W * s, demodulated by rsqrt(sum W'^2 + 1e-8)) with
  `SynthesisLayer`'s flip_weight = (up == 1): a true convolution for the up=2 layer, a correlation otherwise;
  `SynthesisNetwork`'s fp16_resolution = max(2 ** (log2(res) + 1 - num_fp16_res), 8).
All on CPU with tiny tensors (float64 where the comparison is exact).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.signal
import torch
from omegaconf import OmegaConf

from pixelsmith.gan.networks.fir import fir_downsample_2x, fir_filter, fir_kernel_2d, fir_upsample_2x
from pixelsmith.gan.networks.stylegan2 import (
    EqualizedConv2d,
    ModulatedConv2d,
    StyleGAN2Discriminator,
    StyleGAN2Generator,
    SynthesisLayer,
)
from pixelsmith.run.resume import (
    CheckpointMismatchError,
    check_same_function,
)
from tests.conftest import torch_threads

TINY = {"channel_base": 256, "channel_max": 16}


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    with torch_threads(1):
        yield


# ---- the numpy reference ------------------------------------------------------------------------------------------
def reference_filter_2d(gain: float = 1.0) -> np.ndarray:
    taps = np.array([1.0, 3.0, 3.0, 1.0])
    kernel = np.outer(taps, taps)
    return kernel / kernel.sum() * gain


def reference_upfirdn2d(x: np.ndarray, up: int, down: int, pad: tuple[int, int], gain: float) -> np.ndarray:
    """NVlabs `_upfirdn2d_ref` on one [H, W] plane: insert up-1 zeros after each pixel, pad (before, after), convolve
    (scipy's convolve2d flips the kernel: a true convolution) with the gain-scaled filter, keep every down-th pixel."""
    height, width = x.shape
    upsampled = np.zeros((height * up, width * up))
    upsampled[::up, ::up] = x
    padded = np.pad(upsampled, (pad, pad))
    return scipy.signal.convolve2d(padded, reference_filter_2d(gain), mode="valid")[::down, ::down]


def per_plane(fn, x: torch.Tensor) -> torch.Tensor:
    planes = [[fn(plane.numpy()) for plane in sample] for sample in x]
    return torch.from_numpy(np.array(planes))


# ---- FIR ops against the reference --------------------------------------------------------------------------------
def test_the_filter_is_the_normalised_binomial_outer_product():
    kernel = fir_kernel_2d()
    assert kernel.dtype == torch.float32 and kernel.shape == (4, 4)
    np.testing.assert_allclose(kernel.numpy(), reference_filter_2d(), rtol=1e-7)
    assert kernel[0, 0].item() == pytest.approx(1 / 64) and kernel[1, 2].item() == pytest.approx(9 / 64)


@pytest.mark.parametrize("size", [8, 7, 9, 6])
def test_fir_downsample_matches_upfirdn2d_reference_at_even_and_odd_sizes(size: int):
    x = torch.randn(2, 3, size, size + 1, dtype=torch.float64)
    kernel = fir_kernel_2d().double()
    expected = per_plane(lambda p: reference_upfirdn2d(p, up=1, down=2, pad=(1, 1), gain=1.0), x)
    out = fir_downsample_2x(x, kernel)
    assert out.shape == expected.shape == (2, 3, size // 2, (size + 1) // 2)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("size", [4, 5])
def test_fir_upsample_matches_upfirdn2d_reference_with_gain_4(size: int):
    x = torch.randn(2, 3, size, size + 2, dtype=torch.float64)
    expected = per_plane(lambda p: reference_upfirdn2d(p, up=2, down=1, pad=(2, 1), gain=4.0), x)
    out = fir_upsample_2x(x, fir_kernel_2d().double())
    assert out.shape == expected.shape == (2, 3, 2 * size, 2 * size + 4)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_fir_upsample_by_hand_a_single_pixel_spreads_as_the_filter_taps_over_4():
    x = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    x[0, 0, 1, 2] = 1.0
    out = fir_upsample_2x(x, fir_kernel_2d().double())[0, 0]
    # out[2i] = (x[i-1] + 3 x[i]) / 4 and out[2i+1] = (3 x[i] + x[i+1]) / 4 per axis: pixel (1, 2) reaches rows 1..4
    # with weights 1/4, 3/4, 3/4, 1/4 and columns 3..6 likewise.
    taps = torch.tensor([1.0, 3.0, 3.0, 1.0], dtype=torch.float64) / 4
    expected = torch.zeros(8, 8, dtype=torch.float64)
    expected[1:5, 3:7] = torch.outer(taps, taps)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-15)
    # A constant image stays constant away from the zero-padded border (gain 4 makes up for the inserted zeros).
    constant = fir_upsample_2x(torch.full((1, 1, 6, 6), 2.5, dtype=torch.float64), fir_kernel_2d().double())
    torch.testing.assert_close(constant[..., 1:-1, 1:-1], torch.full_like(constant[..., 1:-1, 1:-1], 2.5))


@pytest.mark.parametrize(("padding", "gain"), [(1, 4.0), (2, 1.0)])
def test_fir_filter_at_stride_1_matches_the_reference(padding: int, gain: float):
    x = torch.randn(2, 2, 7, 6, dtype=torch.float64)
    expected = per_plane(lambda p: reference_upfirdn2d(p, up=1, down=1, pad=(padding, padding), gain=gain), x)
    out = fir_filter(x, fir_kernel_2d().double(), padding=padding, gain=gain)
    assert out.shape == (2, 2, 7 + 2 * padding - 3, 6 + 2 * padding - 3)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "op",
    [
        lambda x, k: fir_downsample_2x(x, k),
        lambda x, k: fir_upsample_2x(x, k),
        lambda x, k: fir_filter(x, k, padding=1, gain=4.0),
        lambda x, k: fir_filter(x, k, padding=2),
    ],
    ids=["down", "up", "blur-pad1", "blur-pad2"],
)
def test_fir_ops_pass_gradcheck_and_gradgradcheck(op):
    kernel = fir_kernel_2d().double()
    for size in (5, 6):
        x = torch.randn(2, 3, size, size, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t: op(t, kernel), (x,))
        assert torch.autograd.gradgradcheck(lambda t: op(t, kernel), (x,))


def test_fir_double_backward_is_the_depthwise_filter_pair_not_convolution_double_backward():
    """R1's graph: the gradient of a downsampling filter is its transposed filter, whose own backward is the filter
    again; neither is PyTorch's generic convolution double backward (one conv per channel for groups=C)."""
    x = torch.randn(2, 8, 8, 8, requires_grad=True)
    out = fir_downsample_2x(x, fir_kernel_2d())
    (gradient,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    names = set()
    stack = [gradient.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None:
            names.add(type(node).__name__)
            stack.extend(next_fn for next_fn, _ in node.next_functions)
    assert any("_DepthwiseFIRTranspose" in name for name in names), names
    assert not any(name.startswith("Convolution") for name in names), names


def test_fir_runs_in_the_input_dtype_under_autocast():
    kernel = fir_kernel_2d()
    x = torch.randn(1, 2, 8, 8, dtype=torch.bfloat16)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert fir_downsample_2x(x, kernel).dtype == torch.bfloat16
        assert fir_upsample_2x(x.float(), kernel).dtype == torch.float32


# ---- the layers against unfused references ------------------------------------------------------------------------
def reference_modulated_up_conv(x, weight, styles):
    """NVlabs `modulated_conv2d(up=2, fused_modconv=False)` by its generic path, per sample: the demodulated per-sample
    weight [O, I, 3, 3]; zero-upsample each input plane, pad 3 / 2, FIR with gain 4, then a *true* 3x3 convolution
    (flip_weight=False) summed over input channels."""
    x, weight, styles = x.numpy(), weight.numpy(), styles.numpy()
    out = []
    for sample in range(x.shape[0]):
        per_sample = weight * styles[sample][None, :, None, None]
        per_sample = per_sample / np.sqrt((per_sample**2).sum(axis=(1, 2, 3), keepdims=True) + 1e-8)
        filtered = [reference_upfirdn2d(plane, up=2, down=1, pad=(3, 2), gain=4.0) for plane in x[sample]]
        out.append(
            [
                sum(
                    scipy.signal.convolve2d(filtered[i], per_sample[o, i], mode="valid")
                    for i in range(x.shape[1])
                )
                for o in range(weight.shape[0])
            ]
        )
    return torch.from_numpy(np.array(out))


def test_fir_up_modulated_conv_matches_the_unfused_per_sample_reference():
    layer = ModulatedConv2d(4, 5, 3, w_dim=6, demodulate=True, upsample="fir").double()
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64)
    w = torch.randn(3, 6, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x, w)
        expected = reference_modulated_up_conv(x, layer.weight * layer.weight_gain, layer.affine(w))
    assert out.shape == expected.shape == (3, 5, 10, 10)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_fir_up_path_keeps_the_parameter_shapes_of_the_bilinear_one_and_costs_a_quarter_of_its_conv():
    fir = StyleGAN2Generator(resolution=32, upsampling="fir", z_dim=8, w_dim=8, mapping_layers=1, **TINY)
    bilinear = StyleGAN2Generator(
        resolution=32, upsampling="bilinear", z_dim=8, w_dim=8, mapping_layers=1, **TINY
    )
    assert {k: v.shape for k, v in fir.state_dict().items()} == {
        k: v.shape for k, v in bilinear.state_dict().items()
    }
    bilinear.load_state_dict(fir.state_dict())  # strict: the filters are not persistent buffers

    # MACs of the upsampling 3x3 conv at 16 -> 32 px: the transposed conv touches each input pixel once per tap.
    from torch.utils.flop_counter import FlopCounterMode

    layer_fir = ModulatedConv2d(8, 8, 3, w_dim=8, upsample="fir")
    layer_bilinear = ModulatedConv2d(8, 8, 3, w_dim=8, upsample="bilinear")
    x, w = torch.randn(2, 8, 16, 16), torch.randn(2, 8)
    counts = []
    for layer in (layer_fir, layer_bilinear):
        with FlopCounterMode(display=False) as counter:
            layer(x, w)
        counts.append(counter.get_flop_counts()["Global"])
    conv_fir = counts[0][torch.ops.aten.convolution]
    conv_bilinear = counts[1][torch.ops.aten.convolution]
    # 2 FLOPs per MAC x batch 2 x out 8 x in 8 x 9 taps at the 16x16 input pixels, plus the depthwise 4x4 blur at
    # the 32x32 output; bilinear: the same 3x3 conv at the 32x32 output pixels.
    transposed_conv, blur = 2 * 2 * 8 * 8 * 9 * 16 * 16, 2 * 2 * 8 * 16 * 32 * 32
    assert conv_fir == transposed_conv + blur
    assert conv_bilinear == 4 * transposed_conv


@pytest.mark.parametrize("kernel_size", [3, 1])
def test_fir_downsampling_conv_matches_blur_then_strided_correlation(kernel_size: int):
    layer = EqualizedConv2d(3, 4, kernel_size, bias=True, downsample="fir").double()
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    weight = (layer.weight * layer.weight_gain).detach().numpy()
    out = layer(x).detach()
    expected = np.zeros((2, 4, 4, 4))
    for n in range(2):
        for i in range(3):
            plane = x[n, i].numpy()
            if kernel_size == 3:  # NVlabs: filter with padding 2, then a valid 3x3 correlation at stride 2
                blurred = reference_upfirdn2d(plane, up=1, down=1, pad=(2, 2), gain=1.0)
                for o in range(4):
                    expected[n, o] += scipy.signal.correlate2d(blurred, weight[o, i], mode="valid")[::2, ::2]
            else:  # 1x1: downsample (padding 1), then the 1x1 conv
                down = reference_upfirdn2d(plane, up=1, down=2, pad=(1, 1), gain=1.0)
                for o in range(4):
                    expected[n, o] += weight[o, i, 0, 0] * down
    expected += layer.bias.detach().numpy()[None, :, None, None]
    torch.testing.assert_close(out, torch.from_numpy(expected), rtol=1e-10, atol=1e-10)


def test_discriminator_r1_double_backward_reaches_every_weight_with_fir():
    discriminator = StyleGAN2Discriminator(resolution=16, channels=3, downsampling="fir", **TINY)
    real = torch.randn(4, 3, 16, 16, requires_grad=True)
    (gradient,) = torch.autograd.grad(discriminator(real).sum(), real, create_graph=True)
    gradient.square().sum().backward()
    for name, parameter in discriminator.named_parameters():
        if name.endswith("weight"):
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


# ---- fp16 routing and conv_clamp ----------------------------------------------------------------------------------
def conv_output_dtypes(network, *inputs):
    """dtype of each named submodule's output in one forward."""
    dtypes = {}
    hooks = [
        module.register_forward_hook(lambda m, i, o, name=name: dtypes.__setitem__(name, o.dtype))
        for name, module in network.named_modules()
        if name and isinstance(module, EqualizedConv2d | ModulatedConv2d | SynthesisLayer)
    ]
    try:
        network(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return dtypes


def test_fp16_autocast_runs_only_the_top_resolutions_in_fp16_mapping_and_epilogue_in_fp32():
    # 64 px, num_fp16_res=2: fp16_resolution = max(2 ** (6 + 1 - 2), 8) = 32, so the 32 and 64 px blocks.
    generator = StyleGAN2Generator(
        resolution=64, channels=3, z_dim=8, w_dim=8, mapping_layers=2, num_fp16_res=2, **TINY
    )
    discriminator = StyleGAN2Discriminator(resolution=64, channels=3, num_fp16_res=2, **TINY)
    z = torch.randn(2, 8)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        assert generator.mapping(z).dtype == torch.float32
        dtypes = conv_output_dtypes(generator.synthesis, generator.mapping(z))
        images = generator(z)
        d_dtypes = conv_output_dtypes(discriminator, images)
        logits = discriminator(images)
    resolutions = [4, 8, 16, 32, 64]
    for index, res in enumerate(resolutions):
        expected = torch.float16 if res >= 32 else torch.float32
        block_dtypes = {k: v for k, v in dtypes.items() if k.startswith(f"blocks.{index}.")}
        assert block_dtypes and set(block_dtypes.values()) == {expected}, (res, block_dtypes)
    assert images.dtype == torch.float32 and torch.isfinite(images).all()
    # D's blocks take 64, 32, 16, 8 px inputs: the first two in fp16 (and fromRGB with them), then fp32.
    assert d_dtypes["from_image"] == torch.float16
    for index, res in enumerate([64, 32, 16, 8]):
        expected = torch.float16 if res >= 32 else torch.float32
        block_dtypes = {k: v for k, v in d_dtypes.items() if k.startswith(f"blocks.{index}.")}
        assert set(block_dtypes.values()) == {expected}, (res, block_dtypes)
    assert d_dtypes["epilogue_conv"] == torch.float32 and logits.dtype == torch.float32

    # The whole network under fp16 autocast where num_fp16_res is None (this template's first behaviour).
    everything = StyleGAN2Generator(
        resolution=64, channels=3, z_dim=8, w_dim=8, mapping_layers=2, num_fp16_res=None, **TINY
    )
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        assert set(conv_output_dtypes(everything.synthesis, everything.mapping(z)).values()) == {
            torch.float16
        }


def test_fp16_autocast_runs_a_skip_ds_fromrgbs_in_their_blocks_precision_and_the_epilogues_in_fp32():
    # NVlabs: each block's fromrgb in the block's dtype (fp16 in the top num_fp16_res resolutions), the epilogue's in
    # fp32 with the rest of the epilogue. 64 px, num_fp16_res=2: blocks at 64 and 32 px in fp16.
    discriminator = StyleGAN2Discriminator(
        resolution=64, channels=3, num_fp16_res=2, architecture="skip", **TINY
    )
    images = torch.randn(2, 3, 64, 64)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        dtypes = conv_output_dtypes(discriminator, images)
        logits = discriminator(images)
    assert dtypes["from_image"] == dtypes["blocks.1.from_image"] == torch.float16
    assert dtypes["blocks.2.from_image"] == dtypes["blocks.3.from_image"] == torch.float32
    assert dtypes["epilogue_from_image"] == dtypes["epilogue_conv"] == torch.float32
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_fp16_output_tracks_fp32_and_styles_far_beyond_fp16_range_do_not_overflow():
    kwargs = {
        "resolution": 32,
        "channels": 3,
        "z_dim": 8,
        "w_dim": 8,
        "mapping_layers": 2,
        "use_noise": False,
    }
    generator = StyleGAN2Generator(**kwargs, num_fp16_res=2, **TINY)
    z = torch.randn(4, 8)
    with torch.no_grad():
        reference = generator(z)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            half = generator(z)
        torch.testing.assert_close(half, reference, rtol=0.05, atol=0.05 * reference.abs().max().item())
        # Styles of 1e5 in every demodulated layer: x * styles alone would pass 65504 in fp16. Demodulation makes the
        # result independent of the styles' scale, so it must equal the unscaled one.
        for block in generator.synthesis.blocks:
            for layer in (block.conv0, block.conv1):
                if layer is not None:
                    layer.conv.affine.bias.mul_(1e5)
                    layer.conv.affine.weight.mul_(1e5)
        scaled_reference = generator(z)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            scaled_half = generator(z)
    assert torch.isfinite(scaled_half).all()
    torch.testing.assert_close(
        scaled_half, scaled_reference, rtol=0.05, atol=0.05 * scaled_reference.abs().max().item()
    )


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_fp32_and_bf16_runs_are_unchanged_by_num_fp16_res(autocast_dtype):
    kwargs = {
        "resolution": 32,
        "channels": 3,
        "z_dim": 8,
        "w_dim": 8,
        "mapping_layers": 2,
        "use_noise": False,
        **TINY,
    }
    routed_g, plain_g = (
        StyleGAN2Generator(**kwargs, num_fp16_res=2),
        StyleGAN2Generator(**kwargs, num_fp16_res=None),
    )
    plain_g.load_state_dict(routed_g.state_dict())
    d_kwargs = {"resolution": 32, "channels": 3, **TINY}
    routed_d, plain_d = (
        StyleGAN2Discriminator(**d_kwargs, num_fp16_res=2),
        StyleGAN2Discriminator(**d_kwargs, num_fp16_res=None),
    )
    plain_d.load_state_dict(routed_d.state_dict())
    z = torch.randn(4, 8)
    results = []
    for generator, discriminator in ((routed_g, routed_d), (plain_g, plain_d)):
        with torch.autocast(
            device_type="cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
        ):
            images = generator(z)
            results.append((images, discriminator(images)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


def test_conv_clamp_bounds_every_fp16_conv_output_and_fp32_or_none_leaves_it_alone():
    # NVlabs' conv_clamp guards fp16's range; their --fp32 config sets it to None, so fp32 (and bf16) runs skip it.
    layer = SynthesisLayer(4, 4, w_dim=4, upsample=None, use_noise=False, conv_clamp=256.0)
    unclamped = SynthesisLayer(4, 4, w_dim=4, upsample=None, use_noise=False, conv_clamp=None)
    unclamped.load_state_dict(layer.state_dict())
    with torch.no_grad():
        layer.bias.fill_(1000.0)
        unclamped.bias.fill_(1000.0)
        x, w = torch.randn(2, 4, 8, 8), torch.randn(2, 4)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            # leaky ReLU(x + 1000) * sqrt(2) ~ 1414 everywhere: clamped to exactly 256 in fp16.
            clamped = layer(x, w)
            assert clamped.dtype == torch.float16
            assert clamped.amax().item() == 256.0 and clamped.amin().item() == 256.0
            assert unclamped(x, w).amin().item() > 1000.0
        assert layer(x, w).amin().item() > 1000.0  # fp32: no clamp
        torch.testing.assert_close(layer(x, w), unclamped(x, w), rtol=0, atol=0)

    conv = EqualizedConv2d(2, 3, 3, downsample="fir", conv_clamp=5.0)
    with torch.no_grad():
        conv.weight.mul_(100.0)
        images = torch.randn(2, 2, 8, 8)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            out = conv(images)
        assert conv(images).abs().amax().item() > 5.0
    assert out.abs().amax().item() == 5.0
    # D's residual branches carry their 1/sqrt(2) inside the layer: the clamp bound scales with it (NVlabs clamps each
    # branch at conv_clamp * sqrt(0.5) after the scaling).
    branch = EqualizedConv2d(2, 3, 3, activation=True, conv_clamp=5.0, output_gain=math.sqrt(0.5))
    with torch.no_grad():
        branch.weight.mul_(100.0)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            assert branch(images).abs().amax().item() == pytest.approx(5.0 * math.sqrt(0.5), rel=1e-3)


# ---- config and old checkpoints -----------------------------------------------------------------------------------
def test_invalid_switch_values_are_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="upsampling='nearest': choose one of fir, bilinear"):
        StyleGAN2Generator(upsampling="nearest", **TINY)
    with pytest.raises(ValueError, match="downsampling='max': choose one of fir, avg_pool"):
        StyleGAN2Discriminator(downsampling="max", **TINY)
    with pytest.raises(ValueError, match="architecture='residual': choose one of resnet, orig, skip"):
        StyleGAN2Discriminator(architecture="residual", **TINY)
    with pytest.raises(ValueError, match="num_fp16_res must be >= 0"):
        StyleGAN2Discriminator(num_fp16_res=-1, **TINY)
    with pytest.raises(ValueError, match="conv_clamp must be > 0"):
        StyleGAN2Generator(conv_clamp=0.0, **TINY)


def stored_config(generator: dict, discriminator: dict) -> dict:
    return {
        "model": {
            "name": "stylegan2",
            "generator": {
                "_target_": "pixelsmith.gan.networks.stylegan2.StyleGAN2Generator",
                "z_dim": 8,
                **generator,
            },
            "discriminator": {
                "_target_": "pixelsmith.gan.networks.stylegan2.StyleGAN2Discriminator",
                **discriminator,
            },
        }
    }


def test_resuming_an_old_checkpoint_with_the_other_resampling_is_refused_in_one_paragraph(tmp_path):
    old = stored_config({"upsampling": "bilinear"}, {"downsampling": "avg_pool"})
    faithful = OmegaConf.create(stored_config({"upsampling": "fir"}, {"downsampling": "fir"}))
    with pytest.raises(CheckpointMismatchError) as info:
        check_same_function(old, tmp_path / "old.ckpt", faithful, auto_resumed=False)
    message = str(info.value)
    assert "model.generator.upsampling: bilinear in the checkpoint, fir here" in message
    assert "model.discriminator.downsampling: avg_pool in the checkpoint, fir here" in message
    assert "add model.generator.upsampling=bilinear model.discriminator.downsampling=avg_pool" in message
    assert "\n" not in message
    # The same resampling (given explicitly, as experiment=mnist_stylegan2 does) loads; fp16 settings may change.
    cheap = OmegaConf.create(
        stored_config(
            {"upsampling": "bilinear", "num_fp16_res": 4}, {"downsampling": "avg_pool", "conv_clamp": 256}
        )
    )
    check_same_function(old, tmp_path / "old.ckpt", cheap, auto_resumed=False)
