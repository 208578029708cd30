"""Typed schemas for the Hydra config tree, registered in Hydra's ConfigStore.

Every YAML option of a typed group starts with `defaults: [_schema, _self_]`, and `conf/train.yaml` starts with the
root schema, so a misspelled key (`hardware.batchsize=8`, `maxsteps=5`) or a wrong type (`max_steps=ten`) fails at
start-up with Hydra's message naming the key, instead of training for an hour with a default (LHT #57).

`None` in a hardware field means "take it from the detected profile" (see `pixelsmith.hardware`), which is how
`hardware=auto` composes with command-line overrides such as `hardware.batch_size=32`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")
STRATEGIES = ("auto", "ddp", "fsdp")
SCHEDULES = ("constant", "warmup_cosine")
GAN_LOSSES = ("non_saturating", "hinge")
HOST_SYNC_MODES = ("off", "warn", "error")  # train.host_sync_check (callbacks/host_sync.py)


@dataclass
class HardwareConfig:
    """A hardware profile: device, default precision, backend switches, loader settings and batch size."""

    name: str = "auto"
    accelerator: str | None = None  # "cpu" or "cuda"
    devices: int | None = None
    num_nodes: int = 1
    precision: str | None = None  # the profile's default; `precision=...` on the command line wins
    expected_gpu: str | None = None  # substring of torch.cuda.get_device_name(); a mismatch warns
    cudnn_benchmark: bool | None = None
    matmul_precision: str | None = None  # torch.set_float32_matmul_precision: highest | high | medium
    allow_tf32: bool | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    compile_mode: str | None = None  # default | reduce-overhead | max-autotune
    num_workers: int | None = None
    num_threads: int | None = None  # torch.set_num_threads (intra-op) per process; None = torch's default
    pin_memory: bool | None = None
    batch_size: int | None = None
    optimizer_impl: str | None = None  # Adam implementation: auto | fused | foreach | for_loop
    memory_fraction: float | None = None  # CUDA: torch.cuda.set_per_process_memory_fraction (0, 1]
    cuda_alloc_conf: str | None = None  # CUDA: PYTORCH_CUDA_ALLOC_CONF, e.g. "expandable_segments:True"


@dataclass
class PrecisionConfig:
    name: str = "auto"  # auto = the hardware profile's default


@dataclass
class StrategyConfig:
    name: str = "auto"
    process_group_backend: str | None = None  # None: nccl on CUDA, gloo on CPU
    timeout_minutes: int = 30


@dataclass
class DataConfig:
    _target_: str = MISSING
    name: str = MISSING
    batch_size: int | None = None  # global micro-batch summed over ranks; None = hardware profile default
    resolution: int = 32
    channels: int = 1
    num_workers: int | None = None  # None = hardware profile default
    pin_memory: bool | None = None
    persistent_workers: bool = True
    prefetch_factor: int = 2
    root: str | None = None
    extensions: list[str] = field(default_factory=lambda: ["jpg", "jpeg", "png", "webp"])
    on_corrupt: str = "skip"  # skip (warn and count) | error
    limit: int | None = None  # use only the first N items (debugging)
    resize_shorter: int | None = None  # style content: shorter side before the random crop; None = resolution
    # in-memory datasets (MNIST): keep the images on the training device and slice batches there (data/on_device.py)
    on_device: bool = False


@dataclass
class ScheduleConfig:
    name: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    total_steps: int | None = None  # None = max_steps


@dataclass
class OptimizerConfig:
    lr: float = 2e-4
    betas: list[float] = field(default_factory=lambda: [0.5, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass
class EMAConfig:
    enabled: bool = True
    half_life_kimg: float = 10.0  # StyleGAN2-ADA: beta = 0.5 ** (batch / (half_life_kimg * 1000))
    rampup: float | None = 0.05  # half-life limited to rampup * images seen so far (None: no ramp-up)


@dataclass
class DiffAugmentConfig:
    """`augment=diffaugment` (pixelsmith.augment.DiffAugment)."""

    _target_: str = "pixelsmith.augment.DiffAugment"
    policy: str = "color,translation,cutout"  # comma-separated ops: color, translation, cutout
    translation_ratio: float = 0.125
    cutout_ratio: float = 0.5


@dataclass
class AdaptiveAugmentConfig:
    """`augment=ada` (pixelsmith.augment.AdaptiveAugment): p driven by the sign of D's outputs on reals."""

    _target_: str = "pixelsmith.augment.AdaptiveAugment"
    target: float = 0.6  # E[sign(D(real))] that p is steered towards
    interval: int = 4  # iterations between p adjustments
    speed_kimg: float = 500.0  # images for p to go from 0 to 1
    initial_p: float = 0.0
    max_p: float = 1.0
    xflip: bool = True
    rotate90: bool = True
    translate: float = 0.125
    scale_std: float = 0.2
    rotate_max_deg: float = 180.0
    brightness: float = 0.2
    contrast: float = 0.5
    saturation: float = 1.0
    hue: float = 0.0


