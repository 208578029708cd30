"""Style-transfer training on the shared TrainingCore: Johnson's fast stylizer and AdaIN, with manual optimization.

One iteration, per micro-batch: `style_fwd` (the stylizer), `loss_fwd` (the frozen VGG and the losses), `loss_bwd`
and `style_bwd` (the backward, split at the stylized image); then one `opt_step`. Mixed precision, accumulation, clipping, the non-finite guard, schedules, channels_last/compile of
the trained network and bit-for-bit resume all come from the core.

- `FastStyleModule`: a TransformerNet for the style image(s) in `model.style_images` (several are averaged into one
  target, i.e. a mixture). Loss: content at `content_layers`, Gram style loss at `style_layers`, total variation.
- `AdaINModule`: a decoder for a frozen VGG19 encoder; every content crop is paired with a style drawn at random
  from the style set (torch RNG, which the core reseeds per iteration, so a resumed run draws the same styles).

The loss network runs in the compute precision (autocast) with channels_last, frozen and in eval mode; Grams and
losses are float32 (`style/losses.py`). Checkpoints follow the contract of `style/stylize.py`: `stylizer.*` (fast),
`decoder.*` + `encoder.*` (AdaIN: the encoder is saved so stylizing needs no VGG file), and the run config. The fast
model's VGG is not saved (it is 4x the stylizer): it is rebuilt from the config on resume.

Fixed validation pairs (the first `validation.num_pairs` content images, center-cropped, each with a style in turn)
feed `sample_grid()` (rows content | style | result) and `pixelsmith.style.validation.StyleValidation`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.utils import make_grid

from pixelsmith.core.config import CoreSettings, OptimizerConfig, as_config
from pixelsmith.core.contract import IterationResult, OptimizerDefinition
from pixelsmith.core.module import TrainingCore
from pixelsmith.errors import PixelsmithError
from pixelsmith.metrics.gram import gram_matrix
from pixelsmith.style.config import (
    AdaINDecoderConfig,
    LossNetConfig,
    StyleValidationConfig,
    TransformerNetConfig,
)
from pixelsmith.style.data import (
    EMBEDDED_CONTENT_DIR,
    StyleImageError,
    embedded_style_paths,
    list_images,
    load_style_images,
    read_image,
)
from pixelsmith.style.loss_network import DEFAULT_LAYERS, VGGFeatures, layer_names
from pixelsmith.style.losses import AdaINLoss, PerceptualStyleLoss
from pixelsmith.style.networks import ADAIN_ENCODER_LAYERS, AdaINDecoder, AdaINNet, TransformerNet


class StyleConfigError(PixelsmithError, ValueError):
    pass


def resolve_style_paths(style_images: str | Path | Sequence[str | Path] | None) -> list[Path]:
    """`model.style_images`: one path, a list of paths, or None for every image in data/style/styles."""
    if style_images is None:
        return embedded_style_paths()
    paths = [style_images] if isinstance(style_images, str | Path) else list(style_images)
    if not paths:
        raise StyleImageError(
            "model.style_images is empty: give one image path or a list of them (null = the embedded styles)."
        )
    return [Path(p).expanduser() for p in paths]


def load_configured_styles(paths: list[Path], size: int) -> list[Tensor]:
    try:
        return load_style_images(paths, size)
    except StyleImageError as err:
        raise StyleImageError(
            f"{err} It comes from model.style_images={[str(p) for p in paths]}: set it to an existing image file "
            "or a list of them, e.g. model.style_images=[/path/to/style.jpg] (null = the embedded styles in "
            "data/style/styles)."
        ) from err


def center_square(image: Tensor, size: int) -> Tensor:
    """(3, H, W) float -> (3, size, size): shorter side resized to `size` (antialiased), then center-cropped."""
    height, width = image.shape[-2:]
    scale = size / min(height, width)
    target = (max(size, round(height * scale)), max(size, round(width * scale)))
    resized = F.interpolate(image[None].float(), size=target, mode="bilinear", antialias=True)[0]
    top, left = (target[0] - size) // 2, (target[1] - size) // 2
    return resized[:, top : top + size, left : left + size].clamp(0, 1).contiguous()


class StyleTransferModule(TrainingCore):
    """What both style models share: style images, the frozen loss network's bookkeeping, validation pairs,
    sample grids and the hooks the StyleValidation callback calls."""

    trained_network = ""  # the name of the single optimizer and network (set by subclasses)
    # What evaluate.py says to do with such a checkpoint instead of measuring it (it measures generators).
    evaluate_instead = (
        "This is a style-transfer checkpoint: apply it to photos with `python stylize.py ckpt_path={ckpt_path} "
        "input=<photo or folder> output=<file or folder>`; its validation metrics (content LPIPS, style loss) are "
        "in the training run's metrics.csv."
    )
    # The step-time breakdown's rows: stylizer and loss-network forward, then the backward split at the stylized image.
    breakdown_regions = ("style_fwd", "loss_fwd", "loss_bwd", "style_bwd")
    # hardware.cuda_graphs (core/graphs.py): a style iteration is one fixed-shape step of one optimizer with no
    # branch the host takes, so every iteration launches the same kernels and `iteration_plan` is a constant.
    supports_cuda_graphs = True

    def __init__(
        self,
        core: CoreSettings,
        name: str,
        style_images: Any,
        style_size: int,
        loss_net: Any,
        content_weight: float,
        style_weight: float,
        optimizer: Any,
        validation: Any,
    ):
        super().__init__(core)
        self.model_name = name
        self.style_paths = resolve_style_paths(style_images)
        self.style_size = int(style_size)
        self.styles = load_configured_styles(self.style_paths, self.style_size)  # (3, h, w) float [0, 1], CPU
        self.loss_net_config = as_config(LossNetConfig, loss_net)
        self.content_weight = float(content_weight)
        self.style_weight = float(style_weight)
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        self.validation = as_config(StyleValidationConfig, validation)
        # Frozen helpers that must follow the module's device but stay out of state_dict() and parameters():
        # a plain dict is not traversed by nn.Module, so `_apply` below moves them explicitly.
        self._frozen: dict[str, nn.Module] = {}
        self._validation_cache: tuple[int, Tensor] | None = None
        content, style_index = self._validation_pairs()
        self.validation_style_index = style_index
        self.register_buffer("validation_content", content, persistent=False)
        displayed = torch.stack([center_square(self.styles[i], content.shape[-1]) for i in style_index])
        self.register_buffer("validation_style", displayed, persistent=False)

    # ---- set-up helpers ------------------------------------------------------------------------------------------
    def _validation_pairs(self) -> tuple[Tensor, list[int]]:
        settings = self.validation
        folder = Path(settings.content_dir).expanduser() if settings.content_dir else EMBEDDED_CONTENT_DIR
        files = list_images(folder)[: max(1, settings.num_pairs)]
        if not files:
            raise StyleConfigError(
                f"model.validation.content_dir={str(folder)!r} holds no images for the validation pairs."
            )
        images = [
            center_square(
                torch.from_numpy(read_image(f).rgb.copy()).permute(2, 0, 1).float() / 255, settings.size
            )
            for f in files
        ]
        return torch.stack(images), [i % len(self.styles) for i in range(len(images))]

    def build_loss_network(self, arch: str, layers: Sequence[str]) -> VGGFeatures:
        cfg = self.loss_net_config
        try:
            names = layer_names(arch)
            unknown = [name for name in layers if name not in names]
            if unknown:
                raise ValueError(f"unknown {arch} layer(s) {unknown}; valid: {', '.join(names)}")
        except ValueError as err:
            raise StyleConfigError(f"model.loss_net / model.*_layers: {err}.") from err
        ordered = sorted(set(layers), key=names.index)
        return VGGFeatures(arch, ordered, pretrained=cfg.pretrained, weights_path=cfg.weights_path)

    def _apply(self, fn, recurse: bool = True):
        # nn.Module's private hook for .to()/.cuda()/.float(): extend it to the helpers kept out of the module tree.
        super()._apply(fn, recurse)
        for module in getattr(self, "_frozen", {}).values():
            module._apply(fn, recurse)
        return self

    def prepare_content(self, images: Tensor) -> Tensor:
        """uint8 crops -> float [0, 1] on the device, channels_last when the run uses it (the core gives [-1, 1])."""
        return self.prepare_images(images).add_(1.0).mul_(0.5)

    # ---- TrainingCore contract -------------------------------------------------------------------------------------
    def trained(self) -> nn.Module:
        raise NotImplementedError

    def networks(self) -> dict[str, nn.Module]:
        return {self.trained_network: self.trained()}

    def optimizer_definitions(self) -> list[OptimizerDefinition]:
        params = list(self.trained().parameters())
        return [OptimizerDefinition(self.trained_network, params, self.optimizer_config)]

    def compute_losses(self, content: Tensor, style: Tensor | None):
        """One micro-batch: phases style_fwd and loss_fwd; returns LossTerms. Call `split_backward_at` on the
        stylized image so the breakdown can tell the loss network's backward from the stylizer's."""
        raise NotImplementedError

    def split_backward_at(self, stylized: Tensor) -> None:
        """When a step-time breakdown is attached, switch its region from `loss_bwd` to `style_bwd` at the moment
        autograd has finished the loss network's backward and reaches `stylized` (one tensor hook, no sync)."""
        timer = self._region_timer
        if timer is None or not getattr(timer, "timing", False) or not stylized.requires_grad:
            return

        def switch(grad: Tensor) -> None:
            timer.exit()  # leaves loss_bwd
            timer.enter("style_bwd")  # closed by the loss_bwd context's exit

        stylized.register_hook(switch)

    def style_batch(self, content: Tensor) -> Tensor | None:
        """Style images for this iteration's content batch (AdaIN); None when the style is fixed."""
        return None

    def iteration_plan(self, batch: Any) -> Hashable:
        """The same every iteration: one stylizer step, no lazy phases or host-decided branches (validation and
        sample grids run in callbacks after the iteration). The batch's shape is part of the graph's key anyway."""
        del batch
        return "style"

    def train_iteration(self, batch: Any) -> IterationResult:
        images, skipped = batch
        self.count_skipped_files(skipped)
        with self.region("h2d"):
            content = self.prepare_content(images)
            style = self.style_batch(content)
        style_chunks = self.micro_batches(style) if style is not None else [None] * self.core.accumulate
        sums: dict[str, Tensor] = {}
        for content_chunk, style_chunk in zip(self.micro_batches(content), style_chunks, strict=True):
            terms = self.compute_losses(content_chunk, style_chunk)
            # loss_bwd until autograd reaches the stylized image (`split_backward_at`), style_bwd after it.
            with self.region("loss_bwd"):
                self.loss_backward(terms.total, self.trained_network)
            for key, value in terms._asdict().items():
                sums[key] = sums.get(key, 0.0) + value.detach().float() / self.core.accumulate
        with self.region("opt_step"):
            self.step(self.trained_network)
        return IterationResult(
            content.shape[0], {f"loss/{k}": v for k, v in sums.items() if k in self.logged_terms}
        )

    logged_terms: tuple[str, ...] = ("total", "content", "style", "tv")

    # ---- validation and samples ------------------------------------------------------------------------------------
    def stylize_batch(self, content: Tensor, style_index: list[int]) -> Tensor:
        """Stylized images in [0, 1] (float32) for content (N, 3, H, W) and one style index per image."""
        raise NotImplementedError

    @torch.no_grad()
    def validation_results(self) -> Tensor:
        """The stylized validation content (N, 3, S, S) in [0, 1]; computed once per iteration (grid + metrics)."""
        if self._validation_cache is not None and self._validation_cache[0] == self.iteration:
            return self._validation_cache[1]
        content = self.validation_content
        if self.core.channels_last:
            content = content.contiguous(memory_format=torch.channels_last)
        results = self.stylize_batch(content, self.validation_style_index).float().clamp(0, 1).contiguous()
        self._validation_cache = (self.iteration, results)
        return results

    def style_features(self, images: Tensor) -> list[Tensor]:
        """Features at the style layers of the loss network, for the Gram distance."""
        raise NotImplementedError

    def validation_target_grams(self) -> list[Tensor]:
        """Per style layer, the target Gram of each validation pair ((N or 1, C, C))."""
        raise NotImplementedError

    def sample_grid(self) -> Tensor:
        """Rows of content | style | result on the fixed validation pairs, a [3, H, W] grid in [0, 1]."""
        results = self.validation_results()
        rows = torch.stack([self.validation_content, self.validation_style, results], dim=1).flatten(0, 1)
        return make_grid(rows.float().cpu(), nrow=3, padding=2, pad_value=1.0)


