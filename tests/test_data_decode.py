"""Decoding stored images (`data.decoder`, data/decode.py): which decoder `auto` picks where, simplejpeg and the
batched device decoder (torchvision's decode_jpeg: nvJPEG on CUDA, libjpeg-turbo here) against Pillow's pixels, and
a whole run whose JPEG archive goes through the device-decode path (encoded bytes through the loader, decoded in
`on_before_batch_transfer`) on the CPU, as far as a machine without CUDA can take it. nvJPEG itself waits for a GPU
(`pytest -m gpu`)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.data import decode as decode_module
from pixelsmith.data.decode import (
    DecoderError,
    collate_encoded,
    decode_batch_on_device,
    decode_bytes,
    resolve_decoder,
    simplejpeg_available,
)
from pixelsmith.data.image_folder import decode_square
from pixelsmith.data.prepare import PrepareOptions, prepare
from pixelsmith.run.fit import run
from tests.conftest import FAST, compose_config


def _jpeg(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, width)[None, :, None] + rng.random((height, width, 3)) * 40
    buffer = io.BytesIO()
    Image.fromarray(ramp.astype(np.uint8)).save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("requested", "device", "jpeg", "expected"),
    [
        ("auto", "cuda", True, "nvjpeg"),
        ("auto", "cuda", False, "pil"),
        ("auto", "cpu", True, "simplejpeg" if simplejpeg_available() else "pil"),
        ("auto", "cpu", False, "pil"),
        ("pil", "cuda", True, "pil"),
    ],
)
def test_auto_picks_the_device_decoder_on_a_gpu_and_simplejpeg_on_a_cpu(requested, device, jpeg, expected):
    assert resolve_decoder(requested, device, jpeg) == expected


def test_nvjpeg_without_cuda_stops_at_set_up_naming_auto():
    with pytest.raises(DecoderError, match="device is cpu. Use data.decoder=auto"):
        resolve_decoder("nvjpeg", "cpu", True)
    with pytest.raises(DecoderError, match="auto, pil, simplejpeg, nvjpeg"):
        resolve_decoder("turbo", "cpu", True)


@pytest.mark.skipif(not simplejpeg_available(), reason="simplejpeg (the stream extra) is not installed")
@pytest.mark.parametrize(("size", "resolution"), [(64, 64), (256, 64), (200, 96)])
def test_simplejpeg_gives_pillows_pixels_within_jpeg_decoder_tolerance(size, resolution):
    data = _jpeg(size, size if size != 200 else 150)
    ours = decode_bytes(data, resolution, 3, "simplejpeg").float()
    pil = decode_square(io.BytesIO(data), resolution, 3).float()
    assert ours.shape == pil.shape == (3, resolution, resolution)
    assert (ours - pil).abs().mean() < 3.0  # two libjpeg IDCTs and resamplers: a few levels of 255
    grey = decode_bytes(data, resolution, 1, "simplejpeg")
    assert grey.shape == (1, resolution, resolution)


def test_the_batched_device_decoder_matches_pillow_and_fits_other_sizes_on_the_device():
    encoded = [torch.frombuffer(bytearray(_jpeg(32, 32, seed)), dtype=torch.uint8) for seed in range(3)]
    encoded.append(
        torch.frombuffer(bytearray(_jpeg(48, 32, 9)), dtype=torch.uint8)
    )  # wider: cropped and resized
    batch = decode_batch_on_device(encoded, 32, 3, torch.device("cpu"))
    assert batch.dtype == torch.uint8 and batch.shape == (4, 3, 32, 32)
    for image, data in zip(batch[:3], encoded[:3], strict=True):
        pil = decode_square(io.BytesIO(data.numpy().tobytes()), 32, 3)
        assert (image.float() - pil.float()).abs().mean() < 2.0
    images, flags, labels = collate_encoded([(encoded[0], 0, 1), (encoded[1], 1, 0)])
    assert isinstance(images, list) and flags.tolist() == [0, 1] and labels.tolist() == [1, 0]


def test_a_run_through_the_device_decode_path_on_the_cpu(tmp_path, monkeypatch):
    """The archive stores JPEG; the decoder is forced to the device path (CUDA's, run here on the CPU device): the
    loader yields encoded bytes, the datamodule decodes them before the transfer, and training runs on them."""
    source = tmp_path / "images"
    source.mkdir()
    for i in range(8):
        (source / f"{i}.jpg").write_bytes(_jpeg(40, 40, i))
    dest = tmp_path / "j.zip"
    prepare(PrepareOptions(str(source), str(dest), 32, encoding="jpeg", workers=1, progress=False))
    monkeypatch.setattr(decode_module, "resolve_decoder", lambda requested, device, jpeg: "nvjpeg")
    calls = []
    real = decode_module.decode_batch_on_device

    def counting(*args):
        calls.append(len(args[0]))
        return real(*args)

    monkeypatch.setattr(decode_module, "decode_batch_on_device", counting)
    cfg = compose_config(
        [
            *FAST,
            "data=zip",
            f"data.path={dest}",
            "data.resolution=32",
            "data.batch_size=4",
            "max_steps=3",
            "model.generator.ngf=16",
            "model.discriminator.ndf=16",
            "train.sample_every_n_steps=0",
        ],
        tmp_path / "run",
    )
    metrics = run(cfg)
    assert metrics["iteration"] == 3 and calls == [4, 4, 4]
