"""Iterations that log nothing never make the host wait for the device (issue: GPU speed, "no host syncs").

`train.host_sync_check=error` runs real training through the config tree with every device-side feature on
(fused Adam's on-device skip, clipping, EMA, lazy R1, ADA, warmup+cosine, fp16 GradScaler) and raises at the first
op that would synchronise on CUDA, over the whole Lightning loop of each such iteration (`train.host_sync_scope=loop`:
the batch fetch, every callback, Lightning's bookkeeping), or the module's step only (`step`). The CUDA half of the
proof (`torch.cuda.set_sync_debug_mode`) is in test_gpu.py.
"""

from __future__ import annotations

import linecache
import math

import lightning as L
import pytest
import torch
from omegaconf import open_dict

from pixelsmith.augment import ada
from pixelsmith.callbacks.host_sync import HostSyncCheck, HostSyncError, SyncCounter
from pixelsmith.run.fit import run

ALL_ON = [
    "hardware.optimizer_impl=fused",
    "train.host_sync_check=error",
    "train.log_every_n_steps=4",
    "train.clip_grad_norm=1.0",
    "schedule=warmup_cosine",
    "schedule.warmup_steps=3",
    "model.objective.regularizers.r1.gamma=0.1",
    "model.objective.regularizers.r1.interval=2",
    "augment=ada",
    "augment.initial_p=0.5",
    "augment.interval=2",
    "max_steps=9",
    "data.limit=128",
]


@pytest.fixture
def cuda_code_paths(monkeypatch):
    # ADA picks out the rows to warp with nonzero() on CPU only (a CPU has no device to wait for); take the GPU path.
    monkeypatch.setattr(ada, "_warp_selected_rows_only", lambda device: False)


@pytest.fixture
def checks(monkeypatch):
    """The HostSyncCheck callbacks a run creates, to read what they checked."""
    return record_host_sync_checks(monkeypatch)


def record_host_sync_checks(monkeypatch) -> list[HostSyncCheck]:
    created: list[HostSyncCheck] = []
    original = HostSyncCheck.__init__

    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(HostSyncCheck, "__init__", recording_init)
    return created


@pytest.mark.parametrize(
    ("model", "precision"),
    [("dcgan", "32-true"), ("dcgan", "16-mixed"), ("stylegan2", "32-true")],
)
def test_a_gan_iteration_that_logs_nothing_never_waits_for_the_device(
    make_cfg, tmp_path, cuda_code_paths, checks, model, precision
):
    metrics = run(make_cfg(*ALL_ON, f"precision={precision}", model=model))
    assert metrics["iteration"] == 9 and math.isfinite(metrics["loss/D"])
    (check,) = checks
    # Iterations 1, 2, 4, 5, 6 are checked (0 sets up device state; 3 and 7 log; 8 is the last).
    assert check.checked == 5 and check.events == []
    assert 0 < metrics["augment/p"] <= 1  # ADA's p moved on the device and reached the log


def test_a_host_decided_step_is_caught_and_named(make_cfg, tmp_path):
    """foreach Adam cannot take the skip decision on the device: the core's `bool(skip)` is reported with its
    line, and the run stops with the fix in the message."""
    with pytest.raises(HostSyncError) as err:
        run(make_cfg("hardware.optimizer_impl=foreach", "train.host_sync_check=error", "max_steps=4"))
    message = str(err.value)
    assert "aten._local_scalar_dense" in message and "core/stepping.py" in message
    assert "train.host_sync_check=warn" in message


def test_warn_mode_records_each_sync_and_training_goes_on(make_cfg, tmp_path, checks):
    metrics = run(
        make_cfg(
            "hardware.optimizer_impl=foreach",
            "train.host_sync_check=warn",
            "max_steps=6",
            "model.objective.regularizers.r1.gamma=0",
        )
    )
    assert metrics["iteration"] == 6
    (check,) = checks
    # Two host-decided steps (D, G) per checked iteration (1..4; 0 sets up, 5 is the last). (foreach Adam's own
    # `.item()` on its step counts shows up too: on CPU the counter cannot tell that those live on the host.)
    decisions = [e for e in check.events if "skip.item()" in _source_line(e[2])]
    assert check.checked == 4 and [i for i, _, _ in decisions] == [1, 1, 2, 2, 3, 3, 4, 4]
    # Having waited anyway, the core reads its guard at once; that read is marked deliberate and not reported.
    assert {op for _, op, _ in check.events} == {"aten._local_scalar_dense"}


