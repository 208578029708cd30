"""R3GAN's presets (`experiment=r3gan_cifar10`, `experiment=r3gan_ffhq64`) against the reference's table, and their
networks' parameter counts against the reference's networks at the same widths.

Reference: `brownvc/R3GAN`, `train.py` (the `--preset` branches: WidthPerStage = 3 * x // 4 of [1024, ...],
CardinalityPerStage = 3 * x of [32, ...], BlocksPerStage 2 each, NoiseDimension 64, ExpansionFactor 2, and the
ema/aug/lr/gamma/beta2 schedulers' base_value, final_value and total_nimg; Adam betas [0, 0] eps 1e-8 with beta2 from
its scheduler; the augment pipe xflip..xfrac 1, brightness/contrast/lumaflip/hue/saturation 0.5, cutout 1) and
README.md (`--batch=512` for CIFAR-10, `--batch=256` for FFHQ-64, `--mirror=1 --aug=1`). Parameter counts: the
structure of `R3GAN/Networks.py` (bias-free convs, a bias per activation, 1x1 transitions only where the width
changes, G's basis C x 4 x 4 and Linear(z), D's depthwise 4x4 and Linear), counted by the formula below.
"""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from pixelsmith.augment.ada import AdaptiveAugment, apply_cutout
from pixelsmith.config.validate import validate_config
from tests.conftest import compose_config

# Copied by hand from the reference's train.py (not from our YAML): per preset, the widths and groups from 4x4 up,
# the batch, and each scheduler's (base_value, final_value); total_nimg 2e7 for both.
REFERENCE = {
    "r3gan_cifar10": dict(
        widths=[768] * 4,
        groups=[96] * 4,
        batch=512,
        resolution=32,
        ema=(0, 5000 * 1000),
        aug=(0, 0.55),
        lr=(2e-4, 5e-5),
        gamma=(0.05, 0.005),
        beta2=(0.9, 0.99),
    ),
    "r3gan_ffhq64": dict(
        widths=[768, 768, 768, 768, 384],
        groups=[96, 96, 96, 96, 48],
        batch=256,
        resolution=64,
        ema=(0, 500 * 1000),
        aug=(0, 0.3),
        lr=(2e-4, 5e-5),
        gamma=(2, 0.2),
        beta2=(0.9, 0.99),
    ),
}
REFERENCE_TOTAL_NIMG = 2e7
REFERENCE_AUGMENT_MULTIPLIERS = dict(
    xflip=1,
    rotate90=1,
    xint=1,
    scale=1,
    rotate=1,
    aniso=1,
    xfrac=1,
    brightness=0.5,
    contrast=0.5,
    lumaflip=0.5,
) | dict(hue=0.5, saturation=0.5, cutout=1)


def _compose(tmp_path, preset):
    cfg = compose_config([f"experiment={preset}", f"data.root={tmp_path}", "~local"], tmp_path / "run")
    validate_config(cfg)
    return cfg


@pytest.mark.parametrize("preset", sorted(REFERENCE))
def test_the_preset_equals_the_references_table(tmp_path, preset):
    ref, cfg = REFERENCE[preset], _compose(tmp_path, preset)
    model = cfg.model
    assert list(model.generator.widths) == ref["widths"] and list(model.generator.groups) == ref["groups"]
    assert model.generator.blocks == 2 and model.generator.expansion == 2 and model.generator.z_dim == 64
    assert cfg.data.resolution == ref["resolution"] and cfg.data.mirror is True
    assert cfg.data.batch_size * cfg.accumulate == 2 * ref["batch"]  # D's reals + G's own (R3GANObjective)
    for key, (base, final) in [
        ("lr", ref["lr"]),
        ("beta2", ref["beta2"]),
        ("gamma", ref["gamma"]),
        ("ema_half_life_kimg", (ref["ema"][0] / 1000, ref["ema"][1] / 1000)),
        ("augment_p", ref["aug"]),
    ]:
        schedule = model.schedules[key]
        assert (schedule.start, schedule.final) == (pytest.approx(base), pytest.approx(final)), key
        assert schedule.shape == "cosine" and schedule.horizon_kimg * 1000 == REFERENCE_TOTAL_NIMG, key
        assert schedule.get("warmup_kimg", 0) == 0, key
    # The values the run starts from are the schedules' starts.
    assert model.g_optimizer.lr == model.d_optimizer.lr == ref["lr"][0]
    assert list(model.g_optimizer.betas) == list(model.d_optimizer.betas) == [0.0, ref["beta2"][0]]
    assert model.g_optimizer.eps == 1e-8 and model.objective.gamma == ref["gamma"][0]
    assert model.ema.rampup is None  # the reference's EMA has no ramp-up: its half-life is scheduled from 0
    augment = instantiate(cfg.augment)
    assert augment.target is None  # not adaptive: p follows its schedule
    assert {op: m for op, m in augment.multipliers.items() if m > 0} == REFERENCE_AUGMENT_MULTIPLIERS
    assert augment.cutout_size == 0.5  # NVlabs' AugmentPipe default, which R3GAN keeps


