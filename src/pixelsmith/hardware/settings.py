"""Hardware: detect the device, let Hydra compose its profile, resolve the composed config into one set of hardware
settings, apply them.

Each step happens in one place:

1. **Detection, before Hydra composes.** Every entry point that composes the training config (`train.py`,
   `evaluate.py`, `pixelsmith-train`/`-evaluate`, the benchmarks, the tests' compose helper) first calls
   `register_detected_profile()`. It detects this machine (a CUDA GPU: v100, a100, h100 or h200 by name, else by
   compute capability; else an Apple GPU: mps; else cpu) and stores the config `hardware/_detected` in Hydra's ConfigStore: a defaults list naming that
   profile. `conf/hardware/auto.yaml`, the default, composes `_detected`, so Hydra composes the real profile file:
   `--cfg job` prints the settings that run, `hardware.*` keys on the command line (and in `conf/local/`) win over
   the profile's values by ordinary Hydra composition, and a profile of your own on `hydra.searchpath` composes and
   runs like a shipped one.
2. **One set of hardware settings.** `resolve_hardware_settings` turns the composed `hardware`, `precision` and
   `strategy` nodes into a frozen `HardwareSettings` (no profile file is read here: the composed node is the
   profile). An explicit `precision=...` wins over the profile's default precision. Impossible requests (a CUDA profile with no CUDA device, bf16 on a GPU
   without native bf16, NCCL without a GPU, more devices than GPUs) stop here with a HardwareError naming the fix,
   before any data is read or any output is written.
3. **One application.** `apply_hardware` sets the process-wide switches the hardware settings ask for (matmul
   precision, intra-op threads, cudnn.benchmark, TF32, the CUDA allocator settings and memory fraction);
   `pixelsmith.run.fit` calls it once per run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from pixelsmith.config.choices import values
from pixelsmith.core.config import PRECISIONS, OptimizerImpl
from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.schema import STRATEGIES, HardwareConfig
from pixelsmith.run.launch import launch_topology

log = logging.getLogger(__name__)

OPTIMIZER_IMPLS = values(OptimizerImpl)
DETECTED = "_detected"  # the ConfigStore entry `hardware/_detected` that conf/hardware/auto.yaml composes


class HardwareError(PixelsmithError, RuntimeError):
    """A hardware/precision/strategy request this machine cannot honour; the message names the fix."""


@dataclass(frozen=True)
class HardwareSettings:
    """Where and how to compute: everything the trainer, the training core and `apply_hardware` read, resolved once from
    the composed `hardware`, `precision` and `strategy` groups (`resolve_hardware_settings`)."""

    profile: str  # the composed profile's name (hardware=auto: the detected one)
    accelerator: str  # cpu | cuda | mps
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
    compile_scope: str
    num_workers: int
    pin_memory: bool
    batch_size: int
    device_name: str
    num_threads: int | None = None  # intra-op threads per process; None leaves torch's default
    optimizer_impl: str = (
        "foreach"  # Adam's implementation: auto | fused | foreach | for_loop (core/optim.py)
    )
    memory_fraction: float | None = None  # CUDA: torch.cuda.set_per_process_memory_fraction, in (0, 1]
    cuda_alloc_conf: str | None = None  # CUDA: PYTORCH_CUDA_ALLOC_CONF, e.g. "expandable_segments:True"
    compile_cache_dir: str | None = None  # torch.compile's on-disk cache (compile_cache_dir() when None)
    cuda_graphs: bool = False  # the training iteration captured as CUDA graphs (core/graphs.py)

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


# oneDNN's instruction sets with bf16 instructions (ONEDNN_MAX_CPU_ISA caps oneDNN below the named one).
ONEDNN_BF16_ISAS = (
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
    "ALL",
    "DEFAULT",
)


def isa_capped_below_bf16() -> bool:
    """True when ATEN_CPU_CAPABILITY or ONEDNN_MAX_CPU_ISA keep torch's kernels off the CPU's bf16 instructions (an
    AVX2-only machine emulated on an AVX-512 one): bf16 is then emulated, whatever the CPU has."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    return aten in ("default", "avx2") or bool(onednn and onednn not in ONEDNN_BF16_ISAS)


def cpu_has_native_bf16() -> bool:
    """True when the CPU has bf16 instructions (AVX512-BF16 or AMX) that torch may use; without them bf16 autocast
    is emulated and slow."""
    if isa_capped_below_bf16():
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or cpu_has_amx())