@dataclass
class GANModelConfig:
    _target_: str = "pixelsmith.gan.module.GANModule"
    name: str = MISSING
    generator: Any = MISSING  # {_target_: ..., kwargs}; instantiated by the module
    discriminator: Any = MISSING
    loss: str = "non_saturating"
    r1_gamma: float = 0.0  # 0 disables R1
    r1_interval: int = 16  # lazy regularisation: R1 every N iterations, scaled by N
    g_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    d_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    sample_grid_size: int = 64


@dataclass
class LossNetConfig:
    """The frozen VGG of a style model: torchvision weights from $TORCH_HOME/hub/checkpoints/ or `weights_path`."""

    arch: str = "vgg16"  # vgg16 (Johnson) | vgg19 (AdaIN: always vgg19)
    pretrained: bool = True  # false: random weights with a loud warning (tests, offline smoke runs)
    weights_path: str | None = None  # explicit torchvision VGG .pth file


@dataclass
class StyleValidationConfig:
    """Fixed content/style pairs for sample grids and validation metrics (pixelsmith.callbacks.style_validation)."""

    num_pairs: int = (
        4  # content images (the first N of content_dir, sorted), each paired with a style in turn
    )
    size: int = 256  # shorter side resize + center crop of the validation content
    content_dir: str | None = None  # None = the embedded content images (data/style/content)
    lpips: bool = True  # content LPIPS; needs the backbone weights file (same rule as the VGG loss network)
    lpips_net: str = (
        "vgg"  # alex | vgg | squeeze; vgg reads vgg16-397923af.pth, the fast model's loss-net file
    )
    lpips_weights: str | None = None  # explicit LPIPS backbone file; else $TORCH_HOME/hub/checkpoints/


@dataclass
class TransformerNetConfig:
    base_channels: int = 32
    num_residual_blocks: int = 5
    output_activation: str = "sigmoid"  # sigmoid | none
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, one extra forward


@dataclass
class AdaINDecoderConfig:
    width: float = 1.0  # channel multiplier of the VGG19-mirror decoder (1.0 = the paper's)
    gradient_checkpointing: bool = False  # keep only each resolution stage's input; recompute in backward


@dataclass
class StyleModelConfig:
    """Fields shared by the style-transfer models (pixelsmith.style.module)."""

    _target_: str = MISSING
    name: str = MISSING
    style_images: Any = None  # one path or a list of paths; None = every image in data/style/styles
    style_size: int = 256  # shorter side the style images are resized to
    loss_net: LossNetConfig = field(default_factory=LossNetConfig)
    content_weight: float = 1.0
    style_weight: float = 1.0e5
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-3, betas=[0.9, 0.999]))
    validation: StyleValidationConfig = field(default_factory=StyleValidationConfig)


