"""Hardware resolved once, inside Hydra: `hardware=auto` composes the detected profile's file (so `--cfg job` shows
what runs), a profile of your own on `hydra.searchpath` composes and runs, `conf/local/` wins over the groups and the
command line over it, and one run builds its HardwareSettings once and applies it once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf, open_dict

import pixelsmith.hardware.settings
import pixelsmith.run.build
import pixelsmith.run.fit
from pixelsmith.config.paths import CONF_DIR
from pixelsmith.hardware.settings import HardwareError, check_detected_here, register_detected_profile
from pixelsmith.run.build import resolve_hardware
from pixelsmith.run.fit import run
from tests.conftest import FAST, SMALL, compose_config, run_cli

MYBOX = """\
defaults:
  - _schema
  - _self_

name: mybox
accelerator: cpu
precision: 32-true
channels_last: false
compile: false
num_workers: 0
batch_size: 8
optimizer_impl: foreach
"""


def _searchpath(tmp_path: Path, local: str | None = None) -> str:
    conf = tmp_path / "myconf"
    (conf / "hardware").mkdir(parents=True, exist_ok=True)
    (conf / "hardware" / "mybox.yaml").write_text(MYBOX)
    if local is not None:
        (conf / "local").mkdir(exist_ok=True)
        (conf / "local" / "default.yaml").write_text(local)
    return f"hydra.searchpath=[file://{conf}]"


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_cfg_job_with_hardware_auto_prints_the_detected_profile_and_the_user_key_wins():
    result = run_cli(
        ["train.py", "--cfg", "job", "hardware=auto", "hardware.batch_size=32"],
        timeout=180,
        env_extra={"CUDA_VISIBLE_DEVICES": ""},  # the cpu profile, also on a machine with a GPU
    )
    assert result.returncode == 0, result.stderr
    hardware = yaml.safe_load(result.stdout)["hardware"]
    assert hardware["name"] == "cpu" and hardware["accelerator"] == "cpu"
    assert hardware["batch_size"] == 32  # the command line wins over the profile's 64
    assert (
        hardware["num_workers"] == 2 and hardware["optimizer_impl"] == "fused"
    )  # the cpu profile's own keys


def test_the_default_composes_the_detected_profile_file(tmp_path):
    detected = register_detected_profile()
    cfg = compose_config([], tmp_path)
    assert cfg.hardware.name == detected
    profile = OmegaConf.load(CONF_DIR / "hardware" / f"{detected}.yaml")
    for key, value in profile.items():
        if key != "defaults":
            assert cfg.hardware[key] == value, key
    assert resolve_hardware(cfg).profile == detected


def test_a_profile_of_your_own_on_the_searchpath_composes_and_runs(tmp_path):
    cfg = compose_config(
        [
            _searchpath(tmp_path),
            "hardware=mybox",
            *[o for o in FAST if not o.startswith(("hardware=", "data.batch_size="))],
            *SMALL["dcgan"],
            "logger=none",
            "max_steps=2",
            "train.sample_every_n_steps=0",
        ],
        tmp_path / "run",
    )
    hardware = resolve_hardware(cfg)
    assert (hardware.profile, hardware.precision, hardware.batch_size, hardware.optimizer_impl) == (
        "mybox",
        "32-true",
        8,
        "foreach",
    )
    assert hardware.channels_last is False
    metrics = run(cfg)
    assert metrics["iteration"] == 2
    resolved = OmegaConf.load(tmp_path / "run" / "config_resolved.yaml")
    assert resolved.runtime_plan.profile == "mybox" and resolved.runtime_plan.batch_size == 8


LOCAL = """\
# @package _global_
defaults:
  - override /hardware: mybox

hardware:
  num_workers: 1
