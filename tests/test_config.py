"""The config tree composes for every option, typed schemas reject typos, and hardware requests resolve or fail
with messages that name the fix. The GAN models' schemas: test_gan_config.py; the style models': test_style_config.py
(each part's tests leave with the part, README "Removing a part")."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from pixelsmith.config.paths import CONF_DIR
from pixelsmith.hardware.settings import HardwareError, resolve_hardware_settings
from pixelsmith.run.build import resolve_hardware
from tests.conftest import compose_config, cpu_flags, run_cli

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
    "profiler",
    "hparams_search",
]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group, tmp_path):
    options = _options(group)
    if not options and group == "hparams_search":
        pytest.skip(
            "conf/hparams_search is empty: the one sweep preset left with the GAN part (a style-only fork)"
        )
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


@pytest.mark.slow  # a subprocess: the full run (`pytest --all`) only
def test_cfg_job_prints_composed_config_on_cpu():
    result = run_cli(["train.py", "--cfg", "job", "hardware=v100", "precision=16-mixed"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "name: v100" in result.stdout and "name: 16-mixed" in result.stdout


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
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
    with _no_cuda():  # hardware=auto is detected when the config is composed: compose inside the mock
        hardware = resolve_hardware(compose_config(["precision=32-true"], tmp_path))
        assert hardware.profile == "cpu" and hardware.accelerator == "cpu" and hardware.precision == "32-true"
        hardware = resolve_hardware(compose_config([], tmp_path))
    flags = cpu_flags()
    if flags is None:
        pytest.skip(
            "no /proc/cpuinfo: this machine's bf16 instructions cannot be read independently of torch"
        )
    # bf16 autocast where the CPU has AMX tiles, or AVX512-BF16 on AMD, read here from the kernel's flags rather than
    # from the function under test: fp32 on a 2-core AVX2 machine and on a Cooper Lake Xeon, bf16 on a Zen 4 EPYC and
    # on a Sapphire Rapids Xeon.
    amd = "AuthenticAMD" in Path("/proc/cpuinfo").read_text()
    prefers = "amx_tile" in flags or ("avx512_bf16" in flags and amd)
    assert hardware.precision == ("bf16-mixed" if prefers else "32-true"), sorted(
        flags & {"avx512_bf16", "amx_tile"}
    )


@pytest.mark.parametrize(
    ("vendor", "avx512_bf16", "amx", "auto", "explicit_warns"),
    [
        ("GenuineIntel", False, False, "32-true", "emulated and slow"),
        ("AuthenticAMD", False, False, "32-true", "emulated and slow"),  # Zen 3 and older: AVX2 only
        (
            "GenuineIntel",
            True,
            False,
            "32-true",
            "no AMX: fp32 was measured faster",
        ),  # Cooper Lake: fp32 ~3x faster
        ("AuthenticAMD", True, False, "bf16-mixed", None),  # Zen 4/5: bf16 1.26x faster (cpu_prefers_bf16)
        ("GenuineIntel", True, True, "bf16-mixed", None),  # Sapphire Rapids and newer
    ],
)
def test_cpu_precision_auto_takes_bf16_where_it_was_measured_faster(
    tmp_path, caplog, vendor, avx512_bf16, amx, auto, explicit_warns
):
    cfg = compose_config(["hardware=cpu"], tmp_path)
    with (
        mock.patch("torch.cpu._is_avx512_bf16_supported", return_value=avx512_bf16),
        mock.patch("torch.cpu._is_amx_tile_supported", return_value=amx),
        mock.patch("pixelsmith.hardware.settings.cpu_vendor", return_value=vendor),
    ):
        assert resolve_hardware(cfg).precision == auto
        caplog.clear()
        explicit = compose_config(["hardware=cpu", "precision=bf16-mixed"], tmp_path)
        assert (
            resolve_hardware(explicit).precision == "bf16-mixed"
        )  # asked for: honoured, with a word where it is slower
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert (explicit_warns in warned) if explicit_warns else "bf16" not in warned


@pytest.mark.parametrize(
    "cap",
    [{"ATEN_CPU_CAPABILITY": "avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"ATEN_CPU_CAPABILITY": "default"}],
)
def test_cpu_precision_auto_takes_fp32_where_the_instruction_set_is_capped_below_bf16(
    tmp_path, monkeypatch, cap
):
    """An AVX2-only machine emulated on a Zen 4 (the caps the slow CI CPU is emulated with): bf16 would be emulated."""
    for name, value in cap.items():
        monkeypatch.setenv(name, value)
    cfg = compose_config(["hardware=cpu"], tmp_path)
    with (
        mock.patch("torch.cpu._is_avx512_bf16_supported", return_value=True),
        mock.patch("torch.cpu._is_amx_tile_supported", return_value=False),
        mock.patch("pixelsmith.hardware.settings.cpu_vendor", return_value="AuthenticAMD"),
    ):
        assert resolve_hardware(cfg).precision == "32-true"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # a cap that keeps bf16
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    with (
        mock.patch("torch.cpu._is_avx512_bf16_supported", return_value=True),
        mock.patch("torch.cpu._is_amx_tile_supported", return_value=False),
        mock.patch("pixelsmith.hardware.settings.cpu_vendor", return_value="AuthenticAMD"),
    ):
        assert resolve_hardware(cfg).precision == "bf16-mixed"


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
    with (
        _fake_cuda("Tesla V100-SXM2-16GB", (7, 0), False, arch_list=CUDA13_ARCHS),
        pytest.raises(HardwareError) as err,
    ):
        resolve_hardware(compose_config(["hardware=auto"], tmp_path))
    text = str(err.value)
    assert "sm_70" in text and "V100" in text and "cu126" in text and "get_arch_list" in text
    # The same wheel runs an H100, an A10 (sm_86 binary) and an L4 (sm_89 on the sm_86 binary).
    for name, capability in (
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA A10", (8, 6)),
        ("NVIDIA L4", (8, 9)),
    ):
        with _fake_cuda(name, capability, True, arch_list=CUDA13_ARCHS):
            assert resolve_hardware(compose_config(["hardware=auto"], tmp_path)).accelerator == "cuda"


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
    from pixelsmith.hardware.settings import torch_build_supports

    assert torch_build_supports(capability, arch_list) is supported


@pytest.mark.parametrize(
    ("device_name", "capability", "bf16", "profile", "precision"),
    [
        ("Tesla V100-SXM2-16GB", (7, 0), False, "v100", "16-mixed"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), True, "a100", "bf16-mixed"),
        ("NVIDIA H100 80GB HBM3", (9, 0), True, "h100", "bf16-mixed"),
        ("NVIDIA H200", (9, 0), True, "h200", "bf16-mixed"),  # its own profile: no "tuned for H100" warning
        ("NVIDIA L4", (8, 9), True, "a100", "bf16-mixed"),  # unknown name: mapped by capability
        ("Tesla T4", (7, 5), False, "v100", "16-mixed"),
    ],
)
def test_auto_detection_with_a_mocked_gpu(tmp_path, device_name, capability, bf16, profile, precision):
    with _fake_cuda(device_name, capability, bf16):
        cfg = compose_config([], tmp_path)  # the mocked GPU is detected at composition
        hardware = resolve_hardware(cfg)
    assert cfg.hardware.name == profile and cfg.hardware.accelerator == "cuda"
    assert hardware.profile == profile and hardware.accelerator == "cuda" and hardware.precision == precision
    assert hardware.cudnn_benchmark and hardware.pin_memory
    assert hardware.allow_tf32 == (profile != "v100")


def test_bf16_on_v100_is_refused_with_the_fix(tmp_path):
    cfg = compose_config(["hardware=v100", "precision=bf16-mixed"], tmp_path)
    with _fake_cuda("Tesla V100-SXM2-16GB", (7, 0), False), pytest.raises(HardwareError) as err:
        resolve_hardware(cfg)
    assert "precision=16-mixed" in str(err.value) and "V100" in str(err.value)


def test_explicit_precision_wins_over_profile_default(tmp_path):
    cfg = compose_config(["hardware=v100", "precision=32-true"], tmp_path)
    with _fake_cuda("Tesla V100-SXM2-16GB", (7, 0), False):
        assert resolve_hardware(cfg).precision == "32-true"


def test_fsdp_on_cpu_runs_over_gloo_and_says_it_is_for_testing(tmp_path, caplog):
    with caplog.at_level("INFO", logger="pixelsmith.hardware.settings"):
        hardware = resolve_hardware(
            compose_config(["hardware=cpu", "strategy=fsdp", "hardware.devices=2"], tmp_path)
        )
    assert (hardware.strategy, hardware.process_group_backend, hardware.devices) == ("fsdp", "gloo", 2)
    assert "FSDP saves memory only on GPUs" in caplog.text and "strategy=ddp" in caplog.text


def test_nccl_on_cpu_names_the_fix(tmp_path):
    cfg = compose_config(["hardware=cpu", "strategy=fsdp", "strategy.process_group_backend=nccl"], tmp_path)
    with pytest.raises(HardwareError) as err:
        resolve_hardware(cfg)
    assert "process_group_backend=nccl needs CUDA" in str(err.value) and "gloo" in str(err.value)


def test_unknown_precision_lists_choices(tmp_path):
    cfg = compose_config(["hardware=cpu"], tmp_path)
    with pytest.raises(HardwareError) as err:
        resolve_hardware_settings(cfg.hardware, "fp8", "auto")
    assert "32-true" in str(err.value) and "bf16-mixed" in str(err.value)


def test_more_devices_than_gpus_is_refused(tmp_path):
    cfg = compose_config(["hardware=a100", "hardware.devices=4"], tmp_path)
    with _fake_cuda("NVIDIA A100-SXM4-80GB", (8, 0), True, count=2), pytest.raises(HardwareError) as err:
        resolve_hardware(cfg)
    assert "hardware.devices=2" in str(err.value)


def test_user_hardware_keys_overlay_the_detected_profile(tmp_path):
    hardware = resolve_hardware(
        compose_config(["hardware.batch_size=24", "hardware.channels_last=false"], tmp_path)
    )
    assert hardware.profile == "cpu" and hardware.batch_size == 24 and hardware.channels_last is False


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


# --- No holes in the schemas (the `*/config.py` schemas, pixelsmith/config/choices.py) ------------------------------------------------

HOLES = [
    # (overrides, the key the message must name, what else it must say: the allowed values or the schema)
    (["data=mnist", "data.root=/does/not/exist"], "data.root", "MNISTDataConfig"),
    (["data=mnist", "data.on_corrupt=explode"], "data.on_corrupt", "MNISTDataConfig"),
    (["data=mnist", "data.extensions=[png]"], "data.extensions", "MNISTDataConfig"),
    (["data=image_folder", "data.root=/tmp", "data.on_corrupt=explode"], "data.on_corrupt", "skip, error"),
    (
        ["data=image_folder", "data.root=/tmp", "data.on_device=true"],
        "data.on_device",
        "ImageFolderDataConfig",
    ),
    (["hardware.accelerator=tpu"], "hardware.accelerator", "cpu, cuda"),
    (["hardware.matmul_precision=low"], "hardware.matmul_precision", "highest, high, medium"),
    (["hardware.compile_mode=fast"], "hardware.compile_mode", "reduce-overhead, max-autotune"),
    (["hardware.optimizer_impl=apex"], "hardware.optimizer_impl", "auto, fused, foreach, for_loop"),
    (["hardware.precision=fp8"], "hardware.precision", "32-true, 16-mixed, bf16-mixed"),
    (["precision.name=fp8"], "precision.name", "auto, 32-true, 16-mixed, bf16-mixed"),
    (["strategy.name=deepspeed"], "strategy.name", "auto, ddp, fsdp"),
    (["strategy.process_group_backend=mpi"], "strategy.process_group_backend", "nccl, gloo"),
    (["schedule.name=linear"], "schedule.name", "constant, warmup_cosine"),
    (["train.host_sync_check=loud"], "train.host_sync_check", "off, warn, error"),
    (["train.host_sync_scope=everything"], "train.host_sync_scope", "loop, step"),
    (["eval.extractor=clip"], "eval.extractor", "mnist, inception"),
]


def assert_composition_names(tmp_path, overrides, key, said) -> None:
    """Composing `overrides` fails with a message naming `key` and saying `said` (the values or the schema)."""
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose_config(overrides, tmp_path)
    text = f"{err.value} {err.value.__cause__}"
    assert key in text and said in text, text


@pytest.mark.parametrize(("overrides", "key", "said"), HOLES, ids=[" ".join(h[0]) for h in HOLES])
def test_each_schema_hole_fails_at_composition_naming_the_key(tmp_path, overrides, key, said):
    assert_composition_names(tmp_path, overrides, key, said)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=mnist", "+data.root=/tmp"], "data.root is not a key of MNISTDataConfig"),
        (["+hardware.batchsize=8"], "did you mean hardware.batch_size?"),
    ],
)
def test_a_key_added_with_plus_to_a_typed_node_is_refused_before_the_run(tmp_path, overrides, message):
    """`+key=value` adds a key past the schema (Hydra allows it); nothing would read it, so the run stops."""
    assert_validation_says(tmp_path, overrides, message)


def assert_validation_says(tmp_path, overrides, message) -> None:
    """The composed config fails validate_config with one invalid value, whose message says `message`."""
    from pixelsmith.config.validate import ConfigValueError, validate_config

    with pytest.raises(ConfigValueError) as err:
        validate_config(compose_config(overrides, tmp_path))
    assert message in str(err.value) and "1 invalid value" in str(err.value)


def test_choice_values_from_yaml_files_are_checked_too(tmp_path):
    bad = tmp_path / "conf"
    (bad / "data").mkdir(parents=True)
    (bad / "data" / "broken.yaml").write_text(
        "defaults:\n  - _image_folder_schema\n  - _self_\n_target_: pixelsmith.data.image_folder.ImageFolderDataModule\n"
        "name: broken\nroot: /tmp\non_corrupt: explode\n"
    )
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose_config([f"hydra.searchpath=[file://{bad}]", "data=broken"], tmp_path)
    assert "data.on_corrupt" in str(err.value) and "skip, error" in str(err.value)


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_every_choice_value_composes_and_stays_a_plain_string(tmp_path):
    """Each allowed value of every choice composes (the command lines and YAMLs that worked still do), and the
    composed config holds plain strings: the run config stored in checkpoints loads with weights_only=True."""

    from omegaconf import OmegaConf

    schema = _all_schemas()

    overrides = [
        ("hardware.accelerator", schema.Accelerator),
        ("hardware.matmul_precision", schema.MatmulPrecision),
        ("hardware.compile_mode", schema.CompileMode),
        ("hardware.optimizer_impl", schema.OptimizerImpl),
        ("hardware.precision", schema.Precision),
        ("precision", schema.PrecisionName),  # the group's options carry the same names
        ("precision.name", schema.PrecisionName),
        ("strategy.name", schema.Strategy),
        ("strategy.process_group_backend", schema.ProcessGroupBackend),
        ("schedule.name", schema.Schedule),
        ("train.host_sync_check", schema.HostSyncMode),
        ("train.host_sync_scope", schema.HostSyncScope),
        ("eval.extractor", schema.Extractor),
        ("model.generator.norm", schema.DCGANNorm),
        ("model.discriminator.norm", schema.DCGANNorm),
    ]
    for key, enum in overrides:
        for member in enum:
            cfg = compose_config([f"{key}={member.value}"], tmp_path)
            value = OmegaConf.select(cfg, key if key != "precision" else "precision.name")
            assert value == member.value and type(value) is str, (key, value)


def test_value_tuples_other_modules_import_are_derived_from_the_enums():
    schema = _all_schemas()

    assert schema.PRECISIONS == ("32-true", "16-mixed", "bf16-mixed")
    assert schema.STRATEGIES == ("auto", "ddp", "fsdp")
    assert schema.SCHEDULES == ("constant", "warmup_cosine")
    assert schema.HOST_SYNC_MODES == ("off", "warn", "error")
    from pixelsmith.core.optim import OPTIMIZER_IMPLS

    assert tuple(schema.OptimizerImpl) == OPTIMIZER_IMPLS


def _all_schemas():
    """Every schema module's names in one namespace (each schema lives beside its code: `*/config.py`)."""
    import importlib
    import types

    from pixelsmith.augment import config as augment_config
    from pixelsmith.config import schema as root
    from pixelsmith.core import config as core_config
    from pixelsmith.data import config as data_config
    from pixelsmith.hardware import schema as hardware_config
    from pixelsmith.metrics import config as metrics_config
    from pixelsmith.parts import part_names
    from pixelsmith.perf import config as perf_config

    # The optional parts' schema modules (gan/config.py, style/config.py, ...), whichever this checkout has.
    part_configs = [importlib.import_module(f"pixelsmith.{part}.config") for part in part_names()]
    names: dict = {}
    for module in (
        root,
        core_config,
        hardware_config,
        data_config,
        augment_config,
        *part_configs,
        metrics_config,
        perf_config,
    ):
        names.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
    return types.SimpleNamespace(**names)


