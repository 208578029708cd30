"""Paired-image metrics for style transfer: content SSIM, LPIPS, PSNR and the style Gram distance.

The Gram matrix and the Gram distance are `pixelsmith.metrics.gram`, one implementation in Pixelsmith: the style
loss imports them from there too, so it and the validation metric can never drift apart. All image arguments are float tensors [B, C, H, W] in [-1, 1] (the models' output range);
grayscale images are repeated to 3 channels where a network needs RGB.

SSIM and PSNR come from torchmetrics, on images mapped to [0, 1] with ``data_range=1`` (SSIM's luminance term is
not shift-invariant, so the range matters). LPIPS is torchmetrics' network with its bundled linear layers; its
ImageNet backbone is loaded from torch hub's cache (fetched there on first use, `pixelsmith.metrics.weights`) or a
path, and ``pretrained=False`` gives a random backbone
for tests, with a loud warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import torch
import torchvision
from torch import nn
from torchmetrics import Metric
from torchmetrics.functional.image.lpips import _lpips_update, _NoTrainLpips
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure

from pixelsmith.metrics.gram import gram_matrix as gram_matrix  # re-exported: an older import place
from pixelsmith.metrics.gram import style_gram_distance
from pixelsmith.metrics.weights import resolve_weights_file
from pixelsmith.safe_load import load_data_only

LPIPS_WEIGHTS_CONFIG_KEY = "metrics.lpips_backbone_weights"
# LPIPS net name -> (torchvision architecture, its ImageNet weights enum entry); the file names come from there:
# alexnet-owt-7be5be79.pth, vgg16-397923af.pth, squeezenet1_1-b8a52dc0.pth.
_LPIPS_BACKBONES = {
    "alex": ("alexnet", torchvision.models.AlexNet_Weights.IMAGENET1K_V1),
    "vgg": ("vgg16", torchvision.models.VGG16_Weights.IMAGENET1K_V1),
    "squeeze": ("squeezenet1_1", torchvision.models.SqueezeNet1_1_Weights.IMAGENET1K_V1),
}


class RandomWeightsWarning(UserWarning):
    """A perceptual network runs with random weights: its numbers mean nothing beyond a smoke test."""


def lpips_backbone_file_name(net: str) -> str:
    return os.path.basename(_LPIPS_BACKBONES[net][1].url)


class StyleGramDistance(Metric):
    """Running mean of :func:`style_gram_distance` over validation batches (synced across ranks)."""

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("distance_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, features: Sequence[torch.Tensor], target_grams: Sequence[torch.Tensor]) -> None:
        distances = style_gram_distance(features, target_grams, reduction="none").detach()
        self.distance_sum += distances.double().sum()
        self.count += distances.numel()

    def compute(self) -> torch.Tensor:
        return (self.distance_sum / self.count).float()


# --- SSIM / PSNR -----------------------------------------------------------------------------------------------


def to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] -> [0, 1], clamped, float32."""
    return ((images.float() + 1.0) / 2.0).clamp(0.0, 1.0)


def _rgb(images: torch.Tensor) -> torch.Tensor:
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


class ContentSSIM(StructuralSimilarityIndexMeasure):
    """torchmetrics SSIM (Gaussian 11x11, sigma 1.5) on [-1, 1] images, computed in [0, 1] with data_range=1."""

    def __init__(self, **kwargs) -> None:
        super().__init__(data_range=1.0, **kwargs)

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        super().update(to_unit_range(preds), to_unit_range(target))


class ImagePSNR(PeakSignalNoiseRatio):
    """torchmetrics PSNR on [-1, 1] images in [0, 1] with data_range=1: the mean of per-image PSNRs."""

    def __init__(self, **kwargs) -> None:
        super().__init__(data_range=1.0, dim=(1, 2, 3), **kwargs)

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        super().update(to_unit_range(preds), to_unit_range(target))


# --- LPIPS -----------------------------------------------------------------------------------------------------


