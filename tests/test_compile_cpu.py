"""torch.compile on CPU (inductor's C++ backend): the GPU profiles' code path, as far as a CPU can run it.

The GPU profiles train compiled, in channels_last, with sample grids and FID evaluation between iterations and, for
StyleGAN2-style runs, lazy R1 through ADA. These tests run that mix on CPU, so a double backward through a compiled
network, a compiled network shared between training and sampling, or an augmentation without a double backward
fails here instead of at the first iteration on a GPU. The compile modes beyond `default` run here too, as far as
inductor's CPU backend has them: `reduce-overhead` and `max-autotune` both ask for CUDA graphs, which inductor skips
for CPU graphs (its cudagraph_skips counter, no error), so on CPU they compile and train like `default`;
max-autotune's kernel tuning has no CPU template for DCGAN's convolutions (they stay oneDNN calls; measured with
torch 2.14: nothing autotuned). The GPU test set checks that they run as CUDA graphs there.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
from omegaconf import OmegaConf

from pixelsmith.core.compile import eager
from pixelsmith.run.fit import run
from tests.compile_counts import compile_counts
from tests.conftest import metrics_rows

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
    rows = [r for r in metrics_rows(run_dir) if r.get("loss/D")]
    return [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in rows]


def test_compiled_channels_last_gan_trains_with_r1_ada_samples_and_eval_between(make_cfg, tmp_path):
    torch._dynamo.reset()
    cfg = make_cfg(*COMPILED_MIX, output="compiled")
    with compile_counts() as compiled:
        metrics = run(cfg)
    out = tmp_path / "compiled"
    assert metrics["iteration"] == 4
    assert compiled.graphs > 0, "this run compiled nothing"
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


# A short compiled run: tiny DCGAN (conftest's SMALL widths), channels_last, 2 iterations, no samples or evaluation
# (each would add graphs to compile: minutes on 2 cores).
MODE_RUN = [
    "hardware.compile=true",
    "hardware.channels_last=true",
    "precision=32-true",
    "max_steps=2",
    "train.log_every_n_steps=1",
    "train.sample_every_n_steps=0",
]


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_compile_modes_beyond_default_train_on_cpu_without_cuda_graphs(mode, make_cfg, tmp_path):
    with compile_counts() as compiled:
        metrics = run(make_cfg(*MODE_RUN, f"hardware.compile_mode={mode}", output=mode))
    assert metrics["iteration"] == 2
    assert compiled.graphs > 0, "this run compiled nothing"
    # The mode reached inductor: it asked for CUDA graphs, and inductor ran the CPU graphs without them.
    assert compiled.cudagraph_skips > 0
    assert OmegaConf.load(tmp_path / mode / "config_resolved.yaml").runtime_plan.compile_mode == mode
    # What the mode computes is what eager computes (same seeds): every logged loss, to rounding.
    eager_metrics = run(make_cfg(*MODE_RUN, "hardware.compile=false", output="eager"))
    assert eager_metrics["iteration"] == 2
    compiled_rows, eager_rows = _losses(tmp_path / mode), _losses(tmp_path / "eager")
    assert len(compiled_rows) == len(eager_rows) == 2
    for compiled_row, eager_row in zip(compiled_rows, eager_rows, strict=True):
        for key in ("loss/D", "loss/G"):
            a, b = compiled_row[key], eager_row[key]
            assert a == pytest.approx(b, rel=2e-3, abs=1e-4), (key, a, b)


def test_default_mode_asks_for_no_cuda_graphs(make_cfg):
    with compile_counts() as compiled:
        run(make_cfg(*MODE_RUN, "hardware.compile_mode=default", "max_steps=1"))
    assert compiled.graphs > 0 and compiled.cudagraph_skips == 0  # the skips above come from the modes


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
