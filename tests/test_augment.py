"""Tests for pixelsmith.augment: DiffAugment and ADA values, gradients, precision and the adaptive-p bookkeeping."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from kornia.geometry.transform import warp_affine
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pixelsmith.augment import AdaptiveAugment, DiffAugment, GANAugment
from pixelsmith.augment import ada as ada_module
from pixelsmith.augment.base import apply_to_selected_rows
from pixelsmith.augment.diffaugment import translate_integer
from pixelsmith.augment.warp import warp_affine_reflect
from tests.conftest import torch_threads


def ada_only(*ops: str, **options: float | str) -> AdaptiveAugment:
    """ADA at p=1 with only the given ops (multiplier 1) and the bilinear warp, which moves whole pixels exactly."""
    return AdaptiveAugment(initial_p=1.0, pipeline=",".join(ops), **{"warp": "bilinear", **options})


FACTORIES = {
    "diffaugment": lambda: DiffAugment(),
    "ada": lambda: AdaptiveAugment(initial_p=1.0),  # bgc, lowpass warp
    "ada-bilinear": lambda: AdaptiveAugment(initial_p=1.0, warp="bilinear"),
}


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    with torch_threads(2):
        yield


def images(n: int, channels: int, size: int = 16) -> torch.Tensor:
    return torch.rand(n, channels, size, size) * 2 - 1


# ---- common contract ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_augment_preserves_shape_and_dtype(name: str, channels: int, dtype: torch.dtype) -> None:
    x = images(6, channels).to(dtype)
    out = FACTORIES[name]()(x)
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert (out.float() - x.float()).abs().mean() > 0.05


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("channels", [1, 3])
def test_augment_under_bf16_autocast_is_finite_and_keeps_dtype(name: str, channels: int) -> None:
    aug = FACTORIES[name]()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_f32 = aug(images(6, channels))
        out_bf16 = aug(images(6, channels).bfloat16())
    assert out_f32.dtype == torch.float32 and out_bf16.dtype == torch.bfloat16
    assert torch.isfinite(out_f32).all() and torch.isfinite(out_bf16).all()


@pytest.mark.parametrize("name", FACTORIES)
def test_augment_channels_last_matches_contiguous(name: str) -> None:
    aug = FACTORIES[name]()
    x = images(5, 3)
    torch.manual_seed(1)
    expected = aug(x)
    torch.manual_seed(1)
    got = aug(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("channels", [1, 3])
def test_augment_gradient_reaches_input_and_generator_weights(name: str, channels: int) -> None:
    aug = FACTORIES[name]()
    generator = nn.Sequential(
        nn.Linear(8, channels * 16 * 16), nn.Unflatten(1, (channels, 16, 16)), nn.Tanh()
    )
    discriminator = nn.Conv2d(channels, 1, 3)
    fake = generator(torch.randn(4, 8))
    fake.retain_grad()
    discriminator(aug(fake)).mean().backward()
    assert fake.grad.abs().sum() > 0
    weight_grad = generator[0].weight.grad
    assert torch.isfinite(weight_grad).all() and weight_grad.abs().sum() > 0


@pytest.mark.parametrize("name", FACTORIES)
def test_augment_supports_r1_double_backward(name: str) -> None:
    # R1 differentiates D(aug(real)) w.r.t. real, then backpropagates that gradient's norm into D.
    aug = FACTORIES[name]()
    discriminator = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Softplus(), nn.Conv2d(4, 1, 3))
    real = images(4, 3).requires_grad_(True)
    (grad,) = torch.autograd.grad(discriminator(aug(real)).sum(), real, create_graph=True)
    grad.square().sum().backward()
    for layer in (discriminator[0], discriminator[2]):  # weights; the last bias cannot change d D / d real
        assert torch.isfinite(layer.weight.grad).all() and layer.weight.grad.abs().sum() > 0


class RecordAtenOps(TorchDispatchMode):
    """Records the name of every aten op dispatched (forward and backward, at every order) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", FACTORIES)
