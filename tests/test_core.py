"""The shared training core on a one-layer model: clipping on unscaled fp16 gradients with a real CPU GradScaler,
the non-finite guard (also across two DDP ranks, one of which sees a non-finite loss), schedules on our own iteration
counter, EMA against hand computations, and the resumable sampler."""

from __future__ import annotations

import math
import os
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pixelsmith.callbacks.checkpoint import IterationCheckpoint
from pixelsmith.core.config import CoreSettings, OptimizerConfig, ScheduleConfig
from pixelsmith.core.contract import IterationResult, OptimizerDefinition
from pixelsmith.core.ema import EMA
from pixelsmith.core.guard import NonFiniteError
from pixelsmith.core.module import TrainingCore
from pixelsmith.core.schedules import lr_multiplier
from pixelsmith.core.strategy import MultiNetworkDDPStrategy
from pixelsmith.data.base import BatchSizeError, per_rank_batch
from pixelsmith.data.sampler import IterationSampler
from pixelsmith.errors import PixelsmithError
from tests.conftest import bare_trainer, free_port


class TinyCore(TrainingCore):
    """Linear regression on the core; `poison` maps iteration -> factor multiplied into the loss (NaN to poison)."""

    def __init__(
        self, core: CoreSettings, poison: dict[int, float] | None = None, grad_poison: set[int] | None = None
    ):
        super().__init__(core)
        torch.manual_seed(0)
        self.net = nn.Linear(16, 1)
        self.poison = poison or {}
        self.grad_poison = grad_poison or set()  # iterations whose gradients (not loss) turn NaN
        self.grad_norms_at_step: list[float] = []
        self.weights_before: list[torch.Tensor] = []

    def networks(self):
        return {"net": self.net}

    def optimizer_definitions(self):
        return [
            OptimizerDefinition(
                "net", list(self.net.parameters()), OptimizerConfig(lr=1e-2, betas=[0.9, 0.999])
            )
        ]

    def on_fit_start(self):
        opt = self._raw_optimizer("net")
        original_step = opt.step

        def recording_step(*args, **kwargs):
            # What the optimizer really sees, after the core's unscale + clip.
            grads = [p.grad for p in self.net.parameters()]
            self.grad_norms_at_step.append(float(torch.nn.utils.get_total_norm(grads)))
            return original_step(*args, **kwargs)

        opt.step = recording_step

    def train_iteration(self, batch):
        x, y = batch
        self.weights_before.append(self.net.weight.detach().clone())
        with self.autocast():
            pred = self.net(x)
        loss = (pred.float() - y).square().mean() * 0.01 * self.poison.get(self.iteration, 1.0)
        self.loss_backward(loss, "net")
        if self.iteration in self.grad_poison:
            self.net.weight.grad.fill_(
                math.nan
            )  # a finite loss with NaN gradients (e.g. a bad custom backward)
        self.step("net")
        return IterationResult(x.shape[0], {"loss": loss.detach()})


def _fit(module: TinyCore, callbacks=(), steps: int = 4) -> L.Trainer:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=gen)
    y = x.sum(dim=1, keepdim=True) * 3
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    trainer = bare_trainer(callbacks)
    trainer.fit(module, loader)
    return trainer


def test_clipping_acts_on_unscaled_fp16_gradients_with_a_real_grad_scaler():
    """Lightning #18089: clipping before the scaler unscales clips `scale` times too hard. With a real
    torch.amp.GradScaler("cpu") (scale 65536) the optimizer must see gradients of norm exactly max_norm."""
    clipped = TinyCore(CoreSettings(precision="16-mixed", clip_grad_norm=0.05, max_steps=3))
    _fit(clipped)
    scaler = clipped.mixed_precision.scaler
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 2.0**16
    assert clipped.amp_overflow_skipped == 0 and len(clipped.grad_norms_at_step) == 3
    for norm in clipped.grad_norms_at_step:
        assert norm == pytest.approx(0.05, rel=1e-3)  # clipping scaled gradients would give 0.05 / 65536

    unclipped = TinyCore(CoreSettings(precision="32-true", clip_grad_norm=None, max_steps=1))
    _fit(unclipped)
    assert unclipped.grad_norms_at_step[0] > 0.4  # the clip above (0.05) really was active