def build_lpips_network(
    net: str = "alex",
    backbone_weights: str | os.PathLike | None = None,
    pretrained: bool = True,
    config_key: str = LPIPS_WEIGHTS_CONFIG_KEY,
) -> nn.Module:
    """torchmetrics' LPIPS network with its ImageNet backbone loaded from a file.

    ``backbone_weights``: a path (used as is), else ``$TORCH_HOME/hub/checkpoints/<torchvision file>``, downloaded
    there on first use (:mod:`pixelsmith.metrics.weights`); offline or failed -> a
    :class:`~pixelsmith.metrics.weights.MissingWeightsError` naming the file. ``pretrained=False``: random backbone
    (tests only), with a :class:`RandomWeightsWarning`. The LPIPS linear layers always come from the file
    torchmetrics ships.
    """
    if net not in _LPIPS_BACKBONES:
        raise ValueError(f"LPIPS net must be one of {tuple(_LPIPS_BACKBONES)}, got {net!r}")
    architecture, weights_enum = _LPIPS_BACKBONES[net]
    path = None
    if pretrained:
        path = resolve_weights_file(
            what=f"LPIPS {architecture} backbone (torchvision's {type(weights_enum).__name__}.IMAGENET1K_V1)",
            published=architecture,
            config_path=backbone_weights,
            config_key=config_key,
        )
    else:
        warnings.warn(
            f"LPIPS is running with a RANDOM {architecture} backbone (pretrained=False): its values are not "
            f"LPIPS and must not be reported or compared. Provide {lpips_backbone_file_name(net)} for real numbers.",
            RandomWeightsWarning,
            stacklevel=2,
        )
    # pnet_rand=True builds the torchvision backbone with weights=None, i.e. without touching the network.
    lpips = _NoTrainLpips(pretrained=True, net=net, pnet_rand=True)
    if path is not None:
        backbone = getattr(torchvision.models, architecture)(weights=None)
        backbone.load_state_dict(
            load_data_only(
                path,
                config_key,
                f"Give torchvision's {architecture} ImageNet weights file as it downloads them.",
            )
        )
        features_state = backbone.features.state_dict()
        # torchmetrics splits backbone.features into slices whose children keep their original indices as names.
        remapped = {}
        for slice_name, slice_module in lpips.net.named_modules():
            if isinstance(slice_module, nn.Sequential):
                for child_name in slice_module._modules:
                    prefix = f"{child_name}."
                    for key, value in features_state.items():
                        if key.startswith(prefix):
                            remapped[f"{slice_name}.{key}"] = value
        lpips.net.load_state_dict(remapped, strict=True)
    lpips.requires_grad_(False)
    return lpips.eval()


def lpips_distance(network: nn.Module, preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-image LPIPS [B] between [-1, 1] images (clamped), with a network from :func:`build_lpips_network`."""
    preds = _rgb(preds.float().clamp(-1.0, 1.0))
    target = _rgb(target.float().clamp(-1.0, 1.0))
    return _lpips_update(preds, target, net=network, normalize=False).reshape(-1)


class LPIPS(Metric):
    """Mean LPIPS over all image pairs seen (synced across ranks). Lower is more similar."""

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(
        self,
        net: str = "alex",
        backbone_weights: str | os.PathLike | None = None,
        pretrained: bool = True,
        config_key: str = LPIPS_WEIGHTS_CONFIG_KEY,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.net = build_lpips_network(net, backbone_weights, pretrained, config_key)
        self.add_state("distance_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        with torch.no_grad():
            distances = lpips_distance(self.net, preds, target)
        self.distance_sum += distances.double().sum()
        self.count += distances.numel()

    def compute(self) -> torch.Tensor:
        return (self.distance_sum / self.count).float()


class StyleTransferMetrics(nn.Module):
    """Validation metrics for a stylizer: content SSIM, content LPIPS, PSNR, and (given features) Gram distance.

    ``update(result, content, result_features=None, style_grams=None)``; ``compute()`` returns a dict of floats
    with keys ``content_ssim``, ``content_lpips``, ``content_psnr`` and ``style_gram_distance`` (when features
    were given). Each part is a torchmetrics Metric, so values are synced across DDP ranks on ``compute``.
    """

    def __init__(
        self,
        lpips_net: str = "alex",
        lpips_backbone_weights: str | os.PathLike | None = None,
        lpips_pretrained: bool = True,
    ) -> None:
        super().__init__()
        self.ssim = ContentSSIM()
        self.psnr = ImagePSNR()
        self.lpips = LPIPS(lpips_net, lpips_backbone_weights, lpips_pretrained)
        self.gram = StyleGramDistance()

    def update(
        self,
        result: torch.Tensor,
        content: torch.Tensor,
        result_features: Sequence[torch.Tensor] | None = None,
        style_grams: Sequence[torch.Tensor] | None = None,
    ) -> None:
        self.ssim.update(result, content)
        self.psnr.update(result, content)
        self.lpips.update(result, content)
        if result_features is not None and style_grams is not None:
            self.gram.update(result_features, style_grams)

    def compute(self) -> dict[str, float]:
        results = {
            "content_ssim": float(self.ssim.compute()),
            "content_lpips": float(self.lpips.compute()),
            "content_psnr": float(self.psnr.compute()),
        }
        if self.gram.update_count > 0:
            results["style_gram_distance"] = float(self.gram.compute())
        return results

    def reset(self) -> None:
        for metric in (self.ssim, self.psnr, self.lpips, self.gram):
            metric.reset()
