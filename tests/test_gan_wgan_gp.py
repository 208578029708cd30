"""WGAN-GP (`+model/objective=wgan_gp`, `experiment=mnist_wgan_gp`) and the `model/objective` group: the critic
loss and gradient penalty against a hand computation and `torch.autograd.grad` (Gulrajani et al. 2017, Algorithm 1:
lambda 10, n_critic 5, Adam lr 1e-4, betas (0, 0.9)); n_critic critic steps per iteration, each on a real draw of
its own; kimg counted over all of them; regularisers a composed model brings named at start-up and not run; and a
fork's own objective as one class and one YAML, with no registration."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.objectives import GANBatch, GANObjective, PhaseLoss, WGANGPObjective
from pixelsmith.run.fit import run
from tests.conftest import CONF_DIR, compose_config, last_checkpoint
from tests.test_gan_r3gan import _Loop  # G a constant image b, D(x) = sum of x^2 after scaling by `aug`


def _inputs(real: float, mix: float, n: int = 2):
    return {
        "real": torch.full((n, 1, 2, 2), real),
        "z": torch.zeros(n, 4),
        "mix": torch.full((n, 1, 1, 1), mix),
    }


def test_the_critic_loss_and_penalty_by_hand():
    # reals 0.5 (D = 4 * 0.25 = 1), fakes 0.25 (D = 0.25): critic = 0.25 - 1 = -0.75. Interpolate at e = 0.3:
    # 0.3 * 0.5 + 0.7 * 0.25 = 0.325; dD/dx = 2 x, so ||grad|| = sqrt(4 * 0.65^2) = 1.3 and the penalty (1.3 - 1)^2
    # = 0.09; weight 7 (not 1 or 10, where a missing or extra factor could hide): -0.75 + 0.63 = -0.12.
    objective = WGANGPObjective(gp_weight=7.0)
    dmain = objective.phases()[0]
    out = objective.loss(dmain, _Loop(b=0.25), _inputs(0.5, 0.3))
    assert out.logs["loss/gp"].item() == pytest.approx(0.09, abs=1e-6)
    assert out.logs["wgan/distance"].item() == pytest.approx(0.75)
    assert out.loss.item() == pytest.approx(-0.12, abs=1e-6)
    # G: -mean D(G(z)) = -0.25 at fakes 0.25.
    assert objective.loss(
        objective.phases()[1], _Loop(b=0.25), _inputs(0.5, 0.3)
    ).loss.item() == pytest.approx(-0.25)


def test_the_penalty_differentiates_through_the_augmentation_at_the_interpolates():
    objective = WGANGPObjective(gp_weight=1.0)
    loop = _Loop(b=0.25, aug=3.0)
    out = objective.loss(objective.phases()[0], loop, _inputs(0.5, 0.3))
    between = torch.full((2, 1, 2, 2), 0.325, requires_grad=True)
    (reference,) = torch.autograd.grad(loop.D_forward(between).sum(), between)
    expected = (reference.flatten(1).norm(dim=1) - 1).square().mean()
    assert out.logs["loss/gp"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.logs["loss/gp"].item() == pytest.approx(
        (18 * 0.325 * 2 - 1) ** 2, rel=1e-6
    )  # |d D(3x)/dx| = 18x


def test_the_phase_table_repeats_the_critic_on_draws_of_its_own():
    objective = WGANGPObjective(n_critic=5)
    dmain, gmain = objective.phases()
    assert (dmain.name, dmain.repeats, gmain.name, gmain.repeats) == ("Dmain", 5, "Gmain", 1)
    reals = torch.arange(10.0).view(10, 1, 1, 1)
    draws = [
        objective.sample_inputs(dmain, GANBatch(reals, draw=k), 8)["real"].flatten().tolist()
        for k in range(5)
    ]
    assert draws == [
        [0.0, 1.0],
        [2.0, 3.0],
        [4.0, 5.0],
        [6.0, 7.0],
        [8.0, 9.0],
    ]  # disjoint, covering the batch
    assert objective.images_per_iteration(10) == 10  # all five draws: the images the critic trained on
    with pytest.raises(PixelsmithError, match="micro-batch of 12 images .* must be a multiple of 5"):
        objective.sample_inputs(dmain, GANBatch(torch.zeros(12, 1, 1, 1)), 8)


_SMALL_WGAN = [
    "+model/objective=wgan_gp",
    "model.objective.loss=null",
    "model.discriminator.norm=none",
    "data.batch_size=20",  # 5 draws of 4
    "train.sample_every_n_steps=0",
]


def test_an_iteration_is_one_generator_step_after_n_critic_critic_steps(make_cfg, tmp_path):
    metrics = run(make_cfg(*_SMALL_WGAN, "max_steps=3"))
    saved = last_checkpoint(tmp_path / "run")
    steps = {
        len(state["param_groups"][0]["params"]): next(iter(state["state"].values()))["step"].item()
        for state in saved["optimizer_states"]
    }
    g_params = len(saved["optimizer_states"][0]["param_groups"][0]["params"])
    d_params = len(saved["optimizer_states"][1]["param_groups"][0]["params"])
    assert steps[g_params] == 3 and steps[d_params] == 15  # 3 iterations: 3 G steps, 15 critic steps
    assert metrics["iteration"] == 3 and metrics["train/kimg"] == pytest.approx(3 * 20 / 1000)
    assert math.isfinite(metrics["loss/gp"]) and "loss/r1" not in metrics


def test_the_critic_learns_to_separate_real_from_fake(make_cfg):
    """The critic's Wasserstein estimate E[D(real)] - E[D(fake)] rises from about 0 as it trains."""
    metrics = run(make_cfg(*_SMALL_WGAN, "max_steps=12", "train.log_every_n_steps=12"))
    assert metrics["wgan/distance"] > 0.05, metrics["wgan/distance"]


