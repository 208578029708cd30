"""The wall-clock budget (`train.time_budget_minutes`): training ends at the first iteration past it with the final
evaluation, samples and checkpoint of that iteration, the stop is logged and recorded, resume trains on bit for bit,
and a run without a budget (or with one it does not reach) is unchanged."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from pixelsmith.config.paths import CONF_DIR
from pixelsmith.core import budget as budget_module
from pixelsmith.core.budget import TimeBudget
from pixelsmith.errors import PixelsmithError
from pixelsmith.run.build import resolve_hardware
from pixelsmith.run.fit import run
from tests.conftest import SMALL_DCGAN, last_checkpoint, metrics_rows, run_cli, series

OUTPUTS = [
    "precision=32-true",
    "max_steps=10",
    "train.sample_every_n_steps=3",
    "train.checkpoint_every_n_steps=3",
    "train.log_every_n_steps=3",
    "eval.every_n_steps=3",
    "eval.num_samples=64",
    "eval.batch_size=64",
    "eval.reference_samples=256",
    "eval.metrics=[fid]",
]
# The fake clock below advances one second per reading: one at the start of the run, one per iteration's check,
# so a budget of 3.5 s is past at the check of iteration 4.
BUDGET_4 = f"train.time_budget_minutes={3.5 / 60}"


@pytest.fixture
def ticking_clock(monkeypatch):
    readings = iter(range(10**6))
    monkeypatch.setattr(budget_module, "clock", lambda: float(next(readings)))


def test_budget_stops_at_the_first_iteration_past_it_with_final_outputs_there(
    make_cfg, tmp_path, ticking_clock, caplog
):
    with caplog.at_level(logging.INFO, logger="pixelsmith"):
        metrics = run(make_cfg(*OUTPUTS, BUDGET_4))
    out = tmp_path / "run"
    assert metrics["iteration"] == 4 and metrics["stop_reason"] == "time_budget"
    assert any("Time budget reached at iteration 4 of max_steps=10" in r.getMessage() for r in caplog.records)
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["stop_reason"] == "time_budget" and final["iteration"] == 4
    assert final["train/time_budget_minutes"] == pytest.approx(3.5 / 60)
    assert final["train/minutes_at_stop"] >= 3.5 / 60
    # The final evaluation, sample grid and checkpoint are of the last iteration actually trained.
    history = json.loads((out / "eval_history.json").read_text())["history"]
    assert [h["iteration"] for h in history] == [0.0, 3.0, 4.0]
    assert final["eval/fid"] == history[-1]["fid"]
    assert sorted(p.name for p in (out / "samples").glob("*.png")) == [
        "step_0000000.png",
        "step_0000003.png",
        "step_0000004.png",
    ]
    assert last_checkpoint(out)["pixelsmith"]["iteration"] == 4
    assert (out / "checkpoints" / "step_0000003.ckpt").exists()
    # The last iteration is logged even though it is not a multiple of log_every_n_steps.
    assert series(metrics_rows(out), "train/iteration") == [3.0, 4.0]


def test_resume_after_a_budget_stop_continues_bit_for_bit(make_cfg, tmp_path, monkeypatch):
    common = [
        "precision=32-true",
        "max_steps=4",
        "train.sample_every_n_steps=0",
        "train.checkpoint_every_n_steps=0",
    ]
    run(make_cfg(*common, "train.time_budget_minutes=null", output="straight"))
    readings = iter(range(10**6))
    monkeypatch.setattr(budget_module, "clock", lambda: float(next(readings)))
    first = run(make_cfg(*common, f"train.time_budget_minutes={1.5 / 60}", output="resumed"))
    assert first["iteration"] == 2 and first["stop_reason"] == "time_budget"
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    second = run(make_cfg(*common, "train.time_budget_minutes=null", f"ckpt_path={last}", output="resumed"))
    assert second["iteration"] == 4 and second["stop_reason"] == "max_steps"
    straight, resumed = last_checkpoint(tmp_path / "straight"), last_checkpoint(tmp_path / "resumed")
    for key, value in straight["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key
    assert straight["lr_schedulers"] == resumed["lr_schedulers"]


def test_without_a_budget_or_below_it_the_run_is_unchanged(make_cfg, tmp_path, monkeypatch):
    common = [
        "precision=32-true",
        "max_steps=4",
        "train.sample_every_n_steps=0",
        "train.checkpoint_every_n_steps=0",
    ]

    def no_clock():
        raise AssertionError("a run without a budget must not read the clock")

    monkeypatch.setattr(budget_module, "clock", no_clock)
    unlimited = run(make_cfg(*common, "train.time_budget_minutes=null", output="none"))
    assert unlimited["iteration"] == 4 and unlimited["stop_reason"] == "max_steps"
    assert "train/time_budget_minutes" not in unlimited and "train/minutes_at_stop" not in unlimited
    monkeypatch.undo()
    default = run(
        make_cfg(*common, "train.time_budget_minutes=4.5", output="default")
    )  # the main job's, far away
    assert default["iteration"] == 4 and default["stop_reason"] == "max_steps"
    assert default["train/time_budget_minutes"] == 4.5
    a, b = last_checkpoint(tmp_path / "none"), last_checkpoint(tmp_path / "default")
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key


def test_ranks_agree_when_one_is_past_the_budget(monkeypatch):
    monkeypatch.setattr(budget_module, "clock", lambda: 0.0)
    budget = TimeBudget(minutes=1.0)
    monkeypatch.setattr(budget_module, "clock", lambda: 30.0)
    assert not budget.expired(
        world_size=2, all_reduce=lambda t: t.add_(0.0)
    )  # the other rank is not past either
    assert budget.expired(
        world_size=2, all_reduce=lambda t: t.add_(1.0)
    )  # the other rank is past: stop here too
    monkeypatch.setattr(budget_module, "clock", lambda: 60.0)
    assert budget.expired()
    assert not TimeBudget().expired()


@pytest.mark.slow
def test_ddp_ranks_stop_together_at_the_budget(tmp_path):
    """2 processes: each rank's clock starts when it builds its settings (rank 0 first, it launches rank 1), so they
    disagree about when 6 ms are spent; both must stop at iteration 1, write one set of outputs and exit."""
    run_dir = tmp_path / "ddp_run"
    result = run_cli(
        [
            "train.py",
            "debug=ddp",
            "hardware=cpu",
            "precision=32-true",
            "max_steps=6",
            "train.time_budget_minutes=0.0001",  # 6 ms: past at the first iteration on both ranks
            *SMALL_DCGAN,
            "eval.every_n_steps=0",
            "train.sample_every_n_steps=0",
            "data.limit=64",
            f"hydra.run.dir={run_dir}",
        ],
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # Each rank logs its own stop (rank 1 into the same console): both at iteration 1.
    assert output.count("Time budget reached at iteration 1 of max_steps=6") == 2, output[-3000:]
    report = json.loads((run_dir / "ddp_consistency.json").read_text())
    assert report["world_size"] == 2 and report["iteration"] == 1 and report["max_abs_diff"] == 0.0
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["stop_reason"] == "time_budget" and final["iteration"] == 1
    assert last_checkpoint(run_dir)["pixelsmith"]["iteration"] == 1


def test_a_budget_must_be_positive(make_cfg):
    with pytest.raises(PixelsmithError, match="time_budget_minutes"):
        resolve_hardware(make_cfg("train.time_budget_minutes=0"))


def test_only_the_main_job_has_a_budget(tmp_path):
    from tests.conftest import compose_config

    assert compose_config([], tmp_path).train.time_budget_minutes == 4.5
    assert (
        compose_config(["experiment=mnist_dcgan"], tmp_path).train.time_budget_minutes == 4.5
    )  # it, spelled out
    # Every other preset of the config tree runs to its max_steps.
    presets = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))
    for preset in [name for name in presets if name != "mnist_dcgan"]:
        assert compose_config([f"experiment={preset}"], tmp_path).train.time_budget_minutes is None, preset
