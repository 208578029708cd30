"""The overhead attribution tool runs every variant and the plain loop, and its variants really remove what they
say (no self.log means no logged metrics)."""

from __future__ import annotations

from pixelsmith.perf import overhead


def test_overhead_tool_measures_every_variant(tmp_path):
    times = overhead.measure(iterations=8, repeats=1, workdir=tmp_path)
    assert set(times) == {*overhead.VARIANTS, "plain"}
    assert all(len(v) == 8 - 2 - 1 and all(t > 0 for t in v) for v in times.values())
    table = overhead.report(times)
    assert "Fixed template cost" in table and "without self.log" in table
    # The no_log variant logged nothing through Lightning: its CSV has no loss column.
    assert (tmp_path / "0-template" / "metrics.csv").read_text().count("loss/D") == 1
    assert (
        not (tmp_path / "0-no_log" / "metrics.csv").exists()
        or "loss/D" not in (tmp_path / "0-no_log" / "metrics.csv").read_text()
    )
