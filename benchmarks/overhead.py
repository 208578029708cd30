"""Where the template's fixed per-iteration cost goes: `python -m benchmarks.overhead`.

Runs a tiny DCGAN (16 px, ngf = ndf = 8, batch 8, 1 thread: the framework's cost dominates the step) through the
template as shipped, through variants that each remove one suspect, and through the plain loop; all in one process,
alternating, and reports the 10th-percentile iteration time of each (the iterations least disturbed by other load).
The difference to the plain loop is the template's fixed cost; each variant's saving is what that suspect costs.
Divide by your real step time for the overhead share.

Nothing is patched. A variant is either another config (`logger=none`) or another model class: a subclass of the
configured one (`cfg.model._target_`), made here, that overrides the hook in question the way a user's own module
would, `log`/`log_dict` (the module's logging calls record nothing) or `on_train_batch_start` (the core's
per-iteration reseeding). The non-finite guard's gradient norm cannot be taken out of a run without editing the
core, so it is timed alone instead: `torch.nn.utils.get_total_norm` (what the guard computes for unsharded
gradients) over gradients shaped like D's and G's parameters, once per optimizer as in every iteration.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.arguments import (
    CommandLineError,
    Parser,
    at_least,
    check_output_folder,
    count,
    refusals_exit_2,
)

VARIANTS = {
    "template": "template as shipped",
    "no_log": "without self.log / self.log_dict",
    "no_seed": "without the per-iteration reseeding",
    "no_loggers": "without loggers (logger=none)",
    "none": "without log and seed",
}
NORM = "the guard's gradient norm, timed alone"
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


class WithoutLog:
    """Mixin: the module's own `self.log` / `self.log_dict` calls record nothing (Lightning's methods untouched), and
    the core's logging iterations neither stage nor hand over values (its `_log_iteration`)."""

    def _log_iteration(self, last: bool) -> None:
        return None

    def log(self, *args, **kwargs) -> None:
        return None

    def log_dict(self, *args, **kwargs) -> None:
        return None


class WithoutReseed:
    """Mixin: no per-iteration reseeding of the generators (the core's `on_train_batch_start`)."""

    def on_train_batch_start(self, batch, batch_idx) -> None:
        return None


MIXINS: dict[str, tuple[type, ...]] = {
    "no_log": (WithoutLog,),
    "no_seed": (WithoutReseed,),
    "none": (WithoutLog, WithoutReseed),
}


def variant_target(base_target: str, variant: str) -> str:
    """`_target_` of a subclass of the model class `base_target` with the variant's mixins in front. The class is
    made once and kept as an attribute of this module, so Hydra's `get_class` finds it by that path (also when this
    module runs as `__main__`)."""
    from hydra.utils import get_class

    base = get_class(base_target)
    mixins = MIXINS[variant]
    name = base.__name__ + "".join(m.__name__ for m in mixins)
    if name not in globals():
        globals()[name] = type(name, (*mixins, base), {"__module__": __name__, "__qualname__": name})
    return f"{__name__}.{name}"


def _iteration_times(ends: list[float], skip: int) -> list[float]:
    return [b - a for a, b in zip(ends[skip:], ends[skip + 1 :], strict=False)]


def gradient_norm_seconds(gan, calls: int = 200) -> list[float]:
    """Seconds per iteration of the guard's norm: one `get_total_norm` over D's and one over G's gradient shapes."""
    groups = [
        [torch.randn_like(p) for group in opt.param_groups for p in group["params"] if p.requires_grad]
        for opt in (gan.opt_d, gan.opt_g)
    ]
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        for grads in groups:
            torch.nn.utils.get_total_norm(grads)
        seconds.append(time.perf_counter() - started)
    return seconds


def variant_config(variant: str, iterations: int, output_dir: Path):
    """The composed config of one run: a template variant (a key of VARIANTS) with the bench clock, or "plain" (the
    plain loop's networks and data); the tiny DCGAN, no time budget (`harness.compose`)."""
    from omegaconf import open_dict

    from benchmarks.harness import CLOCK_TARGET, compose

    extra = ["logger=none"] if variant == "no_loggers" else []
    cfg = compose([*TINY, f"max_steps={iterations}", *extra], output_dir)
    if variant == "plain":
        return cfg
    with open_dict(cfg):
        cfg.callbacks.bench_clock = {"_target_": CLOCK_TARGET}
        if variant in MIXINS:
            cfg.model._target_ = variant_target(cfg.model._target_, variant)
        if cfg.get("eval") is not None and "every_n_steps" in cfg.eval:
            cfg.eval.every_n_steps = 0
    return cfg


def measure(iterations: int = 120, repeats: int = 2, workdir: Path | None = None) -> dict[str, list[float]]:
    import lightning as L

    from benchmarks.harness import IterationClock, require_every_iteration
    from benchmarks.plain_loop import build_plain_gan, plain_loader, run_plain
    from pixelsmith.run.build import resolve_hardware
    from pixelsmith.run.fit import run

    # A fresh folder per invocation: a run dir left by an earlier one holds a finished checkpoint that auto-resume
    # would take (and refuse, as there is nothing left to train).
    workdir = workdir or Path("outputs") / "overhead" / time.strftime("%Y%m%d-%H%M%S")
    skip = min(10, iterations // 3)
    times: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "plain", NORM]}
    for repeat in range(repeats):
        for variant in VARIANTS:
            cfg = variant_config(variant, iterations, workdir / f"{repeat}-{variant}")
            require_every_iteration(run(cfg), iterations)
            times[variant] += _iteration_times(IterationClock.ends, skip)
        cfg = variant_config("plain", iterations, workdir / f"{repeat}-plain")
        hardware = resolve_hardware(cfg)
        L.seed_everything(cfg.seed, verbose=False)
        gan = build_plain_gan(cfg, hardware, "fused")
        ends, _ = run_plain(gan, plain_loader(cfg, hardware), iterations)
        times["plain"] += _iteration_times(ends, skip)
        times[NORM] += gradient_norm_seconds(gan)
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
    if times.get(NORM):
        norm = p10(times[NORM])
        median = statistics.median(times[NORM])
        lines.append(f"| {NORM} | | {1000 * median:.2f} | {1000 * norm:.2f} ms (p10) |")
    lines.append("")
    lines.append(
        f"Fixed template cost: {1000 * (full - plain):.2f} ms per iteration (p10 template - p10 plain)."
    )
    return "\n".join(lines)


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="python -m benchmarks.overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--iterations", type=at_least(2), default=120, help="per run (2 or more: a time is between two ends)"
    )
    parser.add_argument("--repeats", type=count, default=2)
    parser.add_argument("--out", default=None, help="run dirs (default outputs/overhead/<time>)")
    args = parser.parse_args(argv)
    if args.out is not None:
        out = check_output_folder(args.out, "--out")
        if out.is_dir() and any(out.iterdir()):
            # An earlier measurement's run dirs hold finished checkpoints that auto-resume would take.
            raise CommandLineError(
                f"--out {args.out} is not empty: the run dirs of an earlier measurement there would be resumed, "
                "not measured again. Nothing was run. Fix: give --out a new or empty folder."
            )
    torch.set_num_threads(1)
    print(report(measure(args.iterations, args.repeats, Path(args.out) if args.out else None)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
