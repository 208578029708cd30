"""Style-transfer losses: content MSE, Gram-matrix style loss, total variation, and AdaIN's mean/std style loss.

Precision: the loss network runs in the compute precision (bf16/fp16 under autocast), but Gram matrices sum
C*H*W-sized products, which overflows fp16 (max 65504) at relu1_2 of a 256px crop and loses most digits in bf16.
So Grams, their normalisation and every reduction here run in float32 with autocast disabled locally.

The Gram matrix and the Gram distance are not defined here: `gram_matrix` and `style_gram_distance` come from
`pixelsmith.metrics.gram`, which the validation/evaluation "style Gram distance" (`pixelsmith.metrics`) uses too, so
the training style loss and the metric are one implementation and cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pixelsmith.metrics.gram import gram_matrix, style_gram_distance
from pixelsmith.style.loss_network import VGGFeatures
from pixelsmith.style.networks import AdaINNet, channel_mean_var


def _fp32_region(x: Tensor) -> AbstractContextManager:
    """Autocast off for this device: inside it, matmuls on float32 tensors stay float32."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def content_loss(output_features: Tensor, target_features: Tensor) -> Tensor:
    """Mean squared error between feature maps, in float32."""
    with _fp32_region(output_features):
        return F.mse_loss(output_features.float(), target_features.float())


def style_loss(
    output_features: Mapping[str, Tensor],
    target_grams: Mapping[str, Tensor],
    layer_weights: Mapping[str, float] | None = None,
) -> Tensor:
    """Sum over layers of weight * MSE(Gram(output), target Gram); target Grams are (1 or B, C, C) float32.
    Each layer's term is `style_gram_distance` (batch mean), the function validation reports."""
    total = None
    for name, target in target_grams.items():
        term = style_gram_distance([output_features[name]], [target])
        term = term * (1.0 if layer_weights is None else float(layer_weights.get(name, 1.0)))
        total = term if total is None else total + term
    if total is None:
        raise ValueError("style_loss needs at least one style layer.")
    return total


def total_variation_loss(images: Tensor) -> Tensor:
    """Mean squared difference between vertical and horizontal neighbours (Johnson's L2 TV), in float32; a mean,
    so its weight does not depend on the crop size."""
    with _fp32_region(images):
        x = images.float()
        return (x[:, :, 1:, :] - x[:, :, :-1, :]).pow(2).mean() + (x[:, :, :, 1:] - x[:, :, :, :-1]).pow(
            2
        ).mean()


def mean_std_loss(output_features: Tensor, target_features: Tensor, eps: float = 1e-5) -> Tensor:
    """AdaIN's style term for one layer: MSE of per-channel means + MSE of per-channel stds, float32."""
    out_mean, out_var = channel_mean_var(output_features)
    with torch.no_grad():
        target_mean, target_var = channel_mean_var(target_features)
    with _fp32_region(out_mean):
        return F.mse_loss(out_mean, target_mean.expand_as(out_mean)) + F.mse_loss(
            torch.sqrt(out_var + eps), torch.sqrt(target_var + eps).expand_as(out_var)
        )


class LossTerms(NamedTuple):
    """Weighted total (backpropagate this) and the unweighted terms (log these)."""

    total: Tensor
    content: Tensor
    style: Tensor
    tv: Tensor


