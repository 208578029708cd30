"""The pluggable GAN objective: the phase table, the loop that runs it (GANModule) and the plain benchmark loop that
reuses it, regularisers (R1, path length, a fork's own) plugged in by `_target_`, and injectable optimizers. Each
loss, penalty and lazy-regularisation constant is checked against a hand computation at values where a wrong
constant shows."""

from __future__ import annotations

import contextlib
import functools
import math

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.plain_loop import build_plain_gan
from pixelsmith.core.config import CoreSettings
from pixelsmith.core.optim import build_optimizer
from pixelsmith.core.seeding import mix_seed as _mix_seed
from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.objectives import (
    GANBatch,
    GANObjective,
    HingeLoss,
    NonSaturatingLoss,
    PathLengthPenalty,
    PhaseLoss,
    R1Penalty,
    Regularizer,
)
from pixelsmith.run.build import build_model, resolve_hardware
from pixelsmith.run.fit import run
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

    def loss(self, loop, inputs):
        self.calls += 1
        drift = loop.D_forward(inputs["real"]).float().square().mean()
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


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_losses_match_a_hand_computation():
    """Logits chosen so each term differs: D's real logits 2 and 0.5, fake -3 and 0."""
    real, fake = torch.tensor([2.0, 0.5]), torch.tensor([-3.0, 0.0])
    # softplus(-D(x)) over reals: ln(1 + e^-2) = 0.126928, ln(1 + e^-0.5) = 0.474077 -> 0.300503;
    # softplus(D(G(z))) over fakes: ln(1 + e^-3) = 0.048587, ln 2 = 0.693147 -> 0.370867. Sum 0.671369.
    d_loss = (_softplus(-2.0) + _softplus(-0.5)) / 2 + (_softplus(-3.0) + _softplus(0.0)) / 2
    assert d_loss == pytest.approx(0.671369, abs=1e-6)
    assert NonSaturatingLoss().discriminator(real, fake).item() == pytest.approx(d_loss, rel=1e-6)
    # G: softplus(-D(G(z))) = ln(1 + e^3) = 3.048587, ln 2 -> 1.870867.
    g_loss = (_softplus(3.0) + _softplus(0.0)) / 2
    assert NonSaturatingLoss().generator(fake).item() == pytest.approx(g_loss, rel=1e-6)
    assert g_loss == pytest.approx(1.870867, abs=1e-6)
    assert HingeLoss().generator(fake) == pytest.approx(1.5)


class _Loop:
    """What a loop gives an objective (GANLoop), reduced to the networks: no autocast, one rank."""

    def __init__(self, G=None, D=None, scale: float = 1.0):
        self.G, self.D, self.device, self.scale = G, D, torch.device("cpu"), scale

    def D_forward(self, images, *conditions, reals=False):
        return self.D(images)

    def autocast(self):
        return contextlib.nullcontext()

    def loss_scale(self):
        return torch.tensor(self.scale)

    def mean_over_ranks(self, tensor):
        return tensor


class _SquareD(nn.Module):
    """D(x) = sum of x^2 over each image, so dD/dx = 2x and the R1 norm is known by hand."""

    def forward(self, images):
        return images.square().sum(dim=[1, 2, 3])


@pytest.mark.parametrize("scale", [1.0, 1024.0])  # 1024: the fp16 path's loss scale must cancel exactly
def test_r1_is_gamma_over_two_times_the_squared_gradient_norm_at_reals(scale):
    reals = torch.tensor([[[[1.0, 1.0]]], [[[0.5, -1.5]]]])  # two 1x1x2 "images"
    # ||2x||^2: 4 * (1 + 1) = 8 and 4 * (0.25 + 2.25) = 10; mean 9. gamma = 4: 4 / 2 * 9 = 18 (gamma * 9 = 36).
    out = R1Penalty(gamma=4.0, interval=16).loss(_Loop(D=_SquareD(), scale=scale), {"real": reals})
    assert out.logs["loss/r1"].item() == pytest.approx(9.0, rel=1e-6)
    assert out.loss.item() == pytest.approx(18.0, rel=1e-6)
    assert out.loss.requires_grad  # it trains D: differentiable w.r.t. D's parameters through the gradient


