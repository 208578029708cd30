"""Fast style training captured as CUDA graphs on a GPU (`pytest -m gpu`; skipped without one): the paper's network at
256 px in bf16, one graph replayed, trained like eager. The CPU half is tests/test_style_graphs.py."""

from __future__ import annotations

import logging

import pytest
import torch

from pixelsmith.run.fit import run
from tests.conftest import compose_config
from tests.test_gpu_graphs import _graph_counts, _max_difference
from tests.test_gpu_graphs import pytestmark as gpu_marks

pytestmark = gpu_marks

# Fast style transfer: the paper's network and crop size, random VGG16 weights (the same cost),
# no validation grids; the GPU profile's precision (bf16).
STYLE = [
    "~local",
    "hardware=auto",
    "experiment=style_fast",
    "model.loss_net.pretrained=false",
    "model.stylizer.base_channels=32",
    "model.stylizer.num_residual_blocks=5",
    "data.batch_size=4",
    "data.resolution=256",
    "data.resize_shorter=null",
    "precision=bf16-mixed",
    "train.progress_bar=false",
    "logger=csv",
    "train.sample_every_n_steps=0",
    "callbacks.style_validation=null",
    "train.time_budget_minutes=null",  # a cold compile must not end the run early
    "schedule=warmup_cosine",
    "schedule.warmup_steps=4",
    "max_steps=16",
]


@pytest.mark.filterwarnings("ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning")
@pytest.mark.filterwarnings("ignore:The number of training batches")
@pytest.mark.parametrize("compile_", ["false", "true"])
def test_captured_style_iterations_train_like_eager_ones(tmp_path, caplog, compile_):
    """16 iterations of style_fast in bf16: one plan, captured at its third iteration (after two warm-up runs) and
    replayed for the 13 after it; the stylizer ends within bf16's tolerance of the eager run's (cuDNN's algorithm
    choice puts bit equality out of reach on the GPU), with finite losses."""
    settings = [f"hardware.compile={compile_}"]

    def train(name, *overrides):
        cfg = compose_config([*STYLE, *settings, *overrides], tmp_path / name)
        metrics = run(cfg)
        path = tmp_path / name / "checkpoints" / "last.ckpt"
        return metrics, torch.load(path, map_location="cpu", weights_only=True)

    with caplog.at_level(logging.INFO, logger="pixelsmith.core"):
        graphed_metrics, graphed = train("graphed", "hardware.cuda_graphs=true")
    assert "hardware.cuda_graphs=true, but" not in caplog.text  # nothing blocked the capture
    assert _graph_counts(caplog.text) == (1, 13)
    _, eager = train("eager", "hardware.cuda_graphs=false")
    assert graphed["pixelsmith"]["iteration"] == eager["pixelsmith"]["iteration"] == 16
    difference = _max_difference(graphed["state_dict"], eager["state_dict"])
    assert difference < 5e-2, difference
    assert graphed_metrics["iteration"] == 16
    assert all(v == v for k, v in graphed_metrics.items() if k.startswith("loss/"))  # finite, not NaN
