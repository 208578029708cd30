"""Tiled inference for images of any size, with instance-norm statistics taken from a whole-image thumbnail.

Why: an instance-normalised stylizer computes per-channel statistics over the whole input, so stylizing tiles
independently gives every tile its own colours and contrast (visible blocks). Following the Thumbnail Instance
Normalization idea of URST (Chen et al., "Towards Ultra-Resolution Neural Style Transfer via Thumbnail Instance
Normalization", AAAI 2022), we run the network once on a downscaled thumbnail of the whole image, record the
per-channel mean/variance every InstanceNorm (and AdaIN content) layer sees, and run the tiles with those fixed
statistics. Remaining tile-border effects (receptive field, reflection padding at tile edges) are hidden by
overlapping tiles blended with raised-cosine ramps whose weights are normalised to sum to exactly 1.

Memory: tiles are processed one tile row at a time into a float32 band (3 x tile x width) that is converted to
uint8 and written into the preallocated uint8 output as soon as no later tile touches its rows. Beyond the uint8
input and output (3 bytes/pixel each) memory depends on the tile size, tile batch and thumbnail size only.

Tile size: `tile="auto"` picks the largest tile that fits a memory budget (`plan_tiles`): on a GPU the free memory
(`torch.cuda.mem_get_info`) times `memory_fraction`, on a CPU a fixed budget. The network's memory per pixel is
measured on a small probe (`bytes_per_pixel`). When the whole image fits it is one tile: no thumbnail, no blending,
exactly whole-image inference.

Pipeline: on a GPU (`pipeline="device"`) the uint8 image is copied to the device once; tiles are cut, blended and
converted to uint8 there, and the result comes back in one copy. On a CPU (`pipeline="host"`) tiles are read from
the numpy image as they are needed. Both give the same pixels (tested on CPU). `StageTimes` records where the time
went: copy in, network, blend, copy out (decode and encode are added by `pipeline.py`).
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pixelsmith.core.precision import AUTOCAST_DTYPES
from pixelsmith.style.networks import AdaptiveInstanceNorm, channel_mean_var

# Names accepted for `precision`: the training core's (32-true, bf16-mixed, 16-mixed) plus short aliases.
PRECISION_ALIASES = {
    **AUTOCAST_DTYPES,
    **dict.fromkeys(("32", "fp32", "float32"), None),
    **dict.fromkeys(("bf16", "bfloat16"), torch.bfloat16),
    **dict.fromkeys(("16", "fp16", "float16"), torch.float16),
}

InstanceStatistics = dict[str, tuple[Tensor, Tensor]]

log = logging.getLogger(__name__)


def autocast_for(precision: str, device: torch.device | str):
    """The autocast context for a precision name (fp32 -> no autocast)."""
    if precision not in PRECISION_ALIASES:
        raise ValueError(f"precision={precision!r} is unknown; choose one of {', '.join(PRECISION_ALIASES)}.")
    dtype = PRECISION_ALIASES[precision]
    device_type = torch.device(device).type
    return nullcontext() if dtype is None else torch.autocast(device_type=device_type, dtype=dtype)


# ----------------------------------------------------------------------------------- instance-norm statistics


def statistic_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Layers whose output depends on per-image statistics: instance norms without running stats, and AdaIN."""
    layers = []
    for name, module in model.named_modules():
        is_instance_norm = isinstance(module, nn.modules.instancenorm._InstanceNorm) and not (
            module.track_running_stats and module.running_mean is not None
        )
        if is_instance_norm or isinstance(module, AdaptiveInstanceNorm):
            layers.append((name, module))
    return layers