def test_fp16_gradients_match_fp32_in_direction_after_unscaling():
    fp16 = TinyCore(CoreSettings(precision="16-mixed", clip_grad_norm=1.0, max_steps=1))
    fp32 = TinyCore(CoreSettings(precision="32-true", clip_grad_norm=1.0, max_steps=1))
    _fit(fp16)
    _fit(fp32)
    # Same first update direction: the Adam step of iteration 0 is lr * sign-ish(grad); compare weights.
    delta16 = fp16.net.weight.detach() - fp16.weights_before[0]
    delta32 = fp32.net.weight.detach() - fp32.weights_before[0]
    cos = torch.nn.functional.cosine_similarity(delta16.flatten(), delta32.flatten(), dim=0)
    assert cos > 0.99


@pytest.mark.parametrize("impl", ["foreach", "fused"])
@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed"])
def test_a_non_finite_step_is_skipped_counted_and_training_goes_on(precision, impl):
    """foreach: the host decides to skip; fused: the skip reaches the kernel as found_inf, on the device."""
    module = TinyCore(
        CoreSettings(precision=precision, max_steps=4, optimizer_impl=impl), poison={1: math.nan}
    )
    _fit(module)
    assert module.iteration == 4
    assert module.nonfinite_skipped == 1
    # Iteration 1 was skipped: the weights entering iteration 2 equal those entering iteration 1.
    assert torch.equal(module.weights_before[1], module.weights_before[2])
    assert not torch.equal(module.weights_before[2], module.weights_before[3])
    assert torch.isfinite(module.net.weight).all()


class OneRankPoisonedCore(TinyCore):
    """`inf` is added to the loss of rank `rank` at iteration `at`: a non-finite loss with finite gradients (the
    constant has none), so only the loss flag, summed over ranks, can tell the other rank to skip."""

    def __init__(self, core: CoreSettings, rank: int, at: int):
        super().__init__(core)
        self.poisoned_rank, self.poisoned_at = rank, at

    def train_iteration(self, batch):
        x, y = batch
        self.weights_before.append(self.net.weight.detach().clone())
        with self.autocast():
            pred = self.net(x)
        loss = (pred.float() - y).square().mean() * 0.01
        if (self.global_rank, self.iteration) == (self.poisoned_rank, self.poisoned_at):
            loss = loss + math.inf
        self.loss_backward(loss, "net")
        self.step("net")
        return IterationResult(x.shape[0], {"loss": loss.detach()})


def _one_rank_poisoned_worker(rank: int, port: int, impl: str, out_dir: str) -> None:
    # As torchrun starts a rank: the launch variables say who this process is, Lightning spawns nothing.
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_RANK=str(rank), NODE_RANK="0"
    )
    torch.set_num_threads(1)
    module = OneRankPoisonedCore(CoreSettings(max_steps=3, optimizer_impl=impl), rank=1, at=1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=gen)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=MultiNetworkDDPStrategy(process_group_backend="gloo"),
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) * 3), batch_size=8))
    torch.save(
        {
            "before": module.weights_before,
            "after": module.net.weight.detach(),
            "skipped": module.nonfinite_skipped,
        },
        Path(out_dir) / f"rank{rank}.pt",
    )


