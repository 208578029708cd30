"""Config values that make no sense stop at start-up, each named with a valid value (config/validate.py): the bad
command lines a new user tried, as a table. Nothing trains and no checkpoint is written."""

from __future__ import annotations

import logging
import re

import pytest

from pixelsmith.config.paths import CONF_DIR
from pixelsmith.config.validate import ConfigValueError, validate_config
from pixelsmith.run.fit import run
from tests.conftest import run_cli

BAD_VALUES = [
    # (override, the key the message must name, a valid value it must offer)
    ("data.batch_size=0", "data.batch_size", "data.batch_size=64"),
    ("hardware.devices=0", "hardware.devices", "hardware.devices=1"),
    ("train.clip_grad_norm=-1", "train.clip_grad_norm", "gradient ascent"),
    ("model.objective.regularizers.r1.gamma=-1", "model.objective.regularizers.r1.gamma", "r1.gamma=10.0"),
    ("train.log_every_n_steps=0", "train.log_every_n_steps", "train.log_every_n_steps=10"),
    ("eval.num_samples=-5", "eval.num_samples", "eval.num_samples=2000"),
    ("eval.monitor=foo", "eval.monitor", "eval.monitor=fid"),
    ("data.limit=-3", "data.limit", "data.limit=null"),
    ("+maxsteps=5", "maxsteps", "Did you mean max_steps?"),
    ("model.g_optimizer.lr=-1", "model.g_optimizer.lr", "model.g_optimizer.lr=2.0e-4"),
    ("model.g_optimizer.betas=[0.5]", "model.g_optimizer.betas", "[0.5,0.999]"),
    ("data.resolution=0", "data.resolution", "data.resolution=32"),
    ("model.objective.regularizers.r1.interval=0", "model.objective.regularizers.r1.interval", "interval=16"),
    ("eval.batch_size=0", "eval.batch_size", "eval.batch_size=250"),
    ("train.nonfinite_max_consecutive=-1", "train.nonfinite_max_consecutive", "=20"),
    ("train.preemption.check_every_n_steps=0", "train.preemption.check_every_n_steps", "=null"),
    ("schedule.min_lr_ratio=2", "schedule.min_lr_ratio", "[0, 1]"),
    ("accumulate=0", "accumulate", "accumulate=1"),
    ("augment=ada augment.target=2.0", "augment.target", "augment.target=0.6"),
    ("augment=ada augment.target=0", "augment.target", "p can never rise"),
    ("hardware.num_workers=-2", "hardware.num_workers", "hardware.num_workers=2"),
    ("model.ema.rampup=-1", "model.ema.rampup", "model.ema.rampup=0.05"),
    ("model.ema.rampup=0", "model.ema.rampup", "no average at all"),
    ("objective=eval/nonexistent_metric", "objective", "objective=eval/best_fid"),
    ("objective=eval/kid_mean", "objective", "eval.metrics=['fid', 'pr']"),  # kid is not among the metrics
    ("objective=eval/best_fd", "objective", "Did you mean eval/best_fid?"),
    # A scheduled value obeys its plain key's range over the whole schedule: start, final and the warm-up's start.
    ("+model.schedules.lr={start:-1,shape:constant}", "model.schedules.lr.start", "lr.start=2.0e-4"),
    (
        "+model.schedules.lr={start:2e-4,final:-1e-3,shape:linear,horizon_kimg:10}",
        "model.schedules.lr.final",
        "at 0 nothing learns",
    ),
    (
        "+model.schedules.beta2={start:0.99,final:1.5,shape:cosine,horizon_kimg:10}",
        "model.schedules.beta2.final",
        "NaN",
    ),
    (
        "+model.schedules.d_lr={start:2e-4,shape:constant,warmup_kimg:1,warmup_start:-1e-4}",
        "model.schedules.d_lr.warmup_start",
        "must be > 0",
    ),
    (
        "augment=ada augment.target=null +model.schedules.augment_p={start:0,final:2,shape:linear,horizon_kimg:9}",
        "model.schedules.augment_p.final",
        "probability in [0, 1]",
    ),
    ("augment=ada augment.max_p=1.5", "augment.max_p", "augment.max_p=1.0"),
]


