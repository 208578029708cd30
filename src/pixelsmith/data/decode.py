"""Decoding stored images for training (`data.decoder` of `data=zip` and `data=shards`).

- `pil`: Pillow in the loader workers (`image_folder.decode_square`: draft-mode JPEG, EXIF, 16-bit, fit to the square).
- `simplejpeg`: JPEG members through libjpeg-turbo's simplejpeg in the loader workers, with DCT scaling to at least
  the training size; measured 1.5-2.4x Pillow's images/s per core on this template's sizes (64-256 px squares from
  64-1024 px JPEGs, `python -m benchmarks.loader_bench`), so `auto` uses it when it is installed (the `stream`
  extra). Other formats, and a JPEG it refuses (CMYK), go to Pillow.
- `nvjpeg`: JPEG batches decoded on the training GPU (torchvision's batched `decode_jpeg(device="cuda")`): the loader
  workers only read bytes, and the host never touches pixels. `auto` picks it on a CUDA run whose archive stores JPEG.
  Why torchvision and not TorchCodec (which torchvision 0.29 deprecates its decoders for): TorchCodec's image API
  needs FFmpeg libraries on the machine, and torchvision's still ships with the torch stack the template needs; this
  file is the one place to change when torchvision removes them. pytorch/vision#9606 (the CUDA decoder's output read
  before its stream has finished it) is worked around by waiting for the current stream once per batch: a host wait
  the iteration takes deliberately (`host_reads_allowed`). A batch the device decoder refuses is decoded by Pillow,
  and the run says so once. Asked for on a machine without CUDA, it stops at set-up naming `data.decoder=auto`.
"""

from __future__ import annotations

import io
import logging
import warnings
from contextlib import contextmanager

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from pixelsmith.data.image_folder import decode_square
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)

DECODERS = ("auto", "pil", "simplejpeg", "nvjpeg")
JPEG_MAGIC = b"\xff\xd8"


class DecoderError(PixelsmithError, ValueError):
    pass


def simplejpeg_available() -> bool:
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_decoder(requested: str, device_type: str, stores_jpeg: bool) -> str:
    """The decoder a run uses: `requested`, or for `auto` nvjpeg on CUDA with JPEG data, simplejpeg when installed,
    else Pillow. `nvjpeg` without CUDA, or `simplejpeg` without the package, stops here with the fix."""
    if requested not in DECODERS:
        raise DecoderError(f"data.decoder={requested!r}; choose one of {', '.join(DECODERS)}.")
    if requested == "auto":
        if device_type == "cuda" and stores_jpeg:
            return "nvjpeg"
        return "simplejpeg" if stores_jpeg and simplejpeg_available() else "pil"
    if requested == "nvjpeg" and device_type != "cuda":
        raise DecoderError(
            f"data.decoder=nvjpeg decodes JPEG on a CUDA device, and this run's device is {device_type}. Use "
            "data.decoder=auto (simplejpeg or Pillow in the loader workers)."
        )
    if requested == "simplejpeg" and not simplejpeg_available():
        raise DecoderError(
            'data.decoder=simplejpeg needs the simplejpeg package: pip install -e ".[stream]" (or pip install '
            "simplejpeg), or use data.decoder=auto."
        )
    return requested


def decode_bytes(data: bytes, resolution: int, channels: int, decoder: str = "pil") -> Tensor:
    """One stored image as uint8 CHW at `resolution`: simplejpeg for JPEG when `decoder` says so, else Pillow."""
    if decoder == "simplejpeg" and data[:2] == JPEG_MAGIC:
        try:
            import simplejpeg

            pixels = simplejpeg.decode_jpeg(
                data,
                colorspace="GRAY" if channels == 1 else "RGB",
                min_height=resolution,
                min_width=resolution,
            )
        except (ValueError, RuntimeError):  # CMYK and other JPEGs libjpeg-turbo's fast path refuses
            pixels = None
        if pixels is not None:
            if pixels.shape[:2] != (resolution, resolution):
                image = Image.fromarray(
                    pixels[..., 0] if channels == 1 else pixels
                )  # GRAY comes as (H, W, 1)
                image = ImageOps.fit(image, (resolution, resolution), method=Image.Resampling.LANCZOS)
                pixels = np.asarray(image)
            pixels = pixels.reshape(resolution, resolution, channels)
            return torch.from_numpy(pixels.transpose(2, 0, 1).copy())
    return decode_square(io.BytesIO(data), resolution, channels)


