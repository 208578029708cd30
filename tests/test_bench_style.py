"""The style-training bench runs both kinds (template, plain loop) in fresh interpreters and prints their ratio."""

from __future__ import annotations

import re

import pytest

from benchmarks import style_bench

pytestmark = pytest.mark.bench


@pytest.mark.slow
def test_the_style_bench_prints_template_and_plain_side_by_side(capsys):
    tiny = ["--resolution", "32", "--base-channels", "4", "--residual-blocks", "1", "--batch-size", "2"]
    assert (
        style_bench.main([*tiny, "--steps", "2", "--warmup", "1", "--repeats", "1", "--hardware", "cpu"]) == 0
    )
    out = capsys.readouterr()
    assert "template:" in out.err and "plain:" in out.err  # both kinds ran
    row = re.search(r"\| 32-true \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", out.out)
    assert row is not None, out.out
    template, plain, ratio = (float(x) for x in row.groups())
    assert template > 0 and plain > 0 and ratio == pytest.approx(template / plain, abs=2e-3)
