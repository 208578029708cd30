"""R3GAN (`model=r3gan`, `R3GANObjective`): the relativistic pairing loss with R1 and R2 against hand computations,
the penalties' gradients taken before augmentation against `torch.autograd.grad`, G's step leaving D alone, gamma as
a buffer a schedule writes, the networks' parameter counts against the reference's structure counted by hand
(`brownvc/R3GAN`,
`R3GAN/Networks.py`: bias-free convs, a bias per activation, a 4x4 basis in G and a depthwise 4x4 + Linear in D),
the Fix-up initialisation, and a short CPU run of the digits preset."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch import nn

from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.networks.r3gan import (
    ACTIVATION_GAIN,
    R3GANDiscriminator,
    R3GANGenerator,
    ResidualBlock,
)
from pixelsmith.gan.objectives import GANBatch, R1Penalty, R3GANObjective
from pixelsmith.run.build import build_core_settings, build_model, resolve_hardware
from pixelsmith.run.fit import run


class _SquareD(nn.Module):
    """D(x) = sum of x^2 per image: dD/dx = 2x, so every penalty is known by hand."""

    def forward(self, images):
        return images.square().sum(dim=[1, 2, 3])


class _Loop:
    """A loop reduced to what the objective calls: G returns a constant image b, D_forward augments by `aug`."""

    def __init__(self, b: float, aug: float = 1.0):
        self.D, self.b, self.aug, self.world_size = _SquareD(), b, aug, 1

    def G_forward(self, z, grad=True):
        return torch.full((z.shape[0], 1, 2, 2), self.b) + 0.0 * z.sum()

    def D_forward(self, images, reals=False):
        return self.D(images * self.aug)

    def loss_scale(self):
        return torch.tensor(1.0)


def _inputs(a: float, n: int = 2):
    return {"real": torch.full((n, 1, 2, 2), a), "z": torch.zeros(n, 4)}


def test_the_d_step_is_the_relativistic_loss_plus_gamma_over_two_r1_plus_r2():
    # reals = 0.5 everywhere (4 pixels): D = 4 * 0.25 = 1, |dD/dx|^2 = 4 * (2 * 0.5)^2 = 4 (R1);
    # fakes = 0.25: D = 0.25, R2 = 4 * (2 * 0.25)^2 = 1. softplus(-(1 - 0.25)) = log(1 + e^-0.75) = 0.386871;
    # gamma 0.3 (a gamma of 1 or 2 would hide a missing or doubled 1/2): 0.386871 + 0.15 * 5 = 1.136871.
    objective = R3GANObjective(gamma=0.3)
    dmain = objective.phases()[0]
    out = objective.loss(dmain, _Loop(b=0.25), _inputs(0.5))
    assert out.logs["loss/r1"].item() == pytest.approx(4.0)
    assert out.logs["loss/r2"].item() == pytest.approx(1.0)
    assert out.logs["loss/D"].item() == pytest.approx(math.log1p(math.exp(-0.75)), rel=1e-6)
    assert out.loss.item() == pytest.approx(0.386871 + 0.15 * 5.0, abs=1e-6)


def test_the_g_step_is_softplus_of_minus_fake_minus_real_on_its_own_reals():
    # fakes 0 (D = 0), reals 0.5 (D = 1): softplus(-(0 - 1)) = log(1 + e) = 1.313262.
    objective = R3GANObjective()
    gmain = objective.phases()[1]
    out = objective.loss(gmain, _Loop(b=0.0), _inputs(0.5))
    assert out.loss.item() == pytest.approx(1.313262, abs=1e-6)
    # Each phase gets its own half of the loader batch: D's reals first, G's second.
    reals = torch.arange(4.0).view(4, 1, 1, 1)
    d_inputs = objective.sample_inputs(objective.phases()[0], GANBatch(reals), 8)
    g_inputs = objective.sample_inputs(gmain, GANBatch(reals), 8)
    assert d_inputs["real"].flatten().tolist() == [0.0, 1.0] and g_inputs["real"].flatten().tolist() == [
        2.0,
        3.0,
    ]
    assert d_inputs["z"].shape == (2, 8) and objective.images_per_iteration(4) == 2
    with pytest.raises(PixelsmithError, match="micro-batch of 3 images .* must be a multiple of 2"):
        objective.sample_inputs(gmain, GANBatch(torch.zeros(3, 1, 2, 2)), 8)


def test_r1_and_r2_differentiate_through_the_augmentation_at_the_images_before_it():
    """D_forward scales by 3 (the augmentation): the penalties are |d D(3x) / dx|^2 (18 x a pixel), not |D'| at the
    augmented images (6 x); checked against torch.autograd.grad computed here."""
    objective = R3GANObjective(gamma=1.0)
    loop = _Loop(b=0.25, aug=3.0)
    out = objective.loss(objective.phases()[0], loop, _inputs(0.5))
    for image, key in (
        (torch.full((2, 1, 2, 2), 0.5), "loss/r1"),
        (torch.full((2, 1, 2, 2), 0.25), "loss/r2"),
    ):
        image.requires_grad_(True)
        (reference,) = torch.autograd.grad(loop.D_forward(image).sum(), image)
        expected = reference.square().sum(dim=[1, 2, 3]).mean()
        assert out.logs[key].item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.logs["loss/r1"].item() == pytest.approx(4 * (18 * 0.5) ** 2)  # 324, not 4 * (6 * 0.5)^2


def test_gamma_is_a_buffer_the_loss_reads_that_a_schedule_writes():
    """model.schedules.gamma writes the buffer (tests/test_schedules.py runs it); the D step reads it there."""
    objective = R3GANObjective(gamma=0.3)
    assert objective.scheduled_scalars() == {"gamma": objective.gamma}
    objective.gamma.fill_(0.1)  # the loss at 0.1: 0.386871 + 0.05 * 5 = 0.636871
    out = objective.loss(objective.phases()[0], _Loop(b=0.25), _inputs(0.5))
    assert out.loss.item() == pytest.approx(0.386871 + 0.05 * 5.0, abs=1e-6)
    assert "gamma" not in objective.state_dict()  # the config or the schedule gives it at every start


def test_regularisers_or_a_loss_beside_r3gans_are_named_at_start_up_not_run(caplog):
    from pixelsmith.gan.objectives import HingeLoss

    with caplog.at_level("WARNING"):
        objective = R3GANObjective(regularizers={"r1": R1Penalty(gamma=1.0)}, loss=HingeLoss())
    said = caplog.text
    assert (
        "R3GANObjective does not run model.objective.regularizers ['r1'] or model.objective.loss (HingeLoss)"
        in said
    )
    assert [p.name for p in objective.phases()] == ["Dmain", "Gmain"] and not len(objective.regularizers)
    assert isinstance(objective.adversarial, type(R3GANObjective().adversarial))  # not the hinge


def test_g_step_leaves_d_unchanged_and_d_step_leaves_g(make_cfg):
    cfg = make_cfg(model="r3gan")
    module = build_model(cfg, build_core_settings(cfg, resolve_hardware(cfg)))
    optimizers, _ = module.configure_optimizers()
    module._test_optimizers = optimizers
    module.optimizers = lambda use_pl_optimizer=True: optimizers  # noqa: ARG005
    module.step = lambda name: optimizers[module._optimizer_index[name]].step()
    module.loss_backward = lambda loss, name: loss.backward()
    module.autocast = contextlib.nullcontext
    torch.manual_seed(0)
    batch = GANBatch(torch.rand(16, 1, 32, 32) * 2 - 1)
    snapshot = lambda net: [p.detach().clone() for p in net.parameters()]  # noqa: E731
    d_before, g_before = snapshot(module.discriminator), snapshot(module.generator)
    gmain = module.objective.phases()[1]
    module.run_phase(gmain, batch)
    assert all(torch.equal(a, b) for a, b in zip(d_before, snapshot(module.discriminator), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(g_before, snapshot(module.generator), strict=True))
    assert all(p.grad is None or not p.grad.any() for p in module.discriminator.parameters())
    g_after = snapshot(module.generator)
    module.run_phase(module.objective.phases()[0], batch)
    assert all(torch.equal(a, b) for a, b in zip(g_after, snapshot(module.generator), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(d_before, snapshot(module.discriminator), strict=True))


def test_parameter_counts_match_the_reference_structure_counted_by_hand():
    # widths [16, 8] (4x4, 8x8), groups [4, 2], 1 block a stage, expansion 2, z 4, 3 channels.
    # A block of C channels, g groups: 1x1 C->2C (2C^2) + bias 2C + 3x3 grouped 2C->2C (2C * 2C/g * 9) + bias 2C
    # + 1x1 2C->C (2C^2): C=16, g=4: 512 + 32 + 2304 + 32 + 512 = 3392; C=8, g=2: 128 + 16 + 1152 + 16 + 128 = 1440.
    # G: basis 16x4x4 (256) + Linear 4->16 (64) + block16 + 1x1 16->8 before the upsample (128) + block8 + 1x1 8->3 (24).
    # D: 1x1 3->8 (24) + block8 + 1x1 8->16 after the downsample (128) + block16 + depthwise 16x4x4 (256) + Linear 16.
    kwargs = dict(resolution=8, channels=3, widths=[16, 8], groups=[4, 2], blocks=1)
    G, D = R3GANGenerator(z_dim=4, **kwargs), R3GANDiscriminator(**kwargs)
    assert sum(p.numel() for p in G.parameters()) == 256 + 64 + 3392 + 128 + 1440 + 24 == 5304
    assert sum(p.numel() for p in D.parameters()) == 24 + 1440 + 128 + 3392 + 256 + 16 == 5256
    assert G(torch.randn(2, 4)).shape == (2, 3, 8, 8) and D(torch.randn(2, 3, 8, 8)).shape == (2,)
    with pytest.raises(ValueError, match="3 stages"):
        R3GANGenerator(resolution=16, widths=[8, 8], groups=[2, 2])


def test_blocks_start_as_the_identity_with_fixup_gains():
    torch.manual_seed(0)
    block = ResidualBlock(channels=64, groups=8, expansion=2, kernel=3, total_blocks=16)
    x = torch.randn(2, 64, 8, 8)
    assert torch.equal(block(x), x)  # the last 1x1 starts at zero
    # N(0, (gain * L^-1/4)^2 / fan_in): gain sqrt(2 / 1.04), L 16 -> 1.386750 / 2 / sqrt(64) = 0.086672.
    expected = ACTIVATION_GAIN * 16 ** (-0.25) / math.sqrt(64)
    assert expected == pytest.approx(0.086672, abs=1e-6)
    assert block.expand.weight.std().item() == pytest.approx(expected, rel=0.05)


def test_the_digits_preset_trains_and_counts_the_d_steps_images(tmp_path):
    from tests.conftest import FAST, compose_config

    cfg = compose_config(
        [
            *FAST,
            "experiment=mnist_r3gan",
            "model.generator.widths=[16,16,16,16]",
            "model.generator.groups=[2,2,2,2]",
            "max_steps=6",
            "train.sample_every_n_steps=0",
        ],
        tmp_path / "run",
    )
    metrics = run(cfg)
    assert metrics["iteration"] == 6
    assert metrics["train/kimg"] == pytest.approx(6 * 8 / 1000)  # FAST's batch 16: 8 for D's step, 8 for G's
    assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith("loss/"))
    assert metrics["loss/r1"] > 0 and metrics["loss/r2"] > 0
    assert 0.01 < metrics["r3gan/gamma"] < 0.1  # moved along model.schedules.gamma's cosine from 0.1
    assert metrics["schedule/gamma"] == pytest.approx(metrics["r3gan/gamma"])


def test_class_conditioning_embeds_labels_in_g_and_projects_in_d():
    """The reference's conditioning (`R3GAN/Networks.py`, ConditionDimension): G concatenates Linear(c) (z's size,
    no bias) to z; D's head gives widths[0] features and the logit is their dot product with Linear(c)."""
    kwargs = dict(resolution=8, channels=3, widths=[16, 8], groups=[4, 2], blocks=1)
    G = R3GANGenerator(z_dim=4, c_dim=10, **kwargs)
    D = R3GANDiscriminator(c_dim=10, **kwargs)
    # Over the unconditional 5304 / 5256 (by hand above): G's embedding 4 x 10 and its basis Linear now (4 + 4) -> 16
    # (+64); D's head Linear 16 -> 16 (+240) and its projection 16 x 10.
    assert sum(p.numel() for p in G.parameters()) == 5304 + 40 + 64
    assert sum(p.numel() for p in D.parameters()) == 5256 + 240 + 160
    z, labels = torch.randn(3, 4), torch.tensor([0, 7, 9])
    one_hot = torch.nn.functional.one_hot(labels, 10).float()
    assert torch.equal(G(z, labels), G(z, one_hot))  # class indices or one-hot alike
    images = G(z, labels)
    features = D.main(D.from_image(images))  # [3, 16]
    assert torch.allclose(D(images, labels), (features * D.embedding[:, labels].T).sum(1), atol=1e-6)
    with pytest.raises(ValueError, match="conditional"):
        D(images)