def test_augment_r1_path_uses_no_grid_sampler(name: str) -> None:
    # CUDA has no double backward for grid_sample ("derivative for aten::grid_sampler_2d_backward is not
    # implemented"), CPU has one: this CPU-side check stands in for R1 with ADA on a GPU.
    aug = FACTORIES[name]()
    discriminator = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Softplus(), nn.Conv2d(4, 1, 3))
    real = images(4, 3).requires_grad_(True)
    with RecordAtenOps() as recorded:
        (grad,) = torch.autograd.grad(discriminator(aug(real)).sum(), real, create_graph=True)
        grad.square().sum().backward()
    assert "aten.convolution_backward.default" in recorded.names  # the recorder saw the backward passes
    assert not [op for op in recorded.names if "grid_sampler" in op]
    assert "aten.gather.default" in recorded.names  # ADA's warp, DiffAugment's translation
    for layer in (discriminator[0], discriminator[2]):
        assert torch.isfinite(layer.weight.grad).all() and layer.weight.grad.abs().sum() > 0


def test_augment_rejects_wrong_inputs() -> None:
    with pytest.raises(ValueError, match="NCHW"):
        DiffAugment()(torch.zeros(3, 8, 8))
    with pytest.raises(TypeError, match="float"):
        AdaptiveAugment(initial_p=0.5)(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="Unknown DiffAugment op"):
        DiffAugment("color,flip")


# ---- DiffAugment ----------------------------------------------------------------------------------------------
def test_diffaugment_is_stateless_and_reports_probability_one() -> None:
    aug = DiffAugment()
    assert isinstance(aug, GANAugment)
    assert len(aug.state_dict()) == 0
    assert aug.probability == 1.0 and aug.stats() == {"p": 1.0}
    aug.observe_real_logits(torch.ones(4))
    aug.update(4)
    assert DiffAugment("").probability == 0.0


@pytest.mark.parametrize("policy", ["color", "translation", "cutout", "color,translation,cutout"])
def test_diffaugment_each_op_changes_images(policy: str) -> None:
    x = images(32, 3)
    out = DiffAugment(policy)(x)
    changed = (out - x).abs().flatten(1).amax(1) > 1e-3
    assert changed.float().mean() >= 0.75  # translation draws (0, 0) for 1 image in 25


def test_translate_integer_moves_content_and_pads_with_zero() -> None:
    x = torch.arange(1, 1 + 2 * 5 * 6, dtype=torch.float32).view(1, 2, 5, 6)
    out = translate_integer(x, torch.tensor([2]), torch.tensor([-1]))
    assert torch.equal(out[:, :, 2:, :-1], x[:, :, :-2, 1:])
    assert torch.equal(out[:, :, :2], torch.zeros(1, 2, 2, 6))
    assert torch.equal(out[..., -1], torch.zeros(1, 2, 5))


