"""The pluggable GAN objective: the phase table, the loop that runs it (GANModule) and the plain benchmark loop that
reuses it, regularisers (R1, path length, a fork's own) plugged in by `_target_`, and injectable optimizers."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.plain_loop import build_plain_gan
from pixelsmith.builders import build_model, build_plan
from pixelsmith.core.module import CoreSettings, _mix_seed
from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.objectives import (
    GANObjective,
    HingeLoss,
    NonSaturatingLoss,
    PathLengthPenalty,
    PhaseLoss,
    R1Penalty,
    Regularizer,
)
from pixelsmith.train import run
from tests.conftest import FAST, SMALL, bare_trainer, compose_config, metrics_rows, series

R1 = "model.objective.regularizers.r1"


class LogitMagnitude(Regularizer):
    """A fork's regulariser, plugged in from the config without touching the module: D's squared real logits
    (a drift penalty, as in ProGAN's epsilon term), every `interval` iterations."""

    phase_name = "Ddrift"
    network = "D"
    inputs = ("real",)

    def __init__(self, weight: float = 0.1, interval: int = 2):
        super().__init__(interval)
        self.weight = weight
        self.calls = 0

    def loss(self, step, inputs):
        self.calls += 1
        drift = step.D_forward(inputs["real"]).float().square().mean()
        return PhaseLoss(drift * self.weight, {"loss/drift": drift.detach()})


class OptimizerSpy(L.Callback):
    """Records the optimizers the core built (added with +callbacks.spy._target_=...)."""

    seen: dict[str, torch.optim.Optimizer] = {}

    def on_train_end(self, trainer, pl_module):
        OptimizerSpy.seen.update(G=pl_module._raw_optimizer("G"), D=pl_module._raw_optimizer("D"))


def _names(phases) -> list[str]:
    return [p.name for p in phases]


def test_the_phase_table_follows_the_regularisers_and_the_order():
    objective = GANObjective(
        NonSaturatingLoss(), {"r1": R1Penalty(gamma=1.0, interval=16), "pl": PathLengthPenalty(interval=4)}
    )
    assert _names(objective.phases()) == ["Dmain", "Dreg", "Gmain", "Greg"]
    assert _names(objective.phases_at(0)) == ["Dmain", "Dreg", "Gmain", "Greg"]
    assert _names(objective.phases_at(4)) == ["Dmain", "Gmain", "Greg"]
    assert _names(objective.phases_at(5)) == ["Dmain", "Gmain"]
    stylegan2_ada = GANObjective(NonSaturatingLoss(), {"r1": R1Penalty(1.0, 16)}, order=("G", "D"))
    assert _names(stylegan2_ada.phases()) == ["Gmain", "Dmain", "Dreg"]
    # A disabled regulariser (gamma 0) is no phase, and changes no optimizer's hyper-parameters.
    off = GANObjective(NonSaturatingLoss(), {"r1": R1Penalty(gamma=0.0, interval=16)})
    assert _names(off.phases()) == ["Dmain", "Gmain"] and off.lazy_ratio("D") == 1.0
    assert objective.lazy_ratio("D") == pytest.approx(16 / 17)
    assert objective.lazy_ratio("G") == pytest.approx(4 / 5)
    # R1 every iteration is still a second D step per iteration: StyleGAN2-ADA's ratio 1/2 (lr halved).
    every = GANObjective(NonSaturatingLoss(), {"r1": R1Penalty(gamma=1.0, interval=1)})
    assert _names(every.phases_at(1)) == ["Dmain", "Dreg", "Gmain"] and every.lazy_ratio("D") == 0.5


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GANObjective(order=("D", "D")), "must name G and D once each"),
        (lambda: GANObjective(loss=torch.nn.Identity()), "not an AdversarialLoss"),
        (lambda: R1Penalty(gamma=-1), "gamma=-1 must be >= 0"),
        (lambda: PathLengthPenalty(interval=0), "interval=0 must be at least 1"),
    ],
)
def test_bad_objectives_are_refused_naming_the_fix(build, message):
    with pytest.raises(PixelsmithError, match=message):
        build()


