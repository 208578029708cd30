"""Style training under `hardware.cuda_graphs` on CPU: the style models declare an iteration plan,
so the template's capture takes them. On CPU nothing is captured, but the graphed iteration's code runs (static batch
buffer, tensor learning rates, device counters, AdaIN's style crops in a static buffer filled before the iteration);
it equals the eager iteration, resumes bit-exactly, never waits for the device, and with CUDA's capture stood in for
by a recorder the run makes one plan: two warm-up runs, one capture, replays after. The GPU half (captured for real,
bf16) is in tests/test_gpu_graphs.py.
"""

from __future__ import annotations

import logging

import pytest
import torch

from pixelsmith.core.module import TrainingCore
from pixelsmith.run.fit import run
from pixelsmith.style.module import AdaINModule, FastStyleModule
from tests.conftest import last_checkpoint
from tests.test_cuda_graphs import _assert_states_close, fake_cuda  # noqa: F401  (fake_cuda is a fixture)
from tests.test_style_train import _cfg

pytestmark = [
    pytest.mark.filterwarnings("ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Experiment logs directory"),
    pytest.mark.usefixtures("one_thread"),  # tiny convolutions (conftest's one_thread says why)
]

# What a graph reads from the device: fused Adam (its skip decided on the device), a warm-up+cosine schedule (the
# learning rate as a tensor the schedule fills), clipping; no sample grids inside the measured iterations.
GRAPHED = [
    "hardware.optimizer_impl=fused",
    "schedule=warmup_cosine",
    "schedule.warmup_steps=2",
    "schedule.total_steps=8",
    "train.clip_grad_norm=1.0",
    "train.sample_every_n_steps=0",
    "train.time_budget_minutes=null",
]


def _train(tmp_path, model, *overrides, output):
    run(_cfg(tmp_path, model, *GRAPHED, *overrides, output=output))
    return last_checkpoint(tmp_path / output)


@pytest.mark.parametrize("model", ["style_fast", "style_adain"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_graphed_style_iterations_equal_eager_ones_to_the_bit(tmp_path, caplog, model, precision):
    """5 iterations through the graphed path (uncaptured on CPU) equal 5 eager ones exactly: weights, Adam moments
    and step counts, the learning rate, the counters."""
    common = [f"precision={precision}", "max_steps=5"]
    with caplog.at_level(logging.INFO, logger="pixelsmith.core"):
        graphed = _train(tmp_path, model, *common, "hardware.cuda_graphs=true", output="graphed")
    assert "no CUDA device, so nothing is captured" in caplog.text  # the graphed path ran ...
    assert "hardware.cuda_graphs=true, but" not in caplog.text  # ... and nothing blocked it
    eager = _train(tmp_path, model, *common, "hardware.cuda_graphs=false", output="eager")
    _assert_states_close(graphed, eager, exact=True)
    assert graphed["pixelsmith"]["iteration"] == 5 and graphed["pixelsmith"]["images_seen"] == 10
    group = graphed["optimizer_states"][0]["param_groups"][0]
    assert torch.is_tensor(group["lr"]) and float(group["lr"]) < group["initial_lr"]  # the schedule moved it


@pytest.mark.parametrize("model", ["style_fast", "style_adain"])
def test_a_graphed_style_checkpoint_resumes_bit_exactly_graphed_or_eager(tmp_path, model):
    graphed = ["precision=32-true", "hardware.cuda_graphs=true", "train.checkpoint_every_n_steps=3"]
    straight = _train(tmp_path, model, *graphed, "max_steps=6", output="straight")
    _train(tmp_path, model, *graphed, "max_steps=3", output="leg")
    ckpt = tmp_path / "leg" / "checkpoints" / "last.ckpt"
    resumed = _train(tmp_path, model, *graphed, "max_steps=6", f"ckpt_path={ckpt}", output="resumed")
    _assert_states_close(straight, resumed, exact=True)
    eager = ["precision=32-true", "hardware.cuda_graphs=false", "train.checkpoint_every_n_steps=3"]
    resumed_eager = _train(tmp_path, model, *eager, "max_steps=6", f"ckpt_path={ckpt}", output="eager")
    _assert_states_close(straight, resumed_eager, exact=True)
    assert isinstance(resumed_eager["optimizer_states"][0]["param_groups"][0]["lr"], float)


@pytest.mark.parametrize("model", ["style_fast", "style_adain"])
def test_the_graphed_style_iteration_never_waits_for_the_device(tmp_path, model, monkeypatch):
    """train.host_sync_check=error over the graphed path: no iteration that logs nothing reads the device (the
    captured iteration on a GPU could not, and the host would wait before every replay)."""
    from tests.test_host_sync import HostSyncCheck

    created = []
    original = HostSyncCheck.__init__

    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(HostSyncCheck, "__init__", recording_init)
    checks = ["train.host_sync_check=error", "train.log_every_n_steps=4", "hardware.cuda_graphs=true"]
    _train(tmp_path, model, "precision=32-true", *checks, "max_steps=6", output="run")
    (check,) = created
    assert check.checked == 3 and check.events == []  # iterations 1, 2 and 4


@pytest.mark.parametrize("model", ["style_fast", "style_adain"])
def test_a_style_run_makes_one_plan_warmed_up_twice_captured_once_and_replayed(
    tmp_path,
    model,
    monkeypatch,
    fake_cuda,  # noqa: F811  (the fixture imported above)
):
    """With CUDA's capture stood in for (tests/test_cuda_graphs.py's recorder), 6 iterations of a style run: one plan
    and one batch shape, so two eager warm-up runs, one capture (which replays at once) and three replays; the
    iteration's Python ran 3 times, never at a replay."""
    ran = []
    original = TrainingCore._device_iteration

    def counting(self, batch):
        ran.append(self.iteration)
        return original(self, batch)

    monkeypatch.setattr(TrainingCore, "_device_iteration", counting)
    made = []
    original_setup = TrainingCore._setup_cuda_graphs

    def capturing_setup(self):
        original_setup(self)
        # The recorder stands in for CUDA's capture; the optimizer's `capturable` stays as on CPU.
        self._graphs.capture = True
        made.append(self._graphs)

    monkeypatch.setattr(TrainingCore, "_setup_cuda_graphs", capturing_setup)
    plans = []
    module_class = {"style_fast": FastStyleModule, "style_adain": AdaINModule}[model]
    original_plan = module_class.iteration_plan

    def recording_plan(self, batch):
        plans.append(original_plan(self, batch))
        return plans[-1]

    monkeypatch.setattr(module_class, "iteration_plan", recording_plan)
    _train(tmp_path, model, "precision=32-true", "hardware.cuda_graphs=true", "max_steps=6", output="run")
    (graphs,) = made
    assert set(plans) == {"style"} and len(plans) == 6  # one plan, asked for every iteration
    assert graphs.captures == 1 and graphs.graph_count == 1 and graphs.replays == 3
    assert ran == [0, 1, 2]  # warm-up, warm-up, capture; iterations 3-5 were replays
    assert fake_cuda[0].replayed == 4  # right after the capture, then three times


def test_both_style_models_declare_an_iteration_plan():
    from pixelsmith.style.module import AdaINModule, FastStyleModule

    assert FastStyleModule.supports_cuda_graphs and AdaINModule.supports_cuda_graphs
