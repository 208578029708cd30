"""Schemas of the style-transfer models (`model=style_fast`, `model=style_adain`) and their content data
(`data=style_content`), beside the style code."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from pixelsmith.config.choices import choice
from pixelsmith.core.config import OptimizerConfig
from pixelsmith.data.config import DataConfig, OnCorrupt


class OutputActivation(StrEnum):  # the fast stylizer's last layer
    SIGMOID = "sigmoid"
    NONE = "none"


class LossNetArch(StrEnum):
    VGG16 = "vgg16"
    VGG19 = "vgg19"


class LPIPSNet(StrEnum):
    ALEX = "alex"
    VGG = "vgg"
    SQUEEZE = "squeeze"


@dataclass
class StyleContentDataConfig(DataConfig):
    """`data=style_content` (pixelsmith.style.datamodule.StyleContentDataModule): random crops of content photos."""

    _target_: str = "pixelsmith.style.datamodule.StyleContentDataModule"
    name: str = "style_content"
    root: str | None = None  # None = the embedded photos (data/style/content)
    resolution: int = 256  # crop side
    resize_shorter: int | None = None  # shorter side before the random crop; None = resolution
    channels: int = 3
    on_corrupt: str = choice(OnCorrupt, "skip")  # skip (warn and count) | error


@dataclass
class LossNetConfig:
    """The frozen VGG of a style model: torchvision weights from $TORCH_HOME/hub/checkpoints/ or `weights_path`."""

    arch: str = choice(LossNetArch, "vgg16")  # vgg16 (Johnson) | vgg19 (AdaIN: always vgg19)
    pretrained: bool = True  # false: random weights with a loud warning (tests, offline smoke runs)
    weights_path: str | None = None  # explicit torchvision VGG .pth file


@dataclass
class StyleValidationConfig:
    """Fixed content/style pairs for sample grids and validation metrics (callbacks.style_validation: pixelsmith.style.validation)."""

    num_pairs: int = (
        4  # content images (the first N of content_dir, sorted), each paired with a style in turn
    )
    size: int = 256  # shorter side resize + center crop of the validation content
    content_dir: str | None = None  # None = the embedded content images (data/style/content)
    lpips: bool = True  # content LPIPS; needs the backbone weights file (same rule as the VGG loss network)
    # alex | vgg | squeeze; vgg reads vgg16-397923af.pth, the fast model's loss-net file
    lpips_net: str = choice(LPIPSNet, "vgg")
    lpips_weights: str | None = None  # explicit LPIPS backbone file; else $TORCH_HOME/hub/checkpoints/


@dataclass
class TransformerNetConfig:
    base_channels: int = 32
    num_residual_blocks: int = 5
    output_activation: str = choice(OutputActivation, "sigmoid")  # sigmoid | none
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
