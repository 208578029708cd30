"""benchmarks/loader_bench.py runs end to end on a tiny set and prints one row per (source, decoder) with a rate."""

from __future__ import annotations

import re

import pytest

from benchmarks.loader_bench import main


def test_the_loader_benchmark_prints_a_rate_per_source_and_decoder(capsys):
    pytest.importorskip("pixelsmith.gan")  # the training-step column builds the default GAN
    assert main(["--sizes", "32", "--images", "8", "--repeats", "1", "--hardware", "cpu"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 32 |")]
    sources = {row.split("|")[2].strip() for row in table}
    assert {"folder", "zip"} <= sources
    for row in table:
        decoded, step = (cell.strip() for cell in row.split("|")[4:6])
        assert float(decoded) > 0 and re.match(r"\d+ \(dcgan\)", step), row
