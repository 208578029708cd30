"""Throughput and MFU: FLOP counts against the convolution formula and against the plain loop, the GPU peak table,
the cached CPU GEMM peak (measured again when a run outdoes it: never an MFU above 100%), and the numbers a breakdown
run writes to throughput.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

# General code checked with the GAN part as its vehicle: a fork without it (README "Removing a part") skips
# this file rather than failing to import it.
pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")

from benchmarks.plain_loop import build_plain_gan, endless, plain_loader  # noqa: E402
from pixelsmith.gan.networks.dcgan import DCGANDiscriminator  # noqa: E402
from pixelsmith.perf import flops as flops_mod  # noqa: E402
from pixelsmith.perf.flops import count_flops, cpu_peak_flops, gpu_peak_flops, peak_precision_key  # noqa: E402
from pixelsmith.run.build import resolve_hardware  # noqa: E402
from pixelsmith.run.fit import run  # noqa: E402
from tests.conftest import cpu_flags, torch_threads  # noqa: E402


def _conv_flops(batch, c_in, c_out, k, h_out, w_out):
    return 2 * batch * c_in * c_out * k * k * h_out * w_out


def test_flop_count_of_a_discriminator_forward_matches_the_convolution_formula():
    D = DCGANDiscriminator(resolution=32, channels=3, ndf=8)
    x = torch.randn(5, 3, 32, 32)
    expected = (
        _conv_flops(5, 3, 8, 4, 16, 16)  # 32 -> 16
        + _conv_flops(5, 8, 16, 4, 8, 8)  # 16 -> 8
        + _conv_flops(5, 16, 32, 4, 4, 4)  # 8 -> 4
        + _conv_flops(5, 32, 1, 4, 1, 1)  # 4 -> 1 logit
    )
    assert count_flops(lambda: D(x)) == expected
    # Backward of a conv costs its forward twice (input and weight gradients), except the first layer's input grad.
    first = _conv_flops(5, 3, 8, 4, 16, 16)
    assert count_flops(lambda: D(x).sum().backward()) == 3 * expected - first


@pytest.mark.parametrize(
    "name, key, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA H200", "fp16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
        ("Tesla V100-SXM2-32GB", "fp16", 125.0),
        ("Tesla V100S-PCIE-32GB", "fp32", 16.4),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ],
)
def test_gpu_peak_table_dense_figures(name, key, tflops):
    assert gpu_peak_flops(name, key) == pytest.approx(tflops * 1e12)


def test_gpu_peak_table_refuses_what_does_not_exist():
    assert gpu_peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # Volta has no bf16 tensor cores
    assert gpu_peak_flops("NVIDIA L40S", "bf16") is None  # "l4" must not match L40S
    assert peak_precision_key("bf16-mixed", "cpu") == "bf16"
    assert peak_precision_key("16-mixed", "cuda") == "fp16"
    assert peak_precision_key("32-true", "cpu") == "fp32"


def test_cpu_gemm_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(dtype):
        calls.append(dtype)
        return 123e9

    value, source = cpu_peak_flops("fp32", measure=fake_measure)
    assert value == 123e9 and "measured" in source and calls == [torch.float32]
    value, source = cpu_peak_flops("fp32", measure=fake_measure)
    assert value == 123e9 and "cached" in source and len(calls) == 1
    table = json.loads((tmp_path / "cpu_gemm_peak.json").read_text())
    assert any(key.endswith("torch.float32") for key in table)
    cpu_peak_flops("bf16", measure=fake_measure)  # another dtype is another entry
    assert calls == [torch.float32, torch.bfloat16]
    # An instruction set capped by the environment (AVX2 emulated on an AVX-512 CPU) is another entry too: the two
    # peaks differ about 2x, and one read for the other puts MFU off by as much.
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    cpu_peak_flops("fp32", measure=fake_measure)
    assert calls == [torch.float32, torch.bfloat16, torch.float32]
    table = json.loads((tmp_path / "cpu_gemm_peak.json").read_text())
    assert any(key.endswith("ATEN_CPU_CAPABILITY=avx2,ONEDNN_MAX_CPU_ISA=AVX2") for key in table)


def test_gemm_rate_is_two_n_cubed_over_the_fastest_run(monkeypatch):
    """A scripted clock: three runs of a 64^3 matmul "take" 4, 2 and 3 ms; the rate is 2 * 64^3 FLOPs over the
    fastest (2 ms), not the mean, not n^3."""
    readings = iter([0.0, 1.0, 1.004, 2.0, 2.002, 3.0, 3.003, 4.0])
    monkeypatch.setattr(flops_mod.time, "perf_counter", lambda: next(readings))
    value = flops_mod.measure_gemm_flops(torch.float32, size=64, min_seconds=0.0)
    assert value == pytest.approx(2 * 64**3 / 0.002, rel=1e-9)  # 262.144 MFLOP/s


def _cpu_clock_range_hz() -> tuple[float, float] | None:
    """(lowest reported, highest possible) core clock: the kernel's current MHz per core, and cpufreq's maximum where
    there is one, else twice the highest reported (a VM reports its nominal clock; turbo stays below 2x)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    mhz = [float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")]
    if not mhz:
        return None
    cpufreq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    highest = int(cpufreq.read_text()) * 1e3 if cpufreq.is_file() else 2 * max(mhz) * 1e6
    return min(mhz) * 1e6, max(highest, max(mhz) * 1e6)


def test_real_gemm_measurement_is_within_what_this_cpu_can_do():
    """One thread's fp32 GEMM rate must lie between 1/8 of one core's vector peak at its lowest reported clock (any
    BLAS reaches that on its best run; a rate in the wrong unit or off by the FLOP count would not) and that peak at
    its highest possible clock (two FMA units: 64 FLOPs per cycle with AVX-512, 32 with AVX2/FMA, 16 with SSE)."""
    flags, clocks = cpu_flags(), _cpu_clock_range_hz()
    if flags is None or clocks is None:
        pytest.skip("no x86 flags or clock in /proc/cpuinfo: this machine's peak cannot be bounded")
    per_cycle = 64 if "avx512f" in flags else 32 if "fma" in flags else 16
    lowest_hz, highest_hz = clocks
    with torch_threads(1):  # one core: two threads on a loaded 2-core machine wait on each other (10x slower)
        value = flops_mod.measure_gemm_flops(torch.float32, size=256, min_seconds=0.2)
    assert per_cycle * lowest_hz / 8 <= value <= per_cycle * highest_hz, (value, per_cycle, clocks)


def test_throughput_json_counts_a_real_iteration_like_the_plain_loop(make_cfg, tmp_path):
    cfg = make_cfg(
        "precision=32-true",
        "max_steps=5",
        "profiler=breakdown",
        "profiler.peak_tflops=0.5",
        "train.sample_every_n_steps=0",
        "eval.every_n_steps=0",  # no FID at start/end: not what these tests measure
    )
    run(cfg)
    summary = json.loads((tmp_path / "run" / "perf" / "throughput.json").read_text())
    # The same networks, losses and batch in a plain loop: the FLOPs of one (non-R1) iteration must agree exactly.
    hardware = resolve_hardware(cfg)
    gan = build_plain_gan(cfg, hardware, "foreach")
    images = next(endless(plain_loader(cfg, hardware)))
    assert summary["flops_per_iteration"] == count_flops(lambda: gan.step(images))
    assert summary["flops_counted_at_iteration"] == 1 and summary["measured_iterations"] == 3
    achieved = summary["flops_per_iteration"] / (summary["step_ms"]["mean"] / 1000)
    assert summary["achieved_tflops"] == pytest.approx(achieved / 1e12)
    assert summary["mfu"] == pytest.approx(achieved / 0.5e12)
    assert summary["peak_source"].startswith("configured")
    memory = summary["memory"]
    assert memory["peak_rss_mb"] >= memory["rss_mb"] > 100
    assert summary["img_per_s"]["from_mean_step"] == pytest.approx(16 / (summary["step_ms"]["mean"] / 1000))


def test_a_cached_cpu_peak_below_what_a_run_achieved_is_measured_again(make_cfg, tmp_path, monkeypatch):
    # A peak cached under heavy load: 1 MFLOP/s, far below any run (MFU in the thousands of percent).
    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(flops_mod, "_REMEASURED", set())
    cpu_peak_flops("fp32", measure=lambda dtype: 1e6)
    measured = []
    monkeypatch.setattr(flops_mod, "measure_gemm_flops", lambda dtype: measured.append(dtype) or 1e15)
    cfg = make_cfg("precision=32-true", "max_steps=5", "profiler=breakdown", "train.sample_every_n_steps=0")
    run(cfg)
    summary = json.loads((tmp_path / "run" / "perf" / "throughput.json").read_text())
    assert measured == [torch.float32]  # measured again once, after training
    assert summary["peak_tflops"] == pytest.approx(1000.0) and "re-measured" in summary["peak_source"]
    assert summary["mfu"] == pytest.approx(summary["achieved_tflops"] / 1000.0) and 0 < summary["mfu"] <= 1.0
    assert cpu_peak_flops("fp32")[0] == 1e15  # the cache keeps the new peak


def test_no_mfu_when_the_cpu_peak_stays_below_what_a_run_achieved(tmp_path, monkeypatch):
    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(flops_mod, "_REMEASURED", set())
    cpu_peak_flops("bf16", measure=lambda dtype: 2e9)
    measured = []

    def busy_measure(dtype):  # still loaded: 3 GFLOP/s, below the 5 achieved
        measured.append(dtype)
        return 3e9

    assert flops_mod.plausible_peak_flops("bf16", 1e9, busy_measure)[0] == 2e9  # plausible: as cached
    value, source = flops_mod.plausible_peak_flops("bf16", 5e9, busy_measure)
    assert value is None and source.startswith("no plausible peak") and "3.0 GFLOP/s" in source
    assert flops_mod.plausible_peak_flops("bf16", 5e9, busy_measure)[0] is None
    assert measured == [
        torch.bfloat16
    ]  # once per process: the second implausible figure costs no measurement