@pytest.mark.slow  # two processes
@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_a_non_finite_loss_on_one_rank_makes_every_rank_skip(tmp_path, impl):
    """DDP, 2 gloo processes: rank 1's loss is inf at iteration 1, rank 0's is finite and the gradients are finite on
    both. The loss flags are summed with the gradients, so both ranks skip that step and stay identical; a flag kept
    per rank would let rank 0 step alone and the ranks drift apart."""
    mp.spawn(_one_rank_poisoned_worker, args=(free_port(), impl, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for state in ranks:
        assert state["skipped"] == 1
        before = state["before"]
        assert torch.equal(before[1], before[2])  # iteration 1 changed nothing ...
        assert not torch.equal(before[0], before[1]) and not torch.equal(
            before[2], state["after"]
        )  # ... 0, 2 did
    assert torch.equal(ranks[0]["after"], ranks[1]["after"])
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["before"], ranks[1]["before"], strict=True))


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_nan_gradients_with_a_finite_loss_stop_the_run_in_every_precision(precision):
    """Under 16-mixed the GradScaler takes NaN gradients for an overflow and would halve the scale forever: K
    skipped steps in a row of one optimizer stop the run whatever the cause."""
    module = TinyCore(
        CoreSettings(precision=precision, max_steps=50, nonfinite_max_consecutive=3),
        grad_poison=set(range(2, 100)),
    )
    with pytest.raises(NonFiniteError, match="3 consecutive steps of optimizer net") as err:
        _fit(module)
    # foreach Adam: the host already waited for each skip decision, so the guard is read every iteration and
    # stops right after the third skip (iterations 2, 3, 4).
    assert module.iteration == 5 and "the last at iteration 4" in str(err.value)
    skipped = module.amp_overflow_skipped if precision == "16-mixed" else module.nonfinite_skipped
    assert skipped == 3


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_fused_steps_keep_the_guard_on_the_device_and_stop_within_two_logging_intervals(precision):
    """Fused Adam: skipped steps leave the weights bit-identical, the counters and the streak live on the device
    and are read one logging interval after a logging iteration staged them; the stop names the iteration where the
    streak reached the limit."""
    module = TinyCore(
        CoreSettings(
            precision=precision,
            max_steps=50,
            nonfinite_max_consecutive=3,
            optimizer_impl="fused",
            log_every_n_steps=4,
        ),
        grad_poison=set(range(2, 100)),
    )
    with pytest.raises(NonFiniteError, match="3 consecutive steps of optimizer net") as err:
        _fit(module)
    # The trip (after iteration 4) is staged at the next logging iteration (8) and read one interval later (12):
    # within two logging intervals, with no device read at a logging iteration.
    assert module.iteration == 12
    assert "the last at iteration 4" in str(err.value)
    skipped = module.amp_overflow_skipped if precision == "16-mixed" else module.nonfinite_skipped
    assert skipped == 10  # iterations 2..11
    for before in module.weights_before[3:]:
        assert torch.equal(before, module.weights_before[2])  # no skipped step moved a weight
    state = module._raw_optimizer("net").state[module.net.weight]
    assert int(state["step"]) == 2  # the fused kernel took back its step-count increment on every skip


class TwoOptimizerCore(TinyCore):
    """TinyCore plus a second network with its own optimizer whose gradients are always NaN."""

    def __init__(self, core: CoreSettings):
        super().__init__(core)
        self.other = nn.Linear(16, 1)

    def networks(self):
        return {"net": self.net, "other": self.other}

    def optimizer_definitions(self):
        config = OptimizerConfig(lr=1e-2, betas=[0.9, 0.999])
        return [
            *super().optimizer_definitions(),
            OptimizerDefinition("other", list(self.other.parameters()), config),
        ]

    def train_iteration(self, batch):
        x, _ = batch
        self.loss_backward(self.other(x).square().mean() * math.nan, "other")
        self.step("other")
        return super().train_iteration(batch)  # "net" steps fine every iteration


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_an_optimizer_that_never_steps_stops_the_run_while_another_one_does(impl):
    module = TwoOptimizerCore(
        CoreSettings(max_steps=50, nonfinite_max_consecutive=4, optimizer_impl=impl, log_every_n_steps=4)
    )
    with pytest.raises(NonFiniteError, match="4 consecutive steps of optimizer other"):
        _fit(module)
    # foreach: the host decides every step and reads the guard at once; fused: the guard staged at iteration 4 is
    # read at the next logging iteration.
    assert module.iteration == (8 if impl == "fused" else 4)


def test_consecutive_non_finite_steps_stop_with_a_message_and_keep_the_last_checkpoint(tmp_path):
    poison = {i: math.inf for i in range(2, 100)}
    module = TinyCore(CoreSettings(max_steps=50, nonfinite_max_consecutive=3), poison=poison)
    ckpt = IterationCheckpoint(str(tmp_path / "checkpoints"), every_n_steps=1, keep=2)
    with pytest.raises(NonFiniteError) as err:
        _fit(module, callbacks=[ckpt])
    message = str(err.value)
    assert "3 consecutive" in message and "train.nonfinite_max_consecutive" in message
    assert "clip_grad_norm" in message and "intact" in message
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["pixelsmith"]["iteration"] == 4
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())
    assert not list((tmp_path / "checkpoints").glob("*.partial"))


def test_schedule_follows_the_iteration_counter_not_global_step():
    settings = CoreSettings(max_steps=6, schedule=ScheduleConfig("warmup_cosine", 2, 0.1, None))
    module = TinyCore(settings)
    trainer = _fit(module)
    expected = 1e-2 * lr_multiplier(6, "warmup_cosine", 2, 6, 0.1)
    assert module._raw_optimizer("net").param_groups[0]["lr"] == pytest.approx(expected)
    assert trainer.global_step == 0  # Lightning's counter is not used: raw optimizer steps through our scaler