class PerceptualStyleLoss(nn.Module):
    """Johnson's loss for a single-style TransformerNet: content at `content_layers`, Gram style loss at
    `style_layers`, total variation; the style targets are set once with `set_style`.

    Default weights follow the ratios of pytorch/examples fast_neural_style (content 1e5 : style 1e10 with the
    same Gram normalisation), rescaled to content 1.
    """

    def __init__(
        self,
        loss_net: VGGFeatures,
        content_layers: Sequence[str] = ("relu2_2",),
        style_layers: Sequence[str] | None = None,
        content_weight: float = 1.0,
        style_weight: float = 1e5,
        tv_weight: float = 0.0,
        style_layer_weights: Mapping[str, float] | None = None,
    ):
        super().__init__()
        self.loss_net = loss_net
        self.content_layers = tuple(content_layers)
        self.style_layers = tuple(style_layers) if style_layers is not None else tuple(loss_net.layers)
        missing = [name for name in self.content_layers + self.style_layers if name not in loss_net.layers]
        if missing:
            raise ValueError(
                f"Layers {missing} are not taps of the loss network (taps: {list(loss_net.layers)})."
            )
        self.content_weight = content_weight
        self.style_weight = style_weight
        self.tv_weight = tv_weight
        self.style_layer_weights = dict(style_layer_weights or {})
        self.target_grams: dict[str, Tensor] = {}

    @torch.no_grad()
    def set_style(self, styles: Tensor | Sequence[Tensor]) -> None:
        """Target Grams from one or more style images ((3, H, W) or (B, 3, H, W), float in [0, 1]; sizes may
        differ). Several styles are averaged into one target: the network then learns their mixture."""
        images = [styles] if isinstance(styles, Tensor) else list(styles)
        grams: dict[str, list[Tensor]] = {name: [] for name in self.style_layers}
        device = next(self.loss_net.parameters()).device
        for image in images:
            batch = (image if image.dim() == 4 else image.unsqueeze(0)).to(device)
            features = self.loss_net(batch, layers=self.style_layers)
            for name in self.style_layers:
                grams[name].append(gram_matrix(features[name]))
        self.target_grams = {name: torch.cat(g).mean(0, keepdim=True) for name, g in grams.items()}

    def _apply(self, fn, recurse: bool = True):
        # The targets follow .to()/.cuda() like a buffer (a plain dict is not traversed by nn.Module). Copying them to
        # the output's device in every forward made each iteration wait for a host-to-device copy, and a CUDA graph
        # refused to capture it ("Cannot copy between CPU and CUDA tensors during CUDA graph capture"; H200).
        super()._apply(fn, recurse)
        self.target_grams = {name: fn(gram) for name, gram in self.target_grams.items()}
        return self

    def forward(self, output: Tensor, content: Tensor) -> LossTerms:
        """output: stylized batch; content: the input batch (both float in [0, 1])."""
        if not self.target_grams:
            raise RuntimeError("PerceptualStyleLoss.set_style(...) must be called before computing the loss.")
        with torch.no_grad():
            content_features = self.loss_net(content, layers=self.content_layers)
        output_features = self.loss_net(output, layers=self.content_layers + self.style_layers)
        c_loss = sum(content_loss(output_features[n], content_features[n]) for n in self.content_layers)
        s_loss = style_loss(output_features, self.target_grams, self.style_layer_weights)
        tv = total_variation_loss(output)
        total = self.content_weight * c_loss + self.style_weight * s_loss + self.tv_weight * tv
        return LossTerms(total, c_loss.detach(), s_loss.detach(), tv.detach())


class AdaINLoss(nn.Module):
    """Huang & Belongie's loss: content = MSE(encoder(output).relu4_1, AdaIN target t); style = sum over
    relu1_1..relu4_1 of mean/std matching against the style image's features. Paper weights: 1 and 10."""

    def __init__(self, net: AdaINNet, content_weight: float = 1.0, style_weight: float = 10.0):
        super().__init__()
        self.net = net
        self.content_weight = content_weight
        self.style_weight = style_weight

    def forward(
        self, output: Tensor, target: Tensor, style: Tensor, style_features: dict[str, Tensor] | None = None
    ) -> LossTerms:
        """output, target: from `AdaINNet.forward_train(content, style)`; style: the style batch;
        style_features: `encoder(style)` if the caller computed it already (one style pass per step, not two)."""
        encoder = self.net.encoder
        if style_features is None:
            with torch.no_grad():
                style_features = encoder(style)
        output_features = encoder(output)
        c_loss = content_loss(output_features["relu4_1"], target.detach())
        s_loss = sum(mean_std_loss(output_features[name], style_features[name]) for name in encoder.layers)
        total = self.content_weight * c_loss + self.style_weight * s_loss
        zero = torch.zeros((), device=output.device)
        return LossTerms(total, c_loss.detach(), s_loss.detach(), zero)
