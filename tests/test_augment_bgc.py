"""ADA's 'bgc' pipeline against NVlabs' AugmentPipe, rebuilt here in numpy.

Matched: github.com/NVlabs/stylegan2-ada-pytorch, training/augment.py (AugmentPipe.__init__ defaults and forward:
the op order, the inverse matrix chain G_inv = flip^-1 rot90^-1 xint^-1 scale^-1 rot^-1 aniso^-1 rot^-1 xfrac^-1,
the rotation probability 1 - sqrt(1 - rotate * p), the colour chain C = saturation hue lumaflip contrast brightness
with the luma axis (1, 1, 1, 0) / sqrt(3), the grayscale rule C[:, :3, :].mean(dim=1), the 'sym6' filter and the
2x upsample / bilinear sample / 2x downsample with low-res pixel i at high-res 2i) and train.py's augpipe_specs
('bgc': every multiplier 1). The references below use numpy, scipy.ndimage.map_coordinates and
scipy.spatial.transform.Rotation, not our code.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, ValidationError
from scipy import ndimage
from scipy.spatial.transform import Rotation

from pixelsmith.augment import AdaptiveAugment
from pixelsmith.augment import ada as ada_module
from pixelsmith.augment.ada import OPS, AugmentDraws, apply_colour, geometric_inverse
from pixelsmith.augment.config import AdaptiveAugmentConfig
from pixelsmith.augment.warp import SYMLET6, warp_inverse_bilinear, warp_inverse_lowpass
from pixelsmith.config.choices import typed
from tests.conftest import torch_threads


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    with torch_threads(2):
        yield


def images(n: int, channels: int, size: int = 8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.rand(n, channels, size, size) * 2 - 1).to(dtype)


def identity_draws(n: int) -> AugmentDraws:
    zeros, ones = torch.zeros(n), torch.ones(n)
    gates = {gate: torch.zeros(n, dtype=torch.bool) for gate in ada_module._GATES}
    return AugmentDraws(
        gates=gates,
        xflip=zeros,
        rotate90=zeros,
        xint=torch.zeros(n, 2),
        scale=ones,
        rotate_pre=zeros,
        aniso=ones,
        rotate_post=zeros,
        xfrac=torch.zeros(n, 2),
        brightness=zeros,
        contrast=ones,
        lumaflip=zeros,
        hue=zeros,
        saturation=ones,
    )


# ---- the pipeline's definition ---------------------------------------------------------------------------------
def test_bgc_default_is_nvlabs_spec_and_constants() -> None:
    """train.py augpipe_specs['bgc'] and AugmentPipe.__init__'s constants; the ADA schedule of train.py
    (ada_target 0.6, ada_interval 4, ada_kimg 500)."""
    aug = AdaptiveAugment()
    # bgc: every geometric and colour op at 1; cutout (implemented for R3GAN's pipeline) is not part of it.
    assert aug.multipliers == {op: 0.0 if op == "cutout" else 1.0 for op in OPS}
    assert set(OPS) == {
        *("xflip", "rotate90", "xint", "scale", "rotate", "aniso", "xfrac"),
        *("brightness", "contrast", "lumaflip", "hue", "saturation"),
        "cutout",
    }
    nvlabs_constants = dict(
        xint_max=0.125,
        scale_std=0.2,
        rotate_max=1.0,
        aniso_std=0.2,
        xfrac_std=0.125,
        brightness_std=0.2,
        contrast_std=0.5,
        hue_max=1.0,
        saturation_std=1.0,
    )
    assert {name: getattr(aug, name) for name in nvlabs_constants} == nvlabs_constants
    assert (aug.target, aug.interval, aug.speed_kimg, aug.warp) == (0.6, 4, 500.0, "lowpass")
    # The shipped config and its schema say the same.
    yaml = OmegaConf.load("conf/augment/ada.yaml")
    schema = OmegaConf.structured(AdaptiveAugmentConfig)
    for name, value in nvlabs_constants.items():
        assert yaml[name] == value and schema[name] == value
    assert yaml.pipeline == schema.pipeline == "bgc" and yaml.warp == schema.warp == "lowpass"
    assert AdaptiveAugment(pipeline="bg").multipliers["hue"] == 0.0
    assert AdaptiveAugment(pipeline="blit,hue", multipliers={"hue": 0.5}).multipliers == {
        op: {"xflip": 1.0, "rotate90": 1.0, "xint": 1.0, "hue": 0.5}.get(op, 0.0) for op in OPS
    }


def test_bad_pipeline_multipliers_and_warp_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"names no ADA op or pipeline: noise.*bgc"):
        AdaptiveAugment(pipeline="bgc,noise")
    with pytest.raises(ValueError, match=r"unknown ops lumaflp.*lumaflip:0"):
        AdaptiveAugment(multipliers={"lumaflp": 0.0})
    with pytest.raises(ValueError, match="negative"):
        AdaptiveAugment(multipliers={"hue": -1.0})
    with pytest.raises(ValueError, match="lowpass.*bilinear"):
        AdaptiveAugment(warp="cubic")
    # In a config the warp is a choice: refused at composition, naming the values.
    cfg = typed(AdaptiveAugmentConfig)
    with pytest.raises(ValidationError, match="lowpass, bilinear"):
        cfg.warp = "cubic"


# ---- each op's probability ---------------------------------------------------------------------------------------
P, MULTIPLIER, SAMPLES = 0.6, 0.5, 40_000


@pytest.mark.parametrize(
    "op", [op for op in OPS if op != "cutout"]
)  # cutout: tests/test_gan_r3gan_presets.py
def test_each_gate_fires_with_p_times_its_multiplier(op: str) -> None:
    aug = AdaptiveAugment(initial_p=P, pipeline=op, multipliers={op: MULTIPLIER})
    draws = aug.sample(torch.empty(SAMPLES, 3, 8, 8))
    rate = {gate: fired.float().mean().item() for gate, fired in draws.gates.items()}
    tolerance = 5 * math.sqrt(0.25 / SAMPLES)  # 5 binomial standard deviations at most
    expected = P * MULTIPLIER
    if op == "rotate":
        # Pre- and post-rotation each with 1 - sqrt(1 - rotate * p), so that either runs with rotate * p.
        each = 1 - math.sqrt(1 - expected)
        assert rate["rotate_pre"] == pytest.approx(each, abs=tolerance)
        assert rate["rotate_post"] == pytest.approx(each, abs=tolerance)
        either = (draws.gates["rotate_pre"] | draws.gates["rotate_post"]).float().mean().item()
        assert either == pytest.approx(expected, abs=tolerance)
        others = {gate: r for gate, r in rate.items() if not gate.startswith("rotate_")}
    else:
        assert rate[op] == pytest.approx(expected, abs=tolerance)
        others = {gate: r for gate, r in rate.items() if gate != op}
    assert all(r == 0.0 for r in others.values()), others


# Probability that a drawn op changes the image: the x-flip and the luma flip flip with 1/2 once drawn, the quarter
# turns are k = 0 one time in 4, and the integer translation rounds U(-1, 1) * 0.125 * 8 to 0 on both axes one time
# in 4 (|t| < 1/2 on each axis with probability 1/2); every other op changes the image almost surely.
CHANGES_WHEN_DRAWN = {"xflip": 0.5, "rotate90": 0.75, "xint": 0.75, "lumaflip": 0.5}


@pytest.mark.parametrize("op", OPS)
def test_each_op_changes_the_images_it_was_drawn_for(op: str) -> None:
    n = 4000
    x = images(n, 3)
    aug = AdaptiveAugment(initial_p=P, pipeline=op, multipliers={op: MULTIPLIER})
    changed = (aug(x) - x).abs().flatten(1).amax(1) > 1e-4
    expected = P * MULTIPLIER * CHANGES_WHEN_DRAWN.get(op, 1.0)
    assert changed.float().mean().item() == pytest.approx(expected, abs=5 * math.sqrt(0.25 / n))


def test_p_times_multiplier_above_one_always_applies() -> None:
    aug = AdaptiveAugment(initial_p=0.8, pipeline="scale", multipliers={"scale": 2.0})
    assert aug.sample(torch.empty(1000, 3, 8, 8)).gates["scale"].all()


# ---- geometry: the matrix ---------------------------------------------------------------------------------------
def nvlabs_inverse(draws: AugmentDraws, i: int) -> np.ndarray:
    """G_inv of sample i as AugmentPipe.forward builds it: a product of 3x3 inverse matrices in numpy."""

    def scale2d(sx, sy):
        return np.array([[sx, 0, 0], [0, sy, 0], [0, 0, 1]], dtype=np.float64)

    def translate2d(tx, ty):
        return np.array([[1, 0, tx], [0, 1, ty], [0, 0, 1]], dtype=np.float64)

    def rotate2d(theta):
        return np.array(
            [[np.cos(theta), -np.sin(theta), 0], [np.sin(theta), np.cos(theta), 0], [0, 0, 1]],
            dtype=np.float64,
        )

    value = {
        f.name: getattr(draws, f.name)[i].double().numpy()
        for f in dataclasses.fields(draws)
        if f.name != "gates" and getattr(draws, f.name) is not None
    }
    g = np.eye(3)
    g = g @ scale2d(1 / (1 - 2 * value["xflip"]), 1)  # scale2d_inv(1 - 2i, 1)
    g = g @ rotate2d(np.pi / 2 * value["rotate90"])  # rotate2d_inv(-pi / 2 * i)
    g = g @ translate2d(-value["xint"][0], -value["xint"][1])  # translate2d_inv
    g = g @ scale2d(1 / value["scale"], 1 / value["scale"])
    g = g @ rotate2d(value["rotate_pre"])  # rotate2d_inv(-theta)
    g = g @ scale2d(1 / value["aniso"], value["aniso"])  # scale2d_inv(s, 1 / s)
    g = g @ rotate2d(value["rotate_post"])
    return g @ translate2d(-value["xfrac"][0], -value["xfrac"][1])


def test_composed_inverse_matrix_equals_nvlabs_chain() -> None:
    aug = AdaptiveAugment(initial_p=1.0, pipeline="bg")
    draws = aug.sample(torch.empty(64, 3, 16, 12))
    assert all(draws.gates[g].all() for g in ("xflip", "rotate90", "xint", "scale", "aniso", "xfrac"))
    assert {int(k) for k in draws.rotate90} == {0, 1, 2, 3} and {int(f) for f in draws.xflip} == {0, 1}
    # Integer translation in whole pixels up to 0.125 * (width 12, height 16).
    assert torch.equal(draws.xint, draws.xint.round())
    assert draws.xint[:, 0].abs().max() <= 1.5 and draws.xint[:, 1].abs().max() <= 2
    linear, offset = geometric_inverse(draws)
    for i in range(64):
        expected = nvlabs_inverse(draws, i)
        np.testing.assert_allclose(linear[i].double().numpy(), expected[:2, :2], atol=2e-6)
        np.testing.assert_allclose(offset[i].double().numpy(), expected[:2, 2], atol=2e-5)


def test_pure_blits_move_whole_pixels_in_nvlabs_direction() -> None:
    """NVlabs' quarter turn k=1 is G_inv = rotate2d(pi/2): output (x, y) reads input (-y, x) (centred coordinates,
    x the column, y the row), so output pixel (r, c) reads input pixel (c, W-1-r): numpy's rot90 (k=1)."""
    x = images(1, 1, size=6)
    draws = identity_draws(1)
    draws.rotate90 = torch.ones(1)
    aug = AdaptiveAugment(initial_p=1.0, pipeline="rotate90", warp="bilinear")
    out = aug.augment_with(x, draws)
    expected = torch.rot90(x, 1, dims=(-2, -1))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    draws = identity_draws(1)
    draws.xint = torch.tensor(
        [[2.0, -1.0]]
    )  # translate2d_inv(2, -1): output (x, y) reads input (x - 2, y + 1)
    out = AdaptiveAugment(initial_p=1.0, pipeline="xint", warp="bilinear").augment_with(x, draws)
    torch.testing.assert_close(out[..., :-1, 2:], x[..., 1:, :-2], atol=1e-6, rtol=0)


