"""The whole GPU check in one command, in stages of at most 9 minutes each (a GPU machine gives a command 10):

    python -m benchmarks.gpu_check --stage tests [--out DIR]   # pytest -m gpu --durations=20
    python -m benchmarks.gpu_check --stage train [--out DIR]   # the main job: wall time, img/s, stop reason, FID
    python -m benchmarks.gpu_check --stage bench [--out DIR]   # DCGAN-64 and StyleGAN2-256: img/s, MFU, ratios
    python -m benchmarks.gpu_check --stage style [--out DIR]   # 8K stylize, style training vs fast_neural_style, no-sync
    python -m benchmarks.gpu_check --stage data [--out DIR]    # decoded img/s per source and decoder, nvJPEG, step

Each stage writes one markdown table, `DIR/<stage>.md`, and the same rows as JSON beside it (`DIR/<stage>.json`),
headed by the device, the torch/CUDA versions and the command; the runs it starts go under `--work-dir` (default
`DIR/<stage>_runs`). Every sub-step runs in a child process with its own time limit, cut to what is left of the
stage's (`--time-limit`, 540 s): a sub-step that fails, hangs or finds no time left becomes a row that says so, and
the table is rewritten after every sub-step, so a stage always leaves its table. Everything a stage starts runs with
`train.time_budget_minutes=null` (the main job's 4.5-minute budget is for a CPU).

Without CUDA (or with `--device cpu`) every size shrinks to something tiny (a few iterations, a 256-px stylize) and
the header says these are CPU dry-run numbers: the tool's logic runs end to end anywhere (tests/test_gpu_check.py).

The bench stage reuses `benchmarks.gan_bench`'s child runs (`run_child`: template, plain loop, the plain step
captured as CUDA graphs) and adds a template column with `hardware.cuda_graphs=true` (the template's own iteration
captured); the style stage reuses `benchmarks.style_bench`'s (the template eager and with `hardware.cuda_graphs=true`,
fast_neural_style's published method, the plain loop). The speed targets, and style training's
(template with cuda_graphs >= 1.5x fast_neural_style at 256 px, batch 4), are printed as ratios measured in the same
run, never asserted.
"""

from __future__ import annotations

import argparse
import csv
import json
import operator
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.arguments import (
    CommandLineError,
    Parser,
    amount,
    check_output_folder,
    nvlabs_checkout,
    one_of,
    refusals_exit_2,
    true_or_false,
)
from benchmarks.child import CHECKOUT, child_env
from pixelsmith.errors import PixelsmithError

STAGES = ("tests", "train", "bench", "startup", "style", "data")
STAGE_SECONDS = 540.0  # 9 minutes: the GPU machine's limit per command is 10
RESERVE_SECONDS = 15.0  # kept back from every sub-step: writing the table, a killed child's clean-up
MIN_STEP_SECONDS = 10.0  # a sub-step offered less than this is skipped (and the row says so)
# On every run a stage starts: the main job's 4.5-minute budget is for a CPU, and a cold compile can eat it.
NO_BUDGET = "train.time_budget_minutes=null"
DRY_RUN_NOTE = (
    "**CPU dry run**: no CUDA here (or `--device cpu`), so every size is shrunk to check the tool's logic end to "
    "end. These are CPU dry-run numbers, not GPU figures; targets are not checked."
)


# ---- time limits and child processes -----------------------------------------------------------------------------
class Deadline:
    """The stage's time limit: what each sub-step may still take."""

    def __init__(self, seconds: float, clock=time.monotonic):
        self.clock = clock
        self.start = clock()
        self.seconds = seconds

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        return self.seconds - self.elapsed()

    def timeout_for(self, cap: float) -> float | None:
        """Seconds for the next sub-step: `cap`, cut to what is left after the reserve; None when too little is."""
        available = min(cap, self.remaining() - RESERVE_SECONDS)
        return available if available >= MIN_STEP_SECONDS else None


@dataclass
class StepOutcome:
    """How a child process ended: its exit status (None when it was killed at its time limit) and its output."""

    returncode: int | None
    timed_out: bool
    seconds: float
    log_path: Path
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, lines: int = 12) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])

    def problem(self) -> str:
        """One line for the table: why this step did not succeed."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s (killed; log: {self.log_path})"
        last = next((line for line in reversed(self.output.strip().splitlines()) if line.strip()), "")
        return f"exit {self.returncode}: {last[:300]}"


def run_bounded(command: list[str], timeout: float, log_path: Path, env: dict[str, str] | None = None):
    """Run `command` (in the checkout) with its output in `log_path`; kill its whole process group at `timeout`.

    A file, not a pipe: a grandchild that outlives a killed child (a compile worker, a loader worker) cannot keep
    this process waiting for the pipe to close."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        process = subprocess.Popen(
            command,
            cwd=CHECKOUT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env if env is not None else child_env(HYDRA_FULL_ERROR="1"),
            start_new_session=True,  # its own process group: the kill reaches its children too
        )
        timed_out = False
        try:
            returncode: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process)
            returncode = None
    output = log_path.read_text(errors="replace")
    return StepOutcome(returncode, timed_out, time.monotonic() - started, log_path, output)


def _kill_group(process: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- the environment and the report ----------------------------------------------------------------------------
@dataclass
class Environment:
    """What the header names: the device the stage measures and the software."""

    device: str  # "cuda" or "cpu": what the stage runs on
    device_name: str
    torch: str
    cuda: str | None
    cudnn: int | None
    driver: str | None
    python: str

    @property
    def dry_run(self) -> bool:
        return self.device != "cuda"


PROBE = (
    "import json, platform, torch\n"
    "cuda = torch.cuda.is_available()\n"
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_available': cuda,\n"
    "    'device_name': torch.cuda.get_device_name(0) if cuda else None,\n"
    "    'cudnn': torch.backends.cudnn.version() if cuda else None, 'python': platform.python_version()}))\n"
)


class NoCudaError(PixelsmithError):
    """`--device cuda` on a machine where torch sees no CUDA device."""


def probe_environment(choice: str, work: Path) -> Environment:
    """Ask a child process (this one stays off the GPU: its memory belongs to the sub-steps)."""
    outcome = run_bounded([sys.executable, "-c", PROBE], 120.0, work / "environment.log")
    found = {}
    for line in reversed(outcome.output.splitlines()):
        if line.startswith("{"):
            found = json.loads(line)
            break
    cuda = bool(found.get("cuda_available"))
    if choice == "cuda" and not cuda:
        problem = "" if outcome.ok else f" (the probe: {outcome.problem()})"
        raise NoCudaError(
            f"--device cuda, but torch sees no CUDA device here{problem}. Nothing was measured. Fix: --device auto "
            "or --device cpu (the shrunk CPU dry run)."
        )
    device = "cuda" if cuda and choice in ("auto", "cuda") else "cpu"
    if device == "cuda":
        name = found.get("device_name") or "unknown CUDA device"
    else:
        from pixelsmith.perf.flops import cpu_model_name

        name = f"{cpu_model_name()} ({os.cpu_count()} logical CPUs)"
    return Environment(
        device=device,
        device_name=name,
        torch=found.get("torch", "unknown"),
        cuda=found.get("cuda"),
        cudnn=found.get("cudnn"),
        driver=_driver_version() if device == "cuda" else None,
        python=found.get("python", "unknown"),
    )


def _driver_version() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


@dataclass
class StageReport:
    """One stage's table: the header, the columns, the rows; `write` puts the markdown and the JSON in `out`."""

    stage: str
    columns: list[str]
    environment: Environment
    command: str
    time_limit: float
    out: Path
    work: Path  # where the stage's runs and logs go
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.now().isoformat(timespec="seconds"))
    seconds: float = 0.0
    elapsed: Callable[[], float] | None = None  # the stage's clock: each write states the time taken so far

    def add(self, **row: Any) -> dict[str, Any]:
        unknown = set(row) - set(self.columns) - {"status", "data"}
        if unknown:
            raise ValueError(f"{sorted(unknown)} are no column of the {self.stage} table: {self.columns}")
        self.rows.append(row)
        return row

    @property
    def md_path(self) -> Path:
        return self.out / f"{self.stage}.md"

    def markdown(self) -> str:
        env = self.environment
        software = f"torch {env.torch}" + (f", CUDA {env.cuda}" if env.cuda else ", no CUDA build")
        if env.cudnn:
            software += f", cuDNN {env.cudnn}"
        if env.driver:
            software += f", driver {env.driver}"
        lines = [
            f"# GPU check: {self.stage}",
            "",
            f"- device: **{env.device_name}** ({env.device})",
            f"- software: {software}, Python {env.python}",
            f"- command: `{self.command}`",
            f"- started {self.started}, took {self.seconds:.0f} s of the stage's {self.time_limit:.0f} s",
        ]
        if env.dry_run:
            lines += ["", DRY_RUN_NOTE]
        lines += ["", "| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        for row in self.rows:
            lines.append("| " + " | ".join(_cell(row.get(c)) for c in self.columns) + " |")
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        if self.elapsed is not None:
            self.seconds = self.elapsed()
        self.out.mkdir(parents=True, exist_ok=True)
        self.md_path.write_text(self.markdown())
        document = {
            "stage": self.stage,
            "command": self.command,
            "environment": asdict(self.environment) | {"dry_run": self.environment.dry_run},
            "started": self.started,
            "seconds": self.seconds,
            "time_limit": self.time_limit,
            "columns": self.columns,
            "rows": self.rows,
            "notes": self.notes,
        }
        (self.out / f"{self.stage}.json").write_text(json.dumps(document, indent=2, default=str))
        return self.md_path


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        value = f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    # A failure message may hold a pipe or a line break: neither may split the table.
    return str(value).replace("|", "\\|").replace("\n", " ")


# ---- stage: tests ----------------------------------------------------------------------------------------------
@dataclass
class PytestSummary:
    """What a pytest run printed: the counts, each failure or error with its message, the slowest steps, and for a
    run that was cut off, the test that was running."""

    counts: dict[str, int] = field(default_factory=dict)
    seconds: float | None = None
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (FAILED|ERROR, node id, message)
    slowest: list[tuple[float, str, str]] = field(
        default_factory=list
    )  # (seconds, setup|call|teardown, node id)
    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> PASSED/FAILED/... (verbose output)
    running: str | None = None  # the node id printed without an outcome (the run stopped inside it)


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")
_FINAL = re.compile(r"^=+ (.*?) in ([\d.]+)s(?: \([\d:]+\))? =+$")
_SLOW = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S.*)$")
_SHORT = re.compile(r"^(FAILED|ERROR) (.+?)(?: - (.*))?$")
_VERBOSE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
_STARTED = re.compile(r"^(\S+\.py::.+?)\s*$")