def _instance_norm_with(module: nn.Module, x: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    # Folded into one per-channel scale and shift (C-sized, float32) so a big activation is touched once and only
    # one activation-sized tensor is allocated.
    scale = torch.rsqrt(var + module.eps)
    shift = -mean * scale
    if module.affine:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        scale = scale * module.weight.float().view(shape)
        shift = shift * module.weight.float().view(shape) + module.bias.float().view(shape)
    return torch.addcmul(shift.to(x.dtype), x, scale.to(x.dtype))


def _make_forward(name: str, module: nn.Module, statistics: InstanceStatistics, record: bool) -> Callable:
    def statistics_for(x: Tensor) -> tuple[Tensor, Tensor]:
        if record:
            if x.shape[0] != 1:
                raise ValueError(
                    f"Record statistics from one thumbnail at a time (got a batch of {x.shape[0]})."
                )
            statistics[name] = channel_mean_var(x)
        elif name not in statistics:
            raise KeyError(
                f"No recorded statistics for layer {name!r}: record them on this same model first."
            )
        return statistics[name]

    if isinstance(module, AdaptiveInstanceNorm):

        def adain_forward(
            content: Tensor, style_mean: Tensor, style_std: Tensor, alpha: float = 1.0
        ) -> Tensor:
            mean, var = statistics_for(content)
            return module.normalize(content, mean, var, style_mean, style_std, alpha)

        return adain_forward

    def instance_norm_forward(x: Tensor) -> Tensor:
        mean, var = statistics_for(x)
        return _instance_norm_with(module, x, mean, var)

    return instance_norm_forward


@contextmanager
def _swapped_forwards(model: nn.Module, statistics: InstanceStatistics, record: bool) -> Iterator[None]:
    """Replace the statistic layers' forward on the instances (not the classes) and restore them on exit."""
    forwards = {
        name: _make_forward(name, module, statistics, record) for name, module in statistic_layers(model)
    }
    with _installed_forwards(model, forwards):
        yield


@contextmanager
def _installed_forwards(model: nn.Module, forwards: dict[str, Callable]) -> Iterator[None]:
    layers = statistic_layers(model)
    saved = [(module, module.__dict__.get("forward")) for _, module in layers]
    try:
        for name, module in layers:
            module.forward = forwards[name]
        yield
    finally:
        for module, previous in saved:
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous


def record_instance_norm_statistics(model: nn.Module, thumbnail: Tensor) -> InstanceStatistics:
    """Run `model` on a (1, 3, h, w) thumbnail and return every statistic layer's float32 (mean, var).

    Call inside the autocast/no-grad context the tiles will use. The recording pass normalises with the same code
    as the frozen pass, so frozen statistics reproduce the recording pass exactly on the same input.
    """
    statistics: InstanceStatistics = {}
    with _swapped_forwards(model, statistics, record=True):
        model(thumbnail)
    return statistics


@contextmanager
def frozen_instance_norm_statistics(model: nn.Module, statistics: InstanceStatistics) -> Iterator[None]:
    """Inside: every statistic layer of `model` normalises with `statistics` instead of its input's own."""
    with _swapped_forwards(model, statistics, record=False):
        yield


@contextmanager
def thumbnail_instance_norm(model: nn.Module, thumbnail: Tensor) -> Iterator[InstanceStatistics]:
    """Record statistics on `thumbnail`, then keep them frozen for the duration of the block."""
    statistics = record_instance_norm_statistics(model, thumbnail)
    with frozen_instance_norm_statistics(model, statistics):
        yield statistics


class CompiledTiles:
    """The stylizer's forward compiled once per tile batch shape (`torch.compile(dynamic=False)`) and reused for every
    tile of every image of that shape: a folder compiles once.

    The thumbnail's statistics reach the compiled code as tensors it reads, not as constants: each image's are
    copied into the same tensors, and the same frozen forwards are installed every time, so Dynamo's guards hold and
    nothing recompiles. The recording pass on the thumbnail runs eagerly (its shape is the thumbnail's)."""

    def __init__(self, model: nn.Module, mode: str = "default"):
        self.model = model
        self.mode = mode
        self.statistics: InstanceStatistics = {}
        self.forwards = {
            name: _make_forward(name, module, self.statistics, record=False)
            for name, module in statistic_layers(model)
        }
        self.compiled = torch.compile(model, dynamic=False, mode=mode)
        self.failure: str | None = None
        self.ran_compiled = (
            False  # a tile batch went through the compiled code (the run may mark the cache warm)
        )

    def __call__(self, batch: Tensor) -> Tensor:
        if self.failure is None:
            try:
                # stylize_tiled sends only the declared tile shapes (two per tile size), so Dynamo's own recompile
                # limit, shared by every instance of the network's class in the process, must never turn one of
                # them eager: which shapes ran compiled would then depend on what ran before.
                limit = max(torch._dynamo.config.recompile_limit, COMPILED_SHAPES_LIMIT)
                with torch._dynamo.config.patch(recompile_limit=limit):
                    result = self.compiled(batch)
                self.ran_compiled = True
                return result
            except torch._dynamo.exc.TorchDynamoException as error:
                # A stylizer torch.compile cannot take (a fork's own network, an old GPU) still stylizes: eagerly.
                self.failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                log.warning(
                    "compile: torch.compile failed on the stylizer (%s); its tiles run eagerly. Set compile=false "
                    "to skip the attempt.",
                    self.failure,
                )
        return self.model(batch)

    @contextmanager
    def frozen(self, recorded: InstanceStatistics) -> Iterator[None]:
        """Inside: the compiled forward normalises with `recorded` (copied into the tensors it reads)."""
        for name, (mean, var) in recorded.items():
            held = self.statistics.get(name)
            if held is not None and held[0].shape == mean.shape and held[0].device == mean.device:
                held[0].copy_(mean)
                held[1].copy_(var)
            else:
                self.statistics[name] = (mean.clone(), var.clone())
        with _installed_forwards(self.model, self.forwards):
            yield


# The compiled graphs a process may hold for the stylizer (CompiledTiles): a job declares two tile batch shapes, so
# this many allows a long-lived process (a service, a test session) dozens of tile sizes before Dynamo would stop.
COMPILED_SHAPES_LIMIT = 64

_compiled_tiles: weakref.WeakKeyDictionary[nn.Module, CompiledTiles] = weakref.WeakKeyDictionary()


def compiled_tiles(model: nn.Module, mode: str = "default") -> CompiledTiles:
    """The model's `CompiledTiles`, made on first use and kept as long as the model lives."""
    found = _compiled_tiles.get(model)
    if found is None or found.mode != mode:
        found = _compiled_tiles[model] = CompiledTiles(model, mode)
    return found


# ------------------------------------------------------------------------------------------------- geometry


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def tile_starts(length: int, tile: int, overlap: int, multiple: int = 1) -> list[int]:
    """Tile start offsets covering [0, length): evenly spread, on multiples of `multiple` (so every tile sees the
    network's stride grid as the whole image does), neighbours overlapping by at least `overlap`. `length` and
    `tile` must be multiples of `multiple` (stylize_tiled pads the image virtually to ensure it)."""
    if length % multiple or tile % multiple:
        raise ValueError(f"length={length} and tile={tile} must be multiples of {multiple}.")
    if length <= tile:
        return [0]
    stride = tile - overlap
    if stride < multiple:
        raise ValueError(f"overlap={overlap} leaves no room to advance a tile of {tile}px.")
    last = length - tile
    count = math.ceil(last / stride) + 1
    while True:
        starts = sorted({round(i * last / (count - 1) / multiple) * multiple for i in range(count)})
        if all(b - a <= stride for a, b in zip(starts, starts[1:], strict=False)):
            return starts
        count += 1


def raised_cosine_ramp(length: int) -> Tensor:
    """Rising weights r(t) = sin^2(pi (t + 0.5) / (2 length)); r(t) + r(length - 1 - t) = 1, so a rising ramp and
    the mirrored falling ramp of the neighbouring tile sum to exactly one across their shared overlap."""
    t = torch.arange(length, dtype=torch.float64)
    return (0.5 - 0.5 * torch.cos(math.pi * (t + 0.5) / length)).float()


def tile_window(starts: list[int], index: int, tile: int) -> Tensor:
    """1-D blending window of tile `index`: ramps across the overlap with each neighbour, 1 elsewhere (including at
    the image border, where no other tile contributes)."""
    window = torch.ones(tile)
    start = starts[index]
    if index > 0:
        left = starts[index - 1] + tile - start
        window[:left] *= raised_cosine_ramp(left)
    if index < len(starts) - 1:
        right = start + tile - starts[index + 1]
        window[tile - right :] *= raised_cosine_ramp(right).flip(0)
    return window


def window_sum(starts: list[int], windows: list[Tensor], length: int) -> Tensor:
    total = torch.zeros(length)
    for start, window in zip(starts, windows, strict=True):
        total[start : start + window.numel()] += window
    return total


# --------------------------------------------------------------------------------------------- tile planning

# Memory a CPU run may give the tiles in flight (network activations of one tile batch) when tile="auto": 2 GiB
# takes a 2K frame whole (TransformerNet 32/5: ~830 bytes per pixel, 1.8 GB), as one forward with no overlap and no
# thumbnail pass (1.6x fewer FLOPs than 512-px tiles); larger images tile at CPU_MAX_AUTO_TILE, and with the uint8
# input and output of an 8K image (100 MB each) and the interpreter, peak RSS stays under 3 GB.
CPU_TILE_BUDGET_BYTES = 2 << 30
# A CPU gains nothing from tiles larger than this (2 cores, TransformerNet 32/5, one run each: a 4K image took
# 30.7 s in 836-px tiles vs 26.5 s in 512-px ones; 2K 7.5 s vs 9.4 s), so tile="auto" on a CPU stops here unless the
# whole image fits the budget.
CPU_MAX_AUTO_TILE = 512
# Per tile pixel in flight outside the network: the float32 input batch (12 bytes), the float32 result (12) and the
# float32 blending band (12 per pixel of a tile row, counted here per tile pixel as an upper bound).
PIPELINE_BYTES_PER_PIXEL = 36
# Estimated peak activation bytes per pixel = this x the largest single layer output per pixel: the input and
# output of the widest layer, a residual kept alive beside them, and the allocator's slack.
ACTIVATION_SAFETY = 3.0


# tile="auto" under compile: the declared tile side is the planned side rounded down to a power of two, at most this
# (per device type), so every image of a job tiles with the same side whatever its size (see `stylize_tiled`).
COMPILED_MAX_AUTO_TILE = {"cpu": CPU_MAX_AUTO_TILE, "cuda": 1024}


@dataclass(frozen=True)
class TilePlan:
    tile: int  # square tile side (the whole image's longer padded side when `whole`)
    whole: bool  # one tile covers the whole image: plain whole-image inference
    budget_bytes: int
    bytes_per_pixel: float


def bytes_per_pixel(
    model: nn.Module,
    device: torch.device,
    precision: str,
    probe: int = 128,
    memory_format: torch.memory_format = torch.channels_last,
) -> float:
    """Peak activation memory of one forward pass per input pixel.

    On CUDA it is measured: the allocator's peak at two probe sizes, and the slope between them (fixed costs such as
    autocast's weight copies and cuDNN workspaces do not grow with the tile). Elsewhere it is estimated from the
    largest output of any layer on a `probe` x `probe` input (forward hooks), times ACTIVATION_SAFETY."""
    multiple = int(getattr(model, "size_multiple", 1))
    side = round_up(probe, multiple)
    if device.type == "cuda":
        peaks = []
        for edge in (side, 2 * side):
            x = torch.rand(1, 3, edge, edge, device=device).contiguous(memory_format=memory_format)
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            with torch.inference_mode(), autocast_for(precision, device):
                model(x)
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device) - before)
            del x
        return max(1.0, 1.25 * (peaks[1] - peaks[0]) / (3 * side**2))
    x = torch.rand(1, 3, side, side, device=device).contiguous(memory_format=memory_format)
    largest = 0

    def record(module, inputs, output) -> None:
        nonlocal largest
        if isinstance(output, Tensor):
            largest = max(largest, output.numel() * output.element_size())

    handles = [m.register_forward_hook(record) for m in model.modules() if not list(m.children())]
    try:
        with torch.inference_mode(), autocast_for(precision, device):
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return max(1.0, ACTIVATION_SAFETY * largest / side**2)


