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

from pixelsmith.core.compile import compile_cache_dir, compile_networks, eager
from pixelsmith.core.config import CoreSettings, EMAConfig
from pixelsmith.core.ema import EMA
from pixelsmith.core.fsdp import MultiNetworkFSDPStrategy
from pixelsmith.core.graph_setup import CudaGraphSetup
from pixelsmith.core.graphs import IterationGraphs
from pixelsmith.core.guard import NonFiniteGuard
from pixelsmith.core.host_reads import host_reads_allowed
from pixelsmith.core.optim import build_optimizer, optimizer_factory
from pixelsmith.core.precision import MixedPrecision
from pixelsmith.core.preemption import PreemptionSignals, stop_message
from pixelsmith.core.scheduled_values import ScheduledValues, set_optimizer_value
from pixelsmith.core.schedules import build_scheduler
from pixelsmith.core.startup import StartupReport, compile_cache_note
from pixelsmith.core.stepping import OptimizerStepper, average_buffers
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


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
        # The core's collaborators, each with its own state: the non-finite guard (core/guard.py), the optimizer
        # stepping between loss_backward and step (core/stepping.py) and the scheduled hyper-parameters
        # (core/scheduled_values.py). CUDA-graph set-up is core/graph_setup.py's, compile core/compile.py's.
        self.guard = NonFiniteGuard(core.nonfinite_max_consecutive)
        self.stepper = OptimizerStepper(core.accumulate, core.clip_grad_norm)
        self.scheduled = ScheduledValues()
        self._optimizer_index: dict[str, int] = {}
        self._float_buffers: dict[str, list[torch.Tensor]] = {}
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
        # Each optimizer's lazy-regularisation scaling (lr_scale, betas_power), applied to its scheduled values.
        self._lr_scale_and_betas_power: dict[str, tuple[float, float]] = {}
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
            result = graphs.run(plan, batch, self._device_iteration, reset=self.abandon_iteration)
            if graphs.captures > captures:
                self.startup.plan_captured(plan, graphs.last_capture_s)
        if first_run:
            with host_reads_allowed():
                self.startup.plan_ran(plan, self.device)
        self._end_iteration(result.images, result.logs, result.grad_allreduce_calls)
        self.startup.iteration_done(self.iteration)

    def _device_iteration(self, batch: Any) -> IterationResult:
        """The model's iteration and the device half of its end (buffer sync, EMA): what a CUDA graph captures."""
        self.stepper.allreduces = 0
        scheduled = self._apply_schedules()
        result = self.train_iteration(batch)
        if not isinstance(result, IterationResult):
            raise PixelsmithError(
                f"{type(self).__name__}.train_iteration returned {type(result).__name__}; return "
                "IterationResult(images=<images this rank trained on>, logs={...})."
            )
        unstepped = self.stepper.unstepped()
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
        result.grad_allreduce_calls = self.stepper.allreduces
        result.logs.update(scheduled)
        return result

    def abandon_iteration(self) -> None:
        """Forget the host state of an iteration that did not finish (a CUDA-graph capture that failed part-way),
        so it can run again eagerly: pending backward counts and losses, unscaled-optimizer marks, gradients. A model
        with host state of its own for the iteration extends it (and calls this)."""
        self.stepper.forget()
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
        self.scheduled.add(schedules, self.schedule_targets(), type(self).__name__, self.core.schedule.name)

    def _apply_schedules(self) -> dict[str, Any]:
        """Write every scheduled value for the coming iteration (core/scheduled_values.py): from the host's count in
        an eager run, from the device's under `hardware.cuda_graphs`. Returns them for the logs."""
        if not self.scheduled:
            return {}
        return self.scheduled.apply(self._images_seen_t if self._graphs is not None else self.images_seen)

    def _set_optimizer_value(self, names: list[str], key: str, value: float | torch.Tensor) -> None:
        for name in names:
            scaling = self._lr_scale_and_betas_power.get(name, (1.0, 1.0))
            set_optimizer_value(self._raw_optimizer(name), name, key, value, scaling)

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
                log.info("%s", compile_cache_note(compile_cache_dir(), compiled))
        for net in self.networks().values():
            if self.core.channels_last and self._fsdp is None:
                net.to(memory_format=torch.channels_last)
        if self.core.compile and compiled:
            core = self.core
            self.inductor_cuda_graphs = compile_networks(
                self.networks(), compiled, core.compile_mode, core.cuda_graphs, core.compile_scope
            )
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
        calls = self.stepper.backward_done(name, loss)
        if self._fsdp is not None:
            # FSDP2 reduce-scatters inside backward: only on the last micro-batch, the earlier ones accumulate
            # locally (the DDP path communicates in `step` and needs no switch).
            for net in self.networks().values():
                if isinstance(net, FSDPModule):
                    net.set_requires_gradient_sync(calls >= self.core.accumulate)
        # A division by 1 would be a kernel that changes nothing.
        scaled = loss if self.core.accumulate == 1 else loss / self.core.accumulate
        self.manual_backward(self.mixed_precision.scale(scaled))

    def _sync_buffers(self) -> None:
        """Average floating buffers (BatchNorm statistics, StyleGAN's w_avg) of the trained networks once per
        iteration: without a DDP wrapper nobody broadcasts them, and ranks would drift apart (EMA copies them)."""
        buffers = [b for group in self._float_buffers.values() for b in group]
        if self.world_size > 1 and buffers:
            average_buffers(buffers, self.world_size)

    def step(self, name: str) -> torch.Tensor:
        """All-reduce, unscale, check, clip and apply optimizer `name` (core/stepping.py); the outcome goes to the
        non-finite guard. Returns a device bool tensor, True where the step was applied: with fused Adam (every
        hardware profile) the whole step stays on the device."""
        return self.stepper.step(
            name,
            self._raw_optimizer(name),
            self.mixed_precision.scaler,
            self.world_size,
            self.device,
            self._fsdp is not None,
            self._record_guard,
        )

    # ---- the non-finite guard, on the device -------------------------------------------------------------------
    def _guard_state(self) -> dict[str, torch.Tensor]:
        return self.guard.state(self.device, list(self._optimizer_index))

    def _record_guard(self, name: str, skip: torch.Tensor, amp_overflow: torch.Tensor | None) -> None:
        # A replayed graph cannot read self.iteration: there the device's own counter says which iteration.
        iteration = self._iteration_t if self._graphs is not None else self.iteration
        self.guard.record(self._guard_state(), name, skip, amp_overflow, iteration)

    @property
    def nonfinite_skipped(self) -> int:
        """Steps skipped for a non-finite loss (or non-finite gradients without fp16 loss scaling); reads the device."""
        return int(self._guard_state()["counts"][0])

    @property
    def amp_overflow_skipped(self) -> int:
        """Steps the fp16 GradScaler skipped for overflowed gradients; reads the device."""
        return int(self._guard_state()["counts"][1])

    def _check_guard(self) -> None:
        """Read the guard (a synchronisation): warn about skipped steps, stop the run at a streak's limit."""
        self.guard.check(self._guard_state(), self.iteration)

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
            if not self.scheduled.sets_learning_rate(name):  # else model.schedules sets it
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
            if logging or last or self.stepper.host_synced:
                # Reading the guard makes the host wait for the device: only where the iteration waits anyway.
                self._check_guard()
        self.stepper.host_synced = False
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
        for name, norm in self.stepper.last_grad_norm.items():
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
        """Why this run cannot replay its iterations as CUDA graphs (empty: it can; core/graph_setup.py)."""
        return CudaGraphSetup(self).blockers()

    def _setup_cuda_graphs(self) -> None:
        """At the start of training: the run's CUDA graphs (None: eager), its learning rates and scheduled betas as
        device tensors the graphs read, and the iteration number and images seen on the device."""
        self._graphs = CudaGraphSetup(self).start(self.core.cuda_graphs)
        if self._graphs is not None:
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
            "nonfinite_skipped": (guard := self.guard.host_state(self._guard_state()))["nonfinite_skipped"],
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
        self.guard.load_host_state(
            {
                "nonfinite_skipped": int(state["nonfinite_skipped"]),
                "amp_overflow_skipped": int(state["amp_overflow_skipped"]),
                "streaks": {k: int(v) for k, v in state.get("nonfinite_streaks", {}).items()},
            },
            self.iteration,
        )
        self._pending_precision_state = state.get("grad_scaler") or None
        self._precision = None


def count_parameters(modules: Iterable[nn.Module]) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())
