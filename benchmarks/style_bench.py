"""Style-training speed: the template against a plain PyTorch loop of the same style step, side by side.

    python -m benchmarks.style_bench                          # paper size: 256 px, batch 4, TransformerNet 32/5
    python -m benchmarks.style_bench --precisions 32-true bf16-mixed --repeats 5 --steps 30

Each measurement runs in a fresh interpreter, alternating template and plain within a repeat so that a busy machine
slows both alike. "template" is `train.py experiment=style_fast` at the chosen size (the real Trainer, callbacks,
core and data loading; sample grids and checkpoints off). "plain" is what a user would write by hand around the very
same networks and loss (`FastStyleModule.stylizer` and `.criterion`, built from the same config): Adam, autocast,
channels_last, the same data loader, and nothing else; it is the fast_neural_style training loop. The ratio of the
two medians is the template's overhead. Reported: img/s (median over repeats of the images per second after
`--warmup` iterations), the overhead, and the per-iteration median. A GPU run adds the CUDA device to the report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.child import child_env
from benchmarks.harness import CLOCK_TARGET, IterationClock, compose, require_every_iteration


def overrides_for(spec: dict[str, Any]) -> list[str]:
    return [
        "experiment=style_fast",
        f"hardware={spec['hardware']}",
        f"precision={spec['precision']}",
        f"max_steps={spec['warmup'] + spec['steps']}",
        f"data.batch_size={spec['batch_size']}",
        f"data.resolution={spec['resolution']}",
        "data.resize_shorter=null",
        f"model.stylizer.base_channels={spec['base_channels']}",
        f"model.stylizer.num_residual_blocks={spec['residual_blocks']}",
        "train.progress_bar=false",
        "train.sample_every_n_steps=0",
        "train.checkpoint_every_n_steps=0",
        "train.log_every_n_steps=1000",
        "callbacks.style_validation=null",
        "model.loss_net.pretrained=false",  # random VGG weights cost exactly what ImageNet ones do
        "logger=none",
        *(["hardware.num_threads=" + str(spec["threads"])] if spec.get("threads") else []),
    ]


def _run_template(cfg) -> list[float]:
    from omegaconf import open_dict

    from pixelsmith.train import run

    with open_dict(cfg):  # the GAN bench's clock: the same readings for both benches and both kinds
        cfg.callbacks.bench_clock = {"_target_": CLOCK_TARGET}
    require_every_iteration(run(cfg), int(cfg.max_steps))
    return list(IterationClock.ends)


def _run_plain(cfg, iterations: int) -> list[float]:
    """The style step by hand: the module's stylizer and loss, Adam, autocast, channels_last, the same loader."""
    import lightning as L
    import torch

    from pixelsmith.builders import build_core_settings, build_datamodule, build_model, build_plan
    from pixelsmith.hardware import apply_plan

    plan = build_plan(cfg)
    apply_plan(plan)
    L.seed_everything(cfg.seed, verbose=False)
    module = build_model(cfg, build_core_settings(cfg, plan))
    device = torch.device("cuda" if plan.accelerator == "cuda" else "cpu")
    memory_format = torch.channels_last if plan.channels_last else torch.contiguous_format
    stylizer = module.stylizer.to(device, memory_format=memory_format).train()
    criterion = module.criterion.to(device)
    criterion.loss_net.to(memory_format=memory_format)
    optimizer = torch.optim.Adam(stylizer.parameters(), lr=float(cfg.model.optimizer.lr))
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(plan.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    datamodule = build_datamodule(cfg, plan)
    datamodule.prepare_data()
    datamodule.setup("fit")
    ends: list[float] = []
    while len(ends) < iterations:
        for images, _skipped in datamodule.train_dataloader():
            content = images.to(device, non_blocking=True).float().div_(255.0)
            content = content.contiguous(memory_format=memory_format)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                output = stylizer(content)
                loss = criterion(output, content).total
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            ends.append(time.perf_counter())  # no sync, as the template's clock (and the GAN bench) reads it
            if len(ends) == iterations:
                break
    return ends


def child_config(spec: dict[str, Any]):
    """The composed config of one run (either kind): the real config tree, outputs in the spec's dir, no time
    budget (`harness.compose`)."""
    return compose(overrides_for(spec), Path(spec["output_dir"]))


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    cfg = child_config(spec)
    iterations = spec["warmup"] + spec["steps"]
    ends = _run_template(cfg) if spec["kind"] == "template" else _run_plain(cfg, iterations)
    timed = ends[spec["warmup"] - 1 : iterations]
    seconds = [b - a for a, b in zip(timed, timed[1:], strict=False)]
    return {
        "kind": spec["kind"],
        "precision": spec["precision"],
        "img_per_s": spec["batch_size"] * len(seconds) / sum(seconds),
        "median_iteration_ms": 1000 * statistics.median(seconds),
    }


def run_child(spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.style_bench", "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=child_env(),
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"style bench child failed ({spec['kind']} {spec['precision']}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="pixelsmith-style-bench-") as tmp:
        for repeat in range(args.repeats):
            for precision in args.precisions:
                for kind in ("template", "plain") if repeat % 2 == 0 else ("plain", "template"):
                    spec = {
                        "kind": kind,
                        "precision": precision,
                        "hardware": args.hardware,
                        "batch_size": args.batch_size,
                        "resolution": args.resolution,
                        "base_channels": args.base_channels,
                        "residual_blocks": args.residual_blocks,
                        "warmup": args.warmup,
                        "steps": args.steps,
                        "threads": args.threads,
                        "output_dir": str(Path(tmp) / f"{kind}_{precision}_{repeat}"),
                    }
                    result = run_child(spec)
                    results.setdefault(precision, {}).setdefault(kind, []).append(result)
                    print(
                        f"repeat {repeat} {precision} {kind}: {result['img_per_s']:.2f} img/s",
                        file=sys.stderr,
                    )
    return results


def report_markdown(results: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> str:
    lines = [
        f"Style training, TransformerNet {args.base_channels}/{args.residual_blocks}, {args.resolution} px, batch "
        f"{args.batch_size}, hardware={args.hardware}, {args.repeats} repeats x {args.steps} iterations "
        f"(after {args.warmup} warm-up), medians over repeats",
        "",
        "| precision | template img/s | plain loop img/s | template / plain | median iteration (template / plain) |",
        "|---|---:|---:|---:|---|",
    ]
    for precision, kinds in results.items():
        template = statistics.median(r["img_per_s"] for r in kinds["template"])
        plain = statistics.median(r["img_per_s"] for r in kinds["plain"])
        it_t = statistics.median(r["median_iteration_ms"] for r in kinds["template"])
        it_p = statistics.median(r["median_iteration_ms"] for r in kinds["plain"])
        lines.append(
            f"| {precision} | {template:.2f} | {plain:.2f} | {template / plain:.3f} | {it_t:.0f} / {it_p:.0f} ms |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default="auto")
    parser.add_argument("--precisions", nargs="+", default=["32-true"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument(
        "--base-channels", type=int, default=32, help="TransformerNet width (32 = the paper's)"
    )
    parser.add_argument("--residual-blocks", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        parser.error(
            "--warmup and --steps must be at least 1 (the first timed iteration starts after a warm one)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(child_main(json.loads(args.child))))
        return 0
    results = run_bench(args)
    print(report_markdown(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
