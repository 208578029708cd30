"""TrainingCore: the LightningModule base every Pixelsmith model inherits (GAN, style transfer, a fork's own).

A subclass implements `networks()`, `optimizer_definitions()` and `train_iteration(batch)`, in which it calls
`self.loss_backward(loss, name)` per micro-batch and `self.step(name)` once per optimizer, and returns an
`IterationResult`. The core owns the rest of the iteration, so there is no bookkeeping call a model could forget.

One iteration, top to bottom (`training_step`):
1. `iteration_plan(batch)`: the host's decisions (the GAN: which phases are due); one CUDA graph per plan.
2. `_device_iteration`: `_apply_schedules` (core/scheduled_values.py), the model's `train_iteration` (the GAN's
   walks its objective's phase table: gan/module.py `run_phase`), then buffer sync and EMA. Under
   `hardware.cuda_graphs` this is what core/graphs.py captures and replays.
3. `loss_backward` / `step` inside it: core/stepping.py (all-reduce, unscale, finite check, clip, fused step), whose
   outcome goes to the non-finite guard (core/guard.py).
4. `_end_iteration`: the counter (`self.iteration`; Lightning's `global_step` counts optimizer steps), lr
   schedulers, logging at logging iterations (core/iteration_log.py), the guard's check, and the stop at `max_steps`,
   the time budget (core/budget.py) or a preemption signal (core/preemption.py); GPU ranks agree on those
   without a device read (core/agreement.py).

Around it: per-iteration seeding (core/seeding.py: a resume continues bit for bit), mixed precision with the core's
own GradScaler (core/precision.py; clipping on unscaled gradients, Lightning #18089), compile of the networks, never
of the module (core/compile.py), CUDA-graph set-up (core/graph_setup.py), and the checkpoint entry
(core/checkpoint_state.py).
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from pixelsmith.core.agreement import RankAgreement
from pixelsmith.core.checkpoint_state import load_core_state, save_core_state
from pixelsmith.core.compile import canonical_channels_last, eager, prepare_networks
from pixelsmith.core.config import CoreSettings, EMAConfig
from pixelsmith.core.contract import IterationResult, OptimizerDefinition
from pixelsmith.core.ema import EMA
from pixelsmith.core.fsdp import MultiNetworkFSDPStrategy
from pixelsmith.core.graph_setup import CudaGraphSetup, lightning_backward_is_inert
from pixelsmith.core.graphs import IterationGraphs
from pixelsmith.core.guard import NonFiniteGuard
from pixelsmith.core.host_reads import host_reads_allowed
from pixelsmith.core.iteration_log import IterationLog
from pixelsmith.core.optim import build_optimizers
from pixelsmith.core.precision import MixedPrecision
from pixelsmith.core.preemption import PreemptionSignals, stop_message
from pixelsmith.core.scheduled_values import ScheduledValues, core_targets, set_optimizer_value
from pixelsmith.core.seeding import mix_seed, seed_iteration
from pixelsmith.core.startup import StartupReport
from pixelsmith.core.stepping import OptimizerStepper, average_buffers
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


class TrainingCore(L.LightningModule):
    # True when `iteration_plan` names every host decision of an iteration, so `hardware.cuda_graphs` may capture
    # it (core/graphs.py); a model that leaves it False runs eagerly, saying so at start-up.
    supports_cuda_graphs = False
    # The step-time breakdown's rows for this model's own timed regions (`with self.region(name):`), in the order they
    # are shown (perf/breakdown.py); a region recorded but not listed is shown after these, in order of appearance.
    breakdown_regions: tuple[str, ...] = ()

    def __init__(self, core: CoreSettings):
        super().__init__()
        self.automatic_optimization = False
        if core.accumulate < 1:
            raise ValueError(f"accumulate={core.accumulate} must be at least 1.")
        self.core = core
        self.iteration = 0
        # The core's collaborators, each with its own state (see the module docstring).
        self.guard = NonFiniteGuard(core.nonfinite_max_consecutive)
        self.stepper = OptimizerStepper(core.accumulate, core.clip_grad_norm)
        self.scheduled = ScheduledValues()
        self._optimizer_index: dict[str, int] = {}
        self._float_buffers: dict[str, list[torch.Tensor]] = {}
        self._precision: MixedPrecision | None = None
        self._pending_precision_state: dict | None = None
        self._region_timer = None
        self._ema_pairs: list[tuple[str, EMA, nn.Module]] = []
        self.images_seen = 0
        self.skipped_files: torch.Tensor | int = 0
        self.iteration_log = IterationLog()  # values held until the next logging iteration
        self.grad_allreduce_calls = 0
        # For host-side draws (crop offsets, indices): reseeded with the torch generators every iteration, and a
        # Python draw never makes the host wait for the device as `int(torch.randint(...))` on a GPU tensor could.
        self.host_random = random.Random(core.seed)
        self.preemption = PreemptionSignals(core.preemption_signals)
        self.preempted_by: int | None = None  # the signal that ended training, once it has
        # GPU ranks' stop decisions without a device read (core/agreement.py).
        self._agreement = RankAgreement()
        # hardware.cuda_graphs (core/graphs.py): set up in on_train_start, None when the run launches eagerly. The
        # iteration number and images seen then also live on the device, advanced inside the captured iteration.
        self._graphs: IterationGraphs | None = None
        # compile_mode=reduce-overhead / max-autotune without hardware.cuda_graphs: inductor's own CUDA graphs
        # (cudagraph trees), whose outputs a later replay may overwrite (`keep_compiled_output`).
        self.inductor_cuda_graphs = False
        self._iteration_t: torch.Tensor | None = None
        self._images_seen_t: torch.Tensor | None = None
        self._counters: torch.Tensor | None = None  # [iteration, images seen]: the two above are views of it
        # The host's (iteration, images seen, max_steps) when graphs began: the EMA's beta table starts from it.
        self._graph_start: tuple[int, int, int] | None = None
        self._counter_steps: dict[int, torch.Tensor] = {}
        # The optimizer steps' outcomes of the running iteration, for the guard (None outside an iteration).
        self._guard_steps: list[tuple[str, torch.Tensor, torch.Tensor | None]] | None = None
        # Each optimizer's lazy-regularisation scaling (lr_scale, betas_power), applied to its scheduled values.
        self._lr_scale_and_betas_power: dict[str, tuple[float, float]] = {}
        # Where the start-up went (core/startup.py): compile per network, each plan's first run and capture.
        self.startup = StartupReport()
        # Whether Lightning's `manual_backward` would do nothing but `loss.backward()` in this run (set at the start
        # of training, `lightning_backward_is_inert`): then the core calls it directly.
        self._direct_backward = False

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
        if graphs is not None and self._region_timer is not None:
            graphs.give_up("a profiler (profiler=breakdown|torch) times the phases on the host")
        # A plan's first run is timed (core/startup.py); every later one pays only this set lookup.
        timing = (
            self.startup.first_run(plan, self.device) if self.startup.plan_is_new(plan) else nullcontext()
        )
        with timing:
            if graphs is None:
                result = self._device_iteration(batch)
            else:
                captures = graphs.captures
                result = graphs.run(plan, batch, self._device_iteration, reset=self.abandon_iteration)
                if graphs.captures > captures:
                    self.startup.plan_captured(plan, graphs.last_capture_s)
        self._end_iteration(result.images, result.logs, result.grad_allreduce_calls)
        self.startup.iteration_done(self.iteration)

    def _device_iteration(self, batch: Any) -> IterationResult:
        """The model's iteration and the device half of its end (buffer sync, EMA): what a CUDA graph captures."""
        self.stepper.allreduces = 0
        scheduled = self._apply_schedules()
        self._guard_steps = []
        try:
            return self._run_iteration(batch, scheduled)
        finally:
            self._guard_steps = None  # an iteration that raised leaves no steps queued for a later one

    def _run_iteration(self, batch: Any, scheduled: dict[str, Any]) -> IterationResult:
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
        self._record_guard_steps()
        self._sync_buffers()
        # The EMA ramp-up reads the images seen before this iteration, as StyleGAN2-ADA's training loop (cur_nimg
        # advances after the G_ema update): the first iteration's average is a copy of G. Under CUDA graphs the
        # device's own count, which a replay can read (the host's it cannot).
        images_seen = self.images_seen_now
        graphed = self._graphs is not None
        for name, ema, source in self._ema_pairs:
            with self.region("ema"):
                result.logs[f"ema/{name}_beta"] = ema.update(
                    source,
                    images_per_iteration,
                    images_seen,
                    self._iteration_t if graphed else None,
                    self._graph_start if graphed else None,
                )
        if graphed:
            # Both counters in one kernel: [iteration, images seen] += [1, images this iteration].
            self._counters.add_(self._counter_step(images_per_iteration))
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

    def iteration_kind(self) -> str:
        """The kind of the coming iteration for the FLOP count (perf/throughput.py counts each kind once): "common",
        or the names of the occasional work in it (the GAN: its lazy phases, "r1" for Dreg alone). Default: one kind."""
        return "common"

    def lazy_interval(self) -> int | None:
        """Every how many iterations the occasional work of `iteration_kind` runs (None: never), for the FLOPs
        averaged over a run."""
        return None

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
        names = [spec.name for spec in self.optimizer_definitions()]
        return core_targets(names, self._set_optimizer_value, [ema for _, ema, _ in self._ema_pairs])

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
        return self.scheduled.apply(self.images_seen_now)

    def _set_optimizer_value(self, names: list[str], key: str, value: float | torch.Tensor) -> None:
        for name in names:
            scaling = self._lr_scale_and_betas_power.get(name, (1.0, 1.0))
            set_optimizer_value(self._raw_optimizer(name), name, key, value, scaling)

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
        """`tensor`, safe to read after other compiled networks have run: under inductor's CUDA graphs an inference
        call's output is overwritten by the next replay (on an H200 D read G's overwritten fakes), so it is cloned."""
        return tensor.clone() if self.inductor_cuda_graphs else tensor

    def configure_model(self) -> None:
        # channels_last and compile of the networks (core/compile.py), then FSDP2's sharding: after compile, as
        # torchtitan does (compile per block, then fully_shard).
        self.inductor_cuda_graphs = prepare_networks(self)
        if self._fsdp is not None:
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
        """Wrap a phase that differentiates through a gradient (R1, path length) of `modules`: compiled networks run
        eagerly inside it (core/compile.py's `eager` says why), and under FSDP their weights stay gathered."""
        with self.keep_unsharded(*modules), eager(*modules):
            yield

    def configure_optimizers(self):
        built = build_optimizers(
            self.optimizer_definitions(),
            self.networks(),
            self.core.optimizer_impl,
            self.core.schedule,
            self.core.max_steps,
        )
        self._optimizer_index = {name: index for index, name in enumerate(built.names)}
        self._lr_scale_and_betas_power = built.scaling
        self._float_buffers = built.float_buffers
        return built.optimizers, built.schedulers

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

    def region(self, name: str):
        """A named region of the iteration that a profiler callback times (`self._region_timer` set by it); free when
        none is attached."""
        return self._region_timer(name) if self._region_timer is not None else nullcontext()

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [0, 255] from the loader -> float in [-1, 1] on the device, in the networks' memory format."""
        images = images.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = images.float().mul_(1.0 / 127.5).sub_(1.0)
        return self.in_network_layout(images)

    def in_network_layout(self, images: torch.Tensor) -> torch.Tensor:
        """`images` in the networks' memory format with canonical strides (core/compile.py: a compiled network
        guards on strides, so real images and G's output must match exactly or D compiles twice)."""
        return canonical_channels_last(images) if self.core.channels_last and images.ndim == 4 else images

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
        scaled = self.mixed_precision.scale(
            loss if self.core.accumulate == 1 else loss / self.core.accumulate
        )
        if self._direct_backward:
            scaled.backward()  # what manual_backward would end in, without its hook dispatch (a host cost)
        else:
            self.manual_backward(scaled)

    def _sync_buffers(self) -> None:
        """Average floating buffers (BatchNorm statistics, StyleGAN's w_avg) of the trained networks once per
        iteration: without a DDP wrapper nobody broadcasts them, and ranks would drift apart (EMA copies them)."""
        buffers = [b for group in self._float_buffers.values() for b in group]
        if self.world_size > 1 and buffers:
            average_buffers(buffers, self.world_size)

    def step(self, name: str) -> torch.Tensor:
        """All-reduce, unscale, check, clip and apply optimizer `name` (core/stepping.py); the outcome goes to the
        non-finite guard. Returns the skip flag, a device float: 1.0 where the step was skipped for a non-finite loss or
        gradient. With fused Adam (every hardware profile) the whole step stays on the device."""
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
        if self._guard_steps is not None:  # inside an iteration: counted together at its end (fewer kernels)
            self._guard_steps.append((name, skip, amp_overflow))
            return
        # A replayed graph cannot read self.iteration: there the device's own counter says which iteration.
        self.guard.record(self._guard_state(), name, skip, amp_overflow, self.iteration_now)

    def _record_guard_steps(self) -> None:
        steps, self._guard_steps = self._guard_steps, None
        if steps:
            self.guard.record_iteration(self._guard_state(), steps, self.iteration_now)

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
    def graphed(self) -> bool:
        """Whether iterations run through the CUDA-graph path (`hardware.cuda_graphs`, captured on a GPU, uncaptured
        on a CPU): then the iteration reads what changes from device tensors (core/graphs.py's contract)."""
        return self._graphs is not None

    @property
    def iteration_now(self) -> int | torch.Tensor:
        """The iteration number as code inside the iteration must read it: a device tensor the replay advances when
        `graphed` (a Python int would be baked into the graph), `self.iteration` otherwise."""
        return self._iteration_t if self._graphs is not None else self.iteration

    @property
    def images_seen_now(self) -> int | torch.Tensor:
        """The images seen before this iteration, read as `iteration_now` is."""
        return self._images_seen_t if self._graphs is not None else self.images_seen

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
        schedulers = dict(zip(self._optimizer_index, self._schedulers(), strict=True))
        self.scheduled.step_lr_schedulers(schedulers, constant_rate)
        iteration = self.iteration
        self.iteration_log.add(logs)
        if iteration == 1:
            self.iteration_log.start(self.images_seen)
        budget = self.core.time_budget
        logging = iteration % self.core.log_every_n_steps == 0
        check_every = self.core.preemption_check_every_n_steps or self.core.log_every_n_steps
        if self.world_size > 1 and self.device.type == "cuda":
            # GPU ranks agree on the budget and a signal every `check_every` iterations, a check interval late
            # (core/agreement.py): no device read.
            last = iteration >= self.core.max_steps
            if iteration % check_every == 0:
                flags = [float(budget.enabled and budget.spent()), float(self.preemption.received or 0)]
                agreed = self._agreement.exchange(
                    flags, partial(self.world_all_reduce, op="max"), self.device
                )
                if agreed is not None:
                    last = last or agreed[0] > 0
                    self.preempted_by = int(agreed[1]) or None
        else:
            last = iteration >= self.core.max_steps or (
                budget.enabled and budget.expired(self.world_size, self.world_all_reduce, self.device)
            )
            self.preempted_by = (
                self.preemption.requested(  # several ranks agree every `check_every` iterations
                    self.world_size,
                    partial(self.world_all_reduce, op="max"),
                    self.device,
                    may_sync=iteration % check_every == 0 or last,
                )
            )
        last = last or self.preempted_by is not None
        # Deliberate reads (train.host_sync_check lets them pass): a logging iteration reads the values it staged one
        # interval ago (their copy long done: no wait), the last one reads its own (the time budget decides it, so
        # no one can know it in advance), and an iteration that already waited reads the guard.
        with host_reads_allowed():
            if logging or last:
                # Only on logging iterations: the loggers write nothing in between, and every `self.log` call costs
                # ~0.4 ms of Lightning bookkeeping (docs/performance.md, "Template overhead").
                self._log_iteration(last)
            if last or self.stepper.host_synced:
                self._check_guard()
        self.stepper.host_synced = False
        if self.preempted_by is not None:
            log.warning("%s", stop_message(self.preempted_by, iteration))
        elif last and iteration < self.core.max_steps:
            budget.stop(iteration, self.core.max_steps)
        if last:
            self.trainer.should_stop = True

    # ---- Lightning hooks ----------------------------------------------------------------------------------------
    def logging_values(self) -> dict[str, Any]:
        """Extra metrics read only at logging iterations, where the host may wait for the device (a subclass's
        device-side state, e.g. ADA's p). Values in `train_iteration`'s result are device tensors held until then."""
        return {}

    def _log_iteration(self, last: bool) -> None:
        self.iteration_log.log(self, last)  # core/iteration_log.py: staged now, handed over an interval later

    def on_train_start(self) -> None:
        self.preemption.start_training(self.trainer, self.world_size)  # core/preemption.py
        self._direct_backward = lightning_backward_is_inert(self)
        self._setup_cuda_graphs()  # after the callbacks' on_train_start (a profiler attaches its timer there)

    def on_train_end(self) -> None:
        if self.core.compile or self._graphs is not None:
            log.info("%s", self.startup.summary())
        self.startup.uninstall()
        self.preemption.uninstall()
        if self._graphs is not None:
            self._graphs.log_summary()
            self.startup.graphs_ended(self._graphs.replays, self._graphs.disabled_reason)
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
            self._counters = torch.full((2,), self.iteration, dtype=torch.long, device=self.device)
            self._counters[1].fill_(self.images_seen)
            self._iteration_t, self._images_seen_t = self._counters[0], self._counters[1]  # views
            self._graph_start = (self.iteration, self.images_seen, self.core.max_steps)
            self._counter_steps = {}

    def _counter_step(self, images_per_iteration: int) -> torch.Tensor:
        """[1, images_per_iteration] on the device, made once per batch size without a host-to-device copy (which
        would wait for the device)."""
        step = self._counter_steps.get(images_per_iteration)
        if step is None:
            step = torch.arange(2, device=self.device).mul_(images_per_iteration - 1).add_(1)
            self._counter_steps[images_per_iteration] = step
        return step

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        seed_iteration(
            mix_seed(self.core.seed, self.global_rank, self.iteration), self.device, self.host_random
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        save_core_state(self, checkpoint)  # core/checkpoint_state.py

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        load_core_state(self, checkpoint)


def count_parameters(modules: Iterable[nn.Module]) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())