def test_warmup_cosine_shape():
    # The schedule group is a ScalarSchedule (core/schedules.py) in iterations: warm-up from 1/10 to 1 over 10.
    values = [lr_multiplier(i, "warmup_cosine", 10, 110, 0.1) for i in range(111)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(0.91)  # 0.1 + 0.9 * 9 / 10
    assert values[10] == pytest.approx(1.0) and values[60] == pytest.approx(0.55)
    assert values[110] == pytest.approx(0.1)
    # Off the symmetric points (where a wrong phase or a missing half would show): warm-up step 2 of 10 is
    # 0.1 + 0.9 * 2 / 10 = 0.28;
    # a quarter into the decay 0.1 + 0.9 * (1 + cos(pi/4)) / 2 = 0.868198, three quarters 0.231802.
    assert values[2] == pytest.approx(0.28)
    assert values[35] == pytest.approx(0.868198, abs=1e-6) and values[85] == pytest.approx(0.231802, abs=1e-6)
    assert lr_multiplier(500, "warmup_cosine", 10, 110, 0.1) == pytest.approx(0.1)  # stays at the floor after
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))
    assert lr_multiplier(5, "constant", 10, 110, 0.1) == 1.0
    with pytest.raises(ValueError, match="constant, warmup_cosine"):
        lr_multiplier(0, "linear", 0, 1, 0.0)


@pytest.mark.parametrize("as_tensor", [False, True])  # True: the device path of a CUDA-graph replay
def test_ema_matches_a_hand_computation_away_from_one_half_life(as_tensor):
    """A quarter half-life per iteration: beta = 0.5 ** (2500 / 10000) = 0.840896, so the average keeps 0.840896
    of itself and takes 0.159104 of the source (a swapped beta and 1 - beta gives the reverse). One half-life
    (beta = 0.5, the test below) cannot tell them apart."""
    source, seen = nn.Linear(2, 2), 10**9
    ema = EMA(source, half_life_kimg=10.0, rampup=None)
    with torch.no_grad():
        ema.model.weight.fill_(0.0)
        source.weight.fill_(1.0)
        source.bias.fill_(-2.0)
        ema.model.bias.fill_(2.0)
    images_seen = torch.tensor(seen) if as_tensor else seen
    beta = ema.update(source, images_per_iteration=2500, images_seen=images_seen)
    assert float(beta) == pytest.approx(0.840896, abs=1e-6)
    assert torch.allclose(ema.model.weight, torch.full((2, 2), 0.159104), atol=1e-6)
    assert torch.allclose(ema.model.bias, torch.full((2,), 2.0 * 0.840896 - 2.0 * 0.159104), atol=1e-6)
    # Ramp-up: after 10,000 images the half-life is at most 0.05 * 10,000 = 500 images: beta = 0.5 ** 5.
    ramped = EMA(source, half_life_kimg=10.0, rampup=0.05)
    assert float(ramped.beta(2500, torch.tensor(10_000) if as_tensor else 10_000)) == pytest.approx(0.03125)


def test_the_graphed_emas_betas_come_from_the_host_bit_for_bit():
    """Under CUDA graphs the EMA reads its beta from a table the host made at the start (or, once the ramp-up is
    over, the host's constant), indexed by the device's iteration: the averaged weights equal the eager path's bit
    for bit at every iteration, through the ramp-up's end and past it; a second batch size falls back to the device
    formula instead of reading rows made for the first."""
    torch.manual_seed(0)
    source = nn.Linear(3, 3)
    eager = EMA(source, half_life_kimg=0.01, rampup=0.05)  # the ramp-up ends at 200 images: iteration 50 at 4
    graphed = EMA(source, half_life_kimg=0.01, rampup=0.05)
    start, seen0, per = 3, 12, 4  # a resumed run: iteration 3, 12 images seen
    for k in range(start, 80):
        with torch.no_grad():
            source.weight.add_(0.01 * k)
        seen = seen0 + (k - start) * per
        beta_eager = eager.update(source, per, seen)
        beta_graphed = graphed.update(source, per, torch.tensor(seen), torch.tensor(k), (start, seen0, 80))
        assert torch.equal(eager.model.weight, graphed.model.weight), k
        assert float(beta_graphed) == pytest.approx(beta_eager, rel=1e-6)
    rows, whole = graphed._tables[next(iter(graphed._tables))]
    assert whole and len(rows) == 81  # to max_steps 80: the index needs no clamp
    assert graphed._betas_by_iteration(8, start, seen0, 80, torch.device("cpu")) is None  # another batch size
    done = EMA(source, half_life_kimg=0.01, rampup=0.05)
    constant = done._betas_by_iteration(per, 100, 400, 1000, torch.device("cpu"))
    assert constant == done.beta(per, 400)  # the ramp-up is over: the host's float, baked into a graph as is


