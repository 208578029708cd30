"""Where the template's fixed per-iteration cost goes: `python -m pixelsmith.perf.overhead`.

Runs a tiny DCGAN (16 px, ngf = ndf = 8, batch 8, 1 thread: the framework's cost dominates the step) through the
template as shipped, through variants that each remove one suspect (`self.log`, the per-iteration reseeding, the
loggers, the non-finite guard's gradient norm), and through the plain loop; all in one process, alternating, and
reports the 10th-percentile iteration time of each (the iterations least disturbed by other load). The difference
to the plain loop is the template's fixed cost; each variant's saving is what that suspect costs. Divide by your
real step time for the overhead share. The variants patch the classes in this process only.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager
from pathlib import Path

import torch

VARIANTS = {
    "template": "template as shipped",
    "no_log": "without self.log / self.log_dict",
    "no_seed": "without the per-iteration reseeding",
    "no_loggers": "without loggers (logger=none)",
    "no_norm": "without the guard's gradient norm",
    "none": "without log, seed and norm",
}
TINY = [
    "hardware=cpu",
    "precision=32-true",
    "hardware.channels_last=false",
    "model.generator.ngf=8",
    "model.discriminator.ndf=8",
    "data.resolution=16",
    "data.batch_size=8",
    "data.limit=512",
    "train.progress_bar=false",
    "train.sample_every_n_steps=0",
]


@contextmanager
def _patched(variant: str):
    import lightning as L

    import pixelsmith.core.module as core

    saved = {
        "log": L.LightningModule.log,
        "log_dict": L.LightningModule.log_dict,
        "seed": core.TrainingCore.on_train_batch_start,
        "norm": getattr(core, "_global_norm", None),
    }
    try:
        if variant in ("no_log", "none"):
            L.LightningModule.log = lambda self, *a, **k: None
            L.LightningModule.log_dict = lambda self, *a, **k: None
        if variant in ("no_seed", "none"):
            core.TrainingCore.on_train_batch_start = lambda self, batch, batch_idx: None
        if variant in ("no_norm", "none") and saved["norm"] is not None:
            core._global_norm = lambda grads: torch.zeros(())
        yield
    finally:
        L.LightningModule.log, L.LightningModule.log_dict = saved["log"], saved["log_dict"]
        core.TrainingCore.on_train_batch_start = saved["seed"]
        if saved["norm"] is not None:
            core._global_norm = saved["norm"]


def _iteration_times(ends: list[float], skip: int) -> list[float]:
    return [b - a for a, b in zip(ends[skip:], ends[skip + 1 :], strict=False)]


def measure(iterations: int = 120, repeats: int = 2, workdir: Path | None = None) -> dict[str, list[float]]:
    import lightning as L
    from omegaconf import open_dict

    from pixelsmith.perf import bench
    from pixelsmith.perf.plain_loop import build_plain_gan, plain_loader, run_plain
    from pixelsmith.train import build_plan, run

    workdir = workdir or Path("outputs") / "overhead"
    skip = min(10, iterations // 3)
    times: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "plain"]}
    overrides = [*TINY, f"max_steps={iterations}"]
    for repeat in range(repeats):
        for variant in VARIANTS:
            extra = ["logger=none"] if variant == "no_loggers" else []
            cfg = bench._compose(overrides + extra, workdir / f"{repeat}-{variant}")
            with open_dict(cfg):
                cfg.callbacks.bench_clock = {"_target_": "pixelsmith.perf.bench.IterationClock"}
                if cfg.get("eval") is not None and "every_n_steps" in cfg.eval:
                    cfg.eval.every_n_steps = 0
            with _patched(variant):
                run(cfg)
            times[variant] += _iteration_times(bench.IterationClock.ends, skip)
        cfg = bench._compose(overrides, workdir / f"{repeat}-plain")
        plan = build_plan(cfg)
        L.seed_everything(cfg.seed, verbose=False)
        ends, _ = run_plain(build_plain_gan(cfg, plan, "fused"), plain_loader(cfg, plan), iterations)
        times["plain"] += _iteration_times(ends, skip)
    return times


def p10(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 10]


def report(times: dict[str, list[float]]) -> str:
    plain = p10(times["plain"])
    full = p10(times["template"])
    lines = [
        "| variant | p10 ms/iteration | median ms | saves vs template |",
        "|---|---:|---:|---:|",
    ]
    for name, label in [*VARIANTS.items(), ("plain", "plain loop")]:
        t = p10(times[name])
        saves = "" if name in ("template", "plain") else f"{1000 * (full - t):.2f} ms"
        lines.append(f"| {label} | {1000 * t:.2f} | {1000 * statistics.median(times[name]):.2f} | {saves} |")
    lines.append("")
    lines.append(
        f"Fixed template cost: {1000 * (full - plain):.2f} ms per iteration (p10 template - p10 plain)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, help="run dirs (default outputs/overhead)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(report(measure(args.iterations, args.repeats, Path(args.out) if args.out else None)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
