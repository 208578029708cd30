"""Style data: the embedded offline images, content crops, style image errors, and image-reading rules."""

import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.style.data import (
    EMBEDDED_CONTENT_DIR,
    EMBEDDED_DIR,
    EMBEDDED_STYLES_DIR,
    ContentImageDataset,
    HighBitDepthWarning,
    ImageNotFoundError,
    ImageReadError,
    StyleImageError,
    embedded_style_paths,
    load_style_image,
    load_style_images,
    read_image,
)


def write_png16_rgb(array: np.ndarray, path) -> None:
    """A 16-bit RGB PNG written by hand (Pillow cannot write one)."""
    height, width, _ = array.shape
    raw = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def test_embedded_set_is_small_licensed_and_readable():
    contents, styles = sorted(EMBEDDED_CONTENT_DIR.glob("*.jpg")), embedded_style_paths()
    assert len(contents) >= 4 and len(styles) >= 3
    assert sum(p.stat().st_size for p in EMBEDDED_DIR.rglob("*")) < 2 * 2**20
    readme = (EMBEDDED_DIR / "README.md").read_text()
    for path in contents + styles:
        assert path.name in readme  # every file has its source and licence listed
        image = read_image(path).rgb
        assert image.dtype == np.uint8 and image.shape[2] == 3 and max(image.shape[:2]) <= 512
    assert all(p.parent == EMBEDDED_STYLES_DIR for p in styles)


def test_content_dataset_gives_random_uint8_crops():
    dataset = ContentImageDataset(
        EMBEDDED_CONTENT_DIR, crop_size=96, resize_shorter=128, samples_per_epoch=20
    )
    assert len(dataset) == 20
    torch.manual_seed(0)
    crops = [dataset[0] for _ in range(4)]
    assert all(c.shape == (3, 96, 96) and c.dtype == torch.uint8 for c in crops)
    assert any(not torch.equal(crops[0], c) for c in crops[1:])  # the crop position is random
    assert dataset[len(dataset.paths)].shape == (3, 96, 96)  # indices wrap around the image list
    with pytest.raises(ValueError, match="resize_shorter"):
        ContentImageDataset(EMBEDDED_CONTENT_DIR, crop_size=256, resize_shorter=128)


def test_content_dataset_folder_errors_name_the_folder(tmp_path):
    with pytest.raises(ImageNotFoundError, match="nope"):
        ContentImageDataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageNotFoundError, match="empty"):
        ContentImageDataset(tmp_path / "empty")


def test_style_image_loading_and_errors_name_the_path(tmp_path):
    style = load_style_image(embedded_style_paths()[0], size=64)
    assert (
        style.dtype == torch.float32 and min(style.shape[1:]) == 64 and style.min() >= 0 and style.max() <= 1
    )
    assert len(load_style_images(embedded_style_paths()[:2])) == 2
    missing = tmp_path / "no_such_style.jpg"
    with pytest.raises(StyleImageError, match="not found") as info:
        load_style_image(missing)
    assert str(missing) in str(info.value) and isinstance(info.value, OSError)
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    with pytest.raises(StyleImageError, match="could not be used") as info:
        load_style_image(corrupt)
    assert str(corrupt) in str(info.value)
    with pytest.raises(StyleImageError, match="No style image"):
        load_style_images([])


def test_16bit_gray_is_reduced_to_8bit_with_a_warning_or_refused(tmp_path):
    path = tmp_path / "gray16.png"
    Image.fromarray(np.array([[0, 257 * 128, 65535, 1000]], dtype=np.uint16)).save(path)
    assert Image.open(path).mode == "I;16"
    with pytest.warns(HighBitDepthWarning, match="16-bit"):
        image = read_image(path)
    np.testing.assert_array_equal(image.rgb[0, :, 0], [0, 128, 255, 4])  # scaled by 255/65535, not clipped
    assert (image.rgb[..., 0] == image.rgb[..., 2]).all()
    with pytest.raises(ImageReadError, match="16-bit.*high_bit_depth=refuse"):
        read_image(path, high_bit_depth="refuse")


def test_16bit_rgb_png_is_detected(tmp_path):
    path = tmp_path / "rgb16.png"
    array = np.zeros((4, 4, 3), np.uint16)
    array[..., 0] = 65535
    array[..., 1] = 257 * 100
    write_png16_rgb(array, path)
    with pytest.warns(HighBitDepthWarning):
        image = read_image(path)
    np.testing.assert_array_equal(image.rgb[0, 0], [255, 100, 0])
    with pytest.raises(ImageReadError, match="refuse"):
        read_image(path, high_bit_depth="refuse")


def test_rgba_alpha_is_separated_and_exif_orientation_applied(tmp_path):
    rgba = np.zeros((10, 20, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = np.linspace(0, 255, 20, dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    image = read_image(tmp_path / "a.png", keep_alpha=True)
    np.testing.assert_array_equal(image.alpha, rgba[..., 3])
    assert image.rgb.shape == (10, 20, 3) and (image.rgb[..., 0] == 200).all()
    assert read_image(tmp_path / "a.png").alpha is None

    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": the stored 20x10 picture is shown as 10x20
    Image.fromarray(rgba[..., :3]).save(tmp_path / "rotated.jpg", exif=exif)
    assert read_image(tmp_path / "rotated.jpg").rgb.shape == (20, 10, 3)


def test_float_images_are_refused(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.float32), "F").save(tmp_path / "f.tif")
    with pytest.raises(ImageReadError, match="floating-point"):
        read_image(tmp_path / "f.tif")
