"""The style models' performance instrumentation: the step-time breakdown's rows (the backward split at the stylized
image), FLOPs and MFU of `profiler=breakdown` runs, and gradient checkpointing of the style networks (the general
rules are in test_perf_breakdown.py, test_perf_flops_models.py and test_perf_switches.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pixelsmith.perf.breakdown import REGION_TOLERANCE
from pixelsmith.run.fit import run
from tests.breakdown_checks import BATCH, assert_breakdown_run_reports_flops_and_mfu
from tests.conftest import compose_config

pytestmark = [
    pytest.mark.filterwarnings("ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Experiment logs directory"),
]

# Tiny style-transfer runs, as in tests/test_style_train.py: 32 px crops, 8-channel networks, random VGG weights.
STYLE = [
    "hardware=cpu",
    "train.progress_bar=false",
    "logger=csv",
    "model.loss_net.pretrained=false",
    f"data.batch_size={BATCH}",
    "data.resolution=32",
    "data.resize_shorter=48",
    "data.num_workers=0",
    "model.style_size=64",
    "callbacks.style_validation=null",
]

STYLE_MODELS = {
    "style_fast": [
        *STYLE,
        "experiment=style_fast",
        "model.stylizer.base_channels=8",
        "model.stylizer.num_residual_blocks=1",
    ],
    "style_adain": [*STYLE, "experiment=style_adain", "model.decoder.width=0.125"],
}


@pytest.mark.usefixtures("one_thread")  # tiny convolutions (conftest's one_thread says why)
@pytest.mark.parametrize("model", list(STYLE_MODELS))
def test_breakdown_run_reports_flops_and_mfu_for_each_style_model(tmp_path, model):
    assert_breakdown_run_reports_flops_and_mfu(tmp_path, model, STYLE_MODELS[model])


def test_style_breakdown_splits_the_loss_network_backward_from_the_stylizer_backward(tmp_path):
    """The style module's rows: stylizer forward, loss-network forward, then the one backward split by a gradient
    hook on the stylized image into the loss network's part and the stylizer's; they still partition the step."""
    cfg = compose_config(
        [
            "experiment=style_fast",
            "hardware=cpu",
            "precision=32-true",
            "train.progress_bar=false",
            "logger=csv",
            "model.loss_net.pretrained=false",
            "model.stylizer.base_channels=8",
            "model.stylizer.num_residual_blocks=1",
            "model.validation.num_pairs=1",
            "model.validation.size=32",
            "data.batch_size=2",
            "data.resolution=32",
            "data.resize_shorter=48",
            "data.num_workers=0",
            "model.style_size=64",
            "max_steps=6",
            "train.sample_every_n_steps=0",
            "callbacks.style_validation=null",
            "profiler=breakdown",
            "profiler.every_n_steps=2",
            "profiler.peak_tflops=1.0",
        ],
        tmp_path / "run",
    )
    run(cfg)
    summary = json.loads((tmp_path / "run" / "perf" / "breakdown.json").read_text())
    rows = {r["phase"]: r["mean_ms"] for r in summary["rows"]}
    for region in ("h2d", "style_fwd", "loss_fwd", "loss_bwd", "style_bwd", "opt_step"):
        assert rows[region] > 0, region
    assert "bwd" not in rows and "D_fwd" not in rows
    assert sum(rows.values()) == pytest.approx(summary["step_mean_ms"], rel=REGION_TOLERANCE)


@pytest.mark.parametrize("network", ["transformer_net", "adain_decoder"])
def test_style_networks_gradient_checkpointing_saves_activations_with_identical_gradients(network, tmp_path):
    from pixelsmith.style.export import export_torchscript
    from pixelsmith.style.networks import AdaINDecoder, TransformerNet

    def build(checkpointing: bool) -> tuple[nn.Module, torch.Tensor]:
        torch.manual_seed(0)
        if network == "transformer_net":
            return TransformerNet(8, 2, gradient_checkpointing=checkpointing), torch.rand(2, 3, 32, 32)
        return AdaINDecoder(0.125, gradient_checkpointing=checkpointing), torch.randn(2, 512, 4, 4)

    def saved_bytes_and_grads(checkpointing: bool):
        net, x = build(checkpointing)
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = net(x)
        out.square().mean().backward()
        return out.detach(), sum(saved), [p.grad.clone() for p in net.parameters()]

    plain_out, plain_bytes, plain_grads = saved_bytes_and_grads(False)
    ckpt_out, ckpt_bytes, ckpt_grads = saved_bytes_and_grads(True)
    assert torch.equal(ckpt_out, plain_out)
    assert ckpt_bytes < 0.5 * plain_bytes, (ckpt_bytes, plain_bytes)
    for a, b in zip(plain_grads, ckpt_grads, strict=True):
        torch.testing.assert_close(a, b)
    # The same module still scripts for export (the checkpointed path is skipped in TorchScript).
    net, x = build(True)
    with torch.no_grad():
        scripted = torch.jit.load(str(export_torchscript(net, tmp_path / "net.pt")))
        torch.testing.assert_close(scripted(x), net(x))