def test_a_conditional_r3gan_learns_to_follow_its_labels():
    """Three classes of flat grey images (level 40 + 80k): after training, G's mean brightness follows the label."""
    from torch.utils.data import DataLoader, TensorDataset

    from pixelsmith.core.config import CoreSettings
    from pixelsmith.gan.module import GANModule
    from tests.test_gan_objectives import bare_trainer

    torch.manual_seed(0)
    labels = torch.arange(3).repeat(64)
    images = (40 + 80 * labels).view(-1, 1, 1, 1).expand(-1, 1, 8, 8).to(torch.uint8).contiguous()
    loader = DataLoader(
        TensorDataset(images, torch.zeros(len(labels), dtype=torch.bool), labels), batch_size=24, shuffle=True
    )
    kwargs = dict(resolution=8, channels=1, widths=[16, 16], groups=[2, 2], blocks=1, c_dim=3)
    module = GANModule(
        CoreSettings(max_steps=120, optimizer_impl="foreach", log_every_n_steps=40),
        R3GANGenerator(z_dim=8, **kwargs),
        R3GANDiscriminator(**kwargs),
        objective=R3GANObjective(gamma=0.1, c_dim=3),
        g_optimizer={"lr": 2e-3, "betas": [0.0, 0.9]},
        d_optimizer={"lr": 2e-3, "betas": [0.0, 0.9]},
        ema={"enabled": False},
        sample_grid_size=6,
    )
    bare_trainer().fit(module, loader)
    z = torch.randn(256, 8)
    with torch.no_grad():
        means = [float(module.generator(z, torch.full((256,), k)).mean()) for k in range(3)]
    assert means[0] < means[1] < means[2], means  # the data's class means: -0.69, -0.06, 0.57
    assert means[2] - means[0] > 0.6, means
    grid = module.generate(torch.randn(6, 8))  # sample grids cycle through the classes: 0, 1, 2, 0, 1, 2
    assert grid[2].mean() > grid[0].mean()


def test_a_conditional_r3gan_without_labelled_data_says_how_to_get_them():
    objective = R3GANObjective(c_dim=10)
    with pytest.raises(PixelsmithError, match="data.labels=true"):
        objective.sample_inputs(objective.phases()[0], GANBatch(torch.zeros(4, 1, 8, 8)), 8)


def test_the_digits_preset_trains_class_conditionally_on_mnists_labels(tmp_path):
    from tests.conftest import FAST, compose_config

    cfg = compose_config(
        [
            *FAST,
            "experiment=mnist_r3gan",
            "model.generator.widths=[16,16,16,16]",
            "model.generator.groups=[2,2,2,2]",
            "model.generator.c_dim=10",
            "data.labels=true",
            "max_steps=3",
            "train.sample_every_n_steps=3",
        ],
        tmp_path / "run",
    )
    assert cfg.model.discriminator.c_dim == cfg.model.objective.c_dim == 10
    metrics = run(cfg)
    assert metrics["iteration"] == 3 and math.isfinite(metrics["loss/D"])
    assert list((tmp_path / "run").rglob("*.png"))  # the sample grid, one class per row position
