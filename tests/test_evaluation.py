"""Evaluation wired into training and `evaluate.py`: FID over time, the best checkpoint, the stored model config
winning over a different `experiment=`, and the missing-weights message."""

from __future__ import annotations

import json

import pytest

from pixelsmith.run.fit import run
from tests.conftest import eval_overrides, run_cli

EVAL = eval_overrides(every_n_steps=4, metrics="fid,kid,pr")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from tests.conftest import FAST, SMALL, compose_config

    out = tmp_path_factory.mktemp("eval") / "run"
    cfg = compose_config(
        [*FAST, *SMALL["dcgan"], *EVAL, "precision=32-true", "max_steps=8", "data.limit=512"], out
    )
    cfg.eval.every_n_steps = 4
    run(cfg)
    return out


def test_training_logs_fid_over_time_and_keeps_the_best_checkpoint(trained_run):
    summary = json.loads((trained_run / "eval_history.json").read_text())
    iterations = [h["iteration"] for h in summary["history"]]
    assert iterations == [0.0, 4.0, 8.0]
    fids = [h["fid"] for h in summary["history"]]
    assert all(f > 0 for f in fids)
    best = summary["best"]
    assert best["fid"] == min(fids) and best["iteration"] == iterations[fids.index(min(fids))]
    assert best["iteration"] > 0  # 8 iterations of training beat the untrained generator's FID
    assert (trained_run / "checkpoints" / "best.ckpt").exists()
    header = (trained_run / "metrics.csv").read_text().splitlines()[0]
    assert "eval/fid" in header and "eval/kid_mean" in header and "eval/precision" in header
    # Each entry says where in the run it was (FID-against-time curves), and those are not logged as scores.
    assert [h["kimg"] for h in summary["history"]] == [0.0, 4 * 16 / 1000, 8 * 16 / 1000]
    seconds = [h["seconds"] for h in summary["history"]]
    assert seconds[0] < 5 and seconds == sorted(seconds) and seconds[-1] > seconds[0]
    assert "eval/seconds" not in header and "eval/kimg" not in header


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_evaluate_uses_the_checkpoint_model_config_whatever_the_experiment(trained_run, tmp_path):
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    out = tmp_path / "evaluation"
    result = run_cli(
        [
            "evaluate.py",
            f"ckpt_path={ckpt}",
            "experiment=mnist_stylegan2",
            "hardware=cpu",
            *EVAL,
            f"hydra.run.dir={out}",
        ]
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "metrics.json").read_text())
    assert report["model"] == "dcgan" and report["precision"] == "32-true"
    history = json.loads((trained_run / "eval_history.json").read_text())["history"]
    assert report["metrics"]["fid"] == pytest.approx(history[-1]["fid"], rel=1e-6)
    assert "| fid |" in (out / "metrics.md").read_text()
    assert "using the checkpoint's" in result.stdout + result.stderr


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_missing_inception_weights_name_the_file_and_where_to_put_it(trained_run, tmp_path):
    result = run_cli(
        [
            "evaluate.py",
            f"ckpt_path={trained_run / 'checkpoints' / 'last.ckpt'}",
            "hardware=cpu",
            "eval.extractor=inception",
            f"hydra.run.dir={tmp_path / 'e'}",
        ],
        env_extra={"TORCH_HOME": str(tmp_path / "empty_torch_home")},
    )
    assert result.returncode == 2
    text = result.stdout + result.stderr
    assert "pt_inception-2015-12-05" in text and str(tmp_path / "empty_torch_home") in text
    assert "Traceback" not in text
