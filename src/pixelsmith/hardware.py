"""Hardware profiles: detect the device, resolve `hardware=` + `precision=` into one runtime plan, apply backend switches.

Resolution order for every setting: the profile YAML (`conf/hardware/<name>.yaml`, or the detected one for
`hardware=auto`), then any non-null `hardware.*` key given by the user. Precision: an explicit `precision=...`
wins over the profile's default. Impossible requests (a CUDA profile with no CUDA device, bf16 on a GPU without
native bf16, NCCL without a GPU) stop here, before any data is read or any output is written.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields, replace

import torch
from omegaconf import DictConfig, OmegaConf

from pixelsmith.config.schema import PRECISIONS, STRATEGIES, HardwareConfig
from pixelsmith.errors import PixelsmithError
from pixelsmith.launch import launch_topology
from pixelsmith.paths import CONF_DIR

log = logging.getLogger(__name__)


class HardwareError(PixelsmithError, RuntimeError):
    """A hardware/precision/strategy request this machine cannot honour; the message names the fix."""


@dataclass(frozen=True)
class RuntimePlan:
    """Everything the trainer and the training core need to know about where and how to compute."""

    profile: str
    accelerator: str  # cpu | cuda
    devices: int
    num_nodes: int
    precision: str  # one of PRECISIONS, after the profile/CLI/device resolution
    strategy: str  # auto | ddp | fsdp
    process_group_backend: str | None
    cudnn_benchmark: bool
    matmul_precision: str
    allow_tf32: bool
    channels_last: bool
    compile: bool
    compile_mode: str
    num_workers: int
    pin_memory: bool
    batch_size: int
    device_name: str
    num_threads: int | None = None  # intra-op threads per process; None leaves torch's default

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


def cpu_has_native_bf16() -> bool:
    """True when the CPU has bf16 instructions (AVX512-BF16 or AMX); without them bf16 autocast is emulated and slow."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cuda_profile_for(device_name: str, capability: tuple[int, int]) -> str:
    """Map a CUDA device to the closest shipped profile (by name, else by compute capability)."""
    upper = device_name.upper()
    for key, profile in (("H100", "h100"), ("H200", "h100"), ("A100", "a100"), ("V100", "v100")):
        if key in upper:
            return profile
    profile = "a100" if capability >= (8, 0) else "v100"
    log.warning(
        "No hardware profile names %r; using the %s profile (compute capability %d.%d). "
        "Copy conf/hardware/%s.yaml to tune one for it.",
        device_name,
        profile,
        *capability,
        profile,
    )
    return profile


# The newest torch builds that still carry kernels for an architecture, by compute capability major. Volta (sm_70) is
# not in the CUDA 12.8+ and 13 builds (torch 2.8 and later), so a V100 needs a CUDA 12.6 build.
_BUILD_FOR_ARCH = {
    7: "a CUDA 12.6 build: pip install -c constraints.txt torch torchvision --index-url "
    "https://download.pytorch.org/whl/cu126",
}
_DEFAULT_BUILD = (
    "a build for your driver's CUDA version: pip install -c constraints.txt torch torchvision --index-url "
    "https://download.pytorch.org/whl/cu128 (or cu126, cu130)"
)


