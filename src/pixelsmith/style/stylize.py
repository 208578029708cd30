"""Stylize images (files or folders, any size) with a trained style model; the code behind `python stylize.py`.

Checkpoint contract (what `load_stylizer_from_checkpoint` reads; the style LightningModule writes it):
- `checkpoint["state_dict"]`: the LightningModule's state dict, containing
  - for a Johnson fast-style model: the TransformerNet under the prefix `stylizer.` (`stylizer.encoder.0.1.weight`),
  - for AdaIN: the AdaINDecoder under `decoder.` (`decoder.layers.1.weight`) and, optionally, the frozen VGG19
    encoder under `encoder.` (`encoder.features.0.weight`). Without `encoder.` keys the encoder is rebuilt from the
    VGG19 weights named by the config (torchvision cache or `model.loss_net.weights_path`), which then must exist.
- `checkpoint["pixelsmith_config"]["model"]`: the model config as a plain dict (OmegaConf.to_container). Read keys:
  `stylizer` (TransformerNet kwargs: base_channels, num_residual_blocks, output_activation), `decoder`
  (AdaINDecoder kwargs: width), `loss_net` (pretrained, weights_path; AdaIN without stored encoder only). Missing
  keys mean the defaults; keys starting with "_" (Hydra's `_target_`) are ignored.
- The file must load with `torch.load(weights_only=True)` (plain containers, tensors, numbers, strings); one that
  does not is refused in one paragraph, never unpickled in full (that can run code: `pixelsmith.safe_load`).

Image handling (choices documented for users in `--help`): EXIF orientation is applied; 16-bit inputs are reduced
to 8-bit with a warning (`high_bit_depth=refuse` refuses them); transparency is kept: the RGB is stylized and the
original alpha re-attached, unless the output format cannot store it (JPEG, BMP: dropped with a warning) or
`transparency=drop|refuse`. The ICC colour profile is passed through.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pixelsmith.config.argv_options import parse_key_values
from pixelsmith.config.stored import plain_tree
from pixelsmith.core.precision import AUTOCAST_DTYPES
from pixelsmith.errors import PixelsmithError, check_writable_folder
from pixelsmith.safe_load import NetworkMismatchError, build_to_fit, load_data_only
from pixelsmith.style.data import (
    IMAGE_EXTENSIONS,
    ImageNotFoundError,
    ImageReadError,
    load_style_image,
)
from pixelsmith.style.devices import DevicesError
from pixelsmith.style.fuse import pad_rgb_convolutions, resolve_pad_channels
from pixelsmith.style.loss_network import RandomLossNetworkWeightsWarning, VGGFeatures
from pixelsmith.style.networks import ADAIN_ENCODER_LAYERS, AdaINDecoder, AdaINNet, TransformerNet
from pixelsmith.style.pipeline import (
    AUTOTUNE_MODE,
    COMPILE_CHOICES,
    COMPILE_MODES,
    JPEG_CODECS,
    MIN_SIDE,
    FolderSummary,
    PipelineOptions,
    PngEncoderUnavailableError,
    check_jpeg_codec,
    check_png_encoder,
    compile_decision,
    compile_key,
    compile_marker,
    compile_mode_decision,
    default_workers,
    make_pool,
    network_flops_per_pixel,
    resolve_precision,
    run_pipeline,
)
from pixelsmith.style.tiling import StageTimes, _compiled_tiles


class CheckpointFormatError(RuntimeError):
    """The checkpoint does not follow the contract in this module's docstring."""


class StylizeInputError(ValueError):
    """Bad input/output paths or options for stylize; the message says what to change."""


# ---------------------------------------------------------------------------------------------- checkpoints


def _load_checkpoint_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(
            f"Checkpoint not found: {path} (resolved: {path.resolve()}). Training writes them to "
            "RUN_DIR/checkpoints/ (last.ckpt is the latest)."
        )
    # Data only, with no fallback: a checkpoint is a file a user hands us, and full unpickling can run its code.
    return load_data_only(
        path,
        "ckpt_path",
        "Give a checkpoint written by `python train.py experiment=style_fast` (or style_adain): its run dir's "
        "checkpoints/last.ckpt.",
    )


