"""The style-training bench runs its four kinds (the template eager and with hardware.cuda_graphs, fast_neural_style's
method, the plain loop) in fresh interpreters and prints them side by side with their ratios, the
cuda_graphs / fast_neural_style among them, without the main job's time budget."""

from __future__ import annotations

import re

import pytest

from benchmarks import style_bench

pytestmark = pytest.mark.bench


@pytest.mark.slow
def test_the_style_bench_prints_every_kind_side_by_side_with_the_ratios(capsys):
    tiny = ["--resolution", "32", "--base-channels", "4", "--residual-blocks", "1", "--batch-size", "2"]
    argv = [*tiny, "--steps", "2", "--warmup", "1", "--repeats", "1", "--hardware", "cpu", "--threads", "1"]
    assert style_bench.main(argv) == 0
    out = capsys.readouterr()
    for kind in ("template", "template_graphed", "peer", "plain"):
        assert f"32-true {kind}:" in out.err, kind  # every kind ran
    number = r"\s*([\d.]+)\s*"
    row = re.search(r"\| 32-true \|" + r"\|".join([number] * 7) + r"\|", out.out)
    assert row is not None, out.out
    eager, graphed, peer, plain, graphed_peer, eager_peer, eager_plain = (float(x) for x in row.groups())
    assert min(eager, graphed, peer, plain) > 0
    assert graphed_peer == pytest.approx(graphed / peer, abs=2e-3)
    assert eager_peer == pytest.approx(eager / peer, abs=2e-3)
    assert eager_plain == pytest.approx(eager / plain, abs=2e-3)
    assert "cuda_graphs / fast_neural_style (target: >= 1.5)" in out.out
    # Without CUDA the graphed column ran the graphed code uncaptured, and the report says so.
    assert "template_graphed runs: uncaptured (no CUDA device" in out.out


def test_the_peer_trains_the_published_network_and_loss():
    """fast_neural_style's method as the peer writes it: the paper's TransformerNet (1.68M parameters at 32/5,
    output the input's shape), and its loop runs the asked-for iterations on a cycled loader."""
    import torch

    from benchmarks import style_peer

    net = style_peer.transformer_net(32, 5)
    assert sum(p.numel() for p in net.parameters()) == 1_679_235
    assert net(torch.rand(1, 3, 32, 32)).shape == (1, 3, 32, 32)
    torch.manual_seed(0)
    batch = (torch.rand(2, 3, 32, 32) * 255).to(torch.uint8)
    ends = style_peer.train(
        [batch], torch.rand(3, 40, 40), 3, torch.device("cpu"), channels=4, residual_blocks=1
    )
    assert len(ends) == 3 and ends == sorted(ends)


def test_style_bench_runs_never_inherit_the_main_jobs_time_budget(tmp_path):
    spec = {
        "hardware": "cpu",
        "precision": "32-true",
        "batch_size": 2,
        "resolution": 32,
        "base_channels": 4,
        "residual_blocks": 1,
        "warmup": 1,
        "steps": 2,
        "threads": None,
    }
    for kind in style_bench.KINDS:
        cfg = style_bench.child_config({**spec, "kind": kind, "output_dir": str(tmp_path / kind)})
        assert cfg.train.time_budget_minutes is None and cfg.max_steps == 3, kind
        # Only the graphed column captures (the GPU profiles would turn it on for the eager one too).
        assert cfg.hardware.cuda_graphs is (kind == "template_graphed"), kind