def torch_build_supports(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a torch built for `arch_list` (torch.cuda.get_arch_list()) runs on a GPU of `capability`: a binary
    for sm_XY runs on sm_XZ with Z >= Y (same major), and PTX for compute_XY is compiled at load time for any newer
    GPU. An empty list (a build that does not say) is taken as supported."""
    if not arch_list:
        return True
    major, minor = capability
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = number.rstrip("af")  # sm_90a, sm_100f: arch-specific variants of sm_90, sm_100
        if not digits.isdigit():
            continue
        arch_major, arch_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def check_torch_build_supports(device_name: str, capability: tuple[int, int], requested: str) -> None:
    """Stop before anything runs when the installed torch has no kernels for this GPU (today's default CUDA 13
    wheel lacks sm_70, so a V100 would fail at its first kernel with "no kernel image is available")."""
    arch_list = list(torch.cuda.get_arch_list())
    if torch_build_supports(capability, arch_list):
        return
    sm = f"sm_{capability[0]}{capability[1]}"
    raise HardwareError(
        f"hardware={requested}: the GPU {device_name} ({sm}) is not supported by the installed torch "
        f"{torch.__version__} (CUDA {torch.version.cuda}), which has kernels for {' '.join(arch_list)} only. Install "
        f"{_BUILD_FOR_ARCH.get(capability[0], _DEFAULT_BUILD)}, then check that "
        f'python -c "import torch; print(torch.cuda.get_arch_list())" lists {sm} (README, "GPU install").'
    )


def _nvidia_hint() -> str:
    import shutil
    from pathlib import Path

    if not (Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi")):
        return ""
    return f" This machine does seem to have an NVIDIA GPU: torch {torch.__version__} is " + (
        f"built for CUDA {torch.version.cuda}, which needs a driver at least as new as that CUDA release "
        "(nvidia-smi shows the driver's CUDA version); install a torch build for an older CUDA or update the "
        'driver (README, "GPU install").'
        if torch.version.cuda
        else 'a CPU-only build; install a CUDA build (README, "GPU install").'
    )


def detect_profile() -> str:
    if torch.cuda.is_available():
        return cuda_profile_for(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
    return "cpu"


def load_profile(name: str) -> HardwareConfig:
    path = CONF_DIR / "hardware" / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in path.parent.glob("*.yaml") if not p.stem.startswith("_"))
        raise HardwareError(
            f"No hardware profile {name!r} ({path} is missing). Available: {', '.join(available)}."
        )
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    merged = OmegaConf.merge(OmegaConf.structured(HardwareConfig), raw)
    return HardwareConfig(**OmegaConf.to_container(merged))


def _overlay(base: HardwareConfig, overrides: HardwareConfig | DictConfig) -> HardwareConfig:
    """The user's non-null hardware keys win over the profile's values."""
    changes = {}
    for f in fields(HardwareConfig):
        value = getattr(overrides, f.name)
        if f.name != "name" and value is not None:
            changes[f.name] = value
    return replace(base, **changes)


def resolve_plan(
    hardware: HardwareConfig | DictConfig,
    precision: str,
    strategy: str,
    process_group_backend: str | None = None,
) -> RuntimePlan:
    """Turn the composed `hardware`, `precision` and `strategy` groups into a RuntimePlan, or stop with a HardwareError."""
    requested = hardware.name
    profile_name = detect_profile() if requested == "auto" else requested
    profile = _overlay(load_profile(profile_name), hardware)

    accelerator = profile.accelerator or "cpu"
    cuda_ok = torch.cuda.is_available()
    if accelerator == "cuda" and not cuda_ok:
        raise HardwareError(
            f"hardware={requested} needs a CUDA GPU, but this machine has none "
            f"(torch {torch.__version__}: torch.cuda.is_available() is False). "
            "Use hardware=auto to detect the device (it picks the cpu profile here) or hardware=cpu."
            + _nvidia_hint()
        )
    if accelerator not in ("cpu", "cuda"):
        raise HardwareError(f"hardware.accelerator={accelerator!r} is not supported; use cpu or cuda.")

    device_name = torch.cuda.get_device_name(0) if accelerator == "cuda" else "cpu"
    if accelerator == "cuda":
        check_torch_build_supports(device_name, tuple(torch.cuda.get_device_capability(0)), requested)
    if (
        accelerator == "cuda"
        and profile.expected_gpu
        and profile.expected_gpu.upper() not in device_name.upper()
    ):
        log.warning(
            "hardware=%s is tuned for %s but the GPU is %s; consider hardware=auto.",
            requested,
            profile.expected_gpu,
            device_name,
        )

    resolved_precision = _resolve_precision(precision, profile, accelerator, requested)

    if strategy not in STRATEGIES:
        raise HardwareError(f"strategy={strategy!r} is unknown; choose one of {', '.join(STRATEGIES)}.")
    if process_group_backend == "nccl" and accelerator != "cuda":
        raise HardwareError(
            f"strategy.process_group_backend=nccl needs CUDA GPUs, but hardware={requested} runs on the CPU. "
            "Leave strategy.process_group_backend unset (gloo on CPU, nccl on GPUs) or set it to gloo."
        )
    if strategy == "fsdp" and accelerator != "cuda":
        # Pixelsmith's own FSDP2 strategy runs over gloo (Lightning's FSDPStrategy would refuse a CPU).
        log.info(
            "strategy=fsdp on CPU (gloo): this runs the sharded code path for testing; FSDP saves memory only on "
            "GPUs. For speed on CPU use strategy=ddp."
        )
    devices = profile.devices or 1
    if devices < 1:
        raise HardwareError(f"hardware.devices={devices} must be at least 1.")
    num_nodes = profile.num_nodes
    launched = launch_topology()
    if launched is not None:
        # torchrun or SLURM started the ranks: their count wins, so one config runs under every launcher.
        if (devices, num_nodes) not in ((1, 1), (launched.processes_per_node, launched.num_nodes)):
            log.warning(
                "hardware.devices=%d hardware.num_nodes=%d, but %s started %d node(s) x %d process(es): "
                "using the launcher's numbers.",
                devices,
                num_nodes,
                launched.launcher,
                launched.num_nodes,
                launched.processes_per_node,
            )
        devices, num_nodes = launched.processes_per_node, launched.num_nodes
    if accelerator == "cuda" and launched is None and devices > torch.cuda.device_count():
        raise HardwareError(
            f"hardware.devices={devices} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
            f"set hardware.devices={torch.cuda.device_count()} or check CUDA_VISIBLE_DEVICES."
        )
    if profile.num_threads is not None and profile.num_threads < 1:
        raise HardwareError(
            f"hardware.num_threads={profile.num_threads} must be at least 1 (or null for torch's default)."
        )
    if devices * num_nodes > 1 and strategy == "auto":
        strategy = "ddp"
    if strategy == "fsdp" and devices * num_nodes == 1:
        log.warning(
            "strategy=fsdp with one process shards nothing (each rank would hold 1/1 of the weights); "
            "set hardware.devices=N for N GPUs."
        )

    return RuntimePlan(
        profile=profile_name,
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        precision=resolved_precision,
        strategy=strategy,
        process_group_backend=process_group_backend or ("nccl" if accelerator == "cuda" else "gloo"),
        cudnn_benchmark=bool(profile.cudnn_benchmark) and accelerator == "cuda",
        matmul_precision=profile.matmul_precision or "highest",
        allow_tf32=bool(profile.allow_tf32) and accelerator == "cuda",
        channels_last=bool(profile.channels_last),
        compile=bool(profile.compile),
        compile_mode=profile.compile_mode or "default",
        num_workers=profile.num_workers if profile.num_workers is not None else 0,
        pin_memory=bool(profile.pin_memory) and accelerator == "cuda",
        batch_size=profile.batch_size or 64,
        device_name=device_name,
        num_threads=profile.num_threads,
    )


def _resolve_precision(precision: str, profile: HardwareConfig, accelerator: str, requested: str) -> str:
    explicit = precision != "auto"
    name = precision if explicit else (profile.precision or "32-true")
    if name not in PRECISIONS:
        raise HardwareError(
            f"precision={name!r} is unknown; choose one of {', '.join(PRECISIONS)} (or auto)."
        )
    if name == "bf16-mixed":
        if accelerator == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
            raise HardwareError(
                f"precision=bf16-mixed needs a GPU with native bfloat16 (compute capability 8.0 or newer: A100, H100, "
                f"L4, RTX 30xx/40xx); {torch.cuda.get_device_name(0)} lacks it. Use precision=16-mixed (fp16 with a "
                "GradScaler, the v100 profile's default) or precision=32-true."
            )
        if accelerator == "cpu" and not cpu_has_native_bf16():
            if not explicit:
                log.info("This CPU has no native bf16; the cpu profile falls back to precision=32-true.")
                return "32-true"
            log.warning(
                "precision=bf16-mixed on a CPU without native bf16 is emulated and slow; 32-true is faster."
            )
    if name == "16-mixed" and accelerator == "cpu":
        # Lightning would silently swap in bf16 here; Pixelsmith owns its GradScaler, so fp16 really runs (tests use it).
        log.warning(
            "precision=16-mixed on CPU runs fp16 autocast with a CPU GradScaler: correct but slow on CPUs."
        )
    return name


def apply_backend_settings(plan: RuntimePlan) -> None:
    """Set the process-wide switches the plan asks for (cudnn autotuner, TF32, matmul precision, allocator)."""
    torch.set_float32_matmul_precision(plan.matmul_precision)
    if plan.num_threads is not None:
        # On a shared or oversubscribed CPU, fewer threads than cores can be several times faster: an OpenMP
        # barrier waits for its slowest thread, and a descheduled one stalls every op (README "Style transfer", docs/performance.md).
        torch.set_num_threads(plan.num_threads)
    if plan.accelerator == "cuda":
        torch.backends.cudnn.benchmark = plan.cudnn_benchmark
        torch.backends.cuda.matmul.allow_tf32 = plan.allow_tf32
        torch.backends.cudnn.allow_tf32 = plan.allow_tf32
        # Fewer fragmentation OOMs with varying shapes; must be set before the first CUDA allocation.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