# ---- geometry: the low-pass warp ----------------------------------------------------------------------------------
def test_symlet6_is_an_orthogonal_wavelet_with_six_vanishing_moments() -> None:
    f = np.asarray(SYMLET6)
    assert f.sum() == pytest.approx(math.sqrt(2), abs=1e-12)
    # Orthogonal to its even shifts: sum_k f[k] f[k + 2m] = delta_m (sum sqrt 2 normalisation).
    for m in range(6):
        assert np.dot(f[: len(f) - 2 * m], f[2 * m :]) == pytest.approx(float(m == 0), abs=1e-10)
    # Its high-pass mirror g[k] = (-1)^k f[11 - k] annihilates polynomials of degree < 6.
    k = np.arange(12)
    g = (-1.0) ** k * f[::-1]
    for power in range(6):
        assert abs(np.dot(k**power, g)) < 1e-8 * 11**power


def _upsample_axis(z: np.ndarray, f: np.ndarray, axis: int) -> np.ndarray:
    """NVlabs' upsample2d along one axis: zero insertion, then convolution with f (gain 2), padding (6, 5)."""
    z = np.moveaxis(z, axis, 0)
    inserted = np.zeros((2 * z.shape[0],) + z.shape[1:])
    inserted[0::2] = z
    padded = np.concatenate([np.zeros((6,) + z.shape[1:]), inserted, np.zeros((5,) + z.shape[1:])])
    out = sum(2 * f[11 - k] * padded[k : k + inserted.shape[0]] for k in range(12))
    return np.moveaxis(out, 0, axis)


