"""GAN objectives as phase tables: what a GAN iteration computes, apart from how the loop runs it.

An objective declares its phases (StyleGAN2-ADA's vocabulary: `Gmain`, `Greg`, `Dmain`, `Dreg`), each with the
network it trains and the interval it runs at, and computes each phase's loss for one micro-batch. The loop that
runs them (`GANModule.train_iteration`, and the benchmark's plain loop, which reuses the same objective so the two
cannot drift) owns everything else once: freezing the other network, micro-batches, the optimizer step at the end
of each phase, lazy-regularisation gain, eager networks for double backward, timing.

Built from parts chosen by `_target_` in `model.objective`:
- an adversarial loss: `NonSaturatingLoss` (StyleGAN2) or `HingeLoss` (SAGAN/BigGAN);
- regularisers, each a phase of its own: `R1Penalty` (Dreg) and `PathLengthPenalty` (Greg), lazily every
  `interval` iterations with the loss multiplied by the interval, as StyleGAN2 does.

A conditional GAN is a subclass that overrides `sample_inputs` (to carry labels from the batch) and the main
losses (to pass them to G and D); nothing in the module changes. See README "How to add your own GAN".
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)

NETWORKS = ("G", "D")


@dataclass(frozen=True)
class Phase:
    """One row of the phase table: `name` trains `network` ("G" or "D") every `interval` iterations; its optimizer
    steps once at the end of the phase. `interval > 1` is lazy regularisation: the loop multiplies the loss by the
    interval. `double_backward` phases differentiate through a gradient (R1, path length): the network runs eagerly
    there (a compiled backward is not differentiable) and stays gathered under FSDP."""

    name: str
    network: str
    interval: int = 1
    double_backward: bool = False
    # Runs per iteration, each with its own inputs (`GANBatch.draw`) and its own optimizer step: WGAN-GP's 5 critic
    # steps per generator step. An iteration is still one of `max_steps`.
    repeats: int = 1

    def runs_at(self, iteration: int) -> bool:
        return iteration % self.interval == 0


@dataclass
class PhaseLoss:
    """A phase's loss for one micro-batch (already weighted) and the values to log (means over micro-batches)."""

    loss: Tensor
    logs: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class GANBatch:
    """One iteration's data on the device: real images in [-1, 1], and labels when the loader yields them (a batch's
    third element: `(images, skipped_flags, labels)`), for conditional objectives. An objective whose phases each draw
    their own reals (`GANObjective.real_draws`) splits `reals` into that many equal draws (`real_draw`)."""

    reals: Tensor
    labels: Tensor | None = None
    draw: int = (
        0  # which run of a repeated phase this is (`Phase.repeats`): the objective picks its real draw by it
    )


class GANLoop(Protocol):
    """What a loop gives an objective while a phase runs (GANModule, and the plain benchmark loop)."""

    G: nn.Module
    D: nn.Module
    device: torch.device

    def G_forward(self, z: Tensor, *conditions: Tensor, grad: bool = True) -> Tensor:
        """G(z, *conditions) under autocast (timed as G_fwd); without autograd when `grad` is False."""

    def D_forward(self, images: Tensor, *conditions: Tensor, reals: bool = False) -> Tensor:
        """D(augment(images), *conditions) under autocast (timed as D_fwd); `reals` feeds ADA's heuristic."""

    def autocast(self) -> AbstractContextManager: ...

    def loss_scale(self) -> Tensor:
        """The fp16 GradScaler's scale as a device tensor (1 otherwise), for gradients taken inside a loss."""

    def mean_over_ranks(self, tensor: Tensor) -> Tensor:
        """The tensor averaged over data-parallel ranks (itself on one process)."""


# ---- adversarial losses ----------------------------------------------------------------------------------------
class AdversarialLoss:
    """The main D and G losses from D's logits, computed in float32 whatever the autocast dtype."""

    def discriminator(self, real_logits: Tensor, fake_logits: Tensor) -> Tensor:
        raise NotImplementedError

    def generator(self, fake_logits: Tensor) -> Tensor:
        raise NotImplementedError


class NonSaturatingLoss(AdversarialLoss):
    """Goodfellow et al. 2014's non-saturating loss (StyleGAN2's): softplus(-D(x)) + softplus(D(G(z)))."""

    def discriminator(self, real_logits: Tensor, fake_logits: Tensor) -> Tensor:
        return F.softplus(-real_logits.float()).mean() + F.softplus(fake_logits.float()).mean()

    def generator(self, fake_logits: Tensor) -> Tensor:
        return F.softplus(-fake_logits.float()).mean()


