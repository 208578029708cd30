"""GAN training end to end through the real config tree: every model in both CPU precisions, outputs on disk,
losses that move the right way, accumulation equal to a bigger batch, and bit-for-bit resume."""

from __future__ import annotations

import math

import pytest
import torch

from pixelsmith.run.fit import run
from tests.conftest import last_checkpoint, metrics_rows, series


@pytest.mark.parametrize("model", ["dcgan", "stylegan2"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_short_train_writes_every_output(make_cfg, tmp_path, model, precision):
    cfg = make_cfg(
        f"precision={precision}",
        "max_steps=6",
        "train.sample_every_n_steps=3",
        "train.checkpoint_every_n_steps=3",
        "train.log_every_n_steps=1",
        "logger=default",
        model=model,
    )
    metrics = run(cfg)
    out = tmp_path / "run"
    assert metrics["iteration"] == 6
    assert math.isfinite(metrics["loss/D"]) and math.isfinite(metrics["loss/G"])
    assert sorted(p.name for p in (out / "samples").glob("*.png")) == [
        "step_0000000.png",
        "step_0000003.png",
        "step_0000006.png",
    ]
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["last.ckpt", "step_0000003.ckpt", "step_0000006.ckpt"]  # no partial files left behind
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "config_resolved.yaml").read_text().count(f"precision: {precision}") >= 1
    state = last_checkpoint(out)
    assert state["pixelsmith"]["iteration"] == 6 and state["pixelsmith"]["precision"] == precision
    assert state["pixelsmith_config"]["model"]["name"] == model
    rows = metrics_rows(out)
    assert len(series(rows, "loss/D")) == 6


def test_discriminator_learns_and_generator_gets_gradients(make_cfg, tmp_path):
    """On 64 digits D's loss must fall from its chance value 2*ln(2) while G receives non-zero gradients."""
    cfg = make_cfg(
        "precision=32-true",
        "max_steps=60",
        "data.limit=64",
        "train.log_every_n_steps=1",
        "train.sample_every_n_steps=0",
    )
    run(cfg)
    rows = metrics_rows(tmp_path / "run")
    loss_d = series(rows, "loss/D")
    assert len(loss_d) == 60
    assert loss_d[0] == pytest.approx(2 * math.log(2), abs=0.35)
    assert sum(loss_d[-10:]) / 10 < loss_d[0] - 0.3
    grad_g = series(rows, "grad_norm/G")
    assert all(math.isfinite(g) and g > 0 for g in grad_g)


def test_accumulation_equals_one_bigger_batch(make_cfg, tmp_path):
    """accumulate=4 x batch 4 must give the update of 1 x batch 16 (no batch-dependent layers: norm=none)."""
    common = [
        "precision=32-true",
        "max_steps=2",
        "model.generator.norm=none",
        "model.discriminator.norm=none",
        "train.sample_every_n_steps=0",
    ]
    run(make_cfg(*common, "data.batch_size=4", "accumulate=4", output="accumulated"))
    run(make_cfg(*common, "data.batch_size=16", "accumulate=1", output="big_batch"))
    accumulated = last_checkpoint(tmp_path / "accumulated")["state_dict"]
    big = last_checkpoint(tmp_path / "big_batch")["state_dict"]
    assert accumulated.keys() == big.keys()
    worst = max((accumulated[k].float() - big[k].float()).abs().max().item() for k in big)
    # Float summation order differs; Adam turns a gradient's rounding into a step error proportional to the lr, so
    # the bound is relative to it (1% of one step: a wrong accumulation, e.g. the last micro-batch's gradient alone,
    # moves weights by a whole step).
    lr = make_cfg(*common).model.g_optimizer.lr
    assert worst < 0.01 * lr, (worst, lr)
    # ...and it really is a different computation from a single micro-batch of 4.
    run(make_cfg(*common, "data.batch_size=4", "accumulate=1", output="small"))
    small = last_checkpoint(tmp_path / "small")["state_dict"]
    assert max((small[k].float() - big[k].float()).abs().max().item() for k in big) > 1e-4


@pytest.mark.parametrize(
    ("model", "initial_p"), [("dcgan", 0.2), ("stylegan2", 0.2), ("dcgan", 0.0), ("r3gan", 0.2)]
)
def test_resume_continues_bit_for_bit(make_cfg, tmp_path, model, initial_p):
    """8 straight iterations == 4 iterations, a resume from last.ckpt, 4 more: weights, EMA, Adam state, schedules,
    ADA probability and counters all identical. With p starting at 0 the host's bound on p (raised by each
    adjustment, reset to p at a resume) must not change the random streams."""
    common = [
        "precision=32-true",
        "augment=ada",
        f"augment.initial_p={initial_p}",
        "augment.interval=1",
        "schedule=warmup_cosine",
        "schedule.warmup_steps=3",
        "schedule.total_steps=8",  # the cosine horizon must not depend on the first leg's max_steps
        "train.sample_every_n_steps=0",
        "train.checkpoint_every_n_steps=4",
    ]
    if (
        model == "r3gan"
    ):  # every schedule R3GAN's presets use, over these 8 iterations' 64 images, in place of the lr's
        horizon = "horizon_kimg:0.064"
        common = [c for c in common if not c.startswith("schedule")] + [
            "augment.target=null",
            "augment.pipeline='bgc,cutout'",
            "model.ema.rampup=null",
            f"+model.schedules.lr={{start:2e-3,final:5e-4,{horizon}}}",
            f"+model.schedules.beta2={{start:0.9,final:0.99,{horizon}}}",
            f"+model.schedules.gamma={{start:0.2,final:0.02,{horizon}}}",
            f"+model.schedules.ema_half_life_kimg={{start:0,final:0.05,{horizon}}}",
            f"+model.schedules.augment_p={{start:0,final:0.55,shape:linear,{horizon}}}",
        ]
    if model == "stylegan2":  # lazy R1 and path length, whose running mean pl_mean is resumable state too
        common += ["model.objective.regularizers.r1.interval=2", "model.objective.regularizers.r1.gamma=0.1"]
        common += [
            "model.objective.regularizers.path_length.weight=1.0",
            "model.objective.regularizers.path_length.interval=2",
        ]
    run(make_cfg(*common, "max_steps=8", model=model, output="straight"))
    run(make_cfg(*common, "max_steps=4", model=model, output="resumed"))
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    run(make_cfg(*common, "max_steps=8", f"ckpt_path={last}", model=model, output="resumed"))
    straight, resumed = last_checkpoint(tmp_path / "straight"), last_checkpoint(tmp_path / "resumed")
    assert resumed["pixelsmith"]["iteration"] == straight["pixelsmith"]["iteration"] == 8
    assert resumed["pixelsmith"]["images_seen"] == straight["pixelsmith"]["images_seen"]
    for key, value in straight["state_dict"].items():
        # bit for bit; a NaN matches a NaN (ADA's r_t before any adjustment, and always under a scheduled p)
        assert torch.equal(value.nan_to_num(), resumed["state_dict"][key].nan_to_num()), key
    assert any("augment" in k for k in straight["state_dict"])
    if model == "stylegan2":
        assert straight["state_dict"]["objective.regularizers.path_length.pl_mean"] > 0
    if model == "r3gan":  # the schedules count D-step images: 8 iterations x half the loader batch of 16
        assert straight["pixelsmith"]["images_seen"] == 8 * 8
        assert straight["state_dict"]["augment.p"] > 0
    for opt_a, opt_b in zip(straight["optimizer_states"], resumed["optimizer_states"], strict=True):
        for pid, st in opt_a["state"].items():
            for name, tensor in st.items():
                assert torch.equal(torch.as_tensor(tensor), torch.as_tensor(opt_b["state"][pid][name])), name
    assert straight["lr_schedulers"] == resumed["lr_schedulers"]


@pytest.mark.parametrize(
    "precision",
    # bf16 carries no state of its own (no loss scaling) and is emulated, slowly, on CPUs without bf16: --all only.
    [pytest.param("bf16-mixed", marks=pytest.mark.slow), "16-mixed"],
)
def test_resume_continues_bit_for_bit_in_mixed_precision(make_cfg, tmp_path, precision):
    """The mixed precisions' resume: 6 straight iterations == 3, a resume, 3 more. 16-mixed carries the GradScaler
    (scale, growth tracker) in the checkpoint: restored, the resumed run's scaler is the straight one's; started
    afresh its growth tracker would count from 0 again (and after an overflow its scale would be 2x off)."""
    common = [
        f"precision={precision}",
        "train.sample_every_n_steps=0",
        "train.checkpoint_every_n_steps=3",
        "data.batch_size=8",
    ]
    run(make_cfg(*common, "max_steps=6", output="straight"))
    run(make_cfg(*common, "max_steps=3", output="resumed"))
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    run(make_cfg(*common, "max_steps=6", f"ckpt_path={last}", output="resumed"))
    straight, resumed = last_checkpoint(tmp_path / "straight"), last_checkpoint(tmp_path / "resumed")
    # Counters, guard and fp16 overflow counts, and the GradScaler's state: all of the core's resumable state.
    assert resumed["pixelsmith"] == straight["pixelsmith"]
    scaler = straight["pixelsmith"]["grad_scaler"]
    if precision == "16-mixed":
        # fp16 overflows in the first steps halve the scale from 2^16 (growth needs 2000 good steps in a row); the
        # tracker counts the good steps (two optimizers per iteration) since the last overflow.
        overflows = straight["pixelsmith"]["amp_overflow_skipped"]
        assert overflows > 0 and scaler["scale"] == 65536.0 / 2**overflows
        assert 0 < scaler["_growth_tracker"] <= 12 - overflows
    else:
        assert scaler == {}  # bf16 has fp32's range: no loss scaling, nothing to resume
    for key, value in straight["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key
    for opt_a, opt_b in zip(straight["optimizer_states"], resumed["optimizer_states"], strict=True):
        for pid, st in opt_a["state"].items():
            for name, tensor in st.items():
                assert torch.equal(torch.as_tensor(tensor), torch.as_tensor(opt_b["state"][pid][name])), name


def test_hinge_loss_matches_a_hand_computation():
    """Hinge (SAGAN/BigGAN): D pays only inside the margin, G maximises D's fake logits (training with it:
    test_hinge_loss_trains_the_discriminator below)."""
    from pixelsmith.gan.objectives import HingeLoss

    real, fake = torch.tensor([2.0, 0.5]), torch.tensor([-3.0, 0.0])
    # relu(1 - real) = [0, 0.5] -> 0.25; relu(1 + fake) = [0, 1] -> 0.5
    assert HingeLoss().discriminator(real, fake).item() == pytest.approx(0.75)
    assert HingeLoss().generator(fake).item() == pytest.approx(1.5)


def test_hinge_loss_trains_the_discriminator(make_cfg, tmp_path):
    cfg = make_cfg(
        "model/objective/loss=hinge",
        "precision=32-true",
        "max_steps=40",
        "data.limit=64",
        "train.log_every_n_steps=1",
        "train.sample_every_n_steps=0",
    )
    run(cfg)
    loss_d = series(metrics_rows(tmp_path / "run"), "loss/D")
    assert loss_d[0] == pytest.approx(2.0, abs=0.5)  # logits near 0: each hinge term is about 1
    assert sum(loss_d[-10:]) / 10 < loss_d[0] - 0.5


def test_metrics_of_some_iterations_only_reach_the_next_logging_iteration(make_cfg, tmp_path):
    """`self.log` runs on logging iterations only; lazy R1's `loss/r1` (computed every 4th iteration here) must still
    be written, fresh, at each logging iteration (every 5th), not frozen at its first value."""
    cfg = make_cfg(
        "precision=32-true",
        "model.objective.regularizers.r1.gamma=1.0",
        "model.objective.regularizers.r1.interval=4",
        "max_steps=20",
        "train.log_every_n_steps=5",
        "train.sample_every_n_steps=0",
    )
    run(cfg)
    rows = metrics_rows(tmp_path / "run")
    r1 = series(rows, "loss/r1")
    assert len(r1) == 4 and len(set(r1)) == 4  # iterations 5, 10, 15, 20: four different R1 values
    assert len(series(rows, "loss/D")) == 4
