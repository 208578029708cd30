"""GANModule: a GAN on the shared TrainingCore, its iteration run from the objective's phase table.

The objective (`model.objective`, `pixelsmith.gan.objectives`) declares the phases (Dmain, Dreg, Gmain, Greg: which
network each trains, how often) and computes their losses. This module runs them, the same way for every objective:
the other network frozen, `accumulate` micro-batches, the loss multiplied by the phase's interval (lazy
regularisation), one optimizer step at the end of the phase, eager networks and gathered weights for phases that
differentiate a gradient, and the step-time breakdown's phases (G_fwd, D_fwd, D_bwd, G_bwd, D_reg, G_reg, opt_step)
timed here once. Augmentation (DiffAugment/ADA) is applied to every image D sees, inside the iteration, on the batch's
device, and G's gradients flow through it; ADA adjusts p once D has trained this iteration. The core ends the
iteration (EMA of G after buffers are synced across ranks, schedules, logging, guard, stopping).
"""

from __future__ import annotations

import inspect
import logging
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from torch import nn
from torchvision.utils import make_grid

from pixelsmith.core.config import CoreSettings, EMAConfig, OptimizerConfig, as_config
from pixelsmith.core.contract import IterationResult, OptimizerDefinition
from pixelsmith.core.module import TrainingCore
from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.objectives import GANBatch, GANObjective, Phase

log = logging.getLogger(__name__)