def _source_line(where: str) -> str:
    path, line = where.split(" ")[0].rsplit(":", 1)
    return linecache.getline(path, int(line))


def test_the_counter_sees_the_ops_that_synchronise_on_cuda():
    x = torch.randn(8)
    with SyncCounter() as counter:
        _ = x.sum() * 2  # stays a tensor: no sync
        _ = torch.where(x > 0, x, 0.0)
    assert counter.events == []
    with SyncCounter() as counter:
        float(x.sum())
        bool(x[0] > 0)
        x.nonzero()
        x[x > 0]
        x[:2].tolist()  # no aten op on a CPU tensor, a device-to-host copy on CUDA
    assert [op for op, _ in counter.events] == [
        "aten._local_scalar_dense",
        "aten._local_scalar_dense",
        "aten.nonzero",
        "aten.index",
        "Tensor.tolist",
    ]
    assert torch.Tensor.tolist.__name__ == "tolist"  # restored on exit
    assert all("test_host_sync.py" in where for _, where in counter.events), counter.events


def test_a_last_iteration_the_time_budget_decides_passes_the_check(make_cfg, checks, monkeypatch):
    """No one knows in advance which iteration the budget ends on; its final reads are deliberate and pass."""
    from pixelsmith.core import budget as budget_module

    readings = iter(
        range(10**6)
    )  # one second per reading: the budget of 3.5 s is past at iteration 4's check
    monkeypatch.setattr(budget_module, "clock", lambda: float(next(readings)))
    overrides = ["hardware.optimizer_impl=fused", "train.host_sync_check=error", "max_steps=10"]
    metrics = run(
        make_cfg(*overrides, f"train.time_budget_minutes={3.5 / 60}", "train.log_every_n_steps=100")
    )
    assert metrics["iteration"] == 4 and metrics["stop_reason"] == "time_budget"
    (check,) = checks
    assert check.checked == 3 and check.events == []  # 1, 2, 3 (3 turned out to be the last)


def test_the_progress_bar_reads_its_metrics_only_at_logging_iterations(make_cfg, monkeypatch):
    """Lightning's rich bar converts its metrics with .item() on every batch (a GPU sync per iteration)."""
    from pixelsmith.callbacks.progress import IterationProgressBar

    reads = []
    original = IterationProgressBar.get_metrics

    def counting(self, trainer, pl_module):
        reads.append(pl_module.iteration)
        return original(self, trainer, pl_module)

    monkeypatch.setattr(IterationProgressBar, "get_metrics", counting)
    run(make_cfg("train.progress_bar=true", "train.log_every_n_steps=3", "max_steps=7"))
    # 7 is read twice: at its batch end (the last iteration) and at the epoch end after training.
    assert {i for i in reads if i > 0} == {3, 6, 7}


