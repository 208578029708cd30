"""Sample grids reach every logger that shows images; a tracker whose package is missing is one paragraph; every
logger gets the resolved config (flat for TensorBoard's HParams, nested for the others) and the final objective; the
console shows the training numbers and one end-of-run summary, without Lightning's advertisement and FLOPs of 0."""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.loggers import Logger, TensorBoardLogger

from pixelsmith.errors import PixelsmithError
from pixelsmith.run.fit import run


class _RecordingLogger(Logger):
    """Stands in for a tracker without its package or a network; keeps what it was given."""

    calls: list[tuple] = []

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics, step=None) -> None:
        _RecordingLogger.calls.append(("metrics", self.name, dict(metrics), step))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        _RecordingLogger.calls.append(("params", self.name, params, kwargs))


class WandbLogger(_RecordingLogger):  # the name is what pixelsmith.callbacks.samples dispatches on
    def log_image(self, key, images, step=None, **kwargs) -> None:
        _RecordingLogger.calls.append(("wandb", key, step, Path(images[0]).is_file()))


class _MlflowClient:
    def log_artifact(self, run_id, local_path, artifact_path=None) -> None:
        _RecordingLogger.calls.append(("mlflow", artifact_path, Path(local_path).name, run_id))


class MLFlowLogger(_RecordingLogger):
    run_id = "run-1"

    @property
    def experiment(self):
        return _MlflowClient()


def test_sample_grids_reach_wandb_and_mlflow(make_cfg, monkeypatch):
    import pixelsmith.run.trainer as train_module

    monkeypatch.setattr(train_module, "OPTIONAL_LOGGERS", {})  # the stand-ins need no package
    _RecordingLogger.calls = []
    run(
        make_cfg(
            "logger=none",
            "+logger.wandb._target_=tests.test_loggers.WandbLogger",
            "+logger.mlflow._target_=tests.test_loggers.MLFlowLogger",
            "max_steps=2",
            "train.sample_every_n_steps=1",
            "precision=32-true",
        )
    )
    assert [c for c in _RecordingLogger.calls if c[0] == "wandb"] == [
        ("wandb", "samples", i, True) for i in (0, 1, 2)
    ]
    assert [c for c in _RecordingLogger.calls if c[0] == "mlflow"] == [
        ("mlflow", "samples", f"step_{i:07d}.png", "run-1") for i in (0, 1, 2)
    ]


