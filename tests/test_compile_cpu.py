"""torch.compile on CPU (inductor's C++ backend): the GPU profiles' code path, as far as a CPU can run it.

The GPU profiles train compiled, in channels_last, with sample grids and FID evaluation between iterations and, for
StyleGAN2-style runs, lazy R1 through ADA. These tests run that mix on CPU, so a double backward through a compiled
network, a compiled network shared between training and sampling, or an augmentation without a double backward
fails here instead of at the first iteration on a GPU.
"""

from __future__ import annotations

import csv
import math

import pytest
import torch
import torch._dynamo

from pixelsmith.core.module import eager
from pixelsmith.train import run

pytestmark = pytest.mark.slow

COMPILED_MIX = [
    "hardware.compile=true",
    "hardware.channels_last=true",
    "precision=32-true",
    "max_steps=4",
    "model.objective.regularizers.r1.gamma=1.0",
    "model.objective.regularizers.r1.interval=2",  # R1 at iterations 0 and 2
    "augment=ada",
    "augment.initial_p=0.5",  # ADA warps from the first iteration (p starts at 0 in real runs)
    "train.log_every_n_steps=1",
    "train.sample_every_n_steps=2",
    "eval.every_n_steps=2",
    "eval.num_samples=64",
    "eval.batch_size=32",
    "eval.reference_samples=256",
]


def _losses(run_dir) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("loss/D")]
    return [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in rows]


def test_compiled_channels_last_gan_trains_with_r1_ada_samples_and_eval_between(make_cfg, tmp_path):
    torch._dynamo.reset()
    cfg = make_cfg(*COMPILED_MIX, output="compiled")
    metrics = run(cfg)
    out = tmp_path / "compiled"
    assert metrics["iteration"] == 4
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert math.isfinite(metrics["loss/D"]) and math.isfinite(metrics["loss/G"])
    assert metrics["loss/r1"] > 0 and math.isfinite(metrics["loss/r1"])
    assert sorted(p.name for p in (out / "samples").glob("*.png")) == [
        "step_0000000.png",
        "step_0000002.png",
        "step_0000004.png",
    ]
    assert [e["iteration"] for e in _eval_history(out)] == [0, 2, 4]
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert not [k for k in state["state_dict"] if "_orig_mod" in k]

    # The compiled run computes what the eager one does (same seeds, same ADA draws): losses agree to rounding.
    eager_metrics = run(make_cfg(*COMPILED_MIX, "hardware.compile=false", output="eager"))
    assert eager_metrics["iteration"] == 4
    compiled_rows, eager_rows = _losses(out), _losses(tmp_path / "eager")
    for key in ("loss/D", "loss/G", "loss/r1"):
        a, b = compiled_rows[0][key], eager_rows[0][key]
        assert a == pytest.approx(b, rel=2e-3, abs=1e-4), (key, a, b)


def _eval_history(run_dir):
    import json

    return json.loads((run_dir / "eval_history.json").read_text())["history"]


def test_eager_switches_compiled_modules_off_only_inside_the_block():
    torch._dynamo.reset()
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    net.compile()
    compiled = net._compiled_call_impl
    x = torch.randn(5, 3, requires_grad=True)
    with eager(net):
        assert net._compiled_call_impl is None
        (grad,) = torch.autograd.grad(net(x).sum(), x, create_graph=True)
    assert net._compiled_call_impl is compiled
    # The eager gradient is differentiable again (what R1 needs); the compiled one is not.
    grad.square().sum().backward()
    assert net[0].weight.grad is not None and torch.isfinite(net[0].weight.grad).all()
    (compiled_grad,) = torch.autograd.grad(net(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        compiled_grad.square().sum().backward()