class HingeLoss(AdversarialLoss):
    """The hinge loss of SAGAN/BigGAN: relu(1 - D(x)) + relu(1 + D(G(z))) for D, -D(G(z)) for G."""

    def discriminator(self, real_logits: Tensor, fake_logits: Tensor) -> Tensor:
        return F.relu(1.0 - real_logits.float()).mean() + F.relu(1.0 + fake_logits.float()).mean()

    def generator(self, fake_logits: Tensor) -> Tensor:
        return -fake_logits.float().mean()


# ---- regularisers ------------------------------------------------------------------------------------------------
def r1_penalty(real_logits: Tensor, real_images: Tensor, loss_scale: float | Tensor = 1.0) -> Tensor:
    """Mean over the batch of ||dD(x)/dx||^2 at real images (Mescheder et al. 2018), differentiable w.r.t. D.

    Under fp16 the logits are multiplied by the GradScaler's scale before autograd.grad so small gradients do not
    flush to zero, and the gradients are divided by it again here.
    """
    (grads,) = torch.autograd.grad(real_logits.float().sum() * loss_scale, real_images, create_graph=True)
    grads = grads.float() / loss_scale
    return grads.square().sum(dim=[1, 2, 3]).mean()


class Regularizer(nn.Module):
    """A lazily applied regulariser: a phase of its own (`phase_name`) on `network`, every `interval` iterations.
    An nn.Module so state such as the path-length mean is saved in checkpoints with the model."""

    phase_name = ""
    network = ""
    inputs: tuple[str, ...] = ()  # what `sample_inputs` provides for its phase: "real" and/or "z"

    def __init__(self, interval: int):
        super().__init__()
        if int(interval) < 1:
            raise PixelsmithError(f"{type(self).__name__}: interval={interval} must be at least 1.")
        self.interval = int(interval)

    @property
    def enabled(self) -> bool:
        return True

    def loss(self, loop: GANLoop, inputs: Mapping[str, Tensor]) -> PhaseLoss:
        raise NotImplementedError


@functools.cache
def _forward_takes_return_ws(generator_class: type) -> bool:
    # Read once per class: inspect.signature costs tens of microseconds, and Greg runs every few iterations.
    return "return_ws" in inspect.signature(generator_class.forward).parameters


class R1Penalty(Regularizer):
    """R1 (Mescheder et al. 2018) on D at real images, as augmented for D: gamma / 2 * ||dD(x)/dx||^2 (StyleGAN2-ADA's
    Dreg). gamma = 0 turns the phase off; StyleGAN2-ADA's heuristic is gamma ~ 0.0002 * resolution^2 / batch."""

    phase_name = "Dreg"
    network = "D"
    inputs = ("real",)

    def __init__(self, gamma: float = 10.0, interval: int = 16):
        super().__init__(interval)
        if float(gamma) < 0:
            raise PixelsmithError(f"R1Penalty: gamma={gamma} must be >= 0 (0 turns R1 off).")
        self.gamma = float(gamma)

    @property
    def enabled(self) -> bool:
        return self.gamma > 0

    def loss(self, loop: GANLoop, inputs: Mapping[str, Tensor]) -> PhaseLoss:
        real = inputs["real"].detach().requires_grad_(True)
        logits = loop.D_forward(real)
        penalty = r1_penalty(logits, real, loop.loss_scale())
        return PhaseLoss(penalty * (self.gamma / 2), {"loss/r1": penalty.detach()})


