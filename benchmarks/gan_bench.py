"""`python bench.py`: images/s of the template across a settings matrix, each run in a fresh process, against a plain
PyTorch loop doing the same work, so the template's overhead is a measured ratio.

    python bench.py                                  # default: DCGAN 64 px, batch 64, the CPU switches one by one
    python bench.py --full                           # model x precision x channels_last x compile x batch size
    python bench.py --models dcgan --precisions 32-true bf16-mixed --channels-last false true --batch-sizes 64
    python bench.py --repeats 5 --warmup 3 --steps 20 --hardware auto   # on a GPU machine

Per cell and repeat, the template run (`pixelsmith.run.fit.run` with the default callbacks and loggers, progress bar
off) and the plain loop (`benchmarks.plain_loop`) each run in a new Python process (no allocator, oneDNN or
compile cache carried over), `--warmup` iterations first, then `--steps` timed ones; images/s = steps x batch /
(wall time from the end of the last warm-up iteration to the end of the last timed one), the same clock for both.
Template and plain alternate in order from repeat to repeat, and cells interleave, so load drift on a shared
machine spreads evenly. Reported: medians with min-max over repeats; overhead = plain / template - 1 per repeat pair,
in wall time and in process CPU time (steadier on a shared machine).
FLOPs per iteration are counted once per cell (FlopCounterMode without its module tracker on plain iterations: same
networks, same FLOPs), one without and one with lazy R1; the reported figure is their mean over the timed iterations
(R1 where iteration % r1_interval == 0), so MFU = FLOPs x iterations/s / peak is exact for the timed window
(datasheet table on NVIDIA GPUs, measured GEMM peak on CPU, measured again when a cell outdoes it).
No run has the main job's time budget (`harness.compose`). On a CPU without native bf16 (no AVX512-BF16 or AMX) the
bf16-mixed cells would time an emulation: they are skipped, with the reason printed once, unless --emulated-bf16.

Outputs in the run dir (default outputs/bench/<timestamp>): bench.json (one record per cell), bench.md, bench.png,
and each run's own dir under runs/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.arguments import (
    CommandLineError,
    Parser,
    check_hardware_here,
    check_output_folder,
    composition_error,
    conf_names,
    count,
    gan_models,
    one_of,
    power_of_two,
    refusals_exit_2,
    seconds,
    true_or_false,
)
from benchmarks.child import child_env
from benchmarks.harness import (
    CLOCK_TARGET,
    PROFILE_TARGET,
    IterationClock,
    KernelProfile,
    compose,
    profiled,
    require_every_iteration,
    window_edges,
)
from pixelsmith.core.config import PRECISIONS, OptimizerImpl
from pixelsmith.errors import PixelsmithError, UnwritableError, check_writable_folder, why_unwritable

RESULT_PREFIX = "PIXELSMITH_BENCH_RESULT "


@dataclass(frozen=True)
class Cell:
    model: str = "dcgan"
    precision: str = "32-true"
    channels_last: bool = False
    compile: bool = False
    batch_size: int = 64
    optimizer: str = "fused"

    @property
    def name(self) -> str:
        layout = "channels_last" if self.channels_last else "contiguous"
        mode = "compiled" if self.compile else "eager"
        return f"{self.model} b{self.batch_size} {self.precision} {layout} {mode} {self.optimizer}-adam"

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "_")


# The default matrix: DCGAN at 64 px, batch 64 (the reference point of the speed targets), switching on the CPU profile's
# settings one at a time. The first cell is "no switches" (fp32, contiguous, eager, foreach Adam); the last is the
# cpu profile's defaults (bf16 autocast, channels_last, fused Adam; compile stays off on CPU).
DEFAULT_CELLS = [
    Cell("dcgan", "32-true", False, False, 64, "foreach"),
    Cell("dcgan", "32-true", False, False, 64, "fused"),
    Cell("dcgan", "32-true", True, False, 64, "fused"),
    Cell("dcgan", "bf16-mixed", False, False, 64, "fused"),
    Cell("dcgan", "bf16-mixed", True, False, 64, "fused"),
]
FULL_AXES = {
    "models": ["dcgan", "stylegan2"],
    "precisions": ["32-true", "bf16-mixed"],
    "channels_last": [False, True],
    "compile": [False, True],
    "batch_sizes": [32, 64, 128],
    "optimizers": ["fused"],
}


# ---- child process ------------------------------------------------------------------------------------------------
def template_iterations(args: dict[str, Any]) -> int:
    """A template run's iterations: warm-up, the timed window, any profiled iterations (`profile_iterations`,
    `harness.KernelProfile`), and one more. The run's last iteration is end-of-run work (it reads its logs at once
    and checks the non-finite guard), so it is in neither the window nor the profile: both see steady iterations,
    as the plain loop's do."""
    return int(args["warmup"]) + int(args["steps"]) + int(args.get("profile_iterations") or 0) + 1


def cell_overrides(cell: Cell, args: dict[str, Any]) -> list[str]:
    return [
        f"hardware={args['hardware']}",
        f"precision={cell.precision}",
        f"hardware.channels_last={str(cell.channels_last).lower()}",
        f"hardware.compile={str(cell.compile).lower()}",
        f"hardware.optimizer_impl={cell.optimizer}",
        f"model={cell.model}",
        "data=mnist",
        f"data.resolution={args['resolution']}",
        "data.channels=3",
        f"data.batch_size={cell.batch_size}",
        f"max_steps={template_iterations(args)}",
        "train.progress_bar=false",
        "train.sample_every_n_steps=0",  # the grid at step 0 is outside the timed window anyway
        *args.get("extra_overrides", []),
    ]


def _images_per_second(ends: list[float], warmup: int, steps: int, batch: int) -> float:
    if len(ends) < warmup + steps or warmup < 1:
        raise RuntimeError(
            f"expected {warmup + steps} iteration times, got {len(ends)} (warm-up must be >= 1)"
        )
    return steps * batch / (ends[warmup + steps - 1] - ends[warmup - 1])