def zero_padded_shift(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    height, width = image.shape[-2:]
    out = torch.zeros_like(image)
    out[..., max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] = image[
        ..., max(-dy, 0) : height - max(dy, 0), max(-dx, 0) : width - max(dx, 0)
    ]
    return out


def test_diffaugment_translation_shifts_known_pattern_by_whole_pixels() -> None:
    # A strictly positive, all-distinct ramp: any shift is identifiable and zero padding cannot be mistaken for it.
    x = torch.linspace(0.1, 1.0, 16 * 16).view(1, 1, 16, 16).repeat(100, 1, 1, 1)
    out = DiffAugment("translation", translation_ratio=0.125)(x)  # up to round(16 * 0.125) = 2 pixels
    shifts = []
    for image_out in out:
        matches = [
            (dy, dx)
            for dy, dx in itertools.product(range(-2, 3), repeat=2)
            if torch.equal(image_out, zero_padded_shift(x[0], dy, dx))
        ]
        assert len(matches) == 1
        shifts.append(matches[0])
    assert len(set(shifts)) >= 15  # 25 equally likely shifts, 100 draws
    assert {dy for dy, _ in shifts} == set(range(-2, 3)) and {dx for _, dx in shifts} == set(range(-2, 3))


def test_diffaugment_brightness_is_uniform_half_in_minus1_1_units() -> None:
    # On a constant grey image saturation and contrast are no-ops, leaving x + U(-0.5, 0.5).
    x = torch.full((4000, 3, 4, 4), 0.2)
    out = DiffAugment("color")(x)
    offsets = out[:, 0, 0, 0] - 0.2
    torch.testing.assert_close(out, (0.2 + offsets).view(-1, 1, 1, 1).expand_as(out))
    assert offsets.min() >= -0.5 and offsets.max() <= 0.5
    assert offsets.min() < -0.49 and offsets.max() > 0.49
    assert offsets.std().item() == pytest.approx(1 / 12**0.5, abs=0.01)


def test_diffaugment_contrast_and_saturation_factors() -> None:
    x = images(2000, 3, size=8)
    out = DiffAugment("color")(x)
    # Contrast: the per-pixel channel mean, centred on the image mean, is scaled by c ~ U(0.5, 1.5).
    luma_in, luma_out = x.mean(1), out.mean(1)
    centred_in = luma_in - luma_in.mean((1, 2), keepdim=True)
    centred_out = luma_out - luma_out.mean((1, 2), keepdim=True)
    contrast = (centred_out * centred_in).sum((1, 2)) / centred_in.square().sum((1, 2))
    torch.testing.assert_close(centred_out, contrast.view(-1, 1, 1) * centred_in, atol=1e-5, rtol=0)
    assert 0.5 <= contrast.min() < 0.52 and 1.48 < contrast.max() <= 1.5
    # Saturation: the chroma (deviation from the channel mean) is scaled by s * c with s ~ U(0, 2).
    chroma_in, chroma_out = x - x.mean(1, keepdim=True), out - out.mean(1, keepdim=True)
    chroma_gain = (chroma_out * chroma_in).sum((1, 2, 3)) / chroma_in.square().sum((1, 2, 3))
    torch.testing.assert_close(chroma_out, chroma_gain.view(-1, 1, 1, 1) * chroma_in, atol=1e-5, rtol=0)
    saturation = chroma_gain / contrast
    assert 0.0 <= saturation.min() < 0.02 and 1.98 < saturation.max() <= 2.0 + 1e-5
    assert saturation.mean().item() == pytest.approx(1.0, abs=0.05)


def test_diffaugment_cutout_zeroes_one_clipped_square() -> None:
    size, cut = 32, 16
    out = DiffAugment("cutout", cutout_ratio=0.5)(torch.ones(3000, 1, size, size))
    zeroed = out[:, 0] == 0
    rows, cols = zeroed.any(2), zeroed.any(1)
    # The zeroed set is exactly the product of its rows and columns: one axis-aligned rectangle.
    assert torch.equal(zeroed, rows.unsqueeze(2) & cols.unsqueeze(1))
    assert rows.sum(1).max() == cut and cols.sum(1).max() == cut and rows.sum(1).min() >= cut // 2
    # Centre uniform over 0..32 (reference's even-size rule), box [c - 8, c + 8) clipped to the image.
    lengths = torch.tensor([min(c + cut // 2, size) - max(c - cut // 2, 0) for c in range(size + 1)]).float()
    expected_fraction = (lengths.mean() / size) ** 2
    assert zeroed.float().mean().item() == pytest.approx(expected_fraction.item(), rel=0.03)


# ---- ADA: augmentation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("warp", ["lowpass", "bilinear"])
@pytest.mark.parametrize("channels", [1, 3])
def test_ada_with_p_zero_is_exactly_the_identity(
    warp: str, channels: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    aug = AdaptiveAugment(warp=warp)
    x = images(8, channels).contiguous(memory_format=torch.channels_last)
    assert aug.probability == 0.0
    assert torch.equal(aug(x), x)
    # Under CUDA graphs nothing is skipped: every op runs at p = 0, and the accelerator path keeps rows with
    # torch.where. The pixels are still the input's, bit for bit.
    aug.skip_when_off = False
    monkeypatch.setattr(ada_module, "_warp_selected_rows_only", lambda device: False)
    assert torch.equal(aug(x), x)


def test_ada_geometry_only_ops_with_nothing_enabled_is_identity() -> None:
    x = images(4, 1)
    assert torch.equal(AdaptiveAugment(initial_p=1.0, pipeline="")(x), x)
    # Hue and saturation need chroma: on one channel they are skipped (NVlabs: num_channels > 1), so this is the
    # identity too.
    assert torch.equal(ada_only("saturation", "hue")(x), x)


def test_ada_xflip_flips_half_the_images() -> None:
    x = images(400, 3)
    out = ada_only("xflip")(x)
    same = (out - x).abs().flatten(1).amax(1) < 1e-5
    flipped = (out - x.flip(-1)).abs().flatten(1).amax(1) < 1e-5
    assert (same ^ flipped).all()
    assert flipped.float().mean().item() == pytest.approx(0.5, abs=0.08)


def test_ada_rotate90_gives_each_quarter_turn() -> None:
    x = images(200, 3)
    out = ada_only("rotate90")(x)
    turns = []
    for image_in, image_out in zip(x, out, strict=True):
        matches = [k for k in range(4) if (image_out - torch.rot90(image_in, k, (1, 2))).abs().max() < 1e-5]
        assert len(matches) == 1
        turns.append(matches[0])
    counts = torch.bincount(torch.tensor(turns), minlength=4).float() / len(turns)
    assert counts.min() > 0.15 and counts.max() < 0.35


def test_ada_translation_is_whole_pixels_with_reflection() -> None:
    x = images(100, 2)
    out = ada_only("xint", xint_max=0.125)(x)  # round(U(-1, 1) * 0.125 * 16): shifts in [-2, 2]
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    shifts = []
    for i in range(len(x)):
        matches = [
            (dy, dx)
            for dy, dx in itertools.product(range(-2, 3), repeat=2)
            if (out[i] - padded[i, :, 2 - dy : 18 - dy, 2 - dx : 18 - dx]).abs().max() < 1e-4
        ]
        assert len(matches) == 1
        shifts.append(matches[0])
    assert {dy for dy, _ in shifts} == set(range(-2, 3)) and {dx for _, dx in shifts} == set(range(-2, 3))


def test_ada_scale_and_rotation_change_geometry_but_keep_the_value_range() -> None:
    x = images(64, 3)
    out = ada_only("scale", "rotate")(x)
    assert ((out - x).abs().flatten(1).mean(1) > 0.05).all()
    # Bilinear resampling with reflection padding interpolates existing pixels: no new extremes, no zero frame.
    assert out.min() >= x.min() - 1e-5 and out.max() <= x.max() + 1e-5
    assert (out == 0).float().mean() < 1e-3


def test_ada_brightness_and_contrast_distributions() -> None:
    x = images(4000, 1, size=4)
    offset = ada_only("brightness", brightness_std=0.2)(x) - x
    torch.testing.assert_close(offset, offset[:, :, :1, :1].expand_as(offset), atol=1e-6, rtol=0)
    assert offset[:, 0, 0, 0].mean().item() == pytest.approx(0.0, abs=0.01)
    assert offset[:, 0, 0, 0].std().item() == pytest.approx(0.2, rel=0.05)
    gain = ada_only("contrast", contrast_std=0.5)(x) / x  # contrast scales about mid-grey (0 in [-1, 1])
    torch.testing.assert_close(gain, gain[:, :, :1, :1].expand_as(gain), atol=1e-3, rtol=0)
    assert torch.log2(gain[:, 0, 0, 0]).std().item() == pytest.approx(0.5, rel=0.05)


def test_ada_saturation_and_hue_keep_luma_and_change_chroma() -> None:
    x = images(64, 3)
    for aug in (ada_only("saturation"), ada_only("hue")):
        out = aug(x)
        torch.testing.assert_close(out.mean(1), x.mean(1), atol=1e-5, rtol=0)
        chroma_in, chroma_out = x - x.mean(1, keepdim=True), out - out.mean(1, keepdim=True)
        chroma_change = (chroma_out - chroma_in).abs().flatten(1).amax(1)
        assert (chroma_change > 1e-2).float().mean() > 0.9
    # Hue is a rotation of the chroma plane: it keeps each pixel's chroma magnitude.
    out = ada_only("hue")(x)
    chroma_in, chroma_out = x - x.mean(1, keepdim=True), out - out.mean(1, keepdim=True)
    torch.testing.assert_close(chroma_out.norm(dim=1), chroma_in.norm(dim=1), atol=1e-5, rtol=0)


def test_ada_applies_each_op_with_probability_p() -> None:
    x = images(5000, 1, size=2)
    aug = AdaptiveAugment(initial_p=0.3, pipeline="brightness")
    changed = (aug(x) - x).abs().flatten(1).amax(1) > 0
    assert changed.float().mean().item() == pytest.approx(0.3, abs=0.03)


def test_ada_accelerator_path_matches_cpu_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPUs warp the whole batch and keep unselected rows with torch.where (no sync); CPU warps only selected rows.
    aug = AdaptiveAugment(initial_p=0.3)
    x = images(16, 3)
    torch.manual_seed(3)
    cpu_path = aug(x)
    monkeypatch.setattr(ada_module, "_warp_selected_rows_only", lambda device: False)
    torch.manual_seed(3)
    torch.testing.assert_close(aug(x), cpu_path, atol=1e-6, rtol=0)
    assert (cpu_path != x).flatten(1).any(1).float().mean() > 0.5


# ---- ADA: the warp -------------------------------------------------------------------------------------------
def ada_matrices(x: torch.Tensor) -> torch.Tensor:
    """Random source-to-destination matrices about the image centre: any rotation, x-flips, scales 2^N(0, 0.3) and
    translations up to half the image size."""
    n, _, height, width = x.shape
    angle = (torch.rand(n, dtype=torch.float64) * 2 - 1) * math.pi
    flip = torch.where(torch.rand(n) < 0.5, -1.0, 1.0).double()
    scale = torch.exp2(torch.randn(n, dtype=torch.float64) * 0.3)
    shift = (torch.rand(n, 2, dtype=torch.float64) - 0.5) * torch.tensor([width, height])
    linear = scale.view(n, 1, 1) * torch.stack(
        [torch.cos(angle) * flip, -torch.sin(angle), torch.sin(angle) * flip, torch.cos(angle)], 1
    ).view(n, 2, 2)
    centre = torch.tensor([(width - 1) / 2, (height - 1) / 2], dtype=torch.float64)
    offset = shift + centre - linear @ centre
    return torch.cat([linear, offset.unsqueeze(2)], 2).to(x.dtype)


def kornia_warp(x: torch.Tensor, matrices: torch.Tensor, padding_mode: str = "reflection") -> torch.Tensor:
    return warp_affine(
        x, matrices, tuple(x.shape[-2:]), mode="bilinear", padding_mode=padding_mode, align_corners=True
    )


@pytest.mark.parametrize("shape", [(16, 3, 16, 16), (16, 3, 12, 20), (16, 1, 9, 24)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_warp_affine_reflect_matches_kornia_warp_affine(shape: tuple[int, ...], channels_last: bool) -> None:
    x = torch.rand(shape) * 2 - 1
    matrices = ada_matrices(x)
    expected = kornia_warp(x, matrices)
    # The matrices push corners and shifted images well outside: reflection padding is exercised.
    assert (kornia_warp(x, matrices, padding_mode="zeros") - expected).abs().amax() > 0.5
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    got = warp_affine_reflect(x, matrices)
    # kornia's float32 round trip through [-1, 1] coordinates is itself ~1e-5 off the exact value at 16 px.
    torch.testing.assert_close(got, expected, atol=3e-5, rtol=0)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    assert got.is_contiguous(memory_format=memory_format)
    # In float64 both are exact: the same sampling convention, to rounding.
    x64, matrices64 = x.double(), matrices.double()
    torch.testing.assert_close(
        warp_affine_reflect(x64, matrices64), kornia_warp(x64, matrices64), atol=1e-10, rtol=0
    )


def test_warp_affine_reflect_has_double_backward_for_images_only() -> None:
    x = (torch.rand(2, 2, 5, 7, dtype=torch.float64) * 2 - 1).requires_grad_(True)
    matrices = ada_matrices(x).requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda images: warp_affine_reflect(images, matrices), (x,))
    # The (random) matrices are constants of the warp: no gradient flows to them.
    (grad_matrices,) = torch.autograd.grad(
        warp_affine_reflect(x, matrices).sum(), matrices, allow_unused=True
    )
    assert grad_matrices is None


@pytest.mark.parametrize("gather_rows", [True, False])
def test_apply_to_selected_rows_paths_agree(gather_rows: bool) -> None:
    x = images(6, 3).requires_grad_(True)
    selected = torch.tensor([True, False, True, True, False, False])
    gains = torch.arange(2.0, 8.0)

    def double(rows: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
        chosen = gains if index is None else gains[index]
        return rows * chosen.view(-1, 1, 1, 1)

    out = apply_to_selected_rows(x, selected, double, gather_rows)
    expected = torch.where(selected.view(-1, 1, 1, 1), x * gains.view(-1, 1, 1, 1), x)
    assert torch.equal(out, expected)
    out.sum().backward()
    assert torch.equal(x.grad[:, 0, 0, 0], torch.where(selected, gains, 1.0))


# ---- ADA: adaptive p ------------------------------------------------------------------------------------------
def run_iterations(
    aug: AdaptiveAugment, logits: torch.Tensor, iterations: int, num_images: int = 64, **kw
) -> None:
    for _ in range(iterations):
        aug.observe_real_logits(logits)
        aug.update(num_images, **kw)


def test_ada_p_rises_and_falls_by_the_formula_every_interval() -> None:
    aug = AdaptiveAugment(target=0.6, interval=4, speed_kimg=500.0)
    step = 4 * 64 / 500_000  # images since the last adjustment / (speed_kimg * 1000)
    run_iterations(aug, torch.ones(64, 1), 3)
    assert aug.probability == 0.0  # not adjusted before `interval` iterations
    run_iterations(aug, torch.ones(64, 1), 1)
    assert aug.probability == pytest.approx(step, abs=1e-8)
    assert aug.stats() == {"p": aug.probability, "rt": 1.0}
    run_iterations(aug, torch.ones(64, 1), 8)
    assert aug.probability == pytest.approx(3 * step, abs=1e-8)
    assert float(aug.p) == aug.probability  # the buffer and its mirror agree
    run_iterations(aug, -torch.ones(64, 1), 4)
    assert aug.probability == pytest.approx(2 * step, abs=1e-8)
    assert aug.stats()["rt"] == -1.0


def test_ada_p_is_clamped_and_does_not_move_at_the_target() -> None:
    aug = AdaptiveAugment(interval=1)
    run_iterations(aug, -torch.ones(16), 5)
    assert aug.probability == 0.0
    top = AdaptiveAugment(interval=1, initial_p=0.2, max_p=0.2)
    run_iterations(top, torch.ones(16), 5)
    assert top.probability == pytest.approx(0.2)
    balanced = AdaptiveAugment(target=0.0, interval=1, initial_p=0.5)
    run_iterations(balanced, torch.tensor([1.0, -1.0, 3.0, -0.5]), 3)  # r_t == target: sign 0
    assert balanced.probability == 0.5 and balanced.stats()["rt"] == 0.0


def test_ada_rt_averages_all_logits_since_the_last_adjustment() -> None:
    aug = AdaptiveAugment(target=0.6, interval=2)
    aug.observe_real_logits(torch.tensor([1.0, 1.0, 1.0, -1.0]))  # micro-batch 1
    aug.observe_real_logits(torch.tensor([[2.0], [0.5]]))  # micro-batch 2, other shape
    aug.update(6)
    aug.observe_real_logits(torch.tensor([-1.0, -2.0]))
    aug.update(2)
    assert aug.stats()["rt"] == pytest.approx((3 - 1 + 2 - 2) / 8)  # 0.25 < 0.6: p would fall, clamped at 0
    assert aug.probability == 0.0 and float(aug.sign_stats.abs().sum()) == 0.0


def test_ada_all_reduce_sums_the_sign_statistics_over_ranks() -> None:
    # Two identical ranks (t * 2): r_t is unchanged, the totals double.
    aug = AdaptiveAugment(interval=2)
    aug.observe_real_logits(torch.tensor([1.0, 1.0, 1.0, -1.0]))
    aug.update(8, all_reduce=lambda t: t * 2)
    assert aug.sign_stats.tolist() == [4.0, 8.0]
    aug.observe_real_logits(torch.tensor([1.0, 1.0, 1.0, -1.0]))
    aug.update(8, all_reduce=lambda t: t * 2)
    assert aug.stats()["rt"] == 0.5
    # A second rank whose D is not overfitting (all real logits negative) pulls r_t down and p with it.
    other_rank = torch.tensor([-4.0, 4.0])
    pulled = AdaptiveAugment(interval=1, target=0.1, initial_p=0.5)
    pulled.observe_real_logits(torch.ones(4))
    pulled.update(8, all_reduce=lambda t: t + other_rank)
    assert pulled.stats()["rt"] == 0.0
    assert pulled.probability == pytest.approx(0.5 - 8 / 500_000, abs=1e-8)

    # An in-place reducer returning None (torch.distributed.all_reduce's style) works too.
    def reduce_in_place(tensor: torch.Tensor) -> None:
        tensor.add_(torch.tensor([-3.0, 3.0]))

    in_place = AdaptiveAugment(interval=1)
    in_place.observe_real_logits(torch.tensor([1.0, 1.0, -1.0]))
    in_place.update(8, all_reduce=reduce_in_place)
    assert in_place.stats()["rt"] == pytest.approx((1 - 3) / (3 + 3))


def test_ada_state_dict_round_trip_continues_identically() -> None:
    config = dict(interval=4, speed_kimg=1.0)
    first = AdaptiveAugment(**config)
    logits = [torch.randn(32) + 1.5 for _ in range(20)]
    for i in range(10):  # two adjustments, then two iterations of accumulated, unadjusted statistics
        first.observe_real_logits(logits[i])
        first.update(32)
    assert 0 < first.probability < 1 and float(first.sign_stats[1]) == 64.0
    # Restore through a parent module, as Lightning does with the whole LightningModule.
    parent = nn.Module()
    parent.augment = AdaptiveAugment(**config)
    parent.load_state_dict({f"augment.{k}": v.clone() for k, v in first.state_dict().items()})
    second = parent.augment
    assert second.probability == first.probability and second.stats() == first.stats()
    history_first, history_second = [], []
    for i in range(10, 20):
        for aug, history in ((first, history_first), (second, history_second)):
            aug.observe_real_logits(logits[i])
            aug.update(32)
            history.append(aug.probability)
    assert history_first == history_second
    assert len(set(history_first)) >= 3  # p kept moving after the restore
    x = images(8, 3)
    torch.manual_seed(5)
    out_first = first(x)
    torch.manual_seed(5)
    assert torch.equal(second(x), out_first)


def test_ada_state_stays_float32_when_the_module_is_cast_to_bf16() -> None:
    aug = AdaptiveAugment(initial_p=0.123456)
    aug.to(torch.bfloat16)
    assert aug.p.dtype == torch.float32 and aug.sign_stats.dtype == torch.float32
    assert float(aug.p) == pytest.approx(0.123456, abs=1e-7)
