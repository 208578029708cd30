"""Auto batch size: the search on an exact memory model (doubling, binary search, margin, limits), and on a real RAM
budget with real training iterations; the batch handed to relaunched DDP ranks, and the linear lr scaling rule."""

from __future__ import annotations

import json

import pytest

from pixelsmith.errors import PixelsmithError
from pixelsmith.perf import batch_size as auto
from pixelsmith.perf import memory
from pixelsmith.perf.batch_size import Trial, choose_batch_size, search_batch_size
from pixelsmith.run.build import resolve_hardware


def _linear_memory(base: float, per_image: float, budget: float):
    calls = []

    def probe(batch: int) -> Trial:
        calls.append(batch)
        peak = base + per_image * batch
        return Trial(batch, peak <= budget, peak)

    return probe, calls


def test_search_doubles_bisects_and_backs_off_by_the_margin():
    probe, calls = _linear_memory(100.0, 3.0, 1000.0)  # largest fitting batch: 300
    result = search_batch_size(probe, start=16, max_batch=4096, margin=0.15)
    assert calls[:6] == [16, 32, 64, 128, 256, 512]  # doubling until the first failure
    assert 300 * 0.95 <= result.best_fit <= 300  # bisected to within 5%
    assert result.chosen == int(result.best_fit * 0.85)
    assert result.memory_limited and len(calls) <= 12
    for t in result.trials:
        assert t.fits == (t.peak_mb <= 1000.0)


def test_search_halves_a_start_that_does_not_fit():
    probe, calls = _linear_memory(100.0, 10.0, 1000.0)  # fits up to 90
    result = search_batch_size(probe, start=256, max_batch=4096, margin=0.1)
    assert calls[:3] == [256, 128, 64]
    assert 85 <= result.best_fit <= 90 and result.chosen == int(result.best_fit * 0.9)


def test_no_margin_when_memory_is_not_the_limit_and_an_error_when_nothing_fits():
    probe, calls = _linear_memory(100.0, 0.01, 1000.0)
    result = search_batch_size(probe, start=64, max_batch=1000, margin=0.15)
    assert calls[-1] == 1000 and result.best_fit == result.chosen == 1000 and not result.memory_limited
    probe, _ = _linear_memory(2000.0, 1.0, 1000.0)
    with pytest.raises(PixelsmithError, match="does not fit"):
        search_batch_size(probe, start=8, max_batch=64, budget_mb=1000.0)


@pytest.mark.skipif(not memory.can_reset_peak_rss(), reason="needs Linux /proc/self/clear_refs")
@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_auto_batch_on_a_ram_budget_with_real_iterations(make_cfg, tmp_path, monkeypatch):
    monkeypatch.delenv(auto.ENV_KEY, raising=False)
    # Narrow networks at 64 px: activation memory is large per FLOP, so trials reach the budget quickly.
    small = ["data.resolution=64", "model.generator.ngf=4", "model.discriminator.ndf=4"]
    warm = make_cfg(*small, output="warm")
    auto.make_training_trial(warm, resolve_hardware(warm))(
        2
    )  # this process's one-time growth, before the budget
    memory.release_free_memory()
    budget_mb = (memory.rss_mb() or 0.0) + 50.0  # a budget 50 MB above what this process holds now
    cfg = make_cfg(
        *small,
        "auto_batch.enabled=true",
        f"auto_batch.ram_budget_gb={budget_mb / 1024.0}",
        "auto_batch.start=64",
        "auto_batch.max_batch=2048",
        "auto_batch.scale_lr=true",
        "data.batch_size=16",  # the reference batch the lrs were tuned for
    )
    hardware = resolve_hardware(cfg)
    chosen = choose_batch_size(cfg, hardware, None)
    report = json.loads((tmp_path / "run" / "perf" / "auto_batch.json").read_text())
    trials = report["trials"]
    measured = [t for t in trials if t["measured"]]
    assert len(measured) >= 3
    # Peak RSS grows with the batch (a real measurement, not a constant).
    by_batch = sorted((t["batch"], t["peak_mb"]) for t in measured)
    assert by_batch[-1][1] > by_batch[0][1] + 5
    best = report["best_fit"]
    assert report["memory_limited"] and chosen == report["chosen"] == int(best * 0.85)
    assert all(t["peak_mb"] <= budget_mb for t in measured if t["fits"])
    assert all(t["peak_mb"] > budget_mb for t in measured if not t["fits"])
    assert report["baseline_mb"] < budget_mb - 10  # the search had room to grow
    assert any(t["batch"] > best and not t["fits"] for t in trials)  # the budget, not max_batch, stopped it
    assert cfg.data.batch_size == chosen
    assert cfg.model.g_optimizer.lr == pytest.approx(1e-3 * chosen / 16)
    assert cfg.model.d_optimizer.lr == pytest.approx(1e-3 * chosen / 16)

    # A relaunched DDP rank (same config, inherited environment) reuses the result without searching.
    def no_search(*args, **kwargs):
        raise AssertionError("searched again")

    monkeypatch.setattr(auto, "make_training_trial", no_search)
    again = make_cfg(
        *small,
        "auto_batch.enabled=true",
        f"auto_batch.ram_budget_gb={budget_mb / 1024.0}",
        "auto_batch.start=64",
        "auto_batch.max_batch=2048",
        "auto_batch.scale_lr=true",
        "data.batch_size=16",
        output="rank1",
    )
    assert choose_batch_size(again, resolve_hardware(again), None) == chosen


def test_predicted_overshoot_is_not_run_on_cpu():
    ran = []
    probe = auto.MemoryProbe(lambda b: ran.append(b), __import__("torch").device("cpu"), budget_mb=1000.0)
    probe.points = [(16, 500.0), (32, 700.0)]  # 12.5 MB per image: 512 would need ~6.7 GB
    trial = probe(512)
    assert not trial.fits and not trial.measured and ran == []