def _sub_state(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def _load_into(module: nn.Module, state: dict[str, torch.Tensor], what: str, path: Path) -> None:
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointFormatError(
            f"{path}: the {what} weights do not fit the network built from pixelsmith_config['model'] "
            f"(was the checkpoint written with a different architecture config?): {error}"
        ) from error


def _build_to_fit(build, state: dict[str, torch.Tensor], path: Path, what: str) -> nn.Module:
    try:
        return build_to_fit(build, state, str(path), what)
    except NetworkMismatchError as error:
        raise CheckpointFormatError(
            f"{error} (Was the checkpoint written with a different architecture config than its "
            "pixelsmith_config['model'] says?)"
        ) from None


def load_stylizer_from_checkpoint(path: str | Path) -> nn.Module:
    """TransformerNet or AdaINNet (eval mode, CPU) from a training checkpoint (contract: module docstring)."""
    path = Path(path)
    checkpoint = _load_checkpoint_file(path)
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise CheckpointFormatError(f"{path} has no 'state_dict': is it a Pixelsmith training checkpoint?")
    stored = checkpoint.get("pixelsmith_config")
    stored_model = stored.get("model") if isinstance(stored, dict) else None
    # Plain data within limits, checked before any value is used; the sizes it gives (widths, block counts) are
    # taken only when the file holds the tensors they make (safe_load.build_to_fit).
    model_config = plain_tree(stored_model if isinstance(stored_model, dict) else {}, str(path), "model")

    stylizer_state = _sub_state(state, "stylizer.")
    decoder_state = _sub_state(state, "decoder.")
    if stylizer_state:
        return _build_to_fit(
            lambda: TransformerNet.from_config(model_config.get("stylizer")),
            stylizer_state,
            path,
            "TransformerNet (stylizer.*)",
        ).eval()
    if decoder_state:
        decoder = _build_to_fit(
            lambda: AdaINDecoder.from_config(model_config.get("decoder")),
            decoder_state,
            path,
            "AdaIN decoder (decoder.*)",
        )
        encoder_state = _sub_state(state, "encoder.")
        if encoder_state:
            with warnings.catch_warnings():
                # Random init is overwritten from the checkpoint right below: the warning would be a false alarm.
                warnings.simplefilter("ignore", RandomLossNetworkWeightsWarning)
                encoder = VGGFeatures("vgg19", ADAIN_ENCODER_LAYERS, pretrained=False)
            _load_into(encoder, encoder_state, "AdaIN encoder (encoder.*)", path)
        else:
            loss_net = dict(model_config.get("loss_net") or {})
            encoder = VGGFeatures(
                "vgg19",
                ADAIN_ENCODER_LAYERS,
                pretrained=bool(loss_net.get("pretrained", True)),
                weights_path=loss_net.get("weights_path"),
            )
        return AdaINNet(encoder, decoder).eval()
    prefixes = sorted({key.split(".", 1)[0] for key in state})
    raise CheckpointFormatError(
        f"{path}: no stylizer in the state dict: expected keys starting with 'stylizer.' (fast style model) or "
        f"'decoder.' (AdaIN); found prefixes {prefixes}."
    )


def prepare_stylizer(
    model: nn.Module,
    style: str | Path | torch.Tensor | None = None,
    alpha: float = 1.0,
    style_size: int | None = 512,
) -> nn.Module:
    """The one-input module to tile: TransformerNet as is; AdaINNet bound to `style` (path or (3, H, W) tensor)."""
    if isinstance(model, AdaINNet):
        if style is None:
            raise StylizeInputError(
                "This is an AdaIN (arbitrary style) model: give the style image to apply, e.g. style=path/to/style.jpg."
            )
        image = style if isinstance(style, torch.Tensor) else load_style_image(style, style_size)
        return model.bind_style(image.unsqueeze(0) if image.dim() == 3 else image, alpha)
    if style is not None:
        warnings.warn("style= is ignored: this fast-style model has its style built in.", stacklevel=2)
    return model


# -------------------------------------------------------------------------------------------------- paths


class SkippedImagesError(StylizeInputError):
    """A folder run finished but some files could not be read; `written` and `skipped` list both."""

    def __init__(self, written: list[Path], skipped: list[Path]):
        super().__init__(f"{len(skipped)} unreadable file(s) skipped: {', '.join(map(str, skipped))}")
        self.written, self.skipped = written, skipped


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def plan_outputs(inputs: Path, output: Path, output_format: str = "same") -> list[tuple[Path, Path]]:
    """(input file, output file) pairs: file -> file (or into a folder), folder -> folder (tree mirrored).
    output_format: "same" keeps each input's extension in a folder; png, jpg, webp, ... writes that format."""
    if output_format != "same":
        suffix = "." + output_format.lower().lstrip(".")
        if suffix not in IMAGE_EXTENSIONS:
            raise StylizeInputError(
                f"format={output_format}: choose same or one of {', '.join(e[1:] for e in IMAGE_EXTENSIONS)}."
            )
        return [
            (s, t if t.suffix.lower() == suffix else t.with_suffix(suffix))
            for s, t in plan_outputs(inputs, output)
        ]
    if not inputs.exists():
        raise ImageNotFoundError(f"Input not found: {inputs} (resolved: {inputs.resolve()}).")
    if inputs.is_file():
        if output.is_dir() or not output.suffix:
            return [(inputs, output / inputs.name)]
        if not _is_image(output):
            raise StylizeInputError(
                f"output={output}: unknown image extension '{output.suffix}'; use one of {', '.join(IMAGE_EXTENSIONS)}."
            )
        return [(inputs, output)]
    if output.is_file() or (output.suffix and _is_image(output)):
        raise StylizeInputError(f"input={inputs} is a folder, so output must be a folder too (got {output}).")
    files = sorted(p for p in inputs.rglob("*") if p.is_file() and _is_image(p))
    if not files:
        raise StylizeInputError(f"No images ({', '.join(IMAGE_EXTENSIONS)}) found in {inputs.resolve()}.")
    return [(file, output / file.relative_to(inputs)) for file in files]


# ------------------------------------------------------------------------------------------------ stylize


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise StylizeInputError(f"device={device} but CUDA is not available here; use device=cpu (or auto).")
    return device


def _check_tile(tile: int | str) -> int | str:
    if isinstance(tile, str):
        if tile.strip().lower() == "auto":
            return "auto"
        try:
            tile = int(tile)
        except ValueError:
            raise StylizeInputError(f"tile={tile!r}: a number of pixels or auto.") from None
    if tile < MIN_SIDE:
        raise StylizeInputError(f"tile={tile} must be at least {MIN_SIDE} (or auto; default: see --help).")
    return tile


def stylize_paths(
    model: nn.Module,
    inputs: str | Path,
    output: str | Path,
    tile: int | str = "auto",
    overlap: int = 64,
    precision: str = "32-true",
    device: str = "cpu",
    *,
    style: str | Path | torch.Tensor | None = None,
    alpha: float = 1.0,
    style_size: int | None = 512,
    tile_batch: int = 4,
    thumbnail: int = 1024,
    high_bit_depth: str = "convert",
    transparency: str = "keep",
    overwrite: bool = True,
    progress: bool = True,
    memory_fraction: float = 0.9,
    prefetch: bool = True,
    times: StageTimes | None = None,
    workers: int | None = None,
    png_compress_level: int = 6,
    jpeg_codec: str = "auto",
    compile: str = "auto",
    summary_out: list[FolderSummary] | None = None,
    png_encoder: str = "auto",
    png_threads: int | str = "auto",
    compile_mode: str = "auto",
    pad_channels: int | str = "auto",
    compile_cache_dir: str | None = None,
    output_format: str = "same",
) -> list[Path]:
    """Stylize one image file or every image under a folder; returns the written files.

    model: TransformerNet, AdaINNet (needs `style`, blended with `alpha`), or any one-input stylizer module.
    tile/overlap/tile_batch/thumbnail/memory_fraction: see `tiling.stylize_tiled` (tile="auto" picks the largest
    tile the free memory holds, the whole image when it fits). precision: 32-true | bf16-mixed | 16-mixed.
    high_bit_depth: convert | refuse. transparency: keep | drop | refuse.
    prefetch: with a folder, decode upcoming files and encode finished ones in codec worker processes (a GPU's
    encodes in threads of this process) while the network runs (`pipeline.run_pipeline`); false: decode and encode
    inline in this process.
    workers: codec processes (default: this process's cores, less one on a CPU device; 0: inline).
    png_compress_level: 0-9 for PNG outputs. jpeg_codec: auto (the device's nvJPEG on CUDA, Pillow otherwise) | pil
    | torchvision (torchvision's decode_jpeg/encode_jpeg on the run's device, libjpeg-turbo on a CPU).
    compile: auto | true | false: full tiles of one declared side through torch.compile (`tiling.stylize_tiled`);
    auto compiles where it pays back (`pipeline.compile_decision`). compile_mode: torch.compile's mode; auto
    autotunes on a GPU where that pays back (`pipeline.compile_mode_decision`).
    compile_cache_dir: torch's compile cache (None: `hardware.compile_cache_dir`'s default).
    png_encoder: auto | threaded | pil | fpng; png_threads: threads per PNG (auto: the cores over the encodes in
    flight). pad_channels: auto | 0 | 4 | 8: the 3-channel convolutions widened with zeros (`fuse`).
    times: filled with the seconds per stage (decode, copy in, network, blend, copy out, encode).
    summary_out: receives the run's `FolderSummary` (images/s, FLOPs, MFU, failures).
    """
    if transparency not in ("keep", "drop", "refuse"):
        raise StylizeInputError(f"transparency={transparency!r}; choose keep, drop or refuse.")
    tile = _check_tile(tile)
    if overlap < 0 or (isinstance(tile, int) and overlap >= tile):
        raise StylizeInputError(
            f"overlap={overlap} must be smaller than tile={tile} (about tile/8 works well)."
        )
    if high_bit_depth not in ("convert", "refuse"):
        raise StylizeInputError(f"high_bit_depth={high_bit_depth!r}; choose convert or refuse.")
    if precision != "auto" and precision not in AUTOCAST_DTYPES:
        raise StylizeInputError(
            f"precision={precision!r} is unknown; choose auto or one of {', '.join(AUTOCAST_DTYPES)}."
        )
    for name, value, least in (("tile_batch", tile_batch, 1), ("thumbnail", thumbnail, 16)):
        if value < least:
            raise StylizeInputError(f"{name}={value} must be at least {least} (default: see --help).")
    if not 0.0 <= alpha <= 1.0:
        raise StylizeInputError(f"alpha={alpha} must be in [0, 1] (1 = full style, 0 = the content image).")
    if not 0.0 < memory_fraction <= 1.0:
        raise StylizeInputError(
            f"memory_fraction={memory_fraction} must be in (0, 1] (the share of free memory)."
        )
    if not 0 <= png_compress_level <= 9:
        raise StylizeInputError(
            f"png_compress_level={png_compress_level} must be in 0..9 (0: none, 9: smallest)."
        )
    if jpeg_codec not in JPEG_CODECS:
        raise StylizeInputError(f"jpeg_codec={jpeg_codec!r}; choose one of {', '.join(JPEG_CODECS)}.")
    if compile not in COMPILE_CHOICES:
        raise StylizeInputError(f"compile={compile!r}; choose one of {', '.join(COMPILE_CHOICES)}.")
    check_speed_options(png_encoder, png_threads, compile_mode, pad_channels)
    stylizer = prepare_stylizer(model, style, alpha, style_size)
    pairs = plan_outputs(Path(inputs), Path(output), output_format)
    summary = stylize_shard(
        stylizer,
        pairs,
        resolve_device(device),
        PipelineOptions(
            tile=tile,
            overlap=overlap,
            tile_batch=tile_batch,
            thumbnail=thumbnail,
            precision=precision,
            transparency=transparency,
            high_bit_depth=high_bit_depth,
            memory_fraction=memory_fraction,
            png_compress_level=png_compress_level,
            jpeg_codec=jpeg_codec,
            compile=compile,
            compile_mode=compile_mode,
            png_encoder=png_encoder,
            png_threads=_threads(png_threads),
        ),
        overwrite=overwrite,
        workers=workers if workers is not None else (None if prefetch else 0),
        progress=progress,
        times=times,
        single_input=Path(inputs).is_file(),
        pad_channels=pad_channels,
        compile_cache_dir=compile_cache_dir,
    )
    if summary_out is not None:
        summary_out.append(summary)
    if summary.failed:
        raise SkippedImagesError([Path(p) for p in summary.written], [Path(p) for p in summary.failed])
    return [Path(p) for p in summary.written]


def stylize_shard(
    stylizer: nn.Module,
    pairs: list[tuple[Path, Path]],
    device: str | torch.device,
    options: PipelineOptions,
    *,
    overwrite: bool = True,
    workers: int | None = None,
    progress: bool = True,
    times: StageTimes | None = None,
    single_input: bool = False,
    rank: int = 0,
    world_size: int = 1,
    pad_channels: int | str = "auto",
    compile_cache_dir: str | None = None,
) -> FolderSummary:
    """One device's share of a job: the pairs `rank::world_size` (sorted input order, so every file goes to exactly
    one rank), those already written skipped when `overwrite` is false, through `pipeline.run_pipeline`.
    workers: codec processes (None: `default_workers`, 0: inline). single_input: a failure is raised, not recorded.
    pad_channels: `fuse.resolve_pad_channels`. compile_cache_dir: where torch's compile cache and this job's marks
    of what it compiled live (None: `hardware.compile_cache_dir`'s default)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from pixelsmith.hardware.settings import compile_cache_dir as resolve_cache_dir
    from pixelsmith.hardware.settings import use_compile_cache

    device = torch.device(device)
    try:
        check_jpeg_codec(options.jpeg_codec, device)
    except ValueError as error:
        raise StylizeInputError(str(error)) from None
    options = dataclasses.replace(options, precision=resolve_precision(options.precision, device))
    padding = resolve_pad_channels(pad_channels, device)
    unpadded, stylizer = stylizer, pad_rgb_convolutions(stylizer, padding)
    # compile=auto is decided on the whole job, not on this rank's share: every rank, and one process given the same
    # folder, then runs the same code and writes the same pixels. A compile an earlier run cached decides it too.
    cache = resolve_cache_dir(compile_cache_dir)

    def marker_for(mode: str) -> Path:
        return compile_marker(
            cache, compile_key(stylizer, device, options.precision, mode, options.tile_batch, padding)
        )

    mode, mode_reason = compile_mode_decision(
        options.compile_mode, device, len(pairs), autotuned_cached=marker_for(AUTOTUNE_MODE).is_file()
    )
    options = dataclasses.replace(options, compile_mode=mode)
    marker = marker_for(mode)
    compiled, reason = compile_decision(options.compile, device, len(pairs), cached=marker.is_file())
    if compiled:
        use_compile_cache(compile_cache_dir)
        reason += f" (compile cache {cache}); {mode_reason}"
    if rank == 0:
        print(reason, file=sys.stderr)
    options = dataclasses.replace(options, compile="true" if compiled else "false")
    shard = pairs[rank::world_size]
    todo = [(s, t) for s, t in shard if overwrite or not t.exists()]
    if workers is None:
        workers = default_workers(device, world_size) if len(todo) > 1 else 0
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    failures: list = []
    start = time.perf_counter()
    pool = make_pool(workers)  # before the network touches the device: the workers fork from a clean server
    try:
        # The network's own FLOPs: the zero channels padding adds are not work done for the image.
        flops_per_pixel = network_flops_per_pixel(unpadded) if todo else 0.0
        with Progress(*columns, disable=not progress, transient=False) as bar:
            label = "images" if world_size == 1 else f"images (rank {rank} of {world_size}, {device})"
            files_task = bar.add_task(label, total=len(todo), visible=len(todo) > 1, rate="")
            tiles_task = bar.add_task("tiles", total=None, visible=False, rate="")

            def on_image_done(source: Path, target: Path | None) -> None:
                bar.advance(files_task)
                done = bar.tasks[files_task].completed
                bar.update(files_task, rate=f"{done / max(time.perf_counter() - start, 1e-9):.2f} img/s")

            def on_tiles_done(done: int, total: int) -> None:
                bar.update(tiles_task, completed=done, total=total, visible=total > 1)

            summary = run_pipeline(
                stylizer,
                todo,
                device,
                options,
                pool,
                times=times,
                on_image_done=on_image_done,
                on_tiles_done=on_tiles_done,
                failures=failures,
            )
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if single_input and failures:
        raise failures[0].error
    summary.notes.insert(0, reason)
    tiles = _compiled_tiles.get(stylizer)
    if (
        compiled
        and tiles is not None
        and tiles.ran_compiled
        and tiles.failure is None
        and not marker.is_file()
    ):
        # The next run with these settings finds its graphs in the cache: compile=auto takes them for one image too.
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{type(stylizer).__name__} {options.compile_mode} {options.precision} {device}\n")
    summary.existing = len(shard) - len(todo)
    summary.flops_per_pixel = flops_per_pixel
    if summary.written:
        from pixelsmith.perf.flops import device_peak_flops

        try:
            peak, key, source = device_peak_flops(device, options.precision)
        except Exception as error:  # noqa: BLE001  (MFU is a report, never a reason to fail a finished job)
            peak, key, source = None, "", f"no peak: {error}"
        summary.peak_flops, summary.peak_source = peak, f"{key} peak: {source}"
    return summary


# ---------------------------------------------------------------------------------------------------- CLI


@dataclasses.dataclass
class StylizeOptions:
    ckpt_path: str | None = None
    input: str | None = None
    output: str | None = None
    style: str | None = None
    alpha: float = 1.0
    style_size: int = 512
    tile: int | str = "auto"
    overlap: int = 64
    tile_batch: int = 4
    thumbnail: int = 1024
    precision: str = "auto"
    device: str = "auto"
    high_bit_depth: str = "convert"
    transparency: str = "keep"
    overwrite: bool = True
    progress: bool = True
    memory_fraction: float = 0.9
    prefetch: bool = True
    devices: int | str = 1
    workers: int | str = "auto"
    png_compress_level: int = 6
    jpeg_codec: str = "auto"
    compile: str = "auto"
    compile_mode: str = "auto"
    compile_cache_dir: str | None = None
    png_encoder: str = "auto"
    png_threads: int | str = "auto"
    pad_channels: int | str = "auto"
    format: str = "same"
    export_dir: str | None = None
    export_formats: str = "torchscript,onnx"


HELP = """\
Stylize photos with a style model trained by `python train.py experiment=style_fast` (or style_adain).

Usage:
  python stylize.py ckpt_path=RUN/checkpoints/last.ckpt input=IN output=OUT [key=value ...]

  IN and OUT are an image file each, or a folder each (every image under IN is stylized into the same
  relative path under OUT). Images of any size work: big ones are processed in overlapping tiles that
  are blended together, using colour statistics from a small preview of the whole image, so there are
  no visible seams and memory stays bounded (an 8K photo needs no more RAM for the network than a 2K one).

Examples:
  python stylize.py ckpt_path=outputs/2025-01-01/12-00-00/checkpoints/last.ckpt input=photo.jpg output=out.jpg
  python stylize.py ckpt_path=RUN/checkpoints/last.ckpt input=photos/ output=stylized/ device=cuda precision=bf16-mixed
  python stylize.py ckpt_path=ADAIN_RUN/checkpoints/last.ckpt input=photo.jpg output=out.png style=starry.jpg alpha=0.7
  python stylize.py ckpt_path=RUN/checkpoints/last.ckpt export_dir=exported/    (TorchScript + ONNX files)

Options (key=value, defaults in brackets):
  ckpt_path       training checkpoint to load (required)
  input, output   image file or folder (both required unless you only export)
  style           AdaIN models only: the style image to apply (any image file)
  alpha           AdaIN only: style strength, 0 = original content .. 1 = full style [1.0]
  style_size      AdaIN only: the style image's shorter side is resized to this many pixels [512]
  tile            tile side in pixels, or auto: the largest tile the free memory holds (on a GPU the free
                  memory x memory_fraction; on a CPU 1 GB and at most 512), the whole image when it fits [auto]
  overlap         pixels shared by neighbouring tiles, blended smoothly [64]
  tile_batch      tiles processed together; higher is faster on a GPU, uses more memory [4]
  thumbnail       longest side of the preview the colour statistics come from [1024]
  precision       auto | 32-true | bf16-mixed | 16-mixed: auto is bf16-mixed where it is the faster path
                  (a GPU with bf16; a CPU with AMX), else 32-true [auto]
  device          auto | cpu | cuda | cuda:1 ... [auto]
  high_bit_depth  convert | refuse: 16-bit images are reduced to 8-bit with a warning, or refused [convert]
  transparency    keep | drop | refuse: PNG/WebP/TIFF keep the alpha channel of the input (the colours
                  are stylized, the alpha is copied); JPEG cannot store it, so it is dropped with a warning [keep]
  overwrite       true | false: replace existing output files [true]
  progress        true | false: show progress bars [true]
  memory_fraction share of the free GPU memory tile=auto may plan for [0.9]
  prefetch        true | false: with a folder, decode upcoming images and encode finished ones in worker
                  processes (on a GPU, encodes in threads) while the network runs [true]
  devices         N | all: one process per device (cuda:0..N-1; with device=cpu, N CPU processes), the
                  files split between them; torchrun --nproc-per-node N works too [1]
  workers         codec worker processes per device, or auto: the cores per device, less one on a CPU [auto]
  format          same | png | jpg | webp ...: the output format of a folder's images [same]
  png_compress_level  0-9 for PNG outputs: 1 is several times faster than 6 for ~15% larger files [6]
  png_encoder     auto | threaded | pil | fpng: auto is threaded, one PNG deflated in strips on several cores
                  (zlib-ng where installed); fpng (pip install fpng) is fastest at one fixed ~level-1 setting;
                  pil is Pillow on one core. All write standard PNGs [auto]
  png_threads     threads per PNG, or auto: the cores shared by the PNGs being encoded at once [auto]
  jpeg_codec      auto | pil | torchvision | nvimgcodec: JPEG decoded and encoded on the device (nvJPEG) with auto on a
                  GPU, with Pillow in the workers otherwise [auto]
  compile         auto | true | false: run full tiles of one declared side through torch.compile (an image
                  larger than it is tiled at it, one that fits runs eagerly whole), so an image's pixels never
                  depend on the images before it; auto: where it pays back: 2 or more images on a GPU, 8 or more on
                  a CPU (the compile costs about 15 s on 2 cores), or any count once an earlier run with the same
                  settings left its compile in the cache; the log says which [auto]
  compile_mode    auto | default | max-autotune-no-cudagraphs | max-autotune | reduce-overhead: torch.compile's
                  mode (the autotuning ones take longer to compile, then run faster; the last two add CUDA graphs);
                  auto: max-autotune-no-cudagraphs on a GPU from 1000 images or once an earlier run cached it,
                  default otherwise; the log says which [auto]
  compile_cache_dir  torch.compile's on-disk cache, shared by runs [~/.cache/pixelsmith/compile]
  pad_channels    auto | 0 | 4 | 8: the 3-channel first and last convolutions widened with zero channels for
                  tensor cores (the same output); auto: 8 on a GPU, off on a CPU [auto]
  export_dir      also write the model to this folder as stylizer.pt (TorchScript) and stylizer.onnx
  export_formats  comma-separated subset of torchscript,onnx [torchscript,onnx]

Photos are turned upright using their EXIF orientation; colour profiles are kept. Outputs are written
atomically: after a kill, overwrite=false does only the files that are missing. A file that fails is named at
the end, the others are written, and the exit status is 1.
"""


def parse_args(argv: Sequence[str]) -> StylizeOptions:
    """Hydra-style `key=value` arguments (a leading `--` or `+` is tolerated) into StylizeOptions."""
    return parse_key_values(argv, StylizeOptions, StylizeInputError, "stylize.py")


def run_job(options: StylizeOptions, device: str, rank: int = 0, world_size: int = 1) -> FolderSummary:
    """One process's part of a `python stylize.py` job: load the model, plan every (input, output) pair, and
    stylize the shard `rank::world_size` on `device` (`stylize_shard`)."""
    model = load_stylizer_from_checkpoint(options.ckpt_path)
    stylizer = prepare_stylizer(model, options.style, options.alpha, options.style_size)
    tile = _check_tile(options.tile)
    workers = None if str(options.workers).lower() == "auto" else int(options.workers)
    if workers is not None and workers < 0:
        raise StylizeInputError(f"workers={workers} must be >= 0 (0: decode and encode inline) or auto.")
    if not options.prefetch:
        workers = 0
    return stylize_shard(
        stylizer,
        plan_outputs(Path(options.input), Path(options.output), options.format),
        resolve_device(device),
        PipelineOptions(
            tile=tile,
            overlap=options.overlap,
            tile_batch=options.tile_batch,
            thumbnail=options.thumbnail,
            precision=options.precision,
            transparency=options.transparency,
            high_bit_depth=options.high_bit_depth,
            memory_fraction=options.memory_fraction,
            png_compress_level=options.png_compress_level,
            jpeg_codec=options.jpeg_codec,
            compile=str(options.compile).lower(),
            compile_mode=options.compile_mode,
            png_encoder=options.png_encoder,
            png_threads=_threads(options.png_threads),
        ),
        overwrite=options.overwrite,
        workers=workers,
        progress=options.progress and rank == 0,
        rank=rank,
        world_size=world_size,
        pad_channels=options.pad_channels,
        compile_cache_dir=options.compile_cache_dir,
    )


def _run_devices(options: StylizeOptions) -> int:
    """A folder or file job over one or more devices (processes); prints the merged summary; the exit status."""
    from pixelsmith.style.devices import launch, resolve_devices, run_rank, torchrun_rank

    # Checked once here, before any process starts: a bad value is one line, not N tracebacks.
    stylize_paths_checks(options)
    plan_outputs(Path(options.input), Path(options.output), options.format)
    ranked = torchrun_rank()
    if ranked is not None:
        rank, world, local_rank = ranked
        device = resolve_device(options.device)
        device = f"cuda:{local_rank}" if device.startswith("cuda") else "cpu"
        summary = run_rank(run_job, options, device, rank, world, "env://")
        if rank != 0:
            return 1 if summary.failed else 0
    else:
        devices = resolve_devices(options.devices, options.device)
        summary = run_job(options, devices[0]) if len(devices) == 1 else launch(run_job, options, devices)
    for line in summary.lines():
        print(line, file=sys.stderr if line.startswith(("FAILED", "  ")) else sys.stdout)
    return 1 if summary.failed else 0


def stylize_paths_checks(options: StylizeOptions) -> None:
    """The option checks `stylize_paths` makes, for a job about to start processes."""
    _check_tile(options.tile)
    workers = str(options.workers).strip().lower()
    if workers != "auto" and not (workers.isdigit() and int(workers) >= 0):
        raise StylizeInputError(
            f"workers={options.workers}: give the codec worker processes per device, 0 or more (0: decode and "
            "encode inline), or auto."
        )
    if not 0 <= options.png_compress_level <= 9:
        raise StylizeInputError(
            f"png_compress_level={options.png_compress_level} must be in 0..9 (0: none, 9: smallest)."
        )
    if options.jpeg_codec not in JPEG_CODECS:
        raise StylizeInputError(f"jpeg_codec={options.jpeg_codec!r}; choose one of {', '.join(JPEG_CODECS)}.")
    if str(options.compile).lower() not in COMPILE_CHOICES:
        raise StylizeInputError(f"compile={options.compile!r}; choose one of {', '.join(COMPILE_CHOICES)}.")
    if options.precision != "auto" and options.precision not in AUTOCAST_DTYPES:
        raise StylizeInputError(
            f"precision={options.precision!r} is unknown; choose auto or one of {', '.join(AUTOCAST_DTYPES)}."
        )
    for name, value, least in (("tile_batch", options.tile_batch, 1), ("thumbnail", options.thumbnail, 16)):
        if value < least:
            raise StylizeInputError(f"{name}={value} must be at least {least} (default: see --help).")
    check_speed_options(options.png_encoder, options.png_threads, options.compile_mode, options.pad_channels)
    try:
        check_jpeg_codec(options.jpeg_codec, torch.device(resolve_device(options.device)))
    except ValueError as error:
        raise StylizeInputError(str(error)) from None


def _threads(value: int | str) -> int | None:
    return None if str(value).strip().lower() == "auto" else int(value)


def check_speed_options(
    png_encoder: str, png_threads: int | str, compile_mode: str, pad_channels: int | str
) -> None:
    """The PNG encoder, compile mode and channel padding checked at start-up, one paragraph per mistake."""
    try:
        check_png_encoder(png_encoder)
        resolve_pad_channels(pad_channels, torch.device("cpu"))
    except (ValueError, PngEncoderUnavailableError) as error:
        raise StylizeInputError(str(error)) from None
    if compile_mode not in COMPILE_MODES:
        raise StylizeInputError(f"compile_mode={compile_mode!r}; choose one of {', '.join(COMPILE_MODES)}.")
    text = str(png_threads).strip().lower()
    if text != "auto" and not (text.isdigit() and int(text) >= 1):
        raise StylizeInputError(f"png_threads={png_threads!r}: a number of threads (1 or more) or auto.")


def check_destinations(options: StylizeOptions) -> None:
    """Refuse an output (or export_dir) this process cannot write, at start-up: a read-only filesystem or a file where
    a folder should be would otherwise fail only when the first image is written."""
    if options.output is not None:
        output = Path(options.output)
        into_folder = output.is_dir() or not output.suffix or Path(options.input or "").is_dir()
        check_writable_folder(
            output if into_folder else output.parent,
            "output",
            "choose an output you can write (output=<a file or folder on a writable disk>).",
        )
    if options.export_dir is not None:
        check_writable_folder(
            options.export_dir, "export_dir", "choose a folder you can write (export_dir=...)."
        )


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of an existing file: one file under two names (a hard link, a case-insensitive filesystem's
    other spelling) has one id."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _inside(path: Path, folder: Path) -> bool:
    resolved, root = path.resolve(), folder.resolve()
    folder_id = _file_id(folder)
    return (
        resolved == root
        or root in resolved.parents
        or (folder_id is not None and _file_id(path) == folder_id)
    )


def _refuse_colliding_outputs(pairs: list[tuple[Path, Path]], options: StylizeOptions) -> None:
    """Two inputs planned onto one output (a.jpg and a.png with format=png) would leave one result silently lost."""
    seen: dict[Path, Path] = {}
    for source, target in pairs:
        first = seen.setdefault(target.resolve(), source)
        if first != source:
            raise StylizeInputError(
                f"input={options.input} holds {first.name} and {source.name}, which would both be written to "
                f"{target} (format={options.format}): one result would be lost. Nothing was written. Use format=same "
                "(each keeps its own extension), or stylize them in two runs with different outputs."
            )


def check_outputs_spare_inputs(options: StylizeOptions) -> None:
    """Refuse, at start-up, an output that is or lies inside one of the command's inputs (the photos, the style
    image, the checkpoint): `input=p.png output=p.png` would replace the photo with its stylized version, and
    `input=dir output=dir` (or an output folder inside the input folder) every original, or feed a later run its
    own outputs. Also an export that would replace the checkpoint. Compared by resolved path and, for files that
    exist, by (device, inode): one stat per file."""
    sources: list[tuple[str, Path]] = [("ckpt_path", Path(options.ckpt_path or "").expanduser())]
    if options.style is not None:
        sources.append(("style", Path(options.style).expanduser()))
    planned: list[tuple[str, Path]] = []
    if options.input is not None and options.output is not None:
        inputs, output = Path(options.input).expanduser(), Path(options.output).expanduser()
        if inputs.is_dir() and _inside(output, inputs):
            where = "the input folder" if _file_id(output) == _file_id(inputs) else "inside the input folder"
            raise StylizeInputError(
                f"output={options.output} is {where} input={options.input}: its stylized images would replace the "
                "originals, or be stylized again by the next run. Nothing was written. Give an output folder "
                f"outside it, e.g. output={inputs.resolve().parent / (inputs.resolve().name + '_stylized')}."
            )
        try:
            pairs = plan_outputs(inputs, output, options.format)
        except (StylizeInputError, ImageReadError):
            pairs = []  # no input, or no images in it: said where the job plans its outputs, as before
        sources += [("input", source) for source, _ in pairs]
        planned += [("output", target) for _, target in pairs]
        _refuse_colliding_outputs(pairs, options)
    if options.export_dir is not None:
        folder = Path(options.export_dir).expanduser()
        planned += [("export_dir", folder / f"stylizer{suffix}") for suffix in (".pt", ".onnx")]
    by_path = {source.resolve(): (key, source) for key, source in sources}
    by_id = {file_id: (key, source) for key, source in sources if (file_id := _file_id(source)) is not None}
    for key, target in planned:
        hit = by_path.get(target.resolve()) or by_id.get(_file_id(target))
        if hit is None:
            continue
        source_key, source = hit
        instead = (
            f"output={target.with_name(target.stem + '_stylized' + target.suffix)}, or a folder outside the inputs"
            if key == "output"
            else "export_dir=<a folder of its own>"
        )
        raise StylizeInputError(
            f"{key}={target} would overwrite {source_key}={source}, one of this command's inputs: stylize.py never "
            f"replaces what it reads. Nothing was written. Give an output of its own, e.g. {instead}."
        )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help", "help") for a in argv):
        print(HELP)
        return 0
    try:
        options = parse_args(argv)
        if options.ckpt_path is None:
            raise StylizeInputError("ckpt_path=... is required (a checkpoint written by train.py).")
        if options.export_dir is None and (options.input is None or options.output is None):
            raise StylizeInputError(
                "input=... and output=... are required (or export_dir=... to only export)."
            )
        check_destinations(options)  # before the model loads and any image is read: minutes may follow
        if options.input is not None:
            stylize_paths_checks(
                options
            )  # a bad option or a codec not installed: said before the model loads
        check_outputs_spare_inputs(options)
        model = load_stylizer_from_checkpoint(options.ckpt_path)
        if options.export_dir is not None:
            from pixelsmith.style.export import export_stylizer

            stylizer = prepare_stylizer(model, options.style, options.alpha, options.style_size)
            formats = tuple(f.strip() for f in options.export_formats.split(",") if f.strip())
            for fmt, path in export_stylizer(stylizer, options.export_dir, formats=formats).items():
                print(f"exported {fmt}: {path}")
        if options.input is not None and options.output is not None:
            if Path(options.input).is_dir() or str(options.devices) != "1" or "WORLD_SIZE" in os.environ:
                return _run_devices(options)
            start = time.perf_counter()
            times = StageTimes()
            written = stylize_paths(
                model,
                options.input,
                options.output,
                options.tile,
                options.overlap,
                options.precision,
                options.device,
                style=options.style,
                alpha=options.alpha,
                style_size=options.style_size,
                tile_batch=options.tile_batch,
                thumbnail=options.thumbnail,
                high_bit_depth=options.high_bit_depth,
                transparency=options.transparency,
                overwrite=options.overwrite,
                progress=options.progress,
                memory_fraction=options.memory_fraction,
                prefetch=options.prefetch,
                times=times,
                png_compress_level=options.png_compress_level,
                jpeg_codec=options.jpeg_codec,
                compile=str(options.compile).lower(),
                png_encoder=options.png_encoder,
                png_threads=options.png_threads,
                compile_mode=options.compile_mode,
                pad_channels=options.pad_channels,
                compile_cache_dir=options.compile_cache_dir,
                output_format=options.format,
            )
            print(f"wrote {len(written)} image(s) to {options.output} in {time.perf_counter() - start:.1f} s")
            print(f"time per stage: {times.summary()}")
    except SkippedImagesError as error:
        print(
            f"wrote {len(error.written)} image(s) to {options.output}; {len(error.skipped)} unreadable file(s) "
            f"skipped (listed above): {', '.join(p.name for p in error.skipped[:10])}",
            file=sys.stderr,
        )
        return 1
    except (
        StylizeInputError,
        CheckpointFormatError,
        ImageReadError,
        FileNotFoundError,
        DevicesError,
        PixelsmithError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