@dataclass
class FastStyleModelConfig(StyleModelConfig):
    """Johnson's feed-forward stylizer for the style(s) in `style_images` (several are averaged into one)."""

    _target_: str = "pixelsmith.style.module.FastStyleModule"
    stylizer: TransformerNetConfig = field(default_factory=TransformerNetConfig)
    content_layers: list[str] = field(default_factory=lambda: ["relu2_2"])
    style_layers: list[str] | None = (
        None  # None = the arch's four (vgg16: relu1_2, relu2_2, relu3_3, relu4_3)
    )
    tv_weight: float = 0.0


@dataclass
class AdaINModelConfig(StyleModelConfig):
    """AdaIN: a decoder for a frozen VGG19 encoder; each content crop is paired with a random style each step."""

    _target_: str = "pixelsmith.style.module.AdaINModule"
    decoder: AdaINDecoderConfig = field(default_factory=AdaINDecoderConfig)
    style_crop: int | None = None  # side of the random style crops; None = the content crop (data.resolution)
    style_weight: float = 10.0
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-4, betas=[0.9, 0.999]))


@dataclass
class PreemptionConfig:
    """Signals that end the run after the current iteration with last.ckpt, exiting 128 + signal (core/preemption.py)."""

    # the signals that end the run with last.ckpt; [] keeps the default handlers
    signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGUSR2"])
    # under SLURM: `scontrol requeue` the job (it comes back to the same run dir and resumes) ...
    requeue: bool = True
    # ... for these signals (not SIGTERM: `scancel` sends it, and a job the user cancelled must stay cancelled)
    requeue_on: list[str] = field(default_factory=lambda: ["SIGUSR1", "SIGUSR2"])
    # under several processes the ranks agree on a signal every N iterations; None = train.log_every_n_steps
    check_every_n_steps: int | None = None


@dataclass
class TrainLoopConfig:
    """Loop settings shared by every model: clipping, non-finite guard, logging, samples, checkpoints."""

    clip_grad_norm: float | None = None  # max global L2 norm per optimizer, on unscaled gradients
    nonfinite_max_consecutive: int = 20  # stop after this many skipped steps in a row
    log_every_n_steps: int = 10
    sample_every_n_steps: int = 250
    checkpoint_every_n_steps: int = 500
    keep_checkpoints: int = 3  # periodic step_*.ckpt files kept besides last.ckpt (0 keeps none)
    progress_bar: bool = True
    # Wall-clock minutes from the start of the run: training also ends at the first iteration past it, and the final
    # evaluation, samples and checkpoint are of that iteration. None = no budget, always all max_steps.
    time_budget_minutes: float | None = None
    # off | warn | error: iterations that log nothing must not make the host wait for the device
    # (callbacks/host_sync.py; CUDA's sync debug mode on a GPU, a count of syncing ops everywhere)
    host_sync_check: str = "off"
    # Resume from <run dir>/checkpoints/last.ckpt when the run dir has one and no ckpt_path is given (a requeued
    # SLURM job, a restarted Kubernetes pod, a torchrun restart, a rerun with the same hydra.run.dir).
    auto_resume: bool = True
    # Start in a run dir that holds another run's outputs but no last.ckpt to resume from (they are overwritten).
    overwrite: bool = False
    preemption: PreemptionConfig = field(default_factory=lambda: PreemptionConfig())


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    data_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class ProfilerConfig:
    """Performance measurement (conf/profiler/: none | breakdown | torch); see docs/performance.md."""

    name: str = "none"
    breakdown: bool = False  # per-phase step time -> perf/ms/*, perf/share/*, <run>/perf/breakdown.*
    throughput: bool = False  # img/s, FLOPs, TFLOP/s, MFU, peak memory -> <run>/perf/throughput.json
    torch: bool = False  # torch.profiler window -> <run>/perf/trace.json (Chrome trace) + kernels.txt/csv
    every_n_steps: int | None = None  # scalars every N iterations; None = train.log_every_n_steps
    warmup_steps: int = 2  # iterations left out of the averages; FLOPs are counted on the last of them
    peak_tflops: float | None = None  # MFU denominator; None = GPU datasheet table / measured CPU GEMM
    torch_wait: int = 2  # iterations skipped before the torch.profiler window
    torch_warmup: int = 1
    torch_active: int = 3  # iterations recorded
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False


