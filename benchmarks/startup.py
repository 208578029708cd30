"""How long each preset takes from the command to its first iteration, and where that time goes.

    python -m benchmarks.startup                          # the CPU proxy: StyleGAN2 at paper256 width, R3GAN (inductor)
    python -m benchmarks.startup --device cuda            # every preset on the GPU, cold then warm compile cache
    python -m benchmarks.startup --rows stylegan2_paper256 --cache cold

Each row runs `train.py experiment=<preset>` in a fresh process on the embedded digits (upsampled to the preset's
resolution, 3 channels), with evaluation and sample grids off, for enough iterations that every iteration plan has
been seen and captured (lazy R1 every 16 iterations: its graph is made at iteration 32). The run's own start-up report
(`startup/*` in final_metrics.json, `pixelsmith.core.startup`) gives: the first iteration's end and the last compile
or capture, in seconds since the launch; torch.compile's seconds per network with its graphs and recompiles; Dynamo's
graph breaks; CUDA-graph captures. `--cache cold` gives each row an empty compile cache, `warm` the cache a cold row
just filled, `both` (default) runs each row twice.

On a CPU the networks keep the preset's widths but train at a small batch and resolution (inductor's C++ compile of
the same graphs: the compile counts are what matter there, and the test `test_startup_counts` asserts them).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.child import CHECKOUT, child_env

NO_BUDGET = "train.time_budget_minutes=null"
QUIET = (
    "eval.every_n_steps=0",
    "train.sample_every_n_steps=100000",
    "train.checkpoint_every_n_steps=100000",
    "train.progress_bar=false",
    "logger=csv",
)


@dataclass(frozen=True)
class StartupRow:
    label: str
    overrides: tuple[str, ...]
    max_steps: int = 40  # past iteration 32, where the lazy-R1 plan is captured


def digits_at(resolution: int, batch: int | None = None) -> tuple[str, ...]:
    """The embedded digits in place of the preset's image folder, at its resolution and 3 channels."""
    sized = (f"data.batch_size={batch}",) if batch else ()
    return ("data=mnist", f"data.resolution={resolution}", "data.channels=3", "data.limit=2048", *sized)


# In priority order (a time limit cuts from the end). The presets' own batch sizes: what the user's command runs.
GPU_ROWS = (
    StartupRow("stylegan2_paper256", ("experiment=stylegan2_paper256", *digits_at(256))),
    StartupRow("r3gan_ffhq64", ("experiment=r3gan_ffhq64", *digits_at(64))),
    StartupRow("main job", (), 40),
    StartupRow("mnist_wgan_gp", ("experiment=mnist_wgan_gp",), 20),
    StartupRow("stylegan2_cifar", ("experiment=stylegan2_cifar", *digits_at(32))),
    StartupRow("stylegan2_auto (256 px)", ("experiment=stylegan2_auto", *digits_at(256))),
    StartupRow("r3gan_cifar10", ("experiment=r3gan_cifar10", *digits_at(32))),
)
# The CPU proxy: the presets' networks at full width, a small batch and resolution, fp32, compiled by inductor.
CPU_SMALL = ("hardware=cpu", "hardware.compile=true", "precision=32-true")
CPU_ROWS = (
    StartupRow(
        "stylegan2_paper256 widths, 64 px b4",
        (
            "experiment=stylegan2_paper256",
            *digits_at(64, 4),
            "model.discriminator.mbstd_group_size=4",
            *CPU_SMALL,
        ),
        34,
    ),
    StartupRow("r3gan_ffhq64 widths, b8", ("experiment=r3gan_ffhq64", *digits_at(64, 8), *CPU_SMALL), 4),
)


# The CPU dry run of `gpu_check --stage startup`: the tool's logic end to end, at sizes that take seconds.
CPU_DRY_ROWS = (
    StartupRow(
        "stylegan2 tiny",
        (
            "model=stylegan2",
            "model.generator.channel_base=256",
            "model.generator.channel_max=16",
            "model.generator.z_dim=16",
            "model.generator.w_dim=16",
            "model.generator.mapping_layers=1",
            "model.discriminator.channel_base=256",
            "model.discriminator.channel_max=16",
            "data.limit=64",
            "data.batch_size=8",
            "hardware=cpu",
            "hardware.compile=true",
            "precision=32-true",
        ),
        2,
    ),
)


