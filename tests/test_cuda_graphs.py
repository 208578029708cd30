"""`hardware.cuda_graphs` (core/graphs.py) on CPU: the graphed iteration's code, run uncaptured, equals the eager
iteration, resumes bit-exactly both ways, and says once why a run cannot be captured.

On CPU nothing is captured, but everything a capture depends on runs: the static batch buffer, the iteration plan
(phases due, ADA's adjustment), the learning rates as device tensors written by the schedule, the device's own
iteration and image counters (the guard, EMA's beta), the in-place skipped-file count. The GPU half (captured
graphs replayed, equal to eager on CUDA) is in tests/test_gpu_graphs.py.
"""

from __future__ import annotations

import json
import logging

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pixelsmith.core.compile import compile_mode_under_graphs as _compile_mode_under_graphs
from pixelsmith.core.graphs import IterationGraphs
from pixelsmith.run.fit import run


def _state(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def _assert_states_close(a, b, atol=1e-6, exact=False):
    assert a["pixelsmith"]["iteration"] == b["pixelsmith"]["iteration"]
    assert a["pixelsmith"]["images_seen"] == b["pixelsmith"]["images_seen"]
    for key, value in a["state_dict"].items():
        other = b["state_dict"][key]
        if exact or not value.is_floating_point():
            assert torch.equal(value, other), key
        else:
            torch.testing.assert_close(value, other, atol=atol, rtol=0, msg=key)
    for opt_a, opt_b in zip(a["optimizer_states"], b["optimizer_states"], strict=True):
        for pid, st in opt_a["state"].items():
            for name, tensor in st.items():
                torch.testing.assert_close(
                    torch.as_tensor(tensor).double(),
                    torch.as_tensor(opt_b["state"][pid][name]).double(),
                    atol=0 if exact else atol,
                    rtol=0,
                    msg=name,
                )
        for group_a, group_b in zip(opt_a["param_groups"], opt_b["param_groups"], strict=True):
            assert float(group_a["lr"]) == pytest.approx(float(group_b["lr"]), rel=1e-12, abs=0)


# Every piece of the iteration that the graphed path moves to the device: lazy R1 (a second plan every 2nd
# iteration), the warm-up+cosine schedule (tensor learning rates), EMA in its ramp-up (device beta), ADA with p > 0
# adjusting every 2nd iteration (a plan of its own), and seeded latents/augmentation.
EVERYTHING = [
    "precision=32-true",
    "augment=ada",
    "augment.initial_p=0.3",
    "augment.interval=2",
    "schedule=warmup_cosine",
    "schedule.warmup_steps=2",
    "schedule.total_steps=8",
    "model.objective.regularizers.r1.gamma=0.5",
    "model.objective.regularizers.r1.interval=2",
    "train.sample_every_n_steps=0",
    "train.checkpoint_every_n_steps=3",
]


@pytest.mark.parametrize("model", ["dcgan", "stylegan2"])
def test_graphed_iterations_equal_eager_ones(make_cfg, tmp_path, model, caplog):
    """N iterations through the graphed path (uncaptured on CPU) equal the eager iterations to 1e-6 in fp32:
    weights, EMA, Adam moments and step counts, ADA's p and counters, the learning rates."""
    extra = ["model.objective.regularizers.path_length.weight=0.5"] if model == "stylegan2" else []
    with caplog.at_level(logging.INFO, logger="pixelsmith.core"):
        run(
            make_cfg(
                *EVERYTHING, *extra, "max_steps=6", "hardware.cuda_graphs=true", model=model, output="graphed"
            )
        )
    assert "no CUDA device, so nothing is captured" in caplog.text
    run(
        make_cfg(
            *EVERYTHING, *extra, "max_steps=6", "hardware.cuda_graphs=false", model=model, output="eager"
        )
    )
    graphed, eager = _state(tmp_path / "graphed"), _state(tmp_path / "eager")
    _assert_states_close(graphed, eager)
    # The run really went through its lazy phases and ADA's adjustments, and the schedule moved the lr.
    assert graphed["state_dict"]["augment.p"] != 0.3
    group = graphed["optimizer_states"][0]["param_groups"][0]
    assert float(group["lr"]) < 0.5 * group["initial_lr"]  # cosine, 4 of 6 decay iterations in
    if model == "stylegan2":
        assert graphed["state_dict"]["objective.regularizers.path_length.pl_mean"] > 0


def test_a_graphed_checkpoint_resumes_bit_exactly_graphed_or_eager(make_cfg, tmp_path):
    graphed = [*EVERYTHING, "hardware.cuda_graphs=true"]
    run(make_cfg(*graphed, "max_steps=6", output="straight"))
    run(make_cfg(*graphed, "max_steps=3", output="first_leg"))
    first_leg = _state(tmp_path / "first_leg")
    assert torch.is_tensor(
        first_leg["optimizer_states"][0]["param_groups"][0]["lr"]
    )  # saved as the graph had it
    ckpt = tmp_path / "first_leg" / "checkpoints" / "last.ckpt"
    run(make_cfg(*graphed, "max_steps=6", f"ckpt_path={ckpt}", output="resumed_graphed"))
    run(
        make_cfg(
            *EVERYTHING, "hardware.cuda_graphs=false", "max_steps=6", f"ckpt_path={ckpt}", output="eager"
        )
    )
    straight = _state(tmp_path / "straight")
    _assert_states_close(straight, _state(tmp_path / "resumed_graphed"), exact=True)
    resumed_eager = _state(tmp_path / "eager")
    _assert_states_close(straight, resumed_eager)
    # An eager run takes the graphed checkpoint's tensor learning rates back as floats.
    assert isinstance(resumed_eager["optimizer_states"][0]["param_groups"][0]["lr"], float)


def test_fp16_graphed_iterations_equal_eager_with_the_scaler_on_the_device(make_cfg, tmp_path):
    """16-mixed through the graphed path: the GradScaler's scale, growth tracker and skip decisions stay device
    tensors, and the result equals eager to the bit (GradScaler("cpu"), fp16 autocast on CPU)."""
    common = [
        "precision=16-mixed",
        "model.objective.regularizers.r1.gamma=0.5",
        "model.objective.regularizers.r1.interval=2",
        "train.sample_every_n_steps=0",
        "max_steps=5",
    ]
    run(make_cfg(*common, "hardware.cuda_graphs=true", output="graphed"))
    run(make_cfg(*common, "hardware.cuda_graphs=false", output="eager"))
    graphed, eager = _state(tmp_path / "graphed"), _state(tmp_path / "eager")
    _assert_states_close(graphed, eager, exact=True)
    assert graphed["pixelsmith"]["grad_scaler"]["scale"] == eager["pixelsmith"]["grad_scaler"]["scale"]


def test_runs_that_cannot_be_captured_say_why_once_and_run_eagerly(make_cfg, caplog):
    with caplog.at_level(logging.WARNING, logger="pixelsmith.core"):
        run(
            make_cfg(
                "hardware.cuda_graphs=true",
                "hardware.optimizer_impl=foreach",
                "profiler=breakdown",
                "max_steps=3",
            )
        )
    warnings = [r.getMessage() for r in caplog.records if "hardware.cuda_graphs=true, but" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "profiler=breakdown" in warnings[0] and "hardware.optimizer_impl=fused" in warnings[0]
    assert "hardware.cuda_graphs=false" in warnings[0]  # how to silence it


def test_a_model_without_an_iteration_plan_is_named_and_trains_eagerly(make_cfg, caplog, monkeypatch):
    """The GAN model declares its plan (the style models too: tests/test_style_graphs.py); a model of one's own
    that does not is named in the one start-up warning and trains eagerly."""
    GANModule = pytest.importorskip("pixelsmith.gan.module", reason="the GAN part is removed").GANModule

    assert GANModule.supports_cuda_graphs
    monkeypatch.setattr(GANModule, "supports_cuda_graphs", False)  # stands in for a model without a plan
    with caplog.at_level(logging.WARNING, logger="pixelsmith.core"):
        metrics = run(make_cfg("hardware.cuda_graphs=true", "hardware.optimizer_impl=fused", "max_steps=2"))
    warnings = [r.getMessage() for r in caplog.records if "hardware.cuda_graphs=true, but" in r.getMessage()]
    assert (
        len(warnings) == 1
        and "GANModule declares no iteration plan (supports_cuda_graphs = False)" in warnings[0]
    )
    assert metrics["iteration"] == 2


def test_a_callback_hooked_inside_the_step_blocks_capture(make_cfg, caplog):
    class GradientPeek(L.Callback):
        def on_after_backward(self, trainer, pl_module):  # would run at capture only, never at a replay
            pass

    from pixelsmith.run.build import build_core_settings, build_model, resolve_hardware

    cfg = make_cfg("hardware.cuda_graphs=true", "max_steps=2")
    module = build_model(cfg, build_core_settings(cfg, resolve_hardware(cfg)))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GradientPeek()],
    )
    with caplog.at_level(logging.WARNING, logger="pixelsmith.core"):
        images = torch.zeros(32, 1, 32, 32, dtype=torch.uint8)
        trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(images), batch_size=16))
    assert "GradientPeek run(s) code in on_before_backward / on_after_backward" in caplog.text