def _downsample_axis(y: np.ndarray, f: np.ndarray, axis: int) -> np.ndarray:
    """NVlabs' downsample2d with flip_filter=True along one axis: correlation with f, every second sample."""
    y = np.moveaxis(y, axis, 0)
    length = (y.shape[0] - 12) // 2 + 1
    out = np.stack([sum(f[k] * y[2 * j + k] for k in range(12)) for j in range(length)])
    return np.moveaxis(out, 0, axis)


def nvlabs_lowpass_warp(plane: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """One plane through AugmentPipe's resampling with a reflect padding wide enough for every sample position:
    pad, upsample 2x, sample bilinearly (map_coordinates) at high-res 2 * G_inv(out / 2), downsample 2x. `inverse`
    (2, 3) maps output to input pixel indices."""
    f = np.asarray(SYMLET6) / np.sum(SYMLET6)
    height, width = plane.shape
    margin = 4 * max(height, width)
    upsampled = _upsample_axis(_upsample_axis(np.pad(plane, margin, mode="reflect"), f, 0), f, 1)
    # The high-res grid the downsampling reads: 5 extra samples per side (low-res output j at high-res 2j).
    u = np.arange(-5, 2 * width + 5) / 2
    v = np.arange(-5, 2 * height + 5) / 2
    out_x, out_y = np.meshgrid(u, v)
    in_x = inverse[0, 0] * out_x + inverse[0, 1] * out_y + inverse[0, 2]
    in_y = inverse[1, 0] * out_x + inverse[1, 1] * out_y + inverse[1, 2]
    sampled = ndimage.map_coordinates(upsampled, [2 * (in_y + margin), 2 * (in_x + margin)], order=1)
    return _downsample_axis(_downsample_axis(sampled, f, 0), f, 1)


@pytest.mark.parametrize("shape", [(6, 2, 9, 12), (4, 1, 8, 8), (3, 3, 5, 7)])
def test_lowpass_warp_equals_nvlabs_resampling(shape: tuple[int, int, int, int]) -> None:
    x = torch.rand(shape, dtype=torch.float64) * 2 - 1
    n, channels, height, width = shape
    draws = AdaptiveAugment(initial_p=1.0, pipeline="bg", xint_max=0.5).sample(x)
    linear, offset = geometric_inverse(draws)
    inverse = ada_module._centred_to_index(linear.double(), offset.double(), height, width)
    got = warp_inverse_lowpass(x, inverse)
    # Sample positions reach well outside the image: the reflection is exercised beyond the filter's reach.
    corners = torch.tensor([[0, 0, 1], [width - 1, 0, 1], [0, height - 1, 1], [width - 1, height - 1, 1.0]])
    source = torch.einsum("nij,kj->nki", inverse, corners.double())  # (N, corner, xy)
    size = torch.tensor([width - 1, height - 1], dtype=torch.float64)
    assert torch.maximum(-source, source - size).amax() > 3
    for i in range(n):
        for c in range(channels):
            expected = nvlabs_lowpass_warp(x[i, c].numpy(), inverse[i].numpy())
            np.testing.assert_allclose(got[i, c].numpy(), expected, atol=1e-10)


def test_lowpass_warp_keeps_an_identity_map_to_rounding() -> None:
    x = torch.rand(2, 3, 9, 6, dtype=torch.float64) * 2 - 1
    identity = torch.tensor([[[1.0, 0, 0], [0, 1, 0]]], dtype=torch.float64)
    torch.testing.assert_close(warp_inverse_lowpass(x, identity), x, atol=1e-10, rtol=0)
    assert torch.equal(warp_inverse_bilinear(x, identity), x)


@pytest.mark.parametrize("warp", [warp_inverse_lowpass, warp_inverse_bilinear])
def test_warps_gradcheck_and_gradgradcheck_in_float64(warp) -> None:
    x = (torch.rand(2, 2, 5, 4, dtype=torch.float64) * 2 - 1).requires_grad_(True)
    draws = AdaptiveAugment(initial_p=1.0, pipeline="bg").sample(x)
    linear, offset = geometric_inverse(draws)
    inverse = ada_module._centred_to_index(linear.double(), offset.double(), 5, 4)
    assert torch.autograd.gradcheck(lambda images: warp(images, inverse), (x,))
    assert torch.autograd.gradgradcheck(lambda images: warp(images, inverse), (x,))


def test_lowpass_warp_aliases_less_than_bilinear_when_shrinking() -> None:
    """The reason for the oversampling: a checkerboard at the Nyquist frequency, shrunk by 2^0.6 and rotated, has
    no frequency a 32-pixel image can hold, so an alias-free warp returns (nearly) zero. The low-pass warp leaves
    a tenth of the bilinear warp's aliased energy or less (away from the borders)."""
    size = 32
    board = ((torch.arange(size).view(-1, 1) + torch.arange(size)) % 2 * 2 - 1).double()
    board = board.expand(1, 1, size, size)
    angle, scale = 0.3, 2**0.6
    c, s = math.cos(angle) * scale, math.sin(angle) * scale
    linear = torch.tensor([[[c, -s], [s, c]]], dtype=torch.float64)
    inverse = ada_module._centred_to_index(linear, torch.zeros(1, 2, dtype=torch.float64), size, size)

    def interior_energy(image: torch.Tensor) -> float:
        return float(image[..., 8:-8, 8:-8].square().mean())

    lowpass = interior_energy(warp_inverse_lowpass(board, inverse))
    bilinear = interior_energy(warp_inverse_bilinear(board, inverse))
    assert bilinear > 0.05 and lowpass < 0.1 * bilinear


# ---- colour -------------------------------------------------------------------------------------------------------
def nvlabs_colour_matrix(draws: AugmentDraws, i: int) -> np.ndarray:
    """C of sample i as AugmentPipe.forward builds it: translate3d, scale3d, the Householder reflection, rotate3d
    about v and the saturation matrix, multiplied on the left in that order."""
    v = np.array([1, 1, 1, 0]) / np.sqrt(3)
    value = {
        f.name: getattr(draws, f.name)[i].double().item()
        for f in dataclasses.fields(draws)
        if f.name in ("brightness", "contrast", "lumaflip", "hue", "saturation")
    }
    c = np.eye(4)
    b = value["brightness"]
    c = np.array([[1, 0, 0, b], [0, 1, 0, b], [0, 0, 1, b], [0, 0, 0, 1]]) @ c
    c = np.diag([value["contrast"]] * 3 + [1]) @ c
    c = (np.eye(4) - 2 * np.outer(v, v) * value["lumaflip"]) @ c
    rotation = np.eye(4)
    rotation[:3, :3] = Rotation.from_rotvec(v[:3] * value["hue"]).as_matrix()  # about v by the hue angle
    c = rotation @ c
    return (np.outer(v, v) + (np.eye(4) - np.outer(v, v)) * value["saturation"]) @ c


@pytest.mark.parametrize("channels", [3, 1])
def test_colour_map_equals_nvlabs_matrix(channels: int) -> None:
    x = images(200, channels, size=4, dtype=torch.float64)
    aug = AdaptiveAugment(initial_p=0.7, pipeline="color")
    draws = aug.sample(x)
    assert all(draws.gates[op].any() and not draws.gates[op].all() for op in ada_module.COLOUR_OPS)
    got = aug.augment_with(x, draws)
    for i in range(len(x)):
        matrix = nvlabs_colour_matrix(draws, i)
        pixels = x[i].reshape(channels, -1).numpy()
        if channels == 3:
            expected = matrix[:3, :3] @ pixels + matrix[:3, 3:]
        else:  # NVlabs' grayscale rule: the mean of the RGB rows
            rows = matrix[:3, :].mean(axis=0)
            expected = pixels * rows[:3].sum() + rows[3]
        np.testing.assert_allclose(got[i].reshape(channels, -1).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("channels", [3, 1])
def test_lumaflip_twice_is_the_identity(channels: int) -> None:
    x = images(400, channels)
    aug = AdaptiveAugment(initial_p=1.0, pipeline="lumaflip")
    torch.manual_seed(7)
    once = aug(x)
    torch.manual_seed(7)  # the same draws again: every flipped sample is flipped back
    twice = aug(once)
    torch.testing.assert_close(twice, x, atol=1e-6, rtol=0)
    flipped = (once - x).abs().flatten(1).amax(1) > 1e-4
    assert 0.4 < flipped.float().mean() < 0.6
    # The reflection keeps chroma and negates luma (on one channel: the value).
    luma_in, luma_out = x.mean(1), once.mean(1)
    torch.testing.assert_close(luma_out[flipped], -luma_in[flipped], atol=1e-6, rtol=0)
    torch.testing.assert_close(
        (once - luma_out.unsqueeze(1))[flipped], (x - luma_in.unsqueeze(1))[flipped], atol=1e-6, rtol=0
    )


def test_full_hue_rotation_is_the_identity_and_matches_a_rotation_about_the_luma_axis() -> None:
    x = images(6, 3, dtype=torch.float64)
    draws = identity_draws(6)
    draws.hue = torch.full((6,), 2 * math.pi)
    torch.testing.assert_close(apply_colour(x, draws), x, atol=1e-6, rtol=0)
    angles = torch.tensor([0.3, -1.0, math.pi, 2.0, -math.pi / 2, 0.0])
    draws.hue = angles
    got = apply_colour(x, draws)
    for i, angle in enumerate(angles.tolist()):
        matrix = Rotation.from_rotvec(np.ones(3) / np.sqrt(3) * angle).as_matrix()
        expected = np.einsum("ij,jhw->ihw", matrix, x[i].numpy())
        np.testing.assert_allclose(got[i].numpy(), expected, atol=1e-6)


def test_p_zero_draws_leave_every_sample_bit_exact_in_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    x = images(16, 3)
    aug = AdaptiveAugment()  # p = 0, bgc
    draws = aug.sample(x)
    assert not any(gate.any() for gate in draws.gates.values())
    assert torch.equal(aug.augment_with(x, draws), x)
    monkeypatch.setattr(ada_module, "_warp_selected_rows_only", lambda device: False)
    assert torch.equal(aug.augment_with(x, draws), x)
    # At p > 0 the samples that drew nothing keep their pixels too.
    half = AdaptiveAugment(initial_p=0.1)
    draws = half.sample(x)
    untouched = ~torch.stack(list(draws.gates.values())).any(0)
    assert untouched.any()
    assert torch.equal(half.augment_with(x, draws)[untouched], x[untouched])


# ---- state --------------------------------------------------------------------------------------------------------
def test_checkpointed_augment_state_resumes_bit_exact() -> None:
    """The whole augment state (p, the sign statistics, the counters) round-trips: after loading, p follows the
    same path and the same seed augments bit-exact, with the lowpass warp and every bgc op."""
    first = AdaptiveAugment(interval=2, speed_kimg=0.5)
    logits = [torch.randn(16) + 2.0 for _ in range(12)]
    for i in range(5):  # two adjustments and one pending iteration
        first.observe_real_logits(logits[i])
        first.update(16)
    second = AdaptiveAugment(interval=2, speed_kimg=0.5)
    second.load_state_dict({k: v.clone() for k, v in first.state_dict().items()})
    x = images(8, 3)
    for i in range(5, 12):
        for aug in (first, second):
            aug.observe_real_logits(logits[i])
            aug.update(16)
        assert first.probability == second.probability
        torch.manual_seed(i)
        out_first = first(x)
        torch.manual_seed(i)
        assert torch.equal(second(x), out_first)
    assert first.probability > 0.05
