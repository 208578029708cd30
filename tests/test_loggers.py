"""Sample grids reach every logger that shows images; a tracker whose package is missing is one paragraph."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from lightning.pytorch.loggers import Logger

from pixelsmith.errors import PixelsmithError
from pixelsmith.train import run


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
        pass

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


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
    import pixelsmith.train as train_module

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
    from pixelsmith.train import _allow_mlflow_file_store

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    cfg = make_cfg("logger=mlflow")
    assert str(cfg.logger.mlflow.tracking_uri).startswith("file:")
    _allow_mlflow_file_store(cfg.logger)
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    cfg.logger.mlflow.tracking_uri = "http://mlflow.internal:5000"
    _allow_mlflow_file_store(cfg.logger)
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