class _ProductG(nn.Module):
    """w = z (times a parameter equal to 1, so w is in the graph); image = w[:4] * w[4] as 2x2 pixels. With the probe
    noise 1/sqrt(4) = 1/2 everywhere, d(sum(image * noise))/dw = (w4/2, w4/2, w4/2, w4/2, S/2), S = w0+..+w3."""

    def __init__(self):
        super().__init__()
        self.one = nn.Parameter(torch.ones(()))

    def forward(self, z, return_ws=False):
        w = z * self.one
        images = (w[:, :4] * w[:, 4:5]).reshape(-1, 1, 2, 2)
        return (images, w) if return_ws else images


def test_path_length_penalty_matches_a_hand_computation(monkeypatch):
    # The probe directions are randn / sqrt(H*W): ones here, so the lengths are known.
    monkeypatch.setattr(torch, "randn_like", lambda t, dtype=None: torch.ones_like(t, dtype=dtype))
    z = torch.tensor([[1.0, 1.0, 1.0, 1.0, 2.0], [1.0, 0.0, 0.0, 0.0, 1.0]])
    # |J^T y|^2 = 4 * (w4 / 2)^2 + (S / 2)^2 = w4^2 + S^2 / 4: 4 + 4 = 8 and 1 + 0.25 = 1.25.
    lengths = [math.sqrt(8.0), math.sqrt(1.25)]
    batch_mean = sum(lengths) / 2  # 1.973231
    pl_mean = 0.0 + 0.25 * (batch_mean - 0.0)  # decay 0.25 from 0 (0.5 would hide a swapped lerp): 0.493308
    penalty = sum((length - pl_mean) ** 2 for length in lengths) / 2  # 2.921533
    assert penalty == pytest.approx(2.921533, abs=1e-6)

    reg = PathLengthPenalty(weight=3.0, interval=4, decay=0.25, batch_shrink=1)
    out = reg.loss(_Loop(G=_ProductG()), {"z": z})
    assert out.logs["pl/mean"].item() == pytest.approx(pl_mean, rel=1e-6)
    assert out.logs["loss/pl"].item() == pytest.approx(penalty, rel=1e-5)
    assert out.loss.item() == pytest.approx(3.0 * penalty, rel=1e-5)  # weight 3: 8.764599
    # The running mean moves `decay` of the way again at the next call: 0.493308 + 0.25 * (1.973231 - 0.493308).
    again = reg.loss(_Loop(G=_ProductG()), {"z": z})
    assert again.logs["pl/mean"].item() == pytest.approx(pl_mean + 0.25 * (batch_mean - pl_mean), rel=1e-6)
    assert again.logs["pl/mean"].item() == pytest.approx(0.863288, abs=1e-6)
    # batch_shrink 2 keeps the first half of the batch: the first latent only.
    half = PathLengthPenalty(weight=1.0, decay=1.0, batch_shrink=2).loss(_Loop(G=_ProductG()), {"z": z})
    assert half.logs["pl/mean"].item() == pytest.approx(math.sqrt(8.0), rel=1e-6)


def test_path_length_takes_its_gradient_unscaled_so_fp16_does_not_overflow(monkeypatch):
    """Seen on an H200 with precision=16-mixed: the inner gradient taken at the GradScaler's 2**16 overflowed G's
    fp16 backward (every length inf, loss/pl NaN). NVlabs' pl_grads are unscaled. Here in fp16, w4 = 4: dL/dimage is
    1/2 a pixel, dL/dw0..3 = w4 / 2 = 2 (at 2**16 scale: 131072, past fp16's 65504); |J^T y| = sqrt(4 * 2^2 + 2^2)."""
    monkeypatch.setattr(torch, "randn_like", lambda t, dtype=None: torch.ones_like(t, dtype=dtype))
    z = torch.tensor([[1.0, 1.0, 1.0, 1.0, 4.0]], dtype=torch.float16)
    reg = PathLengthPenalty(weight=1.0, decay=1.0, batch_shrink=1)
    out = reg.loss(_Loop(G=_ProductG().half(), scale=2.0**16), {"z": z})
    assert out.logs["pl/mean"].item() == pytest.approx(math.sqrt(20.0), rel=1e-3)
    assert math.isfinite(out.logs["loss/pl"].item())


