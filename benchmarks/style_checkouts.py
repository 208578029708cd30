"""Style training's iteration time in two checkouts side by side (e.g. before and after a change), on this machine.

    python -m benchmarks.style_checkouts --before /path/to/main --after . --resolution 96 --base-channels 16 \
        --residual-blocks 3 --threads 1 --steps 20 --repeats 3

Each checkout's own `benchmarks.style_bench --child` runs the template (`experiment=style_fast`, eager unless a kind
says otherwise) in a fresh interpreter with that checkout's `src/` first on PYTHONPATH, the checkouts alternating
within a repeat so a busy machine slows both alike. Prints img/s and the median iteration per checkout and kind
(medians over repeats) and after / before. `--after-kinds template template_graphed` adds the after checkout's
graphed iteration (uncaptured without CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_child(checkout: Path, spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "src")])}
    command = [sys.executable, "-m", "benchmarks.style_bench", "--child", json.dumps(spec)]
    proc = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout} {spec['kind']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path("."))
    parser.add_argument("--after-kinds", nargs="+", default=["template"])
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--base-channels", type=int, default=32)
    parser.add_argument("--residual-blocks", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    units = [("before", args.before.resolve(), "template")]
    units += [("after", args.after.resolve(), kind) for kind in args.after_kinds]
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="pixelsmith-style-checkouts-") as tmp:
        for repeat in range(args.repeats):
            for name, checkout, kind in units if repeat % 2 == 0 else units[::-1]:
                spec = {
                    "kind": kind,
                    "precision": args.precision,
                    "hardware": args.hardware,
                    "batch_size": args.batch_size,
                    "resolution": args.resolution,
                    "base_channels": args.base_channels,
                    "residual_blocks": args.residual_blocks,
                    "warmup": args.warmup,
                    "steps": args.steps,
                    "threads": args.threads,
                    "output_dir": str(Path(tmp) / f"{name}_{kind}_{repeat}"),
                }
                result = run_child(checkout, spec)
                results.setdefault((name, kind), []).append(result)
                print(
                    f"repeat {repeat} {name} {kind}: {result['median_iteration_ms']:.1f} ms", file=sys.stderr
                )
    print(
        f"Style training (template), TransformerNet {args.base_channels}/{args.residual_blocks}, {args.resolution} "
        f"px, batch {args.batch_size}, {args.precision}, hardware={args.hardware}, threads={args.threads}, "
        f"{args.repeats} repeats x {args.steps} iterations (after {args.warmup}), medians over repeats\n"
    )
    print("| checkout | kind | img/s | median iteration ms | per-repeat median iteration ms |")
    print("|---|---|---:|---:|---|")
    medians = {}
    for (name, kind), runs in results.items():
        ms = statistics.median(r["median_iteration_ms"] for r in runs)
        medians[name, kind] = ms
        each = ", ".join(f"{r['median_iteration_ms']:.1f}" for r in runs)
        rate = statistics.median(r["img_per_s"] for r in runs)
        print(f"| {name} | {kind} | {rate:.2f} | {ms:.1f} | {each} |")
    for kind in args.after_kinds:
        ratio = medians["after", kind] / medians["before", "template"]
        print(f"\nafter {kind} / before template, median iteration: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