max_steps: 7
"""


def test_the_local_config_wins_over_the_groups_and_the_command_line_over_it(tmp_path):
    searchpath = _searchpath(tmp_path, local=LOCAL)
    cfg = compose_config([searchpath], tmp_path)
    assert cfg.hardware.name == "mybox"  # local/default.yaml chose the profile
    assert cfg.hardware.num_workers == 1  # over the profile's 0
    assert cfg.max_steps == 7  # over train.yaml's 2500
    cfg = compose_config([searchpath, "hardware=cpu", "hardware.num_workers=3", "max_steps=9"], tmp_path)
    assert (cfg.hardware.name, cfg.hardware.num_workers, cfg.max_steps) == ("cpu", 3, 9)
    # The shipped example is a valid (empty) option: copying it changes nothing until a key is uncommented.
    assert compose_config(["local=example"], tmp_path).max_steps == 2500


def test_one_run_resolves_the_hardware_settings_once_and_applies_them_once(make_cfg, monkeypatch):
    counts = {"resolve_hardware_settings": 0, "apply_hardware": 0, "set_float32_matmul_precision": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    resolve = counting("resolve_hardware_settings", pixelsmith.hardware.settings.resolve_hardware_settings)
    monkeypatch.setattr(pixelsmith.hardware.settings, "resolve_hardware_settings", resolve)
    monkeypatch.setattr(pixelsmith.run.build, "resolve_hardware_settings", resolve)
    apply = counting("apply_hardware", pixelsmith.hardware.settings.apply_hardware)
    monkeypatch.setattr(pixelsmith.hardware.settings, "apply_hardware", apply)
    monkeypatch.setattr(pixelsmith.run.fit, "apply_hardware", apply)
    matmul = torch.get_float32_matmul_precision()
    monkeypatch.setattr(
        torch,
        "set_float32_matmul_precision",
        counting("set_float32_matmul_precision", torch.set_float32_matmul_precision),
    )
    try:
        run(make_cfg("max_steps=1", "logger=none", "train.sample_every_n_steps=0"))
    finally:
        monkeypatch.undo()
        torch.set_float32_matmul_precision(matmul)
    assert counts == {"resolve_hardware_settings": 1, "apply_hardware": 1, "set_float32_matmul_precision": 1}


def test_a_multirun_job_composed_on_another_machine_is_stopped(monkeypatch):
    """hydra-submitit-launcher composes a SLURM job's config with the submitting process's ConfigStore: a GPU job
    would get the login node's detection. The job stops naming the profile to give."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    def job_config(hardware: str):
        register_detected_profile()
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[f"hardware={hardware}"], return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.mode = RunMode.MULTIRUN
        HydraConfig.instance().set_config(cfg)
        return cfg

    try:
        cfg = job_config("auto")  # composed here: cpu
        monkeypatch.setattr(
            pixelsmith.hardware.settings, "_detected_here", None
        )  # ... as if by another process
        monkeypatch.setattr(pixelsmith.hardware.settings, "detect_profile", lambda: "h100")  # on a GPU node
        with pytest.raises(HardwareError, match="hardware=h100"):
            check_detected_here(cfg.hardware.name)
        check_detected_here("h100")  # composed on a machine like this one: nothing to say
        cfg = job_config("cpu")
        check_detected_here(cfg.hardware.name)  # a named profile is never second-guessed
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.parametrize("gpu_present", [False, True])
def test_a_cpu_run_without_a_gpu_answers_cuda_availability_without_nvml(make_cfg, monkeypatch, gpu_present):
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1; with no GPU each torch.cuda.is_available() (torch's optimizers
    ask at every step) then retries loading NVML. apply_hardware turns the NVML path off only where no GPU exists:
    with one, the NVML answer keeps forked loader workers free of CUDA state."""
    import torch

    from pixelsmith.hardware.settings import NVML_CHECK, apply_hardware
    from pixelsmith.run.build import resolve_hardware

    hardware = resolve_hardware(make_cfg("hardware=cpu"))
    monkeypatch.setenv(NVML_CHECK, "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu_present)
    apply_hardware(hardware)
    assert os.environ[NVML_CHECK] == ("1" if gpu_present else "0")
