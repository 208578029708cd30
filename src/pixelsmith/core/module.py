"""TrainingCore: the LightningModule base every Pixelsmith model inherits (GAN, style transfer, a fork's own).

It owns what is easy to get subtly wrong with manual optimization, once:
- an iteration counter (`self.iteration`), saved in checkpoints, that drives schedules, EMA, `max_steps`, sampling
  and checkpoint cadence (Lightning's `global_step` counts every optimizer step, #17958);
- mixed precision with its own GradScaler (see `core/precision.py`), clipping on unscaled gradients (#18089);
- gradient accumulation: the loader yields `accumulate` micro-batches' worth per iteration, split here;
- gradient all-reduce per optimizer (no DDP wrapper, see `core/strategy.py`) or, under `strategy=fsdp`, FSDP2
  per network (`core/fsdp.py`: reduce-scatter on the last micro-batch only), a non-finite guard that skips, counts
  and finally stops, warmup+cosine schedules, channels_last and `torch.compile` of the networks (not of the module);
- per-iteration seeding from (seed, rank, iteration), so resuming from a checkpoint continues bit-for-bit;
- named phases (`with self.phase("G_fwd"):`) that a profiler callback can time; a no-op by default.

A subclass implements `optimizer_definitions()` (name -> parameters and an optimizer partial), `networks()` (what to
put in channels_last and compile) and `train_iteration(batch)`, in which it calls `self.loss_backward(loss, name)` for
each micro-batch and `self.step(name)` once per optimizer, and returns an `IterationResult` (images trained on, values
to log). The core's `training_step` calls it and then ends the iteration itself (counter, schedules, EMA, logging,
guard, stopping): there is no bookkeeping call a model could forget. A backward left without its step is an error.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from pixelsmith.core.budget import TimeBudget
from pixelsmith.core.config import EMAConfig, ScalarScheduleConfig, ScheduleConfig
from pixelsmith.core.ema import EMA
from pixelsmith.core.fsdp import MultiNetworkFSDPStrategy
from pixelsmith.core.graphs import IterationGraphs
from pixelsmith.core.host_reads import host_reads_allowed
from pixelsmith.core.optim import build_optimizer, optimizer_factory
from pixelsmith.core.precision import MixedPrecision
from pixelsmith.core.preemption import PreemptionSignals, stop_message
from pixelsmith.core.schedules import ScalarSchedule, build_scheduler
from pixelsmith.core.startup import StartupReport, compile_cache_note
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


class NonFiniteError(PixelsmithError, RuntimeError):
    """Raised after too many consecutive non-finite steps; checkpoints written before it are kept intact."""


@dataclass
class CoreSettings:
    """Everything the core needs that is not model-specific; built by `pixelsmith.run.fit` from the run config."""

    precision: str = "32-true"
    accumulate: int = 1
    max_steps: int = 1000
    clip_grad_norm: float | None = None
    nonfinite_max_consecutive: int = 20
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    channels_last: bool = False
    compile: bool = False
    compile_mode: str = "default"
    compile_scope: str = "network"  # network | blocks (each block a network's compile_units() names)
    cuda_graphs: bool = False  # hardware.cuda_graphs: the iteration replayed as CUDA graphs (core/graphs.py)
    seed: int = 42
    log_every_n_steps: int = 10
    optimizer_impl: str = (
        "foreach"  # Adam implementation: fused | foreach | for_loop | auto (hardware.optimizer_impl)
    )
    run_config: dict[str, Any] | None = None  # the resolved run config, stored in every checkpoint
    # train.time_budget_minutes: training also ends at the first iteration past it (core/budget.py)
    time_budget: TimeBudget = field(default_factory=TimeBudget)
    # train.preemption.signals: these end the run after the current iteration with last.ckpt (core/preemption.py)
    preemption_signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1", "SIGUSR2")
    preemption_check_every_n_steps: int | None = None  # None: at logging iterations


@dataclass
class OptimizerDefinition:
    name: str
    params: list[nn.Parameter]
    # an optimizer config node (`_target_`, `_partial_`, lr, betas ...; see core/optim.py) or a partial/callable
    optimizer: Any = None
    lr_scale: float = 1.0  # e.g. lazy regularisation's interval / (interval + 1)
    betas_power: float = 1.0  # lazy regularisation raises Adam betas to this power


@dataclass
class IterationResult:
    """What `train_iteration` returns: images this rank trained on, and device values to log (held until the next
    logging iteration; read by the host only there)."""

    images: int
    logs: dict[str, Any] = field(default_factory=dict)
    # Set by the core: gradient all-reduces this iteration made (a replayed graph makes them without Python).
    grad_allreduce_calls: int = field(default=0, repr=False)


def _mix_seed(seed: int, rank: int, iteration: int) -> int:
    # A fixed affine mix keeps seeds distinct per (rank, iteration) and reproducible across runs and resumes.
    return (seed * 1_000_003 + rank * 7_919 + iteration * 104_729) % (2**63 - 1)


class TrainingCore(L.LightningModule):
    # True when `iteration_plan` names every host decision of an iteration, so `hardware.cuda_graphs` may capture
    # it (core/graphs.py); a model that leaves it False runs eagerly, saying so at start-up.
    supports_cuda_graphs = False
    # The step-time breakdown's rows for this model's own phases (`with self.phase(name):`), in the order they are
    # shown (perf/breakdown.py); a phase recorded but not listed is shown after these, in order of appearance.
    breakdown_phases: tuple[str, ...] = ()

    def __init__(self, core: CoreSettings):
        super().__init__()
        self.automatic_optimization = False
        if core.accumulate < 1:
            raise ValueError(f"accumulate={core.accumulate} must be at least 1.")
        self.core = core
        self.iteration = 0
        # The non-finite guard's device state (`_guard_state`): counters, consecutive skips per optimizer (a D that
        # never steps while G does must still stop the run) and the trip point; filled lazily on the device.
        self._guard: dict[str, torch.Tensor] | None = None
        self._guard_names: list[str] = []
        self._guard_from_host: dict[str, Any] | None = (
            None  # from a checkpoint, until the device state exists
        )
        self._guard_reported = 0  # skipped steps already warned about
        self._guard_checked_at = 0  # the iteration of the last check
        self._host_synced_this_iteration = False
        self._optimizer_index: dict[str, int] = {}
        self._float_buffers: dict[str, list[torch.Tensor]] = {}
        self._losses: dict[str, list[torch.Tensor]] = {}  # each optimizer's micro-batch losses since its step
        self._backward_calls: dict[str, int] = {}  # loss_backward calls per optimizer since its last step
        self._precision: MixedPrecision | None = None
        self._pending_precision_state: dict | None = None
        self._phase_timer = None
        self._ema_pairs: list[tuple[str, EMA, nn.Module]] = []
        self.images_seen = 0
        self.skipped_files: torch.Tensor | int = 0
        self._last_log_point: tuple[float, int] | None = None  # (perf_counter, images_seen) at the last log
        self._pending_logs: dict[str, Any] = {}  # the step's logs, held until the next logging iteration
        self.grad_allreduce_calls = 0
        # For host-side draws (crop offsets, indices): reseeded with the torch generators every iteration, and a
        # Python draw never makes the host wait for the device as `int(torch.randint(...))` on a GPU tensor could.
        self.host_random = random.Random(core.seed)
        self.preemption = PreemptionSignals(core.preemption_signals)
        self.preempted_by: int | None = None  # the signal that ended training, once it has
        # hardware.cuda_graphs (core/graphs.py): set up in on_train_start, None when the run launches eagerly. The
        # iteration number and images seen then also live on the device, advanced inside the captured iteration.
        self._graphs: IterationGraphs | None = None
        # compile_mode=reduce-overhead / max-autotune without hardware.cuda_graphs: inductor's own CUDA graphs
        # (cudagraph trees), whose outputs a later replay may overwrite (`keep_compiled_output`).
        self.inductor_cuda_graphs = False
        self._iteration_t: torch.Tensor | None = None
        self._images_seen_t: torch.Tensor | None = None
        self._allreduces_this_iteration = 0
        # model.schedules: hyper-parameters moved by the images seen (core/schedules.py), set at each iteration's
        # start; `_lr_scale_and_betas_power` keeps each optimizer's lazy-regularisation scaling for them.
        self._schedules: dict[str, ScalarSchedule] = {}
        self._lr_scale_and_betas_power: dict[str, tuple[float, float]] = {}
        self._schedule_setters: dict[str, Callable[[float | torch.Tensor], None]] = {}
        # Where the start-up went (core/startup.py): compile per network, each plan's first run and capture.
        self.startup = StartupReport()

    # ---- what a subclass provides ------------------------------------------------------------------------------
    def networks(self) -> dict[str, nn.Module]:
        """Trainable networks to convert to channels_last and to compile."""
        raise NotImplementedError

    def optimizer_definitions(self) -> list[OptimizerDefinition]:
        raise NotImplementedError

    def train_iteration(self, batch: Any) -> IterationResult:
        """One iteration: `loss_backward` per micro-batch and `step` per optimizer; the core ends the iteration."""
        raise NotImplementedError

    def iteration_plan(self, batch: Any) -> Hashable:
        """What the host decides for the coming iteration before it runs (e.g. which phases are due), and host-side
        bookkeeping that must happen once per iteration whether it runs eagerly or is replayed from a CUDA graph.
        Iterations with equal plans (and batch shapes) must launch the same kernels: each plan gets one graph. Called
        every iteration, before `train_iteration`; a model that sets `supports_cuda_graphs` overrides it."""
        del batch
        return None

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """Lightning's hook, owned by the core: the model's `train_iteration` with the end of the iteration's device
        work (EMA, buffer sync), replayed as a CUDA graph under `hardware.cuda_graphs`, then the host's end."""
        plan = self.iteration_plan(batch)
        if self.inductor_cuda_graphs:
            # Nothing a compiled network returned in the last iteration is read again: say so to inductor's cudagraph
            # trees rather than leave them to guess the iteration's start from pending backwards.
            torch.compiler.cudagraph_mark_step_begin()
        graphs = self._graphs
        if graphs is not None and self._phase_timer is not None:
            graphs.give_up("a profiler (profiler=breakdown|torch) times the phases on the host")
        # A plan's first run compiles (and waits) anyway: only then is it timed, with a device synchronisation.
        first_run = self.startup.plan_is_new(plan)
        if first_run:
            with host_reads_allowed():
                self.startup.plan_started(self.device)
        if graphs is None:
            result = self._device_iteration(batch)
        else:
            captures = graphs.captures
            result = graphs.run(plan, batch, self._device_iteration, reset=self._abandon_iteration)
            if graphs.captures > captures:
                self.startup.plan_captured(plan, graphs.last_capture_s)
        if first_run:
            with host_reads_allowed():
                self.startup.plan_ran(plan, self.device)
        self._end_iteration(result.images, result.logs, result.grad_allreduce_calls)
        self.startup.iteration_done(self.iteration)

    def _device_iteration(self, batch: Any) -> IterationResult:
        """The model's iteration and the device half of its end (buffer sync, EMA): what a CUDA graph captures."""
        self._allreduces_this_iteration = 0
        scheduled = self._apply_schedules()
        result = self.train_iteration(batch)
        if not isinstance(result, IterationResult):
            raise PixelsmithError(
                f"{type(self).__name__}.train_iteration returned {type(result).__name__}; return "
                "IterationResult(images=<images this rank trained on>, logs={...})."
            )
        unstepped = sorted(name for name, calls in self._backward_calls.items() if calls)
        if unstepped:
            raise PixelsmithError(
                f"{type(self).__name__}.train_iteration called loss_backward for optimizer(s) {unstepped} without "
                "self.step(name) after them: their gradients would leak into the next iteration. Call "
                "self.step(name) once after each optimizer's micro-batches."
            )
        images_per_iteration = result.images * self.world_size
        self._sync_buffers()
        # The EMA ramp-up reads the images seen before this iteration, as StyleGAN2-ADA's training loop (cur_nimg
        # advances after the G_ema update): the first iteration's average is a copy of G. Under CUDA graphs the
        # device's own count, which a replay can read (the host's it cannot).
        images_seen = self._images_seen_t if self._graphs is not None else self.images_seen
        for name, ema, source in self._ema_pairs:
            with self.phase("ema"):
                result.logs[f"ema/{name}_beta"] = ema.update(source, images_per_iteration, images_seen)
        if self._graphs is not None:
            self._images_seen_t.add_(images_per_iteration)
            self._iteration_t.add_(1)
        result.grad_allreduce_calls = self._allreduces_this_iteration
        result.logs.update(scheduled)
        return result

    def _abandon_iteration(self) -> None:
        """Forget the host state of an iteration that did not finish (a CUDA-graph capture that failed part-way),
        so it can run again eagerly: pending backward counts and flags, unscaled-optimizer marks, gradients."""
        self._backward_calls.clear()
        self._losses.clear()
        scaler = self.mixed_precision.scaler
        if scaler is not None:
            from torch.amp.grad_scaler import _refresh_per_optimizer_state

            scaler._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        for name in self._optimizer_index:
            self._raw_optimizer(name).zero_grad(set_to_none=True)

    def check_data(self, datamodule: Any) -> None:
        """Refuse data this model cannot train on (labels a conditional model needs, classes beyond its c_dim), at
        start-up: train.py calls it once the data's own checks passed, before the run writes anything. Nothing to
        check here; a model with such needs overrides it."""
        del datamodule

    def shard_units(self, name: str, network: nn.Module) -> list[nn.Module]:
        """Under strategy=fsdp: sub-modules of `network` (from `networks()`) to shard as FSDP units of their own,
        innermost first (e.g. a StyleGAN's synthesis blocks). Each unit is gathered just before it runs and freed
        after, capping peak memory at one block's weights instead of one network's. Default: none, the whole
        network is one unit (one all-gather per forward). Return the matching blocks for an EMA copy too."""
        del name, network
        return []

    # ---- scheduled hyper-parameters (model.schedules) -------------------------------------------------------------
    def schedule_targets(self) -> dict[str, Callable[[float | torch.Tensor], None]]:
        """Every hyper-parameter `model.schedules` may name, each with the setter that writes a value into the run:
        a Python float in an eager run, a device tensor under `hardware.cuda_graphs` (computed inside the replay).
        The core's: `lr`, `beta1`, `beta2` (every optimizer) and `<optimizer>_lr` / `_beta1` / `_beta2` (one), as
        the config gives them (each optimizer's lazy-regularisation scaling is applied here), and
        `ema_half_life_kimg` (every EMA). A subclass adds its own (the GAN: its objective's, `augment_p`)."""
        targets: dict[str, Callable[[float | torch.Tensor], None]] = {}
        names = [spec.name for spec in self.optimizer_definitions()]
        for key in ("lr", "beta1", "beta2"):
            targets[key] = partial(self._set_optimizer_value, names, key)
            for name in names:
                targets[f"{name}_{key}"] = partial(self._set_optimizer_value, [name], key)
        if self._ema_pairs:
            targets["ema_half_life_kimg"] = self._set_ema_half_life
        return targets

    def add_schedules(self, schedules: Any) -> None:
        """Schedule the hyper-parameters named in `schedules` (`model.schedules`: name -> ScalarScheduleConfig node).
        Called by a subclass once its networks, optimizers' definitions and objective exist; an unknown name fails
        here, at start-up, with the names this model takes."""
        schedules = dict(schedules or {})
        if not schedules:
            return
        targets = self.schedule_targets()
        unknown = sorted(set(schedules) - set(targets))
        if unknown:
            raise PixelsmithError(
                f"model.schedules names {unknown}, which this model ({type(self).__name__}) cannot schedule. It "
                f"schedules: {', '.join(targets)}."
            )
        lr_keys = [key for key in schedules if key == "lr" or key.endswith("_lr")]
        if lr_keys and self.core.schedule.name != "constant":
            raise PixelsmithError(
                f"model.schedules.{lr_keys[0]} and schedule={self.core.schedule.name} would both set the learning "
                "rate: choose one (schedule=constant keeps the model's schedule alone)."
            )
        for name, node in schedules.items():
            self._schedules[name] = ScalarSchedule.from_config(_schedule_config(name, node), name)
        self._schedule_setters = {name: targets[name] for name in self._schedules}

    def _apply_schedules(self) -> dict[str, Any]:
        """Write every scheduled value for the coming iteration, read at the images seen before it (as R3GAN's
        training loop): on the host from its exact count in an eager run (no device read), on the device from the
        device's count under `hardware.cuda_graphs` (the replay computes it). Returns them for the logs."""
        if not self._schedules:
            return {}
        count = self._images_seen_t if self._graphs is not None else self.images_seen
        values = {}
        for name, schedule in self._schedules.items():
            value = schedule.value(count)
            self._schedule_setters[name](value)
            values[f"schedule/{name}"] = value
        return values

    def _set_optimizer_value(self, names: list[str], key: str, value: float | torch.Tensor) -> None:
        for name in names:
            lr_scale, betas_power = self._lr_scale_and_betas_power.get(name, (1.0, 1.0))
            for group in self._raw_optimizer(name).param_groups:
                if key == "lr":
                    scaled = value * lr_scale
                    if torch.is_tensor(group["lr"]):
                        group["lr"].copy_(scaled)
                    else:
                        group["lr"] = float(scaled)
                    continue
                index = 0 if key == "beta1" else 1
                if "betas" not in group:
                    raise PixelsmithError(
                        f"model.schedules.{key}: optimizer {name} ({type(self._raw_optimizer(name)).__name__}) has "
                        "no betas to schedule."
                    )
                powered = value**betas_power
                betas = list(group["betas"])
                if torch.is_tensor(betas[index]):
                    betas[index].copy_(powered)
                else:
                    betas[index] = float(powered)
                group["betas"] = tuple(betas)

    def _set_ema_half_life(self, value: float | torch.Tensor) -> None:
        for _, ema, _ in self._ema_pairs:
            ema.set_half_life_kimg(value)

    def add_ema(self, name: str, source: nn.Module, config: EMAConfig) -> EMA | None:
        """Create an EMA of `source` that the core updates at the end of every iteration (after buffers are synced
        across ranks). Assign the result to an attribute so it is part of the state_dict; None when disabled."""
        if not config.enabled:
            return None
        ema = EMA(source, config.half_life_kimg, config.rampup)
        self._ema_pairs.append((name, ema, source))
        return ema

    # ---- set-up -----------------------------------------------------------------------------------------------
    @property
    def mixed_precision(self) -> MixedPrecision:
        if self._precision is None:
            self._precision = MixedPrecision(self.core.precision, self.device.type)
            if self._pending_precision_state is not None:
                self._precision.load_state_dict(self._pending_precision_state)
        return self._precision

    def keep_compiled_output(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`, safe to read after other compiled networks have run. Under inductor's CUDA graphs (compile_mode
        reduce-overhead or max-autotune) a network's output lives in the graphs' shared pool, and an inference
        call's (no backward pending) is overwritten by the next replay: on an H200 D read G's overwritten fakes
        ("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"). Then it is cloned;
        otherwise returned as it is."""
        return tensor.clone() if self.inductor_cuda_graphs else tensor

    def configure_model(self) -> None:
        if self.core.channels_last and self._fsdp is not None:
            # FSDP2 refuses non-contiguous parameters and gathers them contiguous anyway; convolutions still pick
            # NHWC kernels from channels_last inputs (prepare_images), so only the weights stay NCHW.
            log.info("strategy=fsdp: channels_last applies to activations only, weights stay contiguous.")
        # EMA copies only sample and evaluate, at batch sizes of their own, every few hundred iterations: compiled,
        # they would cost a compile per batch size (and mark the batch dynamic) for work that takes seconds eagerly.
        averages = {id(ema.model) for _, ema, _ in self._ema_pairs}
        compiled = [name for name, net in self.networks().items() if id(net) not in averages]
        if self.core.compile and compiled:
            self.startup.install()
            if self.global_rank == 0:
                log.info("%s", compile_cache_note(_compile_cache_dir(), compiled))
        for name, net in self.networks().items():
            if self.core.channels_last and self._fsdp is None:
                net.to(memory_format=torch.channels_last)
            if self.core.compile and name in compiled:
                # nn.Module.compile compiles in place: state_dict keys keep their names (no `_orig_mod.`).
                mode = _compile_mode_under_graphs(self.core.compile_mode, self.core.cuda_graphs)
                self.inductor_cuda_graphs = mode in INDUCTOR_CUDA_GRAPH_MODES
                units = compile_units(net, self.core.compile_scope)
                log.info(
                    "Compiling %s (mode=%s, %s)",
                    name,
                    mode,
                    "whole" if units == [net] else f"{len(units)} blocks, each its own graph",
                )
                # dynamic=False: a batch of another size (the path-length batch, an evaluation) is a static graph of
                # its own, never a dynamic-shape graph that every later iteration would run slower.
                for unit in units:
                    unit.compile(mode=mode, dynamic=False)
        if self._fsdp is not None:
            # After compile, as torchtitan does (compile per block, then fully_shard).
            self._fsdp.shard_networks(self)

    @property
    def _fsdp(self) -> MultiNetworkFSDPStrategy | None:
        strategy = self._trainer.strategy if self._trainer is not None else None
        return strategy if isinstance(strategy, MultiNetworkFSDPStrategy) else None

    def keep_unsharded(self, *modules: nn.Module):
        """Under FSDP the weights of `modules` stay gathered until the block ends (a double backward needs them
        after the first backward). A no-op for every other strategy. Most phases want `double_backward`."""
        return self._fsdp.keep_unsharded(*modules) if self._fsdp is not None else nullcontext()

    @contextmanager
    def double_backward(self, *modules: nn.Module) -> Iterator[None]:
        """Wrap a phase that differentiates through a gradient (R1, path length) of `modules`.

        - Compiled networks run their eager forward inside the block: AOTAutograd's compiled backward is not itself
          differentiable ("torch.compile with aot_autograd does not currently support double backward"; the
          gradient from `autograd.grad(create_graph=True)` comes back without a grad_fn). The other phases keep the
          compiled code; a lazy regulariser runs every 4-16 iterations, so eager costs little there.
        - Under FSDP the weights stay gathered until the block ends (`keep_unsharded`).
        """
        with self.keep_unsharded(*modules), eager(*modules):
            yield

    def configure_optimizers(self):
        impl = self.core.optimizer_impl
        optimizers, schedulers = [], []
        schedule = self.core.schedule
        total = schedule.total_steps or self.core.max_steps
        for index, spec in enumerate(self.optimizer_definitions()):
            factory = optimizer_factory(spec.optimizer, f"optimizer {spec.name}")
            opt = build_optimizer(factory, spec.params, spec.lr_scale, spec.betas_power, impl)
            self._lr_scale_and_betas_power[spec.name] = (spec.lr_scale, spec.betas_power)
            self._optimizer_index[spec.name] = index
            owned = {id(p) for p in spec.params}
            self._float_buffers[spec.name] = [
                b
                for net in self.networks().values()
                if any(id(p) in owned for p in net.parameters())
                for b in net.buffers()
                if b.is_floating_point()
            ]
            optimizers.append(opt)
            schedulers.append(
                build_scheduler(opt, schedule.name, schedule.warmup_steps, total, schedule.min_lr_ratio)
            )
        # A network trained by two optimizers must not have its buffers averaged twice.
        seen: set[int] = set()
        for name, group in self._float_buffers.items():
            self._float_buffers[name] = [b for b in group if not (id(b) in seen or seen.add(id(b)))]
        return optimizers, schedulers

    def _raw_optimizer(self, name: str) -> torch.optim.Optimizer:
        # The raw optimizer, not Lightning's wrapper: the core steps it through its own scaler.
        optimizers = self.optimizers(use_pl_optimizer=False)
        if not isinstance(optimizers, list):  # Lightning unwraps a single optimizer
            optimizers = [optimizers]
        return optimizers[self._optimizer_index[name]]

    def _schedulers(self) -> list:
        scheds = self.lr_schedulers()
        if scheds is None:
            return []
        return scheds if isinstance(scheds, list) else [scheds]

    # ---- helpers used inside training_step ---------------------------------------------------------------------
    def autocast(self):
        return self.mixed_precision.autocast()

    def phase(self, name: str):
        """Context that a profiler callback times (`self._phase_timer` set by it); free when none is attached."""
        return self._phase_timer(name) if self._phase_timer is not None else nullcontext()

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [0, 255] from the loader -> float in [-1, 1] on the device, in the networks' memory format."""
        images = images.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = images.float().mul_(1.0 / 127.5).sub_(1.0)
        return self.in_network_layout(images)

    def in_network_layout(self, images: torch.Tensor) -> torch.Tensor:
        """`images` in the networks' memory format with canonical strides. A compiled network guards on strides: real
        images and G's output must match exactly or D compiles twice. With one channel, channels_last and contiguous
        tensors address memory alike but differ in the channel stride, which `.contiguous()` leaves as it is: the
        NHWC view below sets it, with no copy and a backward that is a view too (as_strided's is a slow scatter)."""
        if not (self.core.channels_last and images.ndim == 4):
            return images
        images = images.contiguous(memory_format=torch.channels_last)
        n, c, h, w = images.shape
        if images.stride() == (c * h * w, 1, w * c, c) or images.numel() == 0:
            return images
        return images.permute(0, 2, 3, 1).reshape(n, h * w * c).view(n, h, w, c).permute(0, 3, 1, 2)

    def count_skipped_files(self, flags: torch.Tensor) -> None:
        """Accumulate the loader's per-item "substituted for an unreadable file" flags into data/skipped_files."""
        count = flags.detach().sum()
        if torch.is_tensor(self.skipped_files) and self.skipped_files.device == count.device:
            self.skipped_files.add_(count)  # in place: a replayed CUDA graph adds into the same tensor
        else:
            self.skipped_files = count + self.skipped_files

    def micro_batches(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        n = self.core.accumulate
        if tensor.shape[0] % n:
            raise ValueError(
                f"A batch of {tensor.shape[0]} does not split into accumulate={n} micro-batches."
            )
        return list(tensor.chunk(n))

    def loss_backward(self, loss: torch.Tensor, name: str) -> None:
        """Backward of one micro-batch's mean loss for optimizer `name`; gradients average over micro-batches."""
        # Kept, not checked here: `step` folds the losses into the gradient norm's finite check (one check an
        # optimizer step, not a chain of scalar kernels a micro-batch).
        self._losses.setdefault(name, []).append(loss.detach())
        calls = self._backward_calls[name] = self._backward_calls.get(name, 0) + 1
        if self._fsdp is not None:
            # FSDP2 reduce-scatters inside backward: only on the last micro-batch, the earlier ones accumulate
            # locally (the DDP path communicates in `step` and needs no switch).
            for net in self.networks().values():
                if isinstance(net, FSDPModule):
                    net.set_requires_gradient_sync(calls >= self.core.accumulate)
        # A division by 1 would be a kernel that changes nothing.
        scaled = loss if self.core.accumulate == 1 else loss / self.core.accumulate
        self.manual_backward(self.mixed_precision.scale(scaled))

    def _params_of(self, opt: torch.optim.Optimizer) -> Iterator[nn.Parameter]:
        for group in opt.param_groups:
            yield from group["params"]

    def _all_reduce_gradients(self, params: list[nn.Parameter], loss_flag: torch.Tensor) -> torch.Tensor:
        """Average gradients (and OR the non-finite loss flags) across ranks in one flat all-reduce."""
        world = self.trainer.world_size if self._trainer is not None else 1
        if world <= 1:
            return loss_flag
        # FSDP2 has already averaged the gradients of sharded (DTensor) parameters in backward; only the flag
        # (and any parameter outside the sharded networks) is reduced here.
        params = [p for p in params if not isinstance(p, DTensor)]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads] + [loss_flag.reshape(1).float()])
        torch.distributed.all_reduce(flat)
        self._allreduces_this_iteration += 1
        flat.div_(world)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g).to(g.dtype)
            offset += n
        return flat[-1] * world

    def _sync_buffers(self) -> None:
        """Average floating buffers (BatchNorm statistics, StyleGAN's w_avg) of the trained networks once per
        iteration: without a DDP wrapper nobody broadcasts them, and ranks would drift apart (EMA copies them)."""
        if self.world_size <= 1:
            return
        buffers = [b for group in self._float_buffers.values() for b in group]
        if not buffers:
            return
        flat = torch.cat([b.reshape(-1).float() for b in buffers])
        torch.distributed.all_reduce(flat)
        flat.div_(self.world_size)
        offset = 0
        for b in buffers:
            b.copy_(flat[offset : offset + b.numel()].view_as(b))
            offset += b.numel()

    def step(self, name: str) -> torch.Tensor:
        """All-reduce, unscale, check, clip and apply optimizer `name`.

        Returns a device bool tensor, True where the step was applied. With fused Adam (every hardware profile) the
        whole step stays on the device: the skip decision reaches the fused kernel as its `found_inf`, which leaves
        the weights, moments and step count as they were, and the guard's counters are device tensors read only at
        logging iterations (`_check_guard`). Other Adam implementations need the host to decide (one sync a step).
        """
        opt = self._raw_optimizer(name)
        params = [p for p in self._params_of(opt) if p.requires_grad]
        calls = self._backward_calls.pop(name, 0)
        if self._fsdp is not None and 0 < calls < self.core.accumulate:
            raise PixelsmithError(
                f"Optimizer {name} stepped after {calls} loss_backward call(s) with accumulate="
                f"{self.core.accumulate}: under strategy=fsdp gradients are synchronised on the accumulate-th "
                "call, so call self.loss_backward(loss, name) once per micro-batch (see self.micro_batches)."
            )
        losses = self._losses.pop(name, [])
        # Non-finite exactly where one of the losses is (a sum of finite losses stays finite).
        loss_term = losses[0] if len(losses) == 1 else sum(losses[1:], losses[0]) if losses else None
        if self.world_size > 1:
            flag = (
                _nonfinite(loss_term).float()
                if loss_term is not None
                else torch.zeros((), device=self.device)
            )
            flag = self._all_reduce_gradients(params, flag)  # every rank's flags, so all skip alike
            loss_term = torch.where(flag > 0, float("nan"), 0.0)
        scaler = self.mixed_precision.scaler
        if scaler is not None:
            scaler.unscale_(opt)  # after the all-reduce, so every rank sees the same inf/NaN and skips alike
        with_grad = [p for p in params if p.grad is not None]
        grads = [p.grad for p in with_grad]
        norm = _global_norm(grads) if grads else torch.zeros((), device=self.device)
        amp_overflow = None
        if scaler is not None:
            # The guard tells an fp16 overflow (finite loss, non-finite gradients) from a guard event.
            grads_bad = _nonfinite(norm)
            loss_bad = _nonfinite(loss_term) if loss_term is not None else torch.zeros_like(grads_bad)
            skip = loss_bad | grads_bad
            amp_overflow = grads_bad & ~loss_bad
        else:
            # One check for losses and gradients: the sum is non-finite exactly where either is (a finite norm is far
            # below float32's range: its squares would have overflowed first).
            skip = _nonfinite(norm if loss_term is None else norm + loss_term)
        if self.core.clip_grad_norm is not None and grads:
            # Unscaled gradients here whatever the precision (Lightning #18089 clips scaled ones). A non-finite
            # norm is replaced so the clip stays finite; that step is skipped below anyway.
            safe_norm = torch.nan_to_num(norm, nan=0.0, posinf=0.0)
            torch.nn.utils.clip_grads_with_norm_(with_grad, self.core.clip_grad_norm, safe_norm)
        if opt.defaults.get("fused"):
            # The fused kernel skips the update where found_inf is non-zero and takes back its step-count increment.
            opt.found_inf = skip.float()
            opt.grad_scale = None  # the gradients are unscaled already
            try:
                opt.step()
            finally:
                opt.found_inf = None
        elif not bool(skip):  # the host decides: the one synchronisation of a non-fused step
            opt.step()
        if scaler is not None:
            # update() reads the inf checks unscale_ recorded: an fp16 overflow halves the scale, a good step counts
            # towards growing it. A non-finite loss with finite gradients is a guard event, not an overflow.
            scaler.update()
        self._record_guard(name, skip, amp_overflow)
        opt.zero_grad(set_to_none=True)
        self._last_grad_norm = {**getattr(self, "_last_grad_norm", {}), name: norm.detach()}
        self._host_synced_this_iteration |= not opt.defaults.get("fused")
        return ~skip

    # ---- the non-finite guard, on the device -------------------------------------------------------------------
    def _guard_state(self) -> dict[str, torch.Tensor]:
        """Device counters: [guard events, fp16 overflows], consecutive skips per optimizer, and per optimizer the
        iteration at which its streak last reached `nonfinite_max_consecutive` (-1 while it has not)."""
        if self._guard is not None and self._guard["counts"].device != self.device:
            self._guard = {key: value.to(self.device) for key, value in self._guard.items()}
        if self._guard is None:
            state = self._guard_from_host or {}
            names = list(self._optimizer_index) or list(state.get("streaks", {}))
            streaks = state.get("streaks", {})
            self._guard = {
                "counts": torch.tensor(
                    [state.get("nonfinite_skipped", 0), state.get("amp_overflow_skipped", 0)],
                    dtype=torch.long,
                    device=self.device,
                ),
                # Below the limit (a resume may lower it): such a streak trips at its next skip, where it reaches the limit.
                "streaks": torch.tensor(
                    [
                        min(streaks.get(n, 0), (self.core.nonfinite_max_consecutive or 2**62) - 1)
                        for n in names
                    ],
                    dtype=torch.long,
                    device=self.device,
                ),
                "trips": torch.full((len(names),), -1, dtype=torch.long, device=self.device),
            }
            self._guard_names = names
            self._guard_from_host = None
        return self._guard

    def _record_guard(self, name: str, skip: torch.Tensor, amp_overflow: torch.Tensor | None) -> None:
        guard = self._guard_state()
        if (
            name not in self._guard_names
        ):  # state built before this optimizer was known (e.g. read before fit)
            self._guard_names.append(name)
            guard["streaks"] = torch.cat([guard["streaks"], guard["streaks"].new_zeros(1)])
            guard["trips"] = torch.cat([guard["trips"], guard["trips"].new_full((1,), -1)])
        index = self._guard_names.index(name)
        # A handful of in-place kernels on views of the counters, whatever the number of parameters. An fp16 overflow
        # is the scaler doing its job (it halves the scale and retries); a non-finite loss, or NaN gradients without
        # a scaler, is a guard event. Both extend the streak: K skips in a row mean the scale has fallen by 2^K and
        # the gradients are NaN for another reason.
        if amp_overflow is None:
            guard["counts"][0].add_(skip)
        else:
            guard["counts"].add_(torch.stack([skip & ~amp_overflow, amp_overflow]))
        streak = guard["streaks"][index]
        streak.add_(1).mul_(skip)
        limit = self.core.nonfinite_max_consecutive
        if limit:
            trip = guard["trips"][index]
            # A replayed graph cannot read self.iteration: there the device's own counter says which iteration.
            # Python scalars reach the kernels as arguments: no host-to-device copy (which would wait on CUDA).
            iteration = self._iteration_t if self._graphs is not None else self.iteration
            trip.copy_(torch.where(streak == limit, iteration, trip))

    @property
    def nonfinite_skipped(self) -> int:
        """Steps skipped for a non-finite loss (or non-finite gradients without fp16 loss scaling); reads the device."""
        return int(self._guard_state()["counts"][0])

    @property
    def amp_overflow_skipped(self) -> int:
        """Steps the fp16 GradScaler skipped for overflowed gradients; reads the device."""
        return int(self._guard_state()["counts"][1])

    def _guard_host_state(self) -> dict[str, Any]:
        guard = self._guard_state()
        counts = guard["counts"].tolist()
        return {
            "nonfinite_skipped": counts[0],
            "amp_overflow_skipped": counts[1],
            "streaks": dict(zip(self._guard_names, guard["streaks"].tolist(), strict=True)),
        }

    def _check_guard(self) -> None:
        """Read the guard's device state (a synchronisation): warn about steps skipped since the last check, and stop
        the run if a streak reached the limit. Called at logging iterations, at the last one, and every iteration in
        which a non-fused optimizer made the host wait anyway."""
        guard = self._guard_state()
        counts = guard["counts"].tolist()
        trips = guard["trips"].tolist()
        tripped = [(iteration, index) for index, iteration in enumerate(trips) if iteration >= 0]
        trip_iteration, trip_index = min(tripped) if tripped else (-1, -1)
        new_skips = sum(counts) - self._guard_reported
        if new_skips > 0:
            log.warning(
                "Iterations %d-%d: %d optimizer step(s) skipped for non-finite losses or gradients (%d so far: %d "
                "guard events, %d fp16 overflows).",
                self._guard_checked_at + 1,
                self.iteration,
                new_skips,
                sum(counts),
                counts[0],
                counts[1],
            )
            self._guard_reported = sum(counts)
        self._guard_checked_at = self.iteration
        if trip_iteration < 0:
            return
        limit = self.core.nonfinite_max_consecutive
        worst = self._guard_names[trip_index]
        raise NonFiniteError(
            f"Stopped at iteration {self.iteration}: {limit} consecutive steps of optimizer {worst} had non-finite "
            f"losses or gradients (fp16 overflows included), the last at iteration {trip_iteration}; skipped steps "
            "leave the weights unchanged. The last checkpoint written before this is intact. Usual fixes: a lower "
            "learning rate, train.clip_grad_norm=1.0, precision=32-true to rule out overflow, or a look at the data "
            "for NaNs. The limit is train.nonfinite_max_consecutive."
        )

    def world_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce a tensor over ranks in place, "sum" or "max" (identity on one process); for augmentation
        statistics, the time budget, the preemption signal and the like."""
        if self._trainer is not None and self.trainer.world_size > 1:
            reduce_op = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
            torch.distributed.all_reduce(tensor, op=reduce_op)
        return tensor

    @property
    def world_size(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    @property
    def images_per_iteration(self) -> int:
        """Images per optimizer update summed over ranks and micro-batches (the effective batch)."""
        return self._images_per_iteration

    def _end_iteration(
        self,
        images_this_rank: int,
        logs: dict[str, torch.Tensor | float] | None = None,
        grad_allreduce_calls: int = 0,
    ) -> None:
        """The host's end of an iteration (its device work, EMA and buffer sync, is done): advance the counter and
        schedules, log, and enforce the non-finite guard, `max_steps` and the time budget."""
        self._images_per_iteration = images_this_rank * self.world_size
        self.images_seen += self._images_per_iteration
        self.grad_allreduce_calls += grad_allreduce_calls
        logs = dict(logs or {})
        self.iteration += 1
        constant_rate = self._graphs is not None and self.core.schedule.name == "constant"
        for name, sched in zip(self._optimizer_index, self._schedulers(), strict=True):
            if (
                "lr" not in self._schedules and f"{name}_lr" not in self._schedules
            ):  # else model.schedules sets it
                if constant_rate:
                    # The rate never moves: a step would refill the graphed run's learning-rate tensor with its own
                    # value (kernels every iteration); the count alone advances, as in a stepped scheduler.
                    sched.last_epoch += 1
                    sched._step_count += 1
                else:
                    sched.step()
        iteration = self.iteration
        # Newest value per key since the last log: a metric of some iterations only (R1's `loss/r1`) still reaches
        # the next logging iteration.
        self._pending_logs.update(logs)
        if iteration == 1:
            self._last_log_point = (time.perf_counter(), self.images_seen)  # img/s counts from here
        budget = self.core.time_budget
        last = iteration >= self.core.max_steps or (
            budget.enabled and budget.expired(self.world_size, self.world_all_reduce, self.device)
        )
        logging = iteration % self.core.log_every_n_steps == 0
        check_every = self.core.preemption_check_every_n_steps or self.core.log_every_n_steps
        self.preempted_by = self.preemption.requested(  # several ranks agree every `check_every` iterations
            self.world_size,
            partial(self.world_all_reduce, op="max"),
            self.device,
            may_sync=iteration % check_every == 0 or last,
        )
        last = last or self.preempted_by is not None
        # The reads below are deliberate (train.host_sync_check lets them pass): a logging iteration, the last one
        # (which the time budget decides, so no one can know it in advance), or one that already waited.
        with host_reads_allowed():
            if logging or last:
                # Only on logging iterations: the loggers write nothing in between, and every `self.log` call costs
                # ~0.4 ms of Lightning bookkeeping (docs/performance.md, "Template overhead").
                self._log_iteration(self._pending_logs)
                self._pending_logs = {}
            if logging or last or self._host_synced_this_iteration:
                # Reading the guard makes the host wait for the device: only where the iteration waits anyway.
                self._check_guard()
        self._host_synced_this_iteration = False
        if self.preempted_by is not None:
            log.warning("%s", stop_message(self.preempted_by, iteration))
        elif last and iteration < self.core.max_steps:
            budget.stop(iteration)
            log.info(
                "Time budget reached at iteration %d of max_steps=%d (%.2f min since the run started, "
                "train.time_budget_minutes=%g): training stops here; the final evaluation, samples and "
                "checkpoint are of iteration %d. Resume from checkpoints/last.ckpt to train further.",
                iteration,
                self.core.max_steps,
                budget.elapsed_at_stop_s / 60.0,
                budget.minutes,
                iteration,
            )
        if last:
            self.trainer.should_stop = True

    # ---- Lightning hooks ----------------------------------------------------------------------------------------
    def logging_values(self) -> dict[str, Any]:
        """Extra metrics read only at logging iterations, where the host may wait for the device (a subclass's
        device-side state, e.g. ADA's p). Values in `train_iteration`'s result are device tensors held until then."""
        return {}

    def _log_iteration(self, logs: dict[str, Any]) -> None:
        metrics: dict[str, Any] = {**logs, **self.logging_values()}
        now = time.perf_counter()
        if self._last_log_point is not None:
            # Averaged since the previous logging iteration: a steadier progress bar than one step's rate.
            last_time, last_images = self._last_log_point
            rate = (self.images_seen - last_images) / max(now - last_time, 1e-9)
            self.log("img/s", rate, prog_bar=True, on_step=True, logger=True)
        self._last_log_point = (now, self.images_seen)
        metrics["train/iteration"] = float(self.iteration)
        metrics["train/kimg"] = self.images_seen / 1000.0
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        # Files the datamodule's set-up check left out (distinct, the same on every rank) ...
        left_out = int(getattr(datamodule, "skipped_file_count", 0))
        if torch.is_tensor(self.skipped_files) or left_out:
            # ... plus substitutions for files that broke later: each rank reads its own files, so those are summed
            # (one scalar all-reduce per log).
            total = torch.as_tensor(self.skipped_files, device=self.device).detach().float().clone()
            self.world_all_reduce(total)
            metrics["data/skipped_files"] = total + left_out
        metrics["guard/nonfinite_skipped"] = float(self.nonfinite_skipped)
        metrics["guard/amp_overflow_skipped"] = float(self.amp_overflow_skipped)
        if self.mixed_precision.scaler is not None:
            metrics["amp/scale"] = float(self.mixed_precision.scaler.get_scale())
        for name in self._optimizer_index:
            metrics[f"lr/{name}"] = self._raw_optimizer(name).param_groups[0]["lr"]
        for name, norm in getattr(self, "_last_grad_norm", {}).items():
            metrics[f"grad_norm/{name}"] = norm
        self.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False)

    def on_train_start(self) -> None:
        # After the Trainer's own handlers (registered just before this hook; they are restored after fit): ours end
        # the run at an iteration boundary with last.ckpt instead of Lightning's mid-iteration stop.
        if getattr(self.trainer, "received_sigterm", False) and signal.SIGTERM in self.preemption.signals:
            self.preemption.received = signal.SIGTERM  # it came during set-up, to Lightning's handler
        # After the last iteration a Ctrl-C has no iteration to finish: it stops at once (core/preemption.py).
        self.preemption.install(training_over=lambda: self.trainer.should_stop)
        epoch_loop = self.trainer.fit_loop.epoch_loop
        ours = signal.SIGTERM in self.preemption.signals
        if ours and self.world_size > 1 and hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
            # Lightning 2.6 broadcasts its SIGTERM flag and reads it back on every batch under several processes: a
            # host-device sync per iteration. Its flag is never set with our handler in place; ours agree at logging
            # iterations instead (core/preemption.py).
            epoch_loop._broadcast_sigterm_tensor = lambda: None
        self._setup_cuda_graphs()  # after the callbacks' on_train_start (a profiler attaches its timer there)

    def on_train_end(self) -> None:
        if self.core.compile or self._graphs is not None:
            log.info("%s", self.startup.summary())
        self.startup.uninstall()
        self.preemption.uninstall()
        if self._graphs is not None and self._graphs.captures:
            log.info(
                "hardware.cuda_graphs: %d graph(s) captured, %d iterations replayed.",
                self._graphs.captures,
                self._graphs.replays,
            )
        self._graphs = None  # the graphs hold their own memory pools: release them with the run

    # ---- hardware.cuda_graphs ------------------------------------------------------------------------------------
    def cuda_graph_blockers(self) -> list[str]:
        """Why this run cannot replay its iterations as CUDA graphs (empty: it can). CPU is no blocker: there the
        graphed iteration's code runs uncaptured."""
        reasons = []
        if not self.supports_cuda_graphs:
            reasons.append(f"{type(self).__name__} declares no iteration plan (supports_cuda_graphs = False)")
        if self._fsdp is not None:
            reasons.append("strategy=fsdp gathers and frees weights inside the iteration")
        if self._phase_timer is not None:
            reasons.append("a profiler (profiler=breakdown|torch) times the phases on the host")
        unfused = [
            name for name in self._optimizer_index if not self._raw_optimizer(name).defaults.get("fused")
        ]
        if unfused:
            reasons.append(
                f"optimizer(s) {unfused} are not fused (hardware.optimizer_impl=fused): the host decides their "
                "skipped steps"
            )
        hooked = [
            type(obj).__name__
            for obj, base in [(self, L.LightningModule), *((c, L.Callback) for c in self.trainer.callbacks)]
            for hook in _HOOKS_INSIDE_THE_STEP
            if getattr(type(obj), hook) is not getattr(base, hook)
        ]
        if hooked:
            reasons.append(
                f"{', '.join(sorted(set(hooked)))} run(s) code in {' / '.join(_HOOKS_INSIDE_THE_STEP)}, which a "
                "replayed graph would skip"
            )
        return reasons

    def _setup_cuda_graphs(self) -> None:
        """Called at the start of training with `hardware.cuda_graphs`: decide once whether the iteration can be
        replayed as CUDA graphs, say so when it cannot, and move what the host changes between iterations (the
        learning rates, the iteration number, the images seen) into device tensors the graphs read."""
        self._graphs = None
        if self.core.cuda_graphs:
            blockers = self.cuda_graph_blockers()
            if blockers:
                log.warning(
                    "hardware.cuda_graphs=true, but this run launches its kernels eagerly: %s. Set "
                    "hardware.cuda_graphs=false to silence this.",
                    "; ".join(blockers),
                )
            else:
                capture = self.device.type == "cuda"
                if not capture:
                    log.info(
                        "hardware.cuda_graphs: no CUDA device, so nothing is captured; the graphed iteration's code "
                        "runs uncaptured (static batch buffer, learning rates and counters on the device)."
                    )
                self._graphs = IterationGraphs(capture=capture)
        graphed = self._graphs is not None
        for name in self._optimizer_index:
            for group in self._raw_optimizer(name).param_groups:
                # A graph reads the learning rate from a tensor the schedule fills (a float would be baked into it);
                # an eager run keeps floats (a checkpoint of a graphed run may bring tensors along). CUDA's fused Adam
                # computes in float32 and CPU's in float64, so each device's tensor dtype gives the float's update
                # (float32 on an Apple GPU too: MPS has no float64).
                lr = group["lr"]
                with host_reads_allowed():
                    value = float(lr) if torch.is_tensor(lr) else lr
                dtype = torch.float64 if self.device.type == "cpu" else torch.float32
                group["lr"] = torch.full((), value, dtype=dtype, device=self.device) if graphed else value
                if "capturable" in group:
                    group["capturable"] = graphed and self._graphs.capture
                if "betas" in group and any(
                    key.startswith("beta") or "_beta" in key for key in self._schedules
                ):
                    # Scheduled betas are written inside the replay too: device tensors there, floats otherwise.
                    with host_reads_allowed():
                        betas = [float(b) if torch.is_tensor(b) else b for b in group["betas"]]
                    group["betas"] = tuple(
                        torch.full((), b, dtype=dtype, device=self.device) if graphed else b for b in betas
                    )
                    if graphed and self._graphs.capture and group.get("fused"):
                        # CUDA's fused Adam takes its betas as host floats (`_fused_adam_` has a tensor-lr overload
                        # only): a capture would bake the first value in. Capturable foreach Adam reads tensors.
                        group["fused"], group["foreach"] = False, True
                        log.info(
                            "Scheduled betas under CUDA graphs: optimizer %s steps with foreach Adam.", name
                        )
        if graphed:
            self._iteration_t = torch.full((), self.iteration, dtype=torch.long, device=self.device)
            self._images_seen_t = torch.full((), self.images_seen, dtype=torch.long, device=self.device)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Fresh, deterministic randomness per (seed, rank, iteration): latents, augmentation and dropout are the same
        # whether the run went straight through or was resumed at any iteration.
        seed = _mix_seed(self.core.seed, self.global_rank, self.iteration)
        # The generators a step uses, not torch.manual_seed: on a CUDA wheel that also queues a lazy seed for every
        # CUDA device and captures a Python stack each call (~1 ms, docs/performance.md). Same streams, same results.
        torch.default_generator.manual_seed(seed)
        self.host_random.seed(seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(
                seed
            )  # this device's generator; CUDA is initialised by now, so no lazy stack
        elif self.device.type == "mps":
            torch.mps.manual_seed(seed)  # an Apple GPU's own generator: what randn on the device draws from

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A checkpoint reads the device anyway: a streak that reached the limit since the last logging iteration
        # stops the run here rather than being saved, unnoticed, into a checkpoint a resume would continue from.
        self._check_guard()
        # Every rank saves (only rank 0 writes): the run's count of later-broken files is the sum over ranks.
        skipped = torch.as_tensor(self.skipped_files, device=self.device).detach().clone()
        self.world_all_reduce(skipped)
        checkpoint["pixelsmith"] = {
            "iteration": self.iteration,
            "images_seen": self.images_seen,
            "nonfinite_skipped": (guard := self._guard_host_state())["nonfinite_skipped"],
            "amp_overflow_skipped": guard["amp_overflow_skipped"],
            "nonfinite_streaks": guard["streaks"],
            "grad_scaler": self.mixed_precision.state_dict(),
            "precision": self.core.precision,
            "skipped_files": int(
                skipped
            ),  # later-broken files' substitutions, all ranks: a resume keeps them
        }
        checkpoint["pixelsmith_config"] = self.core.run_config

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("pixelsmith")
        if state is None:
            raise ValueError(
                "This checkpoint was not written by a Pixelsmith model (no 'pixelsmith' entry); "
                "resume with a checkpoint from a Pixelsmith run's checkpoints/ folder."
            )
        self.iteration = int(state["iteration"])
        self.images_seen = int(state["images_seen"])
        # The run's total, restored on rank 0 only: the logged metric sums the ranks' counts.
        self.skipped_files = int(state.get("skipped_files", 0)) if self.global_rank == 0 else 0
        self._guard_from_host = {
            "nonfinite_skipped": int(state["nonfinite_skipped"]),
            "amp_overflow_skipped": int(state["amp_overflow_skipped"]),
            "streaks": {k: int(v) for k, v in state.get("nonfinite_streaks", {}).items()},
        }
        self._guard = None
        self._guard_reported = (
            self._guard_from_host["nonfinite_skipped"] + self._guard_from_host["amp_overflow_skipped"]
        )
        self._guard_checked_at = self.iteration
        self._pending_precision_state = state.get("grad_scaler") or None
        self._precision = None


def _schedule_config(name: str, node: Any) -> ScalarScheduleConfig:
    if isinstance(node, ScalarScheduleConfig):
        return node
    fields = [f for f in ScalarScheduleConfig.__dataclass_fields__]
    given = dict(node) if hasattr(node, "keys") else None
    unknown = sorted(set(given or {}) - set(fields)) if given is not None else []
    if given is None or unknown or "start" not in given:
        raise PixelsmithError(
            f"model.schedules.{name}={node!r} is not a schedule"
            f"{': unknown keys ' + str(unknown) if unknown else ''}. It takes {', '.join(fields)} (start required), "
            f"e.g. +model.schedules.{name}={{start: 2e-4, final: 5e-5, shape: cosine, horizon_kimg: 20000}}."
        )
    return ScalarScheduleConfig(**given)


BLOCK_RECOMPILE_LIMIT = 128


def compile_units(network: nn.Module, scope: str) -> list[nn.Module]:
    """What to compile of `network`: itself (scope network, or a network that names no blocks), or the blocks its
    `compile_units()` names (scope blocks). Blocks of one class at several resolutions are graphs of their own
    under one code object: Dynamo's recompile limit is raised to hold them all (else the rest would run eagerly)."""
    named = getattr(network, "compile_units", None)
    if scope == "network" or not callable(named):
        return [network]
    units = list(named())
    # Blocks share code objects (one class's forward, or a decorator's wrapper across classes, in G and D alike), and
    # each block compiles twice (trained, and frozen under the other network's phase): far beyond the limit of 8.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, BLOCK_RECOMPILE_LIMIT)
    return units


def _compile_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


# torch.compile's modes that capture CUDA graphs of their own (cudagraph trees).
INDUCTOR_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")

# Lightning calls these from inside `manual_backward`, i.e. inside a captured iteration: a replay would skip them.
_HOOKS_INSIDE_THE_STEP = ("on_before_backward", "on_after_backward")


def _compile_mode_under_graphs(mode: str, cuda_graphs: bool) -> str:
    """The compile mode to use: under hardware.cuda_graphs the whole iteration is one graph already, and
    reduce-overhead / max-autotune's own CUDA graphs inside it cannot be captured again."""
    replacement = dict(zip(INDUCTOR_CUDA_GRAPH_MODES, ("default", "max-autotune-no-cudagraphs"), strict=True))
    if not cuda_graphs or mode not in replacement:
        return mode
    log.info(
        "hardware.cuda_graphs captures the whole iteration: compile_mode=%s runs as %s (its own CUDA graphs "
        "cannot sit inside ours).",
        mode,
        replacement[mode],
    )
    return replacement[mode]


@contextmanager
def eager(*modules: nn.Module) -> Iterator[None]:
    """Run modules compiled with `nn.Module.compile` uncompiled inside the block (their compiled code is kept for
    after). Only the modules' own compiled entry points are switched off: a compiled sub-module keeps compiling."""
    switched = [
        (m, m._compiled_call_impl)
        for module in modules
        for m in module.modules()
        if getattr(m, "_compiled_call_impl", None) is not None
    ]
    for m, _ in switched:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, compiled in switched:
            m._compiled_call_impl = compiled


def _nonfinite(value: torch.Tensor) -> torch.Tensor:
    """True where `value` is inf or NaN, in two kernels (`torch.isfinite` is four): x * 0 is 0 exactly for finite x."""
    return value.mul(0).ne(0)


def _global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm over all gradients as one vector. Sharded (DTensor) gradients give the norm over every rank's
    shard (DTensor reduces the partial norms), so clipping and the finite check agree on all ranks."""
    sharded = [g for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    norms = [torch.nn.utils.get_total_norm(group) for group in (sharded, plain) if group]
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    return norms[0] if len(norms) == 1 else torch.nn.utils.get_total_norm(norms)


def count_parameters(modules: Iterable[nn.Module]) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())