def parse_pytest_output(text: str) -> PytestSummary:
    """Parse `pytest -v -ra --durations=N` output (complete, or cut off by a time limit)."""
    summary = PytestSummary()
    for line in text.splitlines():
        line = line.rstrip()
        final = _FINAL.match(line)
        if final and _COUNT.search(final.group(1)):
            for number, word in _COUNT.findall(final.group(1)):
                key = {"error": "errors", "warning": "warnings"}.get(word, word)
                summary.counts[key] = int(number)
            summary.seconds = float(final.group(2))
            continue
        slow = _SLOW.match(line)
        if slow:
            summary.slowest.append((float(slow.group(1)), slow.group(2), slow.group(3).strip()))
            continue
        short = _SHORT.match(line)
        if short:
            summary.failures.append((short.group(1), short.group(2), (short.group(3) or "").strip()))
            continue
        verbose = _VERBOSE.match(line)
        if verbose:
            summary.outcomes[verbose.group(1)] = verbose.group(2)
            continue
        started = _STARTED.match(line)
        if started:
            summary.running = started.group(1)
    if summary.running in summary.outcomes:
        summary.running = None
    if not summary.counts and summary.outcomes:  # cut off before the final line: count what was printed
        for outcome in summary.outcomes.values():
            key = {"ERROR": "errors"}.get(outcome, outcome.lower())
            summary.counts[key] = summary.counts.get(key, 0) + 1
    return summary


def stage_tests(args, env: Environment, report: StageReport, deadline: Deadline) -> None:
    selection = shlex.split(args.pytest_args) if args.pytest_args else ["-m", "gpu"]
    command = [
        sys.executable,
        "-m",
        "pytest",
        *selection,
        "-v",
        "-ra",
        "--durations=20",
        "-p",
        "no:cacheprovider",
    ]
    timeout = deadline.timeout_for(args.time_limit)
    if timeout is None:
        report.add(
            row="pytest", what=shlex.join(selection), result="skipped", detail="no time left", status="skip"
        )
        return
    extra = {"PIXELSMITH_GPU_TESTS_ON_CPU": "1"} if env.dry_run and args.gpu_tests_on_cpu else {}
    # pytest cuts a failure's message to the terminal width: a long test id would leave none of it.
    extra["COLUMNS"] = "500"
    outcome = run_bounded(command, timeout, report.work / "pytest.log", child_env(**extra))
    summary = parse_pytest_output(outcome.output)
    counts = ", ".join(f"{n} {k}" for k, n in summary.counts.items() if k != "warnings") or "nothing ran"
    if outcome.timed_out:
        result, status = f"timed out after {outcome.seconds:.0f} s; before that: {counts}", "timeout"
    elif summary.counts.get("failed") or summary.counts.get("errors"):
        result, status = counts, "fail"
    elif outcome.returncode == 5:
        # pytest's "no tests collected": a selection that names nothing checks nothing.
        result = (
            f"no test was selected: `{shlex.join(selection)}` matched none (pytest exit 5; {counts}); check the "
            "-m / -k expression and the paths in --pytest-args"
        )
        status = "fail"
    elif outcome.returncode == 0:
        result, status = counts, "ok"
    else:
        result, status = f"{counts}; {outcome.problem()}", "fail"
    report.add(
        row="pytest",
        what=shlex.join(["pytest", *selection, "--durations=20"]),
        result=result,
        detail=f"{summary.seconds or outcome.seconds:.0f} s (log: {outcome.log_path})",
        status=status,
        data={"counts": summary.counts, "seconds": summary.seconds, "returncode": outcome.returncode},
    )
    if outcome.timed_out and summary.running:
        report.add(row="running at the time limit", what=summary.running, result="cut off", status="timeout")
    for kind, node, message in summary.failures:
        report.add(row=kind.lower(), what=node, result=kind, detail=message or "(see the log)", status="fail")
    for seconds, when, node in summary.slowest:
        report.add(row="slow", what=node, result=f"{seconds:.2f} s", detail=when, status="info")


# ---- stage: train ----------------------------------------------------------------------------------------------
# The main job, shrunk for a CPU dry run: a few iterations with an evaluation between them.
TRAIN_DRY_RUN = [
    "hardware=cpu",
    "max_steps=4",
    "data.limit=128",
    "data.batch_size=16",
    "eval.every_n_steps=2",
    "eval.num_samples=100",
    "eval.reference_samples=100",
    "train.log_every_n_steps=2",
    "train.progress_bar=false",
]
TARGET_MAIN_JOB_IMG_PER_S = 150_000.0  # the main job (32 px, batch 256) on an H100-class GPU


def read_run_dir(run_dir: Path) -> dict[str, Any]:
    """What a finished (or stopped) run left: final metrics, the FID curve, the img/s logged along the way."""
    found: dict[str, Any] = {}
    final = run_dir / "final_metrics.json"
    if final.is_file():
        found["final"] = json.loads(final.read_text())
    history = run_dir / "eval_history.json"
    if history.is_file():
        found["fid_curve"] = [
            (int(entry["iteration"]), float(entry["fid"]))
            for entry in json.loads(history.read_text()).get("history", [])
            if "fid" in entry
        ]
    metrics = run_dir / "metrics.csv"
    if metrics.is_file():
        with open(metrics) as handle:
            reader = csv.DictReader(handle)
            found["img_per_s"] = [float(r["img/s"]) for r in reader if r.get("img/s")]
            found["metrics_csv"] = f"columns {', '.join(reader.fieldnames or [])[:200]}"
    resolved = run_dir / "config_resolved.yaml"
    if resolved.is_file():
        from omegaconf import OmegaConf

        config = OmegaConf.load(resolved)
        found["batch_size"] = OmegaConf.select(config, "data.batch_size")
        found["max_steps"] = OmegaConf.select(config, "max_steps")
    return found


