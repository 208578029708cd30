"""Feature extractors for the GAN metrics: the standard FID Inception-v3 and an offline MNIST digit network.

Every extractor takes **uint8** images [N, C, H, W] (see :mod:`pixelsmith.metrics.protocol` for how float images
become uint8) and returns ``(features, logits)``: float32 features [N, D] for FID/KID/precision-recall and float32
logits [N, K] for the Inception Score (``None`` when the extractor has no classifier head). Each extractor also
states its name, feature dimension, the sha256 prefix of its weights file and its input protocol; those four go
into the reference-statistics cache key, so statistics made with other weights or another protocol are never
reused.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.image.fid import NoTrainInceptionV3

from pixelsmith.hashing import file_sha256
from pixelsmith.metrics.protocol import QUANTIZE_PROTOCOL
from pixelsmith.metrics.weights import PUBLISHED, MissingWeightsError, resolve_weights_file
from pixelsmith.safe_load import load_data_only

# The FID Inception weights (TensorFlow's 2015-12-05 graph converted to PyTorch): fetched on first use from
# torch-fidelity's release (metrics/weights.py); pytorch-fid's name for the same file is accepted too.
INCEPTION_PUBLISHED = PUBLISHED["inception-v3-fid"]
INCEPTION_WEIGHTS_FILE = "pt_inception-2015-12-05-6726825d.pth"
TORCH_FIDELITY_INCEPTION_WEIGHTS_FILE = INCEPTION_PUBLISHED.file_name
INCEPTION_WEIGHTS_SOURCE = INCEPTION_PUBLISHED.url
# The config key named in the missing-weights message; callers pass their own if their config tree differs.
INCEPTION_WEIGHTS_CONFIG_KEY = "eval.weights_path"
INCEPTION_FEATURE_LAYERS = ("64", "192", "768", "2048")

MNIST_EXTRACTOR_WEIGHTS = Path(__file__).resolve().parent.parent / "assets" / "mnist_extractor.pt"
MNIST_EXTRACTOR_CONFIG_KEY = "eval.weights_path"
MNIST_FEATURE_DIM = 128
MNIST_INPUT_SIZE = 32


class FeatureExtractor(nn.Module):
    """Base class: uint8 images in, ``(features, logits or None)`` out, always in eval mode, never trained."""

    name: str
    feature_dim: int
    num_logits: int | None
    weights_sha256: str
    protocol: str

    @property
    def cache_identity(self) -> dict[str, str | int]:
        """What identifies this extractor in a reference-statistics cache key."""
        return {
            "extractor": self.name,
            "feature_dim": self.feature_dim,
            "weights_sha256": self.weights_sha256,
            "protocol": self.protocol,
        }

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def train(self, mode: bool = True) -> FeatureExtractor:
        # Lightning calls .train() on every submodule at the start of each epoch; BatchNorm statistics and dropout
        # must never change the metric, so this module refuses to leave eval mode.
        return super().train(False)


class _DataOnlyInceptionV3(NoTrainInceptionV3):
    """torchmetrics' Inception-v3, built without torch-fidelity's own load of the weights file (it unpickles the file
    in full, `weights_only=False`, which can run code the file carries): its constructor gets an empty state dict
    of our own making and ignores it, and the caller then loads the weights it read data-only."""

    def __init__(self, features_list: list[str]) -> None:
        self._constructing = True
        with tempfile.TemporaryDirectory() as tmp:
            placeholder = Path(tmp) / "empty.pth"
            torch.save({}, placeholder)
            super().__init__(
                name="inception-v3-compat",
                features_list=features_list,
                feature_extractor_weights_path=str(placeholder),
                antialias=False,
            )
        self._constructing = False

    def load_state_dict(self, state_dict, *args, **kwargs):
        if self.__dict__.get("_constructing"):
            return None  # the placeholder above; the real weights follow
        return super().load_state_dict(state_dict, *args, **kwargs)


class InceptionFeatureExtractor(FeatureExtractor):
    """The FID Inception-v3, run exactly as torch-fidelity runs it (torchmetrics' NoTrainInceptionV3 wraps it).

    Resize: torch-fidelity's TF1-compatible bilinear to 299x299 (``antialias=False`` in torchmetrics), because that is
    what torch-fidelity and the original TensorFlow FID do; torchmetrics' own default (torch bilinear with antialias)
    gives different numbers. For inputs smaller than 299 (all our GAN resolutions up to 256) the resize only
    upsamples, where antialiasing would not apply anyway.
    """

    def __init__(
        self,
        weights_path: str | os.PathLike | None = None,
        feature_layer: str | int = "2048",
        with_logits: bool = True,
        config_key: str = INCEPTION_WEIGHTS_CONFIG_KEY,
    ) -> None:
        super().__init__()
        feature_layer = str(feature_layer)
        if feature_layer not in INCEPTION_FEATURE_LAYERS:
            raise ValueError(
                f"Inception feature_layer must be one of {INCEPTION_FEATURE_LAYERS}, got {feature_layer}"
            )
        path = resolve_weights_file(
            what="FID Inception-v3",
            published="inception-v3-fid",
            config_path=weights_path,
            config_key=config_key,
        )
        outputs = [feature_layer] + (["logits_unbiased"] if with_logits else [])
        state = load_data_only(
            path, config_key, f"Give the FID Inception-v3 weights file ({INCEPTION_WEIGHTS_SOURCE})."
        )
        self.net = _DataOnlyInceptionV3(outputs)
        self.net.load_state_dict(state)
        self.weights_path = path
        self.feature_layer = feature_layer
        self.name = f"inception-v3-fid/{feature_layer}"
        self.feature_dim = int(feature_layer)
        # torch-fidelity's Inception Score uses the 1008 logits without the bias ("logits_unbiased").
        self.num_logits = 1008 if with_logits else None
        self.weights_sha256 = file_sha256(path)[:16]
        self.protocol = (
            f"{QUANTIZE_PROTOCOL}; gray->RGB by repeat; torch-fidelity TF1 bilinear to 299x299 "
            f"(align_corners=False, no antialias); (x-128)/128; float32 net; layer {feature_layer}"
        )

    @torch.no_grad()
    def forward(self, images_uint8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        images_uint8 = _check_uint8(images_uint8).to(self.device, non_blocking=True)
        if images_uint8.shape[1] == 1:
            images_uint8 = images_uint8.expand(-1, 3, -1, -1)
        # One pass gives both the pool features and the logits (torchmetrics' forward returns only the first).
        outputs = self.net._torch_fidelity_forward(images_uint8)
        features = outputs[0].reshape(images_uint8.shape[0], -1).float()
        logits = outputs[1].float() if self.num_logits is not None else None
        return features, logits


class MnistDigitNet(nn.Module):
    """A small digit classifier; its 128-d penultimate embedding (before the ReLU) is the FID feature.

    32x32x1 input in [-1, 1]. ~190k parameters (the float32 weights file stays under 1 MB).
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 16x16
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 8x8
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 4x4
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, MNIST_FEATURE_DIM),
        )
        self.head = nn.Sequential(nn.ReLU(), nn.Dropout(0.3), nn.Linear(MNIST_FEATURE_DIM, 10))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(images)
        return features, self.head(features)