class PathLengthPenalty(Regularizer):
    """StyleGAN2's path-length regularisation (Karras et al. 2020, sec. 3.2, eq. 4) on G (Greg): the Jacobian of the
    image w.r.t. w, probed with random image-space directions (N(0, 1) / sqrt(H * W)), is pushed towards a constant
    length `pl_mean` (a running mean with `decay` 0.01, averaged over ranks so every rank regularises towards the
    same value). `batch_shrink` runs it on a fraction of the batch. Needs a generator whose forward takes
    `return_ws=True` and returns (images, ws) (the StyleGAN2 one); it runs through that forward so FSDP gathers and
    reduces G as in every other phase.

    As NVlabs' `StyleGAN2Loss` (training/loss.py, Gpl): the gradient is taken w.r.t. the per-layer ws [N, num_ws,
    w_dim] (style mixing included), and a sample's length is sqrt(mean over layers of the sum over w_dim of the
    squared gradient); weight 2, every 4 iterations, half the batch. A generator returning one w [N, w_dim] gets the
    paper's eq. 4 w.r.t. that w."""

    phase_name = "Greg"
    network = "G"
    inputs = ("z",)

    def __init__(self, weight: float = 2.0, interval: int = 4, decay: float = 0.01, batch_shrink: int = 2):
        super().__init__(interval)
        if float(weight) < 0 or not 0 < float(decay) <= 1 or int(batch_shrink) < 1:
            raise PixelsmithError(
                f"PathLengthPenalty: weight={weight} must be >= 0, decay={decay} in (0, 1] and "
                f"batch_shrink={batch_shrink} at least 1."
            )
        self.weight = float(weight)
        self.decay = float(decay)
        self.batch_shrink = int(batch_shrink)
        self.register_buffer("pl_mean", torch.zeros(()))

    @property
    def enabled(self) -> bool:
        return self.weight > 0

    def loss(self, loop: GANLoop, inputs: Mapping[str, Tensor]) -> PhaseLoss:
        G = loop.G
        if not _forward_takes_return_ws(type(G)):
            raise PixelsmithError(
                f"PathLengthPenalty needs a generator whose forward takes return_ws=True and returns (images, w); "
                f"{type(G).__name__}'s does not. Use model=stylegan2, or set "
                "model.objective.regularizers.path_length.weight=0."
            )
        z = inputs["z"]
        z = z[: max(1, z.shape[0] // self.batch_shrink)]
        with loop.autocast():
            images, w = G(z, return_ws=True)
        noise = torch.randn_like(images, dtype=torch.float32) / math.sqrt(images.shape[2] * images.shape[3])
        # Unscaled, as NVlabs' pl_grads: the probe is already about 1/sqrt(H*W) a pixel, well inside fp16's range.
        # The fp16 GradScaler's 2**16 (R1's choice, whose gradient is small) overflowed G's fp16 backward here: on
        # an H200 (2026-11-26) every path length came back inf and the penalty NaN.
        (grads,) = torch.autograd.grad((images.float() * noise).sum(), w, create_graph=True)
        squared = grads.float().square().sum(dim=-1)
        if squared.ndim > 1:  # per-layer ws [N, layers, w_dim]: StyleGAN2's code averages over the layers
            squared = squared.mean(dim=1)
        lengths = squared.sqrt()
        batch_mean = loop.mean_over_ranks(lengths.detach().mean())
        with torch.no_grad():
            # A non-finite batch (an fp16 overflow the GradScaler will skip) must not poison the running mean for the
            # rest of the run: the mean keeps its value, decided on the device (no host read).
            moved = self.pl_mean.lerp(batch_mean.to(self.pl_mean.dtype), self.decay)
            self.pl_mean.copy_(torch.where(torch.isfinite(moved), moved, self.pl_mean))
        penalty = (lengths - self.pl_mean).square().mean()
        return PhaseLoss(
            penalty * self.weight, {"loss/pl": penalty.detach(), "pl/mean": self.pl_mean.detach().clone()}
        )


# ---- the objective ----------------------------------------------------------------------------------------------
class GANObjective(nn.Module):
    """An adversarial loss plus named regularisers, laid out as a phase table.

    `order` lists the networks' main phases in the order they run; each network's regularisers follow its main
    phase. `order=("D", "G")` (the default) gives Dmain, Dreg, Gmain, Greg: D first, DCGAN's habit and this
    template's behaviour since its first release. `order=("G", "D")` gives StyleGAN2-ADA's Gmain, Greg, Dmain, Dreg.
    """

    def __init__(
        self,
        loss: AdversarialLoss | None = None,
        regularizers: Mapping[str, Regularizer | None] | None = None,
        order: Sequence[str] = ("D", "G"),
    ):
        super().__init__()
        self.adversarial = loss if loss is not None else NonSaturatingLoss()
        if not isinstance(self.adversarial, AdversarialLoss):
            raise PixelsmithError(
                f"model.objective.loss is a {type(self.adversarial).__name__}, not an AdversarialLoss: give it "
                "`_target_: pixelsmith.gan.objectives.NonSaturatingLoss` (or HingeLoss, or a subclass of your own)."
            )
        if sorted(order) != sorted(NETWORKS):
            raise PixelsmithError(
                f"model.objective.order={list(order)} must name G and D once each, e.g. [D, G]."
            )
        self.order = tuple(order)
        regs = {name: reg for name, reg in (regularizers or {}).items() if reg is not None}
        for name, reg in regs.items():
            if not isinstance(reg, Regularizer) or reg.network not in NETWORKS:
                raise PixelsmithError(
                    f"model.objective.regularizers.{name} is not a Regularizer on G or D; give it a `_target_` "
                    "such as pixelsmith.gan.objectives.R1Penalty or PathLengthPenalty."
                )
        self.regularizers = nn.ModuleDict(regs)
        self._check_unique_phase_names()

    def _check_unique_phase_names(self) -> None:
        names = [p.name for p in self.phases()]
        if len(names) != len(set(names)):
            raise PixelsmithError(
                f"model.objective: phase names {names} repeat; two regularisers of one network need distinct "
                "`phase_name`s (a subclass attribute)."
            )

    def _active(self, network: str) -> list[Regularizer]:
        return [reg for reg in self.regularizers.values() if reg.network == network and reg.enabled]

    def phases(self) -> list[Phase]:
        """The phase table, in run order."""
        table = []
        for network in self.order:
            table.append(Phase(f"{network}main", network))
            table += [
                Phase(reg.phase_name, network, reg.interval, double_backward=True)
                for reg in self._active(network)
            ]
        return table

    def phases_at(self, iteration: int) -> list[Phase]:
        return [phase for phase in self.phases() if phase.runs_at(iteration)]

    def lazy_ratio(self, network: str) -> float:
        """A regularisation phase steps `network`'s optimizer (interval + 1) times per `interval` iterations (every
        iteration twice at interval 1); StyleGAN2 scales its lr by, and raises its Adam betas to,
        interval / (interval + 1) so the dynamics match a single-step run. 1 when no regulariser trains it."""
        ratio = 1.0
        for reg in self._active(network):  # interval 1 too: a separate phase is a second optimizer step
            ratio *= reg.interval / (reg.interval + 1)
        return ratio

    def interval_of(self, phase_name: str) -> int | None:
        """The interval of an active phase (e.g. "Dreg": lazy R1), None when the table has no such phase."""
        return next((p.interval for p in self.phases() if p.name == phase_name), None)

    def regularizer_of(self, phase: Phase) -> Regularizer | None:
        return next((r for r in self._active(phase.network) if r.phase_name == phase.name), None)

    # ---- what each phase needs and computes --------------------------------------------------------------------
    def sample_inputs(self, phase: Phase, batch: GANBatch, z_dim: int) -> dict[str, Tensor]:
        """The phase's whole-batch inputs (each split into micro-batches by the loop). Latents are drawn here, once
        per phase, from the iteration's seeded generator. A conditional objective adds its labels here."""
        reals = batch.reals
        wants = ("real", "z") if phase.name == "Dmain" else ("z",) if phase.name == "Gmain" else ()
        reg = self.regularizer_of(phase)
        if reg is not None:
            wants = reg.inputs
        inputs: dict[str, Tensor] = {}
        if "real" in wants:
            inputs["real"] = reals
        if "z" in wants:
            inputs["z"] = torch.randn(reals.shape[0], z_dim, device=reals.device)
        return inputs

    def sample_conditions(self, count: int, device: torch.device) -> tuple[Tensor, ...]:
        """What G takes besides z when sampling (sample grids, FID evaluation): nothing for an unconditional GAN; a
        conditional objective returns e.g. (labels,) spread over the classes."""
        del count, device
        return ()

    def loss(self, phase: Phase, loop: GANLoop, inputs: Mapping[str, Tensor]) -> PhaseLoss:
        if phase.name == "Dmain":
            fake = loop.G_forward(inputs["z"], grad=False)
            real_logits = loop.D_forward(inputs["real"], reals=True)
            fake_logits = loop.D_forward(fake)
            loss = self.adversarial.discriminator(real_logits, fake_logits)
            return PhaseLoss(
                loss,
                {
                    "loss/D": loss.detach(),
                    "logits/real": real_logits.detach().float().mean(),
                    "logits/fake": fake_logits.detach().float().mean(),
                },
            )
        if phase.name == "Gmain":
            loss = self.adversarial.generator(loop.D_forward(loop.G_forward(inputs["z"])))
            return PhaseLoss(loss, {"loss/G": loss.detach()})
        reg = self.regularizer_of(phase)
        if reg is None:
            raise PixelsmithError(f"{type(self).__name__} has no phase {phase.name!r}.")
        return reg.loss(loop, inputs)

    def real_draws(self) -> int:
        """Real batches an iteration draws from the loader: its batch holds them side by side (data.batch_size is
        their sum) and `real_draw` hands each phase run its own. 1 here: every phase shares the batch. R3GAN: 2
        (D's step, G's step); WGAN-GP: n_critic (one per critic step)."""
        return 1

    def real_draw(self, batch: GANBatch, index: int) -> tuple[Tensor, Tensor | None]:
        """The reals (and labels) of draw `index` of the loader batch."""
        draws = self.real_draws()
        size, rest = divmod(batch.reals.shape[0], draws)
        if size == 0 or rest:
            raise PixelsmithError(
                f"{type(self).__name__} draws {draws} real batches an iteration from one loader batch: this "
                f"process's micro-batch of {batch.reals.shape[0]} images (data.batch_size / processes / ...) must be "
                f"a multiple of {draws}. Set data.batch_size to {draws} x the reference's batch x the processes."
            )
        part = slice(index * size, (index + 1) * size)
        return batch.reals[part], None if batch.labels is None else batch.labels[part]

    def images_per_iteration(self, batch_size: int) -> int:
        """The images an iteration counts (kimg, the EMA's half-life, the schedules, throughput) out of a loader batch
        of `batch_size`: the real images D's main phase trains on, over all its runs (one draw each). All of the
        batch for an objective whose phases share it; for R3GAN half (its reference counts D's batch); for WGAN-GP
        all n_critic draws."""
        draws = self.real_draws()
        runs = sum(phase.repeats for phase in self.phases() if phase.name == "Dmain") if draws > 1 else 1
        return batch_size // draws * runs

    def scheduled_scalars(self) -> dict[str, Tensor]:
        """This objective's hyper-parameters that `model.schedules` may move (name -> a 0-dim buffer the loss reads,
        so a CUDA-graph replay sees each new value): none here; R3GAN's `gamma`, WGAN-GP's `gp_weight`."""
        return {}


# ---- R3GAN ------------------------------------------------------------------------------------------------------
class R3GANObjective(GANObjective):
    """R3GAN (Huang et al. 2024; `brownvc/R3GAN`, `R3GAN/Trainer.py`): the relativistic pairing loss with R1 and R2.

    - Dmain: mean over the batch of softplus(-(D(x_real) - D(x_fake))) + gamma / 2 * (R1 + R2), R1 and R2 the squared
      gradient norms (summed over C, H, W) of D at the reals and at the G-detached fakes, taken w.r.t. the images
      *before* augmentation (D_forward augments inside, so the gradient runs through it), on every D step.
    - Gmain: mean of softplus(-(D(x_fake) - D(x_real))) on a real batch of its own: the loader batch holds two draws
      (`real_draws` 2: data.batch_size = 2 x the reference's batch), the first for D's step and the second for G's.
      D(x_real) is a constant there: D is frozen outside its own step and the reals need no gradient.
    - gamma is a buffer the loss reads; `model.schedules.gamma` moves it (the presets: a cosine over 20M images,
      counted as the reference does, one batch of the D step an iteration, `images_per_iteration`).

    Regularisers and a separate loss are not part of R3GAN: any the config brings (`+model/objective=r3gan` over a
    model whose objective has them) are named at start-up and not run.
    """

    def __init__(
        self,
        gamma: float = 0.05,
        order: Sequence[str] = ("D", "G"),
        c_dim: int = 0,
        loss: AdversarialLoss | None = None,
        regularizers: Mapping[str, Regularizer | None] | None = None,
    ):
        _name_what_is_not_run(type(self).__name__, "R1 and R2 are part of its D step", loss, regularizers)
        super().__init__(NonSaturatingLoss(), {}, order)
        if float(gamma) < 0 or int(c_dim) < 0:
            raise PixelsmithError(f"R3GANObjective: gamma={gamma} and c_dim={c_dim} must be >= 0.")
        # Class-conditional (the networks' c_dim): each draw's labels condition its reals and its fakes alike, so
        # the relativistic pairs are of one class; sample grids and FID cycle through the classes.
        self.c_dim = int(c_dim)
        # Not persistent: the config or model.schedules.gamma gives it at every start.
        self.register_buffer("gamma", torch.tensor(float(gamma)), persistent=False)

    def phases(self) -> list[Phase]:
        # Dmain differentiates through D's input gradient (R1, R2) every iteration.
        return [Phase(f"{network}main", network, double_backward=network == "D") for network in self.order]

    def real_draws(self) -> int:
        return 2

    def scheduled_scalars(self) -> dict[str, Tensor]:
        return {"gamma": self.gamma}

    def sample_inputs(self, phase: Phase, batch: GANBatch, z_dim: int) -> dict[str, Tensor]:
        own, labels = self.real_draw(batch, 0 if phase.name == "Dmain" else 1)
        inputs = {"real": own, "z": torch.randn(own.shape[0], z_dim, device=own.device)}
        if self.c_dim:
            if labels is None:
                raise PixelsmithError(
                    f"R3GAN is class-conditional here (model.objective.c_dim={self.c_dim}), but the data yields no "
                    "labels: use labelled data (data=mnist data.labels=true), or set model.generator.c_dim=0."
                )
            inputs["c"] = labels
        return inputs

    def sample_conditions(self, count: int, device: torch.device) -> tuple[Tensor, ...]:
        if not self.c_dim:
            return ()
        return (torch.arange(count, device=device) % self.c_dim,)

    def loss(self, phase: Phase, loop: GANLoop, inputs: Mapping[str, Tensor]) -> PhaseLoss:
        c = (inputs["c"],) if "c" in inputs else ()
        if phase.name == "Gmain":
            fake_logits = loop.D_forward(loop.G_forward(inputs["z"], *c), *c).float()
            with torch.no_grad():
                real_logits = loop.D_forward(inputs["real"], *c).float()
            loss = F.softplus(-(fake_logits - real_logits)).mean()
            return PhaseLoss(loss, {"loss/G": loss.detach()})
        if phase.name != "Dmain":
            raise PixelsmithError(f"R3GANObjective has no phase {phase.name!r}.")
        real = inputs["real"].detach().requires_grad_(True)
        fake = loop.G_forward(inputs["z"], *c, grad=False).detach().requires_grad_(True)
        real_logits = loop.D_forward(real, *c, reals=True).float()
        fake_logits = loop.D_forward(fake, *c).float()
        # One autograd.grad for both penalties (their sums are independent); under fp16 the GradScaler's scale keeps
        # small gradients from flushing to zero and is divided out again, as r1_penalty does.
        scale = loop.loss_scale()
        real_grad, fake_grad = torch.autograd.grad(
            (real_logits.sum() + fake_logits.sum()) * scale, [real, fake], create_graph=True
        )
        r1 = (real_grad.float() / scale).square().sum(dim=[1, 2, 3])
        r2 = (fake_grad.float() / scale).square().sum(dim=[1, 2, 3])
        gamma = self.gamma.float()
        adversarial = F.softplus(-(real_logits - fake_logits))
        loss = (adversarial + gamma / 2 * (r1 + r2)).mean()
        return PhaseLoss(
            loss,
            {
                "loss/D": adversarial.detach().mean(),
                "loss/r1": r1.detach().mean(),
                "loss/r2": r2.detach().mean(),
                "r3gan/gamma": gamma.detach(),
                "logits/real": real_logits.detach().mean(),
                "logits/fake": fake_logits.detach().mean(),
            },
        )


def _name_what_is_not_run(
    objective: str,
    why: str,
    loss: AdversarialLoss | None,
    regularizers: Mapping[str, Regularizer | None] | None,
) -> None:
    """An objective with its own loss and penalties, composed over a model whose objective node brings a loss or
    regularisers (`model=stylegan2 +model/objective=wgan_gp` merges into stylegan2's R1 and path length): say at
    start-up what will not run, rather than run it beside the objective's own or drop it unseen."""
    named = sorted(name for name, reg in (regularizers or {}).items() if reg is not None and reg.enabled)
    if named or loss is not None:
        parts = ([f"model.objective.regularizers {named}"] if named else []) + (
            [f"model.objective.loss ({type(loss).__name__})"] if loss is not None else []
        )
        log.warning(
            "%s does not run %s: %s. Remove them (~model.objective.regularizers ~model.objective.loss) to silence this.",
            objective,
            " or ".join(parts),
            why,
        )


# ---- WGAN-GP ----------------------------------------------------------------------------------------------------
class WGANGPObjective(GANObjective):
    """WGAN-GP (Gulrajani et al. 2017, "Improved Training of Wasserstein GANs", Algorithm 1): `n_critic` critic steps
    per generator step, each on a real batch of its own (`real_draws` = n_critic: data.batch_size = n_critic x the
    paper's batch), then one generator step.

    - Dmain (repeated n_critic times): mean D(x_fake) - mean D(x_real) + gp_weight * mean((||grad D(x_hat)||_2 - 1)^2),
      x_hat = e x_real + (1 - e) x_fake with e ~ U(0, 1) per sample; the gradient is taken w.r.t. x_hat before
      augmentation (D_forward augments inside), as R3GAN's penalties.
    - Gmain: -mean D(G(z)).
    - `gp_weight` is a buffer, so `model.schedules.gp_weight` may move it.

    The paper's hyper-parameters: lambda 10, n_critic 5, Adam lr 1e-4, betas (0, 0.9) (`conf/model/objective/
    wgan_gp.yaml` sets the optimizers too). An iteration is one generator step; it counts the n_critic draws' images.
    """

    def __init__(
        self,
        n_critic: int = 5,
        gp_weight: float = 10.0,
        order: Sequence[str] = ("D", "G"),
        loss: AdversarialLoss | None = None,
        regularizers: Mapping[str, Regularizer | None] | None = None,
    ):
        _name_what_is_not_run(
            type(self).__name__, "its gradient penalty is part of its critic step", loss, regularizers
        )
        if int(n_critic) < 1 or float(gp_weight) < 0:
            raise PixelsmithError(
                f"WGANGPObjective: n_critic={n_critic} must be at least 1 and gp_weight={gp_weight} >= 0."
            )
        self.n_critic = int(n_critic)  # before the base class reads the phase table
        super().__init__(NonSaturatingLoss(), {}, order)
        self.register_buffer("gp_weight", torch.tensor(float(gp_weight)), persistent=False)

    def phases(self) -> list[Phase]:
        return [
            Phase("Dmain", "D", double_backward=True, repeats=self.n_critic)
            if network == "D"
            else Phase("Gmain", "G")
            for network in self.order
        ]

    def real_draws(self) -> int:
        return self.n_critic

    def scheduled_scalars(self) -> dict[str, Tensor]:
        return {"gp_weight": self.gp_weight}

    def sample_inputs(self, phase: Phase, batch: GANBatch, z_dim: int) -> dict[str, Tensor]:
        reals, _ = self.real_draw(batch, batch.draw if phase.name == "Dmain" else 0)
        inputs = {"z": torch.randn(reals.shape[0], z_dim, device=reals.device)}
        if phase.name == "Dmain":
            inputs["real"] = reals
            inputs["mix"] = torch.rand(reals.shape[0], 1, 1, 1, device=reals.device)
        return inputs

    def loss(self, phase: Phase, loop: GANLoop, inputs: Mapping[str, Tensor]) -> PhaseLoss:
        if phase.name == "Gmain":
            loss = -loop.D_forward(loop.G_forward(inputs["z"])).float().mean()
            return PhaseLoss(loss, {"loss/G": loss.detach()})
        if phase.name != "Dmain":
            raise PixelsmithError(f"WGANGPObjective has no phase {phase.name!r}.")
        real = inputs["real"]
        fake = loop.G_forward(inputs["z"], grad=False).detach()
        real_logits = loop.D_forward(real, reals=True).float()
        fake_logits = loop.D_forward(fake).float()
        mix = inputs["mix"].to(real.dtype)
        between = (mix * real.detach() + (1 - mix) * fake.to(real.dtype)).requires_grad_(True)
        scale = loop.loss_scale()
        (grad,) = torch.autograd.grad(
            loop.D_forward(between).float().sum() * scale, between, create_graph=True
        )
        norms = (grad.float() / scale).flatten(1).norm(dim=1)
        penalty = (norms - 1.0).square().mean()
        critic = fake_logits.mean() - real_logits.mean()
        return PhaseLoss(
            critic + self.gp_weight.float() * penalty,
            {
                "loss/D": critic.detach(),
                "loss/gp": penalty.detach(),
                "wgan/distance": -critic.detach(),
                "logits/real": real_logits.detach().mean(),
                "logits/fake": fake_logits.detach().mean(),
            },
        )
