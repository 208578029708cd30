"""Prometheus exporter: training and GPU metrics on an HTTP port, for Prometheus + Grafana (`callbacks=prometheus`).

    python train.py callbacks=prometheus                       # http://<host>:9464/metrics
    python train.py callbacks=prometheus callbacks.prometheus.port=9500

Rank 0 serves (prometheus-client's own HTTP server, a daemon thread; `pip install -e ".[monitoring]"`):
- `pixelsmith_iteration`, `pixelsmith_images_per_second`, `pixelsmith_images_seen_total`;
- `pixelsmith_metric{name="loss/G"}` for every scalar the run logs: losses, learning rates, gradient norms, EMA,
  evaluation scores (`eval/fid`, `eval/kid_mean`, ...), the step-time breakdown (`perf/ms/<region>` with
  `profiler=breakdown`);
- with NVML (`nvidia-ml-py`) on a machine with NVIDIA GPUs, per GPU `pixelsmith_gpu_utilization_percent`,
  `pixelsmith_gpu_memory_used_bytes`, `pixelsmith_gpu_memory_total_bytes`, `pixelsmith_gpu_power_watts`,
  `pixelsmith_gpu_temperature_celsius` (label `gpu`), read when Prometheus scrapes. Without NVML those series are
  absent, and the rest works.

The training values are read at logging iterations (`train.log_every_n_steps`), where the host may wait for the
device, never in between. `deploy/grafana/pixelsmith.json` is a dashboard for these series.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from pixelsmith.core.host_reads import host_reads_allowed
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


class _NvmlCollector:
    """Reads GPU gauges from NVML at scrape time (no thread of our own, no cost between scrapes)."""

    def __init__(self, pynvml):
        self.nvml = pynvml
        self.count = pynvml.nvmlDeviceGetCount()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        families = {
            "utilization": GaugeMetricFamily(
                "pixelsmith_gpu_utilization_percent",
                "GPU busy time over the last sample period",
                labels=["gpu"],
            ),
            "used": GaugeMetricFamily(
                "pixelsmith_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"]
            ),
            "total": GaugeMetricFamily("pixelsmith_gpu_memory_total_bytes", "GPU memory", labels=["gpu"]),
            "power": GaugeMetricFamily("pixelsmith_gpu_power_watts", "GPU power draw", labels=["gpu"]),
            "temperature": GaugeMetricFamily(
                "pixelsmith_gpu_temperature_celsius", "GPU core temperature", labels=["gpu"]
            ),
        }
        nvml = self.nvml
        for index in range(self.count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            label = [str(index)]
            families["utilization"].add_metric(label, nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            families["used"].add_metric(label, memory.used)
            families["total"].add_metric(label, memory.total)
            families["power"].add_metric(label, nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            families["temperature"].add_metric(
                label, nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
        yield from families.values()


def nvml_collector() -> _NvmlCollector | None:
    """The GPU collector, or None where NVML is missing (no nvidia-ml-py, no driver, a CPU machine)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return _NvmlCollector(pynvml)
    except Exception as err:  # ImportError or an NVMLError: GPU gauges are simply absent
        log.info("Prometheus exporter: no GPU gauges (%s: %s).", type(err).__name__, err)
        return None


class PrometheusExporter(Callback):
    def __init__(self, port: int = 9464, addr: str = "0.0.0.0"):
        self.port = port
        self.addr = addr
        self.bound_port: int | None = None  # the port actually served (port=0 picks a free one)
        self._server = None
        self._gauges: dict[str, Any] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero or self._server is not None:
            return
        try:
            from prometheus_client import CollectorRegistry, Gauge, start_http_server
        except ImportError as err:
            raise PixelsmithError(
                'callbacks=prometheus needs prometheus-client: pip install -e ".[monitoring]" (it also installs '
                "nvidia-ml-py for the GPU gauges), or drop callbacks=prometheus."
            ) from err
        registry = CollectorRegistry()
        self._gauges = {
            "iteration": Gauge("pixelsmith_iteration", "Training iterations done", registry=registry),
            "img_per_s": Gauge(
                "pixelsmith_images_per_second", "Training images/s since the previous log", registry=registry
            ),
            "images_seen": Gauge(
                "pixelsmith_images_seen_total", "Training images seen (all ranks)", registry=registry
            ),
            "metric": Gauge(
                "pixelsmith_metric",
                "A scalar the run logs (losses, lr, eval, perf)",
                ["name"],
                registry=registry,
            ),
        }
        collector = nvml_collector()
        if collector is not None:
            registry.register(collector)
        try:
            self._server, _thread = start_http_server(self.port, addr=self.addr, registry=registry)
        except OSError as err:
            raise PixelsmithError(
                f"The Prometheus exporter cannot listen on {self.addr}:{self.port} ({err}). Choose a free port: "
                "callbacks.prometheus.port=<port> (0 picks any free one)."
            ) from err
        self.bound_port = self._server.server_port
        log.info("Prometheus metrics on http://%s:%d/metrics", self.addr, self.bound_port)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._server is None:
            return
        iteration = int(getattr(pl_module, "iteration", trainer.global_step))
        core = getattr(pl_module, "core", None)
        every = getattr(core, "log_every_n_steps", 1)
        if iteration % every != 0 and not trainer.should_stop:
            return
        self._gauges["iteration"].set(iteration)
        self._gauges["images_seen"].set(float(getattr(pl_module, "images_seen", 0)))
        with host_reads_allowed():  # a logging iteration: the values were just logged
            for name, value in trainer.callback_metrics.items():
                scalar = (torch.is_tensor(value) and value.numel() == 1) or isinstance(value, int | float)
                if not scalar:
                    continue
                number = float(value)
                if name == "img/s":
                    self._gauges["img_per_s"].set(number)
                self._gauges["metric"].labels(name=name).set(number)

    def on_train_end(self, trainer, pl_module) -> None:
        self.on_train_batch_end(trainer, pl_module, None, None, 0)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
