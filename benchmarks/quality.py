"""`python -m benchmarks.quality`: FID against time for GAN presets trained side by side on the embedded digits.

    python -m benchmarks.quality                                  # ROWS, 4.5 min of wall clock each (a CPU's view)
    python -m benchmarks.quality --rows dcgan dcgan_wide --minutes 3 --eval-every 200
    python -m benchmarks.quality --kimg 400 --hardware auto       # a GPU's view: the same images for every row
    python -m benchmarks.quality --row mine="model.generator.ngf=48 model.discriminator.ndf=48"

Each row is `python train.py <overrides>` in a process of its own, as a user runs it, with its evaluation every
`--eval-every` iterations (the same offline MNIST extractor FID as the main job). On a CPU the rows get the same wall
clock (`train.time_budget_minutes`: what a laptop user waits for, evaluations included); on a GPU, where a row of
this size takes seconds, the same number of images (`--kimg`). The rows run one after another, so a busy machine
slows each; the table states the load average beside the numbers.

Writes <out>/quality.json (every evaluation of every row: iteration, kimg, seconds, FID) and quality.md (FID at a
quarter, half and three quarters of the budget, at its end and the best, iterations reached, seconds per iteration
with set-up and evaluations included); default out outputs/quality/<timestamp>.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.arguments import (
    CommandLineError,
    Parser,
    amount,
    check_hardware_here,
    check_output_folder,
    conf_names,
    count,
    one_of,
    refusals_exit_2,
)
from pixelsmith.config.paths import REPO_ROOT

# Named rows: the overrides of `python train.py` each trains with. "dcgan" is the README's first command as it is.
ROWS: dict[str, list[str]] = {
    "dcgan": [],
    "stylegan2_small": ["experiment=mnist_stylegan2"],
    # The demo's CPU-sized widths with NVlabs' switches on (conf/model/stylegan2.yaml's): FIR resampling in G and D,
    # style mixing 0.9, path length weight 2 w.r.t. the per-layer ws.
    "stylegan2_faithful": [
        "experiment=mnist_stylegan2",
        "model.generator.upsampling=fir",
        "model.discriminator.downsampling=fir",
        "model.generator.style_mixing_prob=0.9",
        "model.objective.regularizers.path_length.weight=2.0",
    ],
    # R3GAN's networks and loss at CPU widths (conf/experiment/mnist_r3gan.yaml; README "R3GAN").
    "r3gan": ["experiment=mnist_r3gan"],
}
FRACTIONS = (
    0.25,
    0.5,
    0.75,
)  # of the budget (seconds or kimg) at which the table reads each curve, then the end


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="python -m benchmarks.quality", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", nargs="*", default=list(ROWS), help=f"named rows ({', '.join(ROWS)}); none: only --row ones"
    )
    parser.add_argument(
        "--row",
        action="append",
        default=[],
        metavar='NAME="OVERRIDE ..."',
        help="an extra row: a name and its train.py overrides, space-separated (repeatable)",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--minutes", type=amount("minutes"), default=None, help="wall clock per row (default 4.5 on CPU)"
    )
    budget.add_argument("--kimg", type=amount("kimg"), default=None, help="thousands of images per row (GPU)")
    parser.add_argument("--eval-every", type=count, default=250, help="iterations between evaluations")
    parser.add_argument(
        "--hardware",
        type=one_of(conf_names("hardware"), "hardware profile of conf/hardware"),
        default="auto",
        help="hardware profile of every row (default: detected)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output dir (default outputs/quality/<timestamp>)"
    )
    parser.add_argument(
        "--timeout-factor",
        type=amount("x the budget", 1.0),
        default=3.0,
        help="a row is killed after this x its budget",
    )
    args = parser.parse_args(argv)
    for spec in args.row:
        name, _, overrides = spec.partition("=")
        if not name or not overrides.split():
            parser.error(f'--row {spec!r}: write NAME="OVERRIDE OVERRIDE ..."')
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; named rows are {list(ROWS)} (or add one with --row)")
    if not args.rows and not args.row:
        parser.error(f"no row to run: --rows names none and no --row is given; named rows are {list(ROWS)}")
    if args.minutes is None and args.kimg is None:
        args.minutes = 4.5
    return args


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any row runs, an --out that cannot be written or already holds a row's run dir (train.py
    would resume that finished run instead of training the row again), and a --hardware this machine lacks."""
    if args.out is not None:
        out = check_output_folder(args.out, "--out")
        taken = [name for name in rows_of(args) if (out / name).exists()]
        if taken:
            raise CommandLineError(
                f"--out {args.out} already holds the run dir of row(s) {', '.join(taken)}: train.py would resume "
                "those runs, not train them again. Nothing was run. Fix: give --out a new folder."
            )
    check_hardware_here(args.hardware)


def rows_of(args: argparse.Namespace) -> dict[str, list[str]]:
    rows = {name: list(ROWS[name]) for name in args.rows}
    for spec in args.row:
        name, _, overrides = spec.partition("=")
        rows[name] = overrides.split()
    return rows


