"""Run a command bound to one NUMA node (its CPUs and its memory):

    python -m pixelsmith.perf.numa --node 0 -- python train.py hardware=a100
    python -m pixelsmith.perf.numa --node auto -- python train.py ...      # the node of GPU $LOCAL_RANK (else 0)
    python -m pixelsmith.perf.numa --node 1 --dry-run -- python train.py   # print the command only

Why: on a two-socket server a process whose threads run on socket 0 while its memory (pinned host buffers, the
decoded dataset, loader workers' batches) sits on socket 1 pays the inter-socket link on every access; the GPU's
own PCIe root also hangs off one socket. Binding each training process to the node of its GPU keeps data-loader
workers, pinned-memory copies and the host side of the step local.

With `numactl` installed (apt-get install numactl) this execs `numactl --cpunodebind=N --membind=N <command>`.
Without it, it sets the CPU affinity to the node's CPUs and execs the command: memory then follows first touch,
which lands on the same node for memory the process itself allocates (a warning says so).

Multi-GPU: Lightning's own launcher spawns the other ranks from rank 0, and they would inherit rank 0's binding.
Launch the ranks with torchrun instead (Lightning then does not spawn) and wrap each one:
    torchrun --nproc-per-node 8 -m pixelsmith.perf.numa --node auto -- python train.py hardware.devices=8 strategy=ddp
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

log = logging.getLogger(__name__)

NODE_DIR = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8-11' -> [0, 1, 2, 3, 8, 9, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def numa_nodes(node_dir: Path = NODE_DIR) -> dict[int, list[int]]:
    """NUMA node -> its CPUs; one node with every CPU when the system exposes no NUMA topology."""
    nodes = {}
    for path in sorted(node_dir.glob("node[0-9]*")):
        cpulist = path / "cpulist"
        if cpulist.is_file():
            nodes[int(path.name[4:])] = parse_cpulist(cpulist.read_text())
    return nodes or {0: sorted(os.sched_getaffinity(0))}


def gpu_numa_node(index: int) -> int | None:
    """The NUMA node of CUDA device `index` (from its PCI address in sysfs), or None if unknown."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(index)
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        node = int(Path(f"/sys/bus/pci/devices/{address}/numa_node").read_text())
        return node if node >= 0 else None
    except (AttributeError, OSError, ValueError):
        return None


def resolve_node(requested: str) -> int:
    if requested != "auto":
        return int(requested)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    node = gpu_numa_node(local_rank)
    return node if node is not None else 0


def binding_command(
    node: int, command: list[str], nodes: dict[int, list[int]]
) -> tuple[list[str], list[int] | None]:
    """(argv to exec, CPUs to set as affinity before exec when numactl is missing)."""
    if node not in nodes:
        raise SystemExit(f"NUMA node {node} does not exist here; nodes: {sorted(nodes)}.")
    if shutil.which("numactl"):
        return ["numactl", f"--cpunodebind={node}", f"--membind={node}", *command], None
    return list(command), nodes[node]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m pixelsmith.perf.numa [--node N|auto] [--dry-run] -- <command ...>")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m pixelsmith.perf.numa", description=__doc__)
    parser.add_argument(
        "--node", default="auto", help="NUMA node number, or auto (the node of GPU $LOCAL_RANK)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        raise SystemExit("nothing to run after --")
    nodes = numa_nodes()
    node = resolve_node(args.node)
    exec_argv, cpus = binding_command(node, command, nodes)
    how = (
        "numactl"
        if cpus is None
        else f"sched_setaffinity({cpus}) (numactl not installed: memory follows first touch)"
    )
    if args.dry_run:
        print(f"node {node} via {how}: {' '.join(exec_argv)}")
        return 0
    if cpus is not None:
        log.warning("numactl not found; binding CPUs only. apt-get install numactl for --membind.")
        os.sched_setaffinity(0, cpus)
    sys.stdout.flush()
    os.execvp(exec_argv[0], exec_argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
