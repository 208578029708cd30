"""Data: the embedded MNIST default, and users' image folders with unreadable files, empty or missing folders."""

from __future__ import annotations

import os
import re
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.data.image_folder import DataFolderError, ImageFolderDataset, list_images
from pixelsmith.data.mnist import load_mnist
from pixelsmith.run.fit import run
from tests.conftest import metrics_rows, series


def test_mnist_is_embedded_and_resized():
    images, labels = load_mnist(32)
    assert images.shape == (5000, 1, 32, 32) and images.dtype == torch.uint8
    assert torch.bincount(labels).tolist() == [500] * 10
    assert 30 < images.float().mean() < 45  # mostly black background with white strokes


def _write_images(folder, count, size=(40, 30)):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        array = rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(array).save(folder / f"img_{i:03d}.{'png' if i % 2 else 'jpg'}")


def test_image_folder_lists_recursively_and_decodes_square(tmp_path):
    _write_images(tmp_path / "a", 3)
    _write_images(tmp_path / "a" / "nested", 2)
    files = list_images(tmp_path, ["jpg", "png"])
    assert len(files) == 5
    image, substituted = ImageFolderDataset(files, 16, 3)[0]
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and substituted == 0


def test_missing_and_empty_folders_are_clear_errors(tmp_path):
    with pytest.raises(DataFolderError, match="is not a folder.*data.root="):
        list_images(tmp_path / "nope", ["jpg"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    with pytest.raises(DataFolderError, match="holds no images.*data.extensions"):
        list_images(tmp_path / "empty", ["jpg", "png"])


def test_corrupt_file_is_skipped_with_a_warning_or_names_its_path(tmp_path, caplog):
    _write_images(tmp_path, 3)
    corrupt = tmp_path / "img_001.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    files = list_images(tmp_path, ["jpg", "png"])
    skipping = ImageFolderDataset(files, 16, 3, on_corrupt="skip")
    image, substituted = skipping[1]
    assert substituted == 1 and image.shape == (3, 16, 16)
    assert "img_001.png" in caplog.text
    strict = ImageFolderDataset(files, 16, 3, on_corrupt="error")
    with pytest.raises(DataFolderError, match="img_001.png.*data.on_corrupt=skip"):
        strict[1]


def test_training_on_an_image_folder_counts_skipped_files(make_cfg, tmp_path):
    folder = tmp_path / "images"
    _write_images(folder, 12)
    (folder / "img_003.png").write_bytes(b"garbage")
    assert _skipped_files_per_iteration(make_cfg, tmp_path, folder, batch=4, steps=3) == [
        1.0,
        1.0,
        1.0,
    ]  # the one broken file, counted once, from the first iteration on


def _skipped_files_per_iteration(make_cfg, tmp_path, folder, batch: int, steps: int) -> list[float]:
    """Train on an image folder, logging every iteration; the data/skipped_files series from metrics.csv."""
    overrides = ["data=image_folder", f"data.root={folder}", "data.resolution=16", f"data.batch_size={batch}"]
    overrides += [
        "data.num_workers=1",
        f"max_steps={steps}",
        "train.log_every_n_steps=1",
        "precision=32-true",
    ]
    assert run(make_cfg(*overrides))["iteration"] == steps
    return series(metrics_rows(tmp_path / "run"), "data/skipped_files")


def _new_user_folder(folder):
    """33 valid images of every awkward kind and 5 broken ones, as a new user's folder might hold."""
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(29):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(folder / f"ok_{i:02d}.png")
    Image.new("CMYK", (20, 20), (0, 255, 0, 0)).save(folder / "cmyk.jpg")
    Image.fromarray(np.full((20, 20), 32896, dtype=np.uint16)).save(folder / "grey16.png")  # mid-grey, 16 bit
    palette = Image.new("P", (20, 20))
    palette.info["transparency"] = 0
    palette.save(folder / "palette_alpha.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    Image.new("RGB", (30, 20), (10, 200, 10)).save(folder / "exif_rotated.jpg", exif=exif)
    good = Image.new("RGB", (20, 20)).tobytes()
    (folder / "truncated.png").write_bytes((folder / "ok_00.png").read_bytes()[:60])
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("this is not an image")
    (folder / "random.png").write_bytes(rng.integers(0, 255, 5000, dtype=np.uint8).tobytes())
    # A decompression bomb: a PNG whose header claims 20000 x 20000 (400 megapixels; Pillow refuses it).
    Image.new("L", (1, 1)).save(folder / "bomb.png")
    data = bytearray((folder / "bomb.png").read_bytes())
    data[16:24] = struct.pack(">II", 20000, 20000)  # IHDR width, height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # the IHDR chunk's CRC
    (folder / "bomb.png").write_bytes(bytes(data))
    del good
    return {"truncated.png", "empty.jpg", "text.jpg", "random.png", "bomb.png"}


def test_a_new_users_folder_skips_exactly_the_broken_files_once(make_cfg, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PIXELSMITH_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "images"
    broken = _new_user_folder(folder)
    skipped = _skipped_files_per_iteration(make_cfg, tmp_path, folder, batch=8, steps=10)
    assert skipped == [5.0] * 10  # distinct files, not every re-read of them (the issue saw 84)
    warned = [r.getMessage() for r in caplog.records if "Skipping unreadable image" in r.getMessage()]
    names = [m.removeprefix("Skipping unreadable image ").split(" (")[0].rsplit("/", 1)[-1] for m in warned]
    assert sorted(names) == sorted(broken)  # once per file


def test_the_check_is_cached_so_a_rerun_decodes_nothing_again(tmp_path, monkeypatch):
    from pixelsmith.data import image_check
    from pixelsmith.data.image_check import check_images

    folder = tmp_path / "images"
    broken = _new_user_folder(folder)
    files = list_images(folder, ["jpg", "png"])
    calls = []

    def decode(path):
        calls.append(path)
        return image_check_decode(path)

    from pixelsmith.data.image_folder import decode_square

    def image_check_decode(path):
        return decode_square(path, 16, 3)

    first = check_images(folder, files, decode, cache_dir=tmp_path / "cache")
    assert {p.name for p in first} == broken and len(calls) == 38
    calls.clear()
    again = check_images(folder, files, decode, cache_dir=tmp_path / "cache")
    assert again == first and calls == []  # every verdict came from the cache
    (folder / "text.jpg").write_bytes((folder / "ok_01.png").read_bytes())  # fixed: new mtime and size
    fixed = check_images(folder, files, decode, cache_dir=tmp_path / "cache")
    assert [p.name for p in calls] == ["text.jpg"] and "text.jpg" not in {p.name for p in fixed}
    assert image_check.CACHE_VERSION == 1


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_on_corrupt_error_stops_before_the_first_iteration_in_one_paragraph(tmp_path):
    from tests.conftest import run_cli

    folder = tmp_path / "images"
    _new_user_folder(folder)
    result = run_cli(
        [
            "train.py",
            "data=image_folder",
            f"data.root={folder}",
            "data.on_corrupt=error",
            "data.resolution=16",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        timeout=300,
        env_extra={"PIXELSMITH_CACHE": str(tmp_path / "cache")},
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "5 of 38 images" in output and "data.on_corrupt=skip" in output and "bomb.png" in output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_sixteen_bit_grey_is_scaled_not_clipped(tmp_path):
    from PIL import Image

    from pixelsmith.data.image_folder import decode_square

    Image.fromarray(np.full((20, 24), 32896, dtype=np.uint16)).save(tmp_path / "g.png")
    for channels in (1, 3):
        assert decode_square(tmp_path / "g.png", 16, channels).float().mean() == 128.0  # was 255 (clipped)


@pytest.mark.parametrize(("rank", "world", "start"), [(0, 1, 0), (1, 2, 5), (0, 3, 7)])
def test_device_resident_batches_follow_the_sampler_stream_across_epochs(rank, world, start):
    """data.on_device serves the very batches the DataLoader path draws, for every rank and from any resume point,
    including batches that span the end of an epoch (n=10 items, 3 per rank)."""
    from torch.utils.data import DataLoader

    from pixelsmith.data.mnist import TensorImageDataset
    from pixelsmith.data.on_device import DeviceResidentBatches
    from pixelsmith.data.sampler import IterationSampler

    images = torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 1, 2, 2).contiguous()
    sampler = IterationSampler(
        10, 3, seed=4, start_iteration=start, num_iterations=9, rank=rank, world_size=world
    )
    through_loader = [
        b.flatten(1)[:, 0].tolist() for b in DataLoader(TensorImageDataset(images), 3, sampler=sampler)
    ]
    on_device = [b.flatten(1)[:, 0].tolist() for b in DeviceResidentBatches(images, sampler)]
    assert on_device == through_loader and len(on_device) == 9
    assert len({tuple(sorted(b)) for b in on_device}) > 1  # really shuffled, epoch by epoch


def test_training_with_data_on_the_device_equals_the_dataloader_run(make_cfg, tmp_path):
    from lightning.pytorch.callbacks import Callback

    from pixelsmith.data.on_device import DeviceResidentBatches

    seen = []

    class LoaderKind(Callback):
        def on_train_start(self, trainer, pl_module):
            seen.append(type(trainer.train_dataloader).__name__)

    import pixelsmith.run.fit as train_module

    original = train_module.build_trainer

    def with_probe(cfg, hardware):
        trainer = original(cfg, hardware)
        trainer.callbacks.append(LoaderKind())
        return trainer

    results = {}
    for on_device in (True, False):
        cfg = make_cfg(f"data.on_device={str(on_device).lower()}", "max_steps=4", output=f"run_{on_device}")
        train_module.build_trainer = with_probe
        try:
            results[on_device] = run(cfg)
        finally:
            train_module.build_trainer = original
    assert seen == [DeviceResidentBatches.__name__, "DataLoader"]
    for key in ("loss/D", "loss/G"):
        assert results[True][key] == results[False][key], key  # bit-identical batches, so identical training


def test_a_large_png_is_decoded_once_to_the_training_size_and_cached(tmp_path, monkeypatch):
    """A huge non-JPEG image was decoded in full on every draw (a 144-megapixel PNG: 2.2 GB each time)."""
    from pixelsmith.data import image_folder

    monkeypatch.setattr(image_folder, "LARGE_IMAGE_PIXELS", 100 * 100)
    path = tmp_path / "big.png"
    gradient = np.tile(np.arange(256, dtype=np.uint8), (160, 1))[:, :200]
    Image.fromarray(np.stack([gradient] * 3, axis=-1)).save(path)
    small = tmp_path / "small.png"
    Image.fromarray(gradient[:50, :50]).save(small)
    cache = tmp_path / "cache"

    first = image_folder.decode_cached(path, 16, 3, cache_dir=cache)
    assert torch.equal(first, image_folder.decode_square(path, 16, 3))
    assert len(list(cache.glob("*.npy"))) == 1
    decodes = []
    original = image_folder.decode_square
    monkeypatch.setattr(image_folder, "decode_square", lambda *a: decodes.append(a) or original(*a))
    assert torch.equal(image_folder.decode_cached(path, 16, 3, cache_dir=cache), first)
    assert decodes == []  # read from the cache, not decoded again
    image_folder.decode_cached(small, 16, 3, cache_dir=cache)  # small files are not cached
    assert len(decodes) == 1 and len(list(cache.glob("*.npy"))) == 1
    image_folder.decode_cached(path, 8, 3, cache_dir=cache)  # another training size is another square
    assert len(list(cache.glob("*.npy"))) == 2
    os.utime(path, ns=(1, 1))  # the file changed: decoded again
    image_folder.decode_cached(path, 16, 3, cache_dir=cache)
    assert len(decodes) == 3


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_a_killed_loader_worker_ends_the_run_with_one_paragraph_naming_it(
    make_cfg, tmp_path, monkeypatch, caplog
):
    """A worker killed mid-run (the out-of-memory killer's way): the run stops with exit status 2 and one paragraph
    that says a data-loader worker died, its pid and signal, and the fix; no traceback."""
    import signal

    from pixelsmith.data import image_folder
    from pixelsmith.run.entry import guarded_run

    folder = tmp_path / "images"
    _write_images(folder, 12)
    parent = os.getpid()
    original = image_folder.decode_cached

    def decode_then_die(path, *args):
        if os.getpid() != parent and path.name == "img_005.png":
            os.kill(
                os.getpid(), signal.SIGKILL
            )  # in the worker only: the check at set-up runs in this process
        return original(path, *args)

    monkeypatch.setattr(image_folder, "decode_cached", decode_then_die)
    cfg = make_cfg(
        "data=image_folder",
        f"data.root={folder}",
        "data.resolution=16",
        "data.batch_size=4",
        "data.num_workers=1",
        "max_steps=6",
        "precision=32-true",
    )
    with pytest.raises(SystemExit) as info:
        guarded_run(run, cfg, objective="loss/G")
    assert info.value.code == 2
    message = caplog.text
    # torch says "is killed by signal: Killed" or "exited unexpectedly", depending on which of its checks saw it.
    assert re.search(r"A data-loader worker died: DataLoader worker \(pid(\(s\))? \d+\)", message), message
    assert "data.num_workers=0" in message and "Traceback" not in message


def test_mirror_doubles_an_image_folder_with_x_flipped_copies(tmp_path):
    """NVlabs `training/dataset.py` with xflip=True: the raw indices tiled twice, items n..2n-1 flipped left-right
    (`image[:, :, ::-1]`). Checked against numpy's flip of the decoded pixels."""
    from pixelsmith.data.image_folder import ImageFolderDataModule

    _write_images(tmp_path, 3, size=(20, 20))
    plain = ImageFolderDataModule(str(tmp_path), resolution=16, batch_size=2)
    mirrored = ImageFolderDataModule(str(tmp_path), resolution=16, batch_size=2, mirror=True)
    plain.setup()
    mirrored.setup()
    assert len(plain.train_set) == 3 and len(mirrored.train_set) == 6
    for i in range(3):
        image, substituted = plain.train_set[i]
        assert torch.equal(mirrored.train_set[i][0], image)
        flipped, flipped_substituted = mirrored.train_set[3 + i]
        assert (
            np.array_equal(flipped.numpy(), image.numpy()[:, :, ::-1]) and flipped_substituted == substituted
        )
        assert not torch.equal(flipped, image)  # random pixels: a flip really changes them
    # FID's reference is the folder's own images, not the flipped copies.
    assert mirrored.reference_source()[3] == 3


@pytest.mark.parametrize("on_device", [True, False])
def test_mirror_doubles_mnist_on_the_device_and_through_the_loader(on_device):
    from pixelsmith.data.mnist import MNISTDataModule

    module = MNISTDataModule(limit=10, batch_size=20, on_device=on_device, mirror=True, max_steps=1)
    module.setup()
    originals = load_mnist(32)[0][:10].numpy()
    images = module.train_set.images.numpy()
    assert images.shape == (20, 1, 32, 32)
    assert np.array_equal(images[:10], originals) and np.array_equal(images[10:], originals[:, :, :, ::-1])
    (batch,) = list(module.train_dataloader())  # one iteration of 20 = the whole doubled set, shuffled
    assert sorted(map(bytes, batch.numpy())) == sorted(map(bytes, images))


def test_data_mirror_reaches_the_datamodule_from_the_config(make_cfg):
    from pixelsmith.run.build import build_datamodule, resolve_hardware

    cfg = make_cfg("data.mirror=true", "data.limit=8")
    module = build_datamodule(cfg, resolve_hardware(cfg))
    module.setup()
    assert module.mirror and len(module.train_set) == 16


def test_fewer_digits_than_one_batch_stop_at_set_up_naming_the_counts_and_the_fix(make_cfg, tmp_path):
    from pixelsmith.data.base import BatchSizeError

    cfg = make_cfg("data.limit=20", "data.batch_size=64")
    with pytest.raises(BatchSizeError) as caught:
        run(cfg)
    message = str(caught.value)
    assert "data.limit=20 holds 20 images" in message and "(data.batch_size=64)" in message
    assert "data.batch_size=20 or smaller" in message
    # Refused before the run wrote anything: the corrected command can use the dir.
    assert not (tmp_path / "run" / "final_metrics.json").exists()
    assert not (tmp_path / "run" / "config_resolved.yaml").exists()
    # Accumulation counts: 20 digits, 2 micro-batches of 16 = 32 per iteration.
    with pytest.raises(
        BatchSizeError, match=r"data.batch_size=16 x accumulate=2 = 32 images.*batch_size=10 or"
    ):
        run(make_cfg("data.limit=20", "data.batch_size=16", "accumulate=2", output="acc"))


def test_exactly_one_batch_of_digits_trains(make_cfg, tmp_path):
    metrics = run(make_cfg("data.limit=16", "data.batch_size=16", "max_steps=2", "precision=32-true"))
    assert metrics["iteration"] == 2 and metrics["stop_reason"] == "max_steps"


def test_an_image_folder_smaller_than_one_batch_stops_at_set_up(make_cfg, tmp_path):
    from pixelsmith.data.base import BatchSizeError

    _write_images(tmp_path / "images", 5)
    cfg = make_cfg(
        "data=image_folder", f"data.root={tmp_path / 'images'}", "data.resolution=16", "data.mirror=true"
    )
    with pytest.raises(BatchSizeError) as caught:
        run(cfg)
    # 5 files and their 5 flipped copies: 10 images for a batch of 16.
    assert "holds 10 images" in str(caught.value) and "data.batch_size=10 or smaller" in str(caught.value)
    assert not (tmp_path / "run" / "config_resolved.yaml").exists()
