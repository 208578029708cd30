"""Schemas of the GAN models (`model=dcgan`, `model=stylegan2`, a fork's `_gan_schema` model), their networks and
their objective, beside the GAN code: `model.*` keys and `GANModule`'s arguments are kept equal by a test
(tests/test_config.py), as are each network config and its class's arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from pixelsmith.config.choices import choice
from pixelsmith.core.config import CoreModelConfig, OptimizerConfig


class StyleGAN2Upsampling(StrEnum):
    FIR = "fir"  # NVlabs: stride-2 transposed conv, then the [1, 3, 3, 1] blur; FIR-upsampled skip image
    BILINEAR = "bilinear"  # bilinear 2x, then the conv (4x that conv's FLOPs); bilinear skip image


class StyleGAN2Downsampling(StrEnum):
    FIR = "fir"  # NVlabs: [1, 3, 3, 1] blur, then a stride-2 conv; the skip path blurred, then 1x1
    AVG_POOL = "avg_pool"  # 2x2 average pool, then the conv (more aliasing)


class StyleGAN2DArchitecture(StrEnum):
    RESNET = "resnet"  # NVlabs' default: residual blocks (a 1x1 skip branch, the sum scaled by 1/sqrt(2))
    ORIG = "orig"  # NVlabs' cifar config: plain conv blocks, no skip branch
    SKIP = "skip"  # plain blocks, each also fed a fromRGB of the image downsampled to its resolution


class DCGANNorm(StrEnum):
    BATCH = "batch"
    INSTANCE = "instance"
    NONE = "none"


@dataclass
class GANObjectiveConfig:
    """`model.objective` (pixelsmith.gan.objectives): the adversarial loss (the `model/objective/loss` group:
    non_saturating | hinge), named regularisers (each a phase: r1 -> Dreg, path_length -> Greg; a zero gamma or
    weight turns one off) and the order of the main phases ([D, G]: Dmain, Dreg, Gmain, Greg). Documents the default
    objective's keys; `model.objective` itself is untyped so another objective (R3GAN, WGAN-GP, a fork's) brings its
    own keys, which the module checks against its class (`pixelsmith.gan.module.build_objective`)."""

    _target_: str = "pixelsmith.gan.objectives.GANObjective"
    loss: Any = MISSING  # {_target_: pixelsmith.gan.objectives.NonSaturatingLoss} (from model/objective/loss)
    regularizers: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=lambda: ["D", "G"])


@dataclass
class GANModelConfig(CoreModelConfig):
    """`model/_gan_schema`: a GAN with any G/D (`{_target_: ..., kwargs}`, instantiated by the module). A fork's own
    networks use this schema as they are; the shipped networks have typed configs (DCGANModelConfig,
    StyleGAN2ModelConfig below), and a fork gets the same by a subclass narrowing `generator`/`discriminator`."""

    _target_: str = "pixelsmith.gan.module.GANModule"
    name: str = MISSING
    generator: Any = MISSING  # {_target_: ..., kwargs}; instantiated by the module
    discriminator: Any = MISSING
    # Any objective by `_target_` (GANObjectiveConfig's keys for the default one; `model/objective=r3gan|wgan_gp`;
    # a fork's own class): its keys are checked against that class's arguments when the model is built
    # (gan/module.py), so an objective with arguments of its own needs no schema or registration here.
    objective: Any = None
    g_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    d_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    sample_grid_size: int = 64
    # model.ema and model.schedules come from CoreModelConfig; the GAN schedules lr, beta1, beta2, G_lr, D_beta2, ...,
    # ema_half_life_kimg, augment_p and its objective's scalars (gamma, ...).


@dataclass
class DCGANGeneratorConfig:
    """pixelsmith.gan.networks.dcgan.DCGANGenerator's arguments."""

    _target_: str = "pixelsmith.gan.networks.dcgan.DCGANGenerator"
    resolution: int = 32
    channels: int = 1
    z_dim: int = 100
    ngf: int = 64
    norm: str = choice(DCGANNorm, "batch")


@dataclass
class DCGANDiscriminatorConfig:
    """pixelsmith.gan.networks.dcgan.DCGANDiscriminator's arguments."""

    _target_: str = "pixelsmith.gan.networks.dcgan.DCGANDiscriminator"
    resolution: int = 32
    channels: int = 1
    ndf: int = 64
    norm: str = choice(DCGANNorm, "batch")  # none makes accumulation exactly equal to a bigger batch


