"""GPU-specific failures explained: an out-of-memory or a torch.compile error mid-run stops with one paragraph that
names the key avoiding it, keeps the checkpoints already written, and leaves the traceback in the run dir.

Both are provoked on CPU: the OOM is raised at a chosen iteration, the compiler error by a failing inductor.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo

# General code checked with the GAN part as its vehicle: a fork without it (README "Removing a part") skips
# this file rather than failing to import it.
pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")

from pixelsmith.gan.module import GANModule  # noqa: E402
from pixelsmith.run.entry import guarded_run  # noqa: E402
from pixelsmith.run.fit import run  # noqa: E402


def _fail_at_iteration(monkeypatch, iteration: int, error: BaseException) -> None:
    original = GANModule.training_step

    def training_step(self, batch, batch_idx):
        if self.iteration == iteration:
            raise error
        return original(self, batch, batch_idx)

    monkeypatch.setattr(GANModule, "training_step", training_step)


def test_out_of_memory_names_the_batch_fix_and_keeps_checkpoints(make_cfg, tmp_path, monkeypatch, caplog):
    _fail_at_iteration(
        monkeypatch, 3, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    )
    cfg = make_cfg("max_steps=6", "train.checkpoint_every_n_steps=2", "train.sample_every_n_steps=0")
    with caplog.at_level(logging.ERROR, logger="pixelsmith"), pytest.raises(SystemExit) as exit_info:
        guarded_run(run, cfg, objective="loss/G")
    assert exit_info.value.code == 2
    message = caplog.records[-1].getMessage()
    assert "Out of memory" in message and "data.batch_size=8 with accumulate=2" in message
    assert "auto_batch.enabled=true" in message and "step_0000002.ckpt" in message
    assert "Traceback" not in message
    out = tmp_path / "run"
    assert "OutOfMemoryError" in (out / "error_traceback.txt").read_text()
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["pixelsmith"]["iteration"] == 2


def test_compiler_failure_names_hardware_compile_false(make_cfg, tmp_path, monkeypatch, caplog):
    import torch._inductor.compile_fx as compile_fx

    def broken_inductor(*args, **kwargs):
        raise RuntimeError("synthetic inductor failure")

    monkeypatch.setattr(compile_fx, "compile_fx", broken_inductor)
    torch._dynamo.reset()
    cfg = make_cfg("max_steps=2", "hardware.compile=true", "train.sample_every_n_steps=0")
    try:
        with caplog.at_level(logging.ERROR, logger="pixelsmith"), pytest.raises(SystemExit):
            guarded_run(run, cfg, objective="loss/G")
    finally:
        torch._dynamo.reset()  # drop the failed compile's state for later tests
    message = caplog.records[-1].getMessage()
    assert "torch.compile failed" in message and "synthetic inductor failure" in message
    assert "hardware.compile=false" in message and "No checkpoint had been written yet" in message
    assert (tmp_path / "run" / "error_traceback.txt").is_file()


def test_other_errors_keep_their_traceback(make_cfg, monkeypatch):
    _fail_at_iteration(monkeypatch, 1, ValueError("a bug in a forked model"))
    with pytest.raises(ValueError, match="a bug in a forked model"):
        guarded_run(run, make_cfg("max_steps=3", "train.sample_every_n_steps=0"), objective="loss/G")