@pytest.mark.parametrize(("override", "key", "fix"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_each_bad_value_is_named_with_a_valid_one(make_cfg, tmp_path, override, key, fix):
    cfg = make_cfg(*override.split(), "eval.metrics=[fid,pr]")
    with pytest.raises(ConfigValueError) as err:
        run(cfg)
    message = str(err.value)
    assert f"{key}=" in message or f"{key} is not" in message
    assert fix in message and "1 invalid value" in message
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before anything was written


def test_a_scheduled_value_and_its_plain_key_share_one_rule(make_cfg):
    """One range per kind of value: the schedule's table holds the very Range objects the plain keys' rules come
    from, so the two cannot drift apart; and R3GAN's scheduled gamma is refused below 0 as its plain key is."""
    from pixelsmith.config import rules, validate
    from pixelsmith.parts import part_names

    if "gan" not in part_names():
        pytest.skip("the GAN part's keys: a fork without it has none of them")
    plain = {rule.key: rule for rule in validate.RULES}
    for key, name in (
        ("model.g_optimizer.lr", "lr"),
        ("model.d_optimizer.lr", "d_lr"),
        ("model.objective.regularizers.r1.gamma", "gamma"),
        ("model.objective.gamma", "gamma"),
        ("model.objective.gp_weight", "gp_weight"),
        ("augment.initial_p", "augment_p"),
    ):
        assert plain[key].ok is validate.scheduled_range(name).ok, (key, name)
    assert validate.scheduled_range("g_beta1") is validate.scheduled_range("beta2") is rules.ADAM_BETA
    cfg = make_cfg(
        "+model.schedules.gamma={start:0.05,final:-0.01,shape:cosine,horizon_kimg:5}", model="r3gan"
    )
    with pytest.raises(ConfigValueError, match=r"model.schedules.gamma.final=-0.01 must be >= 0"):
        validate_config(cfg)
    with pytest.raises(ConfigValueError, match=r"model.objective.gamma=-0.01 must be >= 0"):
        validate_config(make_cfg("model.objective.gamma=-0.01", model="r3gan"))


def test_all_problems_are_listed_at_once(make_cfg):
    cfg = make_cfg("data.batch_size=0", "train.clip_grad_norm=-1", "eval.monitor=kid")
    with pytest.raises(ConfigValueError, match=r"3 invalid value\(s\).*\(1\).*\(2\).*\(3\)"):
        validate_config(cfg)


def test_the_edges_of_the_new_ranges_pass(make_cfg):
    """What the rules above must not refuse: ADA targets just inside (0, 1), no EMA ramp-up, no loader workers, and
    every key the evaluation writes as a sweep's objective."""
    validate_config(make_cfg("augment=ada", "augment.target=0.01", "model.ema.rampup=null"))
    validate_config(make_cfg("augment=ada", "augment.target=0.99", "hardware.num_workers=0"))
    for objective in ("eval/fid", "eval/kid_mean", "eval/recall", "eval/best_fid", "eval/best_iteration"):
        validate_config(make_cfg("eval.metrics=[fid,kid,pr]", f"objective={objective}"))
    validate_config(make_cfg("eval.monitor=kid_mean", "objective=eval/best_kid_mean"))
    validate_config(make_cfg("objective=loss/G"))  # a training metric: the model's own, not checked here


def test_every_shipped_config_passes(make_cfg):
    # The main job and every experiment preset of the config tree (whichever model parts this checkout has).
    for extra in ([], *[[f"experiment={name}"] for name in shipped_experiments()]):
        validate_config(make_cfg(*extra, fast=False))
    for debug in ("fast", "overfit", "ddp", "fsdp"):
        validate_config(make_cfg(f"debug={debug}", fast=False))


def test_a_warmup_longer_than_the_run_warns(make_cfg, caplog):
    with caplog.at_level(logging.WARNING):
        validate_config(make_cfg("schedule=warmup_cosine", "schedule.warmup_steps=999999", "max_steps=2"))
    assert "never reaches its peak" in caplog.text


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_train_py_prints_one_paragraph_and_no_traceback(tmp_path):
    result = run_cli(
        ["train.py", "train.clip_grad_norm=-1", f"hydra.run.dir={tmp_path / 'run'}"], timeout=300
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "train.clip_grad_norm=-1.0 must be > 0" in output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("model.generator.style_mixing_prob=1.5", "model.generator.style_mixing_prob=0.9"),
        ("model.generator.style_mixing_prob=-0.1", "0 turns style mixing off"),
        ("model.generator.c_dim=-1", "model.generator.c_dim=0"),
    ],
)
def test_stylegan2_generator_switches_out_of_range_are_named_with_a_valid_value(make_cfg, override, fix):
    cfg = make_cfg(override, model="stylegan2")
    with pytest.raises(ConfigValueError, match="1 invalid value") as err:
        validate_config(cfg)
    assert fix in str(err.value)


def shipped_experiments() -> list[str]:
    """The experiment presets of the config tree (conf/experiment/*.yaml), by name."""
    return sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))


