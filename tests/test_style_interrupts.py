"""Ctrl-C to a style run with loader workers: exit status 130 and last.ckpt, no dead-worker error (the style case of
test_interrupts.py, with its helpers)."""

from __future__ import annotations

import re

import pytest

from tests.test_interrupts import _ctrl_c_to_a_training_process_group, _iteration


@pytest.mark.slow
def test_ctrl_c_to_a_style_run_with_loader_workers_exits_130_with_last_ckpt(tmp_path):
    """The workers get the Ctrl-C too and leave it to the training process: no dead-worker error."""
    run_dir = tmp_path / "run"
    proc, output = _ctrl_c_to_a_training_process_group(
        run_dir,
        "experiment=style_fast",
        "model.loss_net.pretrained=false",
        "model.stylizer.base_channels=8",
        "model.stylizer.num_residual_blocks=1",
        "data.batch_size=2",
        "data.resolution=32",
        "data.resize_shorter=48",
        "data.num_workers=1",
        "model.style_size=64",
        "model.validation.num_pairs=2",
        "model.validation.size=32",
        "train.sample_every_n_steps=0",
    )
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "DataLoader worker" not in output
    stopped = int(re.search(r"training stopped at the end of iteration (\d+)", output).group(1))
    assert _iteration(run_dir / "checkpoints" / "last.ckpt") == stopped < 400
