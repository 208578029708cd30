"""The Gram matrix of feature maps and the Gram distance: the definition of "style" in neural style transfer.

The validation/evaluation metric "style Gram distance" (`pixelsmith.metrics.image_metrics.StyleGramDistance`) and
the style-transfer training loss (the optional style part) both use these two functions, so they are one
implementation and cannot drift apart. It lives here, in the general metrics package, so that the dependency runs
one way: the style part imports it, and nothing general imports the style part (README "Removing a part").
Plain torch, no other Pixelsmith import.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gram_matrix(features: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] features -> [B, C, C] Gram matrices, in float32, normalised by C*H*W.

    Autocast is disabled and the features are upcast first: under fp16 a sum of H*W products of activations in
    the hundreds overflows 65504, and bf16 would lose the small differences the style loss depends on.
    """
    if features.dim() != 4:
        raise ValueError(f"gram_matrix expects features [B, C, H, W], got shape {tuple(features.shape)}")
    batch, channels, height, width = features.shape
    with torch.autocast(device_type=features.device.type, enabled=False):
        flat = features.float().reshape(batch, channels, height * width)
        return torch.bmm(flat, flat.transpose(1, 2)) / (channels * height * width)


def style_gram_distance(
    features: Sequence[torch.Tensor], target_grams: Sequence[torch.Tensor], reduction: str = "mean"
) -> torch.Tensor:
    """Sum over layers of the mean squared difference between Gram matrices (differentiable, float32).

    ``features``: one [B, C, H, W] tensor per layer (e.g. VGG relu1_2, relu2_2, relu3_3, relu4_3) of the images
    being judged. ``target_grams``: :func:`gram_matrix` of the style image's features at the same layers, [1, C, C]
    (broadcast over the batch) or [B, C, C]. ``reduction``: "mean" over the batch, "sum", or "none" ([B]).
    """
    if len(features) != len(target_grams) or not features:
        raise ValueError(
            f"need one target Gram per feature layer, got {len(features)} and {len(target_grams)}"
        )
    per_sample = None
    for layer_features, target in zip(features, target_grams, strict=True):
        difference = gram_matrix(layer_features) - target.float()
        layer_distance = difference.square().mean(dim=(1, 2))
        per_sample = layer_distance if per_sample is None else per_sample + layer_distance
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "sum":
        return per_sample.sum()
    if reduction == "none":
        return per_sample
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