def _constructor_args(cls) -> set[str]:
    import inspect

    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {
            p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        }
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return names


@pytest.mark.parametrize(
    "schema_name",
    [
        "MNISTDataConfig",
        "ImageFolderDataConfig",
    ],
)
def test_typed_configs_match_their_classes_arguments(schema_name):
    """A network config holds exactly its constructor's arguments; a data config only keys its datamodule takes
    (train.py adds accumulate, max_steps and seed)."""
    assert_typed_config_matches_its_class(schema_name)


def assert_typed_config_matches_its_class(schema_name) -> None:
    import dataclasses

    from hydra.utils import get_class

    schema = _all_schemas()

    config = getattr(schema, schema_name)
    keys = {f.name for f in dataclasses.fields(config)} - {"_target_", "name"}
    accepted = _constructor_args(get_class(config._target_))
    if schema_name.endswith("DataConfig"):
        assert keys <= accepted, keys - accepted
        assert accepted - keys <= {"accumulate", "max_steps", "seed", "on_device"}, accepted - keys
    else:
        assert keys == accepted, keys ^ accepted


def assert_model_schema_matches_its_module(schema_name, passed_by_train) -> None:
    import dataclasses

    from hydra.utils import get_class

    schema = _all_schemas()

    config = getattr(schema, schema_name)
    keys = {f.name for f in dataclasses.fields(config)} - {"_target_"}
    accepted = _constructor_args(get_class(config._target_)) - {"_target_"}
    assert keys == accepted - passed_by_train, keys ^ (accepted - passed_by_train)


