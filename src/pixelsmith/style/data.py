"""Style-transfer data: image reading, the content crop dataset, style images, and the embedded offline default.

The embedded default lives in `data/style/` (content/ and styles/), small JPEGs made from images that
scikit-image and scikit-learn ship (licences in data/style/README.md). They are committed so that training and tests
need neither a download nor those packages at run time; `python -m pixelsmith.style.data --rebuild` regenerates them
(that one needs scikit-image and scikit-learn installed).

Reading rules, shared by training data, style images and `stylize.py`: EXIF orientation is applied; grayscale,
palette and CMYK become RGB; 16-bit images are converted to 8-bit with a warning (or refused); float images are
refused; alpha is returned separately when asked for.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset

from pixelsmith.config.paths import DATA_DIR
from pixelsmith.errors import PixelsmithError

EMBEDDED_DIR = DATA_DIR / "style"
EMBEDDED_CONTENT_DIR = EMBEDDED_DIR / "content"
EMBEDDED_STYLES_DIR = EMBEDDED_DIR / "styles"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


class ImageReadError(PixelsmithError, OSError):
    """An image file is missing, unreadable or in a form we do not process; the message names the path (a
    PixelsmithError: entry points print it as one paragraph)."""


class ImageNotFoundError(ImageReadError, FileNotFoundError):
    """The image path does not exist."""


class StyleImageError(ImageReadError):
    """A configured style image is missing or unreadable."""


class HighBitDepthWarning(UserWarning):
    """A 16-bit image was reduced to 8 bits per channel."""


@dataclass
class ImageData:
    rgb: np.ndarray  # (H, W, 3) uint8
    alpha: np.ndarray | None  # (H, W) uint8 when the file has transparency and it was asked for
    icc_profile: bytes | None  # passed through to the output so colours stay as the camera meant them
    source_mode: str  # PIL mode of the file, for messages


def _is_16bit(image: Image.Image) -> bool:
    # Pillow decodes 16-bit RGB(A) PNGs straight to 8-bit modes; the raw mode of the pending decode says so.
    raw_modes = [str(getattr(t, "args", "")) for t in (image.tile or [])]
    return image.mode.startswith("I;16") or any(";16" in mode for mode in raw_modes)


def read_image(path: str | Path, *, keep_alpha: bool = False, high_bit_depth: str = "convert") -> ImageData:
    """Read an image file as 8-bit RGB (+ alpha when `keep_alpha`), applying the EXIF orientation.

    high_bit_depth: "convert" (16 -> 8 bit, with a HighBitDepthWarning) or "refuse" (ImageReadError).
    """
    path = Path(path)
    if not path.is_file():
        raise ImageNotFoundError(f"Image not found: {path} (resolved: {path.resolve()}).")
    try:
        with Image.open(path) as opened:
            sixteen_bit = _is_16bit(opened) or (opened.mode == "I")
            source_mode = opened.mode
            if sixteen_bit and high_bit_depth == "refuse":
                raise ImageReadError(
                    f"{path} is a 16-bit image (mode {opened.mode}); it was refused because high_bit_depth=refuse. "
                    "Convert it to 8-bit first, or pass high_bit_depth=convert to reduce it automatically."
                )
            if opened.mode == "F":
                raise ImageReadError(
                    f"{path} is a floating-point image (mode F), which has no defined 0..255 range; "
                    "convert it to an 8-bit RGB image first."
                )
            icc_profile = opened.info.get("icc_profile")
            # exif_transpose copies the image even when there is nothing to rotate; skip it then (8K = 100 MB).
            needs_rotation = opened.getexif().get(ExifTags.Base.Orientation, 1) not in (0, 1)
            image = ImageOps.exif_transpose(opened) if needs_rotation else opened
            image.load()
    except ImageReadError:
        raise
    except Image.DecompressionBombError as error:
        raise ImageReadError(
            f"{path} was refused as a possible decompression bomb ({error}). If the file is trusted, raise Pillow's "
            "limit (PIL.Image.MAX_IMAGE_PIXELS) in your own script before calling stylize."
        ) from error
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise ImageReadError(f"Could not read {path} as an image: {error}") from error

    if sixteen_bit:
        warnings.warn(
            f"{path}: 16-bit image (mode {source_mode}) reduced to 8 bits per channel for stylization.",
            HighBitDepthWarning,
            stacklevel=2,
        )
        if image.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N"):
            values = np.asarray(image, dtype=np.int64)
            # 16-bit range to 8-bit with rounding: v * 255 / 65535 == v / 257.
            image = Image.fromarray(np.clip((values + 128) // 257, 0, 255).astype(np.uint8), mode="L")

    alpha = None
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    if keep_alpha and has_alpha:
        image = image.convert("RGBA")
        array = np.asarray(image)
        alpha = np.ascontiguousarray(array[:, :, 3])
        rgb = np.ascontiguousarray(array[:, :, :3])
    else:
        # np.asarray wraps PIL's buffer export (read-only, no second copy); convert() only when the mode differs.
        rgb = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    return ImageData(rgb=rgb, alpha=alpha, icc_profile=icc_profile, source_mode=source_mode)


def resize_shorter_side(image: Tensor, size: int) -> Tensor:
    """(3, H, W) uint8 -> (3, h, w) uint8 with min(h, w) == size (antialiased bilinear)."""
    height, width = image.shape[-2:]
    scale = size / min(height, width)
    target = (max(size, round(height * scale)), max(size, round(width * scale)))
    if target == (height, width):
        return image
    resized = F.interpolate(
        image[None].float(), size=target, mode="bilinear", antialias=True, align_corners=False
    )
    return resized[0].round().clamp(0, 255).to(torch.uint8)


def list_images(root: str | Path) -> list[Path]:
    """Image files under `root` (recursively), sorted so a seed gives the same order everywhere."""
    root = Path(root)
    if not root.is_dir():
        raise ImageNotFoundError(f"Content image folder not found: {root} (resolved: {root.resolve()}).")
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())


class ContentImageDataset(Dataset):
    """Random crops from an image folder: resize the shorter side to `resize_shorter` (default: `crop_size`), then
    a random `crop_size` square crop. Items are (3, crop, crop) uint8 tensors.

    samples_per_epoch: virtual epoch length (a handful of embedded images still gives many different crops);
    default one crop per image. cache: keep decoded, resized images in memory (per DataLoader worker).
    """

    def __init__(
        self,
        root: str | Path = EMBEDDED_CONTENT_DIR,
        crop_size: int = 256,
        resize_shorter: int | None = None,
        samples_per_epoch: int | None = None,
        cache: bool = True,
    ):
        self.paths = list_images(root)
        if not self.paths:
            raise ImageNotFoundError(
                f"No images ({', '.join(IMAGE_EXTENSIONS)}) found under {Path(root).resolve()}."
            )
        self.crop_size = crop_size
        self.resize_shorter = resize_shorter or crop_size
        if self.resize_shorter < crop_size:
            raise ValueError(f"resize_shorter={self.resize_shorter} is smaller than crop_size={crop_size}.")
        self.samples_per_epoch = samples_per_epoch or len(self.paths)
        self.cache: dict[int, Tensor] | None = {} if cache else None

    def __len__(self) -> int:
        return self.samples_per_epoch

    def _load(self, index: int) -> Tensor:
        if self.cache is not None and index in self.cache:
            return self.cache[index]
        rgb = read_image(self.paths[index]).rgb
        image = resize_shorter_side(torch.from_numpy(rgb.copy()).permute(2, 0, 1), self.resize_shorter)
        if self.cache is not None:
            self.cache[index] = image
        return image

    def __getitem__(self, index: int) -> Tensor:
        image = self._load(index % len(self.paths))
        height, width = image.shape[-2:]
        top = int(torch.randint(0, height - self.crop_size + 1, ()).item())
        left = int(torch.randint(0, width - self.crop_size + 1, ()).item())
        return image[:, top : top + self.crop_size, left : left + self.crop_size].contiguous()


def load_style_image(path: str | Path, size: int | None = None) -> Tensor:
    """A style image as (3, H, W) float32 in [0, 1], shorter side resized to `size` when given.

    A missing or unreadable file raises StyleImageError naming the path.
    """
    try:
        rgb = read_image(path).rgb
    except ImageNotFoundError as error:
        raise StyleImageError(
            f"Style image not found: {path} (resolved: {Path(path).resolve()}). Check the style path(s) in the "
            "config or the style= argument."
        ) from error
    except ImageReadError as error:
        raise StyleImageError(f"Style image {path} could not be used: {error}") from error
    image = torch.from_numpy(rgb.copy()).permute(2, 0, 1)
    if size is not None:
        image = resize_shorter_side(image, size)
    return image.float().div_(255.0)


def load_style_images(paths: str | Path | Sequence[str | Path], size: int | None = None) -> list[Tensor]:
    """One path or a list of paths -> list of style images (see `load_style_image`)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise StyleImageError("No style image given: set at least one style path.")
    return [load_style_image(path, size) for path in paths]


