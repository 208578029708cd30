"""Stylizer networks: Johnson's feed-forward TransformerNet and AdaIN (arbitrary style, one model for any style).

Conventions shared by every stylizer here (tiling and export rely on them):
- input and output are RGB float images in [0, 1], shape (B, 3, H, W); output has the input's size;
- `size_multiple` is the total downsampling factor: any H, W work (the forward reflection-pads up to a multiple
  and crops back), and tiles placed on multiples of it see the same sampling grid as the whole image;
- every per-image statistic is computed by an `nn.InstanceNorm2d` or an `AdaptiveInstanceNorm` layer, so
  `tiling.thumbnail_instance_norm` can replace them all with statistics taken from a whole-image thumbnail.

References: Johnson, Alahi, Fei-Fei, "Perceptual Losses for Real-Time Style Transfer" (ECCV 2016), with instance
norm (Ulyanov et al. 2016) and nearest-upsample + conv instead of transposed convs (Odena et al. 2016, no
checkerboard). Huang & Belongie, "Arbitrary Style Transfer in Real-time with Adaptive Instance Normalization"
(ICCV 2017).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from pixelsmith.style.loss_network import VGGFeatures


def checkpointed_sequence(segments: list[nn.Module], x: Tensor) -> Tensor:
    """Run `segments` in order keeping only each segment's input for backward (gradient checkpointing): the
    activations inside a segment are recomputed in the backward pass, one extra forward for less memory."""
    for segment in segments:
        x = checkpoint(segment, x, use_reentrant=False)
    return x


def _checkpointing_active(enabled: bool) -> bool:
    # Only while a graph is being built (under no_grad nothing is saved anyway), and never in TorchScript, which
    # cannot compile torch.utils.checkpoint (export scripts the same module).
    return enabled and torch.is_grad_enabled() and not torch.jit.is_scripting()


def padding_to_multiple(x: Tensor, multiple: int) -> list[int]:
    """F.pad amounts [left, right, top, bottom] that make H and W multiples of `multiple` (bottom/right only)."""
    return [
        0,
        (multiple - x.shape[-1] % multiple) % multiple,
        0,
        (multiple - x.shape[-2] % multiple) % multiple,
    ]


def pad_to_multiple(x: Tensor, multiple: int) -> Tensor:
    """Reflection-pad bottom/right so H and W are multiples of `multiple` (a zero-size pad is a no-op)."""
    return F.pad(x, padding_to_multiple(x, multiple), mode="reflect")


def crop_padding(y: Tensor, padding: list[int]) -> Tensor:
    """Undo `pad_to_multiple`. Negative padding crops; unlike slicing to the input size it adds no shape guard,
    which lets torch.export (ONNX) keep height and width dynamic."""
    return F.pad(y, [-p for p in padding])


class ConvLayer(nn.Sequential):
    """Reflection padding + conv: no zero border for the network to learn around (Johnson's choice)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1):
        super().__init__(
            nn.ReflectionPad2d(kernel_size // 2),
            nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride),
        )


class UpsampleConvLayer(nn.Module):
    """Nearest-neighbour x2 upsample then conv: avoids the checkerboard artefacts of transposed convolutions."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3):
        super().__init__()
        self.conv = ConvLayer(in_channels, out_channels, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(
            ConvLayer(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
            nn.ReLU(inplace=True),
            ConvLayer(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


class TransformerNet(nn.Module):
    """Johnson's image transformation network: 9x9 conv, two stride-2 convs, residual blocks, two upsample-convs,
    9x9 output conv; reflection padding and affine instance norm throughout.

    `base_channels=32, num_residual_blocks=5` is the paper's size (1.7M parameters). `output_activation="sigmoid"`
    keeps the output in [0, 1], so what the loss network sees is what gets saved; "none" is the paper's linear output.
    `gradient_checkpointing=True` keeps only the inputs of the encoder, of each residual block and of the decoder
    during training and recomputes the rest in backward (for larger crops or batches in the same memory).
    """

    size_multiple = 4

    def __init__(
        self,
        base_channels: int = 32,
        num_residual_blocks: int = 5,
        output_activation: str = "sigmoid",
        gradient_checkpointing: bool = False,
    ):
        super().__init__()
        if output_activation not in ("sigmoid", "none"):
            raise ValueError(f"output_activation={output_activation!r}; choose 'sigmoid' or 'none'.")
        c = base_channels
        self.config = {
            "base_channels": base_channels,
            "num_residual_blocks": num_residual_blocks,
            "output_activation": output_activation,
            "gradient_checkpointing": gradient_checkpointing,
        }
        self.use_sigmoid = output_activation == "sigmoid"
        self.gradient_checkpointing = gradient_checkpointing
        self.encoder = nn.Sequential(
            ConvLayer(3, c, 9),
            nn.InstanceNorm2d(c, affine=True),
            nn.ReLU(inplace=True),
            ConvLayer(c, 2 * c, 3, stride=2),
            nn.InstanceNorm2d(2 * c, affine=True),
            nn.ReLU(inplace=True),
            ConvLayer(2 * c, 4 * c, 3, stride=2),
            nn.InstanceNorm2d(4 * c, affine=True),
            nn.ReLU(inplace=True),
        )
        self.residuals = nn.Sequential(*[ResidualBlock(4 * c) for _ in range(num_residual_blocks)])
        self.decoder = nn.Sequential(
            UpsampleConvLayer(4 * c, 2 * c),
            nn.InstanceNorm2d(2 * c, affine=True),
            nn.ReLU(inplace=True),
            UpsampleConvLayer(2 * c, c),
            nn.InstanceNorm2d(c, affine=True),
            nn.ReLU(inplace=True),
            ConvLayer(c, 3, 9),
        )

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> TransformerNet:
        return cls(
            **_constructor_kwargs(
                cls,
                config or {},
                ("base_channels", "num_residual_blocks", "output_activation", "gradient_checkpointing"),
            )
        )

    @torch.jit.unused
    def _checkpointed_body(
        self, x
    ):  # unannotated: TorchScript's stub of an unused method cannot resolve names
        return checkpointed_sequence([self.encoder, *self.residuals, self.decoder], x)

    def forward(self, x: Tensor) -> Tensor:
        padding = padding_to_multiple(x, 4)
        x = F.pad(x, padding, mode="reflect")
        if _checkpointing_active(self.gradient_checkpointing):
            y = self._checkpointed_body(x)
        else:
            y = self.decoder(self.residuals(self.encoder(x)))
        y = crop_padding(y, padding)
        return torch.sigmoid(y) if self.use_sigmoid else y


def _constructor_kwargs(cls: type, config: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """Config keys for a constructor; Hydra's `_target_`-style keys are ignored, anything else unknown is an error."""
    kwargs = {key: value for key, value in dict(config).items() if not str(key).startswith("_")}
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"{cls.__name__} does not take {unknown}; its options are {list(allowed)}.")
    return kwargs


