"""Frozen VGG16/VGG19 feature extractor with named taps: the perceptual loss network and the AdaIN encoder.

Weights are torchvision's ImageNet files, from an explicit `weights_path` (used as is) or from torch hub's cache,
`$TORCH_HOME/hub/checkpoints/<file>`, where torchvision keeps them too; a file missing there is downloaded on first
use from torchvision's address and checked (`pixelsmith.metrics.weights`). With `PIXELSMITH_OFFLINE=1`, or when the
download fails, `LossNetworkWeightsNotFoundError` names the file and where to put it. `pretrained=False` builds
random weights with a loud warning; tests and smoke runs use it.

Inputs are RGB in [0, 1]; the ImageNet normalisation torchvision's VGG weights expect happens inside.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from pixelsmith.errors import PixelsmithError
from pixelsmith.metrics.weights import resolve_weights_file
from pixelsmith.safe_load import load_data_only

# Layer layouts of torchvision's `vgg16().features` / `vgg19().features` (configs "D" and "E"); "M" is a max-pool.
# Building only the convolutional part avoids allocating the 120M-parameter classifier we never use.
VGG_LAYOUTS: dict[str, list[int | str]] = {
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        512,
        "M",
    ],
}
# Johnson et al. (2016) use VGG16 relu1_2..relu4_3; Huang & Belongie (AdaIN, 2017) use VGG19 relu1_1..relu4_1.
DEFAULT_LAYERS = {
    "vgg16": ("relu1_2", "relu2_2", "relu3_3", "relu4_3"),
    "vgg19": ("relu1_1", "relu2_1", "relu3_1", "relu4_1"),
}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CONFIG_KEY_WEIGHTS_PATH = "model.loss_net.weights_path"
CONFIG_KEY_PRETRAINED = "model.loss_net.pretrained"


class LossNetworkWeightsNotFoundError(PixelsmithError, FileNotFoundError):
    """The pretrained VGG weights are not on disk and could not be fetched; the message says which file, where, and
    the ways to fix it
    (a PixelsmithError: train.py prints it as one paragraph, without a traceback)."""


class RandomLossNetworkWeightsWarning(UserWarning):
    """The loss network runs with random weights: style/content losses are then not perceptual."""


def layer_names(arch: str) -> list[str]:
    """Names of the modules in `features` in order: conv1_1, relu1_1, conv1_2, relu1_2, pool1, conv2_1, ..."""
    if arch not in VGG_LAYOUTS:
        raise ValueError(f"Unknown loss network arch={arch!r}; choose one of {', '.join(VGG_LAYOUTS)}.")
    names, block, index = [], 1, 1
    for entry in VGG_LAYOUTS[arch]:
        if entry == "M":
            names.append(f"pool{block}")
            block, index = block + 1, 1
        else:
            names += [f"conv{block}_{index}", f"relu{block}_{index}"]
            index += 1
    return names


def build_vgg_features(arch: str, upto: int) -> nn.Sequential:
    """Torchvision's VGG `features` layout (same indices, so its state-dict keys load) truncated after index `upto`."""
    layers: list[nn.Module] = []
    in_channels = 3
    for entry in VGG_LAYOUTS[arch]:
        if entry == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            conv = nn.Conv2d(in_channels, int(entry), kernel_size=3, padding=1)
            # torchvision's VGG init; PyTorch's default conv init shrinks activations layer by layer, which makes
            # random-weight deep taps nearly constant and the random-weight tests meaningless.
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(conv.bias)
            # Not in-place: a tap may be a conv output, which an in-place ReLU would overwrite.
            layers += [conv, nn.ReLU(inplace=False)]
            in_channels = int(entry)
        if len(layers) > upto:
            break
    return nn.Sequential(*layers[: upto + 1])


def load_vgg_state_dict(arch: str, weights_path: str | Path | None) -> dict[str, Tensor]:
    """The `features.*` weights of a torchvision VGG checkpoint, from `weights_path` or torch hub's cache (fetched
    there on first use)."""
    path = resolve_weights_file(
        what=f"{arch.upper()} ImageNet (torchvision's, for the style loss network)",
        published=arch,
        config_path=weights_path,
        config_key=CONFIG_KEY_WEIGHTS_PATH,
        also=(
            f"To run without pretrained weights (tests and smoke runs only: the losses are then not perceptual, so "
            f"only colours and simple textures transfer), set {CONFIG_KEY_PRETRAINED}=false."
        ),
        error=LossNetworkWeightsNotFoundError,
    )
    state = load_data_only(
        path,
        CONFIG_KEY_WEIGHTS_PATH,
        f"Give torchvision's {arch} ImageNet weights file as it downloads them (a plain state dict).",
    )
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    # Accept a full torchvision state dict ("features.0.weight", "classifier...") or a features-only one ("0.weight").
    has_prefix = any(key.startswith("features.") for key in state)
    return {
        key.removeprefix("features."): value
        for key, value in state.items()
        if (key.startswith("features.") or not has_prefix)
    }


class VGGFeatures(nn.Module):
    """Frozen VGG feature extractor: `forward(x in [0,1]) -> {tap name: activation}`.

    Always in eval mode (`train()` is a no-op for it), parameters have `requires_grad=False`, and it keeps
    channels_last. Under autocast it computes in the autocast dtype like any other module.
    """

    def __init__(
        self,
        arch: str = "vgg16",
        layers: Sequence[str] | None = None,
        pretrained: bool = True,
        weights_path: str | Path | None = None,
        channels_last: bool = True,
    ):
        super().__init__()
        names = layer_names(arch)
        self.arch = arch
        self.layers = tuple(layers) if layers is not None else DEFAULT_LAYERS[arch]
        unknown = [name for name in self.layers if name not in names]
        if unknown:
            raise ValueError(f"Unknown {arch} layer(s) {unknown}; valid names: {', '.join(names)}.")
        self.tap_indices = {names.index(name): name for name in self.layers}
        self.features = build_vgg_features(arch, max(self.tap_indices))
        if pretrained or weights_path is not None:
            state = load_vgg_state_dict(arch, weights_path)
            wanted = self.features.state_dict().keys()
            missing = [key for key in wanted if key not in state]
            if missing:
                raise RuntimeError(
                    f"The {arch} weights file lacks {missing[:4]}{'...' if len(missing) > 4 else ''}: "
                    f"is it a torchvision {arch} checkpoint?"
                )
            self.features.load_state_dict({key: state[key] for key in wanted})
        else:
            warnings.warn(
                f"\n{'!' * 100}\n  The {arch.upper()} loss network is using RANDOM weights ({CONFIG_KEY_PRETRAINED}=false): "
                "content/style losses are not perceptual:\n  colours and simple textures transfer, the style's "
                f"shapes and brush strokes do not. Fine for tests and smoke runs only.\n{'!' * 100}",
                RandomLossNetworkWeightsWarning,
                stacklevel=2,
            )
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)
        self.channels_last = channels_last
        if channels_last:
            self.to(memory_format=torch.channels_last)
        super().train(False)

    def train(self, mode: bool = True) -> VGGFeatures:
        # Frozen by contract: Lightning calls model.train() on the whole module tree every epoch.
        return super().train(False)

    def forward(self, x: Tensor, layers: Iterable[str] | None = None) -> dict[str, Tensor]:
        wanted = set(self.layers if layers is None else layers)
        x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out: dict[str, Tensor] = {}
        for index, layer in enumerate(self.features):
            x = layer(x)
            name = self.tap_indices.get(index)
            if name is not None and name in wanted:
                out[name] = x
                if len(out) == len(wanted):
                    break
        return out
