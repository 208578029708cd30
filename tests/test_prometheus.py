"""The Prometheus exporter, scraped over 127.0.0.1 during a short CPU run; the Grafana dashboard asks for what it
serves."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from lightning.pytorch.callbacks import Callback

from pixelsmith.paths import REPO_ROOT
from pixelsmith.train import run

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


class Scraper(Callback):
    """Fetches /metrics at the end of chosen iterations, after the exporter updated (it is listed earlier)."""

    def __init__(self, at: set[int]):
        self.at, self.pages = at, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.iteration in self.at:
            (exporter,) = [c for c in trainer.callbacks if type(c).__name__ == "PrometheusExporter"]
            url = f"http://127.0.0.1:{exporter.bound_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                self.pages[pl_module.iteration] = response.read().decode()


def _samples(page: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
    }


def test_a_cpu_run_serves_its_metrics_and_no_gpu_gauges(make_cfg, monkeypatch):
    import pixelsmith.train as train_module

    scraper = Scraper(at={2, 4})
    original = train_module._instantiate_group
    monkeypatch.setattr(
        train_module,
        "_instantiate_group",
        lambda node: original(node) + ([scraper] if node is not None and "checkpoint" in node else []),
    )
    run(
        make_cfg(
            "callbacks=prometheus",
            "callbacks.prometheus.port=0",
            "callbacks.prometheus.addr=127.0.0.1",
            "train.log_every_n_steps=2",
            "max_steps=4",
            "precision=32-true",
        )
    )
    first, second = _samples(scraper.pages[2]), _samples(scraper.pages[4])
    assert first[("pixelsmith_iteration", ())] == 2 and second[("pixelsmith_iteration", ())] == 4
    assert second[("pixelsmith_images_seen_total", ())] == 4 * 16
    assert second[("pixelsmith_images_per_second", ())] > 0
    for name in ("loss/G", "loss/D", "lr/G", "grad_norm/D"):
        assert ("pixelsmith_metric", (("name", name),)) in second, name
    assert not any(name.startswith("pixelsmith_gpu_") for name, _ in second)  # no NVML on this machine


def test_the_dashboard_queries_only_series_the_exporter_serves():
    dashboard = json.loads((REPO_ROOT / "deploy" / "grafana" / "pixelsmith.json").read_text())
    source = (REPO_ROOT / "src" / "pixelsmith" / "callbacks" / "prometheus.py").read_text()
    served = set(re.findall(r'"(pixelsmith_[a-z_]+)"', source))
    assert {"pixelsmith_iteration", "pixelsmith_metric", "pixelsmith_gpu_power_watts"} <= served
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"pixelsmith_[a-z_]+", target["expr"])
    }
    assert queried and queried <= served, queried - served
    assert any(name.startswith("pixelsmith_gpu_") for name in queried)  # the GPU panels are there