# ----------------------------------------------------------------------------------------------------- AdaIN


def channel_mean_var(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-(sample, channel) spatial mean and biased variance, in float32 (bf16 loses the small variances)."""
    x = x.float()
    var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, correction=0)
    return mean, var


def adain(content: Tensor, style_mean: Tensor, style_std: Tensor, eps: float = 1e-5) -> Tensor:
    """Adaptive instance normalisation: content features re-normalised to the style's per-channel mean/std.

    `style_mean`/`style_std` are (B or 1, C, 1, 1); compute them from style features with `channel_mean_var`
    (std = sqrt(var + eps)). Computed in float32, returned in the content's dtype.
    """
    mean, var = channel_mean_var(content)
    normalized = (content.float() - mean) * torch.rsqrt(var + eps)
    return (normalized * style_std.float() + style_mean.float()).to(content.dtype)


class AdaptiveInstanceNorm(nn.Module):
    """The AdaIN op as a layer, so thumbnail-statistics tiling can freeze its *content* statistics like an
    InstanceNorm's. `alpha` blends the re-styled features with the content features (alpha=0: content only)."""

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, content: Tensor, style_mean: Tensor, style_std: Tensor, alpha: float = 1.0) -> Tensor:
        mean, var = channel_mean_var(content)
        return self.normalize(content, mean, var, style_mean, style_std, alpha)

    def normalize(
        self, content: Tensor, mean: Tensor, var: Tensor, style_mean: Tensor, style_std: Tensor, alpha: float
    ) -> Tensor:
        # alpha * ((x - mean) / std_c * std_s + mean_s) + (1 - alpha) * x, folded into one per-channel
        # scale and shift (float32, C-sized) so the feature map is read once.
        scale = torch.rsqrt(var + self.eps) * style_std.float()
        shift = style_mean.float() - mean * scale
        scale = alpha * scale + (1.0 - alpha)
        shift = alpha * shift
        return torch.addcmul(shift.to(content.dtype), content, scale.to(content.dtype))


