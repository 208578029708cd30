"""profiler=torch: a window of iterations becomes a Chrome trace with the module's regions as named ranges, plus a
kernel summary table and CSV in the run dir; the profiler is stopped after the window."""

from __future__ import annotations

import csv
import json

from pixelsmith.run.fit import run


def test_torch_profiler_window_writes_trace_and_kernel_table(make_cfg, tmp_path):
    cfg = make_cfg(
        "precision=32-true",
        "max_steps=5",
        "profiler=torch",
        "profiler.torch_wait=1",
        "profiler.torch_warmup=1",
        "profiler.torch_active=2",
        "train.sample_every_n_steps=0",
        "eval.every_n_steps=0",  # no FID at start/end: not what these tests measure
    )
    run(cfg)
    out = tmp_path / "run" / "perf"
    trace = json.loads((out / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    for region in ("h2d", "G_fwd", "D_fwd", "D_bwd", "G_bwd", "opt_step", "ema"):
        assert region in names, region
    assert any(str(n).startswith("aten::convolution") for n in names)
    # Exactly the 2 active iterations were recorded: one G_bwd range each.
    assert sum(1 for e in trace["traceEvents"] if e.get("name") == "G_bwd" and e.get("ph") == "X") == 2
    table = (out / "kernels.txt").read_text()
    assert "Self CPU" in table and "aten::" in table and "sorted by self_cpu_time_total" in table
    with open(out / "kernels.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and float(rows[0]["self_cpu_ms"]) >= float(rows[-1]["self_cpu_ms"])
    assert any(r["name"].startswith("aten::") and int(r["calls"]) > 0 for r in rows)
    assert not (out / "breakdown.csv").exists()  # timings inside a profiled window would be distorted