# ---- the whole Lightning loop (train.host_sync_scope=loop), not only the module's step --------------------------
class ReadsTheDeviceAtEveryBatchEnd(L.Callback):
    """A callback after the check that reads a device value at every batch end: a GPU sync per iteration."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        float(next(pl_module.parameters()).sum())  # the sync under test


QUIET_RUN = [
    "hardware.optimizer_impl=fused",
    "train.host_sync_check=warn",
    "train.log_every_n_steps=4",
    "max_steps=9",
    "data.limit=128",
]


@pytest.mark.parametrize("scope", ["loop", "step"])
def test_the_loop_scope_sees_a_sync_in_another_callbacks_batch_end(make_cfg, checks, scope):
    cfg = make_cfg(*QUIET_RUN, f"train.host_sync_scope={scope}")
    with open_dict(cfg):
        cfg.callbacks.reader = {"_target_": f"{__name__}.ReadsTheDeviceAtEveryBatchEnd"}
    run(cfg)
    (check,) = checks
    assert check.checked == 5  # 1, 2, 4, 5, 6 (0 sets up; 3 and 7 log; 8 is the last)
    found = [(i, op) for i, op, where in check.events if "test_host_sync.py" in where]
    if scope == "loop":
        # Each checked iteration's read, named with its line; never at a logging or the last iteration.
        assert found == [(i, "aten._local_scalar_dense") for i in (1, 2, 4, 5, 6)]
    else:  # the module's step only: the other callbacks run after the window closed
        assert found == []


@pytest.mark.parametrize("scope", ["loop", "step"])
def test_the_loop_scope_sees_a_sync_in_the_batch_fetch(make_cfg, checks, monkeypatch, scope):
    """The next batch is fetched (here: sliced from the device-resident dataset) before `on_train_batch_start`."""
    from pixelsmith.data.on_device import DeviceResidentBatches

    original = DeviceResidentBatches.indices

    def indices_read_on_the_host(self, iteration):
        chosen = original(self, iteration)
        int(chosen[0])  # the sync under test: a fetch that decides something on the host
        return chosen

    monkeypatch.setattr(DeviceResidentBatches, "indices", indices_read_on_the_host)
    run(make_cfg(*QUIET_RUN, f"train.host_sync_scope={scope}"))
    (check,) = checks
    fetches = [i for i, _, where in check.events if "indices_read_on_the_host" in where]
    # Lightning prefetches one batch: checked iteration i's window ends with the fetch for iteration i + 2, and it
    # stays open into iteration i + 1's fetch only when i + 1 is checked too (3 and 7 log, 8 is the last).
    assert fetches == ([1, 2, 4, 5, 6] if scope == "loop" else [])


class LogsItsOwnValue:
    """Mixin for the configured GAN module: at each logging iteration it also logs a device value to the progress
    bar with `self.log`, as a fork's own module would."""

    def _log_iteration(self, last: bool) -> None:
        super()._log_iteration(last)
        self.log("user/value", self.generator_loss_probe(), prog_bar=True, on_step=True, on_epoch=False)

    def generator_loss_probe(self):
        return next(self.generator.parameters()).detach().float().abs().mean()


def _module_that_logs_its_own_value(target: str) -> str:
    from hydra.utils import get_class

    base = get_class(target)
    name = f"{base.__name__}LogsItsOwnValue"
    if name not in globals():
        globals()[name] = type(name, (LogsItsOwnValue, base), {"__module__": __name__, "__qualname__": name})
    return f"{__name__}.{name}"


@pytest.mark.parametrize("released", [True, False])
def test_lightning_converts_no_logged_value_between_logging_iterations(
    make_cfg, checks, monkeypatch, released
):
    """The core's own values never pass Lightning's step results (they go straight to `callback_metrics` and the
    bar). A module's own `self.log` of a device value to the progress bar does: Lightning's logger connector then
    `.item()`s it at every batch end unless StepResultsRelease drops it once logged; without it the loop scope finds
    that sync on every quiet iteration after the first log."""
    from pixelsmith.callbacks.step_results import StepResultsRelease

    if not released:
        monkeypatch.setattr(StepResultsRelease, "on_train_batch_start", lambda *args: None)
    longer = [arg for arg in QUIET_RUN if not arg.startswith("max_steps=")] + ["max_steps=13"]
    cfg = make_cfg(*longer, "train.progress_bar=true")
    with open_dict(cfg):
        cfg.model._target_ = _module_that_logs_its_own_value(cfg.model._target_)
    metrics = run(cfg)
    (check,) = checks
    conversions = [i for i, _, where in check.events if "to_item" in where]
    # The module logs at iterations 3 and 7 (0-based batch indices of logging iterations 4 and 8): without the
    # release, every checked iteration after the first log converts it again.
    assert conversions == ([] if released else [4, 5, 6, 8, 9, 10])
    assert len(check.events) == len(conversions)  # nothing else in the loop waits
    assert metrics["img/s"] > 0  # what the core logged still reaches the final metrics


def test_the_loop_scope_falls_back_to_the_step_under_several_processes(caplog):
    """Lightning reads its broadcast SIGTERM flag on the host at every iteration under DDP: said once, step scope."""
    from types import SimpleNamespace

    check = HostSyncCheck("error", scope="loop")
    check.on_train_start(SimpleNamespace(world_size=2), None)
    assert check.scope == "step"
    assert "under 2 processes" in caplog.text and "host_sync_scope=step" in caplog.text
    single = HostSyncCheck("error", scope="loop")
    single.on_train_start(SimpleNamespace(world_size=1), None)
    assert single.scope == "loop"


def test_an_unknown_scope_is_refused_with_the_choices():
    from pixelsmith.errors import PixelsmithError

    with pytest.raises(PixelsmithError, match="loop, step"):
        HostSyncCheck("error", scope="everything")