def test_the_ema_ramp_up_reads_the_images_seen_before_the_iteration_as_nvlabs(make_cfg):
    """StyleGAN2-ADA training/training_loop.py: ema_nimg = min(ema_kimg * 1000, cur_nimg * ema_rampup), beta = 0.5 **
    (batch / max(ema_nimg, 1e-8)), with cur_nimg advanced after the update. Batch 16, ramp-up 0.05: iteration 0
    copies G (beta 0), iteration 1 has 16 images behind it (beta 0.5 ** (16 / 0.8) = 0.5 ** 20), iteration 2 32
    (0.5 ** 10); counting the iteration's own images would give 0.5 ** 20, 0.5 ** 10, 0.5 ** (20 / 3)."""
    from pixelsmith.run.fit import run
    from tests.conftest import metrics_rows, series

    cfg = make_cfg(
        "max_steps=3", "train.log_every_n_steps=1", "model.ema.rampup=0.05", "model.ema.half_life_kimg=10"
    )
    run(cfg)
    betas = series(metrics_rows(Path(cfg.paths.output_dir)), "ema/G_beta")
    assert betas == pytest.approx([0.0, 0.5**20, 0.5**10], rel=1e-6, abs=1e-12)


def test_ema_half_life_and_rampup():
    source = nn.Linear(2, 2)
    ema = EMA(source, half_life_kimg=10.0, rampup=None)
    assert ema.beta(10_000, 10**9) == pytest.approx(0.5)  # one half-life of images halves the old weight
    ramped = EMA(source, half_life_kimg=10.0, rampup=0.05)
    assert ramped.beta(64, 64 * 10) == pytest.approx(0.5 ** (64 / (640 * 0.05)))
    with torch.no_grad():
        source.weight.add_(1.0)
    before = ema.model.weight.clone()
    ema.update(source, images_per_iteration=10_000, images_seen=10**9)
    assert torch.allclose(ema.model.weight, before + 0.5)
    ema.train()
    assert not ema.model.training  # stays in eval mode whatever the owner does


def test_sampler_shards_ranks_disjointly_and_resumes_at_any_iteration():
    full = list(IterationSampler(10, batch_per_rank=3, seed=5, start_iteration=0, num_iterations=6))
    ranks = [list(IterationSampler(10, 3, 5, 0, 6, rank=r, world_size=2)) for r in range(2)]
    # Iteration 0 of the 2-rank stream covers 6 distinct items of the first permutation.
    assert len(set(ranks[0][:3] + ranks[1][:3])) == 6
    resumed = list(IterationSampler(10, 3, 5, start_iteration=4, num_iterations=2))
    assert resumed == full[12:]
    assert sorted(full[:10]) == list(range(10))  # each epoch is a permutation


def test_global_batch_must_divide_across_processes():
    assert per_rank_batch(64, 2, 4) == 128
    with pytest.raises(BatchSizeError) as err:
        per_rank_batch(15, 2, 1)
    assert "data.batch_size=15" in str(err.value) and "data.batch_size=14" in str(err.value)


class ForgetfulCore(TinyCore):
    """A model that backpropagates but forgets to step: the core must refuse, not carry gradients over."""

    def train_iteration(self, batch):
        x, y = batch
        self.loss_backward((self.net(x) - y).square().mean(), "net")
        return IterationResult(x.shape[0])


class NoResultCore(TinyCore):
    def train_iteration(self, batch):
        super().train_iteration(batch)  # steps, but returns nothing


@pytest.mark.parametrize(
    ("module_cls", "message"),
    [
        (ForgetfulCore, r"loss_backward for optimizer\(s\) \['net'\] without self.step"),
        (NoResultCore, "IterationResult"),
    ],
)
def test_the_core_ends_the_iteration_and_refuses_a_broken_contract(module_cls, message):
    with pytest.raises(PixelsmithError, match=message):
        _fit(module_cls(CoreSettings(max_steps=2)))


def test_the_core_stops_at_max_steps_without_the_model_asking():
    module = TinyCore(CoreSettings(max_steps=3))
    trainer = _fit(module, steps=3)
    # The Trainer runs with max_steps=-1 in train.py; here too the core alone ends the run.
    assert module.iteration == 3 and trainer.should_stop