@pytest.mark.parametrize(("logger", "package"), [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_tracker_without_its_package_names_the_extra(make_cfg, monkeypatch, logger, package):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )
    with pytest.raises(
        PixelsmithError, match=rf'needs the {package} package.*pip install -e "\.\[{package}\]"'
    ):
        run(make_cfg(f"logger={logger}", "max_steps=1"))


def test_logger_mlflow_opts_in_to_its_file_store_in_the_run_dir(make_cfg, monkeypatch):
    """MLflow 3 refuses a file: tracking URI unless MLFLOW_ALLOW_FILE_STORE is set (found running logger=mlflow with
    mlflow-skinny 3.17); a server or database URI is left to MLflow."""
    from pixelsmith.run.trainer import _allow_mlflow_file_store

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    cfg = make_cfg("logger=mlflow")
    assert str(cfg.logger.mlflow.tracking_uri).startswith("file:")
    _allow_mlflow_file_store(cfg.logger)
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    cfg.logger.mlflow.tracking_uri = "http://mlflow.internal:5000"
    _allow_mlflow_file_store(cfg.logger)
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ


class TensorBoardRecorder(TensorBoardLogger):
    """A real TensorBoardLogger that also keeps what it was given."""

    def log_hyperparams(self, params, metrics=None, step=None) -> None:
        _RecordingLogger.calls.append(("tb-params", dict(params), metrics, step))
        super().log_hyperparams(params, metrics=metrics, step=step)


def _tracked_run(make_cfg, monkeypatch, tmp_path, *extra: str) -> dict:
    import pixelsmith.run.trainer as train_module

    monkeypatch.setattr(train_module, "OPTIONAL_LOGGERS", {})
    _RecordingLogger.calls = []
    return run(
        make_cfg(
            "logger=default",  # CSV + TensorBoard
            "+logger.wandb._target_=tests.test_loggers.WandbLogger",
            "+logger.tbrec._target_=tests.test_loggers.TensorBoardRecorder",
            f"+logger.tbrec.save_dir={tmp_path / 'tbrec'}",
            "max_steps=2",
            "train.sample_every_n_steps=0",
            "precision=32-true",
            *extra,
        )
    )


def test_every_logger_gets_the_resolved_config_flat_for_tensorboard_nested_for_the_others(
    make_cfg, monkeypatch, tmp_path
):
    _tracked_run(make_cfg, monkeypatch, tmp_path, "model.generator.ngf=24")
    run_dir = tmp_path / "run"
    csv_params = yaml.safe_load((run_dir / "hparams.yaml").read_text())  # was {} before
    assert csv_params["model"]["generator"]["ngf"] == 24 and csv_params["max_steps"] == 2
    assert csv_params["runtime_plan"]["precision"] == "32-true"
    tb_params = yaml.safe_load((run_dir / "tensorboard" / "hparams.yaml").read_text())
    assert tb_params["model/generator/ngf"] == 24 and tb_params["data/batch_size"] == 16
    (nested,) = [c[2] for c in _RecordingLogger.calls if c[:2] == ("params", "WandbLogger") and c[2]]
    assert nested["model"]["generator"]["ngf"] == 24 and nested["objective"] == "eval/best_fid"
    flat = next(c[1] for c in _RecordingLogger.calls if c[0] == "tb-params" and c[1])
    assert flat["model/generator/ngf"] == 24 and not any(isinstance(v, dict) and v for v in flat.values())
    assert flat.keys() == tb_params.keys()


def test_the_final_objective_reaches_tensorboards_hparams_view_and_the_trackers(
    make_cfg, monkeypatch, tmp_path
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    metrics = _tracked_run(make_cfg, monkeypatch, tmp_path, "objective=loss/D")
    final = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert final["loss/D"] == metrics["loss/D"]
    # The other trackers: the objective as a metric at the last iteration, after the run's own metrics.
    tracked = [c for c in _RecordingLogger.calls if c[:2] == ("metrics", "WandbLogger")]
    assert tracked[-1][2:] == ({"loss/D": final["loss/D"]}, 2)
    # TensorBoard: the HParams session is the config with the objective as its metric.
    (ended,) = [c for c in _RecordingLogger.calls if c[0] == "tb-params" and c[2] is not None]
    assert ended[2] == {"loss/D": final["loss/D"]} and ended[3] == 2 and ended[1]["max_steps"] == 2
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["loss/D"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["max_steps"].number_value == 2
    assert start.session_start_info.hparams["model/name"].string_value == "dcgan"
    assert events.Scalars("loss/D")[-1].value == pytest.approx(final["loss/D"])


def test_no_objective_value_attaches_nothing(make_cfg, monkeypatch, tmp_path):
    _tracked_run(make_cfg, monkeypatch, tmp_path)  # objective=eval/best_fid, evaluation off: no value
    assert not [c for c in _RecordingLogger.calls if c[0] == "tb-params" and c[2] is not None]
    assert not [c for c in _RecordingLogger.calls if c[0] == "metrics" and "eval/best_fid" in c[2]]


def test_the_console_shows_the_training_numbers_and_one_summary_without_lightnings_noise(
    make_cfg, tmp_path, caplog, capsys
):
    with caplog.at_level("INFO"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # max_steps below the logging interval: Lightning warned "smaller than the logging interval"
        metrics = run(make_cfg("max_steps=3", "train.log_every_n_steps=10", "precision=32-true"))
    text = caplog.text
    # The last iteration logs whatever the interval: losses, the learning rate (one, G's and D's being equal).
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Iteration 3/3: "))
    assert f"loss/D {metrics['loss/D']:.4g}" in line and f"loss/G {metrics['loss/G']:.4g}" in line
    assert f"lr {metrics['lr/G']:.4g}" in line and "img/s " in line
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Run finished")]
    assert summary == [
        f"Run finished: max_steps at iteration 3 of max_steps=3.\n"
        "  no evaluation (eval.every_n_steps=0, or the run ended before the first)\n"
        f"  run dir: {tmp_path / 'run'}\n"
        f"  report:  {tmp_path / 'run' / 'report.html'}"
    ]
    assert "GPU available" in text  # Lightning's own start-up lines are captured here ...
    assert "litlogger" not in text  # ... its advertisement is not
    assert not [w for w in caught if "smaller than the logging interval" in str(w.message)]
    out = capsys.readouterr().out
    assert "Total params" in out and "FLOPs" not in out  # the summary table, without its column of zeros


def test_console_metrics_pick_losses_the_learning_rate_and_adas_p():
    from pixelsmith.callbacks.progress import console_metrics

    logged = {
        "loss/G": torch.tensor(0.51234),
        "loss/D": torch.tensor(1.25),
        "lr/G": 2e-4,
        "lr/D": 1e-4,
        "augment/p": torch.tensor(0.125),
        "augment/rt": 0.6,
        "grad_norm/D": 3.0,
        "img/s": 900.0,
        "images": torch.zeros(2, 2),
    }
    assert console_metrics(logged) == {
        "loss/D": "1.25",
        "loss/G": "0.5123",
        "lr/D": "0.0001",
        "lr/G": "0.0002",
        "p": "0.125",
    }
    assert console_metrics({"lr/G": 2e-4, "lr/D": 2e-4}) == {"lr": "0.0002"}


def test_the_progress_bar_shows_the_console_metrics_beside_its_own():
    from types import SimpleNamespace

    from pixelsmith.callbacks.progress import IterationProgressBar

    trainer = SimpleNamespace(
        loggers=[], progress_bar_metrics={"img/s": 900.0}, callback_metrics={"loss/G": torch.tensor(0.5)}
    )
    assert IterationProgressBar().get_metrics(trainer, None) == {"img/s": 900.0, "loss/G": "0.5"}


def test_the_end_of_run_summary_names_the_best_evaluation_and_where():
    from pathlib import Path

    from pixelsmith.run.fit import run_summary

    metrics = {
        "stop_reason": "time_budget",
        "iteration": 1800.0,
        "eval/best_fid": 8.312,
        "eval/best_iteration": 1500.0,
    }
    assert run_summary(metrics, 2500, Path("/runs/a"), None).splitlines() == [
        "Run finished: time_budget at iteration 1800 of max_steps=2500.",
        "  best fid: 8.312 at iteration 1500",
        "  run dir: /runs/a",
        "  report:  not written (see the warning above)",
    ]