class MnistFeatureExtractor(FeatureExtractor):
    """The offline extractor for the embedded MNIST default: 128 features + 10 logits, weights in the repo."""

    def __init__(
        self, weights_path: str | os.PathLike | None = None, config_key: str = MNIST_EXTRACTOR_CONFIG_KEY
    ) -> None:
        super().__init__()
        path = Path(weights_path).expanduser() if weights_path else MNIST_EXTRACTOR_WEIGHTS
        if not path.is_file():
            raise MissingWeightsError(
                f"The MNIST feature-extractor weights file {path} does not exist. It is committed with Pixelsmith "
                f"(src/pixelsmith/assets/mnist_extractor.pt); recreate it with "
                f"`python -m pixelsmith.metrics.train_mnist_extractor`, or pass another file with `{config_key}=`."
            )
        checkpoint = load_data_only(
            path,
            config_key,
            "Give the extractor weights Pixelsmith ships (src/pixelsmith/assets/mnist_extractor.pt), or recreate "
            "them with `python -m pixelsmith.metrics.train_mnist_extractor`.",
        )
        self.net = MnistDigitNet()
        self.net.load_state_dict(checkpoint["state_dict"])
        self.net.requires_grad_(False)
        self.weights_path = path
        self.test_accuracy = float(checkpoint.get("test_accuracy", float("nan")))
        self.name = "pixelsmith-mnist-digits"
        self.feature_dim = MNIST_FEATURE_DIM
        self.num_logits = 10
        self.weights_sha256 = file_sha256(path)[:16]
        self.protocol = (
            f"{QUANTIZE_PROTOCOL}; RGB->gray by channel mean; resize to {MNIST_INPUT_SIZE}x{MNIST_INPUT_SIZE} "
            f"bilinear antialias if needed; x/127.5-1; pre-ReLU penultimate features"
        )
        self.eval()

    @torch.no_grad()
    def forward(self, images_uint8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        images = _check_uint8(images_uint8).to(self.device, non_blocking=True).float()
        if images.shape[1] == 3:
            images = images.mean(dim=1, keepdim=True)
        elif images.shape[1] != 1:
            raise ValueError(f"the MNIST extractor takes 1 or 3 channels, got {images.shape[1]}")
        if images.shape[-2:] != (MNIST_INPUT_SIZE, MNIST_INPUT_SIZE):
            images = F.interpolate(
                images, size=(MNIST_INPUT_SIZE, MNIST_INPUT_SIZE), mode="bilinear", antialias=True
            )
        features, logits = self.net(images / 127.5 - 1.0)
        return features, logits


def build_feature_extractor(
    name: str = "mnist",
    weights_path: str | os.PathLike | None = None,
    feature_layer: str | int = "2048",
    with_logits: bool = True,
    device: str | torch.device = "cpu",
) -> FeatureExtractor:
    """Factory for configs: ``name`` is ``"mnist"`` (offline default) or ``"inception"`` (the standard FID)."""
    if name == "mnist":
        extractor: FeatureExtractor = MnistFeatureExtractor(weights_path)
    elif name == "inception":
        extractor = InceptionFeatureExtractor(
            weights_path, feature_layer=feature_layer, with_logits=with_logits
        )
    else:
        raise ValueError(f"unknown feature extractor {name!r}: expected 'mnist' or 'inception'")
    return extractor.to(device).eval()


def make_random_fid_inception_weights(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save a randomly initialised FID Inception-v3 state dict to ``path`` (for tests and benchmarks only).

    Same architecture and key names as the real file, so the loading code path is the real one. Convolutions get
    He-normal weights and BatchNorm the identity, so activations keep their scale through all 90+ layers and the
    deep features are not numerically zero.
    """
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class _NoLoad(FeatureExtractorInceptionV3):
        def load_state_dict(self, *args, **kwargs):  # keep the fresh modules; we overwrite every tensor below
            return None

    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.pth"
        torch.save({}, empty)
        skeleton = _NoLoad("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(empty))
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, value in skeleton.state_dict().items():
        if key.endswith("conv.weight"):
            fan_in = value[0].numel()
            state[key] = torch.randn(value.shape, generator=generator) * (2.0 / fan_in) ** 0.5
        elif key.endswith("bn.weight") or key.endswith("running_var"):
            state[key] = torch.ones_like(value)
        elif key.endswith("bn.bias") or key.endswith("running_mean"):
            state[key] = torch.zeros_like(value)
        elif key == "fc.weight":
            state[key] = torch.randn(value.shape, generator=generator) * (1.0 / value.shape[1]) ** 0.5
        elif key == "fc.bias":
            state[key] = torch.randn(value.shape, generator=generator) * 0.01
        else:  # num_batches_tracked
            state[key] = value.clone()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


def _check_uint8(images: torch.Tensor) -> torch.Tensor:
    if images.dtype != torch.uint8:
        raise TypeError(
            f"feature extractors take uint8 images; quantize first with pixelsmith.metrics.quantize_to_uint8 "
            f"(got {images.dtype})"
        )
    if images.dim() != 4:
        raise ValueError(f"expected images [N, C, H, W], got shape {tuple(images.shape)}")
    return images