def test_a_non_finite_batch_leaves_the_path_length_mean_where_it_was(monkeypatch):
    """An overflowing batch (the GradScaler skips its step) must not poison pl_mean for the rest of the run."""
    monkeypatch.setattr(torch, "randn_like", lambda t, dtype=None: torch.ones_like(t, dtype=dtype))
    reg = PathLengthPenalty(weight=1.0, decay=0.25, batch_shrink=1)
    reg.loss(_Loop(G=_ProductG()), {"z": torch.tensor([[1.0, 1.0, 1.0, 1.0, 2.0]])})
    before = reg.pl_mean.item()
    assert before == pytest.approx(0.25 * math.sqrt(8.0), rel=1e-6)  # from 0, decay 0.25: 0.707107
    huge = reg.loss(_Loop(G=_ProductG()), {"z": torch.tensor([[1.0, 1.0, 1.0, 1.0, 1e38]])})  # length inf
    assert not math.isfinite(huge.logs["loss/pl"].item())
    assert reg.pl_mean.item() == before


class _TwoLayerG(nn.Module):
    """Per-layer ws [N, 2 layers, 2] (z copied to both layers); a 1x2 image: pixel 0 = 3 * ws[:, 0, 0] (layer 0 only),
    pixel 1 = ws[:, 1, 0] * ws[:, 1, 1] (layer 1 only)."""

    def __init__(self):
        super().__init__()
        self.one = nn.Parameter(torch.ones(()))

    def forward(self, z, return_ws=False):
        ws = z[:, None, :].expand(-1, 2, -1) * self.one
        images = torch.stack([3.0 * ws[:, 0, 0], ws[:, 1, 0] * ws[:, 1, 1]], dim=1).reshape(-1, 1, 1, 2)
        return (images, ws) if return_ws else images


def test_path_length_wrt_per_layer_ws_matches_nvlabs_by_hand(monkeypatch):
    """NVlabs training/loss.py (StyleGAN2Loss, Gpl): noise = randn / sqrt(H * W), grads w.r.t. gen_ws [N, num_ws,
    w_dim], pl_lengths = grads.square().sum(2).mean(1).sqrt(), pl_mean = pl_mean.lerp(lengths.mean(), 0.01),
    penalty (lengths - pl_mean)^2 times pl_weight 2, on gen_z[: N // 2] (pl_batch_shrink 2). The defaults here must
    be those constants (a summed instead of averaged layer axis, or H*W instead of its root, change the numbers)."""
    monkeypatch.setattr(torch, "randn_like", lambda t, dtype=None: torch.ones_like(t, dtype=dtype))
    # noise 1/sqrt(2) per pixel: layer 0's gradient (3/sqrt2, 0), layer 1's (ws11/sqrt2, ws10/sqrt2); the mean over
    # the 2 layers of their squared norms: (9 + ws10^2 + ws11^2) / 4. z = (1, 2): 14 / 4 = 3.5; z = (0, 0): 9 / 4.
    z = torch.tensor([[1.0, 2.0], [0.0, 0.0], [50.0, 50.0], [9.0, 9.0]])  # the last two are shrunk away
    lengths = [math.sqrt(3.5), 1.5]
    pl_mean = 0.01 * sum(lengths) / 2  # from 0, decay 0.01: 0.016854
    penalty = sum((length - pl_mean) ** 2 for length in lengths) / 2  # 2.818472
    assert pl_mean == pytest.approx(0.016854, abs=1e-6) and penalty == pytest.approx(2.818472, abs=1e-6)

    reg = PathLengthPenalty()
    assert (reg.weight, reg.interval, reg.decay, reg.batch_shrink) == (2.0, 4, 0.01, 2)
    out = reg.loss(_Loop(G=_TwoLayerG()), {"z": z})
    assert out.logs["pl/mean"].item() == pytest.approx(pl_mean, rel=1e-6)
    assert out.logs["loss/pl"].item() == pytest.approx(penalty, rel=1e-6)
    assert out.loss.item() == pytest.approx(2.0 * penalty, rel=1e-6)