def stage_train(args, env: Environment, report: StageReport, deadline: Deadline) -> None:
    run_dir = report.work / "main_job"
    overrides = [NO_BUDGET, f"hydra.run.dir={run_dir}", *(TRAIN_DRY_RUN if env.dry_run else [])]
    command = [sys.executable, "train.py", *overrides]
    shown = "python train.py " + " ".join(overrides)
    timeout = deadline.timeout_for(args.time_limit)
    if timeout is None:
        report.add(measure="the main job", value="skipped: no time left", status="skip")
        return
    outcome = run_bounded(command, timeout, report.work / "main_job.log")
    run = read_run_dir(run_dir)
    final = run.get("final", {})
    report.add(measure="command", value=f"`{shown}`", status="info")
    status = "ok" if outcome.ok else "timeout" if outcome.timed_out else "fail"
    report.add(
        measure="process",
        value="finished" if outcome.ok else outcome.problem(),
        status=status,
        data={"returncode": outcome.returncode, "log": str(outcome.log_path)},
    )
    report.add(
        measure="wall time (process, start-up and evaluations included)", value=f"{outcome.seconds:.1f} s"
    )
    iterations, batch = final.get("iteration"), run.get("batch_size")
    report.add(
        measure="iterations, stop reason",
        value=f"{iterations:.0f} of {run.get('max_steps')}, {final.get('stop_reason')}"
        if final
        else "no result",
        status="ok" if final.get("stop_reason") == "max_steps" else "fail" if final else status,
    )
    rates = run.get("img_per_s") or []
    if not rates and final.get("img/s"):
        # metrics.csv held no rate (no logger wrote one, or the run stopped before): the last interval's, from
        # final_metrics.json, and a row that says which files were read.
        rates = [float(final["img/s"])]
        report.add(
            measure="img/s source",
            value=f"final_metrics.json (metrics.csv: {run.get('metrics_csv', 'absent')})",
            status="info",
        )
    elif not rates:
        report.add(
            measure="img/s source",
            value=f"none: metrics.csv {run.get('metrics_csv', 'absent')}; final_metrics.json "
            + ("has no img/s" if final else "absent"),
            status="fail" if outcome.ok else status,
        )
    # The first logged rates hold the compile and the first evaluation: the median of the rest is the pace.
    steady = rates[2:] or rates
    if steady and not batch:
        report.add(measure="img/s", value="no data.batch_size in config_resolved.yaml", status="fail")
    if steady and batch:
        pace = statistics.median(steady)
        report.add(
            measure="img/s (median of the logged rates after the first two; it/s)",
            value=f"{pace:,.0f} img/s ({pace / batch:,.1f} it/s at batch {batch})",
            status="info",
            data={"img_per_s": rates, "batch_size": batch},
        )
        if not env.dry_run:
            met = pace >= TARGET_MAIN_JOB_IMG_PER_S
            report.add(
                measure=f"target: at least {TARGET_MAIN_JOB_IMG_PER_S:,.0f} img/s",
                value=f"{pace / TARGET_MAIN_JOB_IMG_PER_S:.2f}x of it",
                status="met" if met else "not met",
            )
    curve = run.get("fid_curve") or []
    report.add(
        measure="FID curve (iteration: FID, eval_history.json)",
        value=", ".join(f"{i}: {fid:.1f}" for i, fid in curve) or "no evaluation recorded",
        status="info" if curve else "fail",
        data={"fid_curve": curve},
    )
    if "eval/best_fid" in final:
        report.add(
            measure="best FID",
            value=f"{final['eval/best_fid']:.2f} at {final.get('eval/best_iteration'):.0f}",
        )
    report.add(measure="run dir", value=str(run_dir), status="info")


# ---- stage: startup --------------------------------------------------------------------------------------------
TARGET_FIRST_ITERATION_COLD_S = 60.0  # from the command to the first iteration, empty compile cache
TARGET_FIRST_ITERATION_WARM_S = 20.0


def stage_startup(args, env: Environment, report: StageReport, deadline: Deadline) -> None:
    """`benchmarks.startup` per preset: the first iteration's time after launch (cold, then warm compile cache),
    compile per network, graphs, recompiles, breaks, captures and the steady img/s; the targets as ratios."""
    from benchmarks import startup

    rows = startup.CPU_DRY_ROWS if env.dry_run else startup.GPU_ROWS
    if args.only:
        rows = tuple(r for r in rows if any(part in r.label for part in args.only))
    caches = ("cold",) if env.dry_run else ("cold", "warm")
    end = time.monotonic() + max(deadline.remaining() - RESERVE_SECONDS, 0.0)
    for row, state, result in startup.measure(rows, caches, report.work, args.step_limit, end):
        cells = startup.describe(result)
        metrics = result.get("metrics") or {}
        first = metrics.get("startup/first_iteration_s")
        if first is None:
            status = "skip" if "no time left" in str(result.get("problem")) else "fail"
        elif env.dry_run:
            status = "ok"
        else:
            target = TARGET_FIRST_ITERATION_COLD_S if state == "cold" else TARGET_FIRST_ITERATION_WARM_S
            status = "met" if first <= target else "not met"
        report.add(
            preset=row.label,
            cache=state,
            first_iteration=cells.get("first iteration"),
            compile=cells.get("compile", cells.get("detail")),
            counts=cells.get("graphs / recompiles / breaks"),
            captures=cells.get("captures"),
            img_per_s=cells.get("img/s (last logged)"),
            status=status,
            data=result,
        )
        report.write()
    report.notes.append(
        f"Targets on an H100-class GPU: the first iteration within {TARGET_FIRST_ITERATION_COLD_S:.0f} s of the command "
        f"from an empty compile cache, within {TARGET_FIRST_ITERATION_WARM_S:.0f} s from a warm one. The first run of "
        "each plan is split in the runs' logs into torch.compile and the rest (first kernels, cuDNN autotuning)."
    )


# ---- stage: bench ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchCell:
    """A benchmark cell: a `benchmarks.gan_bench.Cell` with the resolution, extra overrides and iterations."""

    label: str
    model: str
    precision: str
    batch_size: int
    resolution: int
    kinds: tuple[str, ...]
    extra: tuple[str, ...] = ()
    warmup: int = 10
    steps: int = 100


KIND_LABELS = {
    "template": "template",
    "template_graphs": "template, hardware.cuda_graphs=true",
    "plain": "plain loop",
    "graphed": "hand-captured graph (plain step)",
    "template_graphs_quiet": "template, hardware.cuda_graphs=true, no logging in the window",
}
ALL_KINDS = ("template", "template_graphs", "plain", "graphed")
# The template's logging interval in the bench cells (train.log_every_n_steps' default): the quiet kind sets it past
# the timed window, so the two graphed kinds' rates give a logging iteration's cost in ordinary iterations.
BENCH_LOG_EVERY = 10
# Iterations profiled after each DCGAN run's timed window (`benchmarks.harness.KernelProfile`): the device's kernel
# time and count per iteration and the costliest kernels, per kind and precision. Where two kinds' img/s differ,
# this says whether the device's work differs (kernels, their time) or only how the host feeds it.
PROFILE_ITERATIONS = 10
# NVlabs StyleGAN2 paper256 widths (cbase 16384, cmax 512, 8 mapping layers, 512-d z and w).
STYLEGAN2_PAPER256 = (
    "model.generator.z_dim=512",
    "model.generator.w_dim=512",
    "model.generator.mapping_layers=8",
    "model.generator.channel_base=16384",
    "model.generator.channel_max=512",
    "model.discriminator.channel_base=16384",
    "model.discriminator.channel_max=512",
    "data.limit=1024",  # 1,024 digits upsampled to 256 px are plenty for a throughput cell
)
# R3GAN at the ffhq64 preset's widths (the reference's FFHQ-64 configuration), gamma as the preset starts.
R3GAN_FFHQ64 = (
    "model.generator.z_dim=64",
    "model.generator.widths=[768,768,768,768,384]",
    "model.generator.groups=[96,96,96,96,48]",
    "model.objective.gamma=2.0",
    "data.limit=2048",
)
# The same cells with tiny networks for a CPU dry run.
DCGAN_TINY = ("model.generator.ngf=8", "model.discriminator.ndf=8", "data.limit=256")
STYLEGAN2_TINY = (
    "model.generator.z_dim=32",
    "model.generator.w_dim=32",
    "model.generator.mapping_layers=2",
    "model.generator.channel_base=512",
    "model.generator.channel_max=32",
    "model.discriminator.channel_base=512",
    "model.discriminator.channel_max=32",
    "data.limit=256",
)