def collate_encoded(items: list[tuple]) -> tuple:
    """A batch of `(encoded uint8 1-D tensor, flag[, label])` items: the encoded images stay a list (their lengths
    differ); flags and labels are stacked."""
    columns = list(zip(*items, strict=True))
    out: list = [list(columns[0]), torch.as_tensor(columns[1])]
    if len(columns) > 2:
        out.append(torch.stack([torch.as_tensor(v) for v in columns[2]]))
    return tuple(out)


@contextmanager
def quiet_torchvision_io():
    """torchvision 0.29 warns on every decode_jpeg/encode_jpeg call that TorchCodec replaces them (see the module
    docstring); the style part's nvJPEG codec uses this too."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(deprecat|TorchCodec).*")
        yield


class DecodesOnDevice:
    """What a datamodule of stored images (data=zip, data=shards) shares for `data.decoder`: `choose_decoder` picks it
    for the run's device once, at set-up (with nvjpeg the loader batches encoded bytes, `collate_encoded`), and
    Lightning's `on_before_batch_transfer` then decodes those batches on that device. Listed before the datamodule
    base class, so its hook is the one Lightning calls."""

    decoder_used = "pil"
    decode_device: torch.device | None = None

    def choose_decoder(self, requested: str, stores_jpeg: bool) -> str:
        trainer = getattr(self, "trainer", None)
        self.decode_device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        self.decoder_used = resolve_decoder(requested, self.decode_device.type, stores_jpeg)
        return self.decoder_used

    def set_decoder(self, decoder: str) -> None:
        """Fix the decoder `choose_decoder` chose (or one the datamodule falls back to) and the loader's batching."""
        self.decoder_used = decoder
        self.collate_fn = collate_encoded if decoder == "nvjpeg" else None

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        if self.decoder_used != "nvjpeg":
            return batch
        images = decode_batch_on_device(batch[0], self.resolution, self.channels, self.decode_device)
        return (images, *batch[1:])


_warned_fallback = False


def decode_batch_on_device(
    encoded: list[Tensor], resolution: int, channels: int, device: torch.device
) -> Tensor:
    """uint8 [N, C, R, R] on `device` from a list of encoded JPEGs (CPU uint8 1-D tensors): one batched torchvision
    `decode_jpeg` (nvJPEG on CUDA), a center crop and antialiased resize on the device for any not already the
    square. The same code runs on a CPU device (libjpeg-turbo), which is how it is tested without a GPU."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as TF

    global _warned_fallback
    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    try:
        with quiet_torchvision_io():
            images = decode_jpeg(encoded, mode=mode, device=device)
        if device.type == "cuda":
            from pixelsmith.core.host_reads import host_reads_allowed

            with host_reads_allowed():
                torch.cuda.current_stream(device).synchronize()  # pytorch/vision#9606
    except RuntimeError as err:
        if not _warned_fallback:
            log.warning("The device JPEG decoder refused a batch (%s); decoding it with Pillow instead.", err)
            _warned_fallback = True
        images = [
            decode_square(io.BytesIO(e.numpy().tobytes()), resolution, channels).to(device) for e in encoded
        ]
    out = []
    for image in images:
        if image.shape[-2:] != (resolution, resolution):
            side = min(image.shape[-2:])
            image = TF.center_crop(image, [side, side])
            image = TF.resize(image, [resolution, resolution], antialias=True)
        out.append(image)
    return torch.stack(out)