def memory_budget(device: torch.device, memory_fraction: float = 0.9) -> int:
    """Bytes the tiles may take: the free GPU memory times `memory_fraction`, or CPU_TILE_BUDGET_BYTES on a CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        # Memory PyTorch holds in its cache (the previous image's tiles) is free to this process too.
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int((free + cached) * memory_fraction)
    return CPU_TILE_BUDGET_BYTES


def plan_tiles(
    height: int,
    width: int,
    *,
    budget_bytes: int,
    bytes_per_pixel: float,
    batch_size: int,
    multiple: int = 1,
    min_tile: int = 16,
    image_on_device: bool = False,
) -> TilePlan:
    """The largest tile whose forward fits `budget_bytes`: the whole image if it fits (one forward, batch 1), else
    the largest square tile (a multiple of `multiple`) of which `batch_size` fit at once, at least `min_tile`.

    Besides the network, each tile pixel in flight costs PIPELINE_BYTES_PER_PIXEL (the float input batch, the float
    result and its share of the float blending band); with `image_on_device` the uint8 input and output images
    (6 bytes per image pixel) are on the device too and come off the budget first."""
    padded_h, padded_w = round_up(height, multiple), round_up(width, multiple)
    per_pixel = bytes_per_pixel + PIPELINE_BYTES_PER_PIXEL
    budget = budget_bytes - (6 * height * width if image_on_device else 0)
    if padded_h * padded_w * per_pixel <= budget:
        return TilePlan(max(padded_h, padded_w), True, budget_bytes, bytes_per_pixel)
    side = int(math.sqrt(max(budget, 0) / (per_pixel * batch_size)))
    side = max(round_up(min_tile, multiple), side // multiple * multiple)
    return TilePlan(side, False, budget_bytes, bytes_per_pixel)


@dataclass
class StageTimes:
    """Seconds per stage of one or more stylized images. Timed here, on CUDA the device work is synchronised at each
    stage's end (`stylize_tiled` does that only when given a StageTimes). The folder pipeline on CUDA never waits
    for a stage: its copy in, network, blend and copy out come from CUDA events read once each image is finished
    (`overlap.EventStageTimes`), its decode and encode are the host's wall time of those calls, and since the stages
    of consecutive images overlap, their sum exceeds the wall time."""

    decode: float = 0.0
    copy_in: float = 0.0
    network: float = 0.0
    blend: float = 0.0
    copy_out: float = 0.0
    encode: float = 0.0

    @contextmanager
    def stage(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)

    def add(self, other: StageTimes) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def summary(self) -> str:
        total = sum(getattr(self, f.name) for f in fields(self))
        parts = ", ".join(f"{f.name.replace('_', ' ')} {getattr(self, f.name):.2f} s" for f in fields(self))
        return f"{parts} (sum {total:.2f} s)"


# ------------------------------------------------------------------------------------------------ image I/O


def _reflect_indices(start: int, size: int, limit: int) -> np.ndarray | slice:
    """Indices start..start+size-1, reflected at `limit` like F.pad(mode="reflect") does beyond the last pixel."""
    if start + size <= limit:
        return slice(start, start + size)
    index = np.arange(start, start + size)
    return np.where(index < limit, index, 2 * (limit - 1) - index)


def read_tile(image: np.ndarray, y: int, x: int, height: int, width: int) -> Tensor:
    """(3, height, width) float32 in [0, 1] from an (H, W, 3) uint8 array, reflection-padded past its end."""
    rows = _reflect_indices(y, height, image.shape[0])
    cols = _reflect_indices(x, width, image.shape[1])
    patch = image[rows][:, cols] if isinstance(rows, np.ndarray) else image[rows, cols]
    return torch.from_numpy(np.array(patch)).permute(2, 0, 1).float().div_(255.0)  # np.array: a writable copy


def make_thumbnail(image: np.ndarray | Tensor, max_side: int, multiple: int = 1) -> Tensor:
    """(1, 3, h, w) float32 thumbnail with max(h, w) ~ max_side (sides multiples of `multiple`); the whole image
    when it is already that small. Box-averages in row bands first so a huge image is never converted to float
    whole (a 7680x4320 float copy would be 400 MB). A uint8 (H, W, 3) tensor (decoded on the device) is reduced
    where it lives, with the same box average and resize."""
    height, width = image.shape[:2]
    scale = max_side / max(height, width)
    if isinstance(image, Tensor):
        return _make_thumbnail_tensor(image, scale, multiple)
    if scale >= 1.0:
        return torch.from_numpy(np.array(image)).permute(2, 0, 1).unsqueeze(0).float().div_(255.0)
    factor = max(1, int(1.0 / scale))  # box-average to just above the target size, then an antialiased resize
    reduced_h, reduced_w = height // factor, width // factor
    reduced = np.empty((reduced_h, reduced_w, 3), dtype=np.float32)
    rows_per_band = max(1, 32 // factor) * factor
    for y in range(0, reduced_h * factor, rows_per_band):
        band = image[y : min(y + rows_per_band, reduced_h * factor), : reduced_w * factor].astype(np.float32)
        band = band.reshape(band.shape[0] // factor, factor, reduced_w, factor, 3).mean(axis=(1, 3))
        reduced[y // factor : y // factor + band.shape[0]] = band
    target_h = max(multiple, round(height * scale / multiple) * multiple)
    target_w = max(multiple, round(width * scale / multiple) * multiple)
    tensor = torch.from_numpy(reduced).permute(2, 0, 1).unsqueeze(0).div_(255.0)
    return F.interpolate(
        tensor, size=(target_h, target_w), mode="bilinear", antialias=True, align_corners=False
    )


def _make_thumbnail_tensor(image: Tensor, scale: float, multiple: int) -> Tensor:
    height, width = image.shape[:2]
    if scale >= 1.0:
        return image.permute(2, 0, 1).unsqueeze(0).float().div_(255.0)
    factor = max(1, int(1.0 / scale))
    reduced_h, reduced_w = height // factor, width // factor
    reduced = torch.empty((1, 3, reduced_h, reduced_w), dtype=torch.float32, device=image.device)
    rows_per_band = max(1, 32 // factor) * factor
    for y in range(0, reduced_h * factor, rows_per_band):
        band = image[y : min(y + rows_per_band, reduced_h * factor), : reduced_w * factor]
        band = band.permute(2, 0, 1).unsqueeze(0).float()
        reduced[:, :, y // factor : y // factor + band.shape[2] // factor] = F.avg_pool2d(band, factor)
    target_h = max(multiple, round(height * scale / multiple) * multiple)
    target_w = max(multiple, round(width * scale / multiple) * multiple)
    return F.interpolate(
        reduced.div_(255.0), size=(target_h, target_w), mode="bilinear", antialias=True, align_corners=False
    )


def to_uint8(x: Tensor) -> Tensor:
    return x.clamp_(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)


# -------------------------------------------------------------------------------------------- tiled stylize


def upload(tensor: Tensor, device: torch.device) -> Tensor:
    """`tensor` on `device`. A host tensor goes to a CUDA device from pinned memory, asynchronously: an ordinary
    (blocking) host-to-device copy synchronises its stream, so it would wait for every network queued before it."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def read_tile_tensor(image: Tensor, y: int, x: int, height: int, width: int) -> Tensor:
    """`read_tile` for an (H, W, 3) uint8 tensor already on the device: the same pixels, cut on the device."""
    rows = _reflect_indices(y, height, image.shape[0])
    cols = _reflect_indices(x, width, image.shape[1])
    if isinstance(rows, np.ndarray):
        rows = upload(torch.from_numpy(rows), image.device)
    if isinstance(cols, np.ndarray):
        cols = upload(torch.from_numpy(cols), image.device)
    patch = image[rows][:, cols] if isinstance(rows, Tensor) else image[rows, cols]
    return patch.permute(2, 0, 1).float().div_(255.0)


