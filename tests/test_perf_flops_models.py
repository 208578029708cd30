"""FLOPs per iteration of the GAN models (DCGAN, StyleGAN2): the DCGAN count against the convolution formula,
StyleGAN2's lazy R1 iterations counted (the issue: FlopCounterMode's module tracker failed on them), and real
`profiler=breakdown` runs reporting FLOPs and MFU (the style models' runs: test_style_perf.py)."""

from __future__ import annotations

import pytest
import torch

# General code checked with the GAN part as its vehicle: a fork without it (README "Removing a part") skips
# this file rather than failing to import it.
pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")

from benchmarks.gan_flops import GANIterationFlops, count_gan_iteration_flops  # noqa: E402
from benchmarks.plain_loop import build_plain_gan, endless, plain_loader  # noqa: E402
from pixelsmith.perf.flops import count_flops  # noqa: E402
from pixelsmith.perf.throughput import ThroughputMonitor  # noqa: E402
from pixelsmith.run.build import resolve_hardware  # noqa: E402
from tests.breakdown_checks import BATCH, assert_breakdown_run_reports_flops_and_mfu  # noqa: E402
from tests.conftest import FAST, SMALL, compose_config  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Experiment logs directory"),
]

MODELS = {
    "dcgan": [*FAST, *SMALL["dcgan"], f"data.batch_size={BATCH}"],
    # Lazy R1 every 2nd iteration, so a 6-iteration run counts and times R1 iterations after the warm-up.
    "stylegan2": [
        *FAST,
        *SMALL["stylegan2"],
        f"data.batch_size={BATCH}",
        "model.objective.regularizers.r1.interval=2",
        # path length (the model's default now, every 4) would add "Greg" kinds; this test is about lazy R1
        "model.objective.regularizers.path_length.weight=0",
    ],
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny convolutions (conftest's one_thread says why)


def _conv(batch, c_in, c_out, k, h, w):
    """Forward FLOPs (2 x MACs) of a k x k convolution; (h, w) is the output (input for a transposed one)."""
    return 2 * batch * c_in * c_out * k * k * h * w


def _dcgan_forward_flops(batch, z_dim=100, ngf=16, ndf=16, channels=1):
    """Per-layer forward FLOPs of SMALL["dcgan"] at 32 px: G = latent matmul + 3 transposed convs, D = 4 convs."""
    g = [
        2 * batch * z_dim * (4 * ngf) * 16,  # z -> (4 ngf, 4, 4) as a matmul
        _conv(batch, 4 * ngf, 2 * ngf, 4, 4, 4),  # 4 -> 8 (transposed: input size)
        _conv(batch, 2 * ngf, ngf, 4, 8, 8),  # 8 -> 16
        _conv(batch, ngf, channels, 4, 16, 16),  # 16 -> 32
    ]
    d = [
        _conv(batch, channels, ndf, 4, 16, 16),  # 32 -> 16
        _conv(batch, ndf, 2 * ndf, 4, 8, 8),  # 16 -> 8
        _conv(batch, 2 * ndf, 4 * ndf, 4, 4, 4),  # 8 -> 4
        _conv(batch, 4 * ndf, 1, 4, 1, 1),  # 4 -> 1 logit
    ]
    return g, d


def _dcgan_iteration_flops(batch):
    """One DCGAN iteration (no R1), analytically. A backward costs its forward twice (input and weight gradients)
    minus what is not needed:
    D step: G forward under no_grad (G), D on reals and fakes (2 D), their backward without the first layer's input
    gradient (2 (2 D - D0)); G step: G and D forward (G + D), D's input gradients only (D frozen), G's backward
    without the latent matmul's input gradient (2 G - G0). Total 4 G + 8 D - 2 D0 - G0."""
    g, d = _dcgan_forward_flops(batch)
    return 4 * sum(g) + 8 * sum(d) - 2 * d[0] - g[0]


def _plain(tmp_path, model, *overrides):
    cfg = compose_config([*MODELS[model], "precision=32-true", *overrides], tmp_path / "plain")
    hardware = resolve_hardware(cfg)
    gan = build_plain_gan(cfg, hardware, "foreach")
    return gan, next(endless(plain_loader(cfg, hardware)))


@pytest.mark.bench
def test_dcgan_iteration_flops_match_the_convolution_formula(tmp_path):
    gan, images = _plain(
        tmp_path,
        "dcgan",
        "model.objective.regularizers.r1.gamma=1.0",
        "model.objective.regularizers.r1.interval=4",
    )
    counts = count_gan_iteration_flops(gan, images)
    expected = _dcgan_iteration_flops(BATCH)
    assert counts.common == pytest.approx(expected, rel=0.01)  # exact in practice (433.7 MFLOP at batch 16)
    # R1 adds a D forward on the reals, its input gradient, and the backward of both (about 4 D): ~6 D in all.
    _, d = _dcgan_forward_flops(BATCH)
    assert counts.r1 - counts.common == pytest.approx(6 * sum(d), rel=0.03)
    assert counts.r1_interval == 4 and counts.amortised == counts.common + (counts.r1 - counts.common) / 4
    assert gan.iteration == 0  # restored


@pytest.mark.bench
def test_stylegan2_counts_flops_and_lazy_r1_costs_more(tmp_path):
    """The failure seen: G's forward under no_grad (the fakes for D) hands StyleGAN2's constant input, a view of
    a parameter made under no_grad, to the module tracker, which raised "Expected gradient function to be set"."""
    gan, images = _plain(tmp_path, "stylegan2")
    counts = count_gan_iteration_flops(gan, images)
    assert 0 < counts.common < counts.r1
    with torch.no_grad():
        assert count_flops(lambda: gan.G(torch.randn(BATCH, gan.z_dim))) > 0
    gan, images = _plain(tmp_path, "stylegan2", "model.objective.regularizers.r1.gamma=0")
    without_r1 = count_gan_iteration_flops(gan, images)
    assert without_r1.common == without_r1.r1 == counts.common


@pytest.mark.bench
def test_mean_flops_over_timed_iterations_counts_r1_as_often_as_it_runs():
    counts = GANIterationFlops(common=100, r1=260, r1_interval=16)
    assert counts.amortised == 110
    assert counts.mean_over(range(1, 17)) == 110  # iterations 1..16: one R1 (16)
    assert counts.mean_over(range(2, 12)) == 100  # none
    assert counts.mean_over(range(0, 2)) == 180  # iteration 0 has R1
    assert GANIterationFlops(common=100, r1=100, r1_interval=16).mean_over(range(0, 32)) == 100


@pytest.mark.parametrize("model", list(MODELS))
def test_breakdown_run_reports_flops_and_mfu_for_every_model(tmp_path, model):
    expected = _dcgan_iteration_flops(BATCH) if model == "dcgan" else None
    assert_breakdown_run_reports_flops_and_mfu(tmp_path, model, MODELS[model], expected_common_flops=expected)


class _FakeGAN(torch.nn.Module):
    """Just what the monitor reads: r1_gamma, r1_interval, iteration, and a training_step whose matmul is larger on
    R1 iterations (FLOPs: 2 x 8 x 8 x 8 = 1024 common, 2 x 8 x 8 x 16 = 2048 with R1)."""

    def __init__(self, compiled: bool):
        super().__init__()
        self.net = torch.nn.Identity()
        if compiled:
            self.net._compiled_call_impl = lambda *args: None  # what nn.Module.compile sets
        self.r1_gamma, self.r1_interval, self.iteration = 1.0, 4, 0
        self.images_per_iteration = 8

    def training_step(self, batch, batch_idx):
        width = 16 if self.iteration % self.r1_interval == 0 else 8
        torch.randn(8, 8) @ torch.randn(8, width)
        self.iteration += 1


class _FakeTrainer:
    class strategy:  # noqa: N801
        root_device = torch.device("cpu")

    loggers: list = []
    is_global_zero = True


@pytest.mark.parametrize("compiled", [False, True])
def test_monitor_counts_r1_in_the_warm_up_unless_compiled_and_never_times_a_counted_iteration(
    tmp_path, compiled
):
    monitor = ThroughputMonitor(tmp_path, every_n_steps=100, warmup_steps=2, peak_tflops=1.0)
    module, trainer = _FakeGAN(compiled), _FakeTrainer()
    monitor.on_train_start(trainer, module)
    for index in range(10):  # iterations 0-9, R1 at 0, 4, 8
        monitor.on_train_batch_start(trainer, module, None, index)
        module.training_step(None, index)  # Lightning looks the step up on the module at each iteration
        monitor.on_train_batch_end(trainer, module, None, None, index)
    monitor.on_train_end(trainer, module)
    assert "training_step" not in vars(module)  # the one-call wrapper is gone
    summary = monitor.summary
    assert summary["flops_by_iteration_kind"]["common"] == {"flops": 1024, "counted_at_iteration": 1}
    if compiled:
        # R1 counted on iteration 4 (after the warm-up, so compilation stays in it) and left out of the timing.
        assert summary["flops_by_iteration_kind"]["r1"] == {"flops": 2048, "counted_at_iteration": 4}
        assert summary["timed_iterations_by_kind"] == {"common": 6, "r1": 1}  # 2, 3, 5, 6, 7, 9 and 8
        assert summary["flops_per_iteration"] == pytest.approx((6 * 1024 + 2048) / 7)
    else:
        assert summary["flops_by_iteration_kind"]["r1"] == {"flops": 2048, "counted_at_iteration": 0}
        assert summary["timed_iterations_by_kind"] == {"common": 6, "r1": 2}  # 2, 3, 5, 6, 7, 9 and 4, 8
        assert summary["flops_per_iteration"] == pytest.approx((6 * 1024 + 2 * 2048) / 8)
    assert summary["flops_per_iteration_amortised"] == 1024 + 1024 / 4
    seconds = sum(monitor.step_times)
    assert summary["achieved_tflops"] == pytest.approx(
        summary["flops_per_iteration"] * len(monitor.step_times) / seconds / 1e12
    )
