"""Checkpoint writes under fire: last.ckpt first (step files are links to it), stale partial files from a killed
run removed at start-up, and a full disk or read-only directory stopping the run with one paragraph."""

from __future__ import annotations

import errno
import logging
import os

import lightning as L
import pytest
import torch

from pixelsmith.run.entry import guarded_run
from pixelsmith.run.fit import run


def test_periodic_checkpoints_are_links_to_last_and_stale_partials_are_removed(make_cfg, tmp_path):
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    stale = [ckpt_dir / ".last.ckpt.partial", ckpt_dir / ".step_0000002.ckpt.partial"]
    for path in stale:
        path.write_bytes(b"half a checkpoint")  # what a kill during a write leaves
    run(make_cfg("max_steps=4", "train.checkpoint_every_n_steps=2", "train.sample_every_n_steps=0"))
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [
        "last.ckpt",
        "step_0000002.ckpt",
        "step_0000004.ckpt",
    ]
    assert os.path.samefile(ckpt_dir / "last.ckpt", ckpt_dir / "step_0000004.ckpt")  # one write, two names
    assert not os.path.samefile(ckpt_dir / "step_0000002.ckpt", ckpt_dir / "step_0000004.ckpt")
    for name, iteration in (("step_0000002.ckpt", 2), ("last.ckpt", 4)):
        state = torch.load(ckpt_dir / name, map_location="cpu", weights_only=True)
        assert state["pixelsmith"]["iteration"] == iteration


@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "read-only")])
def test_full_disk_or_read_only_dir_stops_with_one_paragraph(
    make_cfg, tmp_path, monkeypatch, caplog, code, words
):
    original = L.Trainer.save_checkpoint

    def save_checkpoint(self, filepath, *args, **kwargs):
        if "0000004" in str(filepath):
            with open(filepath, "wb") as handle:  # a write that got part of the way
                handle.write(b"partial")
            raise OSError(code, os.strerror(code), str(filepath))
        return original(self, filepath, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "save_checkpoint", save_checkpoint)
    cfg = make_cfg("max_steps=6", "train.checkpoint_every_n_steps=2", "train.sample_every_n_steps=0")
    with caplog.at_level(logging.ERROR, logger="pixelsmith"), pytest.raises(SystemExit) as exit_info:
        guarded_run(run, cfg, objective="loss/G")
    assert exit_info.value.code == 2
    message = caplog.records[-1].getMessage()
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert words in message and str(ckpt_dir) in message and "hydra.run.dir" in message
    assert "Traceback" not in message
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["last.ckpt", "step_0000002.ckpt"]  # no partial left
    assert torch.load(ckpt_dir / "last.ckpt", weights_only=True)["pixelsmith"]["iteration"] == 2


class _NotATensor:
    """Stands for anything a foreign checkpoint pickles besides tensors and plain containers."""


def test_resume_refuses_a_checkpoint_that_needs_full_unpickling(make_cfg, tmp_path, caplog):
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}, "trainer": _NotATensor()}, foreign)
    cfg = make_cfg("max_steps=2", f"ckpt_path={foreign}")
    with caplog.at_level(logging.ERROR, logger="pixelsmith"), pytest.raises(SystemExit):
        guarded_run(run, cfg, objective="loss/G")
    message = caplog.records[-1].getMessage()
    assert "weights_only=True" in message and str(foreign) in message and "last.ckpt" in message
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained, nothing written