class FastStyleModule(StyleTransferModule):
    """Johnson et al. (2016): a TransformerNet trained with a VGG perceptual loss for a fixed style."""

    trained_network = "stylizer"

    def __init__(
        self,
        core: CoreSettings,
        name: str = "style_fast",
        style_images: Any = None,
        style_size: int = 256,
        stylizer: Any = None,
        loss_net: Any = None,
        content_layers: Sequence[str] = ("relu2_2",),
        style_layers: Sequence[str] | None = None,
        content_weight: float = 1.0,
        style_weight: float = 1e5,
        tv_weight: float = 0.0,
        optimizer: Any = None,
        validation: Any = None,
        _target_: str | None = None,  # accepted so a config node can be passed whole
    ):
        super().__init__(
            core,
            name,
            style_images,
            style_size,
            loss_net,
            content_weight,
            style_weight,
            optimizer,
            validation,
        )
        self.stylizer_config = dataclasses.asdict(as_config(TransformerNetConfig, stylizer))
        try:
            self.stylizer = TransformerNet.from_config(self.stylizer_config)
        except ValueError as err:
            raise StyleConfigError(f"model.stylizer: {err}") from err
        arch = self.loss_net_config.arch
        if arch not in DEFAULT_LAYERS:
            raise StyleConfigError(
                f"model.loss_net.arch={arch!r}; choose one of {', '.join(DEFAULT_LAYERS)}."
            )
        self.content_layers = tuple(content_layers)
        self.style_layers = tuple(style_layers) if style_layers else DEFAULT_LAYERS[arch]
        loss_net_module = self.build_loss_network(arch, self.content_layers + self.style_layers)
        criterion = PerceptualStyleLoss(
            loss_net_module,
            self.content_layers,
            self.style_layers,
            self.content_weight,
            self.style_weight,
            float(tv_weight),
        )
        criterion.set_style(self.styles)  # one target: the mean Gram over the style images
        self._frozen["criterion"] = criterion

    @property
    def criterion(self) -> PerceptualStyleLoss:
        return self._frozen["criterion"]

    def trained(self) -> nn.Module:
        return self.stylizer

    def compute_losses(self, content: Tensor, style: Tensor | None):
        with self.region("style_fwd"), self.autocast():
            output = self.stylizer(content)
        self.split_backward_at(output)
        with self.region("loss_fwd"), self.autocast():
            return self.criterion(output, content)

    def stylize_batch(self, content: Tensor, style_index: list[int]) -> Tensor:
        with self.autocast():
            return self.stylizer(content)

    def style_features(self, images: Tensor) -> list[Tensor]:
        with self.autocast():
            features = self.criterion.loss_net(images, layers=self.style_layers)
        return [features[name] for name in self.style_layers]

    def validation_target_grams(self) -> list[Tensor]:
        # A fast model learns the one (mean) target it was trained for, whichever style image a row displays.
        return [self.criterion.target_grams[name].to(self.device) for name in self.style_layers]


