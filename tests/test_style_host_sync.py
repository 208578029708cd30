"""A style iteration that logs nothing never makes the host wait for the device (the style models' case of
test_host_sync.py, with its recording of the HostSyncCheck callbacks)."""

from __future__ import annotations

import pytest

from pixelsmith.run.fit import run
from tests.test_host_sync import record_host_sync_checks


@pytest.fixture
def checks(monkeypatch):
    return record_host_sync_checks(monkeypatch)


@pytest.mark.filterwarnings("ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning")
@pytest.mark.filterwarnings("ignore:The number of training batches")
@pytest.mark.parametrize("model", ["style_fast", "style_adain"])
def test_the_style_iteration_never_waits_for_the_device(tmp_path, checks, model):
    from tests.test_style_train import _cfg

    overrides = ["hardware.optimizer_impl=fused", "train.host_sync_check=error", "train.log_every_n_steps=4"]
    metrics = run(_cfg(tmp_path, model, *overrides, "max_steps=6", "train.clip_grad_norm=1.0"))
    assert metrics["iteration"] == 6
    (check,) = checks
    assert check.checked == 3 and check.events == []  # 1, 2, 4