# ---- each range rule at its boundary, from both sides ---------------------------------------------------------
# key -> (values just inside the range, values just outside). Every rule of config/validate.py's RULES must be
# here: a rule added without its boundaries fails test_every_rule_has_its_boundaries_here. The three optimizers'
# rules share the `<optimizer>.` entries, the generator's and discriminator's the `<network>.` ones.
TINY = 1e-12
BOUNDARIES: dict[str, tuple[list, list]] = {
    "max_steps": ([1], [0, -1, 1.5, True]),
    "accumulate": ([1], [0]),
    "data.batch_size": ([1, None], [0]),
    "data.resolution": ([4], [3]),
    "data.channels": ([1, 3], [0, 2, 4]),
    "data.limit": ([1, None], [0]),
    "data.num_workers": ([0, None], [-1]),
    "hardware.num_workers": ([0, None], [-1]),
    "data.prefetch_factor": ([1], [0]),
    "data.on_corrupt": (["skip", "error"], ["ignore", None]),
    "hardware.devices": ([1, None], [0]),
    "hardware.num_nodes": ([1], [0]),
    "hardware.num_threads": ([1, None], [0]),
    "hardware.memory_fraction": ([TINY, 1, 1.0, None], [0, 1 + 1e-9]),
    "train.clip_grad_norm": ([TINY, None], [0, -TINY]),
    "train.log_every_n_steps": ([1], [0]),
    "train.sample_every_n_steps": ([0], [-1]),
    "train.checkpoint_every_n_steps": ([0], [-1]),
    "train.keep_checkpoints": ([0], [-1]),
    "train.preemption.check_every_n_steps": ([1, None], [0]),
    "train.nonfinite_max_consecutive": ([0], [-1]),
    "train.host_sync_check": (["off", "warn", "error"], ["on", None]),
    "schedule.name": (["constant", "warmup_cosine"], ["cosine", None]),
    "schedule.warmup_steps": ([0], [-1]),
    "schedule.min_lr_ratio": ([0, 0.0, 1, 1.0], [-TINY, 1 + 1e-9]),
    "schedule.total_steps": ([1, None], [0]),
    "model.objective.regularizers.r1.gamma": ([0, 0.0], [-TINY]),
    "model.objective.gamma": ([0.0], [-TINY]),
    "model.objective.gp_weight": ([0.0], [-TINY]),
    "model.objective.regularizers.r1.interval": ([1], [0]),
    "model.objective.regularizers.path_length.weight": ([0.0], [-TINY]),
    "model.objective.regularizers.path_length.interval": ([1], [0]),
    "model.sample_grid_size": ([1, 1024], [0, 1025]),
    "<network>.num_fp16_res": ([0, None], [-1, 1.5]),
    "<network>.conv_clamp": ([TINY, None], [0, -TINY]),
    "model.generator.style_mixing_prob": ([0, 1, 1.0], [-TINY, 1 + 1e-9]),
    "model.generator.c_dim": ([0], [-1, 1.5]),
    "model.ema.half_life_kimg": ([TINY], [0, -TINY]),
    "model.ema.rampup": ([TINY, None], [0, -TINY]),
    "augment.target": ([TINY, 1 - 1e-9, None], [0, 1, 1.0]),
    "augment.initial_p": ([0, 1.0], [-TINY, 1 + 1e-9]),
    "augment.max_p": ([0.0, 1], [-TINY, 1 + 1e-9]),
    "<optimizer>.lr": ([TINY], [0, 0.0, -TINY]),
    # beta 1.0 makes Adam's bias correction divide by zero; 0.999 is Adam's default beta2.
    "<optimizer>.betas": (
        [[0.0, 0.0], [0.5, 0.999], [0.0, 1 - 1e-9], None],
        [[0.5, 1.0], [1.0, 0.99], [-TINY, 0.99], [0.5], [0.5, 0.9, 0.99]],
    ),
    "<optimizer>.eps": ([TINY, None], [0, -TINY]),
    "<optimizer>.weight_decay": ([0, 0.0], [-TINY]),
    "strategy.timeout_minutes": ([TINY], [0]),
    "profiler.every_n_steps": ([1, None], [0]),
    "profiler.warmup_steps": ([0], [-1]),
    "profiler.torch_wait": ([0], [-1]),
    "profiler.torch_warmup": ([0], [-1]),
    "profiler.torch_active": ([1], [0]),
    "eval.every_n_steps": ([0], [-1]),
    "eval.num_samples": ([2], [1, 0]),  # FID's covariance needs two images
    "eval.batch_size": ([1], [0]),
    "eval.reference_samples": ([1, None], [0]),
    "eval.metrics": ([["fid"], ["fid", "kid", "pr", "is"]], [[], ["fd"], None]),
    "callbacks.prometheus.port": ([0, 65535], [-1, 65536, 99999, 9464.0, True]),
    # The networks' sizes: a layer of 0 (or a negative number of) inputs or channels.
    "model.generator.z_dim": ([1], [0, -1, 1.5]),
    "model.generator.w_dim": ([1], [0]),
    "model.generator.mapping_layers": ([1, 64], [0, 65]),
    "model.generator.ngf": ([1], [0]),
    "model.discriminator.ndf": ([1], [0]),
    "model.discriminator.mbstd_group_size": ([1], [0]),
    "<network>.channel_base": ([1], [0]),
    "<network>.channel_max": ([1], [0]),
    "<network>.widths": ([[1], [768, 768]], [[], [768, 0], None]),
    "<network>.groups": ([[1], [96, 96]], [[], [0], None]),
    "<network>.blocks": ([1, [1, 2]], [0, [], [2, 0]]),
    "<network>.expansion": ([1], [0]),
    "<network>.kernel": ([1, 3], [0, 2, -1]),
}