def test_path_length_of_stylegan2_is_taken_wrt_the_ws_the_synthesis_network_read(monkeypatch):
    """Through the real generator: the penalty's lengths equal NVlabs' formula applied to the gradient w.r.t. a leaf
    ws tensor fed to G.synthesis (noise off, the probe fixed), and they differ from the gradient w.r.t. one shared w
    (which sums the layers' gradients instead of averaging their squared norms)."""
    from pixelsmith.gan.networks.stylegan2 import StyleGAN2Generator

    torch.manual_seed(0)
    G = StyleGAN2Generator(
        resolution=16, z_dim=8, w_dim=8, mapping_layers=1, channel_base=64, channel_max=8, use_noise=False
    ).eval()
    z = torch.randn(3, 8)
    probe = torch.randn(3, 1, 16, 16)
    monkeypatch.setattr(torch, "randn_like", lambda t, dtype=None: probe.clone())
    reg = PathLengthPenalty(
        weight=1.0, decay=1.0, batch_shrink=1
    )  # decay 1: pl_mean is this batch's mean length
    out = reg.loss(_Loop(G=G), {"z": z})

    ws = G.mapping(z).detach().clone().requires_grad_(True)
    (grads,) = torch.autograd.grad((G.synthesis(ws) * probe / 16.0).sum(), ws)
    lengths = grads.square().sum(2).mean(1).sqrt()
    torch.testing.assert_close(out.logs["pl/mean"], lengths.mean(), rtol=1e-5, atol=0)
    shared = grads.sum(1).square().sum(1).sqrt()  # d/dw of the same images when every layer reads one w
    assert (shared.mean() - lengths.mean()).abs() > 0.1 * lengths.mean()


def test_a_lazy_phase_multiplies_its_loss_by_its_interval(make_cfg, monkeypatch):
    """StyleGAN2's lazy regularisation: R1 every 4th iteration counts 4 times (gamma 2: 2 / 2 * 4 * penalty)."""
    cfg = make_cfg(f"{R1}.gamma=2.0", f"{R1}.interval=4", "precision=32-true", "augment=none")
    module = build_model(cfg, CoreSettings(precision="32-true"))
    backward = []
    monkeypatch.setattr(module, "loss_backward", lambda loss, name: backward.append((name, loss.detach())))
    monkeypatch.setattr(module, "step", lambda name: None)
    reals = torch.rand(4, 1, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    (phase,) = [p for p in module.objective.phases() if p.name == "Dreg"]
    assert phase.interval == 4
    logs = module.run_phase(phase, GANBatch(reals))
    ((name, loss),) = backward
    assert name == "D"
    # The logged penalty is unweighted; what trains D is gamma / 2 * interval times it.
    assert loss.item() == pytest.approx(2.0 / 2 * 4 * logs["loss/r1"].item(), rel=1e-5)


def test_lazy_regularisation_scales_the_lr_and_raises_the_betas():
    """R1 every 16 iterations: StyleGAN2's c = 16 / 17 multiplies the lr and is the power of each beta."""
    param = nn.Parameter(torch.zeros(3))
    factory = functools.partial(torch.optim.Adam, lr=0.002, betas=(0.5, 0.99))
    ratio = GANObjective(NonSaturatingLoss(), {"r1": R1Penalty(gamma=1.0, interval=16)}).lazy_ratio("D")
    assert ratio == pytest.approx(16 / 17)
    group = build_optimizer(factory, [param], lr_scale=ratio, betas_power=ratio).param_groups[0]
    assert group["lr"] == pytest.approx(0.002 * 16 / 17)  # 0.00188235
    # 0.5 ** (16/17) = 0.520808, 0.99 ** (16/17) = 0.990585: each beta closer to 1, not scaled like the lr.
    assert group["betas"][0] == pytest.approx(0.520808, abs=1e-6)
    assert group["betas"][1] == pytest.approx(0.990585, abs=1e-6)


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
    hardware = resolve_hardware(cfg)
    core = CoreSettings(
        max_steps=2, optimizer_impl="foreach", seed=7, log_every_n_steps=1, precision=precision
    )
    module = build_model(cfg, core)
    plain = build_plain_gan(cfg, hardware, "foreach")
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

    def loss(self, phase, loop, inputs):
        if phase.name == "Dmain":
            fake = loop.G_forward(inputs["z"], inputs["c_fake"], grad=False)
            real_logits = loop.D_forward(inputs["real"], inputs["c_real"], reals=True)
            loss = self.adversarial.discriminator(real_logits, loop.D_forward(fake, inputs["c_fake"]))
            return PhaseLoss(loss, {"loss/D": loss.detach()})
        if phase.name == "Gmain":
            fake = loop.G_forward(inputs["z"], inputs["c_fake"])
            loss = self.adversarial.generator(loop.D_forward(fake, inputs["c_fake"]))
            return PhaseLoss(loss, {"loss/G": loss.detach()})
        return super().loss(phase, loop, inputs)


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