def test_losses_match_their_formulas():
    real, fake = torch.tensor([2.0, 0.5]), torch.tensor([-3.0, 0.0])
    softplus = torch.nn.functional.softplus
    assert NonSaturatingLoss().discriminator(real, fake) == pytest.approx(
        float(softplus(-real).mean() + softplus(fake).mean())
    )
    assert NonSaturatingLoss().generator(fake) == pytest.approx(float(softplus(-fake).mean()))
    assert HingeLoss().generator(fake) == pytest.approx(1.5)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_plain_benchmark_loop_and_the_module_compute_the_same_iterations(tmp_path, precision):
    """The plain loop reuses the module's objective: from the same weights, batch and seeds, two iterations (the
    first with lazy R1) leave the same weights in both. A loop that drifted from the template would fail here."""
    cfg = compose_config(
        [
            *FAST,
            *SMALL["dcgan"],
            f"precision={precision}",
            f"{R1}.gamma=0.5",
            f"{R1}.interval=2",
            "hardware.channels_last=false",
        ],
        tmp_path / "run",
    )
    plan = build_plan(cfg)
    core = CoreSettings(
        max_steps=2, optimizer_impl="foreach", seed=7, log_every_n_steps=1, precision=precision
    )
    module = build_model(cfg, core)
    plain = build_plain_gan(cfg, plan, "foreach")
    plain.G.load_state_dict(module.generator.state_dict())
    plain.D.load_state_dict(module.discriminator.state_dict())
    images = torch.randint(
        0, 256, (8, 1, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )

    trainer = bare_trainer()
    trainer.fit(module, DataLoader(TensorDataset(images), batch_size=8))
    assert module.iteration == 2
    for iteration in range(2):
        torch.default_generator.manual_seed(_mix_seed(7, 0, iteration))  # the module's per-iteration seed
        plain.step(images)

    for net_a, net_b in ((module.generator, plain.G), (module.discriminator, plain.D)):
        for (name, a), b in zip(net_a.state_dict().items(), net_b.state_dict().values(), strict=True):
            assert torch.allclose(a.float(), b.float(), atol=1e-6), name


def test_a_forks_regulariser_runs_as_its_own_phase_from_the_config(make_cfg, tmp_path):
    cfg = make_cfg(
        "precision=32-true",
        "max_steps=6",
        "train.log_every_n_steps=2",
        "train.sample_every_n_steps=0",
        "+model.objective.regularizers.drift._target_=tests.test_gan_objectives.LogitMagnitude",
        "+model.objective.regularizers.drift.interval=2",
    )
    run(cfg)
    drift = series(metrics_rows(tmp_path / "run"), "loss/drift")
    assert len(drift) == 3 and all(v > 0 for v in drift)  # iterations 0, 2, 4: logged at 2, 4, 6


def test_path_length_regularisation_trains_stylegan2_and_tracks_its_mean(make_cfg, tmp_path):
    cfg = make_cfg(
        "precision=32-true",
        "max_steps=8",
        "train.log_every_n_steps=4",
        "train.sample_every_n_steps=0",
        "model.objective.regularizers.path_length.weight=2.0",
        "model.objective.regularizers.path_length.interval=2",
        model="stylegan2",
    )
    run(cfg)
    rows = metrics_rows(tmp_path / "run")
    pl_mean = series(rows, "pl/mean")
    assert len(pl_mean) == 2 and pl_mean[0] > 0 and pl_mean[0] != pl_mean[1]
    assert all(torch.isfinite(torch.tensor(series(rows, "loss/pl"))))
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    saved = state["state_dict"]["objective.regularizers.path_length.pl_mean"]
    assert float(saved) == pytest.approx(pl_mean[-1], rel=1e-5)  # a resume continues from the running mean


def test_path_length_on_a_generator_without_mapping_names_the_fix(make_cfg):
    cfg = make_cfg(
        "max_steps=2",
        "+model.objective.regularizers.pl._target_=pixelsmith.gan.objectives.PathLengthPenalty",
    )
    with pytest.raises(PixelsmithError, match="return_ws=True.*model=stylegan2"):
        run(cfg)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["model.g_optimizer._target_=torch.optim.AdamW", "model.g_optimizer.weight_decay=0.01"],
            torch.optim.AdamW,
        ),
        (
            [
                "model.g_optimizer._target_=torch.optim.SGD",
                "model.g_optimizer.betas=null",
                "model.g_optimizer.eps=null",
                "+model.g_optimizer.kwargs.momentum=0.9",
            ],
            torch.optim.SGD,
        ),
    ],
)
def test_the_optimizer_is_injectable_by_target(make_cfg, overrides, expected):
    OptimizerSpy.seen.clear()
    run(make_cfg("max_steps=2", *overrides, "+callbacks.spy._target_=tests.test_gan_objectives.OptimizerSpy"))
    assert type(OptimizerSpy.seen["G"]) is expected and type(OptimizerSpy.seen["D"]) is torch.optim.Adam
    if expected is torch.optim.SGD:
        assert OptimizerSpy.seen["G"].param_groups[0]["momentum"] == 0.9