def cpu_has_amx() -> bool:
    """True when the CPU has AMX tiles (Sapphire Rapids and newer Xeons): where bf16 autocast is faster than fp32.

    `cpu_prefers_bf16` is the rule `precision=auto` follows (docs/platforms.md)."""
    return bool(torch.cpu._is_amx_tile_supported())


def cpu_vendor() -> str:
    """The CPU's vendor string ("GenuineIntel", "AuthenticAMD"; "" where the OS does not say)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_prefers_bf16() -> bool:
    """True where bf16 autocast trains faster than fp32 on this CPU, the rule `precision=auto` follows:
    - AMX tiles (Intel Sapphire Rapids and newer): bf16 matrix units several times faster than fp32 FMAs;
    - AVX512-BF16 on an AMD CPU (Zen 4 and newer): the main job's DCGAN step at batch 64 ran 1.26x faster in
      bf16-mixed than in 32-true (2,218 against 1,763 img/s, medians of 3 interleaved repeats, `bench.py`, a quiet
      2-core EPYC);
    - not AVX512-BF16 alone on Intel (Cooper Lake): fp32 was about 3x faster there; nor without bf16 instructions
      (emulated, many times slower), or where ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA keep torch off them."""
    if isa_capped_below_bf16():
        return False
    if cpu_has_amx():
        return True
    return bool(torch.cpu._is_avx512_bf16_supported()) and cpu_vendor() == "AuthenticAMD"


def mps_available() -> bool:
    """An Apple GPU that torch can use (torch.backends.mps: macOS 12.3+, Apple silicon or an AMD GPU)."""
    return bool(torch.backends.mps.is_available())


def profiles_by_gpu(conf_dir: Path | None = None) -> dict[str, str]:
    """`expected_gpu` -> profile name, read from the profiles themselves (conf/hardware/*.yaml), so a profile of your
    own for another GPU is detected by adding its file, with no table here to edit."""
    from omegaconf import OmegaConf

    from pixelsmith.config.paths import CONF_DIR

    found = {}
    for path in sorted(((conf_dir or CONF_DIR) / "hardware").glob("*.yaml")):
        if path.stem.startswith("_"):
            continue
        expected = OmegaConf.load(path).get("expected_gpu")
        if expected:
            found[str(expected)] = path.stem
    return found


def cuda_profile_for(device_name: str, capability: tuple[int, int], conf_dir: Path | None = None) -> str:
    """Map a CUDA device to the profile whose `expected_gpu` its name contains (the longest such name wins), else by
    compute capability: 8.0 and newer a100, older v100. `resolve_hardware_settings` warns when the profile was made for another
    GPU."""
    upper = device_name.upper()
    matches = [
        (len(gpu), profile) for gpu, profile in profiles_by_gpu(conf_dir).items() if gpu.upper() in upper
    ]
    if matches:
        return max(matches)[1]
    return "a100" if capability >= (8, 0) else "v100"


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
    """The shipped profile for the device this process sees: a CUDA GPU's (cuda_profile_for), else mps on an Apple
    GPU, else cpu.

    Without a GPU this costs nothing (no driver call beyond a device count); with one it reads device 0's name and
    compute capability, which initialises CUDA in this process, the one that then trains on it."""
    if torch.cuda.is_available():
        return cuda_profile_for(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
    if mps_available():
        return "mps"
    return "cpu"


_detected_here: str | None = None  # what register_detected_profile found in this process


def register_detected_profile() -> str:
    """Detect this machine's profile and store it for `hardware=auto`; returns its name (cpu, mps, v100, a100, h100,
    h200, or a profile of your own).

    Call it before Hydra composes the training config: the entry points do at import, `compose` callers (tests, the
    benchmarks) before each compose. It stores `hardware/_detected` in Hydra's ConfigStore as a defaults list that
    names the profile, which `conf/hardware/auto.yaml` composes. A second call replaces the first (tests that mock
    torch.cuda call it again inside the mock)."""
    global _detected_here
    from hydra.core.config_store import ConfigStore

    name = detect_profile()
    ConfigStore.instance().store(group="hardware", name=DETECTED, node={"defaults": [name, "_self_"]})
    _detected_here = name
    return name


def check_detected_here(profile: str) -> None:
    """Stop a multirun job whose `hardware=auto` was detected on another machine.

    Detection runs where the config is composed. hydra-submitit-launcher (`hydra/launcher=slurm`) hands each SLURM job
    the submitting process's ConfigStore, so a job on a GPU node would compose the login node's profile (cpu). Called
    by `pixelsmith.run.entry.guarded_run` inside the job; a no-op outside multiruns and for named profiles."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or hydra_cfg.runtime.choices.get("hardware") != "auto":
        return
    here = _detected_here if _detected_here is not None else detect_profile()
    if here != profile:
        raise HardwareError(
            f"hardware=auto composed the {profile} profile on the machine that launched this job, but this machine "
            f"takes the {here} profile. A launcher that composes the config on another machine (hydra/launcher=slurm "
            f"submits from a login node) needs the profile named: hardware={here} (or the GPU's own profile)."
        )


def _get(hardware: HardwareConfig | DictConfig, key: str) -> Any:
    return getattr(hardware, key, None)


def resolve_hardware_settings(
    hardware: HardwareConfig | DictConfig,
    precision: str,
    strategy: str,
    process_group_backend: str | None = None,
) -> HardwareSettings:
    """Turn the composed `hardware` node (the profile Hydra composed, the user's `hardware.*` keys already on top),
    `precision` and `strategy` into a HardwareSettings, or stop with a HardwareError. Keys a profile leaves null take the
    defaults below (a minimal profile of your own: `accelerator: cuda` and a name)."""
    requested = _get(hardware, "name") or "auto"
    accelerator = _get(hardware, "accelerator") or "cpu"
    cuda_ok = torch.cuda.is_available()
    if accelerator == "cuda" and not cuda_ok:
        raise HardwareError(
            f"hardware={requested} needs a CUDA GPU, but this machine has none "
            f"(torch {torch.__version__}: torch.cuda.is_available() is False). "
            "Use hardware=auto to detect the device (it picks the cpu profile here) or hardware=cpu."
            + _nvidia_hint()
        )
    if accelerator == "mps" and not mps_available():
        raise HardwareError(
            f"hardware={requested} needs an Apple GPU (torch.backends.mps), but torch {torch.__version__} sees none "
            f"here (built with MPS: {torch.backends.mps.is_built()}; it needs macOS 12.3 or newer). Use "
            "hardware=auto to detect the device or hardware=cpu."
        )
    if accelerator not in ("cpu", "cuda", "mps"):
        raise HardwareError(f"hardware.accelerator={accelerator!r} is not supported; use cpu, cuda or mps.")

    if accelerator == "cuda":
        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = "Apple GPU (MPS)" if accelerator == "mps" else "cpu"
    if accelerator == "cuda":
        check_torch_build_supports(device_name, tuple(torch.cuda.get_device_capability(0)), requested)
    expected_gpu = _get(hardware, "expected_gpu")
    if accelerator == "cuda" and expected_gpu and expected_gpu.upper() not in device_name.upper():
        log.warning(
            "The %s profile is tuned for %s, but the GPU is %s (hardware=auto takes the profile named after the GPU, "
            "else a100 or v100 by compute capability). Copy conf/hardware/%s.yaml to a profile of your own to tune "
            "it (README, How to add your own ... hardware profile).",
            requested,
            expected_gpu,
            device_name,
            requested,
        )

    resolved_precision = _resolve_precision(precision, _get(hardware, "precision"), accelerator)

    if strategy not in STRATEGIES:
        raise HardwareError(f"strategy={strategy!r} is unknown; choose one of {', '.join(STRATEGIES)}.")
    if process_group_backend == "nccl" and accelerator != "cuda":
        raise HardwareError(
            f"strategy.process_group_backend=nccl needs CUDA GPUs, but hardware={requested} runs on the CPU. "
            "Leave strategy.process_group_backend unset (gloo on CPU, nccl on GPUs) or set it to gloo."
        )
    if accelerator == "mps" and strategy != "auto":
        raise HardwareError(
            f"strategy={strategy} needs several processes, each with a device of its own; an Apple GPU is one device "
            "that one process drives (hardware=mps). Leave strategy=auto."
        )
    if strategy == "fsdp" and accelerator != "cuda":
        # Pixelsmith's own FSDP2 strategy runs over gloo (Lightning's FSDPStrategy would refuse a CPU).
        log.info(
            "strategy=fsdp on CPU (gloo): this runs the sharded code path for testing; FSDP saves memory only on "
            "GPUs. For speed on CPU use strategy=ddp."
        )
    devices = _get(hardware, "devices") or 1  # its range: config/validate.py's rule, at start-up
    num_nodes = _get(hardware, "num_nodes") or 1
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
    if accelerator == "mps" and devices * num_nodes > 1:
        raise HardwareError(
            f"hardware.devices={devices} hardware.num_nodes={num_nodes}: an Apple GPU is one device, driven by one "
            "process; set hardware.devices=1 (hardware=mps)."
        )
    if accelerator == "mps" and _get(hardware, "cuda_graphs"):
        # Its uncaptured dry run keeps counters and schedules as float64 device tensors, which MPS does not have.
        log.info("hardware.cuda_graphs applies to CUDA only; an Apple GPU runs the eager iteration.")
    if accelerator == "mps" and _get(hardware, "compile"):
        log.warning(
            "hardware.compile=true on an Apple GPU: torch.compile's Metal backend is experimental in torch %s; "
            "hardware.compile=false runs eagerly (the mps profile's default).",
            torch.__version__,
        )
    if accelerator == "cuda" and launched is None and devices > torch.cuda.device_count():
        raise HardwareError(
            f"hardware.devices={devices} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
            f"set hardware.devices={torch.cuda.device_count()} or check CUDA_VISIBLE_DEVICES."
        )
    num_threads = _get(hardware, "num_threads")
    if num_threads is not None and num_threads < 1:
        raise HardwareError(
            f"hardware.num_threads={num_threads} must be at least 1 (or null for torch's default)."
        )
    if devices * num_nodes > 1 and strategy == "auto":
        strategy = "ddp"
    if strategy == "fsdp" and devices * num_nodes == 1:
        log.warning(
            "strategy=fsdp with one process shards nothing (each rank would hold 1/1 of the weights); "
            "set hardware.devices=N for N GPUs."
        )
    optimizer_impl = str(_get(hardware, "optimizer_impl") or "foreach")
    if optimizer_impl not in OPTIMIZER_IMPLS:
        raise HardwareError(
            f"hardware.optimizer_impl={optimizer_impl!r} is unknown; choose one of {', '.join(OPTIMIZER_IMPLS)}."
        )
    memory_fraction = _get(hardware, "memory_fraction")
    if memory_fraction is not None and not 0.0 < float(memory_fraction) <= 1.0:
        raise HardwareError(f"hardware.memory_fraction={memory_fraction} must be in (0, 1].")

    def flag(key: str) -> bool:
        return bool(_get(hardware, key))

    num_workers = _get(hardware, "num_workers")
    return HardwareSettings(
        profile=requested,
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        precision=resolved_precision,
        strategy=strategy,
        process_group_backend=process_group_backend or ("nccl" if accelerator == "cuda" else "gloo"),
        cudnn_benchmark=flag("cudnn_benchmark") and accelerator == "cuda",
        matmul_precision=str(_get(hardware, "matmul_precision") or "highest"),
        allow_tf32=flag("allow_tf32") and accelerator == "cuda",
        channels_last=flag("channels_last"),
        compile=flag("compile"),
        compile_mode=str(_get(hardware, "compile_mode") or "default"),
        compile_scope=str(_get(hardware, "compile_scope") or "network"),
        num_workers=num_workers if num_workers is not None else 0,
        pin_memory=flag("pin_memory") and accelerator == "cuda",
        batch_size=_get(hardware, "batch_size") or 64,
        device_name=device_name,
        num_threads=num_threads,
        optimizer_impl=optimizer_impl,
        memory_fraction=None if memory_fraction is None else float(memory_fraction),
        cuda_alloc_conf=_get(hardware, "cuda_alloc_conf") or None,
        compile_cache_dir=_get(hardware, "compile_cache_dir") or None,
        cuda_graphs=flag("cuda_graphs") and accelerator != "mps",
    )


def _resolve_precision(precision: str, profile_precision: str | None, accelerator: str) -> str:
    explicit = precision != "auto"
    name = precision if explicit else str(profile_precision or "32-true")
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
        if accelerator == "cpu" and not explicit and not cpu_prefers_bf16():
            log.info(
                "On this CPU fp32 trains faster than bf16 autocast: precision=auto takes 32-true "
                "(docs/platforms.md; precision=bf16-mixed to override)."
            )
            return "32-true"
        if accelerator == "cpu" and not cpu_has_native_bf16():
            log.warning(
                "precision=bf16-mixed on a CPU without native bf16 is emulated and slow; 32-true is faster."
            )
        elif accelerator == "cpu" and not cpu_prefers_bf16():
            log.warning(
                "precision=bf16-mixed on an Intel CPU with AVX512-BF16 but no AMX: fp32 was measured faster on such "
                "CPUs (docs/platforms.md); precision=auto picks 32-true here."
            )
        if accelerator == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
            raise HardwareError(
                "precision=bf16-mixed on an Apple GPU needs macOS 14 or newer (MPS has no bfloat16 before); use "
                "precision=16-mixed or precision=32-true."
            )
    if name == "16-mixed" and accelerator == "cpu":
        # Lightning would silently swap in bf16 here; Pixelsmith owns its GradScaler, so fp16 really runs (tests use it).
        log.warning(
            "precision=16-mixed on CPU runs fp16 autocast with a CPU GradScaler: correct but slow on CPUs."
        )
    return name


NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def apply_hardware(hardware: HardwareSettings) -> None:
    """Set the process-wide switches the hardware settings ask for: the one place they are set (`pixelsmith.run.fit` calls it once
    per run, before data and model; a hand-written loop such as the benchmarks' plain loop calls it too).

    Matmul precision and intra-op threads everywhere; cudnn.benchmark (False on a CPU: Lightning's Trainer is
    not given `benchmark`, so it does not set it a second time); on CUDA also TF32, the caching allocator's settings
    (PYTORCH_CUDA_ALLOC_CONF before CUDA's first allocation, the allocator's run-time setter after) and this process's
    memory fraction (its device is LOCAL_RANK's)."""
    torch.set_float32_matmul_precision(hardware.matmul_precision)
    if hardware.compile:
        use_compile_cache(hardware.compile_cache_dir)
    if hardware.num_threads is not None:
        # On a shared or oversubscribed CPU, fewer threads than cores can be several times faster: an OpenMP
        # barrier waits for its slowest thread, and a descheduled one stalls every op (README "Style transfer",
        # docs/performance.md).
        torch.set_num_threads(hardware.num_threads)
    torch.backends.cudnn.benchmark = hardware.cudnn_benchmark
    if hardware.accelerator != "cuda":
        if os.environ.get(NVML_CHECK) == "1" and not torch.cuda.is_available():
            # Lightning asks torch to answer `torch.cuda.is_available()` through NVML (no CUDA initialisation, so
            # forked loader workers stay safe). Without a GPU NVML never loads and every call tries again: a dlopen
            # per call, and torch's optimizers ask at every step (28 us each on a 2-core CPU). With no GPU there is
            # no CUDA state a fork could inherit: the runtime's own count answers in under a microsecond.
            os.environ[NVML_CHECK] = "0"
        if hardware.memory_fraction is not None or hardware.cuda_alloc_conf:
            log.info(
                "hardware.memory_fraction / cuda_alloc_conf apply to CUDA only; on CPU bound the batch by RAM "
                "with auto_batch.ram_budget_gb."
            )
        return
    torch.backends.cuda.matmul.allow_tf32 = hardware.allow_tf32
    torch.backends.cudnn.allow_tf32 = hardware.allow_tf32
    if hardware.cuda_alloc_conf:
        if torch.cuda.is_initialized():
            # Too late for the environment variable; the allocator accepts most keys at run time.
            set_allocator = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
            if set_allocator is not None:  # torch.cuda.memory's wrapper warns (FutureWarning) on torch 2.11
                set_allocator(hardware.cuda_alloc_conf)
            else:
                torch.cuda.memory._set_allocator_settings(hardware.cuda_alloc_conf)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = hardware.cuda_alloc_conf
    if hardware.memory_fraction is not None:
        device = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_per_process_memory_fraction(hardware.memory_fraction, device)


COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_dir(configured: str | None = None) -> Path:
    """Where torch.compile keeps what it compiled, across runs: `hardware.compile_cache_dir`, else an inductor cache
    the user already chose ($TORCHINDUCTOR_CACHE_DIR), else $PIXELSMITH_CACHE/compile or ~/.cache/pixelsmith/compile,
    beside the FID statistics: a place to see and to clear, instead of torch's default under /tmp that a reboot empties.
    """
    if configured:
        return Path(configured).expanduser()
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get(COMPILE_CACHE_ENV)
    # Inductor writes its /tmp default into the variable at first use: that one is not the user's choice.
    if chosen and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return Path(chosen)
    root = os.environ.get("PIXELSMITH_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "pixelsmith") / "compile"


def use_compile_cache(configured: str | None = None) -> Path:
    """Point inductor's on-disk caches (FX graphs, AOTAutograd, Triton kernels under it) at `compile_cache_dir`, and
    make sure the graph caches are on: a second run of the same model loads its graphs instead of compiling them."""
    directory = compile_cache_dir(configured)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[COMPILE_CACHE_ENV] = str(directory.resolve())
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return directory