@dataclass
class StyleGAN2GeneratorConfig:
    """pixelsmith.gan.networks.stylegan2.StyleGAN2Generator's arguments."""

    _target_: str = "pixelsmith.gan.networks.stylegan2.StyleGAN2Generator"
    resolution: int = 32
    channels: int = 1
    z_dim: int = 128
    w_dim: int = 128
    mapping_layers: int = 4
    channel_base: int = 4096
    channel_max: int = 256
    mapping_lr_multiplier: float = 0.01
    use_noise: bool = True
    gradient_checkpointing: bool = False
    upsampling: str = choice(StyleGAN2Upsampling, "fir")
    # Under 16-mixed only the N highest resolutions in fp16 (mapping and the rest fp32); null: all under autocast.
    num_fp16_res: int | None = 4
    conv_clamp: float | None = 256.0  # clamp conv outputs to +-this (fp16 overflow guard); null: no clamp
    # NVlabs' style-mixing regularisation (StyleGAN2Loss.style_mixing_prob, 0.9; 0 in their cifar config)
    style_mixing_prob: float = 0.0
    c_dim: int = 0  # > 0: a class-conditional mapping network (one-hot labels [N, c_dim] as G's second input)


@dataclass
class StyleGAN2DiscriminatorConfig:
    """pixelsmith.gan.networks.stylegan2.StyleGAN2Discriminator's arguments."""

    _target_: str = "pixelsmith.gan.networks.stylegan2.StyleGAN2Discriminator"
    resolution: int = 32
    channels: int = 1
    channel_base: int = 4096
    channel_max: int = 256
    mbstd_group_size: int = 4
    gradient_checkpointing: bool = False
    downsampling: str = choice(StyleGAN2Downsampling, "fir")
    # Under 16-mixed only the N highest resolutions in fp16 (the rest and the epilogue fp32); null: all under autocast.
    num_fp16_res: int | None = 4
    conv_clamp: float | None = 256.0  # clamp conv outputs to +-this (fp16 overflow guard); null: no clamp
    architecture: str = choice(StyleGAN2DArchitecture, "resnet")  # NVlabs' D architecture (cifar: orig)
    freeze_layers: int = 0  # NVlabs' Freeze-D (--freezed=N): the first N conv layers keep their weights


@dataclass
class DCGANModelConfig(GANModelConfig):
    """`model=dcgan` (`model/_dcgan_schema`): GANModelConfig with DCGAN's G and D typed."""

    generator: DCGANGeneratorConfig = field(default_factory=DCGANGeneratorConfig)
    discriminator: DCGANDiscriminatorConfig = field(default_factory=DCGANDiscriminatorConfig)


@dataclass
class StyleGAN2ModelConfig(GANModelConfig):
    """`model=stylegan2` (`model/_stylegan2_schema`): GANModelConfig with StyleGAN2's G and D typed."""

    generator: StyleGAN2GeneratorConfig = field(default_factory=StyleGAN2GeneratorConfig)
    discriminator: StyleGAN2DiscriminatorConfig = field(default_factory=StyleGAN2DiscriminatorConfig)


@dataclass
class R3GANGeneratorConfig:
    """`model.generator` of `model=r3gan` (pixelsmith.gan.networks.r3gan.R3GANGenerator)."""

    _target_: str = "pixelsmith.gan.networks.r3gan.R3GANGenerator"
    resolution: int = 32
    channels: int = 3
    z_dim: int = 64
    widths: list[int] = field(default_factory=lambda: [768, 768, 768, 768])
    groups: list[int] = field(default_factory=lambda: [96, 96, 96, 96])
    blocks: Any = 2  # per stage: one number, or a list (one per stage)
    expansion: int = 2
    kernel: int = 3
    c_dim: int = 0  # > 0: class-conditional (the reference's ConditionDimension; labels one-hot or indices)
    c_embed_dim: int | None = (
        None  # the label embedding's size; null: the reference's (G: z_dim; D: widths[0])
    )


@dataclass
class R3GANDiscriminatorConfig:
    """`model.discriminator` of `model=r3gan` (R3GANDiscriminator: G's lists, 4x4 up; D reverses them)."""

    _target_: str = "pixelsmith.gan.networks.r3gan.R3GANDiscriminator"
    resolution: int = 32
    channels: int = 3
    widths: list[int] = field(default_factory=lambda: [768, 768, 768, 768])
    groups: list[int] = field(default_factory=lambda: [96, 96, 96, 96])
    blocks: Any = 2
    expansion: int = 2
    kernel: int = 3
    c_dim: int = 0  # > 0: class-conditional (the reference's ConditionDimension; labels one-hot or indices)
    c_embed_dim: int | None = (
        None  # the label embedding's size; null: the reference's (G: z_dim; D: widths[0])
    )


@dataclass
class R3GANModelConfig(GANModelConfig):
    """`model=r3gan` (`model/_r3gan_schema`): GANModelConfig with R3GAN's G and D typed."""

    generator: R3GANGeneratorConfig = field(default_factory=R3GANGeneratorConfig)
    discriminator: R3GANDiscriminatorConfig = field(default_factory=R3GANDiscriminatorConfig)