class AdaINDecoder(nn.Module):
    """Mirror of VGG19 up to relu4_1: reflection padding, ReLU, nearest x2 upsampling, no normalisation.

    `width` scales the channel counts (1.0 = the paper's 512-256-128-64); the input always has 512 channels
    (VGG19 relu4_1).
    """

    def __init__(self, width: float = 1.0, gradient_checkpointing: bool = False):
        super().__init__()
        self.config = {"width": width, "gradient_checkpointing": gradient_checkpointing}
        self.gradient_checkpointing = gradient_checkpointing
        c256, c128, c64 = (max(8, round(n * width)) for n in (256, 128, 64))

        def conv(cin: int, cout: int, relu: bool = True) -> list[nn.Module]:
            return [nn.ReflectionPad2d(1), nn.Conv2d(cin, cout, 3)] + (
                [nn.ReLU(inplace=True)] if relu else []
            )

        def upsample() -> nn.Module:
            return nn.Upsample(scale_factor=2.0, mode="nearest")

        self.layers = nn.Sequential(
            *conv(512, c256),
            upsample(),
            *conv(c256, c256),
            *conv(c256, c256),
            *conv(c256, c256),
            *conv(c256, c128),
            upsample(),
            *conv(c128, c128),
            *conv(c128, c64),
            upsample(),
            *conv(c64, c64),
            *conv(c64, 3, relu=False),
        )
        # He init: PyTorch's default conv init shrinks the signal ~1.7x per layer, so an untrained 9-layer
        # decoder would output a constant image whatever the features (and alpha) are.
        for module in self.layers:
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> AdaINDecoder:
        return cls(**_constructor_kwargs(cls, config or {}, ("width", "gradient_checkpointing")))

    @torch.jit.unused
    def _checkpointed_layers(self, features):  # unannotated: see TransformerNet._checkpointed_body
        # One segment per resolution (split before each upsample): only the four stage inputs are kept.
        cuts = [i for i, m in enumerate(self.layers) if isinstance(m, nn.Upsample)]
        bounds = [0, *cuts, len(self.layers)]
        return checkpointed_sequence(
            [self.layers[a:b] for a, b in zip(bounds, bounds[1:], strict=False)], features
        )

    def forward(self, features: Tensor) -> Tensor:
        if _checkpointing_active(self.gradient_checkpointing):
            return self._checkpointed_layers(features)
        return self.layers(features)


ADAIN_ENCODER_LAYERS = ("relu1_1", "relu2_1", "relu3_1", "relu4_1")


