"""benchmarks/sg2_reference.py at tiny widths: every phase timed and counted for each of our columns, the FLOPs the
README quotes in the right order, and a wrong NVlabs checkout refused with what to give instead."""

from __future__ import annotations

import re

import pytest

from benchmarks.sg2_reference import main

pytestmark = pytest.mark.bench

TINY = [
    "--resolution", "16", "--batch-size", "4", "--z-dim", "16", "--mapping-layers", "1",
    "--channel-base", "64", "--channel-max", "16", "--repeats", "2", "--warmup", "0", "--threads", "1",
]  # fmt: skip


def test_the_table_has_every_phase_for_every_column_and_fir_cuts_gmain_flops(capsys):
    assert main([*TINY, "--channels-last"]) == 0
    out = capsys.readouterr().out
    columns = ("ours (fir)", "ours (fir, channels_last)", "ours (bilinear/avg_pool)")
    assert all(column in out for column in columns)
    timing, flops = out.split("GFLOPs per phase step")
    for phase in ("Gmain", "Dmain", "R1"):
        (rates_line,) = [line for line in timing.splitlines() if line.startswith(phase)]
        rates = [float(v) for v in re.findall(r"([\d.]+) \(", rates_line)]
        assert len(rates) == 3 and all(rate > 0 for rate in rates)
    gflops = {
        line.split()[0]: [float(v) for v in line.split()[1:]]
        for line in flops.splitlines()
        if line.split() and line.split()[0] in ("Gmain", "Dmain", "R1")
    }
    fir, fir_channels_last, bilinear = gflops["Gmain"]
    assert fir == fir_channels_last  # the memory format changes no arithmetic
    assert fir < bilinear  # the transposed-conv up path: no 3x3 conv at the upsampled size


def test_a_folder_that_is_not_nvlabs_checkout_is_refused_with_what_to_give(tmp_path, capsys):
    assert main([*TINY, "--nvlabs-path", str(tmp_path)]) == 2
    said = capsys.readouterr()
    assert re.search(r"training/networks.py.*NVlabs/stylegan2-ada-pytorch", said.err) and said.out == ""