def test_compile_modes_with_their_own_cuda_graphs_give_way_to_the_iterations():
    assert _compile_mode_under_graphs("reduce-overhead", True) == "default"
    assert _compile_mode_under_graphs("max-autotune", True) == "max-autotune-no-cudagraphs"
    assert _compile_mode_under_graphs("max-autotune", False) == "max-autotune"
    assert _compile_mode_under_graphs("default", True) == "default"


# ---- IterationGraphs itself, with CUDA's capture stood in for by a recorder -------------------------------------
class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: a replay counts, it runs no Python (as a real replay)."""

    def __init__(self):
        self.replayed = 0

    def replay(self):
        self.replayed += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    from contextlib import contextmanager

    import pixelsmith.core.graphs as graphs

    captured = []

    @contextmanager
    def fake_capture(graph, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        captured.append(graph)
        yield

    monkeypatch.setattr(graphs.torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(graphs.torch.cuda, "graph", fake_capture)
    monkeypatch.setattr(graphs, "_on_side_stream", lambda fn, arg: fn(arg))
    return captured


def test_each_plan_is_warmed_up_then_captured_once_and_replayed(fake_cuda):
    graphs = IterationGraphs(capture=True, warmup=2)
    calls = []

    def iteration(static):
        calls.append(static[0].clone())
        return static[0] * 2

    plans = ["main", "main", "main", "reg", "main", "reg", "reg", "main"]
    results = [graphs.run(plan, (torch.full((2,), float(i)),), iteration) for i, plan in enumerate(plans)]
    # main: warm-up at 0 and 1, captured at 2, replayed at 4 and 7; reg: warm-up at 3 and 5, captured at 6.
    assert len(calls) == 6 and graphs.captures == 2 and graphs.replays == 2
    assert [float(c[0]) for c in calls] == [
        0,
        1,
        2,
        3,
        5,
        6,
    ]  # the static buffer holds each iteration's batch
    assert results[4] is results[2]  # a replay hands back the captured outputs (which it overwrites in place)
    assert fake_cuda[0].replayed == 3  # right after capture, then twice


def test_new_batch_shapes_get_a_graph_of_their_own_and_too_many_stop_capture(fake_cuda, caplog):
    graphs = IterationGraphs(capture=True, warmup=0, max_graphs=2)
    for size in (2, 3, 2, 4, 5):
        graphs.run("main", torch.zeros(size), lambda static: static + 1)
    assert graphs.disabled_reason is not None and "more than 2 distinct iteration plans" in caplog.text
    assert graphs.graph_count == 0 and not graphs.capture


def test_a_failed_capture_resets_the_iteration_and_runs_it_eagerly(fake_cuda, caplog):
    graphs = IterationGraphs(capture=True, warmup=0)
    resets, runs = [], []

    def iteration(static):
        runs.append(torch.cuda.is_current_stream_capturing() if torch.cuda.is_available() else False)
        if len(runs) == 1:
            raise RuntimeError("operation not permitted when stream is capturing")
        return static + 1

    with caplog.at_level(logging.WARNING, logger="pixelsmith.core.graphs"):
        out = graphs.run("main", torch.zeros(3), iteration, reset=lambda: resets.append(True))
    assert torch.equal(out, torch.ones(3)) and resets == [True] and len(runs) == 2
    assert "capturing the iteration failed (RuntimeError: operation not permitted" in caplog.text
    assert "launches its kernels eagerly" in caplog.text
    graphs.run("main", torch.zeros(3), iteration)
    assert graphs.captures == 0 and len(runs) == 3  # no further attempt


@pytest.mark.slow
def test_two_processes_run_the_graphed_iteration_with_the_all_reduce_inside_it(tmp_path):
    """DDP over gloo: the graphed path (the gradient all-reduce inside the iteration a graph would capture) keeps
    both ranks identical, counts its all-reduces, and ends where the eager DDP run ends."""
    from tests.conftest import SMALL, run_cli

    common = [
        "train.py",
        "debug=ddp",
        "hardware=cpu",
        "precision=32-true",
        "max_steps=4",
        "callbacks.ddp_check.every_n_steps=2",
        "eval.every_n_steps=0",
        "train.sample_every_n_steps=0",
        "train.time_budget_minutes=null",
        *SMALL["dcgan"],
    ]
    for graphs in ("true", "false"):
        result = run_cli(
            [*common, f"hardware.cuda_graphs={graphs}", f"hydra.run.dir={tmp_path / graphs}"], timeout=900
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "true" / "ddp_consistency.json").read_text())
    assert report["max_abs_diff"] == 0.0 and report["grad_allreduce_calls_per_rank"] == [8, 8]
    _assert_states_close(_state(tmp_path / "true"), _state(tmp_path / "false"), exact=True)


@pytest.mark.parametrize(
    ("mode", "cuda_graphs", "inductor_graphs"),
    [("reduce-overhead", "false", True), ("max-autotune", "false", True), ("reduce-overhead", "true", False)],
)
def test_under_inductors_own_cuda_graphs_fakes_for_d_are_copies_and_each_iteration_is_marked(
    make_cfg, monkeypatch, mode, cuda_graphs, inductor_graphs
):
    """On an H200, compile_mode=reduce-overhead / max-autotune failed in Dmain: G's fakes (an inference call, no
    backward pending) were overwritten by D's replay before D read them. They are now cloned, and every iteration
    tells the cudagraph trees where it starts. Under hardware.cuda_graphs the modes give way (no clone, no mark)."""
    from pixelsmith.run.build import build_core_settings, build_model, resolve_hardware

    cfg = make_cfg(
        "hardware.compile=true", f"hardware.compile_mode={mode}", f"hardware.cuda_graphs={cuda_graphs}"
    )
    module = build_model(cfg, build_core_settings(cfg, resolve_hardware(cfg)))
    module.configure_model()  # nn.Module.compile is lazy: nothing is compiled until a network runs
    assert module.inductor_cuda_graphs is inductor_graphs
    returned = []
    generator_forward = module.generator.forward

    def recording_forward(*args, **kwargs):
        returned.append(generator_forward(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(module.generator, "forward", recording_forward)
    module.generator._compiled_call_impl = (
        None  # the eager forward: this test checks the wrapper, not inductor
    )
    z = torch.randn(2, module.z_dim)
    fakes = module.G_forward(z, grad=False)
    assert torch.equal(fakes, returned[-1])
    assert (fakes.data_ptr() != returned[-1].data_ptr()) is inductor_graphs
    trained = module.G_forward(z)  # with a gradient the backward keeps G's output alive: no copy
    assert trained.data_ptr() == returned[-1].data_ptr()

    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(module, "iteration_plan", lambda batch: None)

    class Stop(Exception):
        pass

    def stop(batch):
        raise Stop

    monkeypatch.setattr(module, "_device_iteration", stop)
    with pytest.raises(Stop):
        module.training_step(torch.zeros(2, 1, 32, 32, dtype=torch.uint8), 0)
    assert len(marks) == int(inductor_graphs)
