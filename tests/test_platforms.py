"""What Linux CI can prove about macOS and Windows (docs/platforms.md): the entry points start and train with the
POSIX-only modules made unimportable, a POSIX signal the platform lacks is left out of the preemption signals, the
Apple GPU profile composes and resolves with torch.backends.mps mocked available (hardware=mps and hardware=auto),
and what MPS lacks (float64) is kept off the device."""

from __future__ import annotations

import signal
import textwrap
import types
from unittest import mock

import pytest
import torch
from torch import nn

from pixelsmith.core import ema as ema_module
from pixelsmith.core import preemption
from pixelsmith.core.ema import EMA
from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.settings import HardwareError
from pixelsmith.run.build import resolve_hardware
from tests.conftest import CHECKOUT, FAST, SMALL, compose_config, run_cli

# Made unimportable in the child below: modules Windows does not have.
POSIX_ONLY_MODULES = ("fcntl", "resource", "termios", "pwd", "grp")


@pytest.mark.slow  # a subprocess training a model: the full run (`pytest --all`) only
def test_the_entry_points_start_and_train_without_posix_only_modules(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (12, 12), (40 * i, 90, 200)).save(images / f"{i}.png")
    train_args = [
        *FAST,
        *SMALL["dcgan"],
        "max_steps=2",
        "data.limit=32",
        "data.batch_size=8",
        "data.num_workers=0",
        "train.checkpoint_every_n_steps=0",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    script = textwrap.dedent(
        f"""
        import runpy, sys
        for name in {POSIX_ONLY_MODULES!r}:
            sys.modules[name] = None  # `import fcntl` now raises ImportError, as on Windows
        def entry(path, *argv):
            sys.argv = [path, *argv]
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as stop:
                print(f"EXIT {{path}} {{stop.code}}", flush=True)
        entry("prepare.py", "source={images}", "dest={tmp_path / "out.zip"}", "resolution=8", "progress=false")
        entry("stylize.py", "--help")
        entry("stylize.py", "ckpt_path={tmp_path / "none.ckpt"}", "input={images}", "output={tmp_path / "styled"}")
        entry("train.py", *{train_args!r})  # last: a finished run may end the process at once
        """
    )
    result = run_cli(["-c", script], cwd=CHECKOUT)
    said = result.stdout + result.stderr
    assert "EXIT prepare.py 0" in said and (tmp_path / "out.zip").is_file(), said[-3000:]
    assert "EXIT stylize.py 0" in said  # --help
    # Started, parsed its options, checked its destinations and got as far as the checkpoint it was given.
    assert "EXIT stylize.py 2" in said and "none.ckpt" in said
    assert result.returncode == 0, said[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert "ModuleNotFoundError" not in said and "ImportError" not in said


def test_a_posix_signal_the_platform_lacks_is_left_out_and_a_typo_still_refused(monkeypatch):
    windows_like = types.SimpleNamespace(
        Signals={"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}, SIGINT=signal.SIGINT
    )
    monkeypatch.setattr(preemption, "signal", windows_like)
    watched = preemption.PreemptionSignals(("SIGTERM", "SIGUSR1", "SIGUSR2"))  # the defaults
    assert watched.signals == [int(signal.SIGTERM)]
    assert preemption.signal_number("usr1") is None
    with pytest.raises(PixelsmithError, match="'SIGTREM' is not a signal name"):
        preemption.signal_number("SIGTREM")


def _apple_gpu(available: bool = True, macos14: bool = True):
    """A machine without CUDA whose torch sees an Apple GPU."""
    return mock.patch.multiple(
        "torch.backends.mps",
        is_available=mock.Mock(return_value=available),
        is_macos_or_newer=mock.Mock(return_value=macos14),
    )


def _no_cuda():
    return mock.patch.multiple(
        "torch.cuda", is_available=mock.Mock(return_value=False), device_count=mock.Mock(return_value=0)
    )


def test_hardware_auto_takes_the_mps_profile_on_an_apple_gpu(tmp_path):
    with _no_cuda(), _apple_gpu():
        cfg = compose_config(["hardware=auto"], tmp_path)  # detected as the config is composed
        assert cfg.hardware.name == "mps" and cfg.hardware.accelerator == "mps"
        hardware = resolve_hardware(cfg)
    assert (hardware.profile, hardware.accelerator, hardware.devices, hardware.device_name) == (
        "mps",
        "mps",
        1,
        "Apple GPU (MPS)",
    )
    assert hardware.precision == "32-true" and hardware.process_group_backend == "gloo"
    assert not (
        hardware.compile
        or hardware.cuda_graphs
        or hardware.pin_memory
        or hardware.cudnn_benchmark
        or hardware.allow_tf32
    )
    with _no_cuda(), _apple_gpu(available=False):
        assert compose_config(["hardware=auto"], tmp_path).hardware.name == "cpu"


@pytest.mark.parametrize(
    ("overrides", "macos14", "precision", "refused"),
    [
        (["precision=16-mixed"], True, "16-mixed", None),
        (["precision=bf16-mixed"], True, "bf16-mixed", None),
        (["precision=bf16-mixed"], False, None, "needs macOS 14"),
        (["hardware.devices=2"], True, None, "an Apple GPU is one device"),
        (["strategy=ddp"], True, None, "Leave strategy=auto"),
    ],
)
def test_the_mps_profile_honours_what_mps_can_and_names_what_it_cannot(
    tmp_path, overrides, macos14, precision, refused
):
    with _no_cuda(), _apple_gpu(macos14=macos14):
        cfg = compose_config(["hardware=mps", *overrides], tmp_path)
        if refused is None:
            assert resolve_hardware(cfg).precision == precision
        else:
            with pytest.raises(HardwareError, match=refused):
                resolve_hardware(cfg)


def test_the_mps_profile_without_an_apple_gpu_names_the_fix(tmp_path):
    with _no_cuda(), _apple_gpu(available=False):
        cfg = compose_config(["hardware=mps"], tmp_path)
        with pytest.raises(HardwareError, match="needs an Apple GPU.*hardware=cpu"):
            resolve_hardware(cfg)


def test_cuda_graphs_are_off_on_an_apple_gpu(tmp_path):
    with _no_cuda(), _apple_gpu():
        hardware = resolve_hardware(compose_config(["hardware=mps", "hardware.cuda_graphs=true"], tmp_path))
    assert hardware.cuda_graphs is False


def test_the_ema_half_life_goes_float32_only_to_a_device_without_float64(monkeypatch):
    # "meta" stands in for "mps" (no MPS here): a device type on the no-float64 list.
    monkeypatch.setattr(ema_module, "NO_FLOAT64_DEVICES", frozenset({"meta"}))
    average = EMA(nn.Linear(2, 2), half_life_kimg=10.0)
    assert average.to("cpu").half_life_nimg.dtype == torch.float64
    moved = average.to("meta")
    assert moved.half_life_nimg.dtype == torch.float32 and moved.half_life_nimg.device.type == "meta"
    assert moved.model.weight.device.type == "meta"  # the rest of the module moved as usual
