"""The config tree composes for every option, typed schemas reject typos, and hardware requests resolve or fail
with messages that name the fix."""

from __future__ import annotations

from unittest import mock

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from pixelsmith.hardware import HardwareError, resolve_plan
from pixelsmith.paths import CONF_DIR
from pixelsmith.train import build_plan
from tests.conftest import compose_config, run_cli

GROUPS = [
    "hardware",
    "precision",
    "strategy",
    "model",
    "data",
    "augment",
    "schedule",
    "logger",
    "callbacks",
    "experiment",
    "debug",
    "paths",
]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group, tmp_path):
    options = _options(group)
    assert options, f"conf/{group} has no options"
    for option in options:
        extra = ["data.root=/tmp"] if option == "image_folder" else []
        cfg = compose_config([f"{group}={option}", *extra], tmp_path)
        assert cfg.max_steps >= 1
        assert cfg.model._target_.startswith("pixelsmith.")


def test_misspelled_key_fails_at_startup_naming_the_key(tmp_path):
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose_config(["hardware.batchsize=8"], tmp_path)
    assert "batchsize" in str(err.value) or "batchsize" in str(err.value.__cause__)


def test_wrong_type_fails_at_startup(tmp_path):
    with pytest.raises(Exception) as err:
        compose_config(["max_steps=ten"], tmp_path)
    text = f"{err.value} {err.value.__cause__}"
    assert "max_steps" in text and "ten" in text


def test_typo_inside_a_yaml_option_is_rejected_by_the_schema(tmp_path):
    bad = tmp_path / "conf"
    (bad / "hardware").mkdir(parents=True)
    (bad / "hardware" / "typo.yaml").write_text(
        "defaults:\n  - _schema\n  - _self_\nname: typo\nchanels_last: true\n"
    )
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose_config([f"hydra.searchpath=[file://{bad}]", "hardware=typo"], tmp_path)
    assert "chanels_last" in f"{err.value} {err.value.__cause__}"


