"""Scheduled hyper-parameters (`model.schedules`, core/schedules.py): the three shapes and the warm-up against hand
computations and against R3GAN's own formula (`brownvc/R3GAN`, `training/training_loop.py`,
`cosine_decay_with_warmup`: decay = (1 + cos(pi (n - warmup) / (total - warmup))) / 2, value = base + (1 - decay)
(final - base), a linear warm-up from warmup_value below warmup_nimg, final past total_nimg); a run in which every
hyper-parameter R3GAN schedules (lr, beta2, gamma, the EMA half-life, ADA's p) holds its hand-computed value; the
device path of a CUDA-graph replay against the host's; and start-up errors that name the fix."""

from __future__ import annotations

import math

import pytest
import torch

from pixelsmith.core.schedules import ScalarSchedule
from pixelsmith.errors import PixelsmithError
from pixelsmith.run.fit import run
from tests.conftest import last_checkpoint


def _reference_cosine_decay_with_warmup(n, base, total, final=0.0, warmup_value=0.0, warmup=0):
    """R3GAN's formula, rewritten from its definition for the comparison (no hold phase: no preset uses it)."""
    decay = 0.5 * (1 + math.cos(math.pi * (n - warmup) / float(total - warmup)))
    value = base + (1 - decay) * (final - base)
    if warmup > 0 and n < warmup:
        value = (base - warmup_value) / warmup * n + warmup_value
    return final if n > total else value


def test_cosine_linear_and_constant_by_hand_away_from_the_midpoint():
    cosine = ScalarSchedule(2e-4, 5e-5, "cosine", horizon=20e6)
    # A quarter of the way: (1 - cos(pi / 4)) / 2 = 0.146447 of the way down: 2e-4 - 0.146447 * 1.5e-4 = 1.780330e-4.
    assert cosine.value(5e6) == pytest.approx(1.780330e-4, rel=1e-6)
    assert cosine.value(0) == 2e-4 and cosine.value(20e6) == pytest.approx(5e-5) and cosine.value(1e9) == 5e-5
    linear = ScalarSchedule(0.9, 0.99, "linear", horizon=20e6)
    assert linear.value(5e6) == pytest.approx(0.9225)  # 0.9 + 0.25 * 0.09
    assert ScalarSchedule(0.3, 0.3, "constant").value(1e12) == 0.3
    # The ramps of R3GAN's CIFAR-10 preset at 3M images (not a symmetric point), against its formula.
    for base, final in [(2e-4, 5e-5), (0.9, 0.99), (0.05, 0.005), (0.0, 5e6), (0.0, 0.55)]:
        ours = ScalarSchedule(base, final, "cosine", horizon=2e7).value(3e6)
        assert ours == pytest.approx(_reference_cosine_decay_with_warmup(3e6, base, 2e7, final), rel=1e-12)


def test_the_warm_up_climbs_from_its_start_then_the_horizon_counts_from_zero():
    schedule = ScalarSchedule(1.0, 0.1, "cosine", horizon=110, warmup=10, warmup_start=0.2)
    assert schedule.value(0) == 0.2 and schedule.value(5) == pytest.approx(0.6)  # 0.2 + 0.8 * 5 / 10
    assert schedule.value(10) == 1.0
    # 35: a quarter into the decay's 100 units: 0.1 + 0.9 * (1 + cos(pi / 4)) / 2 = 0.868198.
    assert schedule.value(35) == pytest.approx(0.868198, abs=1e-6)
    for n in (0, 3, 10, 35, 85, 200):
        expected = _reference_cosine_decay_with_warmup(n, 1.0, 110, 0.1, warmup_value=0.2, warmup=10)
        assert schedule.value(n) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("shape", ["constant", "linear", "cosine"])
def test_the_device_path_computes_the_hosts_number(shape):
    """A CUDA-graph replay evaluates the schedule from the device's count: the same formula in float64."""
    schedule = ScalarSchedule(0.9, 0.99, shape, horizon=1000.0, warmup=100.0, warmup_start=0.5)
    for n in (0, 50, 100, 333, 999, 5000):
        on_device = schedule.value(torch.tensor(n, dtype=torch.long))
        assert on_device.dtype == torch.float64 and on_device.item() == pytest.approx(
            schedule.value(n), abs=1e-15
        )


def test_bad_schedules_fail_at_construction_naming_the_fix():
    with pytest.raises(PixelsmithError, match="needs 0 <= warmup"):
        ScalarSchedule(1.0, 0.0, "cosine", horizon=10, warmup=10)
    with pytest.raises(PixelsmithError, match="constant, linear, cosine"):
        ScalarSchedule(1.0, 0.0, "step", horizon=10)