def _count_plain_flops(cfg, hardware, optimizer_impl: str, warmup: int, steps: int) -> dict[str, Any]:
    """FLOPs of a plain iteration without and with lazy R1, and their mean over the timed iterations
    (warmup .. warmup + steps - 1 of a fresh run: R1 runs where iteration % r1_interval == 0)."""
    from benchmarks.gan_flops import count_gan_iteration_flops
    from benchmarks.plain_loop import build_plain_gan, endless, plain_loader

    gan = build_plain_gan(cfg, hardware, optimizer_impl)
    images = next(endless(plain_loader(cfg, hardware)))
    counts = count_gan_iteration_flops(gan, images)
    return {
        "flops_per_iteration": counts.mean_over(range(warmup, warmup + steps)),
        "flops_common_iteration": counts.common,
        "flops_r1_iteration": counts.r1,
        "r1_interval": counts.r1_interval,
        "flops_per_iteration_amortised": counts.amortised,
    }


def child_config(spec: dict[str, Any]):
    """The composed config of one run of a cell (either kind; no time budget, see `harness.compose`)."""
    cell = Cell(**spec["cell"])
    # The template eager (the plain loop's execution mode) or with its own CUDA graphs (the hand-captured step's).
    graphs = f"hardware.cuda_graphs={str(spec.get('kind') == 'template_graphed').lower()}"
    overrides = [*cell_overrides(cell, spec), graphs, *spec.get("run_overrides", [])]
    cfg = compose(overrides, Path(spec["output_dir"]))
    if cfg.get("eval") is not None and "every_n_steps" in cfg.eval:
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.eval.every_n_steps = 0  # FID at start and end is outside the timed window: skip its minutes
    return cfg


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    cell = Cell(**spec["cell"])
    output_dir = Path(spec["output_dir"])
    cfg = child_config(spec)
    result: dict[str, Any] = {"kind": spec["kind"], "cell": asdict(cell)}
    # Iterations profiled after the timed window (`harness.KernelProfile`): kernel time and count per iteration.
    profile_iterations = int(spec.get("profile_iterations") or 0)
    if spec["kind"] in ("template", "template_graphed"):
        from omegaconf import open_dict

        from pixelsmith.run.fit import run

        with open_dict(cfg):
            cfg.callbacks = cfg.callbacks or {}
            cfg.callbacks.bench_clock = {"_target_": CLOCK_TARGET}
            if profile_iterations:
                cfg.callbacks.kernel_profile = {"_target_": PROFILE_TARGET}
        IterationClock.synchronize_after = window_edges(spec["warmup"], spec["steps"])
        KernelProfile.first, KernelProfile.count = spec["warmup"] + spec["steps"] + 1, profile_iterations
        try:
            metrics = run(cfg)
            require_every_iteration(metrics, template_iterations(spec))
        finally:
            IterationClock.synchronize_after = frozenset()  # a later run in this process times its own window
            KernelProfile.count = 0
            KernelProfile.discard()  # a run that ended inside its profiled iterations leaves no profiler on
        if profile_iterations:
            result["profile"] = KernelProfile.summary
        # Whether the run compiled again or left its graphs (a capture or a recompile inside the window would show
        # in its slowest iteration; these say which).
        result["startup"] = {
            key.removeprefix("startup/"): metrics[key]
            for key in (
                "startup/captures",
                "startup/replays",
                "startup/recompiles",
                "startup/graphs_given_up",
            )
            if key in metrics
        }
        ends, cpu_ends = IterationClock.ends, IterationClock.cpu_ends
        breakdown = output_dir / "perf" / "breakdown.csv"
        if breakdown.is_file():
            result["breakdown_csv"] = str(breakdown)
            result["breakdown_md"] = str(output_dir / "perf" / "breakdown.md")
        if spec.get("count_flops"):
            from pixelsmith.run.build import resolve_hardware

            hardware = resolve_hardware(cfg)
            result.update(
                _count_plain_flops(cfg, hardware, hardware.optimizer_impl, spec["warmup"], spec["steps"])
            )
    else:
        import lightning as L

        from benchmarks.plain_loop import build_plain_gan, endless, plain_loader, run_plain
        from pixelsmith.hardware.settings import apply_hardware
        from pixelsmith.run.build import resolve_hardware

        hardware = resolve_hardware(cfg)
        apply_hardware(hardware)
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        graphed = spec["kind"] == "graphed"
        gan = build_plain_gan(cfg, hardware, hardware.optimizer_impl, capturable=graphed)
        loader = plain_loader(cfg, hardware)
        if graphed:
            from benchmarks.plain_loop import GraphedPlainGAN

            gan = GraphedPlainGAN(gan, next(endless(loader)), capture=torch.cuda.is_available())
        ends, cpu_ends = run_plain(
            gan, loader, spec["warmup"] + spec["steps"], window_edges(spec["warmup"], spec["steps"])
        )
        if profile_iterations:
            batches = endless(loader)
            result["profile"] = profiled(profile_iterations, lambda: gan.step(next(batches)))
        if spec.get("count_flops"):
            result.update(
                _count_plain_flops(cfg, hardware, hardware.optimizer_impl, spec["warmup"], spec["steps"])
            )
    result["img_per_s"] = _images_per_second(ends, spec["warmup"], spec["steps"], cell.batch_size)
    timed = ends[spec["warmup"] - 1 : spec["warmup"] + spec["steps"]]
    result["iteration_seconds"] = [b - a for a, b in zip(timed, timed[1:], strict=False)]
    # Images per CPU-second (all threads): on a shared machine wall time absorbs other people's load, CPU time
    # mostly does not, so the overhead ratio in CPU time is the steadier of the two.
    result["img_per_cpu_s"] = _images_per_second(cpu_ends, spec["warmup"], spec["steps"], cell.batch_size)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        result["peak_cuda_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    result["threads"] = torch.get_num_threads()
    return result


# ---- parent: run the matrix ---------------------------------------------------------------------------------------
def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One run in a fresh interpreter; its result is the JSON line it prints last."""
    output_dir = Path(spec["output_dir"])
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gan_bench", "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=child_env(HYDRA_FULL_ERROR="1"),
    )
    (output_dir / "child.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        failed = {"kind": spec["kind"], "cell": spec["cell"], "error": f"exit {proc.returncode}: {tail}"}
        (output_dir / "result.json").write_text(json.dumps(failed))
        return failed
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    result["process_seconds"] = time.perf_counter() - started
    (output_dir / "result.json").write_text(json.dumps(result))
    return result


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def peak_for(precision: str, hardware: str, achieved: float | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s for MFU or None, "key: where it came from"). With `achieved` (a cell's FLOP/s), a CPU GEMM peak
    below it is measured again, and None when it stays below (`plausible_peak_flops`): never an MFU above 100%."""
    import torch

    from pixelsmith.perf.flops import device_peak_flops, plausible_peak_flops

    device = torch.device("cuda" if hardware != "cpu" and torch.cuda.is_available() else "cpu")
    value, key, source = device_peak_flops(device, precision)
    if device.type == "cpu" and achieved is not None and value is not None and achieved > value:
        value, source = plausible_peak_flops(key, achieved)
    return value, f"{key}: {source}"


def build_cells(args: argparse.Namespace) -> list[Cell]:
    axes_given = any(
        getattr(args, name) is not None
        for name in ("models", "precisions", "channels_last", "compile", "batch_sizes", "optimizers")
    )
    if not args.full and not axes_given:
        return list(DEFAULT_CELLS)
    axes = (
        dict(FULL_AXES)
        if args.full
        else {
            **FULL_AXES,
            "models": ["dcgan"],
            "channels_last": [False],
            "compile": [False],
            "batch_sizes": [64],
            "precisions": ["32-true"],
        }
    )
    for name in axes:
        value = getattr(args, name)
        if value is not None:
            axes[name] = value
    return [
        Cell(m, p, cl, c, b, o)
        for m, p, cl, c, b, o in itertools.product(
            axes["models"],
            axes["precisions"],
            axes["channels_last"],
            axes["compile"],
            axes["batch_sizes"],
            axes["optimizers"],
        )
    ]


def emulated_bf16_reason(args: argparse.Namespace) -> str | None:
    """Why bf16-mixed cells would only time an emulation here (a CPU without native bf16), or None: on a GPU, on a
    CPU with AVX512-BF16 or AMX, or when `--emulated-bf16` asks for them anyway."""
    if getattr(args, "emulated_bf16", False) or (args.hardware != "cpu" and _cuda_available()):
        return None
    from pixelsmith.hardware.settings import cpu_has_native_bf16

    if cpu_has_native_bf16():
        return None
    return (
        f"this CPU ({_cpu_name()}) has no native bf16 (neither AVX512-BF16 nor AMX), so bf16 autocast is emulated: "
        "those cells would time the emulation, many times slower than fp32, and the cpu profile itself trains "
        "32-true here. --emulated-bf16 runs them anyway."
    )


def runnable_cells(args: argparse.Namespace) -> tuple[list[Cell], list[Cell], str | None]:
    """The matrix split into the cells to run and the ones skipped, with the reason for skipping (None: none is)."""
    cells = build_cells(args)
    emulated = [c for c in cells if c.precision == "bf16-mixed"]
    reason = emulated_bf16_reason(args) if emulated else None
    if reason is None:
        return cells, [], None
    return [c for c in cells if c.precision != "bf16-mixed"], emulated, reason


def cells_to_run(args: argparse.Namespace) -> tuple[list[Cell], list[Cell], str | None]:
    """`runnable_cells`, refused when none is left to run."""
    cells, skipped, reason = runnable_cells(args)
    if not cells:
        raise CommandLineError(
            "Every cell of this matrix is bf16-mixed, and this CPU can only emulate bf16. Nothing was run. Fix: add "
            "--precisions 32-true, or pass --emulated-bf16 to time the emulation."
        )
    return cells, skipped, reason


def check_matrix(args: argparse.Namespace) -> None:
    """Refuse, before any run, what would make runs fail and leave rows of n/a: a hardware profile this machine
    cannot run, a cell whose config does not compose or that the run's own checks (`validate_config`, the precision
    on this device) would refuse, and an output folder that cannot be written or overlaps the data the runs read.
    One composition per model, precision and batch size: the other axes are names the parser checked. Without
    --out, sets the default (outputs/bench/<timestamp>), so the folder checked is the one written."""
    import tempfile

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from pixelsmith.config.validate import validate_config
    from pixelsmith.run.build import resolve_hardware

    cells, _, _ = cells_to_run(args)
    check_hardware_here(args.hardware)
    composed: set[tuple[str, str, int]] = set()
    # What the runs read (an image folder's root, an archive's or shards' path): no output goes inside it.
    data: set[tuple[str, str]] = set()
    for cell in cells:
        if (cell.model, cell.precision, cell.batch_size) in composed:
            continue
        composed.add((cell.model, cell.precision, cell.batch_size))
        try:
            with tempfile.TemporaryDirectory() as scratch:
                cfg = compose(cell_overrides(cell, _base_settings(args)), Path(scratch))
            validate_config(cfg)
            resolve_hardware(cfg)
        except (HydraException, OmegaConfBaseException) as err:
            raise CommandLineError(
                f"The runs of cell {cell.name} do not compose: {composition_error(err)}. Nothing was run. Fix the "
                "value it names (an option of the matrix or a --override)."
            ) from err
        except PixelsmithError as err:
            raise CommandLineError(
                f"The runs of cell {cell.name} would be refused: {err} Nothing was run."
            ) from err
        data |= {
            (f"the runs' data.{key}", str(cfg.data[key])) for key in ("root", "path") if cfg.data.get(key)
        }
    args.out = args.out or str(Path("outputs") / "bench" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f"))
    check_output_folder(args.out, "--out", sorted(data))


def check_report_from(args: argparse.Namespace) -> Path:
    """The run dir `--report-from` rebuilds, refused in one paragraph when it is not one a bench run wrote, cannot
    be written, or holds none of the matrix's cells (a report of rows of n/a)."""
    given = args.report_from
    folder = Path(given).expanduser()
    if args.out is not None:
        raise CommandLineError(
            f"--out {args.out} with --report-from {given}: --report-from rebuilds bench.json, bench.md and "
            "bench.png in the folder it reads, from the runs under its runs/ (which it only reads). Nothing was "
            "written. Fix: leave out --out."
        )
    if not folder.is_dir():
        found = "is a file" if folder.exists() else "does not exist"
        raise CommandLineError(
            f"--report-from {given} {found}. Nothing was written. Fix: give the folder a bench.py run wrote (its "
            "--out, by default outputs/bench/<timestamp>: the one that holds runs/)."
        )
    runs = folder / "runs"
    if not runs.is_dir():
        raise CommandLineError(
            f"--report-from {given} holds no runs/ folder, so no bench.py run wrote it. Nothing was written. Fix: "
            "give the folder a bench.py run wrote (its --out, by default outputs/bench/<timestamp>)."
        )
    check_writable_folder(
        folder, "--report-from", "rebuild a copy of the run dir in a folder you can write in."
    )
    ran = sorted(p.name for p in runs.iterdir() if p.is_dir())
    cells = build_cells(args)
    if not any(cell.slug in ran for cell in cells):
        listed = (
            ", ".join(ran[:6]) + (f" and {len(ran) - 6} more" if len(ran) > 6 else "") if ran else "nothing"
        )
        raise CommandLineError(
            f"--report-from {given}: none of the {len(cells)} cells of this matrix ran there (its runs/ holds "
            f"{listed}). Nothing was written. Fix: give the matrix options of the run that wrote it (--models, "
            "--precisions, --channels-last, --compile, --batch-sizes, --optimizers, or --full)."
        )
    return folder


def run_matrix(args: argparse.Namespace) -> dict[str, Any]:
    cells, skipped, reason = cells_to_run(args)
    if skipped:
        names = ", ".join(c.name for c in skipped)
        print(f"bench: skipping {len(skipped)} bf16-mixed cell(s) ({names}): {reason}", flush=True)
    out = Path(args.out or Path("outputs") / "bench" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f"))
    out.mkdir(parents=True, exist_ok=True)
    base = _base_settings(args)
    kinds = bench_kinds(args)
    flops: dict[str, float] = {}
    load_start = load_average()
    for precision in sorted({c.precision for c in cells}):
        peak_for(precision, args.hardware)  # measure or read the CPU GEMM peak before the runs
    started = time.perf_counter()
    print(f"bench: {len(cells)} cells x {args.repeats} repeats x {len(kinds)} kinds -> {out}", flush=True)
    for repeat in range(args.repeats):
        for cell in cells:
            order = kinds if repeat % 2 == 0 else list(reversed(kinds))
            for kind in order:
                spec = {
                    **base,
                    "kind": kind,
                    "cell": asdict(cell),
                    "output_dir": str(out / "runs" / cell.slug / f"{repeat}-{kind}"),
                    "count_flops": cell.slug not in flops and (kind == "plain" or args.no_plain),
                }
                result = run_child(spec, args.timeout)
                if "flops_per_iteration" in result:
                    flops[cell.slug] = result["flops_per_iteration"]
                shown = f"{result['img_per_s']:.1f} img/s" if "img_per_s" in result else result["error"][:300]
                print(f"  [{repeat + 1}/{args.repeats}] {cell.name} {kind}: {shown}", flush=True)
        # A report after every round: an interrupted benchmark still leaves one (and --report-from rebuilds it).
        write_report(out, args, load_start, time.perf_counter() - started)
    if args.breakdown and cells:
        target = cells[-1]
        spec = {
            **base,
            "kind": "template",
            "cell": asdict(target),
            "output_dir": str(out / "runs" / target.slug / "breakdown"),
            "run_overrides": ["profiler=breakdown", f"profiler.warmup_steps={args.warmup}"],
        }
        result = run_child(spec, args.timeout)
        print(
            f"  breakdown run ({target.name}): {result.get('img_per_s', float('nan')):.1f} img/s", flush=True
        )
    report = write_report(out, args, load_start, time.perf_counter() - started)
    print(
        f"bench: wrote {out / 'bench.json'}, bench.md, bench.png in {report['wall_seconds']:.0f} s",
        flush=True,
    )
    return report


def bench_kinds(args: argparse.Namespace) -> list[str]:
    """template and the plain loop, eager; on a CUDA machine also each captured as CUDA graphs: the template with
    `hardware.cuda_graphs=true`, and the plain step captured by hand (the launch-free limit)."""
    kinds = ["template"] + ([] if args.no_plain else ["plain"])
    if not getattr(args, "no_graph", False) and _cuda_available():
        kinds.append("template_graphed")
        if not args.no_plain:
            kinds.append("graphed")
    return kinds


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _base_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "hardware": args.hardware,
        "resolution": args.resolution,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads,
        "extra_overrides": list(args.override or []),
    }


def collect_runs(out: Path) -> tuple[dict[str, dict[str, list[dict[str, Any]]]], dict[str, Any] | None]:
    """Every run's result.json under `out/runs/<cell>/<repeat>-<kind>/` (in repeat order), and the breakdown run."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    breakdown = None
    for cell_dir in sorted((out / "runs").glob("*")):
        by_kind: dict[str, list[dict[str, Any]]] = {}
        run_dirs = sorted(
            cell_dir.glob("*-*"), key=lambda d: int(d.name.split("-")[0]) if d.name[0].isdigit() else -1
        )
        for run_dir in run_dirs:
            path = run_dir / "result.json"
            if path.is_file() and run_dir.name[0].isdigit():
                result = read_result(path)
                by_kind.setdefault(result["kind"], []).append(result)
        runs[cell_dir.name] = by_kind
        result_path = cell_dir / "breakdown" / "result.json"
        if result_path.is_file():
            result = read_result(result_path)
            name = Cell(**result["cell"]).name
            if "breakdown_csv" in result:
                breakdown = {"cell": name, "img_per_s": result["img_per_s"], **_read_breakdown(result)}
            else:
                breakdown = {"cell": name, "error": result.get("error", "no breakdown written")}
    return runs, breakdown


class UnreadableResultError(PixelsmithError):
    """A run's result.json that is not what `run_child` writes (cut short, edited): no report is built on it."""


def read_result(path: Path) -> dict[str, Any]:
    """One run's result.json, refused in one paragraph (before any report file is written) when it does not hold a
    result: a JSON object with the run's kind and cell."""
    try:
        result = json.loads(path.read_text())
        if not isinstance(result, dict) or not isinstance(result.get("kind"), str):
            raise ValueError("no JSON object with a 'kind'")
        Cell(**result["cell"])
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise UnreadableResultError(
            f"{path} is not a result bench.py wrote ({type(err).__name__}: {err}), so no report was written. Fix: "
            f"delete that run's folder, {path.parent} (the cell's other repeats still count), and rebuild with "
            "--report-from."
        ) from err
    return result


# Per-kind FLOP counts a run's result carries next to flops_per_iteration (the mean over the timed iterations).
FLOP_DETAIL_KEYS = (
    "flops_common_iteration",
    "flops_r1_iteration",
    "r1_interval",
    "flops_per_iteration_amortised",
)


def write_report(
    out: Path, args: argparse.Namespace, load_start, wall_seconds: float | None
) -> dict[str, Any]:
    cells, skipped, skip_reason = runnable_cells(args)
    runs, breakdown = collect_runs(out)
    flops = {
        slug: r["flops_per_iteration"]
        for slug, kinds in runs.items()
        for results in kinds.values()
        for r in results
        if "flops_per_iteration" in r
    }
    flop_details = {
        slug: {key: r[key] for key in FLOP_DETAIL_KEYS if key in r}
        for slug, kinds in runs.items()
        for results in kinds.values()
        for r in results
        if "flops_per_iteration" in r
    }
    kinds = bench_kinds(args)
    records = [_cell_record(cell, runs.get(cell.slug, {}), flops.get(cell.slug), args) for cell in cells]
    for cell, record in zip(cells, records, strict=True):
        record.update(flop_details.get(cell.slug, {}))
    load_end = load_average()
    previous = out / "bench.json"
    if load_start is None and previous.is_file():
        # A rebuild (--report-from) keeps the load averages and duration of the run that measured; a report that
        # does not read back (cut short, edited) leaves them unknown.
        try:
            old = json.loads(previous.read_text())
            load_start, load_end = old["machine"]["load_average_start"], old["machine"]["load_average_end"]
            wall_seconds = old.get("wall_seconds")
        except (OSError, ValueError, TypeError, KeyError):
            load_end = None
    report = {
        "created": datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "cpu": _cpu_name(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": _torch_version(),
            "load_average_start": load_start,
            "load_average_end": load_end,
            "cpu_count": os.cpu_count(),
        },
        "settings": {**_base_settings(args), "repeats": args.repeats, "kinds": kinds},
        "wall_seconds": wall_seconds,
        "cells": records,
        "skipped": {"cells": [c.name for c in skipped], "reason": skip_reason} if skipped else None,
        "speedups": _speedups(records),
        "breakdown": breakdown,
    }
    _write_whole(
        out,
        {
            "bench.json": lambda path: path.write_text(json.dumps(report, indent=2)),
            "bench.md": lambda path: path.write_text(bench_markdown(report)),
            "bench.png": lambda path: bench_png(path, report),
        },
    )
    return report


def _write_whole(out: Path, writers: dict[str, Any]) -> None:
    """Each file written beside its final name first and moved into place once all are written: an interrupted
    write leaves the previous report whole, never a cut one."""
    partial = {name: out / f".{Path(name).stem}.partial{Path(name).suffix}" for name in writers}
    try:
        for name, write in writers.items():
            write(partial[name])
        for name in writers:
            os.replace(partial[name], out / name)
    except OSError as err:
        raise UnwritableError(
            f"The report in {out} could not be written: {why_unwritable(err)} ({err.strerror or err}). The "
            "previous one is kept as it was. Fix: free space there (or make it writable) and rebuild it with "
            "--report-from."
        ) from err
    finally:
        for path in partial.values():
            path.unlink(missing_ok=True)


def _read_breakdown(result: dict[str, Any]) -> dict[str, Any]:
    import csv

    with open(result["breakdown_csv"]) as handle:
        rows = list(csv.DictReader(handle))
    md = Path(result["breakdown_md"]).read_text() if result.get("breakdown_md") else ""
    return {"rows": rows, "markdown": md}


def _cell_record(
    cell: Cell, runs: dict[str, list[dict[str, Any]]], flops: float | None, args
) -> dict[str, Any]:
    template = [r["img_per_s"] for r in runs.get("template", []) if "img_per_s" in r]
    plain = [r["img_per_s"] for r in runs.get("plain", []) if "img_per_s" in r]
    graphed = [r["img_per_s"] for r in runs.get("graphed", []) if "img_per_s" in r]
    template_graphed = [r["img_per_s"] for r in runs.get("template_graphed", []) if "img_per_s" in r]

    def pair_ratios(key: str) -> list[float]:
        return [
            p[key] / t[key] - 1.0
            for t, p in zip(runs.get("template", []), runs.get("plain", []), strict=False)
            if key in t and key in p
        ]

    pairs = pair_ratios("img_per_s")
    template_cpu = [r["img_per_cpu_s"] for r in runs.get("template", []) if "img_per_cpu_s" in r]

    # Every timed iteration of all repeats, per kind.
    pooled = {
        kind: [t for r in runs.get(kind, []) for t in r.get("iteration_seconds", [])]
        for kind in ("template", "plain")
    }
    # timeit's rule on a shared machine: the fastest iteration is the one least disturbed by other load.
    best_template, best_plain = (cell.batch_size / min(t) if t else None for t in pooled.values())
    # The pooled median: a burst of other load hits a few iterations, not the median of hundreds, so this ratio is
    # steadier than the per-run ratios (one run = 10-20 iterations, often all in one burst).
    median_template, median_plain = (statistics.median(t) if t else None for t in pooled.values())
    peak_rss = [r["peak_rss_mb"] for r in runs.get("template", []) if "peak_rss_mb" in r]
    peak_rss_plain = [r["peak_rss_mb"] for r in runs.get("plain", []) if "peak_rss_mb" in r]
    record: dict[str, Any] = {
        "name": cell.name,
        "settings": asdict(cell) | {"resolution": args.resolution, "hardware": args.hardware},
        "template_img_per_s": _stats(template),
        "plain_img_per_s": _stats(plain),
        # The plain step captured as CUDA graphs (GPU only): how far the template is from the launch-free limit.
        "graphed_img_per_s": _stats(graphed),
        "template_vs_graphed": statistics.median(template) / statistics.median(graphed)
        if template and graphed
        else None,
        # The template's own iteration as CUDA graphs (hardware.cuda_graphs=true), against the hand-captured step:
        # the template overhead in the graphed execution mode (target: at most 3%, i.e. >= 0.97).
        "template_graphed_img_per_s": _stats(template_graphed),
        "template_graphed_vs_graphed": statistics.median(template_graphed) / statistics.median(graphed)
        if template_graphed and graphed
        else None,
        "overhead": _stats(pairs),  # plain / template - 1, per interleaved pair
        "template_img_per_cpu_s": _stats(template_cpu),  # images per CPU-second (all threads)
        "overhead_cpu_time": _stats(pair_ratios("img_per_cpu_s")),  # the same ratio in process CPU time
        "best_iteration_img_per_s": {"template": best_template, "plain": best_plain},
        "overhead_best_iteration": best_plain / best_template - 1.0 if best_template and best_plain else None,
        "median_iteration_ms": {
            "template": 1000 * median_template if median_template else None,
            "plain": 1000 * median_plain if median_plain else None,
        },
        # template time / plain time - 1 on the pooled per-iteration medians: the overhead figure to quote.
        "overhead_median_iteration": median_template / median_plain - 1.0
        if median_template and median_plain
        else None,
        "peak_rss_mb": _stats(peak_rss),
        "plain_peak_rss_mb": _stats(peak_rss_plain),
        "flops_per_iteration": flops,
        "errors": [r["error"] for kind in runs.values() for r in kind if "error" in r],
    }
    achieved = flops * statistics.median(template) / cell.batch_size if flops and template else None
    peak, source = peak_for(cell.precision, args.hardware, achieved)
    record["peak_flops"] = peak
    record["peak_source"] = source
    if achieved is not None:
        record["achieved_tflops"] = achieved / 1e12
        if peak:
            record["mfu"] = achieved / peak
    if flops and template_graphed and peak:
        record["template_graphed_mfu"] = flops * statistics.median(template_graphed) / cell.batch_size / peak
    return record


def _speedups(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each cell's median template img/s relative to the first cell of the same model and batch (the baseline)."""
    out = {}
    baselines: dict[tuple, dict[str, Any]] = {}
    for record in records:
        key = (record["settings"]["model"], record["settings"]["batch_size"])
        baselines.setdefault(key, record)
        base = baselines[key]
        if record["template_img_per_s"] and base["template_img_per_s"]:
            out[record["name"]] = {
                "vs": base["name"],
                "speedup": record["template_img_per_s"]["median"] / base["template_img_per_s"]["median"],
            }
            best, base_best = (r.get("best_iteration_img_per_s", {}).get("template") for r in (record, base))
            if best and base_best:
                out[record["name"]]["speedup_best_iteration"] = best / base_best
    return out


def _fmt_stats(stats: dict[str, float] | None, scale: float = 1.0, digits: int = 1, suffix: str = "") -> str:
    if not stats:
        return "n/a"
    f = f"{{:.{digits}f}}"
    return (
        f"{f.format(stats['median'] * scale)}{suffix} ({f.format(stats['min'] * scale)} – "
        f"{f.format(stats['max'] * scale)})"
    )


def _fmt_graphed(record: dict[str, Any]) -> str:
    if not record.get("graphed_img_per_s"):
        return "n/a (CUDA only)"
    return f"{_fmt_stats(record['graphed_img_per_s'])} ({record['template_vs_graphed']:.2f}x)"


def _fmt_template_graphed(record: dict[str, Any]) -> str:
    if not record.get("template_graphed_img_per_s"):
        return "n/a (CUDA only)"
    ratio = record.get("template_graphed_vs_graphed")
    mfu = record.get("template_graphed_mfu")
    return (
        _fmt_stats(record["template_graphed_img_per_s"])
        + (f" ({ratio:.2f}x of the graph)" if ratio else "")
        + (f", MFU {100 * mfu:.1f}%" if mfu else "")
    )


def _fmt_speedup(speed: dict[str, Any] | None) -> str:
    if not speed:
        return "n/a"
    best = speed.get("speedup_best_iteration")
    return f"{speed['speedup']:.2f}x" + (f"; {best:.2f}x" if best else "")


def _fmt_median_iteration(record: dict[str, Any]) -> str:
    medians = record.get("median_iteration_ms") or {}
    if not medians.get("template"):
        return "n/a"
    if not medians.get("plain"):
        return f"{medians['template']:.1f}"
    return f"{medians['template']:.1f} / {medians['plain']:.1f} ({100 * record['overhead_median_iteration']:+.1f}%)"


def _fmt_best(record: dict[str, Any]) -> str:
    best = record.get("best_iteration_img_per_s") or {}
    if not best.get("template"):
        return "n/a"
    text = f"{best['template']:.1f} / {best['plain']:.1f}" if best.get("plain") else f"{best['template']:.1f}"
    overhead = record.get("overhead_best_iteration")
    return text + (f" ({100 * overhead:+.1f}%)" if overhead is not None else "")


def bench_markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        "# Pixelsmith benchmark",
        "",
        f"{report['created']} on `{m['cpu']}` ({m['cpu_count']} logical CPUs), torch {m['torch']}, "
        f"hardware={s['hardware']}, {s['resolution']} px, {s['warmup']} warm-up + {s['steps']} timed iterations, "
        f"{s['repeats']} repeats, each run in a fresh process. Load average (1/5/15 min) at start "
        f"{m['load_average_start']}, at end {m['load_average_end']}. Medians with (min – max).",
        "",
        "| cell | template img/s | plain loop img/s | CUDA-graph step img/s (template / graph) | "
        "template with hardware.cuda_graphs img/s | "
        "overhead (plain/template - 1) | overhead in CPU time | "
        "median iteration ms, template / plain (overhead) | best iteration img/s, template / plain | "
        "speedup vs first (median; best iteration) | peak RSS MB | GFLOP/iter | MFU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for record in report["cells"]:
        speed = report["speedups"].get(record["name"])
        flops = record.get("flops_per_iteration")
        cells = [
            record["name"],
            _fmt_stats(record["template_img_per_s"]),
            _fmt_stats(record["plain_img_per_s"]),
            _fmt_graphed(record),
            _fmt_template_graphed(record),
            _fmt_stats(record["overhead"], 100, 1, "%"),
            _fmt_stats(record.get("overhead_cpu_time"), 100, 1, "%"),
            _fmt_median_iteration(record),
            _fmt_best(record),
            _fmt_speedup(speed),
            _fmt_stats(record["peak_rss_mb"], 1, 0),
            f"{flops / 1e9:.2f}" if flops else "n/a",
            f"{100 * record['mfu']:.1f}%" if record.get("mfu") else "n/a",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [(r["name"], e) for r in report["cells"] for e in r["errors"]]
    if errors:
        lines += [
            "",
            "Errors:",
            *[f"- {name}: {error.splitlines()[-1] if error else ''}" for name, error in errors],
        ]
    skipped = report.get("skipped")
    if skipped:
        lines += ["", f"Not run: {', '.join(skipped['cells'])}: {skipped['reason']}"]
    peaks = {r["peak_source"] for r in report["cells"]}
    if any((r.get("mfu") or 0) > 1.0 for r in report["cells"]):
        # A CPU GEMM peak below the achieved FLOP/s is re-measured (peak_for), so this is a datasheet peak.
        lines += [
            "",
            "**MFU above 100%: the datasheet peak is below what the cell achieved, so the GPU's name matched the "
            "wrong entry of `pixelsmith/perf/flops.py` GPU_PEAK_FLOPS or the FLOP count is wrong.**",
        ]
    lines += [
        "",
        "Overhead in CPU time: the same ratio with each run's process CPU time (all threads) instead of wall "
        "time; on a shared machine it absorbs less of other people's load. Median iteration: the median of every "
        "timed iteration of all repeats pooled, template over plain - 1: the overhead figure to quote (a burst of "
        "load moves a few iterations, not the pooled median). Best iteration: the fastest timed iteration over all "
        "repeats (timeit's rule). CUDA-graph step: the plain iteration captured once as CUDA graphs (one with "
        "lazy R1, one without; `benchmarks/plain_loop.py` GraphedPlainGAN) and replayed over a static batch buffer: the "
        "launch-free limit of this step on this GPU; the ratio is template over graph (the target is >= 0.7). "
        "Template with hardware.cuda_graphs: the template's own iteration replayed as CUDA graphs "
        "(`core/graphs.py`), over the hand-captured step (the template's overhead in that mode: target >= 0.97); "
        "the template and plain loop columns run eagerly.",
        "GFLOP/iter: matmul and convolution FLOPs (forward, backward, R1's double backward) of the plain "
        "iteration, averaged over the timed iterations: lazy R1 iterations (every r1_interval-th) count as often "
        "as they ran; bench.json also holds the iteration without and with R1 and the long-run mean.",
        "MFU peaks: " + "; ".join(sorted(peaks)),
    ]
    lines += targets_markdown(report)
    breakdown = report.get("breakdown")
    if breakdown and "markdown" in breakdown:
        lines += [
            "",
            f"## Step-time breakdown: {breakdown['cell']}",
            "",
            breakdown["markdown"].split("\n", 2)[2],
        ]
    lines.append("")
    return "\n".join(lines)


# The performance targets, checked on every report (CPU figures for DCGAN 64 px, batch 64).
TARGET_SPEEDUP = 1.7  # the profile's defaults vs fp32 contiguous eager (the first cell)
TARGET_OVERHEAD = 0.03  # template vs plain loop, pooled median iteration
TARGET_DATA_WAIT = 0.05  # share of the step


def _profile_cell(report: dict[str, Any]) -> dict[str, Any] | None:
    """The cell whose settings are the hardware profile's defaults (None when the matrix does not hold it)."""
    import tempfile

    from hydra.errors import HydraException

    from benchmarks.harness import compose
    from pixelsmith.run.build import resolve_hardware

    try:
        with tempfile.TemporaryDirectory() as scratch:
            cfg = compose([f"hardware={report['settings']['hardware']}"], Path(scratch))
    except (HydraException, PixelsmithError):
        return None
    profile = cfg.hardware
    try:
        # What the profile trains on this machine: the cpu profile's bf16-mixed falls back to 32-true on a CPU
        # without AMX (docs/platforms.md).
        precision = resolve_hardware(cfg).precision
    except PixelsmithError:  # a GPU profile's report rebuilt on a machine without that GPU
        precision = profile.precision
    for record in report["cells"]:
        cell = record["settings"]
        if (
            cell["precision"] == precision
            and cell["channels_last"] == bool(profile.channels_last)
            and cell["compile"] == bool(profile.compile)
            and cell["optimizer"] == (profile.optimizer_impl or "foreach")
        ):
            return record
    return None


def targets_markdown(report: dict[str, Any]) -> list[str]:
    record = _profile_cell(report)
    if record is None:
        return []
    verdict = {True: "**met**", False: "**not met**"}
    name, s = record["name"], report["settings"]
    lines = ["", f"## Targets: the {s['hardware']} profile's defaults ({name})", ""]
    speed = report["speedups"].get(name)
    if speed and speed["vs"] != name:
        value = speed["speedup"]
        lines.append(
            f"- vs {speed['vs']}: {value:.2f}x img/s (median; best iteration "
            f"{speed.get('speedup_best_iteration') or float('nan'):.2f}x), target >= {TARGET_SPEEDUP}x: "
            f"{verdict[value >= TARGET_SPEEDUP]}"
        )
    overhead = record.get("overhead_median_iteration")
    if overhead is not None:
        timed = s["repeats"] * s["steps"]
        lines.append(
            f"- template overhead, pooled median iteration: {100 * overhead:+.1f}% over {timed} timed iterations per "
            f"side, target <= {100 * TARGET_OVERHEAD:.0f}%: {verdict[overhead <= TARGET_OVERHEAD]}"
            + (
                ". Fewer than 100 iterations per side cannot resolve a few percent on a shared machine: rerun this "
                "cell alone with `--repeats 7 --steps 20`."
                if timed < 100
                else ""
            )
        )
    breakdown = report.get("breakdown") or {}
    if breakdown.get("cell") == name and breakdown.get("rows"):
        share = next((float(r["share"]) for r in breakdown["rows"] if r["phase"] == "data_wait"), None)
        if share is not None:
            lines.append(
                f"- data wait: {100 * share:.1f}% of the step, target < {100 * TARGET_DATA_WAIT:.0f}%: "
                f"{verdict[share < TARGET_DATA_WAIT]}"
            )
    return lines


def bench_png(path: Path, report: dict[str, Any]) -> None:
    from pixelsmith.perf.plot import Bar, bar_chart

    def bar(stats):
        return Bar(stats["median"], stats["min"], stats["max"]) if stats else Bar(0.0)

    cells = report["cells"]
    series = [[bar(c["template_img_per_s"]) for c in cells]]
    names = ["template"]
    if any(c["plain_img_per_s"] for c in cells):
        series.append([bar(c["plain_img_per_s"]) for c in cells])
        names.append("plain loop")
    load = report["machine"]["load_average_start"]
    bar_chart(
        path,
        f"images/s, median (min-max) of {report['settings']['repeats']} runs; load avg at start {load}",
        [c["name"] for c in cells],
        series,
        names,
    )


def _cpu_name() -> str:
    from pixelsmith.perf.flops import cpu_model_name

    return cpu_model_name()


def _torch_version() -> str:
    import torch

    return torch.__version__


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(
        prog="python bench.py",
        description="Benchmark the template against a plain PyTorch loop (see docs/performance.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--full", action="store_true", help="the full matrix (long: compile cells cold-start)"
    )
    models = gan_models()
    parser.add_argument(
        "--models",
        nargs="+",
        type=one_of(models, "GAN model of conf/model"),
        default=None,
        help=" ".join(models),
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        type=one_of(PRECISIONS, "precision"),
        default=None,
        help=" ".join(PRECISIONS),
    )
    parser.add_argument("--channels-last", nargs="+", type=true_or_false, default=None, dest="channels_last")
    parser.add_argument("--compile", nargs="+", type=true_or_false, default=None)
    parser.add_argument("--batch-sizes", nargs="+", type=count, default=None, dest="batch_sizes")
    optimizers = [o.value for o in OptimizerImpl]
    parser.add_argument(
        "--optimizers",
        nargs="+",
        type=one_of(optimizers, "Adam implementation"),
        default=None,
        help=" ".join(optimizers),
    )
    parser.add_argument("--resolution", type=power_of_two(4), default=64)
    profiles = conf_names("hardware")
    parser.add_argument(
        "--hardware",
        type=one_of(profiles, "hardware profile of conf/hardware"),
        default="cpu",
        help=f"hardware profile of every run ({' '.join(profiles)}; auto on a GPU machine)",
    )
    parser.add_argument("--repeats", type=count, default=3)
    parser.add_argument(
        "--warmup", type=count, default=3, help="at least 1: the timed window starts after one"
    )
    parser.add_argument("--steps", type=count, default=10)
    parser.add_argument("--threads", type=count, default=None, help="torch.set_num_threads in each run")
    parser.add_argument(
        "--no-plain", action="store_true", help="skip the plain-loop runs (no overhead ratio)"
    )
    parser.add_argument(
        "--no-graph",
        action="store_true",
        help="skip the CUDA-graph column (the plain step captured as CUDA graphs; runs on CUDA machines only)",
    )
    parser.add_argument(
        "--no-breakdown",
        action="store_false",
        dest="breakdown",
        help="skip the extra profiler=breakdown run of the last cell",
    )
    parser.add_argument(
        "--emulated-bf16",
        action="store_true",
        dest="emulated_bf16",
        help="run bf16-mixed cells on a CPU without native bf16 (AVX512-BF16/AMX) too: skipped by default, as they "
        "time an emulation",
    )
    parser.add_argument("--override", nargs="*", default=None, help="extra Hydra overrides for every run")
    parser.add_argument("--out", default=None, help="run dir (default outputs/bench/<timestamp>)")
    parser.add_argument("--timeout", type=seconds, default=1800.0, help="seconds per run")
    parser.add_argument(
        "--report-from",
        default=None,
        dest="report_from",
        help="rebuild bench.json/md/png in this run dir from its runs (same matrix options as the original run)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        result = child_main(json.loads(args.child))
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    if args.report_from is not None:
        report = write_report(check_report_from(args), args, None, None)
        print(f"bench: rebuilt the report of {len(report['cells'])} cells in {args.report_from}", flush=True)
        return 0
    check_matrix(args)
    report = run_matrix(args)
    failed = [(r["name"], len(r["errors"])) for r in report["cells"] if r["errors"]]
    if failed:
        # A report with failed runs (rows of n/a) is not a measurement: the exit status says so.
        runs = ", ".join(f"{name} ({n})" for name, n in failed)
        print(
            f"bench: runs failed in {len(failed)} cell(s): {runs}; the Errors list in bench.md says why",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