def test_cfg_job_prints_composed_config_on_cpu():
    result = run_cli(["train.py", "--cfg", "job", "hardware=v100", "precision=16-mixed"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "name: v100" in result.stdout and "name: 16-mixed" in result.stdout


def test_hardware_v100_without_cuda_stops_and_names_the_fix(tmp_path):
    # No GPU for this process, also on a machine that has one.
    result = run_cli(
        ["train.py", "hardware=v100", f"hydra.run.dir={tmp_path}/run"],
        timeout=120,
        env_extra={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode == 2
    text = result.stdout + result.stderr
    assert "hardware=v100 needs a CUDA GPU" in text and "hardware=auto" in text and "hardware=cpu" in text
    assert "Traceback" not in text
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_auto_detects_cpu_and_cli_precision_wins(tmp_path):
    cfg = compose_config(["precision=32-true"], tmp_path)
    with _no_cuda():
        plan = build_plan(cfg)
        assert plan.profile == "cpu" and plan.accelerator == "cpu" and plan.precision == "32-true"
        plan = build_plan(compose_config([], tmp_path))
    assert plan.precision in ("bf16-mixed", "32-true")  # bf16 only where the CPU has it natively


def test_cpu_profile_falls_back_to_fp32_without_native_bf16(tmp_path):
    cfg = compose_config(["hardware=cpu"], tmp_path)
    with mock.patch("pixelsmith.hardware.cpu_has_native_bf16", return_value=False):
        assert build_plan(cfg).precision == "32-true"
    with mock.patch("pixelsmith.hardware.cpu_has_native_bf16", return_value=True):
        assert build_plan(cfg).precision == "bf16-mixed"


def _fake_cuda(name: str, capability: tuple[int, int], bf16: bool, count: int = 1, arch_list=None):
    # The installed torch's kernels are for its build's architectures; by default the fake GPU's own is among them.
    arch_list = arch_list if arch_list is not None else [f"sm_{capability[0]}{capability[1]}"]
    return mock.patch.multiple(
        "torch.cuda",
        is_available=mock.Mock(return_value=True),
        get_device_name=mock.Mock(return_value=name),
        get_device_capability=mock.Mock(return_value=capability),
        is_bf16_supported=mock.Mock(return_value=bf16),
        device_count=mock.Mock(return_value=count),
        get_arch_list=mock.Mock(return_value=arch_list),
    )


def _no_cuda():
    # These tests are about a machine without a GPU; on one with a GPU the answer would rightly differ.
    return mock.patch.multiple(
        "torch.cuda", is_available=mock.Mock(return_value=False), device_count=mock.Mock(return_value=0)
    )


CUDA13_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # torch 2.14.1's default wheel


def test_v100_with_a_cuda13_torch_is_refused_with_the_build_to_install(tmp_path):
    cfg = compose_config(["hardware=auto"], tmp_path)
    with (
        _fake_cuda("Tesla V100-SXM2-16GB", (7, 0), False, arch_list=CUDA13_ARCHS),
        pytest.raises(HardwareError) as err,
    ):
        build_plan(cfg)
    text = str(err.value)
    assert "sm_70" in text and "V100" in text and "cu126" in text and "get_arch_list" in text
    # The same wheel runs an H100, an A10 (sm_86 binary) and an L4 (sm_89 on the sm_86 binary).
    for name, capability in (
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA A10", (8, 6)),
        ("NVIDIA L4", (8, 9)),
    ):
        with _fake_cuda(name, capability, True, arch_list=CUDA13_ARCHS):
            assert build_plan(cfg).accelerator == "cuda"


@pytest.mark.parametrize(
    ("capability", "arch_list", "supported"),
    [
        ((7, 0), ["sm_75", "sm_80"], False),
        ((7, 0), ["sm_70", "sm_80"], True),
        ((8, 9), ["sm_80", "sm_86", "sm_90"], True),  # same major, lower minor binary runs
        ((10, 0), ["sm_80", "sm_90", "compute_90"], True),  # PTX is compiled for newer GPUs at load time
        ((10, 0), ["sm_80", "sm_90"], False),
        ((9, 0), ["sm_90a"], True),
        ((9, 0), [], True),  # a build that does not list its architectures
    ],
)
def test_torch_build_architecture_rules(capability, arch_list, supported):
    from pixelsmith.hardware import torch_build_supports

    assert torch_build_supports(capability, arch_list) is supported


@pytest.mark.parametrize(
    ("device_name", "capability", "bf16", "profile", "precision"),
    [
        ("Tesla V100-SXM2-16GB", (7, 0), False, "v100", "16-mixed"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), True, "a100", "bf16-mixed"),
        ("NVIDIA H100 80GB HBM3", (9, 0), True, "h100", "bf16-mixed"),
        ("NVIDIA L4", (8, 9), True, "a100", "bf16-mixed"),  # unknown name: mapped by capability
        ("Tesla T4", (7, 5), False, "v100", "16-mixed"),
    ],
)
def test_auto_detection_with_a_mocked_gpu(tmp_path, device_name, capability, bf16, profile, precision):
    cfg = compose_config([], tmp_path)
    with _fake_cuda(device_name, capability, bf16):
        plan = build_plan(cfg)
    assert plan.profile == profile and plan.accelerator == "cuda" and plan.precision == precision
    assert plan.cudnn_benchmark and plan.pin_memory
    assert plan.allow_tf32 == (profile != "v100")


def test_bf16_on_v100_is_refused_with_the_fix(tmp_path):
    cfg = compose_config(["hardware=v100", "precision=bf16-mixed"], tmp_path)
    with _fake_cuda("Tesla V100-SXM2-16GB", (7, 0), False), pytest.raises(HardwareError) as err:
        build_plan(cfg)
    assert "precision=16-mixed" in str(err.value) and "V100" in str(err.value)


def test_explicit_precision_wins_over_profile_default(tmp_path):
    cfg = compose_config(["hardware=v100", "precision=32-true"], tmp_path)
    with _fake_cuda("Tesla V100-SXM2-16GB", (7, 0), False):
        assert build_plan(cfg).precision == "32-true"


def test_fsdp_on_cpu_runs_over_gloo_and_says_it_is_for_testing(tmp_path, caplog):
    with caplog.at_level("INFO", logger="pixelsmith.hardware"):
        plan = build_plan(compose_config(["hardware=cpu", "strategy=fsdp", "hardware.devices=2"], tmp_path))
    assert (plan.strategy, plan.process_group_backend, plan.devices) == ("fsdp", "gloo", 2)
    assert "FSDP saves memory only on GPUs" in caplog.text and "strategy=ddp" in caplog.text


def test_nccl_on_cpu_names_the_fix(tmp_path):
    cfg = compose_config(["hardware=cpu", "strategy=fsdp", "strategy.process_group_backend=nccl"], tmp_path)
    with pytest.raises(HardwareError) as err:
        build_plan(cfg)
    assert "process_group_backend=nccl needs CUDA" in str(err.value) and "gloo" in str(err.value)


def test_unknown_precision_lists_choices(tmp_path):
    cfg = compose_config(["hardware=cpu"], tmp_path)
    with pytest.raises(HardwareError) as err:
        resolve_plan(cfg.hardware, "fp8", "auto")
    assert "32-true" in str(err.value) and "bf16-mixed" in str(err.value)


def test_more_devices_than_gpus_is_refused(tmp_path):
    cfg = compose_config(["hardware=a100", "hardware.devices=4"], tmp_path)
    with _fake_cuda("NVIDIA A100-SXM4-80GB", (8, 0), True, count=2), pytest.raises(HardwareError) as err:
        build_plan(cfg)
    assert "hardware.devices=2" in str(err.value)


def test_user_hardware_keys_overlay_the_detected_profile(tmp_path):
    plan = build_plan(compose_config(["hardware.batch_size=24", "hardware.channels_last=false"], tmp_path))
    assert plan.profile == "cpu" and plan.batch_size == 24 and plan.channels_last is False


def test_default_progress_bar_counts_iterations_not_a_meaningless_epoch(tmp_path):
    """Runs are one endless epoch (max_epochs=-1): Lightning's stock bar would read "Epoch 0/-2"."""
    from hydra.utils import instantiate

    from pixelsmith.callbacks.progress import IterationProgressBar

    bar = instantiate(compose_config([], tmp_path).callbacks.progress)
    assert isinstance(bar, IterationProgressBar)
    description = bar._get_train_description(current_epoch=0)
    assert description.strip() == "Training" and "-2" not in description


@pytest.mark.parametrize("override", ["augment.polcy=color", "augment.interval=often"])
def test_augment_options_are_typed(tmp_path, override):
    option = "diffaugment" if "polcy" in override else "ada"
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose_config([f"augment={option}", override], tmp_path)
    key = override.split("=")[0].split(".")[1]
    assert key in f"{err.value} {err.value.__cause__}"