def row_command(row: StartupRow, run_dir: Path, cache_dir: Path) -> list[str]:
    return [
        sys.executable,
        "train.py",
        *row.overrides,
        NO_BUDGET,
        *QUIET,
        f"max_steps={row.max_steps}",
        f"hardware.compile_cache_dir={cache_dir}",
        f"hydra.run.dir={run_dir}",
    ]


def run_row(
    row: StartupRow, run_dir: Path, cache_dir: Path, timeout: float, log_path: Path
) -> dict[str, Any]:
    """One start-up measurement in a fresh process: the run's `startup/*` metrics, its img/s and the wall time."""
    command = row_command(row, run_dir, cache_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        try:
            process = subprocess.run(
                command, cwd=CHECKOUT, stdout=log, stderr=subprocess.STDOUT, env=child_env(), timeout=timeout
            )
            returncode: int | None = process.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    result: dict[str, Any] = {
        "label": row.label,
        "command": "python " + shlex.join(command[1:]),
        "returncode": returncode,
        "wall_s": time.monotonic() - started,
        "log": str(log_path),
    }
    final = run_dir / "final_metrics.json"
    if final.is_file():
        metrics = json.loads(final.read_text())
        result["metrics"] = {k: v for k, v in metrics.items() if k.startswith("startup/") or k == "img/s"}
    else:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        result["problem"] = (
            f"timed out after {timeout:.0f} s"
            if returncode is None
            else (lines[-1][:300] if lines else "no output")
        )
    return result


def describe(result: dict[str, Any]) -> dict[str, str]:
    """One table row's cells."""
    m = result.get("metrics")
    if not m:
        return {"first iteration": "-", "detail": result.get("problem", "no result")}
    per_network = ", ".join(
        f"{key.rsplit('/', 1)[1]} {value:.1f} s"
        for key, value in sorted(m.items())
        if key.startswith("startup/compile_s/")
    )
    return {
        "first iteration": f"{m.get('startup/first_iteration_s', float('nan')):.1f} s",
        "last compile/capture": f"{m.get('startup/last_compile_or_capture_s', float('nan')):.1f} s",
        "compile": f"{m.get('startup/compile_s', 0):.1f} s ({per_network or 'none'}); first runs outside compile "
        f"(first kernels, cuDNN autotuning) {m.get('startup/first_runs_not_compile_s', 0):.1f} s",
        "graphs / recompiles / breaks": f"{m.get('startup/graphs', 0):.0f} / {m.get('startup/recompiles', 0):.0f} / "
        f"{m.get('startup/graph_breaks', 0):.0f}",
        "captures": f"{m.get('startup/captures', 0):.0f} in {m.get('startup/capture_s', 0):.1f} s",
        "img/s (last logged)": f"{m['img/s']:,.0f}" if "img/s" in m else "-",
    }


def measure(rows, caches: tuple[str, ...], work: Path, timeout: float, deadline: float | None = None):
    """Yield (row, cache, result) for each row and cache state, cold first (an empty cache of the row's own)."""
    for index, row in enumerate(rows):
        cache_dir = work / f"cache_{index}"
        for state in caches:
            if state == "cold":
                shutil.rmtree(cache_dir, ignore_errors=True)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left < 10:
                yield row, state, {"label": row.label, "problem": "skipped: no time left"}
                continue
            slug = f"{index}_{state}"
            result = run_row(
                row,
                work / f"run_{slug}",
                cache_dir,
                min(timeout, left) if left else timeout,
                work / f"{slug}.log",
            )
            yield row, state, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rows", nargs="*", default=None, help="row labels (prefixes) to run")
    parser.add_argument("--cache", choices=("cold", "warm", "both"), default="both")
    parser.add_argument("--work", default="outputs/startup")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument(
        "--time-limit", type=float, default=None, help="seconds for all rows (later rows skip)"
    )
    args = parser.parse_args(argv)
    rows = GPU_ROWS if args.device == "cuda" else CPU_ROWS
    if args.rows:
        rows = tuple(r for r in rows if any(r.label.startswith(prefix) for prefix in args.rows))
    caches = ("cold", "warm") if args.cache == "both" else (args.cache,)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results = []
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    for row, state, result in measure(rows, caches, work, args.timeout, deadline):
        cells = describe(result)
        results.append({"cache": state, **result, "cells": cells})
        print(
            f"| {row.label} | {state} | " + " | ".join(f"{k}: {v}" for k, v in cells.items()) + " |",
            flush=True,
        )
    (work / "startup.json").write_text(json.dumps(results, indent=2))
    return 0 if all("metrics" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