def _boundary_entry(key: str) -> str:
    for prefix, entry in (
        (("model.g_optimizer.", "model.d_optimizer.", "model.optimizer."), "<optimizer>."),
        (("model.generator.", "model.discriminator."), "<network>."),
    ):
        for p in prefix:
            if key.startswith(p) and entry + key.removeprefix(p) in BOUNDARIES:
                return entry + key.removeprefix(p)
    return key


def _rules():
    from pixelsmith.config.validate import RULES

    return RULES


def test_every_rule_has_its_boundaries_here():
    missing = [rule.key for rule in _rules() if _boundary_entry(rule.key) not in BOUNDARIES]
    assert missing == [], "add the boundary values of these rules to BOUNDARIES"


@pytest.mark.parametrize("rule", _rules(), ids=lambda rule: rule.key)
def test_each_rule_at_its_boundary_accepts_inside_and_refuses_outside(rule):
    inside, outside = BOUNDARIES[_boundary_entry(rule.key)]
    assert [v for v in inside if not rule.ok(v)] == [], f"{rule.key}: refused values inside its range"
    assert [v for v in outside if rule.ok(v)] == [], f"{rule.key}: accepted values outside its range"


@pytest.mark.parametrize(
    ("name", "inside", "outside"),
    [
        ("lr", [TINY], [0, -TINY]),
        ("g_beta2", [0.0, 0.999], [1.0, -TINY]),
        ("gamma", [0.0], [-TINY]),
        ("augment_p", [0.0, 1.0], [-TINY, 1 + 1e-9]),
        ("ema_half_life_kimg", [0.0], [-TINY]),  # a scheduled half-life may start at 0 (R3GAN's ramp)
    ],
)
def test_a_scheduled_range_at_its_boundary(name, inside, outside):
    from pixelsmith.config.validate import scheduled_range
    from pixelsmith.parts import part_names

    if name == "gamma" and "gan" not in part_names():
        pytest.skip("gamma is the GAN part's objective scalar: a fork without it has no such schedule")
    allowed = scheduled_range(name)
    assert all(allowed.ok(v) for v in inside) and not any(allowed.ok(v) for v in outside)


@pytest.mark.parametrize(
    ("inside", "outside"),
    [
        ("model.g_optimizer.betas=[0.5,0.999]", "model.g_optimizer.betas=[0.5,1.0]"),
        ("model.d_optimizer.lr=1e-12", "model.d_optimizer.lr=0"),
        ("schedule.min_lr_ratio=1.0", "schedule.min_lr_ratio=1.000001"),
        ("hardware.memory_fraction=1.0", "hardware.memory_fraction=0"),
    ],
)
def test_boundaries_through_the_composed_config(make_cfg, inside, outside):
    validate_config(make_cfg(inside))  # just inside: no error
    key = outside.split("=")[0]
    with pytest.raises(ConfigValueError, match=rf"{re.escape(key)}=.+? must be"):
        validate_config(make_cfg(outside))
