"""The stylize pipeline for one device: decode | network | download | encode, overlapped.

Per image: decode the file, run the tiled network (`tiling.stylize_tiled`), encode the result. The network runs in
this process on its device; decoding and encoding run beside it. On a CUDA device `run_pipeline` is a software
pipeline: image i's network is queued on a compute stream of its own, and while the GPU runs it the host decodes
image i+1 (nvJPEG on a decode stream) and finishes image i-1 (on an encode stream: nvJPEG, or a copy into pinned
memory for a host encoder thread), so a JPEG folder runs at close to one image per network time. Nothing in the
loop makes the host wait for the compute stream: stage times come from CUDA events, tile=auto's measurements are
made once per job, and host tensors are uploaded asynchronously. The streams, events and the reasons for each wait
are in `overlap` (`CudaStages`); on a CPU the same loop runs through its no-op twin (`HostStages`), one image at a
time as before, so the CPU tests run the GPU's scheduling code.

Codecs:
- JPEG on a CUDA device (`jpeg_codec=auto`, or `torchvision` anywhere): torchvision's `decode_jpeg`/`encode_jpeg`,
  which are nvJPEG on CUDA, so the pixels never cross PCIe as raw RGB (an 8K frame is 100 MB raw, ~5 MB as JPEG).
  Why torchvision and not TorchCodec, which torchvision 0.29 points to: TorchCodec's image API needs FFmpeg
  libraries on the machine and has no device JPEG *encoder*; torchvision's functions are still there in 0.29 and
  ship with the torch stack the template already needs. When torchvision removes them, this file is the only place
  to change. Reported faults are worked around: the CUDA decoder writes its output from a stream of its own
  without waiting for the caller's (pytorch/vision#9606; the pipeline decodes on a dedicated, always-synchronised
  stream); CUDA encodes run on this process's main thread only, never from a thread pool (#9060, corrupt output
  under threads); the encoder neither waits for the caller's stream nor copies its bytes out on it
  (`encode_jpeg_on_device`). A JPEG the device decoder refuses (CMYK, progressive oddities) is decoded on the host
  instead, and the run says so once.
- Every other format (and JPEG on a CPU device): Pillow. Decodes run in a pool of `workers` processes (default:
  the cores this device's process has, less one on a CPU device, whose network uses them). Encodes run there too
  on a CPU; a GPU's results are encoded by threads of this process (zlib and numpy release the GIL, and a 100 MB
  result is not pickled to a worker). `workers=0`: both inline. PNG output takes a compression level
  (`png_compress_level`, 0-9, default 6) and an encoder (`png_encoder`): `auto`/`threaded` is `style.png`'s, which
  deflates one image in strips on `png_threads` threads (an 8K frame at level 6 in a fraction of a second on a GPU
  machine's cores, where Pillow takes ~7 s of one core); `fpng` (if installed) is fastest, at one fixed ~level-1
  setting; `pil` is Pillow's. All write standard PNGs that Pillow reads back bit-exactly (docs/style-transfer-
  performance.md has the measurements).

At most `depth` decoded images wait for the network and `depth` results wait for their encoder, so memory is
bounded whatever the folder's size. Images finish, and are reported, in input order. Writes are atomic (a hidden
`.partial` file renamed into place), so a killed run leaves only whole images and `overwrite=false` redoes just the
missing ones. A file that fails at any stage is recorded with its reason and the run goes on;
`FolderSummary.failed` names them all.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import ExifTags, Image
from torch import Tensor, nn

from pixelsmith.data.decode import quiet_torchvision_io
from pixelsmith.style.data import ImageData, ImageReadError, read_image
from pixelsmith.style.overlap import HostStages, stages_for
from pixelsmith.style.tiling import StageTimes, stylize_tiled

ALPHA_FORMATS = {".png", ".webp", ".tif", ".tiff"}
JPEG_SUFFIXES = (".jpg", ".jpeg")
JPEG_QUALITY = 95
MIN_SIDE = 16  # smallest image side (and tile) the stylizers' padding and downsampling handle
JPEG_CODECS = ("auto", "pil", "torchvision", "nvimgcodec")


def nvimgcodec_package() -> str:
    """The PyPI name of NVIDIA's nvImageCodec for this torch's CUDA (cu12, cu13)."""
    major = (torch.version.cuda or "12").split(".")[0]
    return f"nvidia-nvimgcodec-cu{major}"


def check_jpeg_codec(name: str, device: torch.device) -> None:
    """Refuse, at start-up, a jpeg_codec that is unknown, or nvimgcodec where it cannot run; the message names the
    fix. (nvimgcodec decodes on the GPU with the hardware JPEG decoder where the GPU has one; it is tried only when
    asked for: torchvision's nvJPEG stays the default.)"""
    if name not in JPEG_CODECS:
        raise ValueError(f"jpeg_codec={name!r}; choose one of {', '.join(JPEG_CODECS)}.")
    if name != "nvimgcodec":
        return
    if device.type != "cuda":
        raise ValueError(
            f"jpeg_codec=nvimgcodec decodes on a CUDA GPU, but this job runs on {device}: use device=cuda, or "
            "jpeg_codec=auto (Pillow in the codec workers on a CPU)."
        )
    try:
        from nvidia import nvimgcodec  # noqa: F401
    except ImportError:
        raise ValueError(
            f"jpeg_codec=nvimgcodec but NVIDIA's nvImageCodec is not installed here. Install it for this torch's "
            f"CUDA {torch.version.cuda}: `pip install {nvimgcodec_package()}` (or `pip install 'pixelsmith[nvimgcodec]'` "
            "for CUDA 12), or use jpeg_codec=auto: torchvision's nvJPEG, the default."
        ) from None


_nvimgcodec_decoders: dict[int, Any] = {}


def decode_jpeg_nvimgcodec(source: Path, device: torch.device) -> Tensor:
    """(H, W, 3) uint8 on `device` decoded by nvImageCodec (hardware JPEG decoder where there is one), EXIF
    orientation applied; the decoder is made once per device."""
    from nvidia import nvimgcodec

    index = device.index if device.index is not None else torch.cuda.current_device()
    decoder = _nvimgcodec_decoders.get(index)
    if decoder is None:
        decoder = _nvimgcodec_decoders[index] = nvimgcodec.Decoder(device_id=index)
    params = nvimgcodec.DecodeParams(apply_exif_orientation=True, color_spec=nvimgcodec.ColorSpec.RGB)
    stream = torch.cuda.current_stream(device)
    # Ordered on the caller's current stream (the folder pipeline's decode stream), not on the legacy default one.
    image = decoder.decode(source.read_bytes(), params=params, cuda_stream=stream.cuda_stream)
    if image is None:
        raise ImageReadError(f"{source}: nvImageCodec could not decode it")
    # Copied into memory of torch's caching allocator: nvImageCodec's own buffer would be freed with the image
    # object, whatever the device still has queued on it, where an allocator block waits for its streams.
    pixels = torch.as_tensor(image, device=device).clone()
    # As with nvJPEG (pytorch/vision#9606): wait for the decode before the network reads it.
    stream.synchronize()
    if pixels.dim() != 3 or pixels.shape[2] != 3:
        raise ImageReadError(f"{source}: decoded to shape {tuple(pixels.shape)}, not (H, W, 3)")
    return pixels


PNG_ENCODERS = ("auto", "threaded", "pil", "fpng")


class PngEncoderUnavailableError(RuntimeError):
    """png_encoder names an encoder whose package is not installed here."""


def check_png_encoder(name: str) -> None:
    """Refuse, at start-up, a png_encoder that is unknown or not installed; the message names the fix."""
    if name not in PNG_ENCODERS:
        raise ValueError(f"png_encoder={name!r}; choose one of {', '.join(PNG_ENCODERS)}.")
    if name == "fpng":
        try:
            import fpng  # noqa: F401
        except ImportError:
            raise PngEncoderUnavailableError(
                "png_encoder=fpng but the fpng package is not installed here. Install it (`pip install fpng`, or "
                "`pip install 'pixelsmith[png]'`), or use png_encoder=auto: the threaded zlib encoder that needs "
                "nothing extra (zlib-ng, from the same extra, makes it about 2x faster)."
            ) from None


def png_bytes(
    rgb: np.ndarray,
    alpha: np.ndarray | None,
    icc_profile: bytes | None,
    level: int,
    encoder: str,
    threads: int | None,
) -> bytes | None:
    """The PNG file's bytes from `encoder` (None for `pil`: Pillow writes the file itself)."""
    if encoder in ("auto", "threaded"):
        from pixelsmith.style.png import encode_png

        return encode_png(rgb, alpha, icc_profile, level=level, threads=threads)
    if encoder == "fpng":
        if alpha is not None or icc_profile:
            return png_bytes(rgb, alpha, icc_profile, level, "threaded", threads)  # fpng writes neither
        import fpng

        return fpng.from_ndarray(np.ascontiguousarray(rgb))
    return None


# ------------------------------------------------------------------------------------------------- encoding


def save_image(
    rgb: np.ndarray,
    alpha: np.ndarray | None,
    path: Path,
    icc_profile: bytes | None,
    png_compress_level: int = 6,
    png_encoder: str = "auto",
    png_threads: int | None = None,
) -> None:
    """Write an image atomically (written next to its name, then renamed): PNG with `png_encoder` (`png_bytes`),
    everything else with Pillow. png_threads: threads for one PNG (None: this process's cores)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    alpha = storable_alpha(alpha, path, stacklevel=3)
    if path.suffix.lower() == ".png":
        data = png_bytes(rgb, alpha, icc_profile, png_compress_level, png_encoder, png_threads)
        if data is not None:
            write_bytes_atomically(data, path)
            return
    image = Image.fromarray(rgb, "RGB")
    if alpha is not None:
        image.putalpha(Image.fromarray(alpha, "L"))
    options: dict[str, Any] = {"icc_profile": icc_profile} if icc_profile else {}
    if path.suffix.lower() in JPEG_SUFFIXES:
        options.update(quality=JPEG_QUALITY, subsampling=0)
    elif path.suffix.lower() == ".png":
        options.update(compress_level=png_compress_level)
    # An interrupted run never leaves a half image that overwrite=false would then take for done. The temporary
    # file is created new (never an existing name, which could be a link planted to redirect the write).
    with _new_partial(path) as (handle, partial):
        image.save(handle, format=Image.registered_extensions().get(path.suffix.lower()), **options)
        handle.close()
        os.replace(partial, path)


def storable_alpha(alpha: np.ndarray | None, path: Path, stacklevel: int = 2) -> np.ndarray | None:
    """`alpha`, or None with a warning where `path`'s format cannot store transparency."""
    if alpha is not None and path.suffix.lower() not in ALPHA_FORMATS:
        warnings.warn(
            f"{path}: {path.suffix} cannot store transparency; the alpha channel was dropped.",
            stacklevel=stacklevel,
        )
        return None
    return alpha


def write_bytes_atomically(data: bytes, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _new_partial(path) as (handle, partial):
        handle.write(data)
        handle.close()
        os.replace(partial, path)


@contextlib.contextmanager
def _new_partial(path: Path):
    """A new, uniquely named temporary file beside `path` (open for writing, and its path), removed unless it was
    renamed into place: created with O_EXCL, so no existing file or planted link is ever written through."""
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    partial = Path(name)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(partial, 0o666 & ~mask)  # mkstemp's 0600 would make the image private once renamed into place
    try:
        with os.fdopen(handle, "wb") as stream:
            yield stream, partial
    finally:
        partial.unlink(missing_ok=True)


ICC_MARKER_PAYLOAD = (
    65519  # an APP2 segment holds 65533 bytes: 14 of them the "ICC_PROFILE\0" tag and counters
)


def jpeg_with_icc_profile(jpeg: bytes, icc_profile: bytes | None) -> bytes:
    """Insert an ICC profile into JPEG bytes as APP2 "ICC_PROFILE" segments (the ICC spec's embedding, what Pillow
    writes), right after the SOI/APP0 header: torchvision's encoder has no option for it."""
    if not icc_profile:
        return jpeg
    chunks = [icc_profile[i : i + ICC_MARKER_PAYLOAD] for i in range(0, len(icc_profile), ICC_MARKER_PAYLOAD)]
    segments = b"".join(
        b"\xff\xe2"
        + (len(chunk) + 16).to_bytes(2, "big")
        + b"ICC_PROFILE\x00"
        + bytes([index + 1, len(chunks)])
        + chunk
        for index, chunk in enumerate(chunks)
    )
    insert_at = 2  # after SOI
    if jpeg[2:4] == b"\xff\xe0":  # keep JFIF's APP0 first, as readers expect
        insert_at = 4 + int.from_bytes(jpeg[4:6], "big")
    return jpeg[:insert_at] + segments + jpeg[insert_at:]


def decode_jpeg_on_device(source: Path, device: torch.device, orientation: int | None = None) -> Tensor:
    """(H, W, 3) uint8 on `device`: nvJPEG on CUDA, libjpeg-turbo on a CPU, EXIF orientation applied.

    On CUDA the decode is complete before the orientation's flips are queued: the caller's current stream is
    synchronised (pytorch/vision#9606: the decoder writes from a stream of its own), and the flips then run on that
    stream, in order for whoever uses the result there. The folder pipeline makes a dedicated decode stream current
    for this, so the wait covers the decode only (`overlap.CudaStages`)."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    with quiet_torchvision_io():
        data = read_file(str(source))
        image = decode_jpeg(data, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # pytorch/vision#9606: wait for the decoder's stream
    if image.shape[0] != 3:
        raise ImageReadError(f"{source}: decoded to {image.shape[0]} channels, not RGB")
    if device.type == "cuda":
        # torchvision's CUDA decoder ignores apply_exif_orientation (its CPU decoder honours it): a phone photo
        # would come out lying on its side. The orientation is read from the header on the host (`orientation`,
        # where the caller has read it already) and applied here.
        if orientation is None:
            orientation = jpeg_header(source)[0]
        image = exif_oriented(image, orientation)
    return image.permute(1, 2, 0)


def jpeg_header(source: Path) -> tuple[int, bytes | None]:
    """(EXIF orientation, ICC profile) of an image file, from its header only: what a device decoder drops."""
    with Image.open(source) as header:
        return header.getexif().get(EXIF_ORIENTATION, 1), header.info.get("icc_profile")


EXIF_ORIENTATION = ExifTags.Base.Orientation


def exif_oriented(image: Tensor, orientation: int) -> Tensor:
    """A (C, H, W) image turned upright for its EXIF `orientation` (1-8), as Pillow's `ImageOps.exif_transpose`
    does; views where it can (flips and rotations copy). Unknown values leave it as it is."""
    rows, columns = image.dim() - 2, image.dim() - 1
    if orientation == 2:  # mirrored
        return image.flip(columns)
    if orientation == 3:  # upside down
        return image.flip(rows, columns)
    if orientation == 4:  # mirrored upside down
        return image.flip(rows)
    if orientation == 5:  # mirrored across the main diagonal
        return image.transpose(rows, columns)
    if orientation == 6:  # turned 90 degrees counter-clockwise: turn it clockwise
        return torch.rot90(image, -1, (rows, columns))
    if orientation == 7:  # mirrored across the anti-diagonal
        return image.transpose(rows, columns).flip(rows, columns)
    if orientation == 8:  # turned 90 degrees clockwise: turn it counter-clockwise
        return torch.rot90(image, 1, (rows, columns))
    return image


def encode_jpeg_on_device(result: Tensor, target: Path, icc_profile: bytes | None) -> None:
    """Encode an (H, W, 3) uint8 tensor where it is (nvJPEG on CUDA) and write it atomically. Main thread only
    (pytorch/vision#9060: corrupt output from threads).

    On CUDA, torchvision's encoder reads its input on a stream of its own without waiting for the caller's, and
    copies the encoded bytes out on the legacy default stream: the input is made complete first (the current
    stream is synchronised) and the bytes are read only after that default stream has copied them (the folder
    pipeline runs its networks on a stream of their own, so neither wait covers a later image's network)."""
    from torchvision.io import encode_jpeg

    planar = result.permute(2, 0, 1).contiguous()
    if planar.is_cuda:
        torch.cuda.current_stream(planar.device).synchronize()
    with quiet_torchvision_io():
        encoded = encode_jpeg(planar, quality=JPEG_QUALITY)
    if encoded.is_cuda:
        torch.cuda.default_stream(encoded.device).synchronize()
    write_bytes_atomically(jpeg_with_icc_profile(encoded.cpu().numpy().tobytes(), icc_profile), target)


# --------------------------------------------------------------------------------------- worker functions


def decode_on_host(
    source: Path, keep_alpha: bool, high_bit_depth: str
) -> tuple[ImageData | ImageReadError, float, list[tuple[str, type[Warning]]]]:
    """Run in a worker process: (image or the error, seconds, warnings raised) — nothing is raised across."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            image: ImageData | ImageReadError = read_image(
                source, keep_alpha=keep_alpha, high_bit_depth=high_bit_depth
            )
        except ImageReadError as error:
            image = error
    return image, time.perf_counter() - start, [(str(w.message), w.category) for w in caught]


def encode_on_host(
    rgb: np.ndarray,
    alpha: np.ndarray | None,
    icc_profile: bytes | None,
    target: Path,
    png_compress_level: int,
    png_encoder: str = "auto",
    png_threads: int | None = None,
) -> tuple[float, list[tuple[str, type[Warning]]]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seconds = timed_save(rgb, alpha, icc_profile, target, png_compress_level, png_encoder, png_threads)
    return seconds, [(str(w.message), w.category) for w in caught]


def timed_save(
    rgb: np.ndarray,
    alpha: np.ndarray | None,
    icc_profile: bytes | None,
    target: Path,
    png_compress_level: int,
    png_encoder: str = "auto",
    png_threads: int | None = None,
) -> float:
    """Write the image; the seconds the write took."""
    start = time.perf_counter()
    save_image(rgb, alpha, target, icc_profile, png_compress_level, png_encoder, png_threads)
    return time.perf_counter() - start


def encode_in_thread(
    stages: HostStages,
    ready: Any,
    rgb: np.ndarray,
    alpha: np.ndarray | None,
    icc_profile: bytes | None,
    target: Path,
    png_compress_level: int,
    png_encoder: str = "auto",
    png_threads: int | None = None,
) -> tuple[float, list[tuple[str, type[Warning]]]]:
    """Run in an encoder thread of this process: wait for the download `ready`, write the image; the seconds the
    write took and no warnings, as `encode_on_host` returns them. The caller has dropped an alpha the format cannot
    store (`storable_alpha`), so this raises no warning: recording warnings (`encode_on_host`) swaps process-wide
    state, which threads would corrupt."""
    stages.wait_ready(ready)
    return timed_save(rgb, alpha, icc_profile, target, png_compress_level, png_encoder, png_threads), []


def rewarn(caught: list[tuple[str, type[Warning]]]) -> None:
    """Warnings a worker process recorded, raised again here, where the caller's filters and tests see them."""
    for message, category in caught:
        warnings.warn(message, category, stacklevel=3)


def default_workers(device: torch.device, processes: int = 1) -> int:
    """Codec worker processes for one device's pipeline: its share of the cores, less one where the network runs
    on those cores too."""
    share = max(1, _cores() // max(1, processes))
    return max(1, share - 1) if device.type == "cpu" else share


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def make_pool(workers: int) -> ProcessPoolExecutor | None:
    """A codec pool (None: decode and encode inline). Workers come from a fork server: started before this process
    grew threads or a CUDA context, so forking it is safe, and far cheaper per worker than spawning."""
    if workers <= 0:
        return None
    method = "forkserver" if sys.platform.startswith("linux") else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["pixelsmith.style.pipeline"])
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


# --------------------------------------------------------------------------------------------- the summary


@dataclass
class FolderSummary:
    """What a run (one device's shard, or all of them merged) did; JSON-serialisable for merging across ranks."""

    devices: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    existing: int = 0  # outputs already there with overwrite=false: not redone
    failed: dict[str, str] = field(default_factory=dict)  # source -> reason
    pixels: int = 0  # of the written images
    wall_seconds: float = 0.0  # the slowest device's, for a merged summary
    stage_seconds: dict[str, float] = field(default_factory=dict)
    flops_per_pixel: float = 0.0  # the network's, counted once (FlopCounterMode on a probe)
    peak_flops: float | None = None  # the devices' peak together, for MFU
    peak_source: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def merge(cls, parts: list[dict[str, Any]] | list[FolderSummary]) -> FolderSummary:
        parts = [p if isinstance(p, FolderSummary) else FolderSummary(**p) for p in parts]
        merged = cls()
        for part in parts:
            merged.devices += part.devices
            merged.written += part.written
            merged.existing += part.existing
            merged.failed.update(part.failed)
            merged.pixels += part.pixels
            merged.wall_seconds = max(merged.wall_seconds, part.wall_seconds)
            for name, seconds in part.stage_seconds.items():
                merged.stage_seconds[name] = merged.stage_seconds.get(name, 0.0) + seconds
            merged.flops_per_pixel = merged.flops_per_pixel or part.flops_per_pixel
            if part.peak_flops is not None:
                merged.peak_flops = (merged.peak_flops or 0.0) + part.peak_flops
            merged.peak_source = merged.peak_source or part.peak_source
            merged.notes += [n for n in part.notes if n not in merged.notes]
        return merged

    def lines(self) -> list[str]:
        done = len(self.written)
        devices = ", ".join(self.devices) or "no device"
        wall = max(self.wall_seconds, 1e-9)
        lines = [
            f"stylized {done} image(s) on {len(self.devices)} device(s) ({devices}) in {self.wall_seconds:.1f} s: "
            f"{done / wall:.2f} images/s, {self.pixels / wall / 1e6:.1f} megapixels/s"
        ]
        if self.existing:
            lines.append(f"already there (overwrite=false): {self.existing} image(s), not redone")
        if done and self.flops_per_pixel:
            flops = self.flops_per_pixel * self.pixels
            achieved = flops / wall
            network_seconds = self.stage_seconds.get("network", 0.0) / max(1, len(self.devices))
            line = (
                f"network: {_flops(flops / done)} per image (mean), {_flops(achieved)}/s over the run, "
                f"{_flops(flops / max(network_seconds, 1e-9))}/s while it ran"
            )
            if self.peak_flops:
                line += f"; MFU {achieved / self.peak_flops:.1%} of {self.peak_flops / 1e12:.1f} TFLOP/s ({self.peak_source})"
            else:
                line += f"; no MFU ({self.peak_source or 'no peak known'})"
            lines.append(line)
        if self.stage_seconds:
            stages = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in self.stage_seconds.items())
            lines.append(f"time per stage: {stages} (summed over devices and codec workers, which overlap)")
        lines += self.notes
        if self.failed:
            lines.append(f"FAILED: {len(self.failed)} file(s) could not be read or written; the others were:")
            lines += [f"  {source}: {reason}" for source, reason in sorted(self.failed.items())]
        return lines


def _flops(value: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} FLOP"


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto`: bf16-mixed where bf16 is the faster path (a CUDA GPU with bf16, a CPU where
    `cpu_prefers_bf16`: the hardware profiles' rule, docs/platforms.md), else 32-true. Any other value is returned as it is."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    from pixelsmith.hardware.settings import cpu_prefers_bf16

    return "bf16-mixed" if device.type == "cpu" and cpu_prefers_bf16() else "32-true"


def network_flops_per_pixel(stylizer: nn.Module, probe_side: int = 128) -> float:
    """FLOPs of one forward per input pixel (convolutions scale with pixels), counted on a small probe."""
    from pixelsmith.perf.flops import count_flops

    parameter = next(stylizer.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    multiple = int(getattr(stylizer, "size_multiple", 1))
    side = max(multiple, probe_side // max(1, multiple) * max(1, multiple))
    probe = torch.rand(1, 3, side, side, device=device)
    with torch.inference_mode():
        return count_flops(lambda: stylizer(probe)) / (side * side)


# ---------------------------------------------------------------------------------------------- the pipeline


@dataclass
class PipelineOptions:
    tile: int | str = "auto"
    overlap: int = 64
    tile_batch: int = 4
    thumbnail: int = 1024
    precision: str = "32-true"
    transparency: str = "keep"
    high_bit_depth: str = "convert"
    memory_fraction: float = 0.9
    png_compress_level: int = 6
    png_encoder: str = "auto"
    png_threads: int | None = None  # threads per PNG encode; None: the cores shared by the encodes in flight
    jpeg_codec: str = "auto"
    compile: str = "auto"
    compile_mode: str = "auto"


# compile=auto pays the compile (and, with a mode that autotunes, cuDNN/Triton's autotuning) only where it pays back:
# - a CPU: compiling the stylizer costs about 15 s on 2 cores (the first image waits for it), and each later 2K image
#   ran 1.3x faster in fp32 and about 3x in bf16 (AMX Xeon), so from a few images on;
# - a GPU: the first compile of an 8K tile set took ~7 s against a ~0.15 s eager 8K forward, so one image never
#   repays it, two or more images of a folder do (the compiled tiles run every later image);
# - either, whatever the count: when an earlier run left this network's compile for these settings in the compile
#   cache (`compile_marker`), which then loads in a fraction of the cold time.
CPU_COMPILE_MIN_IMAGES = 8
CUDA_COMPILE_MIN_IMAGES = 2
COMPILE_CHOICES = ("auto", "true", "false")
COMPILE_MODES = ("auto", "default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
# compile_mode=auto autotunes (max-autotune-no-cudagraphs: cuDNN against Triton convolution templates, per shape) only
# where that pays back. On an H200 the autotuned 8K stylizer ran 78 ms a forward against 138 ms compiled in the
# default mode (131 against 74 TFLOP/s), and the autotuning took about 5 s per convolution shape, some 50 s for the
# network: about 60 ms saved per 8K image repays it after some 800 images. So: from CUDA_AUTOTUNE_MIN_IMAGES images,
# or at once where an earlier run left the autotuned compile in the cache; the default mode otherwise, and always on
# a CPU (inductor's CPU code has no convolution templates to choose from).
AUTOTUNE_MODE = "max-autotune-no-cudagraphs"
CUDA_AUTOTUNE_MIN_IMAGES = 1000


def compile_mode_decision(
    choice: str, device: torch.device, images: int, autotuned_cached: bool = False
) -> tuple[str, str]:
    """torch.compile's mode for the tiles, and the log's reason: `compile_mode` as given, or for auto the
    autotuning mode where it pays back (`CUDA_AUTOTUNE_MIN_IMAGES`, or an autotuned compile in the cache)."""
    if choice != "auto":
        return choice, f"compile_mode={choice}"
    if device.type != "cuda":
        return "default", "compile_mode=auto: default (no autotuning on a CPU)"
    if autotuned_cached:
        return (
            AUTOTUNE_MODE,
            f"compile_mode=auto: {AUTOTUNE_MODE}, from the compile cache an earlier run left",
        )
    if images >= CUDA_AUTOTUNE_MIN_IMAGES:
        return AUTOTUNE_MODE, f"compile_mode=auto: {AUTOTUNE_MODE}, {images} images repay its autotuning"
    return "default", (
        f"compile_mode=auto: default, {images} image(s) would not repay autotuning (from "
        f"{CUDA_AUTOTUNE_MIN_IMAGES}, or once a run with compile_mode={AUTOTUNE_MODE} cached it)"
    )


def compile_decision(
    choice: str, device: torch.device, images: int, cached: bool = False
) -> tuple[bool, str]:
    """Whether the tiles run compiled, and the log's reason: `compile` = true | false | auto (from
    CUDA_COMPILE_MIN_IMAGES images on a GPU, CPU_COMPILE_MIN_IMAGES on a CPU, or at once when `cached`)."""
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"compile={choice!r}; choose one of {', '.join(COMPILE_CHOICES)}.")
    if choice != "auto":
        return choice == "true", f"compile={choice}"
    least = CUDA_COMPILE_MIN_IMAGES if device.type == "cuda" else CPU_COMPILE_MIN_IMAGES
    if cached:
        return True, "compile=auto: compiled, from the compile cache an earlier run left for these settings"
    if images >= least:
        return (
            True,
            f"compile=auto: compiled, {images} images repay the compile (from {least} on {device.type})",
        )
    return False, (
        f"compile=auto: not compiled, {images} image(s) would not repay the compile (from {least} on "
        f"{device.type}, or once an earlier run cached it); compile=true forces it"
    )


def compile_tiles(choice: str, device: torch.device, images: int, cached: bool = False) -> bool:
    """`compile_decision`'s yes or no."""
    return compile_decision(choice, device, images, cached)[0]


def compile_key(
    stylizer: nn.Module,
    device: torch.device,
    precision: str,
    mode: str,
    tile_batch: int,
    pad_channels: int = 0,
) -> str:
    """What a compile of the tiles depends on, hashed: torch's version, the device model, the settings and the
    network's parameter shapes (weights are graph inputs, not constants: another checkpoint of the same architecture
    reuses the compile)."""
    import hashlib

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    shapes = [(name, tuple(p.shape), str(p.dtype)) for name, p in stylizer.named_parameters()]
    text = repr(
        (
            torch.__version__,
            device_name,
            precision,
            mode,
            tile_batch,
            pad_channels,
            type(stylizer).__name__,
            shapes,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def compile_marker(cache_dir: str | Path, key: str) -> Path:
    """The file a run leaves beside torch's compile cache once its tiles ran compiled (`compile_key`)."""
    return Path(cache_dir) / "stylize" / f"{key}.done"


@dataclass
class _Failure:
    source: Path
    error: BaseException


@dataclass
class _Image:
    """One image on its way through the pipeline: decoded, its network queued, finished."""

    source: Path
    target: Path
    pending: Any  # its decode: a Future, or "device" / "host" (decoded in this process when its turn comes)
    pixels: np.ndarray | Tensor | None = None
    alpha: np.ndarray | None = None
    icc_profile: bytes | None = None
    pixel_count: int = 0
    error: BaseException | None = None  # kept until the image's turn to finish: files are reported in order
    result: np.ndarray | Tensor | None = None
    done: Any = None  # the mark of its network's completion (`HostStages.record_done`)
    timer: StageTimes | None = None
    encode_on_device: bool = False


@dataclass
class _Encoding:
    """A host encode in flight, in a codec process or an encoder thread."""

    image: _Image
    future: Future
    # The downloaded pixels (pinned memory on CUDA), alive until the encoder is done with them.
    keep: Any = None


# What one file can fail with (unreadable, too small, a network that cannot take it, a failed write): the file is
# named in the summary and the run goes on.
FILE_ERRORS = (ImageReadError, OSError, ValueError, RuntimeError)


def run_pipeline(
    stylizer: nn.Module,
    pairs: list[tuple[Path, Path]],
    device: torch.device,
    options: PipelineOptions,
    pool: ProcessPoolExecutor | None,
    *,
    depth: int = 2,
    times: StageTimes | None = None,
    on_image_done: Callable[[Path, Path | None], None] | None = None,
    on_tiles_done: Callable[[int, int], None] | None = None,
    failures: list[_Failure] | None = None,
    stages: HostStages | None = None,
) -> FolderSummary:
    """Stylize `pairs` (source, target) on `device`; returns this device's summary. `failures` (optional) receives
    each failed file with its exception, for callers that re-raise (a single input file). `stages`: the device's
    streams and events (default `overlap.stages_for(device)`; the tests pass stand-ins that record the schedule).

    The schedule (module docstring): per image, prepare (decode), launch (queue the network), finish (download and
    encode, or nvJPEG). With `stages.lag` 1 (CUDA) image i is launched before image i+1 is prepared and image i-1
    finished; with lag 0 (a CPU) each image is finished right after its network, as the sequential loop did. Images
    finish, and `on_image_done` is called, in input order, a failed image in its turn."""
    times = times if times is not None else StageTimes()
    options.precision = resolve_precision(options.precision, device)
    compiled = compile_tiles(options.compile, device, len(pairs))
    if options.compile_mode == "auto":  # stylize.py decides it with the cache in view; a direct call here
        options.compile_mode = compile_mode_decision("auto", device, len(pairs))[0]
    device_jpeg = options.jpeg_codec in ("torchvision", "nvimgcodec") or (
        options.jpeg_codec == "auto" and device.type == "cuda"
    )
    keep_alpha = options.transparency != "drop"
    stages = stages if stages is not None else stages_for(device)
    # A GPU's results are encoded on the host by threads of this process: zlib and numpy release the GIL, and a 100 MB
    # result is not pickled to a worker. On a CPU they go to the codec processes, as this process's cores run the
    # network. No pool (workers=0): inline.
    threads = (
        ThreadPoolExecutor(max_workers=depth, thread_name_prefix="pixelsmith-encode")
        if stages.threaded_encodes and pool is not None
        else None
    )
    encoder: Executor | None = threads if threads is not None else pool
    # Up to `depth` PNGs are encoded at once, each over its share of the cores; inline, the one encode takes them all.
    png_threads = options.png_threads or max(1, _cores() // (depth if encoder is not None else 1))
    summary = FolderSummary(devices=[str(device)])
    start = time.perf_counter()
    waiting: deque[_Image] = deque()  # decodes submitted ahead, at most `depth`
    launched: deque[_Image] = deque()  # networks queued and not finished, at most `stages.lag` between images
    encoding: deque[_Encoding] = deque()  # host encodes in flight, at most `depth`: memory stays bounded
    upcoming = iter(pairs)
    noted: set[str] = set()
    plan_cache: dict[
        tuple, float
    ] = {}  # tile=auto's measurements: made on the first image, reused by the rest

    def note(message: str) -> None:
        if message not in noted:
            noted.add(message)
            summary.notes.append(message)
            print(message, file=sys.stderr)

    def fail(source: Path, error: BaseException, counted: bool = False) -> None:
        summary.failed[str(source)] = f"{type(error).__name__}: {error}"
        if failures is not None:
            failures.append(_Failure(source, error))
        print(f"failed: {source}: {error}", file=sys.stderr)
        if on_image_done is not None and not counted:
            on_image_done(source, None)

    def queue_next() -> None:
        pair = next(upcoming, None)
        if pair is None:
            return
        source, target = pair
        if device_jpeg and source.suffix.lower() in JPEG_SUFFIXES:
            pending: Any = "device"
        elif pool is None:
            pending = "host"
        else:
            pending = pool.submit(decode_on_host, source, keep_alpha, options.high_bit_depth)
        waiting.append(_Image(source, target, pending))

    def decode(item: _Image) -> None:
        source = item.source
        icc_profile = None
        if item.pending == "device":
            decode_start = time.perf_counter()
            try:
                orientation, icc_profile = jpeg_header(source)  # the device decoders drop both
                with stages.decode():  # CUDA: on the decode stream, waited for alone (pytorch/vision#9606)
                    if options.jpeg_codec == "nvimgcodec":
                        pixels: np.ndarray | Tensor = decode_jpeg_nvimgcodec(source, device)
                    else:
                        pixels = decode_jpeg_on_device(source, device, orientation)
                alpha = None
            except (
                RuntimeError,
                OSError,
                ImageReadError,
            ) as error:  # OSError: Pillow could not read the header
                note(
                    f"note: the device JPEG decoder refused {source.name} ({error}); decoded on the host instead"
                )
                image, _, messages = decode_on_host(source, keep_alpha, options.high_bit_depth)
                rewarn(messages)
                if isinstance(image, ImageReadError):
                    raise image from None
                pixels, alpha, icc_profile = image.rgb, image.alpha, image.icc_profile
            times.decode += time.perf_counter() - decode_start
        else:
            if isinstance(item.pending, Future):
                image, seconds, messages = item.pending.result()
            else:
                image, seconds, messages = decode_on_host(source, keep_alpha, options.high_bit_depth)
            times.decode += seconds
            rewarn(messages)
            if isinstance(image, ImageReadError):
                raise image
            if image.alpha is not None and options.transparency == "refuse":
                raise ImageReadError(
                    f"{source} has an alpha channel and transparency=refuse; use keep or drop."
                )
            pixels, alpha, icc_profile = image.rgb, image.alpha, image.icc_profile
        height, width = pixels.shape[:2]
        if min(height, width) < MIN_SIDE:
            raise ImageReadError(
                f"{source} is {width}x{height}: too small to stylize (at least {MIN_SIDE} px a side)."
            )
        item.pixels = stages.decoded(pixels)
        item.alpha, item.icc_profile, item.pixel_count = alpha, icc_profile, height * width

    def prepare() -> _Image | None:
        """The next image, decoded (or holding the error that stopped it)."""
        if not waiting:
            return None
        item = waiting.popleft()
        queue_next()  # keep `depth` decodes in flight while this image waits and the device works
        try:
            decode(item)
        except FILE_ERRORS as error:
            item.error = error
        return item

    def launch(item: _Image) -> None:
        """Queue the image's network (on a CPU: run it)."""
        if item.error is not None:
            return
        item.encode_on_device = (
            device_jpeg and item.target.suffix.lower() in JPEG_SUFFIXES and item.alpha is None
        )
        item.timer = stages.timer()
        try:
            with stages.compute():
                item.result = stylize_tiled(
                    stylizer,
                    item.pixels,
                    tile=options.tile,
                    overlap=options.overlap,
                    batch_size=options.tile_batch,
                    thumbnail_size=options.thumbnail,
                    precision=options.precision,
                    device=device,
                    on_tiles_done=on_tiles_done,
                    memory_fraction=options.memory_fraction,
                    times=item.timer,
                    return_tensor=item.encode_on_device or stages.results_on_device,
                    compile=compiled,
                    compile_mode=options.compile_mode,
                    # channels_last only where compiled on a GPU: there Inductor fuses the padding and instance norm
                    # around cuDNN's channels_last convolutions. Eager, those two have no channels_last kernels and
                    # convert layouts around every convolution: the 8K network ran 541 ms in bf16 channels_last against
                    # 256 ms in fp32 NCHW on an H200, and oneDNN ran it 1.3x slower in channels_last on a CPU (2K).
                    channels_last=device.type == "cuda" and compiled,
                    plan_cache=plan_cache,
                )
                item.done = stages.record_done()
        except FILE_ERRORS as error:
            # One bad file must not abort a folder: recorded, named in the summary, the exit status says so.
            item.error = error
        finally:
            item.pixels = None  # on CUDA the allocator keeps its memory until the queued network has read it

    def finish(item: _Image) -> None:
        """Encode the image (nvJPEG here, or a host encoder), count it, report it."""
        if item.error is not None:
            fail(item.source, item.error)
            return
        source, target = item.source, item.target
        try:
            if item.encode_on_device:
                with stages.encode(item.done, item.result):
                    encode_start = time.perf_counter()
                    encode_jpeg_on_device(
                        item.result, target, item.icc_profile
                    )  # this thread: pytorch/vision#9060
                    times.encode += time.perf_counter() - encode_start
                stages.collect(item.timer, times)
            else:
                while len(encoding) >= depth:
                    finish_oldest_encode()
                rgb, keep, ready = stages.download(item.result, item.done, item.timer)
                settings = (options.png_compress_level, options.png_encoder, png_threads)
                if encoder is None:
                    stages.wait_ready(ready)
                    seconds, messages = encode_on_host(rgb, item.alpha, item.icc_profile, target, *settings)
                    times.encode += seconds
                    rewarn(messages)
                    stages.collect(item.timer, times)
                elif threads is not None:
                    alpha = storable_alpha(item.alpha, target)  # warned here: the thread records no warnings
                    future = threads.submit(
                        encode_in_thread, stages, ready, rgb, alpha, item.icc_profile, target, *settings
                    )
                    encoding.append(_Encoding(item, future, keep))
                else:
                    future = encoder.submit(
                        encode_on_host, rgb, item.alpha, item.icc_profile, target, *settings
                    )
                    encoding.append(_Encoding(item, future, keep))
            summary.written.append(str(target))
            summary.pixels += item.pixel_count
            if on_image_done is not None:
                on_image_done(source, target)
        except FILE_ERRORS as error:
            fail(source, error)
        finally:
            item.result = None

    def finish_oldest_encode() -> None:
        encode = encoding.popleft()
        item = encode.image
        try:
            outcome = encode.future.result()
        except Exception as error:  # noqa: BLE001  (a write that failed: named, the rest go on)
            fail(item.source, error, counted=True)
            summary.written.remove(str(item.target))
            summary.pixels -= item.pixel_count
            return
        finally:
            encode.keep = None
            stages.collect(item.timer, times)
        seconds, messages = outcome
        times.encode += seconds
        rewarn(messages)

    def finish_launched(keep: int) -> None:
        while len(launched) > keep:
            finish(launched.popleft())

    try:
        for _ in range(depth if pool is not None else 1):
            queue_next()
        item = prepare()
        while item is not None:
            launch(item)
            launched.append(item)
            if not stages.lag:
                finish_launched(0)  # the network has run: finished before the next decode, as one loop would
            item = prepare()  # decoded while the device runs the networks queued
            finish_launched(stages.lag)
        finish_launched(0)
        while encoding:
            finish_oldest_encode()
    finally:
        if threads is not None:
            threads.shutdown(wait=True, cancel_futures=True)
        stages.close()
    summary.wall_seconds = time.perf_counter() - start
    summary.stage_seconds = {name: round(value, 4) for name, value in asdict(times).items()}
    return summary
