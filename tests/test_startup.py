"""Start-up: what torch.compile and CUDA-graph capture cost before the first iteration, and that it stays bounded.

- Each training phase compiles its networks once: G twice (trained in Gmain, frozen in Dmain), D twice (trained in
  Dmain, frozen under Gmain's gradient), no graph break, and no recompile once every plan has run: a run through
  three cycles of the plans compiles exactly what a run through one does (a recompile per iteration would show).
- Real images and G's output reach D in one memory layout (a one-channel channels_last batch used to compile D twice).
- The EMA copy is not compiled (its sampling and evaluation batches were graphs of their own).
- `StartupReport` attributes compile time to the network whose forward is on the stack, counts recompiles from
  Dynamo's compile ids ("frame/count"), and splits a plan's first run into compile and the rest.
- The compile cache lives where a user can see and clear it, and a user's own inductor cache is kept.

Dynamo's "eager" backend stands in for inductor here: graphs, guards, recompiles and breaks are Dynamo's, the same
whatever the backend, and a test then takes seconds instead of minutes of C++ compilation on 2 cores.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from pixelsmith.core.compile import BLOCK_RECOMPILE_LIMIT, compile_units
from pixelsmith.core.module import TrainingCore
from pixelsmith.core.startup import StartupReport, plan_label
from pixelsmith.hardware.settings import compile_cache_dir, use_compile_cache
from pixelsmith.run.fit import run

REGULARISED = {
    "stylegan2": [
        "model.objective.regularizers.r1.gamma=1.0",
        "model.objective.regularizers.r1.interval=4",
        "model.objective.regularizers.path_length.weight=2.0",
        "model.objective.regularizers.path_length.interval=2",
        "data.channels=1",  # one channel: where channels_last and contiguous strides differ without a copy
    ],
    "r3gan": [],
    "wgan_gp": ["+model/objective=wgan_gp", "data.batch_size=20"],  # 5 critic draws of 4
}
MODEL_OF = {"stylegan2": "stylegan2", "r3gan": "r3gan", "wgan_gp": "dcgan"}


@pytest.fixture
def dynamo_eager_backend(monkeypatch):
    original = torch.nn.Module.compile

    def compile_with_dynamo_only(self, *args, **kwargs):
        kwargs.pop("mode", None)
        return original(self, *args, backend="eager", **kwargs)

    monkeypatch.setattr(torch.nn.Module, "compile", compile_with_dynamo_only)


def _startup(make_cfg, tmp_path, name: str, steps: int, *extra: str) -> dict[str, float]:
    cfg = make_cfg(
        *REGULARISED[name],
        "hardware.compile=true",
        "hardware.channels_last=true",
        f"hardware.compile_cache_dir={tmp_path / 'compile_cache'}",
        f"max_steps={steps}",
        "train.log_every_n_steps=1",
        *extra,
        model=MODEL_OF[name],
        output=f"{name}_{steps}",
    )
    metrics = run(cfg)
    return {k: v for k, v in metrics.items() if k.startswith("startup/")}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stylegan2", "r3gan", "wgan_gp"])
def test_each_phase_compiles_once_without_breaks_and_nothing_recompiles_per_iteration(
    name, make_cfg, tmp_path, dynamo_eager_backend
):
    one_cycle = _startup(make_cfg, tmp_path, name, 4, "hardware.compile_scope=network")
    three_cycles = _startup(make_cfg, tmp_path, name, 12, "hardware.compile_scope=network")
    assert one_cycle["startup/graph_breaks"] == 0
    assert three_cycles["startup/graphs"] == one_cycle["startup/graphs"], (
        "a graph compiled after every plan ran"
    )
    assert three_cycles["startup/recompiles"] == one_cycle["startup/recompiles"]
    # StyleGAN2: G trained (Gmain) and frozen (Dmain's fakes), D trained (Dmain) and frozen (Gmain). WGAN-GP's critic
    # step differentiates D's gradient (the penalty) every time, so D runs eagerly there and compiles once, frozen
    # under G's step. R3GAN's D step is eager the same way (R1 + R2), but its G step also reads D's real logits
    # under no_grad: a second, inference graph of D.
    expected = {"stylegan2": 4, "r3gan": 4, "wgan_gp": 3}[name]
    assert one_cycle["startup/graphs"] == expected, one_cycle
    assert one_cycle["startup/first_iteration_s"] > 0
    assert one_cycle["startup/compile_s/G"] > 0 and one_cycle["startup/compile_s/D"] > 0


@pytest.mark.slow
def test_blocks_scope_compiles_each_block_and_still_adds_nothing_per_iteration(
    make_cfg, tmp_path, dynamo_eager_backend
):
    one_cycle = _startup(make_cfg, tmp_path, "stylegan2", 4, "hardware.compile_scope=blocks")
    three_cycles = _startup(make_cfg, tmp_path, "stylegan2", 12, "hardware.compile_scope=blocks")
    assert one_cycle["startup/graph_breaks"] == 0
    assert three_cycles["startup/graphs"] == one_cycle["startup/graphs"]
    assert one_cycle["startup/graphs"] > 4  # one graph per block, not per network


def test_real_and_generated_images_reach_d_with_identical_strides():
    core = types.SimpleNamespace(channels_last=True)
    layout = types.SimpleNamespace(core=core)
    for channels in (1, 3):
        contiguous = torch.randn(4, channels, 8, 8)
        channels_last = torch.randn(4, channels, 8, 8).contiguous(memory_format=torch.channels_last)
        a = TrainingCore.in_network_layout(layout, contiguous)
        b = TrainingCore.in_network_layout(layout, channels_last)
        assert a.stride() == b.stride() == (channels * 64, 1, 8 * channels, channels)
        torch.testing.assert_close(a, contiguous)  # the same values: only the strides are canonical
    core.channels_last = False
    x = torch.randn(2, 1, 4, 4)
    assert TrainingCore.in_network_layout(layout, x) is x


def test_the_ema_copy_is_not_compiled(make_cfg, tmp_path, dynamo_eager_backend):
    from pixelsmith.run.build import build_core_settings, build_model, resolve_hardware

    cfg = make_cfg("hardware.compile=true", "max_steps=1", model="stylegan2")
    model = build_model(cfg, build_core_settings(cfg, resolve_hardware(cfg)))
    model.configure_model()

    def compiled(network):
        return [m for m in network.modules() if getattr(m, "_compiled_call_impl", None) is not None]

    assert compiled(model.generator) and compiled(model.discriminator)
    assert compiled(model.G_ema.model) == []


def test_blocks_scope_names_each_block_and_raises_the_recompile_limit(make_cfg, monkeypatch):
    pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")
    from pixelsmith.gan.networks.stylegan2 import StyleGAN2Discriminator, StyleGAN2Generator

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    generator = StyleGAN2Generator(
        resolution=32, channels=3, z_dim=8, w_dim=8, channel_base=64, channel_max=16
    )
    discriminator = StyleGAN2Discriminator(resolution=32, channels=3, channel_base=64, channel_max=16)
    assert compile_units(generator, "network") == [generator]
    units = compile_units(generator, "blocks")
    assert units[0] is generator.mapping and units[1:] == list(generator.synthesis.blocks)
    assert len(compile_units(discriminator, "blocks")) == 1 + len(discriminator.blocks) + 3
    assert torch._dynamo.config.recompile_limit == BLOCK_RECOMPILE_LIMIT
    plain = torch.nn.Linear(2, 2)
    assert compile_units(plain, "blocks") == [plain]  # a network that names no blocks compiles whole


def test_startup_report_attributes_compiles_and_splits_first_runs(monkeypatch):
    report = StartupReport()
    clock = iter([0.0, 2.0, 2.0, 3.5, 10.0, 10.25])  # perf_counter: two compiles, then a backward's compile
    monkeypatch.setattr("pixelsmith.core.startup.time.perf_counter", lambda: next(clock))
    dynamo = types.SimpleNamespace(name="DYNAMO")
    backward = types.SimpleNamespace(name="LAZY_BACKWARD")
    with report.network("G"):
        report._compile_started(types.SimpleNamespace(compile_id="0/0", callback_trigger=dynamo))
        report._compile_ended(None)
        report._compile_started(types.SimpleNamespace(compile_id="0/1", callback_trigger=dynamo))
        report._compile_ended(None)
    # A backward compiled at its first call, outside any forward: charged to the frame's network.
    report._compile_started(types.SimpleNamespace(compile_id="0/1", callback_trigger=backward))
    report._compile_ended(None)
    assert report.graphs == {"G": 2} and report.recompiles == {"G": 1}
    assert report.compile_s["G"] == pytest.approx(2.0 + 1.5 + 0.25)
    metrics = report.metrics()
    assert metrics["startup/graphs"] == 2 and metrics["startup/recompiles"] == 1
    assert plan_label((("Gmain", "Dmain"), True)) == "Gmain+Dmain (ADA adjusts)"


def test_compile_cache_dir_is_visible_and_a_users_own_is_kept(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.delenv("PIXELSMITH_CACHE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what inductor writes there itself
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache_dir() == tmp_path / "home" / ".cache" / "pixelsmith" / "compile"
    monkeypatch.setenv("PIXELSMITH_CACHE", str(tmp_path / "cache"))
    assert compile_cache_dir() == tmp_path / "cache" / "compile"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    assert compile_cache_dir(str(tmp_path / "configured")) == tmp_path / "configured"
    used = use_compile_cache(str(tmp_path / "configured"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(used.resolve()) and used.is_dir()