@pytest.mark.slow  # a subprocess: the full run (`pytest --all`) only
def test_train_py_refuses_a_key_the_datamodule_does_not_take(tmp_path):
    result = run_cli(
        [
            "train.py",
            "data=mnist",
            "data.root=/does/not/exist",
            "data.on_corrupt=explode",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        timeout=120,
    )
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "data.root" in text and "MNISTDataConfig" in text and "Traceback" not in text
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_profile_of_your_own_is_detected_by_its_expected_gpu(tmp_path):
    """Detection reads each profile's `expected_gpu`: a new file is enough, and the longest matching name wins (an
    "H100 NVL" profile beats h100 on that GPU)."""
    import shutil

    from pixelsmith.config.paths import CONF_DIR
    from pixelsmith.hardware.settings import cuda_profile_for

    shutil.copytree(CONF_DIR / "hardware", tmp_path / "hardware")
    (tmp_path / "hardware" / "h100nvl.yaml").write_text("name: h100nvl\nexpected_gpu: H100 NVL\n")
    assert cuda_profile_for("NVIDIA H100 NVL", (9, 0), tmp_path) == "h100nvl"
    assert cuda_profile_for("NVIDIA H100 80GB HBM3", (9, 0), tmp_path) == "h100"
    assert cuda_profile_for("NVIDIA H200", (9, 0), tmp_path) == "h200"