def row_command(overrides: list[str], args: argparse.Namespace, run_dir: Path) -> list[str]:
    """`python train.py ...` for one row: its overrides, then what makes the rows comparable (budget, evaluation
    cadence, no intermediate samples, one fixed run dir)."""
    if args.kimg is not None:
        from benchmarks.harness import compose
        from pixelsmith.run.build import resolve_hardware

        cfg = compose([f"hardware={args.hardware}", *overrides], run_dir)
        batch = int(cfg.data.batch_size or resolve_hardware(cfg).batch_size) * int(cfg.accumulate)
        budget = ["train.time_budget_minutes=null", f"max_steps={math.ceil(args.kimg * 1000 / batch)}"]
    else:
        budget = [f"train.time_budget_minutes={args.minutes}", "max_steps=10000000"]
    return [
        sys.executable,
        "train.py",
        f"hardware={args.hardware}",
        *overrides,
        *budget,
        f"eval.every_n_steps={args.eval_every}",
        "train.progress_bar=false",
        "train.sample_every_n_steps=0",
        f"hydra.run.dir={run_dir}",
    ]


def read_curve(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "eval_history.json"
    if not path.is_file():
        return []
    history = json.loads(path.read_text()).get("history", [])
    return [
        {key: float(entry[key]) for key in ("iteration", "kimg", "seconds", "fid") if key in entry}
        for entry in history
    ]


def value_at(curve: list[dict[str, float]], axis: str, position: float) -> float | None:
    """The FID of the last evaluation at or before `position` on `axis` (seconds or kimg): what a user stopping
    there would have had."""
    seen = [point["fid"] for point in curve if point.get(axis, math.inf) <= position + 1e-9]
    return seen[-1] if seen else None


def run_rows(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out or Path("outputs") / "quality" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    limit = (args.minutes * 60 if args.minutes is not None else 1800) * args.timeout_factor + 120
    results: dict[str, Any] = {}
    for name, overrides in rows_of(args).items():
        run_dir = (out / name).resolve()
        command = row_command(overrides, args, run_dir)
        print(f"quality: {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=limit)
            error = None if done.returncode == 0 else (done.stdout + done.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            error = f"killed after {limit:.0f} s"
        final = run_dir / "final_metrics.json"
        metrics = json.loads(final.read_text()) if final.is_file() else {}
        curve = read_curve(run_dir)
        results[name] = {
            "overrides": overrides,
            "curve": curve,
            "iterations": metrics.get("iteration"),
            "stop_reason": metrics.get("stop_reason"),
            "wall_seconds": time.monotonic() - started,
            "error": error,
        }
        print(f"quality: {name}: {_summary_line(results[name])}", flush=True)
    report = {
        "created": datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "budget": {"minutes": args.minutes, "kimg": args.kimg, "eval_every": args.eval_every},
        "hardware": args.hardware,
        "rows": results,
    }
    (out / "quality.json").write_text(json.dumps(report, indent=2))
    (out / "quality.md").write_text(quality_markdown(report))
    print((out / "quality.md").read_text(), flush=True)
    return report


def _summary_line(row: dict[str, Any]) -> str:
    if row["error"]:
        return "failed: " + row["error"].strip().splitlines()[-1]
    fids = [p["fid"] for p in row["curve"]]
    return (
        f"{row['iterations']:.0f} iterations, final FID {fids[-1]:.1f}, best {min(fids):.1f}"
        if fids
        else "no FID"
    )


def quality_markdown(report: dict[str, Any]) -> str:
    budget = report["budget"]
    by_time = budget["kimg"] is None
    axis, total = ("seconds", budget["minutes"] * 60) if by_time else ("kimg", budget["kimg"])
    unit = (lambda v: f"{v / 60:.3g} min") if by_time else (lambda v: f"{v:.3g} kimg")
    lines = [
        "# FID against " + ("time" if by_time else "images seen"),
        "",
        f"{report['created']}, hardware={report['hardware']}, {report['machine']['cpu_count']} logical CPUs, load "
        f"average {report['machine']['load_average']}; every row {unit(total)}"
        + (" of wall clock (evaluations included)" if by_time else "")
        + f", evaluated every {budget['eval_every']} iterations (offline MNIST extractor FID, lower is better).",
        "",
        "| row | "
        + " | ".join(f"FID at {unit(f * total)}" for f in FRACTIONS)
        + " | final FID | best FID | iterations | s / iteration (all in) | overrides |",
        "|---|" + "---:|" * (len(FRACTIONS) + 4) + "---|",
    ]
    for name, row in report["rows"].items():
        curve = row["curve"]
        at = [value_at(curve, axis, f * total) for f in FRACTIONS]
        fids = [p["fid"] for p in curve]
        iterations = row.get("iterations")
        last_seconds = curve[-1].get("seconds") if curve else None
        per_iteration = last_seconds / iterations if iterations and last_seconds else None
        cells = [
            name,
            *("n/a" if v is None else f"{v:.1f}" for v in at),
            f"{fids[-1]:.1f}" if fids else "n/a",
            f"{min(fids):.1f}" if fids else "n/a",
            f"{iterations:.0f}" if iterations else "n/a",
            f"{per_iteration:.3f}" if per_iteration else "n/a",
            "`" + " ".join(row["overrides"]) + "`" if row["overrides"] else "(defaults)",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    failed = {name: row["error"] for name, row in report["rows"].items() if row.get("error")}
    if failed:
        lines += ["", "Failed rows:", *(f"- {n}: {e.strip().splitlines()[-1]}" for n, e in failed.items())]
    return "\n".join(lines) + "\n"


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_outputs(args)
    report = run_rows(args)
    return 1 if any(row["error"] for row in report["rows"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