# 5 iterations of 8 images (FAST's loader batch of 16, half for D's step): the last one reads the 32 images before it.
_HORIZON = "horizon_kimg:0.096"  # 96 images: 32 is a third of the way, where no shape is symmetric
_SCHEDULED = [
    "model.ema.rampup=null",
    "augment=ada",
    "augment.target=null",
    f"+model.schedules.lr={{start:2e-3,final:5e-4,shape:cosine,{_HORIZON}}}",
    f"+model.schedules.beta2={{start:0.9,final:0.99,shape:linear,{_HORIZON}}}",
    "+model.schedules.gamma={start:0.3,final:0.3,shape:constant,warmup_kimg:0.048,warmup_start:0}",
    f"+model.schedules.ema_half_life_kimg={{start:0,final:0.05,shape:cosine,{_HORIZON}}}",
    "+model.schedules.augment_p={start:0.4,shape:constant}",
    "max_steps=5",
    "train.log_every_n_steps=5",
    "train.sample_every_n_steps=0",
]


def test_every_hyper_parameter_r3gan_schedules_holds_its_hand_computed_value(make_cfg, tmp_path):
    metrics = run(make_cfg(*_SCHEDULED, model="r3gan", output="eager"))
    # lr: a third down the cosine: 2e-3 - 1.5e-3 * (1 - cos(pi / 3)) / 2 = 2e-3 - 1.5e-3 * 0.25 = 1.625e-3.
    assert metrics["schedule/lr"] == pytest.approx(1.625e-3, rel=1e-6)  # logged as float32
    assert metrics["schedule/beta2"] == pytest.approx(0.93)  # 0.9 + 0.09 / 3
    assert metrics["schedule/gamma"] == pytest.approx(0.2)  # warming up: 0.3 * 32 / 48
    assert metrics["r3gan/gamma"] == pytest.approx(0.2)  # ... and what the loss used
    assert metrics["schedule/augment_p"] == pytest.approx(0.4)
    # EMA half-life 50 * 0.25 = 12.5 images: beta = 0.5 ** (8 / 12.5) = 0.641713.
    assert metrics["ema/G_beta"] == pytest.approx(0.641713, abs=1e-6)
    saved = last_checkpoint(tmp_path / "eager")
    for state in saved["optimizer_states"]:
        group = state["param_groups"][0]
        assert group["lr"] == pytest.approx(1.625e-3) and group["betas"][1] == pytest.approx(0.93)
        assert group["betas"][0] == 0.0
    assert saved["state_dict"]["augment.p"].item() == pytest.approx(0.4)


def test_under_cuda_graphs_the_schedules_run_on_the_device_and_train_as_eagerly(make_cfg, tmp_path):
    """hardware.cuda_graphs=true on a CPU runs the graphed iteration's code uncaptured: the counts, schedules, lrs
    and betas are device tensors written inside the iteration. Same values, same training."""
    eager = run(make_cfg(*_SCHEDULED, model="r3gan", output="eager"))
    graphed = run(make_cfg(*_SCHEDULED, "hardware.cuda_graphs=true", model="r3gan", output="graphed"))
    for key in ("schedule/lr", "schedule/beta2", "schedule/gamma", "ema/G_beta"):
        assert graphed[key] == pytest.approx(eager[key], rel=1e-7), key
    a, b = last_checkpoint(tmp_path / "eager"), last_checkpoint(tmp_path / "graphed")
    group = b["optimizer_states"][0]["param_groups"][0]
    assert torch.is_tensor(group["lr"]) and torch.is_tensor(group["betas"][1])  # device values, not floats
    for key, value in a["state_dict"].items():
        if value.is_floating_point():
            torch.testing.assert_close(
                b["state_dict"][key], value, rtol=1e-5, atol=1e-6, equal_nan=True, msg=key
            )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+model.schedules.momentum={start:0.9}"], r"cannot schedule.*lr, G_lr.*gamma, augment_p"),
        (["+model.schedules.gamma={start:0.1,final:0.01}"], "needs horizon_kimg"),
        (["+model.schedules.gamma={begin:0.1}"], r"unknown keys \['begin'\].*start required"),
        (
            ["+model.schedules.lr={start:1e-3,shape:constant}", "schedule=warmup_cosine"],
            "would both set the learning rate",
        ),
    ],
)
def test_a_wrong_schedule_fails_at_start_up_naming_the_fix(make_cfg, overrides, message):
    with pytest.raises(PixelsmithError, match=message):
        run(make_cfg("augment=ada", *overrides, "max_steps=1", model="r3gan"))


def test_a_scheduled_p_with_adas_own_adaptation_is_refused(make_cfg):
    with pytest.raises(PixelsmithError, match="set augment.target=null"):
        run(make_cfg("augment=ada", "+model.schedules.augment_p={start:0.2,shape:constant}", model="r3gan"))