class GraphableTinyCore(TinyCore):
    supports_cuda_graphs = True


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_a_nan_loss_streak_stops_the_run_within_two_logging_intervals(cuda_graphs):
    """A loss that turns NaN for good (its gradients with it) is caught by the one finite check over loss and
    gradient norm, on the graphed path too (uncaptured on CPU): the streak reaches the limit at iteration 4, and the
    run stops at a logging iteration at most two intervals on, naming that iteration."""
    module = GraphableTinyCore(
        CoreSettings(
            max_steps=50,
            nonfinite_max_consecutive=3,
            optimizer_impl="fused",
            log_every_n_steps=4,
            cuda_graphs=cuda_graphs,
        ),
        poison={i: math.nan for i in range(2, 100)},
    )
    with pytest.raises(NonFiniteError, match="3 consecutive steps of optimizer net") as err:
        _fit(module)
    assert (module._iteration_t is not None) == cuda_graphs  # the graphed path's device counters were used
    assert 4 < module.iteration <= 4 + 2 * 4
    assert "the last at iteration 4" in str(err.value)
    assert module.nonfinite_skipped == module.iteration - 2
    for before in module.weights_before[3:]:
        assert torch.equal(before, module.weights_before[2])


class BackwardHooks(L.Callback):
    """Counts Lightning's hooks around each backward; its mere presence sends the core through `manual_backward`."""

    def __init__(self):
        self.before = self.after = 0

    def on_before_backward(self, trainer, pl_module, loss):
        self.before += 1

    def on_after_backward(self, trainer, pl_module):
        self.after += 1


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_backward_skips_lightnings_dispatch_only_where_no_hook_would_run_and_trains_the_same(precision):
    """Without a hook around the backward (nor another precision plugin or a DDP wrapper), the core calls
    `loss.backward()` itself: the same gradients and weights, bit for bit, as through Lightning's `manual_backward`,
    which a run with such a hook still takes (every hook called once per backward). fp16: the scaled loss either way."""
    hooks = BackwardHooks()
    through_lightning = TinyCore(CoreSettings(precision=precision, clip_grad_norm=1.0, max_steps=4))
    _fit(through_lightning, callbacks=[hooks])
    direct = TinyCore(CoreSettings(precision=precision, clip_grad_norm=1.0, max_steps=4))
    _fit(direct)
    assert not through_lightning._direct_backward and direct._direct_backward
    assert hooks.before == hooks.after == 4  # one backward an iteration, each with both hooks
    assert direct.grad_norms_at_step == through_lightning.grad_norms_at_step
    for a, b in zip(direct.weights_before, through_lightning.weights_before, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(direct.net.weight, through_lightning.net.weight)


@pytest.mark.parametrize("method", ["backward", "manual_backward"])
def test_a_model_overriding_lightnings_backward_keeps_it(method):
    calls = []

    def counted(self, loss, *args, **kwargs):
        calls.append(method)
        getattr(L.LightningModule, method)(self, loss, *args, **kwargs)

    own = type("OwnBackward", (TinyCore,), {method: counted})
    module = own(CoreSettings(precision="32-true", max_steps=3))
    _fit(module)
    assert not module._direct_backward and calls == [method] * 3


def test_the_gradient_norm_of_one_group_is_get_total_norms_bit_for_bit():
    """The guard's norm for gradients of one device and dtype skips `get_total_norm`'s per-tensor host work but is the
    same number: 13 for (3, 4) and (12), and the same bits over tensors of very different scales."""
    from pixelsmith.core.stepping import OptimizerStepper, global_norm

    assert global_norm([torch.tensor([3.0, 4.0]), torch.tensor([12.0])], one_group=True).item() == 13.0
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(7, 5, generator=gen) * 10.0 ** (i % 9 - 4) for i in range(60)]
    assert torch.equal(global_norm(grads, one_group=True), torch.nn.utils.get_total_norm(grads))
    assert torch.equal(global_norm(grads), torch.nn.utils.get_total_norm(grads))
    # Which optimizers qualify, decided once each: one dtype yes; a bf16 tensor among fp32 ones no.
    stepper = OptimizerStepper(accumulate=1, clip_grad_norm=None)
    same = torch.optim.Adam([nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2))])
    mixed = torch.optim.Adam(
        [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]
    )
    assert stepper._one_group("same", same) and not stepper._one_group("mixed", mixed)
