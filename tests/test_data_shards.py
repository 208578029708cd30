"""Streaming shards (`data=shards`, litdata) written by `python prepare.py ... format=shards`: 2 processes with 2
loader workers each see every image exactly once per epoch; a resumed run continues the stream (weights bit for bit
against a straight run); labels reach the batch; an undecodable sample is skipped and counted, or stops an error run
naming it; a folder without shards names the command that writes them. Local folders only (no network)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image

pytest.importorskip("litdata")

from pixelsmith.data.prepare import PrepareOptions, prepare  # noqa: E402
from pixelsmith.data.shards import ShardsDataModule, ShardsError  # noqa: E402
from pixelsmith.run.fit import run  # noqa: E402
from tests.conftest import FAST, compose_config, last_checkpoint  # noqa: E402


def _numbered_images(root: Path, count: int, classes: int = 2) -> Path:
    """Image i is flat at grey level 5 * i (decodes back to its number), in class subfolder i % classes."""
    for i in range(count):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 5 * i, dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return root


def _shards(tmp_path: Path, count: int = 40, chunk_mb: int = 64, resolution: int = 8) -> Path:
    dest = tmp_path / "shards"
    prepare(
        PrepareOptions(
            str(_numbered_images(tmp_path / "images", count)),
            str(dest),
            resolution,
            format="shards",
            workers=1,
            progress=False,
            chunk_mb=chunk_mb,
        )
    )
    return dest


def _epoch_on_rank(rank: int, world: int, path: str, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        module = ShardsDataModule(
            path, resolution=8, batch_size=5, num_workers=2, seed=3, persistent_workers=False
        )
        module.setup()
        seen = [int(v) // 5 for images, _flags in module.train_dataloader() for v in images[:, 0, 0, 0]]
        torch.save(seen, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_processes_with_two_workers_each_see_every_image_exactly_once_per_epoch(tmp_path):
    path = _shards(tmp_path)
    mp.spawn(_epoch_on_rank, args=(2, str(path), str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 20  # 40 images, 2 ranks: 2 workers x 2 batches of 5 each
    assert not set(ranks[0]) & set(ranks[1])  # disjoint parts
    assert sorted(ranks[0] + ranks[1]) == list(range(40))  # every image once
    assert ranks[0] != sorted(ranks[0])  # shuffled


def test_a_resumed_run_continues_the_stream_bit_for_bit(tmp_path):
    """6 straight iterations == 3, a resume from last.ckpt, 3 more: the loader's position comes back with it (the
    epoch of 40 images is 10 batches, so a stream restarted from its beginning would train on other images)."""
    path = _shards(tmp_path, resolution=16)  # the resolution it trains at
    common = [
        *FAST,
        "model.generator.ngf=16",
        "model.discriminator.ndf=16",
        "data=shards",
        f"data.path={path}",
        "data.resolution=16",
        "data.batch_size=4",
        "data.num_workers=2",
        "train.sample_every_n_steps=0",
        "train.checkpoint_every_n_steps=3",
        "precision=32-true",
    ]
    run(compose_config([*common, "max_steps=6"], tmp_path / "straight"))
    run(compose_config([*common, "max_steps=3"], tmp_path / "resumed"))
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    assert last_checkpoint(tmp_path / "resumed")["loops"]["fit_loop"]["state_dict"].get("combined_loader")
    run(compose_config([*common, "max_steps=6", f"ckpt_path={last}"], tmp_path / "resumed"))
    straight, resumed = last_checkpoint(tmp_path / "straight"), last_checkpoint(tmp_path / "resumed")
    for key, value in straight["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key


def test_labels_come_with_the_batch(tmp_path):
    module = ShardsDataModule(str(_shards(tmp_path, count=10)), resolution=8, labels=True, batch_size=5)
    module.setup()
    images, flags, labels = next(iter(module.train_dataloader()))
    assert labels.dtype == torch.int64 and flags.sum() == 0
    assert torch.equal(labels, (images[:, 0, 0, 0].long() // 5) % 2)  # image i is in class i % 2


def _corrupt_one_sample(path: Path) -> None:
    """Overwrite the PNG signature of one stored image inside the chunk file (its bytes no longer decode)."""
    chunk = next(path.glob("chunk-*.bin"))
    data = bytearray(chunk.read_bytes())
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 5 * 3, dtype=np.uint8)).save(buffer, format="PNG")
    start = data.find(b"\x89PNG", data.find(b"\x89PNG", data.find(b"\x89PNG") + 1) + 1)  # the third image
    data[start : start + 8] = b"XXXXXXXX"
    chunk.write_bytes(bytes(data))


def test_an_undecodable_sample_is_skipped_and_counted_or_stops_an_error_run(tmp_path, caplog):
    path = _shards(tmp_path, count=10)
    _corrupt_one_sample(path)
    module = ShardsDataModule(str(path), resolution=8, batch_size=10, shuffle=False)
    module.setup()
    with caplog.at_level("WARNING"):
        images, flags = next(iter(module.train_dataloader()))
    assert flags.tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert torch.equal(images[2], images[1])  # the worker's previous image stands in
    assert "Skipping undecodable sample 2 of the shards in" in caplog.text
    strict = ShardsDataModule(str(path), resolution=8, batch_size=10, shuffle=False, on_corrupt="error")
    strict.setup()
    with pytest.raises(ShardsError, match=r"Cannot decode sample 2 of the shards in .*on_corrupt=skip"):
        next(iter(strict.train_dataloader()))


def test_a_folder_without_shards_names_the_command_that_writes_them(tmp_path):
    with pytest.raises(
        ShardsError, match=r"no index.json.*python prepare.py source=<images> dest=.* format=shards"
    ):
        ShardsDataModule(str(tmp_path), resolution=8, batch_size=2).setup()


def _shards_run(path: Path, out: Path, *extra: str):
    overrides = [
        *FAST,
        "model.generator.ngf=16",
        "model.discriminator.ndf=16",
        "data=shards",
        f"data.path={path}",
    ]
    overrides += [
        "data.resolution=16",
        "data.num_workers=0",
        "train.sample_every_n_steps=0",
        "precision=32-true",
    ]
    return compose_config([*overrides, "max_steps=3", *extra], out)


def test_shards_smaller_than_one_batch_stop_at_set_up_naming_the_counts_and_the_fix(tmp_path):
    from pixelsmith.data.base import BatchSizeError

    path = _shards(tmp_path, count=20, resolution=16)
    with pytest.raises(BatchSizeError) as caught:
        run(_shards_run(path, tmp_path / "run", "data.batch_size=64"))
    message = str(caught.value)
    assert "holds 20 images" in message and "(data.batch_size=64)" in message
    assert (
        "drop_last" in message
        and "train 0 iterations" in message
        and "data.batch_size=20 or smaller" in message
    )
    assert not (tmp_path / "run" / "final_metrics.json").exists()
    # data.limit counts too: 20 stored, 8 used, batch 16.
    with pytest.raises(BatchSizeError, match=r"data.limit=8 holds 8 images"):
        run(_shards_run(path, tmp_path / "limited", "data.limit=8"))


def test_a_run_that_gets_no_batch_is_an_error_never_stop_reason_max_steps(tmp_path, monkeypatch):
    """Past the set-up check (switched off here), a loader that yields nothing ends fit at once: the run says so and
    final_metrics.json records stop_reason data_exhausted."""
    from pixelsmith.data.base import ImageDataModule
    from pixelsmith.run.fit import DataExhaustedError

    monkeypatch.setattr(ImageDataModule, "check_fits_one_batch", lambda self, *args, **kwargs: None)
    with pytest.raises(DataExhaustedError, match=r"iteration 0 of max_steps=3, having trained 0 iterations"):
        run(_shards_run(_shards(tmp_path, count=20, resolution=16), tmp_path / "run", "data.batch_size=64"))
    final = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert final["stop_reason"] == "data_exhausted" and final["iteration"] == 0


def test_the_chunk_cache_size_is_a_config_key_said_once_not_every_epoch(tmp_path, caplog):
    path = str(_shards(tmp_path, count=10))
    module = ShardsDataModule(path, resolution=8, batch_size=5, max_cache_size="2GB")
    with caplog.at_level("INFO"):
        module.setup()
        for _epoch in range(3):
            assert len(list(module.train_dataloader())) == 2
    assert module.train_set.max_cache_size == "2GB"
    assert caplog.text.count("chunk cache holds at most 2GB (data.max_cache_size)") == 1
    assert "max_cache_size is unset" not in caplog.text  # litdata's line, once per epoch without a size
    assert (
        compose_config([*FAST, "data=shards", f"data.path={path}"], tmp_path / "c").data.max_cache_size
        == "50GB"
    )
    with pytest.raises(ShardsError, match=r"data.max_cache_size='0.5'.*e.g. data.max_cache_size=50GB"):
        ShardsDataModule(path, resolution=8, batch_size=5, max_cache_size="0.5")