class GANModule(TrainingCore):
    supports_cuda_graphs = True  # iteration_plan names the phases due and ADA's adjustment (core/graphs.py)
    # The step-time breakdown's rows (R1 in D_reg, path length in G_reg; augment is nested in D_fwd/D_reg).
    breakdown_regions = ("augment", "G_fwd", "D_fwd", "D_bwd", "D_reg", "G_bwd", "G_reg")

    def __init__(
        self,
        core: CoreSettings,
        generator: Any,
        discriminator: Any,
        objective: Any = None,
        name: str = "gan",
        g_optimizer: Any = None,
        d_optimizer: Any = None,
        ema: Any = None,
        sample_grid_size: int = 64,
        schedules: Any = None,
        augment: nn.Module | None = None,
        init_from: str | None = None,
        _target_: str | None = None,  # accepted so a config node can be passed whole
    ):
        super().__init__(core)
        self.model_name = name
        # Optimizer partials (config nodes or callables, core/optim.py); a None or a partial node (e.g. only `lr`)
        # takes the schema's defaults (Adam, lr 2e-4, betas 0.5/0.999), as the composed config does.
        self.g_optimizer, self.d_optimizer = (
            o if callable(o) else as_config(OptimizerConfig, o) for o in (g_optimizer, d_optimizer)
        )
        ema_cfg = as_config(EMAConfig, ema)
        self.generator = generator if isinstance(generator, nn.Module) else instantiate(generator)
        self.discriminator = (
            discriminator if isinstance(discriminator, nn.Module) else instantiate(discriminator)
        )
        self.objective = build_objective(objective)
        self.augment = augment
        self.z_dim = int(self.generator.z_dim)
        self.G_ema = self.add_ema("G", self.generator, ema_cfg)
        if init_from:  # fine-tuning: G, D and G_ema start from a published or earlier network
            from pixelsmith.gan.pretrained import init_module_from

            init_module_from(self, str(init_from))
        self._timing_forwards = True  # off inside regularisation phases, which are timed whole
        self._parameter_lists: dict[nn.Module, list[nn.Parameter]] = {}  # `_set_trainable`'s, per network
        self._plan: tuple[tuple[str, ...], bool] | None = (
            None  # iteration_plan's, for the coming train_iteration
        )
        # Fixed latents for sample grids: a buffer, so a resumed run draws the very same grid.
        gen = torch.Generator().manual_seed(core.seed)
        self.register_buffer("sample_z", torch.randn(sample_grid_size, self.z_dim, generator=gen))
        if "augment_p" in (schedules or {}) and getattr(augment, "target", None) is not None:
            raise PixelsmithError(
                f"model.schedules.augment_p sets ADA's p, but augment.target={augment.target} adapts it: set "
                "augment.target=null for a scheduled p (R3GAN's presets do)."
            )
        self.add_schedules(schedules)
        self._check_batch(core)

    @staticmethod
    def registers_on_load(key: str) -> bool:
        """State a network adds as it loads it, so a checkpoint holding it fits a freshly built model: the noise maps
        of a StyleGAN2 converted from an NVlabs pickle (`SynthesisLayer.noise_const`)."""
        return key.endswith(".noise_const")

    def _check_batch(self, core: CoreSettings) -> None:
        """At start-up (a training run's core carries its config and hardware settings), refuse a micro-batch D's minibatch
        standard deviation or the objective's draws cannot use, naming the batch sizes that work."""
        run = core.run_config or {}
        hardware = run.get("runtime_plan") or {}
        batch = (run.get("data") or {}).get("batch_size") or hardware.get("batch_size")
        processes = int(hardware.get("devices") or 1) * int(hardware.get("num_nodes") or 1)
        if not batch or batch % processes:
            return  # no run config (evaluation, a test's module); an indivisible batch is refused by the data
        draws = self.objective.real_draws()
        per_process = batch // processes
        if per_process % draws:
            raise PixelsmithError(
                f"{type(self.objective).__name__} draws {draws} real batches an iteration from one loader batch, so "
                f"this process's micro-batch (data.batch_size={batch} over {processes} process(es): {per_process}) "
                f"must be a multiple of {draws}: e.g. data.batch_size={draws * processes * max(1, per_process // draws)}."
            )
        seen = per_process // draws  # the images D sees in one forward
        group = int(getattr(self.discriminator, "mbstd_group_size", 0) or 0)
        used = min(group, seen)
        if group <= 1 or (used > 1 and seen % used == 0 and used == group):
            return
        key = "model.discriminator.mbstd_group_size"
        fits = max(g for g in range(1, group + 1) if seen % g == 0)
        if used > 1 and seen % used == 0:  # fewer images than a group: NVlabs' min(group, batch), said once
            log.warning(
                "%s=%d, but D sees %d images per forward (data.batch_size=%d over %d process(es)): its minibatch "
                "standard deviation is taken over groups of %d (NVlabs' min(group, batch)).",
                key,
                group,
                seen,
                batch,
                processes,
                used,
            )
            return
        why = (
            "a group of 1 has no spread: the feature would be a constant and D would see no batch statistic"
            if used == 1
            else f"NVlabs' StyleGAN2 takes min(group, batch) = {used} images a group and needs the batch to be a "
            "multiple of it"
        )
        raise PixelsmithError(
            f"{key}={group} does not fit the {seen} images D sees per forward (data.batch_size={batch} over "
            f"{processes} process(es)): {why}. Use data.batch_size={group * draws * processes * max(1, -(-seen // group))} "
            f"(a multiple of {group * draws * processes}), or {key}={fits}"
            + (" to say you mean no batch statistic" if fits == 1 else "")
            + "."
        )

    def check_data(self, datamodule: Any) -> None:
        """A class-conditional model (its objective's or generator's c_dim > 0) needs labels, and labels below c_dim:
        one_hot would otherwise fail at the first iteration, after sample grids and logs were written."""
        c_dim = int(getattr(self.objective, "c_dim", 0) or getattr(self.generator, "c_dim", 0) or 0)
        label_classes = getattr(datamodule, "label_classes", None)
        classes = label_classes() if callable(label_classes) and c_dim else None
        if classes == 0:
            raise PixelsmithError(
                f"model.generator.c_dim={c_dim} makes the model class-conditional, but the data yields no labels: "
                "set data.labels=true (labelled data: data=mnist, or an archive prepared from class subfolders), "
                "or model.generator.c_dim=0 for an unconditional model."
            )
        if classes is not None and classes > c_dim:
            raise PixelsmithError(
                f"The data's labels span {classes} classes (0..{classes - 1}), but model.generator.c_dim={c_dim} "
                f"conditions on {c_dim}: a label of {c_dim} or more has no one-hot slot. Set "
                f"model.generator.c_dim={classes}, or data.labels=false for an unconditional run."
            )

    # ---- TrainingCore contract -----------------------------------------------------------------------------------
    def networks(self) -> dict[str, nn.Module]:
        nets = {"G": self.generator, "D": self.discriminator}
        if self.G_ema is not None:
            nets["G_ema"] = self.G_ema.model
        return nets

    def optimizer_definitions(self) -> list[OptimizerDefinition]:
        ratio = self.objective.lazy_ratio
        return [
            OptimizerDefinition(
                "G", list(self.generator.parameters()), self.g_optimizer, ratio("G"), ratio("G")
            ),
            OptimizerDefinition(
                "D", list(self.discriminator.parameters()), self.d_optimizer, ratio("D"), ratio("D")
            ),
        ]

    def schedule_targets(self) -> dict[str, Any]:
        """The core's (lr, betas, EMA half-life), the objective's own scalars (R3GAN's `gamma`, WGAN-GP's
        `gp_weight`: `GANObjective.scheduled_scalars`), and `augment_p`: ADA's p, fixed rather than adapted
        (`augment.target=null`), as R3GAN's presets ramp it."""
        targets = super().schedule_targets()
        for name, buffer in self.objective.scheduled_scalars().items():
            targets[name] = partial(_set_buffer, buffer)
        if self.augment is not None and hasattr(self.augment, "set_p"):
            targets["augment_p"] = self.augment.set_p
        return targets

    # ---- what the objective calls (pixelsmith.gan.objectives.GANLoop) ----------------------------------------------
    @property
    def G(self) -> nn.Module:
        return self.generator

    @property
    def D(self) -> nn.Module:
        return self.discriminator

    def _forward_region(self, name: str):
        return self.region(name) if self._timing_forwards else nullcontext()

    def G_forward(self, z: torch.Tensor, *conditions: torch.Tensor, grad: bool = True) -> torch.Tensor:
        grad_enabled = torch.set_grad_enabled(grad and torch.is_grad_enabled())
        with self._forward_region("G_fwd"), grad_enabled, self.autocast(), self.startup.network("G"):
            images = self.generator(z, *conditions)
        # Without a gradient no backward holds the images for D: under inductor's CUDA graphs D's replay would
        # overwrite them before D reads them (Dmain's fakes, seen on an H200).
        return images if grad else self.keep_compiled_output(images)

    def D_forward(self, images: torch.Tensor, *conditions: torch.Tensor, reals: bool = False) -> torch.Tensor:
        with self._forward_region("D_fwd"), self.autocast():
            if self.augment is not None:
                with self.region("augment"):
                    images = self.augment(images)
            with self.startup.network("D"):
                logits = self.discriminator(self.in_network_layout(images), *conditions)
        if reals and self.augment is not None:
            self.augment.observe_real_logits(logits.detach())
        return logits

    def loss_scale(self) -> torch.Tensor:
        # The GradScaler's scale as a device tensor (scale() of a one): get_scale() would make the host wait.
        return self.mixed_precision.scale(torch.ones((), device=self.device))

    def mean_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size <= 1:
            return tensor
        return self.world_all_reduce(tensor.detach().clone()) / self.world_size

    # ---- the iteration ---------------------------------------------------------------------------------------------
    def iteration_plan(self, batch: Any) -> tuple[tuple[str, ...], bool]:
        """The phases due at this iteration (lazy regularisers every few) and whether ADA adjusts p in it; ADA's
        host-side count advances here, once per iteration, replayed or not."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        phases = tuple(phase.name for phase in self.objective.phases_at(self.iteration))
        adapts = False
        if self.augment is not None:
            if self.graphed and hasattr(self.augment, "skip_when_off"):
                self.augment.skip_when_off = False  # the same kernels at p = 0 as after (see AdaptiveAugment)
            # The images D trains on (R3GAN: one of its two draws), as the kimg count.
            adapts = self.augment.advance(
                self.objective.images_per_iteration(images.shape[0]) * self.world_size
            )
        self._plan = (phases, adapts)
        return self._plan

    def iteration_kind(self) -> str:
        lazy = [p.name for p in self.objective.phases_at(self.iteration) if p.interval > 1]
        return "common" if not lazy else "r1" if lazy == ["Dreg"] else "+".join(lazy)

    def lazy_interval(self) -> int | None:
        return self.objective.interval_of("Dreg")  # None when R1 is off

    def train_iteration(self, batch: Any) -> IterationResult:
        images = batch[0] if isinstance(batch, list | tuple) else batch
        if isinstance(batch, list | tuple) and len(batch) > 1:
            self.count_skipped_files(batch[1])
        # The plan made for this iteration (a caller that drives train_iteration alone gets one made here).
        phase_names, adapts = self._plan if self._plan is not None else self.iteration_plan(batch)
        self._plan = None
        with self.region("h2d"):
            reals = self.prepare_images(images)
            labels = (
                batch[2].to(self.device, non_blocking=True)
                if isinstance(batch, list | tuple) and len(batch) > 2
                else None
            )
        data = GANBatch(reals, labels)
        phases = [phase for phase in self.objective.phases() if phase.name in phase_names]
        last_d = max((i for i, p in enumerate(phases) if p.network == "D"), default=-1)
        logs: dict[str, torch.Tensor] = {}
        for index, phase in enumerate(phases):
            for draw in range(phase.repeats):  # WGAN-GP's critic: n_critic steps, each on its own draw
                data.draw = draw
                logs.update(self.run_phase(phase, data))
            if index == last_d and self.augment is not None:
                self.augment.apply_update(
                    self.objective.images_per_iteration(reals.shape[0]) * self.world_size,
                    adapts,
                    self.world_all_reduce if self.world_size > 1 else None,
                )
        return IterationResult(self.objective.images_per_iteration(reals.shape[0]), logs)

    def abandon_iteration(self) -> None:
        super().abandon_iteration()
        if self.augment is not None:
            self.augment.discard_pending()

    def _set_trainable(self, network: torch.nn.Module, trainable: bool) -> None:
        """`network.requires_grad_(trainable)` over its parameter list, gathered once: `requires_grad_` walks every
        submodule each call, a host cost per phase that grows with the network's depth. The list is taken at the
        first phase, after the networks are compiled or sharded (which keep or replace parameters before then)."""
        parameters = self._parameter_lists.get(network)
        if parameters is None:
            parameters = self._parameter_lists[network] = list(network.parameters())
        for parameter in parameters:
            parameter.requires_grad_(trainable)

    def run_phase(self, phase: Phase, batch: GANBatch) -> dict[str, torch.Tensor]:
        """One phase: its network trainable and the other frozen (its backward then skips the other's
        gradients), `accumulate` micro-batches, one optimizer step. Returns the phase's logs (micro-batch means)."""
        trained = self.networks()[phase.network]
        frozen = self.discriminator if phase.network == "G" else self.generator
        sums: dict[str, torch.Tensor] = {}
        regularising = phase.double_backward
        # A regularisation phase is one breakdown row (StyleGAN2-ADA's Dreg/Greg: forward, gradient, double backward).
        whole = self.region(f"{phase.network}_reg") if regularising else nullcontext()
        try:
            self._set_trainable(frozen, False)
            self._set_trainable(trained, True)
            inputs = self.objective.sample_inputs(phase, batch, self.z_dim)
            chunks = {key: self.micro_batches(value) for key, value in inputs.items()}
            self._timing_forwards = not regularising
            with whole, self.double_backward(trained) if regularising else nullcontext():
                for micro in range(self.core.accumulate):
                    # A main phase's forwards share one autocast region: D's bf16 weight casts are made once and
                    # its real and fake passes use the same copies (autocast's cast cache), as a hand-written step
                    # does. Regularisation phases keep their gradient-of-gradient outside autocast.
                    with nullcontext() if regularising else self.autocast():
                        out = self.objective.loss(
                            phase, self, {key: parts[micro] for key, parts in chunks.items()}
                        )
                    loss = out.loss * phase.interval if phase.interval != 1 else out.loss
                    with nullcontext() if regularising else self.region(f"{phase.network}_bwd"):
                        self.loss_backward(loss, phase.network)
                    for key, value in out.logs.items():
                        value = value.detach()
                        if value.dtype != torch.float32:  # no call where it is float32 already (host time)
                            value = value.float()
                        if (
                            self.core.accumulate != 1
                        ):  # a division by 1 would be a kernel that changes nothing
                            value = value / self.core.accumulate
                        sums[key] = sums[key] + value if key in sums else value
        finally:
            self._timing_forwards = True
            self._set_trainable(frozen, True)
        with self.region("opt_step"):
            self.step(phase.network)
        return sums

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        # A checkpoint from before an objective's state existed (e.g. the path-length mean, added with
        # model.objective) lacks its keys: they start from their initial values, as in a fresh run.
        state = checkpoint.get("state_dict", {})
        current = self.state_dict()
        for key, value in current.items():
            if key.startswith("objective.") and key not in state:
                state[key] = value
                log.info("The checkpoint has no %s (written before it existed): starting it afresh.", key)
        for key in [k for k in state if k.startswith("objective.") and k not in current]:
            # State an objective no longer keeps (R3GAN's own image count, now the core's schedules').
            del state[key]
            log.info(
                "The checkpoint's %s is no longer used by %s: dropped.", key, type(self.objective).__name__
            )

    def logging_values(self) -> dict[str, float]:
        # ADA's p and r_t live on the device; read them only when the iteration logs.
        if self.augment is None:
            return {}
        if self.device.type == "cpu":  # host values already: reading them tightens ADA's bound on p for free
            return {f"augment/{k}": v for k, v in self.augment.stats().items()}
        # On a GPU the device tensors, staged with the other logged values and read an interval later.
        return {"augment/p": self.augment.p, "augment/rt": self.augment.last_rt}

    # ---- sampling ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, z: torch.Tensor, use_ema: bool = True) -> torch.Tensor:
        """Images in [-1, 1] from latents, with the EMA generator when there is one."""
        net = self.G_ema.model if (use_ema and self.G_ema is not None) else self.generator
        was_training = net.training
        net.eval()
        try:
            conditions = self.objective.sample_conditions(
                z.shape[0], self.device
            )  # labels of a conditional GAN
            with self.autocast():
                return net(z.to(self.device), *conditions).float().clamp(-1, 1)
        finally:
            net.train(was_training)

    def sample_grid(self) -> torch.Tensor:
        """A [C, H, W] grid in [0, 1] from the fixed latents; used by the sample-grid callback."""
        images = self.generate(self.sample_z)
        nrow = max(1, int(round(images.shape[0] ** 0.5)))
        return make_grid(images.add(1).div(2), nrow=nrow, padding=2, pad_value=1.0).cpu()