@torch.inference_mode()
def stylize_tiled(
    model: nn.Module,
    image: np.ndarray | Tensor,
    *,
    tile: int | str = 512,
    overlap: int = 64,
    batch_size: int = 4,
    thumbnail_size: int = 1024,
    precision: str = "32-true",
    device: str | torch.device = "cpu",
    channels_last: bool = True,
    thumbnail_statistics: bool = True,
    on_tiles_done: Callable[[int, int], None] | None = None,
    pipeline: str = "auto",
    memory_fraction: float = 0.9,
    budget_bytes: int | None = None,
    times: StageTimes | None = None,
    return_tensor: bool = False,
    compile: bool = False,
    compile_mode: str = "default",
    plan_cache: dict[tuple, float] | None = None,
) -> np.ndarray | Tensor:
    """Stylize an (H, W, 3) uint8 image of any size with overlapping tiles; returns (H, W, 3) uint8.

    image: a numpy array, or a uint8 tensor (decoded on the device by nvJPEG: the device pipeline then skips the
      copy in). return_tensor: return the result as a tensor where the pipeline left it (on the device for
      pipeline="device": encoded there by nvJPEG, no copy out) instead of a numpy array.

    model: one-input stylizer, float (B, 3, h, w) in [0, 1] -> same size (TransformerNet, AdaINNet.bind_style(...)).
      It is put in eval mode and moved to `device` (and channels_last) in place.
    tile: tile side in pixels (rounded up to the model's `size_multiple`), or "auto": the largest that fits the
      memory budget (`plan_tiles`; `budget_bytes` overrides the measured free memory x `memory_fraction`), the
      whole image when it fits. overlap: minimum overlap of neighbouring tiles in pixels.
    batch_size: tiles per forward pass. thumbnail_size: longest side of the statistics thumbnail; images no larger
      than it take their statistics from the full image, exactly like whole-image inference.
    thumbnail_statistics=False gives each tile its own statistics (the naive baseline: visible blocks).
    pipeline: "device" keeps the image, tiles, blend and output on `device` until one copy back; "host" reads tiles
      from the numpy image one by one (bounded host memory); "auto" = device on CUDA, host otherwise.
    on_tiles_done(done, total): progress callback after every batch. times: filled with the stages' seconds.
    compile: run the tiles through `compiled_tiles(model)`, for a declared set of shapes only, so that an image's
      pixels never depend on the images stylized before it: every image larger than the declared tile T (`tile`, or
      for "auto" the planned side rounded down to a power of two, at most COMPILED_MAX_AUTO_TILE) is cut into T x T
      tiles, run compiled in batches of `batch_size` and the rest one by one (two graphs per T, compiled by the
      first image that needs them); an image that fits in one tile, or is narrower than T, runs eagerly whole or in
      its own tiles, exactly as without compile. Torch's recompile limit (a count over the images seen) then never
      decides which path an image takes. compile_mode: torch.compile's mode for them (default; max-autotune-no-cudagraphs
      autotunes the convolutions and Triton kernels; max-autotune and reduce-overhead also capture CUDA graphs).
    plan_cache: a dict the caller keeps for a job of many images: tile="auto"'s measurements (`bytes_per_pixel`,
      which on CUDA runs probe forwards and waits for the device, and `memory_budget`) are made for the first
      image and reused for the others, so a folder's images are not serialised by them.
    """
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype not in (np.uint8, torch.uint8):
        raise ValueError(f"Expected an (H, W, 3) uint8 array, got shape {image.shape} dtype {image.dtype}.")
    multiple = int(getattr(model, "size_multiple", 1))
    height, width = image.shape[:2]
    if min(height, width) < max(multiple, 2):
        raise ValueError(
            f"Image of {width}x{height} px is too small to stylize (minimum {max(multiple, 2)} px)."
        )
    device = torch.device(device)
    if pipeline == "auto":
        pipeline = "device" if device.type == "cuda" else "host"
    if pipeline not in ("device", "host"):
        raise ValueError(f"pipeline={pipeline!r}: choose auto, device or host.")
    if isinstance(image, Tensor) and pipeline == "host":
        image = image.cpu().numpy()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model.eval().to(device=device, memory_format=memory_format)
    compiled_forward = compiled_tiles(model, compile_mode) if compile else None
    whole = False
    times_requested = times is not None
    times = times if times is not None else StageTimes()

    def _stylize_with(tile: int, whole: bool, overlap: int) -> np.ndarray:
        # Stage times need the device to finish each stage: only when the caller asked for them.
        sync = device if device.type == "cuda" and times_requested else None

        padded_h, padded_w = round_up(height, multiple), round_up(width, multiple)
        tile = round_up(tile, multiple)
        tile_h, tile_w = min(tile, padded_h), min(tile, padded_w)
        ys = tile_starts(padded_h, tile_h, overlap, multiple)
        xs = tile_starts(padded_w, tile_w, overlap, multiple)
        # Where the pixels live while they are worked on: the device (one upload, one download) or the host.
        work = device if pipeline == "device" else torch.device("cpu")
        # Made and summed on the host, then uploaded: reading device windows back would make the host wait for
        # every network queued on the device (the folder pipeline queues the next image's while one runs).
        host_windows_y = [tile_window(ys, i, tile_h) for i in range(len(ys))]
        host_windows_x = [tile_window(xs, j, tile_w) for j in range(len(xs))]
        sum_y = upload(window_sum(ys, host_windows_y, padded_h), work)
        sum_x = upload(window_sum(xs, host_windows_x, padded_w), work)
        windows_y = [upload(w, work) for w in host_windows_y]
        windows_x = [upload(w, work) for w in host_windows_x]

        with times.stage("copy_in", sync):
            if pipeline == "device" and isinstance(image, Tensor):
                source = image.to(device)  # decoded on the device already: nothing to copy
                output = torch.empty((height, width, 3), dtype=torch.uint8, device=device)
            elif pipeline == "device":
                source = upload(torch.from_numpy(image), device)
                output = torch.empty((height, width, 3), dtype=torch.uint8, device=device)
            else:
                source = image
                output_array = np.empty((height, width, 3), dtype=np.uint8)
                output = torch.from_numpy(output_array)  # shares memory: rows written here land in the array
        single = len(ys) == 1 and len(xs) == 1
        # Compiled only for the declared shapes: full tiles of the declared side (see the docstring).
        use_compiled = compiled_forward is not None and not single and tile_h == tile_w == declared_tile
        forward = compiled_forward if use_compiled else model
        # float32 accumulator for the current tile row (none for a single tile)
        band = torch.zeros(3, tile_h if not single else 0, padded_w, device=work)
        total_tiles, done = len(ys) * len(xs), 0

        with autocast_for(precision, device):
            if thumbnail_statistics and not whole:
                thumbnail = upload(make_thumbnail(image, thumbnail_size, multiple), device).to(
                    memory_format=memory_format
                )
                if use_compiled:
                    statistics_context = forward.frozen(record_instance_norm_statistics(model, thumbnail))
                else:
                    statistics_context = thumbnail_instance_norm(model, thumbnail)
            else:  # one tile covering the image takes its statistics from the image itself, as whole inference does
                statistics_context = nullcontext()
            with statistics_context:
                for row, y in enumerate(ys):
                    for first in range(0, len(xs), batch_size):
                        columns = list(range(first, min(first + batch_size, len(xs))))
                        with times.stage("copy_in", sync):
                            if pipeline == "device":
                                batch = torch.stack(
                                    [read_tile_tensor(source, y, xs[j], tile_h, tile_w) for j in columns]
                                )
                            else:
                                batch = torch.stack(
                                    [read_tile(source, y, xs[j], tile_h, tile_w) for j in columns]
                                )
                            batch = batch.to(device).contiguous(memory_format=memory_format)
                        with times.stage("network", sync):
                            if use_compiled and len(columns) != batch_size:
                                # A row's last, short batch: one tile at a time, a second declared shape.
                                result = torch.cat([forward(batch[k : k + 1]) for k in range(len(columns))])
                            else:
                                result = forward(batch)
                            result = result.float().to(work)
                        if result.shape[-2:] != (tile_h, tile_w):
                            raise ValueError(
                                f"The model changed the tile size {(tile_h, tile_w)} to {result.shape[-2:]}."
                            )
                        if single:  # the whole image in one tile: nothing to blend, straight to uint8
                            with times.stage("blend", sync):
                                output.copy_(to_uint8(result[0, :, :height, :width]).permute(1, 2, 0))
                            del batch, result
                            done += 1
                            if on_tiles_done is not None:
                                on_tiles_done(done, total_tiles)
                            continue
                        with times.stage("blend", sync):
                            for k, j in enumerate(columns):
                                weight = windows_y[row][:, None] * windows_x[j][None, :]
                                band[:, :, xs[j] : xs[j] + tile_w].addcmul_(result[k], weight)
                        del batch, result
                        done += len(columns)
                        if on_tiles_done is not None:
                            on_tiles_done(done, total_tiles)
                    if single:
                        continue
                    with times.stage("blend", sync):
                        # Rows before the next tile row's start receive no more contributions: finish and emit them.
                        finished = (ys[row + 1] - y) if row + 1 < len(ys) else tile_h
                        _emit_rows(band, output, y, min(finished, height - y), sum_y, sum_x)
                        # Carry the rows the next tile row overlaps (about `overlap` rows) to the top of the band.
                        carried = tile_h - finished
                        if carried > 0:
                            band[:, :carried] = band[:, finished:].clone()
                        band[:, carried:] = 0.0
        if pipeline == "host":
            return torch.from_numpy(output_array) if return_tensor else output_array
        if return_tensor:
            return output
        with times.stage("copy_out", sync):
            return output.cpu().numpy()

    def measured(key: tuple, measure: Callable[[], float]) -> float:
        if plan_cache is None:
            return measure()
        if key not in plan_cache:
            plan_cache[key] = measure()
        return plan_cache[key]

    def planning_figures() -> tuple[int, float]:
        """(budget bytes, network bytes per pixel) for tile="auto"."""
        budget = budget_bytes
        if budget is None:
            budget = int(
                measured(
                    ("memory_budget", str(device), memory_fraction),
                    lambda: memory_budget(device, memory_fraction),
                )
            )
        per_pixel = measured(
            ("bytes_per_pixel", id(model), str(device), precision, str(memory_format)),
            lambda: bytes_per_pixel(model, device, precision, memory_format=memory_format),
        )
        return budget, per_pixel

    auto = tile == "auto"
    # A planned tile that did not fit is halved; a tile the user fixed is not second-guessed.
    halve_on_oom = auto
    declared_tile = None  # the one tile side compiled tiles have (compile only)
    if compile:
        if auto:
            budget, per_pixel = planning_figures()
            widest = plan_tiles(
                1 << 20,
                1 << 20,  # an image too large to fit whole: the plan's tile side for this budget
                budget_bytes=budget,
                bytes_per_pixel=per_pixel,
                batch_size=batch_size,
                multiple=multiple,
            ).tile
            cap = COMPILED_MAX_AUTO_TILE.get(device.type, CPU_MAX_AUTO_TILE)
            tile = round_up(min(cap, 1 << (max(widest, 16).bit_length() - 1)), multiple)
            # An image that fits in one tile runs whole, as tile=auto takes it without compile (eagerly here).
            whole = max(round_up(height, multiple), round_up(width, multiple)) <= tile
            if not whole:
                overlap = min(overlap, tile // 4)
            auto = False  # the side is fixed for the job; no whole-image plan of this image's own
        declared_tile = round_up(tile, multiple)
    if auto:
        budget, per_pixel = planning_figures()
        plan = plan_tiles(
            height,
            width,
            budget_bytes=budget,
            bytes_per_pixel=per_pixel,
            batch_size=batch_size,
            multiple=multiple,
            image_on_device=pipeline == "device",
        )
        tile, whole = plan.tile, plan.whole
        if device.type == "cpu" and not whole:
            tile = min(tile, CPU_MAX_AUTO_TILE)
        if not whole:
            overlap = min(overlap, tile // 4)  # a small planned tile keeps room to advance
        log.info(
            "tile=auto for %dx%d on %s: %s (budget %.2f GB, %.0f bytes per pixel).",
            width,
            height,
            device,
            "the whole image" if whole else f"{tile}-px tiles",
            plan.budget_bytes / 1e9,
            plan.bytes_per_pixel,
        )
    if not isinstance(tile, int):
        raise ValueError(f"tile={tile!r}: a number of pixels or 'auto'.")
    if overlap < 0 or (overlap >= tile and not whole):
        raise ValueError(f"overlap={overlap} must be in [0, tile={tile}).")
    while True:
        try:
            return _stylize_with(tile, whole, overlap)
        except torch.OutOfMemoryError:
            # The plan is an estimate: an auto tile that did not fit is halved (a fixed tile is the user's call).
            smaller = round_up(max(16, tile // 2), multiple)
            if not halve_on_oom or smaller >= tile:
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            # Said, not silent: each retry costs a failed pass, and a smaller memory_fraction plans it right away.
            log.warning(
                "tile=auto: %s ran out of memory on %s; retrying with %d-px tiles.",
                "the whole image" if whole else f"{tile}-px tiles",
                device,
                smaller,
            )
            tile, whole, overlap = smaller, False, min(overlap, smaller // 4)
            if declared_tile is not None:
                declared_tile = tile  # an out-of-memory retry declares the smaller side instead


def _emit_rows(band: Tensor, output: Tensor, y: int, rows: int, sum_y: Tensor, sum_x: Tensor) -> None:
    """Normalise the first `rows` band rows by the blending weights and write them to output[y : y + rows] as
    uint8, in chunks so the float temporaries stay a few MB even for an 8K-wide band."""
    width = output.shape[1]
    chunk = 32
    for start in range(0, max(rows, 0), chunk):
        stop = min(start + chunk, rows)
        norm = sum_y[y + start : y + stop, None] * sum_x[None, :width]
        values = band[:, start:stop, :width] / norm
        output[y + start : y + stop] = to_uint8(values).permute(1, 2, 0)


@torch.inference_mode()
def stylize_whole(
    model: nn.Module, image: np.ndarray, precision: str = "32-true", device: str | torch.device = "cpu"
) -> np.ndarray:
    """Plain whole-image inference (the reference tiling is compared with): (H, W, 3) uint8 -> same."""
    model.eval().to(device=device, memory_format=torch.channels_last)
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1).unsqueeze(0).float().div_(255.0)
    with autocast_for(precision, device):
        y = model(x.to(device).contiguous(memory_format=torch.channels_last)).float().cpu()
    return to_uint8(y[0]).permute(1, 2, 0).numpy()