def test_a_models_regularisers_are_named_at_start_up_and_not_run(make_cfg, caplog):
    cfg = make_cfg(
        "+model/objective=wgan_gp",
        "model.objective.regularizers.r1.gamma=0.1",
        "model.objective.regularizers.path_length.weight=2.0",
        "data.batch_size=10",
        "max_steps=1",
        "train.sample_every_n_steps=0",
        model="stylegan2",
    )
    with caplog.at_level(logging.WARNING):
        metrics = run(cfg)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "WGANGPObjective does not run model.objective.regularizers ['path_length', 'r1']" in said
    assert "~model.objective.regularizers" in said
    assert "loss/r1" not in metrics and "loss/pl" not in metrics and "loss/gp" in metrics


def test_a_misspelled_objective_key_fails_naming_what_the_class_takes(make_cfg):
    with pytest.raises(
        PixelsmithError, match=r"\['n_critc'\] that WGANGPObjective does not take; it takes: n_critic"
    ):
        run(make_cfg(*_SMALL_WGAN, "+model.objective.n_critc=3", "max_steps=1"))


class HalvedHinge(GANObjective):
    """A fork's objective with an argument of its own (used by the test below through its YAML)."""

    def __init__(self, margin: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.margin = margin

    def loss(self, phase, loop, inputs):
        if phase.name != "Dmain":
            return super().loss(phase, loop, inputs)
        real = loop.D_forward(inputs["real"], reals=True).float()
        fake = loop.D_forward(loop.G_forward(inputs["z"], grad=False)).float()
        loss = torch.relu(self.margin - real).mean() + torch.relu(self.margin + fake).mean()
        return PhaseLoss(loss, {"loss/D": loss.detach(), "margin": torch.tensor(self.margin)})


def test_a_forks_objective_is_one_class_and_one_yaml(tmp_path):
    fork = tmp_path / "conf" / "model" / "objective"
    fork.mkdir(parents=True)
    (fork / "halved_hinge.yaml").write_text(
        "_target_: tests.test_gan_wgan_gp.HalvedHinge\nmargin: 0.5\nregularizers: {}\norder: [D, G]\n"
    )
    assert not (CONF_DIR / "model" / "objective" / "halved_hinge.yaml").exists()
    from tests.conftest import FAST, SMALL

    cfg = compose_config(
        [
            f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
            *FAST,
            *SMALL["dcgan"],
            "+model/objective=halved_hinge",
            "max_steps=2",
            "train.log_every_n_steps=1",
            "train.sample_every_n_steps=0",
        ],
        tmp_path / "run",
    )
    metrics = run(cfg)
    assert metrics["margin"] == pytest.approx(0.5) and metrics["iteration"] == 2


def test_the_repeated_critic_phase_runs_the_same_through_the_cuda_graph_path(make_cfg, tmp_path):
    """hardware.cuda_graphs=true on a CPU runs the graphed iteration's code uncaptured: n_critic draws and steps in
    one plan, the same weights as eagerly."""
    eager = run(make_cfg(*_SMALL_WGAN, "max_steps=2", "precision=32-true", output="eager"))
    graphed = run(
        make_cfg(
            *_SMALL_WGAN, "max_steps=2", "precision=32-true", "hardware.cuda_graphs=true", output="graphed"
        )
    )
    assert graphed["loss/gp"] == pytest.approx(eager["loss/gp"], rel=1e-5)
    a, b = last_checkpoint(tmp_path / "eager"), last_checkpoint(tmp_path / "graphed")
    for key, value in a["state_dict"].items():
        if value.is_floating_point():
            torch.testing.assert_close(b["state_dict"][key], value, rtol=1e-5, atol=1e-6, msg=key)