class AdaINNet(nn.Module):
    """VGG19 encoder (frozen, to relu4_1) + AdaIN + trained decoder.

    Training: `output, target = net.forward_train(content, style)`; the content loss compares
    `encoder(output)["relu4_1"]` with `target`, the style loss compares mean/std of `encoder(output)` with those of
    `encoder(style)` at relu1_1..relu4_1 (`losses.AdaINLoss` does both). Inference:
    `net(content, style, alpha)`, or `net.bind_style(style, alpha)` for a one-input module (tiling, export).
    """

    size_multiple = 8

    def __init__(self, encoder: VGGFeatures, decoder: AdaINDecoder | None = None, eps: float = 1e-5):
        super().__init__()
        if encoder.arch != "vgg19" or "relu4_1" not in encoder.layers:
            raise ValueError("AdaIN needs a VGG19 encoder with the relu4_1 tap (VGGFeatures('vgg19', ...)).")
        self.encoder = encoder
        self.decoder = decoder if decoder is not None else AdaINDecoder()
        self.adain = AdaptiveInstanceNorm(eps)
        self.eps = eps

    @classmethod
    def build(
        cls,
        pretrained: bool = True,
        weights_path: str | Path | None = None,
        decoder: dict[str, Any] | None = None,
        channels_last: bool = True,
    ) -> AdaINNet:
        encoder = VGGFeatures(
            "vgg19",
            ADAIN_ENCODER_LAYERS,
            pretrained=pretrained,
            weights_path=weights_path,
            channels_last=channels_last,
        )
        return cls(encoder, AdaINDecoder.from_config(decoder))

    def encode(self, x: Tensor) -> dict[str, Tensor]:
        return self.encoder(x)

    def style_statistics(
        self, style: Tensor, style_features: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """relu4_1 per-channel mean and std (sqrt(var + eps)) of the style images, float32, (B, 512, 1, 1).
        `style_features`: the encoder's features of `style` when the caller has them already."""
        if style_features is None:
            style_features = self.encoder(style, layers=("relu4_1",))
        mean, var = channel_mean_var(style_features["relu4_1"])
        return mean, torch.sqrt(var + self.eps)

    def forward_train(
        self, content: Tensor, style: Tensor, style_features: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """(decoded image, AdaIN target features t); content and style batches of equal size (or style batch 1).
        Pass `style_features` (encoder(style), no grad) to share one style pass with `AdaINLoss`."""
        with torch.no_grad():  # the encoder is frozen and the inputs are data: no graph needed up to t
            content_features = self.encoder(content, layers=("relu4_1",))["relu4_1"]
            style_mean, style_std = self.style_statistics(style, style_features)
            target = self.adain(content_features, style_mean, style_std)
        return self.decoder(target), target

    def forward(self, content: Tensor, style: Tensor, alpha: float = 1.0) -> Tensor:
        return self.bind_style(style, alpha)(content)

    def bind_style(self, style: Tensor, alpha: float = 1.0) -> AdaINStylizer:
        """A one-input stylizer with this style's statistics precomputed (style: (1, 3, h, w) in [0, 1])."""
        with torch.no_grad():
            style_mean, style_std = self.style_statistics(style)
        return AdaINStylizer(self.encoder, self.decoder, self.adain, style_mean, style_std, alpha)


class AdaINStylizer(nn.Module):
    """AdaIN with the style fixed: content (B, 3, H, W) in [0, 1] -> stylized image. This is what gets tiled and
    exported (the style statistics are baked in as buffers)."""

    size_multiple = 8

    def __init__(
        self,
        encoder: VGGFeatures,
        decoder: AdaINDecoder,
        adain_layer: AdaptiveInstanceNorm,
        style_mean: Tensor,
        style_std: Tensor,
        alpha: float = 1.0,
    ):
        super().__init__()
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(
                f"alpha={alpha} must be in [0, 1] (1 = full style, 0 = reconstruct the content)."
            )
        # The encoder's layers up to relu4_1 (the modules are shared, not copied) and its ImageNet normalisation.
        relu4_1 = max(index for index, name in encoder.tap_indices.items() if name == "relu4_1")
        self.encoder_to_relu4_1 = encoder.features[: relu4_1 + 1]
        self.register_buffer("input_mean", encoder.mean.detach().clone(), persistent=False)
        self.register_buffer("input_std", encoder.std.detach().clone(), persistent=False)
        self.decoder = decoder
        self.adain = adain_layer
        self.register_buffer("style_mean", style_mean.detach().float())
        self.register_buffer("style_std", style_std.detach().float())
        self.alpha = float(alpha)

    def forward(self, content: Tensor) -> Tensor:
        padding = padding_to_multiple(content, 8)
        x = F.pad(content, padding, mode="reflect")
        x = (x - self.input_mean.to(x.dtype)) / self.input_std.to(x.dtype)
        x = self.encoder_to_relu4_1(x.contiguous(memory_format=torch.channels_last))
        x = self.adain(x, self.style_mean, self.style_std, self.alpha)
        return crop_padding(self.decoder(x), padding)