def _reference_block(width, groups, expansion=2, kernel=3):
    expanded = width * expansion
    return (
        width * expanded + expanded * (expanded // groups) * kernel * kernel + expanded * width + 2 * expanded
    )


def _reference_counts(widths, groups, z_dim=64, channels=3):
    blocks = sum(2 * _reference_block(w, g) for w, g in zip(widths, groups, strict=True))
    transitions = sum(a * b for a, b in zip(widths, widths[1:], strict=False) if a != b)
    generator = widths[0] * 16 + z_dim * widths[0] + blocks + transitions + widths[-1] * channels
    discriminator = channels * widths[-1] + blocks + transitions + widths[0] * 16 + widths[0]
    return generator, discriminator


@pytest.mark.parametrize("preset", sorted(REFERENCE))
def test_the_presets_networks_have_the_references_parameter_counts(tmp_path, preset):
    cfg = _compose(tmp_path, preset)
    G, D = instantiate(cfg.model.generator), instantiate(cfg.model.discriminator)
    expected_g, expected_d = _reference_counts(REFERENCE[preset]["widths"], REFERENCE[preset]["groups"])
    assert sum(p.numel() for p in G.parameters()) == expected_g
    assert sum(p.numel() for p in D.parameters()) == expected_d
    if (
        preset == "r3gan_cifar10"
    ):  # by hand: 8 blocks of 2,583,552; G + basis, Linear(z), to-RGB; D + from-RGB, head
        assert expected_g == 8 * 2_583_552 + 12_288 + 49_152 + 2_304 == 20_732_160
        assert expected_d == 2_304 + 8 * 2_583_552 + 12_288 + 768 == 20_683_776


def test_cutout_zeroes_the_square_nvlabs_cuts():
    """8x8 images, size 0.5, centre (0.25, 0.75): pixel centres (i + 0.5) / 8 within 0.25 of the centre are cut,
    i.e. columns 0-3 ((0.5..3.5) / 8 = 0.0625..0.4375, all < 0.25 away from 0.25; column 4 is 0.5625 - 0.25 =
    0.3125 away) and rows 4-7; the second image drew no cutout."""
    images = torch.ones(2, 3, 8, 8)
    out = apply_cutout(images, torch.tensor([True, False]), torch.tensor([[0.25, 0.75], [0.5, 0.5]]), 0.5)
    cut = out[0, 0] == 0
    assert cut[4:, :4].all() and cut.sum() == 16
    assert torch.equal(out[1], images[1])
    # In the pipeline: drawn with probability p x its multiplier, and only when the op is on (the other ops'
    # random streams are the same with or without it).
    torch.manual_seed(0)
    ada = AdaptiveAugment(target=None, pipeline="cutout", initial_p=1.0)
    augmented = ada(torch.ones(64, 1, 8, 8))
    assert (augmented.flatten(1) == 0).any(1).all()  # p = 1: every image has its square cut
    assert ((augmented == 0).flatten(1).sum(1) <= 16).all()  # never more than 4 x 4 pixels of 8 x 8
