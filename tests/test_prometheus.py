"""The Prometheus exporter, scraped over 127.0.0.1 during a short CPU run, with the GPU gauges this host's NVML
gives (none on a CPU machine, one set per GPU where NVML finds GPUs; both cases also with NVML mocked); the Grafana
dashboard asks for what it serves."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import Callback

from pixelsmith.callbacks.prometheus import PrometheusExporter
from pixelsmith.config.paths import REPO_ROOT
from pixelsmith.run.fit import run

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


GPU_GAUGES = (
    "pixelsmith_gpu_utilization_percent",
    "pixelsmith_gpu_memory_used_bytes",
    "pixelsmith_gpu_memory_total_bytes",
    "pixelsmith_gpu_power_watts",
    "pixelsmith_gpu_temperature_celsius",
)


def _gpus_nvml_finds() -> int:
    """How many GPUs NVML reports on this host: 0 without nvidia-ml-py, without a driver, or on a CPU machine."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # ImportError, or NVMLError (e.g. the library or driver not found)
        return 0


def _gpu_gauges(samples: dict[tuple[str, tuple], float]) -> dict[tuple[str, str], float]:
    """{(gauge name, gpu label): value} of the pixelsmith_gpu_* series in a scrape."""
    return {
        (name, dict(labels)["gpu"]): value
        for (name, labels), value in samples.items()
        if name.startswith("pixelsmith_gpu_")
    }


def test_a_cpu_run_serves_its_metrics_and_the_gpu_gauges_this_host_has(make_cfg, monkeypatch):
    import pixelsmith.run.trainer as train_module

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
    # The GPU gauges follow the host, not the run's device: none without NVML or GPUs, all five per GPU NVML finds
    # (a CPU run on a GPU machine still serves them).
    gpus = _gpus_nvml_finds()
    assert set(_gpu_gauges(second)) == {(name, str(index)) for name in GPU_GAUGES for index in range(gpus)}


class FakeNvml:
    """The nvidia-ml-py calls the exporter makes, answering for `count` GPUs (or failing at init, as without a
    driver)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, count: int, driver: bool = True):
        self.count, self.driver = count, driver

    def nvmlInit(self) -> None:
        if not self.driver:
            raise RuntimeError("NVML Shared Library Not Found")  # pynvml raises NVMLError_LibraryNotFound

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        return SimpleNamespace(gpu=50 + handle)

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        return SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 300_000 + 1000 * handle  # milliwatts

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 60 + handle


def _scrape_exporter() -> dict[tuple[str, tuple], float]:
    """Start the exporter as rank 0 of a run, scrape /metrics once, stop it."""
    exporter = PrometheusExporter(port=0, addr="127.0.0.1")
    trainer = SimpleNamespace(is_global_zero=True)
    exporter.setup(trainer, None, "fit")
    try:
        url = f"http://127.0.0.1:{exporter.bound_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return _samples(response.read().decode())
    finally:
        exporter.teardown(trainer, None, "fit")


def test_gpu_gauges_are_served_per_gpu_when_nvml_finds_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(count=2))
    gauges = _gpu_gauges(_scrape_exporter())
    assert set(gauges) == {(name, index) for name in GPU_GAUGES for index in ("0", "1")}
    assert gauges[("pixelsmith_gpu_utilization_percent", "1")] == 51
    assert gauges[("pixelsmith_gpu_memory_used_bytes", "1")] == 2 * 2**30
    assert gauges[("pixelsmith_gpu_memory_total_bytes", "0")] == 80 * 2**30
    assert gauges[("pixelsmith_gpu_power_watts", "1")] == 301.0  # NVML's milliwatts as watts
    assert gauges[("pixelsmith_gpu_temperature_celsius", "0")] == 60


@pytest.mark.parametrize(
    "nvml",
    [None, FakeNvml(count=2, driver=False), FakeNvml(count=0)],
    ids=["no-nvidia-ml-py", "no-driver", "no-gpu"],
)
def test_no_gpu_gauges_without_nvml_or_gpus(nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: `import pynvml` raises ImportError
    samples = _scrape_exporter()
    assert not _gpu_gauges(samples)
    assert ("pixelsmith_iteration", ()) in samples  # the training series are served all the same


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