def test_an_optimizer_key_it_does_not_take_is_refused_naming_the_fix(make_cfg):
    cfg = make_cfg("max_steps=2", "model.g_optimizer._target_=torch.optim.SGD")
    with pytest.raises(PixelsmithError, match="SGD takes no betas, eps.*betas=null"):
        run(cfg)


# ---- a conditional GAN: a new objective plus data, the module unchanged ------------------------------------------
class ConditionalGenerator(nn.Module):
    """G(z, c): the class embedding concatenated to z; 8x8 grey images."""

    z_dim = 8

    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(num_classes, 8)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.Tanh())

    def forward(self, z, c):
        return self.net(torch.cat([z, self.embed(c)], dim=1)).view(-1, 1, 8, 8)


class ProjectionDiscriminator(nn.Module):
    """D(x, c) = w . h(x) + <embed(c), h(x)> (Miyato & Koyama 2018)."""

    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.LeakyReLU(0.2))
        self.out = nn.Linear(64, 1)
        self.embed = nn.Embedding(num_classes, 64)
        self.labels_seen: list[torch.Tensor] = []

    def forward(self, x, c):
        self.labels_seen.append(c.detach().clone())
        h = self.features(x)
        return self.out(h).squeeze(1) + (self.embed(c) * h).sum(dim=1)


class ConditionalObjective(GANObjective):
    """The default phase table; the main phases carry labels: the batch's for reals, uniform ones for fakes."""

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes

    def sample_conditions(self, count, device):
        return (torch.arange(count, device=device) % self.num_classes,)  # sample grids: every class in turn

    def sample_inputs(self, phase, batch, z_dim):
        inputs = super().sample_inputs(phase, batch, z_dim)
        if "real" in inputs:
            inputs["c_real"] = batch.labels
        if "z" in inputs:
            inputs["c_fake"] = torch.randint(
                self.num_classes, (inputs["z"].shape[0],), device=inputs["z"].device
            )
        return inputs

    def loss(self, phase, step, inputs):
        if phase.name == "Dmain":
            fake = step.G_forward(inputs["z"], inputs["c_fake"], grad=False)
            real_logits = step.D_forward(inputs["real"], inputs["c_real"], reals=True)
            loss = self.adversarial.discriminator(real_logits, step.D_forward(fake, inputs["c_fake"]))
            return PhaseLoss(loss, {"loss/D": loss.detach()})
        if phase.name == "Gmain":
            fake = step.G_forward(inputs["z"], inputs["c_fake"])
            loss = self.adversarial.generator(step.D_forward(fake, inputs["c_fake"]))
            return PhaseLoss(loss, {"loss/G": loss.detach()})
        return super().loss(phase, step, inputs)