def bench_cells(dry_run: bool) -> list[BenchCell]:
    """In priority order: the time limit cuts from the end."""
    if dry_run:
        return [
            BenchCell("DCGAN-32 b8 bf16-mixed", "dcgan", "bf16-mixed", 8, 32, (*ALL_KINDS, "template_graphs_quiet"),
                      DCGAN_TINY, 1, 2),
            BenchCell("DCGAN-32 b8 32-true", "dcgan", "32-true", 8, 32, ALL_KINDS, DCGAN_TINY, 1, 2),
            BenchCell("StyleGAN2-32 tiny b4 bf16-mixed", "stylegan2", "bf16-mixed", 4, 32, ("template", "plain"),
                      STYLEGAN2_TINY, 1, 2),
        ]  # fmt: skip
    return [
        BenchCell("DCGAN-64 b64 bf16-mixed", "dcgan", "bf16-mixed", 64, 64, (*ALL_KINDS, "template_graphs_quiet")),
        BenchCell("DCGAN-64 b64 32-true", "dcgan", "32-true", 64, 64, ALL_KINDS),
        # Lazy R1 (every 16) and path length (every 4) on, as model=stylegan2 runs them; 40 timed iterations hold
        # both in their proportion. 16-mixed: fp16 in the top 4 resolutions with clamp 256, NVlabs' configuration.
        BenchCell("StyleGAN2-256 paper width b32 bf16-mixed", "stylegan2", "bf16-mixed", 32, 256,
                  ("template", "template_graphs", "plain"), STYLEGAN2_PAPER256, 48, 48),
        BenchCell("StyleGAN2-256 paper width b32 16-mixed", "stylegan2", "16-mixed", 32, 256,
                  ("template", "template_graphs", "plain"), STYLEGAN2_PAPER256, 48, 48),
        BenchCell("R3GAN-64 ffhq64 width b512 bf16-mixed", "r3gan", "bf16-mixed", 512, 64,
                  ("template", "template_graphs", "plain"), R3GAN_FFHQ64, 10, 40),
    ]  # fmt: skip


def bench_schedule(cells: list[BenchCell]) -> list[tuple[BenchCell, str]]:
    """(cell, kind) in the order they run: what the DCGAN ratios need first (bf16: the template with graphs, the
    hand-captured graph, the template eager, the plain loop, the quiet graphed template), then the later cells'
    graphed template and plain loop, then the rest; a short stage drops the end of this list."""
    first = cells[0]
    order = [
        (first, kind)
        for kind in ("template_graphs", "graphed", "template", "plain", "template_graphs_quiet")
        if kind in first.kinds
    ]
    later = [(cell, kind) for cell in cells[1:] for kind in cell.kinds]
    priority = ("template_graphs", "plain", "template", "graphed")
    later.sort(
        key=lambda item: (
            priority.index(item[1]) if item[1] in priority else len(priority),
            cells.index(item[0]),
        )
    )
    return order + later