@dataclass
class AutoBatchConfig:
    """Largest micro-batch that fits, backed off by `margin` (pixelsmith.perf.batch_size)."""

    enabled: bool = False
    margin: float = 0.15  # back off this fraction from the largest batch that fitted
    ram_budget_gb: float | None = None  # CPU: peak RSS allowed; None = current RSS + 80% of MemAvailable
    gpu_budget_fraction: float = 0.9  # CUDA: peak reserved memory allowed, fraction of the device memory
    start: int | None = None  # first per-process batch tried; None = the configured batch
    max_batch: int = 4096  # per process
    scale_lr: bool = False  # linear scaling rule: every *optimizer.lr x new_batch / reference_batch
    reference_batch: int | None = None  # the batch the lrs were tuned for; None = the configured batch


@dataclass
class EvalConfig:
    """GAN evaluation, shared by the training callback and `evaluate.py` (see README "Evaluation")."""

    every_n_steps: int = 500  # 0 disables evaluation during training
    num_samples: int = 2000  # generated images per evaluation (split across ranks)
    batch_size: int = 250
    extractor: str | None = (
        None  # mnist (offline, digits) | inception (standard FID); None = the data's default
    )
    weights_path: str | None = None  # explicit extractor weights file; else $TORCH_HOME/hub/checkpoints/
    metrics: list[str] = field(default_factory=lambda: ["fid", "kid", "pr"])  # + "is" with inception
    reference_samples: int | None = None  # real images in the reference statistics; None = all of the dataset
    cache_dir: str | None = (
        None  # reference statistics cache; None = $PIXELSMITH_CACHE or ~/.cache/pixelsmith
    )
    monitor: str = "fid"
    save_best: bool = True  # keep checkpoints/best.ckpt for the best monitored value
    seed: int = 0  # latents of the evaluation samples


@dataclass
class TrainConfig:
    """The root of `conf/train.yaml`."""

    task_name: str = "train"
    seed: int = 42
    max_steps: int = 2000  # training iterations (one G and one D update each), whatever the optimizer count
    accumulate: int = 1  # micro-batches per optimizer step
    ckpt_path: str | None = None  # resume from this checkpoint
    objective: str = (
        "eval/best_fid"  # the final metric a sweep optimises (returned to Hydra, ranked in summary.md)
    )
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = MISSING
    augment: Any = None
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    logger: Any = None
    callbacks: Any = None
    paths: PathsConfig = field(default_factory=PathsConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    auto_batch: AutoBatchConfig = field(default_factory=AutoBatchConfig)


def register_configs() -> None:
    """Register every schema; called by the entry points before Hydra composes."""
    cs = ConfigStore.instance()
    cs.store(name="_train_schema", node=TrainConfig)
    cs.store(group="hardware", name="_schema", node=HardwareConfig)
    cs.store(group="precision", name="_schema", node=PrecisionConfig)
    cs.store(group="strategy", name="_schema", node=StrategyConfig)
    cs.store(group="data", name="_schema", node=DataConfig)
    cs.store(group="schedule", name="_schema", node=ScheduleConfig)
    cs.store(group="model", name="_gan_schema", node=GANModelConfig)
    cs.store(group="augment", name="_diffaugment_schema", node=DiffAugmentConfig)
    cs.store(group="augment", name="_ada_schema", node=AdaptiveAugmentConfig)
    cs.store(group="model", name="_style_fast_schema", node=FastStyleModelConfig)
    cs.store(group="model", name="_style_adain_schema", node=AdaINModelConfig)
    cs.store(group="paths", name="_schema", node=PathsConfig)
    cs.store(group="profiler", name="_schema", node=ProfilerConfig)