def test_a_conditional_gan_is_a_new_objective_plus_labelled_data():
    from pixelsmith.gan.module import GANModule

    torch.manual_seed(0)
    labels = torch.arange(3).repeat(64)
    # Class k is a flat image at grey level 40 + 80k: the generator must learn to follow the label.
    images = (40 + 80 * labels).view(-1, 1, 1, 1).expand(-1, 1, 8, 8).to(torch.uint8).contiguous()
    loader = DataLoader(
        TensorDataset(images, torch.zeros(len(labels), dtype=torch.bool), labels), batch_size=24, shuffle=True
    )
    module = GANModule(
        CoreSettings(max_steps=150, optimizer_impl="foreach", log_every_n_steps=50),
        ConditionalGenerator(),
        ProjectionDiscriminator(),
        objective=ConditionalObjective(num_classes=3),
        g_optimizer={"lr": 2e-3, "betas": [0.5, 0.999]},
        d_optimizer={"lr": 2e-3, "betas": [0.5, 0.999]},
        ema={"enabled": False},
        sample_grid_size=4,
    )
    trainer = bare_trainer()
    trainer.fit(module, loader)
    first_real_labels = module.discriminator.labels_seen[0]  # Dmain's first D call is on the reals
    assert first_real_labels.shape == (24,) and set(first_real_labels.tolist()) <= {0, 1, 2}
    z = torch.randn(256, 8)
    with torch.no_grad():
        means = [float(module.generator(z, torch.full((256,), k)).mean()) for k in range(3)]
    # The data's class means are -0.69, -0.06 and 0.57; a generator that ignored its label would give one mean.
    assert means[0] < means[1] < means[2], means
    assert means[2] - means[0] > 0.8 and means[0] < -0.3 and means[2] > 0.3, means
    # Sample grids and FID evaluation sample through the objective's conditions: classes 0, 1, 2, 0, ...
    grid_images = module.generate(torch.randn(6, 8))
    assert grid_images.shape == (6, 1, 8, 8) and grid_images[2].mean() > grid_images[0].mean()
    assert module.sample_grid().ndim == 3  # the fixed latents, one class each in turn


def test_a_stored_config_from_before_the_objective_builds_the_same_gan(tmp_path):
    """Checkpoints written before `model.objective` store `model.loss`/`r1_gamma`/`r1_interval`; evaluate.py and a
    resume build their model from that stored config."""
    from omegaconf import OmegaConf

    cfg = compose_config([*FAST, *SMALL["dcgan"]], tmp_path / "run")
    legacy = OmegaConf.to_container(cfg, resolve=True)
    del legacy["model"]["objective"]
    legacy["model"].update(loss="hinge", r1_gamma=1.0, r1_interval=4)
    module = build_model(OmegaConf.create(legacy), CoreSettings())
    assert isinstance(module.objective.adversarial, HingeLoss)
    r1 = module.objective.regularizers["r1"]
    assert (r1.gamma, r1.interval) == (1.0, 4) and _names(module.objective.phases_at(4)) == [
        "Dmain",
        "Dreg",
        "Gmain",
    ]


def test_a_checkpoint_without_the_objectives_state_resumes(make_cfg, tmp_path):
    """A StyleGAN2 checkpoint from before the path-length regulariser existed has no `pl_mean`: the resume starts it
    afresh instead of failing Lightning's strict load."""
    first = make_cfg("precision=32-true", "max_steps=2", "train.sample_every_n_steps=0", model="stylegan2")
    run(first)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=False)
    del state["state_dict"]["objective.regularizers.path_length.pl_mean"]
    old = tmp_path / "old.ckpt"
    torch.save(state, old)
    resumed = make_cfg(
        "precision=32-true",
        "max_steps=3",
        "train.sample_every_n_steps=0",
        f"ckpt_path={old}",
        model="stylegan2",
        output="resumed",
    )
    assert run(resumed)["iteration"] == 3


def test_renamed_command_line_keys_are_refused_naming_their_new_spelling(capsys):
    from pixelsmith.entry import refuse_renamed_overrides

    refuse_renamed_overrides(
        ["model=stylegan2", "model.objective.regularizers.r1.gamma=1"]
    )  # the new keys pass
    with pytest.raises(SystemExit) as stopped:
        refuse_renamed_overrides(["model.loss=non_saturating,hinge", "+model.r1_interval=4"])
    message = capsys.readouterr().err
    assert stopped.value.code == 2
    assert "model/objective/loss=non_saturating,hinge" in message
    assert "model.objective.regularizers.r1.interval=4" in message
