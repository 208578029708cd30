"""Shared test fixtures: compose the real config tree (as `train.py` does) with outputs under tmp_path."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, open_dict

from pixelsmith.config.schema import register_configs
from pixelsmith.hardware import register_detected_profile
from pixelsmith.paths import CONF_DIR, REPO_ROOT

register_configs()
torch.set_num_threads(min(2, os.cpu_count() or 1))

# Small, quiet, fast: every test run trains on CPU in fp32 unless it asks otherwise.
FAST = [
    "~local",  # a developer's own conf/local/default.yaml must not change what the tests compose
    "hardware=cpu",
    "train.progress_bar=false",
    "logger=csv",
    "data.limit=256",
    "data.batch_size=16",
    "eval.every_n_steps=0",  # tests that check evaluation turn it on
    "train.time_budget_minutes=null",  # a loaded CI machine must not end a test's run early (tests of it set it)
]
# Narrow networks per model so a test trains in seconds.
SMALL = {
    "dcgan": ["model=dcgan", "model.generator.ngf=16", "model.discriminator.ndf=16"],
    "stylegan2": [
        "model=stylegan2",
        "model.generator.channel_base=512",
        "model.generator.channel_max=32",
        "model.generator.z_dim=32",
        "model.generator.w_dim=32",
        "model.generator.mapping_layers=2",
        "model.discriminator.channel_base=512",
        "model.discriminator.channel_max=32",
    ],
}


def compose_config(overrides: list[str], output_dir: Path, config_name: str = "train") -> DictConfig:
    # As the entry points do before composing: hardware=auto composes the profile detected now (a test that mocks
    # torch.cuda composes inside its mock).
    register_detected_profile()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
    return cfg


@pytest.fixture
def make_cfg(tmp_path):
    def _make(*overrides: str, fast: bool = True, model: str = "dcgan", output: str = "run") -> DictConfig:
        base = [*FAST, *SMALL[model]] if fast else []
        return compose_config([*base, *overrides], tmp_path / output)

    return _make


def bare_trainer(callbacks=()) -> L.Trainer:
    """A one-CPU Trainer with nothing of its own (no logger, checkpoints, bar or summary): for a module driven
    directly; the training core stops it at `max_steps`."""
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )


def run_cli(args: list[str], cwd: Path = REPO_ROOT, timeout: int = 600, env_extra: dict | None = None):
    """Run an entry point the way a user does; returns the CompletedProcess (stdout+stderr merged)."""
    # A DDP rendezvous port below Linux's ephemeral range (32768-60999): Lightning's default pick is a port that was
    # free a moment ago, and the gloo sockets of the ranks (ephemeral ports) can take it first (EADDRINUSE flakes).
    # Always a fresh one: an in-process run with a DDP/FSDP strategy leaves its MASTER_PORT in os.environ while its
    # store still listens there.
    port = {"MASTER_PORT": str(random.randint(20000, 29999))}
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **port, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# The fast default: `pytest` runs what checks behaviour in-process (about 2 minutes on 2 cores); `pytest --all` adds
# the slow tests (subprocesses, several processes, sweeps) and the benchmark tooling's tests, as CI does. An explicit
# `-m` expression (`pytest -m gpu`, `-m bench`) is honoured as given, and a test named by its id runs whatever its marks.
FAST_SELECTION = "not slow and not bench"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        default=False,
        help=f"run every test; without it (and without -m) only `{FAST_SELECTION}` runs",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A test named on the command line (`pytest tests/test_fsdp.py::test_x`) runs whatever its marks.
    named = any("::" in str(arg) for arg in config.args)
    if not config.getoption("--all") and not config.option.markexpr and not named:
        config.option.markexpr = FAST_SELECTION


def pytest_report_header(config: pytest.Config) -> str:
    selection = config.option.markexpr or "every test"
    return f"pixelsmith test selection: {selection} (`pytest --all` runs every test, as CI does)"