def _gan_spec(
    cell: BenchCell, kind: str, env: Environment, args, work: Path, count_flops: bool
) -> dict[str, Any]:
    from benchmarks.gan_bench import Cell

    extra = [NO_BUDGET, *cell.extra]
    # Quiet: the timed window holds no logging iteration (nor does the logging kind's hold the run's last iteration,
    # which reads at once: `gan_bench.template_iterations` runs past the window and the profiled iterations).
    quiet = kind == "template_graphs_quiet"
    extra.append(f"train.log_every_n_steps={cell.warmup + cell.steps + 1 if quiet else BENCH_LOG_EVERY}")
    gpu = not env.dry_run
    return {
        "hardware": "auto" if gpu else "cpu",
        "resolution": cell.resolution,
        "warmup": cell.warmup,
        "steps": cell.steps,
        "threads": None,
        "extra_overrides": extra,
        # gan_bench sets hardware.cuda_graphs from the kind: true for "template_graphed", false for "template".
        "kind": "template_graphed" if kind.startswith("template_graphs") else kind,
        # The GPU profiles' switches (compile, channels_last, fused Adam); a dry run does not compile.
        "cell": asdict(
            Cell(cell.model, cell.precision, True, gpu and args.compile, cell.batch_size, "fused")
        ),
        "output_dir": str(work / re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{cell.label}_{kind}")),
        "profile_iterations": PROFILE_ITERATIONS if cell.model == "dcgan" else 0,
        "count_flops": count_flops,  # once per cell: the same networks do the same FLOPs in every kind
    }


def run_gan_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """`benchmarks.gan_bench.run_child` (one fresh interpreter per run), a time-out turned into a result."""
    from benchmarks import gan_bench

    try:
        return gan_bench.run_child(spec, timeout)
    except subprocess.TimeoutExpired:
        return {
            "kind": spec["kind"],
            "cell": spec["cell"],
            "error": f"timed out after {timeout:.0f} s (killed)",
        }


def peak_flops(precision: str, env: Environment) -> tuple[float | None, str]:
    """MFU's denominator, found without touching the GPU here: datasheet peaks by device name on CUDA (32-true
    against TF32: the GPU profiles enable it), the measured GEMM peak on a CPU."""
    from pixelsmith.perf import flops

    if env.device == "cuda":
        key = {"bf16-mixed": "bf16", "16-mixed": "fp16"}.get(precision, "tf32")
        value = flops.gpu_peak_flops(env.device_name, key)
        return value, f"{key}: datasheet dense peak for {env.device_name}" if value else f"{key}: unknown GPU"
    key = flops.peak_precision_key(precision, "cpu")
    try:
        value, source = flops.cpu_peak_flops(key, measure=_no_measurement)
    except LookupError:
        # Measuring takes seconds to minutes (an emulated bf16 GEMM on a CPU without bf16 units): not in a dry run.
        return (
            None,
            f"{key}: no cached CPU GEMM peak (python -m pixelsmith.perf.flops --refresh measures one)",
        )
    return value, f"{key}: {source}"


def _no_measurement(dtype) -> float:
    raise LookupError(f"no cached CPU GEMM peak for {dtype}")


def stage_bench(args, env: Environment, report: StageReport, deadline: Deadline) -> None:
    cells = bench_cells(env.dry_run)
    if args.only:
        cells = [c for c in cells if any(part.lower() in c.label.lower() for part in args.only)]
    results: dict[tuple[str, str], dict[str, Any]] = {}
    flops_of: dict[str, float] = {}
    for cell, kind in bench_schedule(cells):
        timeout = deadline.timeout_for(args.step_limit)
        if timeout is None:
            results[cell.label, kind] = {"skipped": f"no time left in the stage's {deadline.seconds:.0f} s"}
        else:
            spec = _gan_spec(cell, kind, env, args, report.work, cell.label not in flops_of)
            result = run_gan_child(spec, timeout)
            results[cell.label, kind] = result
            if "flops_per_iteration" in result:
                flops_of[cell.label] = result["flops_per_iteration"]
        _bench_rows(report, cells, results, flops_of, env)
        report.write()
    if getattr(args, "nvlabs_path", None) and not args.only:
        _nvlabs_phases(args, env, report, deadline)
    peaks = sorted(
        {row["data"]["peak_source"] for row in report.rows if row.get("data", {}).get("peak_source")}
    )
    report.notes = [
        "img/s: `benchmarks.gan_bench` child runs, one fresh process each (warm-up, compile and capture before the "
        "timed iterations). MFU = FLOPs per iteration (matmuls and convolutions, counted once per cell) x "
        "iterations/s / peak; peaks: " + ("; ".join(peaks) or "none known") + ".",
        "Ratios are the targets, measured in this run. A cell skipped for time runs alone with "
        "`--only <part of its name>` (e.g. `--only 32-true`, `--only StyleGAN2`).",
    ]
    report.notes += host_notes(cells, results)


def host_notes(cells, results) -> list[str]:
    """Where the eager kinds' host time goes (cProfile over the profiled iterations): their costliest functions by
    time spent in each itself, per iteration. The eager template against the plain loop is a question of host time."""
    notes = []
    for cell in cells:
        for kind in ("template", "plain"):
            profile = (results.get((cell.label, kind)) or {}).get("profile") or {}
            top = profile.get("python_top")
            if top:
                functions = "; ".join(f"`{row['function']}` {row['self_us']:.0f} us" for row in top[:6])
                notes.append(
                    f"Host, {cell.label}, {KIND_LABELS[kind]} ({profile['wall_ms_per_iteration']:.1f} ms an "
                    f"iteration under the profilers): {functions}."
                )
    return notes


TARGET_PHASE_RATIO_NVLABS = 1.5  # StyleGAN2 paper256: ours at least 1.5x NVlabs' networks on every phase


def _nvlabs_phases(args, env: Environment, report: StageReport, deadline: Deadline) -> None:
    """`benchmarks.sg2_reference`: our StyleGAN2 (bf16, compiled) against NVlabs' own networks (their paper
    configuration, fp16 in the top 4 resolutions, their CUDA ops where nvcc builds them) per phase, at paper256 width
    and batch 32 on a GPU (tiny on a CPU dry run)."""
    from benchmarks.sg2_reference import PHASES, RESULT_PREFIX

    sizes = (
        ["--resolution", "16", "--batch-size", "4", "--z-dim", "16", "--mapping-layers", "1", "--channel-base", "128",
         "--channel-max", "16", "--repeats", "1", "--warmup", "1"]
        if env.dry_run
        else ["--resolution", "256", "--batch-size", "32", "--z-dim", "512", "--mapping-layers", "8",
              "--channel-base", "16384", "--channel-max", "512", "--repeats", "5", "--warmup", "2",
              "--precision", "bf16", "--nvlabs-fp16", "--compile"]
    )  # fmt: skip
    command = [sys.executable, "-m", "benchmarks.sg2_reference", "--device", env.device, "--no-legacy",
               "--nvlabs-path", str(args.nvlabs_path), *sizes]  # fmt: skip
    label = "StyleGAN2 per phase vs NVlabs' networks"
    timeout = deadline.timeout_for(args.step_limit)
    if timeout is None:
        report.add(cell=label, kind="all phases", result="skipped: no time left", status="skip")
        return
    outcome = run_bounded(command, timeout, report.work / "sg2_reference.log")
    lines = [line for line in outcome.output.splitlines() if line.startswith(RESULT_PREFIX)]
    if not outcome.ok or not lines:
        report.add(cell=label, kind="all phases", result=outcome.problem(), status="fail")
        return
    found = json.loads(lines[-1][len(RESULT_PREFIX) :])
    ours, theirs = found["rates"]["ours (fir)"], found["rates"]["NVlabs"]
    for phase in PHASES:
        ratio = ours[phase] / theirs[phase]
        met = "ok" if env.dry_run else "met" if ratio >= TARGET_PHASE_RATIO_NVLABS else "not met"
        report.add(
            cell=label,
            kind=phase,
            img_per_s=ours[phase],
            result=f"{ratio:.2f}x NVlabs' {theirs[phase]:,.1f} img/s (target {TARGET_PHASE_RATIO_NVLABS}x); "
            + (found.get("header") or ""),
            status=met,
            data=found,
        )


def _bench_rows(report, cells, results, flops_of, env) -> None:
    """Rebuild the table from the results so far: a row per cell and kind, then the targets' ratios."""
    report.rows = []
    peaks = {}
    for cell in cells:
        if cell.precision not in peaks:
            try:
                peaks[cell.precision] = peak_flops(cell.precision, env)
            except Exception as error:  # noqa: BLE001  (no peak: no MFU, said in the row)
                peaks[cell.precision] = (None, f"no peak: {error}")
        peak, source = peaks[cell.precision]
        for kind in cell.kinds:
            result = results.get((cell.label, kind))
            row = {"cell": cell.label, "kind": KIND_LABELS[kind]}
            if result is None:
                report.add(**row, result="not run yet", status="pending")
                continue
            if "skipped" in result:
                report.add(**row, result=f"skipped: {result['skipped']}", status="skip")
                continue
            if "error" in result:
                report.add(**row, result=result["error"].splitlines()[-1][:400], status="fail")
                continue
            rate = result["img_per_s"]
            profile = iteration_profile(result.get("iteration_seconds") or [], cell, kind)
            flop = flops_of.get(cell.label)
            mfu = flop * rate / cell.batch_size / peak if flop and peak else None
            report.add(
                **row,
                img_per_s=rate,
                ms_per_iteration=profile.get("text"),
                kernels_per_iteration=kernels_text(result.get("profile")),
                mfu=f"{100 * mfu:.1f}%" if mfu is not None else "n/a",
                gflop_per_iteration=flop / 1e9 if flop else None,
                result=f"{cell.warmup} warm-up + {cell.steps} timed iterations" + run_events(result, kind),
                status="ok",
                data={
                    "img_per_s": rate,
                    "mfu": mfu,
                    "peak_source": source,
                    "flops_per_iteration": flop,
                    "iteration_ms": profile,
                    "profile": result.get("profile"),
                },
            )
    for label, numerator, denominator, target, how in bench_ratios(cells, results, env):
        value = numerator / denominator if numerator and denominator else None
        if value is None:
            status = "n/a"
        elif env.dry_run or target is None:
            status = "info"
        else:
            status = "met" if how(value, target) else "not met"
        report.add(
            cell="ratio",
            kind=label,
            result=f"{value:.3f}" if value is not None else "n/a (a run is missing)",
            status=status,
        )


def run_events(result: dict[str, Any], kind: str) -> str:
    """What a template run did besides training, from its start-up metrics: graphs captured and iterations
    replayed (a graphed kind; capture given up mid-run said so), recompiles."""
    events = result.get("startup") or {}
    parts = []
    if kind.startswith("template_graphs") and "replays" in events:
        parts.append(f"{events.get('captures', 0):.0f} graph(s) captured, {events['replays']:.0f} replays")
        if events.get("graphs_given_up"):
            parts.append("capture GIVEN UP mid-run (see its log)")
    if "recompiles" in events:
        parts.append(f"{events['recompiles']:.0f} recompile(s)")
    return "; " + ", ".join(parts) if parts else ""


def kernels_text(profile: dict[str, Any] | None, top: int = 3) -> str | None:
    """A profiled run's work per iteration, as the table shows it: time and count of the device's kernels (of the
    host's operators on a CPU) and the costliest few, in microseconds per iteration."""
    if not profile:
        return None
    what = "kernels" if profile["timed"] == "device kernels" else "host ops"
    costliest = "; ".join(f"{row['name'][:48]} {row['us']:.0f} us" for row in profile["top"][:top])
    return (
        f"{profile['ms_per_iteration']:.2f} ms in {profile['count_per_iteration']:.0f} {what}; "
        f"costliest: {costliest}"
    )


def iteration_profile(seconds: list[float], cell: BenchCell, kind: str) -> dict[str, Any]:
    """One kind's timed iterations in milliseconds: the mean (the window's time over its iterations: what img/s
    says), the median, the median of the logging iterations (iteration % BENCH_LOG_EVERY == 0; the template kinds
    log there), the slowest, and for the asynchronous kinds the steady time (the median of the window's second
    half: by then the host has filled the launch queue and each iteration waits for the GPU's). The host's clock
    only sees when an iteration's launches returned: a short median beside a long steady time is a host running
    ahead, and a few long iterations among short ones are the places where it waited."""
    if not seconds:
        return {}
    ms = [1e3 * s for s in seconds]
    first = cell.warmup + 1  # the timed window's first iteration (iterations count from 1)
    logging = [
        t
        for index, t in enumerate(ms)
        if kind.startswith("template") and (first + index) % BENCH_LOG_EVERY == 0
    ]
    logging = logging if kind != "template_graphs_quiet" else []
    profile = {
        "mean": statistics.fmean(ms),
        "median": statistics.median(ms),
        "logging": statistics.median(logging) if logging else None,
        "max": max(ms),
        "steady": statistics.median(ms[len(ms) // 2 :]),
    }
    parts = [f"mean {profile['mean']:.2f}", f"median {profile['median']:.2f}"]
    if profile["logging"] is not None:
        parts.append(f"logging {profile['logging']:.2f}")
    parts += [f"steady {profile['steady']:.2f}", f"max {profile['max']:.2f}"]
    profile["text"] = ", ".join(parts)
    return profile


def bench_ratios(cells, results, env):
    """The DCGAN targets as (label, numerator, denominator, target, comparison), measured in this run."""

    def rate(label_part: str, precision: str, kind: str) -> float | None:
        for cell in cells:
            if label_part in cell.label and cell.precision == precision:
                result = results.get((cell.label, kind)) or {}
                return result.get("img_per_s")
        return None

    at_least, at_most = operator.ge, operator.le
    model = "DCGAN"
    bf16, fp32 = "bf16-mixed", "32-true"
    graphs, quiet = rate(model, bf16, "template_graphs"), rate(model, bf16, "template_graphs_quiet")
    # A logging iteration's wall time in ordinary iterations: the logging run spends (quiet rate / logging rate - 1)
    # more time per iteration, all of it in one iteration of every BENCH_LOG_EVERY.
    logging_cost = 1.0 + (quiet / graphs - 1.0) * BENCH_LOG_EVERY if graphs and quiet else None
    rows = [
        ("template with cuda_graphs / hand-captured graph (bf16; target >= 0.9)", graphs,
         rate(model, bf16, "graphed"), 0.9, at_least),
        ("template with cuda_graphs img/s / 35,000 (6x pytorch/examples' dcgan, 5,766 img/s on an H200; "
         "target >= 1)", graphs, 35_000.0, 1.0, at_least),
        ("a logging iteration, in ordinary iterations (template with cuda_graphs, bf16; target <= 1.5)",
         logging_cost, 1.0, 1.5, at_most),
        ("bf16 / fp32, template (target >= 1)", rate(model, bf16, "template"), rate(model, fp32, "template"), 1.0,
         at_least),
        ("bf16 / fp32, template with cuda_graphs (target >= 1)", graphs, rate(model, fp32, "template_graphs"), 1.0,
         at_least),
        # The references in both precisions: where they too run bf16 slower, the cause is below the template.
        ("bf16 / fp32, plain loop (target >= 1)", rate(model, bf16, "plain"), rate(model, fp32, "plain"), 1.0,
         at_least),
        ("bf16 / fp32, hand-captured graph (target >= 1)", rate(model, bf16, "graphed"), rate(model, fp32, "graphed"),
         1.0, at_least),
        ("iteration time, template eager / plain loop (bf16; target <= 1.15)", rate(model, bf16, "plain"),
         rate(model, bf16, "template"), 1.15, at_most),
        ("iteration time, template eager / plain loop (fp32; target <= 1.15)", rate(model, fp32, "plain"),
         rate(model, fp32, "template"), 1.15, at_most),
        ("StyleGAN2 iteration time, template with cuda_graphs / plain loop (bf16; target <= 1.05)",
         rate("StyleGAN2", bf16, "plain"), rate("StyleGAN2", bf16, "template_graphs"), 1.05, at_most),
    ]  # fmt: skip
    return rows


# ---- stage: style ----------------------------------------------------------------------------------------------
def stylize_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh interpreter: stylize a synthetic photo of `size` with a random-weight TransformerNet 32/5 to each
    output format, after a small warm-up image (CUDA context, cuDNN); the seconds per stage of each."""
    import logging

    import torch

    from benchmarks.style_tiling import synthetic_photo
    from pixelsmith.style.networks import TransformerNet
    from pixelsmith.style.stylize import stylize_paths
    from pixelsmith.style.tiling import StageTimes

    plans: list[str] = []

    class Plans(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            plans.append(record.getMessage())

    tiling_log = logging.getLogger("pixelsmith.style.tiling")
    tiling_log.setLevel(logging.INFO)
    tiling_log.addHandler(Plans())
    work = Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    width, height = spec["size"]
    source = work / "photo.jpg"
    synthetic_photo(width, height).save(source, quality=92)
    warm = work / "warm.jpg"
    synthetic_photo(256, 144, seed=1).save(warm, quality=92)
    torch.manual_seed(0)
    model = TransformerNet(base_channels=32)
    options = {"device": spec["device"], "precision": spec["precision"], "progress": False}
    stylize_paths(model, warm, work / "warm_out.jpg", **options)
    results = {}
    for suffix in spec["formats"]:
        times = StageTimes()
        plans.clear()
        start = time.perf_counter()
        (written,) = stylize_paths(model, source, work / f"stylized{suffix}", times=times, **options)
        results[suffix] = {
            "seconds": time.perf_counter() - start,
            "stages": asdict(times),
            "plan": [p for p in plans if p.startswith("tile=auto")],
            "bytes": written.stat().st_size,
        }
        written.unlink()  # 100 MB each at 8K: the work dir keeps the logs, not the pictures
    return results


STYLIZE_PREFIX = "PIXELSMITH_GPU_CHECK_STYLIZE "
STYLE_NO_SYNC = {
    # The main job's model and data path; StyleGAN2 with lazy R1 through ADA; the fast style model (a DataLoader).
    "main job (DCGAN, data on the device)": [],
    "StyleGAN2, lazy R1 through ADA": ["model=stylegan2", "augment=ada", "augment.initial_p=0.5"],
    "style_fast (a DataLoader)": ["experiment=style_fast", "model.loss_net.pretrained=false"],
}
NO_SYNC_COMMON = [
    "train.host_sync_check=error",
    "train.host_sync_scope=loop",
    "train.log_every_n_steps=10",
    "train.sample_every_n_steps=0",
    "train.checkpoint_every_n_steps=0",
    "eval.every_n_steps=0",
    "train.progress_bar=true",
    NO_BUDGET,
]


def stage_style(args, env: Environment, report: StageReport, deadline: Deadline) -> None:
    _style_stylize(args, env, report, deadline)
    report.write()
    _style_folder(args, env, report, deadline)
    report.write()
    _style_training(args, env, report, deadline)
    report.write()
    _style_no_sync(args, env, report, deadline)


def _style_stylize(args, env, report, deadline) -> None:
    size = (256, 144) if env.dry_run else (7680, 4320)
    name = f"stylize {size[0]}x{size[1]} (tile=auto, {args.stylize_precision})"
    timeout = deadline.timeout_for(args.step_limit)
    if timeout is None:
        report.add(step=name, measure="all", value="skipped: no time left", status="skip")
        return
    spec = {
        "size": size,
        "device": env.device,
        "precision": args.stylize_precision,
        "formats": [".png", ".jpg"],
        "work": str(report.work / "stylize"),
    }
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--child-stylize", json.dumps(spec)]
    outcome = run_bounded(command, timeout, report.work / "stylize.log")
    line = next((x for x in reversed(outcome.output.splitlines()) if x.startswith(STYLIZE_PREFIX)), None)
    if not outcome.ok or line is None:
        report.add(
            step=name,
            measure="all",
            value=outcome.problem(),
            status="timeout" if outcome.timed_out else "fail",
        )
        return
    results = json.loads(line[len(STYLIZE_PREFIX) :])
    for suffix, result in results.items():
        stages = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in result["stages"].items())
        report.add(
            step=f"{name} -> {suffix.lstrip('.').upper()}",
            measure="seconds per stage (total)",
            value=f"{stages} ({result['seconds']:.2f} s)",
            status="ok",
            data=result,
        )
    plans = sorted({plan for result in results.values() for plan in result["plan"]})
    report.add(step=name, measure="tile plan", value="; ".join(plans) or "not said", status="info")


# The folder targets on one H100-class GPU: 8K images per second by output format.
FOLDER_TARGETS = {"jpg": 20.0, "png": 3.0}


def _style_folder(args, env, report, deadline) -> None:
    """`benchmarks.style_folder` at 8K to JPEG and PNG (ours and fast_neural_style's loop), with the targets."""
    size = "128x96" if env.dry_run else "8K"
    name = f"stylize folder {size} (pipeline vs fast_neural_style)"
    timeout = deadline.timeout_for(args.step_limit)
    if timeout is None:
        report.add(step=name, measure="all", value="skipped: no time left", status="skip")
        return
    command = [sys.executable, "-m", "benchmarks.style_folder", "--sizes", size, "--formats", "jpg", "png"]
    command += ["--images", "2" if env.dry_run else "8", "--repeats", "1", "--device", env.device]
    # The peer (fp32, Pillow's one-core PNG) is the slow half: timed once, on 2 images; its rate is per image.
    command += ["--peer-images", "1" if env.dry_run else "2", "--peer-once"]
    if env.dry_run:
        command += ["--base-channels", "4", "--residual-blocks", "1"]
    # One compile cache for this stage's children (--all sets it for every stage): the folder's compile of the
    # 8K tiles is then paid once, not once per child.
    child_env = {
        **os.environ,
        "PIXELSMITH_CACHE": os.environ.get("PIXELSMITH_CACHE", str(report.work / "cache")),
    }
    outcome = run_bounded(command, timeout, report.work / "stylize_folder.log", child_env)
    rows = re.findall(
        r"^\| (\S+) \| (jpg|png) \| ([\d.]+) \| ([\d.na]+) \| ([\d.na]+)x \| ([\d.]+) \| ([\d.na%]+) \|$",
        outcome.output,
        flags=re.MULTILINE,
    )
    if not outcome.ok or not rows:
        report.add(
            step=name,
            measure="all",
            value=outcome.problem(),
            status="timeout" if outcome.timed_out else "fail",
        )
        return
    for _label, fmt, ours, peer, ratio, tflops, mfu in rows:
        target = FOLDER_TARGETS[fmt]
        report.add(
            step=f"{name} -> {fmt.upper()}",
            measure="images/s ours / peer (ratio); TFLOP/s, MFU",
            value=f"{ours} / {peer} ({ratio}x); {tflops} TFLOP/s, MFU {mfu}; target >= {target:g} 8K/s: "
            + ("met" if float(ours) >= target else "not met"),
            status="ok" if env.dry_run or float(ours) >= target else "fail",
        )


STYLE_KIND_LABELS = {
    "template": "template",
    "template_graphed": "template, hardware.cuda_graphs=true",
    "peer": "fast_neural_style's method (fp32, as published)",
    "plain": "plain",
}
STYLE_TARGET = 1.5  # template with cuda_graphs >= 1.5x fast_neural_style's img/s


def _style_training(args, env, report, deadline) -> None:
    from benchmarks import style_bench

    dry = env.dry_run
    # The GPU profiles' precision (bf16) only: a stage has 9 minutes, and each run compiles cold. The peer runs in
    # its published precision (fp32) whatever the template's.
    precisions = ["32-true"] if dry else ["bf16-mixed"]
    shape = {
        "hardware": "cpu" if dry else "auto",
        "batch_size": 2 if dry else 4,
        "resolution": 64 if dry else 256,
        "base_channels": 8 if dry else 32,
        "residual_blocks": 1 if dry else 5,
        "warmup": 1 if dry else 3,
        "steps": 2 if dry else 30,
        "threads": None,
    }
    for precision in precisions:
        rates = {}
        # The target's two columns first, so a stage short of time still has its ratio.
        for kind in ("template_graphed", "peer", "template", "plain"):
            run_precision = style_bench.PEER_PRECISION if kind == "peer" else precision
            step = (
                f"style training {shape['resolution']} px b{shape['batch_size']} {run_precision}, "
                f"{STYLE_KIND_LABELS[kind]}"
            )
            timeout = deadline.timeout_for(args.step_limit)
            if timeout is None:
                report.add(step=step, measure="img/s", value="skipped: no time left", status="skip")
                continue
            spec = {
                **shape,
                "kind": kind,
                "precision": run_precision,
                "output_dir": str(report.work / f"style_{kind}"),
            }
            try:
                result = style_bench.run_child(spec, timeout)
            except subprocess.TimeoutExpired:
                report.add(
                    step=step, measure="img/s", value=f"timed out after {timeout:.0f} s", status="timeout"
                )
                continue
            except SystemExit as failed:  # style_bench says why a child failed by exiting with its stderr
                last = str(failed).strip().splitlines()[-1:] or ["failed"]
                report.add(step=step, measure="img/s", value=last[0][:400], status="fail")
                continue
            rates[kind] = result["img_per_s"]
            report.add(step=step, measure="img/s", value=rates[kind], status="ok", data=result)
            if kind == "template_graphed":
                # Captured on a GPU; uncaptured on CPU (or blocked, with the reason): the ratio means what this says.
                report.add(
                    step=step, measure="hardware.cuda_graphs", value=result.get("graphs", "?"), status="info"
                )
        if {"template_graphed", "peer"} <= rates.keys():
            ratio = rates["template_graphed"] / rates["peer"]
            report.add(
                step=f"style training {precision}",
                measure=f"template with cuda_graphs / fast_neural_style (target >= {STYLE_TARGET})",
                value=f"{ratio:.3f}",
                status="info" if dry else "met" if ratio >= STYLE_TARGET else "not met",
            )
        if {"template", "plain"} <= rates.keys():
            report.add(
                step=f"style training {precision}",
                measure="plain / template (overhead + 1; target <= 1.03)",
                value=f"{rates['plain'] / rates['template']:.3f}",
                status="info" if dry else "met" if rates["plain"] / rates["template"] <= 1.03 else "not met",
            )


def _style_no_sync(args, env, report, deadline) -> None:
    dry = env.dry_run
    shape = (
        ["hardware=cpu", "max_steps=6", "train.log_every_n_steps=3", "data.limit=128"]
        if dry
        else ["max_steps=40"]
    )
    for name, overrides in STYLE_NO_SYNC.items():
        if dry and "StyleGAN2" in name:
            overrides = [*overrides, *STYLEGAN2_TINY]
        step = f"no host sync: {name}"
        timeout = deadline.timeout_for(args.step_limit)
        if timeout is None:
            report.add(
                step=step, measure="train.host_sync_check=error", value="skipped: no time left", status="skip"
            )
            continue
        slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        run_dir = report.work / f"no_sync_{slug}"
        command = [
            sys.executable,
            "train.py",
            *overrides,
            *NO_SYNC_COMMON,
            *shape,
            f"hydra.run.dir={run_dir}",
        ]
        outcome = run_bounded(command, timeout, report.work / f"no_sync_{slug}.log")
        if outcome.ok:
            value, status = "no synchronisation on any iteration that logs nothing (whole loop)", "ok"
        else:
            syncs = [x for x in outcome.output.splitlines() if "synchroniz" in x or "made the host wait" in x]
            value = syncs[-1].strip()[:400] if syncs else outcome.problem()
            status = "timeout" if outcome.timed_out else "fail"
        report.add(step=step, measure="train.host_sync_check=error", value=value, status=status)


# ---- stage: data -------------------------------------------------------------------------------------------------
def stage_data(args, env: Environment, report: StageReport, deadline: Deadline) -> None:
    """The loader benchmark (`benchmarks.loader_bench`): decoded img/s per source and decoder, nvJPEG on the device,
    beside the training step's img/s on the GPU profile."""
    sizes = ["64", "256"] if env.dry_run else ["64", "256", "1024"]
    command = [sys.executable, "-m", "benchmarks.loader_bench", "--sizes", *sizes, "--hardware", "auto"]
    if env.dry_run:
        command += ["--images", "32", "--repeats", "1", "--hardware", "cpu"]
    timeout = deadline.timeout_for(args.time_limit)
    if timeout is None:
        report.add(measure="loader benchmark", value="skipped: no time left", status="skip")
        return
    outcome = run_bounded(command, timeout, report.work / "loader_bench.log")
    report.add(measure="command", value="`python -m " + " ".join(command[2:]) + "`", status="info")
    rows = [line for line in outcome.output.splitlines() if line.startswith("| ") and "---" not in line]
    for line in rows[1:]:  # after the header
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        report.add(
            measure=" ".join(cells[:3]) + " px/source/decoder", value=" | ".join(cells[3:]), status="info"
        )
    report.add(
        measure="process",
        value="finished" if outcome.ok else outcome.problem(),
        status="ok" if outcome.ok else "timeout" if outcome.timed_out else "fail",
    )


# ---- main -------------------------------------------------------------------------------------------------------
COLUMNS = {
    "tests": ["row", "what", "result", "detail", "status"],
    "train": ["measure", "value", "status"],
    "bench": [
        "cell",
        "kind",
        "img_per_s",
        "ms_per_iteration",
        "kernels_per_iteration",
        "mfu",
        "gflop_per_iteration",
        "result",
        "status",
    ],
    "startup": ["preset", "cache", "first_iteration", "compile", "counts", "captures", "img_per_s", "status"],
    "style": ["step", "measure", "value", "status"],
    "data": ["measure", "value", "status"],
}
RUNNERS = {
    "tests": stage_tests,
    "train": stage_train,
    "bench": stage_bench,
    "startup": stage_startup,
    "style": stage_style,
    "data": stage_data,
}


# ---- --all: the most informative rows of every stage within one time limit ----------------------------------------
# The GPU tests of fixes made without a GPU (inductor's own CUDA graphs, fp16 path length, captured schedules, the
# foreach-Adam switch, R3GAN and WGAN-GP under graphs, nvJPEG in training, graphed == eager, bit-exact resume).
FIX_TESTS = (
    "reduce-overhead or max-autotune or stylegan2-ada-16-mixed or path_length_captures or train_like_eager or "
    "resumes_bit or r3gan or wgan or jpeg_zip or style_fast"
)


@dataclass(frozen=True)
class AllStep:
    stage: str
    share: float  # of --time-limit at most; what a step leaves unused goes to the later ones
    overrides: tuple[tuple[str, Any], ...] = ()


ALL_PLAN = (
    AllStep("tests", 0.30, (("pytest_args", f"-m gpu -k '{FIX_TESTS}'"),)),
    AllStep("train", 0.15),
    AllStep("bench", 0.15, (("only", ["DCGAN-64 b64 bf16", "DCGAN-32 b8 bf16"]),)),
    AllStep("startup", 0.25, (("only", ["stylegan2_paper256", "r3gan_ffhq64", "stylegan2 tiny"]),)),
    AllStep("style", 1.0),
)
SUMMARY_STATUSES = ("met", "not met", "fail", "timeout", "skip")


def run_all(args, argv: list[str], out: Path, work: Path, env: Environment) -> int:
    """Every stage of ALL_PLAN in order, each within its share of what is left; then `all.md`: per stage its time and
    outcome, and every row that has a target or a failure (measured, target, met / not met / skipped for time)."""
    import copy

    os.environ.setdefault("PIXELSMITH_CACHE", str(work / "cache"))  # one compile cache for every child
    total = Deadline(args.time_limit)
    summary: list[dict[str, Any]] = []
    for step in ALL_PLAN:
        budget = min(step.share * args.time_limit, total.remaining() - RESERVE_SECONDS)
        if budget < MIN_STEP_SECONDS:
            summary.append(
                {"stage": step.stage, "row": "whole stage", "value": "", "status": "skipped for time"}
            )
            continue
        stage_args = copy.copy(args)
        stage_args.stage, stage_args.time_limit = step.stage, budget
        for key, value in step.overrides:
            setattr(stage_args, key, value)
        deadline = Deadline(budget)
        report = StageReport(
            stage=step.stage,
            columns=COLUMNS[step.stage],
            environment=env,
            command=shlex.join(["python", "-m", "benchmarks.gpu_check", *argv]) + f"  (stage {step.stage})",
            time_limit=budget,
            out=out,
            work=work / f"{step.stage}_runs",
            elapsed=deadline.elapsed,
        )
        report.work.mkdir(parents=True, exist_ok=True)
        problem = None
        try:
            RUNNERS[step.stage](stage_args, env, report, deadline)
        except Exception as error:  # noqa: BLE001 - one stage's bug must not cost the others their time
            problem = f"{type(error).__name__}: {error}"
            report.notes.append(f"**The stage stopped early**: {problem}")
        report.write()
        statuses = [r.get("status") for r in report.rows]
        worst = "fail" if problem or "fail" in statuses or "timeout" in statuses else "ok"
        summary.append(
            {
                "stage": step.stage,
                "row": f"whole stage ({report.seconds:.0f} s of {budget:.0f} s)",
                "value": problem or f"{len(report.rows)} rows in {report.md_path.name}",
                "status": worst,
            }
        )
        for row in report.rows:
            if row.get("status") in SUMMARY_STATUSES:
                # The row's name: its first column, and the second in the wider tables (cell and kind, step and measure).
                named = 2 if len(report.columns) > 3 else 1
                label = " ".join(str(row.get(c)) for c in report.columns[:named] if row.get(c) is not None)
                value = " ".join(
                    str(row.get(c)) for c in report.columns[named:-1] if row.get(c) not in (None, "")
                )
                status = "skipped for time" if row.get("status") == "skip" else row["status"]
                summary.append({"stage": step.stage, "row": label, "value": value[:300], "status": status})
    lines = [
        "# GPU check: all stages",
        "",
        f"- device: **{env.device_name}** ({env.device}); torch {env.torch}, CUDA {env.cuda}",
        f"- command: `{shlex.join(['python', '-m', 'benchmarks.gpu_check', *argv])}`",
        f"- took {total.elapsed():.0f} s of {args.time_limit:.0f} s",
        *(["", DRY_RUN_NOTE] if env.dry_run else []),
        "",
        "| stage | row | measured | status |",
        "|---|---|---|---|",
        *(f"| {r['stage']} | {_cell(r['row'])} | {_cell(r['value'])} | {r['status']} |" for r in summary),
    ]
    (out / "all.md").write_text("\n".join(lines) + "\n")
    (out / "all.json").write_text(json.dumps(summary, indent=2, default=str))
    print("\n".join(lines), flush=True)
    return 1 if any(r["status"] in ("fail", "timeout") for r in summary) else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from pixelsmith.core.config import PRECISIONS

    parser = Parser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--stage", choices=STAGES, required=False)
    parser.add_argument(
        "--all", action="store_true", help="every stage's most informative rows within --time-limit (all.md)"
    )
    parser.add_argument(
        "--out", default=None, help="where <stage>.md and <stage>.json go (default outputs/gpu_check/<time>)"
    )
    parser.add_argument("--work-dir", default=None, help="where the runs go (default OUT/<stage>_runs)")
    parser.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="cpu: the shrunk dry run"
    )
    # Below these a stage, or a sub-step, could start nothing: every row would say "no time left".
    parser.add_argument(
        "--time-limit",
        type=amount("seconds", MIN_STEP_SECONDS + RESERVE_SECONDS),
        default=STAGE_SECONDS,
        help="seconds for the whole stage",
    )
    parser.add_argument(
        "--step-limit",
        type=amount("seconds", MIN_STEP_SECONDS),
        default=240.0,
        help="seconds at most for one sub-step",
    )
    parser.add_argument("--pytest-args", default=None, help="tests stage: the selection (default: -m gpu)")
    parser.add_argument(
        "--gpu-tests-on-cpu",
        action="store_true",
        help="tests stage without CUDA: PIXELSMITH_GPU_TESTS_ON_CPU=1 (the GPU set's slow CPU dry run)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="bench stage: cells whose name holds one of these; startup: presets",
    )
    parser.add_argument(
        "--compile", type=true_or_false, default=True,
        help="bench stage on CUDA: compile as the GPU profiles do (false: eager cells)",
    )  # fmt: skip
    parser.add_argument(
        "--stylize-precision",
        type=one_of(("auto", *PRECISIONS), "precision stylize.py takes"),
        default="32-true",
        help="style stage: stylize.py's precision",
    )
    parser.add_argument(
        "--nvlabs-path",
        type=nvlabs_checkout,
        default=None,
        help="bench stage: a checkout of NVlabs/stylegan2-ada-pytorch to time per phase",
    )
    parser.add_argument("--child-stylize", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_stylize is None:
        check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse, before any stage starts, what the parser cannot see: no stage or two, a --pytest-args that does not
    split, --only matching nothing its stage runs, an output folder that cannot be written or that lies in the
    NVlabs checkout the bench stage reads."""
    if args.stage is None and not args.all:
        raise CommandLineError(f"--stage (one of {', '.join(STAGES)}) or --all is required. Nothing was run.")
    if args.stage is not None and args.all:
        raise CommandLineError(
            f"--stage {args.stage} and --all together: --all runs every stage. Nothing was run. Fix: keep one."
        )
    if args.pytest_args is not None:
        try:
            shlex.split(args.pytest_args)
        except ValueError as err:
            raise CommandLineError(
                f"--pytest-args {args.pytest_args!r} does not split into arguments ({err}). Nothing was run. Fix: "
                "close the quote, e.g. --pytest-args \"-m gpu -k 'graphs or r3gan'\"."
            ) from err
    if args.only:
        check_only(args)
    inputs = [("--nvlabs-path", args.nvlabs_path)]
    args.out = args.out or str(Path("outputs") / "gpu_check" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    check_output_folder(args.out, "--out", inputs)
    if args.work_dir is not None:
        check_output_folder(args.work_dir, "--work-dir", inputs)


def check_only(args: argparse.Namespace) -> None:
    """Every --only text picks a bench cell (case-insensitive) or a start-up preset (as written) of the stage, on a
    GPU or in the CPU dry run; --all picks its own."""
    from benchmarks import startup

    if args.stage not in ("bench", "startup"):
        where = "--all picks its own cells and presets" if args.all else f"--stage {args.stage} has none"
        raise CommandLineError(
            f"--only {' '.join(args.only)}: --only picks the cells of --stage bench and the presets of --stage "
            f"startup; {where}. Nothing was run. Fix: leave out --only, or use it with --stage bench or startup."
        )
    if args.stage == "bench":
        labels = [c.label for dry_run in (False, True) for c in bench_cells(dry_run)]
        unmatched = [part for part in args.only if not any(part.lower() in label.lower() for label in labels)]
    else:
        labels = [r.label for r in (*startup.GPU_ROWS, *startup.CPU_DRY_ROWS)]
        unmatched = [part for part in args.only if not any(part in label for label in labels)]
    if unmatched:
        raise CommandLineError(
            f"--only {' '.join(unmatched)} matches nothing --stage {args.stage} runs; its names are: "
            f"{'; '.join(dict.fromkeys(labels))}. Nothing was run. Fix: give a part of one of them."
        )


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child_stylize is not None:
        print(STYLIZE_PREFIX + json.dumps(stylize_child(json.loads(args.child_stylize))), flush=True)
        return 0
    deadline = Deadline(args.time_limit)
    out = Path(args.out).resolve()  # check_args: given, or a new one under outputs/gpu_check/
    work = Path(args.work_dir).resolve() if args.work_dir else out / f"{args.stage or 'all'}_runs"
    work.mkdir(parents=True, exist_ok=True)
    env = probe_environment(args.device, work)
    if args.all:
        return run_all(args, argv, out, work, env)
    report = StageReport(
        stage=args.stage,
        columns=COLUMNS[args.stage],
        environment=env,
        command=shlex.join(["python", "-m", "benchmarks.gpu_check", *argv]),
        time_limit=args.time_limit,
        out=out,
        work=work,
        elapsed=deadline.elapsed,
    )
    report.write()  # a table from the first second on: a stage killed from outside still leaves one
    try:
        RUNNERS[args.stage](args, env, report, deadline)
    except Exception as error:  # noqa: BLE001  (the table is the product: a bug in a stage becomes its last row)
        report.notes.append(f"**The stage stopped early**: {type(error).__name__}: {error}")
        raise
    finally:
        path = report.write()
        print(f"gpu_check {args.stage}: wrote {path} and {path.with_suffix('.json')}", flush=True)
    failed = [r for r in report.rows if r.get("status") in ("fail", "timeout")]
    print(report.markdown(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