class AdaINModule(StyleTransferModule):
    """Huang & Belongie (2017): decoder trained for a frozen VGG19 encoder; any style image at inference."""

    trained_network = "decoder"
    logged_terms = ("total", "content", "style")

    def __init__(
        self,
        core: CoreSettings,
        name: str = "style_adain",
        style_images: Any = None,
        style_size: int = 256,
        style_crop: int | None = None,
        decoder: Any = None,
        loss_net: Any = None,
        content_weight: float = 1.0,
        style_weight: float = 10.0,
        optimizer: Any = None,
        validation: Any = None,
        _target_: str | None = None,
    ):
        super().__init__(
            core,
            name,
            style_images,
            style_size,
            loss_net,
            content_weight,
            style_weight,
            optimizer,
            validation,
        )
        if self.loss_net_config.arch != "vgg19":
            raise StyleConfigError(
                f"model.loss_net.arch={self.loss_net_config.arch!r}: AdaIN's encoder is VGG19 up to relu4_1; "
                "set model.loss_net.arch=vgg19."
            )
        self.style_crop = int(style_crop) if style_crop else None
        if self.style_crop is not None and self.style_crop > self.style_size:
            raise StyleConfigError(
                f"model.style_crop={self.style_crop} is larger than model.style_size={self.style_size} (the style "
                "images' shorter side): lower the crop or raise style_size."
            )
        self.decoder_config = dataclasses.asdict(as_config(AdaINDecoderConfig, decoder))
        encoder = self.build_loss_network("vgg19", ADAIN_ENCODER_LAYERS)
        # Registered as `encoder` and `decoder` (the stylize.py checkpoint contract); the AdaINNet/AdaINLoss views
        # over them live outside the module tree so their weights are not listed twice.
        self.encoder = encoder
        self.decoder = AdaINDecoder.from_config(self.decoder_config)
        adain = AdaINNet(self.encoder, self.decoder)
        self._views = {"net": adain, "loss": AdaINLoss(adain, self.content_weight, self.style_weight)}
        self._pending_style: Tensor | None = None  # this iteration's style crops (iteration_plan's)
        # Under hardware.cuda_graphs: the style crops' device buffers the graphs read, one per shape.
        self._static_style: dict[tuple[int, ...], Tensor] = {}

    @property
    def net(self) -> AdaINNet:
        return self._views["net"]

    def trained(self) -> nn.Module:
        return self.decoder

    def iteration_plan(self, batch: Any) -> Hashable:
        """The style crops are this iteration's host decisions: drawn here, before the iteration runs. Under
        hardware.cuda_graphs they are copied into a device buffer that the captured iteration reads (a replay runs
        no Python, so a crop made inside it would be the captured iteration's crop forever)."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        crops = self._draw_style_crops(images.shape[0], self.style_crop or int(images.shape[-1]))
        if not self.graphed:
            self._pending_style = crops
            return "style"
        key = tuple(crops.shape)
        static = self._static_style.get(key)
        if static is None:
            # One buffer per shape, kept for the run: each graph reads the buffer it was captured with.
            memory_format = torch.channels_last if self.core.channels_last else torch.contiguous_format
            static = torch.empty(crops.shape, dtype=crops.dtype, device=self.device)
            static = self._static_style[key] = static.contiguous(memory_format=memory_format)
        static.copy_(crops, non_blocking=True)
        self._pending_style = static
        return "style"

    def _draw_style_crops(self, count: int, crop: int) -> Tensor:
        """`count` random style crops (CPU, float [0, 1]): style index and crop offsets from the core's host RNG
        (reseeded per iteration, so resuming draws the same ones; host draws keep the GPU from waiting on a
        `.item()`)."""
        if crop > self.style_size:
            raise StyleConfigError(
                f"Style crops of {crop} px do not fit style images resized to model.style_size={self.style_size}: "
                "raise model.style_size or set model.style_crop lower."
            )
        rng = self.host_random
        crops = []
        for _ in range(count):
            style = self.styles[rng.randrange(len(self.styles))]
            height, width = style.shape[-2:]
            top = rng.randrange(height - crop + 1)
            left = rng.randrange(width - crop + 1)
            crops.append(style[:, top : top + crop, left : left + crop])
        return torch.stack(crops)

    def style_batch(self, content: Tensor) -> Tensor:
        """One random style crop per content image, drawn by `iteration_plan` (a caller that drives
        `train_iteration` alone gets them drawn here); on the device already under hardware.cuda_graphs."""
        crops = self._pending_style
        if crops is not None and crops is self._static_style.get(tuple(crops.shape)):
            # The buffer the graph reads, kept (not consumed): an iteration re-run after a failed capture reads it too.
            return crops
        self._pending_style = None
        if crops is None:
            crops = self._draw_style_crops(content.shape[0], self.style_crop or int(content.shape[-1]))
        batch = crops.to(self.device, non_blocking=True)
        if self.core.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch

    def compute_losses(self, content: Tensor, style: Tensor | None):
        with self.region("style_fwd"), self.autocast():
            with torch.no_grad():  # one style pass serves the AdaIN target and the style loss
                style_features = self.net.encoder(style)
            output, target = self.net.forward_train(content, style, style_features)
        self.split_backward_at(output)
        with self.region("loss_fwd"), self.autocast():
            return self._views["loss"](output, target, style, style_features)

    def _full_style(self, index: int) -> Tensor:
        return self.styles[index][None].to(self.device)

    def stylize_batch(self, content: Tensor, style_index: list[int]) -> Tensor:
        results = torch.empty(content.shape, dtype=torch.float32, device=content.device)
        with self.autocast():
            for index in sorted(set(style_index)):
                rows = [i for i, s in enumerate(style_index) if s == index]
                stylizer = self.net.bind_style(self._full_style(index), alpha=1.0)
                results[rows] = stylizer(content[rows]).float()
        return results

    def style_features(self, images: Tensor) -> list[Tensor]:
        with self.autocast():
            features = self.encoder(images)
        return [features[name] for name in ADAIN_ENCODER_LAYERS]

    @torch.no_grad()
    def validation_target_grams(self) -> list[Tensor]:
        per_style = {}
        for index in sorted(set(self.validation_style_index)):
            with self.autocast():
                features = self.encoder(self._full_style(index))
            per_style[index] = [gram_matrix(features[name]) for name in ADAIN_ENCODER_LAYERS]
        return [
            torch.cat([per_style[index][layer] for index in self.validation_style_index])
            for layer in range(len(ADAIN_ENCODER_LAYERS))
        ]
