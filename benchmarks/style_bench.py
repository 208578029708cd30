"""Style-training speed: the template (eager and with its CUDA graphs), fast_neural_style's method and a plain loop
of the template's own step, side by side.

    python -m benchmarks.style_bench                          # paper size: 256 px, batch 4, TransformerNet 32/5
    python -m benchmarks.style_bench --precisions 32-true bf16-mixed --repeats 5 --steps 30

Each measurement runs in a fresh interpreter, the kinds' order alternating between repeats so that a busy machine
slows all alike. The kinds:
- "template": `train.py experiment=style_fast` at the chosen size with `hardware.cuda_graphs=false` (the real Trainer,
  callbacks, core and data loading; sample grids and checkpoints off);
- "template_graphed": the same with `hardware.cuda_graphs=true` (the iteration captured once and replayed; on a
  machine without CUDA the graphed code runs uncaptured, and the report says so);
- "peer": fast_neural_style's published training method written as a plain loop (`benchmarks/style_peer.py`: its
  own TransformerNet and VGG16 loss, fp32 as published, whatever `--precisions` says), the target's yardstick:
  the target is template_graphed / peer >= 1.5 at 256 px, batch 4, on the same GPU;
- "plain": what a user would write by hand around the template's very networks and loss (`FastStyleModule.stylizer`
  and `.criterion`, built from the same config): Adam, autocast, channels_last, the same loader; template / plain is
  the template's overhead.
All kinds read the same data loader. Reported: img/s (median over repeats of the images per second after `--warmup`
iterations), the ratios, and the per-iteration medians. A GPU run adds the CUDA device to the report.
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

from benchmarks.arguments import (
    Parser,
    at_least,
    check_hardware_here,
    conf_names,
    count,
    one_of,
    refusals_exit_2,
)
from benchmarks.child import child_env
from benchmarks.harness import CLOCK_TARGET, IterationClock, compose, require_every_iteration

KINDS = ("template", "template_graphed", "peer", "plain")
PEER_PRECISION = "32-true"  # fast_neural_style's published loop has no mixed precision


def overrides_for(spec: dict[str, Any]) -> list[str]:
    return [
        "experiment=style_fast",
        # Only template_graphed captures: the GPU profiles turn capture on, and "template" is the eager column.
        f"hardware.cuda_graphs={str(spec['kind'] == 'template_graphed').lower()}",
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


def _run_template(cfg) -> tuple[list[float], str]:
    """The template's run and what became of `hardware.cuda_graphs` in it (from the core's log lines)."""
    import logging

    from omegaconf import open_dict

    from pixelsmith.run.fit import run

    with open_dict(cfg):  # the GAN bench's clock: the same readings for both benches and both kinds
        cfg.callbacks.bench_clock = {"_target_": CLOCK_TARGET}
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("pixelsmith.core")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        require_every_iteration(run(cfg), int(cfg.max_steps))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return list(IterationClock.ends), _graphs_outcome(bool(cfg.hardware.cuda_graphs), said)


def _graphs_outcome(asked: bool, messages: list[str]) -> str:
    if not asked:
        return "eager"
    for message in messages:
        if "hardware.cuda_graphs=true, but" in message:
            return "blocked: " + message.split(": ", 1)[-1].split(". Set")[0]
        if "nothing is captured" in message:
            return "uncaptured (no CUDA device: the graphed code runs eagerly)"
        if "graph(s) captured" in message:
            return message.removeprefix("hardware.cuda_graphs: ")
    return "graphed"


def _run_plain(cfg, iterations: int) -> list[float]:
    """The style step by hand: the module's stylizer and loss, Adam, autocast, channels_last, the same loader."""
    import lightning as L
    import torch

    from pixelsmith.hardware.settings import apply_hardware
    from pixelsmith.run.build import build_core_settings, build_datamodule, build_model, resolve_hardware

    hardware = resolve_hardware(cfg)
    apply_hardware(hardware)
    L.seed_everything(cfg.seed, verbose=False)
    module = build_model(cfg, build_core_settings(cfg, hardware))
    device = torch.device("cuda" if hardware.accelerator == "cuda" else "cpu")
    memory_format = torch.channels_last if hardware.channels_last else torch.contiguous_format
    stylizer = module.stylizer.to(device, memory_format=memory_format).train()
    criterion = module.criterion.to(device)
    criterion.loss_net.to(memory_format=memory_format)
    optimizer = torch.optim.Adam(stylizer.parameters(), lr=float(cfg.model.optimizer.lr))
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(hardware.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    datamodule = build_datamodule(cfg, hardware)
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


def _run_peer(cfg, iterations: int) -> list[float]:
    """fast_neural_style's method (`benchmarks/style_peer.py`) on the template's loader and hardware settings."""
    import lightning as L
    import torch

    from benchmarks import style_peer
    from pixelsmith.hardware.settings import apply_hardware
    from pixelsmith.run.build import build_datamodule, resolve_hardware
    from pixelsmith.style.data import load_style_images
    from pixelsmith.style.module import resolve_style_paths

    hardware = resolve_hardware(cfg)
    apply_hardware(hardware)
    L.seed_everything(cfg.seed, verbose=False)
    device = torch.device("cuda" if hardware.accelerator == "cuda" else "cpu")
    style = load_style_images(resolve_style_paths(cfg.model.style_images)[:1], int(cfg.model.style_size))[0]
    datamodule = build_datamodule(cfg, hardware)
    datamodule.prepare_data()
    datamodule.setup("fit")

    class _Cycled:  # a fresh pass over the loader whenever the peer's loop asks for one (an epoch)
        def __iter__(self):
            return (images for images, _skipped in datamodule.train_dataloader())

    return style_peer.train(
        _Cycled(),
        style,
        iterations,
        device,
        int(cfg.model.stylizer.base_channels),
        int(cfg.model.stylizer.num_residual_blocks),
    )


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
    graphs = "eager"
    if spec["kind"] in ("template", "template_graphed"):
        ends, graphs = _run_template(cfg)
    elif spec["kind"] == "peer":
        ends = _run_peer(cfg, iterations)
    else:
        ends = _run_plain(cfg, iterations)
    timed = ends[spec["warmup"] - 1 : iterations]
    seconds = [b - a for a, b in zip(timed, timed[1:], strict=False)]
    return {
        "kind": spec["kind"],
        "precision": spec["precision"],
        "img_per_s": spec["batch_size"] * len(seconds) / sum(seconds),
        "median_iteration_ms": 1000 * statistics.median(seconds),
        "graphs": graphs,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
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
    """{"rows": {precision: {kind: [result per repeat]}}, "peer": [result per repeat]}: the peer runs once a repeat,
    in its published precision."""
    results: dict[str, Any] = {"rows": {}, "peer": []}
    units = [(precision, kind) for precision in args.precisions for kind in args.kinds if kind != "peer"]
    if "peer" in args.kinds:
        units.append((PEER_PRECISION, "peer"))
    with tempfile.TemporaryDirectory(prefix="pixelsmith-style-bench-") as tmp:
        for repeat in range(args.repeats):
            for precision, kind in units if repeat % 2 == 0 else units[::-1]:
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
                if kind == "peer":
                    results["peer"].append(result)
                else:
                    results["rows"].setdefault(precision, {}).setdefault(kind, []).append(result)
                print(f"repeat {repeat} {precision} {kind}: {result['img_per_s']:.2f} img/s", file=sys.stderr)
    return results


def _median(runs: list[dict[str, Any]] | None, key: str = "img_per_s") -> float | None:
    return statistics.median(r[key] for r in runs) if runs else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def _rate(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def report_markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    every = [r for kinds in results["rows"].values() for runs in kinds.values() for r in runs] + results[
        "peer"
    ]
    device = every[0].get("device", "?") if every else "?"
    lines = [
        f"Style training, TransformerNet {args.base_channels}/{args.residual_blocks}, {args.resolution} px, batch "
        f"{args.batch_size}, hardware={args.hardware} ({device}), {args.repeats} repeats x {args.steps} iterations "
        f"(after {args.warmup} warm-up), medians over repeats",
        "",
        "| precision | template eager img/s | template cuda_graphs img/s | fast_neural_style img/s (fp32, as "
        "published) | plain loop img/s | cuda_graphs / fast_neural_style (target: >= 1.5) | eager / "
        "fast_neural_style | template / plain | median iteration ms (eager / graphs / fast_neural_style / plain) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    peer = _median(results["peer"])
    peer_ms = _median(results["peer"], "median_iteration_ms")
    outcomes = set()
    for precision, kinds in results["rows"].items():
        eager, graphed, plain = (_median(kinds.get(k)) for k in ("template", "template_graphed", "plain"))
        ms = [_median(kinds.get(k), "median_iteration_ms") for k in ("template", "template_graphed")]
        ms += [peer_ms, _median(kinds.get("plain"), "median_iteration_ms")]
        outcomes |= {r["graphs"] for r in kinds.get("template_graphed", [])}
        lines.append(
            f"| {precision} | {_rate(eager)} | {_rate(graphed)} | {_rate(peer)} | {_rate(plain)} | "
            f"{_ratio(graphed, peer)} | {_ratio(eager, peer)} | {_ratio(eager, plain)} | "
            + " / ".join(f"{m:.0f}" if m is not None else "-" for m in ms)
            + " |"
        )
    if outcomes:
        lines += ["", "hardware.cuda_graphs in the template_graphed runs: " + "; ".join(sorted(outcomes))]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from pixelsmith.core.config import PRECISIONS

    parser = Parser(prog="python -m benchmarks.style_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hardware", type=one_of(conf_names("hardware"), "hardware profile of conf/hardware"), default="auto"
    )
    parser.add_argument("--precisions", nargs="+", type=one_of(PRECISIONS, "precision"), default=["32-true"])
    parser.add_argument("--batch-size", type=count, default=4)
    parser.add_argument(
        "--resolution", type=at_least(16), default=256, help="crop side (VGG's four poolings need 16 or more)"
    )
    parser.add_argument(
        "--base-channels", type=count, default=32, help="TransformerNet width (32 = the paper's)"
    )
    parser.add_argument("--residual-blocks", type=count, default=5)
    # At least 1 warm-up: the first timed iteration starts after a warm one.
    parser.add_argument("--warmup", type=count, default=3)
    parser.add_argument("--steps", type=count, default=15)
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument("--threads", type=count, default=None)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(child_main(json.loads(args.child))))
        return 0
    check_hardware_here(args.hardware, precisions=args.precisions)
    results = run_bench(args)
    print(report_markdown(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