def _set_buffer(buffer: torch.Tensor, value: float | torch.Tensor) -> None:
    """A scheduled scalar into its buffer: copied on the device inside a replay, filled from the host's float
    otherwise (neither waits for the device)."""
    if torch.is_tensor(value):
        buffer.copy_(value)
    else:
        buffer.fill_(value)


def build_objective(node: Any) -> GANObjective:
    """`model.objective` as an objective: given as one, None (the default GANObjective), or a config node whose keys
    are checked against its `_target_` class's arguments first, so a misspelled key of any objective (the shipped
    ones or a fork's, none of which is registered anywhere) fails at start-up naming the keys it takes."""
    if isinstance(node, GANObjective):
        return node
    if node is None:
        return GANObjective()
    if not hasattr(node, "get"):
        raise PixelsmithError(
            f"model.objective={node!r} is not an objective's config: give a node with a _target_ (e.g. "
            "pixelsmith.gan.objectives.GANObjective), or +model/objective=r3gan|wgan_gp."
        )
    # No _target_: the default objective, whose keys (loss, regularizers, order) a model's YAML gives alone.
    target = node.get("_target_") or "pixelsmith.gan.objectives.GANObjective"
    node = {**node, "_target_": target}
    try:
        cls = get_class(target)
    except Exception as error:  # Hydra wraps the import error
        raise PixelsmithError(f"model.objective._target_={target!r} cannot be imported: {error}") from None
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(k for k in node if not k.startswith("_") and k not in accepted)
    if unknown and not takes_any:
        names = [name for name in accepted if name != "self"]
        raise PixelsmithError(
            f"model.objective has key(s) {unknown} that {cls.__name__} does not take; it takes: {', '.join(names)}."
        )
    objective = instantiate(node)
    if not isinstance(objective, GANObjective):
        raise PixelsmithError(
            f"model.objective._target_={target} built a {type(objective).__name__}, not a GANObjective subclass."
        )
    return objective