def embedded_style_paths() -> list[Path]:
    return list_images(EMBEDDED_STYLES_DIR)


# ------------------------------------------------------------------------------ rebuilding the embedded set

# name -> (loader, crop box (top, left, height, width) or None for the whole image). Content: photos with
# objects and faces; styles: strong colour/texture. Licences: data/style/README.md.
_EMBEDDED_SOURCES = {
    "content/astronaut.jpg": ("skimage:astronaut", None),
    "content/coffee.jpg": ("skimage:coffee", None),
    "content/chelsea.jpg": ("skimage:chelsea", None),
    "content/rocket.jpg": ("skimage:rocket", None),
    "content/china.jpg": ("sklearn:china.jpg", None),
    "styles/hubble_deep_field.jpg": ("skimage:hubble_deep_field", (0, 0, 512, 512)),
    "styles/immunohistochemistry.jpg": ("skimage:immunohistochemistry", None),
    "styles/dahlia_petals.jpg": ("sklearn:flower.jpg", (115, 195, 210, 210)),
    "styles/brick.jpg": ("skimage:brick", None),
}


def _load_source(spec: str) -> np.ndarray:
    package, name = spec.split(":")
    if package == "skimage":
        from skimage import data

        array = getattr(data, name)()
    else:
        from sklearn.datasets import load_sample_image

        array = load_sample_image(name)
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    return array[..., :3].astype(np.uint8)


def rebuild_embedded(out_dir: Path = EMBEDDED_DIR, max_side: int = 512, quality: int = 90) -> list[Path]:
    """Regenerate data/style/ from scikit-image and scikit-learn (both must be installed)."""
    written = []
    for relative, (spec, box) in _EMBEDDED_SOURCES.items():
        array = _load_source(spec)
        if box is not None:
            top, left, height, width = box
            array = array[top : top + height, left : left + width]
        image = Image.fromarray(array)
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        target = out_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        image.save(target, quality=quality, optimize=True)
        written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rebuild", action="store_true", help="regenerate data/style/ (needs scikit-image, sklearn)"
    )
    args = parser.parse_args(argv)
    if args.rebuild:
        for path in rebuild_embedded():
            print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")
    else:
        for path in list_images(EMBEDDED_DIR):
            print(path)


if __name__ == "__main__":
    main()
