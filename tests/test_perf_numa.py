"""The NUMA wrapper: cpulist parsing, the numactl command, and a real CPU-affinity binding when numactl is absent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from pixelsmith.perf.numa import binding_command, numa_nodes, parse_cpulist
from tests.conftest import run_cli


def test_cpulist_parsing_and_topology(tmp_path):
    assert parse_cpulist("0-3,8-11\n") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parse_cpulist("5") == [5]
    for node, cpus in (("node0", "0-1"), ("node1", "2-3")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus)
    assert numa_nodes(tmp_path) == {0: [0, 1], 1: [2, 3]}


def test_command_uses_numactl_when_present(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/numactl")
    argv, cpus = binding_command(1, ["python", "train.py"], {0: [0, 1], 1: [2, 3]})
    assert argv == ["numactl", "--cpunodebind=1", "--membind=1", "python", "train.py"] and cpus is None
    monkeypatch.setattr(shutil, "which", lambda name: None)
    argv, cpus = binding_command(1, ["python", "train.py"], {0: [0, 1], 1: [2, 3]})
    assert argv == ["python", "train.py"] and cpus == [2, 3]
    with pytest.raises(SystemExit, match="does not exist"):
        binding_command(7, ["python"], {0: [0, 1]})


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity")
    or shutil.which("taskset") is None
    or shutil.which("numactl") is not None,
    reason="needs Linux, taskset, >= 2 CPUs on node 0 and no numactl (the affinity fallback is what runs here)",
)
def test_wrapper_really_binds_the_child():
    node0 = numa_nodes()[0]
    if len(node0) < 2:
        pytest.skip("node 0 has a single CPU")
    # Start pinned to one CPU; the wrapper must widen the child to node 0's CPUs.
    result = subprocess.run(
        ["taskset", "-c", str(node0[0]), sys.executable, "-m", "pixelsmith.perf.numa", "--node", "0", "--",
         sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(sorted(node0))
    dry = run_cli(
        ["-m", "pixelsmith.perf.numa", "--node", "0", "--dry-run", "--", "python", "train.py"], timeout=60
    )
    assert dry.returncode == 0 and "node 0 via" in dry.stdout and "python train.py" in dry.stdout
