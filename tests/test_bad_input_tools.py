"""The bad-input list of the benchmark tools a user runs (`python bench.py`, `python -m benchmarks.gpu_check` and
the other `python -m benchmarks.*` tools of docs/performance.md and docs/gpu-check.md), in the style of
tests/test_bad_input.py: each mistake with the words its one-paragraph refusal must contain. One test runs them all,
each tool's `main(argv)` in this process, and prints how many were refused cleanly: exit status 2, one line on
stderr naming the cause and the fix, nothing on stdout (no run started), no traceback, and nothing written in the
working directory (where the default output folders go) or anywhere the case names.

A refusal that used to be a row of n/a with exit 0 (an unknown model, precision or profile, a batch size of 0, a GPU
profile on a machine without that GPU) or a traceback (an output folder on /proc, a missing --report-from) is here.
The machine is a CPU one for every case (torch.cuda.is_available patched), so the GPU-profile cases hold on a GPU
machine too. Also here: what the checks must not refuse (the command lines the docs show), and the GPU check's
tests stage reporting a pytest selection that selected nothing as a failure.
"""

from __future__ import annotations

import importlib
import json
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

TOOLS = {
    "bench": "benchmarks.gan_bench",  # python bench.py
    "gpu_check": "benchmarks.gpu_check",
    "style_bench": "benchmarks.style_bench",
    "overhead": "benchmarks.overhead",
    "op_counts": "benchmarks.op_counts",
    "quality": "benchmarks.quality",
    "sg2_reference": "benchmarks.sg2_reference",
    "loader_bench": "benchmarks.loader_bench",
}
DEFAULT_SLUG = "dcgan_b64_32-true_contiguous_eager_foreach-adam"  # bench.py's first default cell


@dataclass
class Case:
    tool: str  # a key of TOOLS
    name: str
    args: Callable[[Path], list[str]]  # the command line, given a scratch folder (the working directory)
    words: tuple[str, ...]  # what the paragraph must say: the cause and the fix


def _a_file(tmp: Path) -> Path:
    (tmp / "a_file").write_text("not a folder")
    return tmp / "a_file"


def _folder(tmp: Path, name: str) -> Path:
    (tmp / name).mkdir(parents=True, exist_ok=True)
    return tmp / name


def _bench_run_dir(tmp: Path, slug: str = DEFAULT_SLUG, result: str | None = None) -> Path:
    """A run dir as bench.py leaves it: runs/<cell>/0-template/result.json, and the report built from it."""
    run = _folder(tmp, f"bench/runs/{slug}/0-template")
    cell = {"model": "dcgan", "precision": "32-true", "channels_last": False, "compile": False}
    cell |= {"batch_size": 64, "optimizer": "foreach"}
    (run / "result.json").write_text(
        result or json.dumps({"kind": "template", "cell": cell, "img_per_s": 1.0})
    )
    (tmp / "bench" / "bench.json").write_text('{"the": "report it had"}')
    return tmp / "bench"


def _nvlabs_checkout(tmp: Path) -> Path:
    (_folder(tmp, "stylegan2-ada-pytorch/training") / "networks.py").write_text("# a stand-in\n")
    return tmp / "stylegan2-ada-pytorch"


def _quality_out_with_a_row(tmp: Path) -> Path:
    _folder(tmp, "quality/dcgan")
    return tmp / "quality"


CASES = [
    # ---- python bench.py
    Case(
        "bench",
        "out on /proc",
        lambda t: ["--out", "/proc/pixelsmith-test/bench"],
        ("--out=", "cannot be written"),
    ),
    Case(
        "bench",
        "out under a file",
        lambda t: ["--out", str(_a_file(t) / "b")],
        ("--out=", "a file, not a folder"),
    ),
    Case(
        "bench",
        "report-from missing",
        lambda t: ["--report-from", "/nonexistent"],
        ("--report-from /nonexistent does not exist", "runs/"),
    ),
    Case(
        "bench",
        "report-from not a run dir",
        lambda t: ["--report-from", str(_folder(t, "empty"))],
        ("holds no runs/ folder", "outputs/bench/"),
    ),
    Case(
        "bench",
        "report-from with out",
        lambda t: ["--report-from", str(_bench_run_dir(t)), "--out", str(t / "bench")],
        ("--out", "in the folder it reads", "leave out --out"),
    ),
    Case(
        "bench",
        "report-from another matrix",
        lambda t: [
            "--report-from",
            str(_bench_run_dir(t, "stylegan2_b32_16-mixed_contiguous_eager_fused-adam")),
        ],
        ("none of the 5 cells", "stylegan2_b32", "--models"),
    ),
    Case(
        "bench",
        "report-from a cut result",
        lambda t: ["--report-from", str(_bench_run_dir(t, result='{"kind": "templ'))],
        ("is not a result bench.py wrote", "0-template", "--report-from"),
    ),
    Case("bench", "unknown model", lambda t: ["--models", "foo"], ("'foo'", "dcgan", "stylegan2")),
    Case(
        "bench",
        "unknown precision",
        lambda t: ["--precisions", "8-mixed"],
        ("'8-mixed'", "32-true", "bf16-mixed"),
    ),
    Case("bench", "unknown optimizer", lambda t: ["--optimizers", "adamw"], ("'adamw'", "fused", "foreach")),
    Case("bench", "batch size 0", lambda t: ["--batch-sizes", "64", "0"], ("--batch-sizes", "at least 1")),
    Case("bench", "no repeats", lambda t: ["--repeats", "0"], ("--repeats", "at least 1")),
    Case("bench", "no warm-up", lambda t: ["--warmup", "0"], ("--warmup", "at least 1")),
    Case("bench", "negative steps", lambda t: ["--steps", "-2"], ("--steps", "at least 1")),
    Case("bench", "no threads", lambda t: ["--threads", "0"], ("--threads", "at least 1")),
    Case("bench", "timeout 0", lambda t: ["--timeout", "0"], ("--timeout", "more than 0")),
    Case(
        "bench",
        "resolution 48",
        lambda t: ["--resolution", "48"],
        ("--resolution", "power of two", "32 or 64"),
    ),
    Case(
        "bench", "not a boolean", lambda t: ["--channels-last", "maybe"], ("--channels-last", "true", "false")
    ),
    Case("bench", "unknown profile", lambda t: ["--hardware", "h300"], ("'h300'", "cpu", "h200")),
    Case(
        "bench",
        "a GPU profile without the GPU",
        lambda t: ["--hardware", "h200"],
        ("--hardware h200", "CUDA GPU", "no GPU", "--hardware auto", "--hardware cpu"),
    ),
    Case(
        "bench",
        "override of the wrong type",
        lambda t: ["--override", "model.generator.ngf=abc"],
        ("model.generator.ngf=abc", "Integer", "--override"),
    ),
    Case(
        "bench",
        "override out of range",
        lambda t: ["--override", "data.batch_size=-3"],
        ("data.batch_size=-3", "at least 1"),
    ),
    Case(
        "bench",
        "out inside the image folder",
        lambda t: [
            "--override",
            "data=image_folder",
            f"data.root={_folder(t, 'photos')}",
            "--out",
            str(t / "photos/bench"),
        ],
        ("--out", "is inside the runs' data.root", "a folder outside"),
    ),  # fmt: skip
    # ---- python -m benchmarks.gpu_check
    Case(
        "gpu_check",
        "out on /proc",
        lambda t: ["--stage", "tests", "--out", "/proc/pixelsmith-test/gc"],
        ("--out=", "cannot be written"),
    ),
    Case(
        "gpu_check",
        "work dir under a file",
        lambda t: ["--stage", "tests", "--work-dir", str(_a_file(t) / "w")],
        ("--work-dir=", "a file, not a folder"),
    ),
    Case(
        "gpu_check",
        "out inside the NVlabs checkout",
        lambda t: [
            "--stage",
            "bench",
            "--nvlabs-path",
            str(_nvlabs_checkout(t)),
            "--out",
            str(t / "stylegan2-ada-pytorch/gc"),
        ],
        ("--out", "is inside --nvlabs-path", "outside"),
    ),
    Case(
        "gpu_check",
        "negative time limit",
        lambda t: ["--stage", "tests", "--time-limit", "-5"],
        ("--time-limit", "at least 25"),
    ),
    Case(
        "gpu_check",
        "step limit 0",
        lambda t: ["--stage", "tests", "--step-limit", "0"],
        ("--step-limit", "at least 10"),
    ),
    Case("gpu_check", "no stage", lambda t: [], ("--stage", "--all", "bench")),
    Case("gpu_check", "unknown stage", lambda t: ["--stage", "gpu"], ("--stage", "'gpu'", "tests")),
    Case("gpu_check", "a stage and all", lambda t: ["--all", "--stage", "bench"], ("--all", "keep one")),
    Case(
        "gpu_check",
        "only matching nothing",
        lambda t: ["--stage", "bench", "--only", "DCGAN-128"],
        ("--only DCGAN-128", "matches nothing", "DCGAN-64 b64 bf16-mixed"),
    ),
    Case(
        "gpu_check",
        "only where no stage uses it",
        lambda t: ["--stage", "train", "--only", "DCGAN"],
        ("--only", "--stage bench", "--stage train has none"),
    ),
    Case(
        "gpu_check",
        "pytest args that do not split",
        lambda t: ["--stage", "tests", "--pytest-args", "-k 'graphs"],
        ("--pytest-args", "No closing quotation", "close the quote"),
    ),
    Case(
        "gpu_check",
        "unknown stylize precision",
        lambda t: ["--stage", "style", "--stylize-precision", "fp8"],
        ("--stylize-precision", "'fp8'", "bf16-mixed"),
    ),
    Case(
        "gpu_check",
        "not an NVlabs checkout",
        lambda t: ["--stage", "bench", "--nvlabs-path", str(_folder(t, "elsewhere"))],
        ("--nvlabs-path", "training/networks.py", "NVlabs/stylegan2-ada-pytorch"),
    ),
    Case(
        "gpu_check",
        "not a boolean",
        lambda t: ["--stage", "bench", "--compile", "maybe"],
        ("--compile", "true"),
    ),
    # ---- python -m benchmarks.style_bench
    Case(
        "style_bench",
        "a GPU profile without the GPU",
        lambda t: ["--hardware", "a100"],
        ("--hardware a100", "CUDA GPU", "--hardware cpu"),
    ),
    Case("style_bench", "unknown precision", lambda t: ["--precisions", "fp16"], ("'fp16'", "16-mixed")),
    Case("style_bench", "batch size 0", lambda t: ["--batch-size", "0"], ("--batch-size", "at least 1")),
    Case("style_bench", "resolution 8", lambda t: ["--resolution", "8"], ("--resolution", "at least 16")),
    Case("style_bench", "no warm-up", lambda t: ["--warmup", "0"], ("--warmup", "at least 1")),
    # ---- python -m benchmarks.overhead
    Case("overhead", "one iteration", lambda t: ["--iterations", "1"], ("--iterations", "at least 2")),
    Case("overhead", "no repeats", lambda t: ["--repeats", "0"], ("--repeats", "at least 1")),
    Case(
        "overhead",
        "out on /proc",
        lambda t: ["--out", "/proc/pixelsmith-test/o"],
        ("--out=", "cannot be written"),
    ),
    Case(
        "overhead",
        "out holding an earlier measurement",
        lambda t: ["--out", str(_folder(t, "overhead/0-template").parent)],
        ("--out", "not empty", "resumed", "new or empty folder"),
    ),
    # ---- python -m benchmarks.op_counts
    Case("op_counts", "unknown model", lambda t: ["--models", "foo"], ("--models", "'foo'", "dcgan")),
    Case("op_counts", "resolution 8", lambda t: ["--resolution", "8"], ("--resolution", "from 16 to 256")),
    Case("op_counts", "resolution 512", lambda t: ["--resolution", "512"], ("--resolution", "128 or 256")),
    # ---- python -m benchmarks.quality
    Case("quality", "no row", lambda t: ["--rows"], ("no row to run", "stylegan2_small")),
    Case("quality", "unknown row", lambda t: ["--rows", "dcgann"], ("dcgann", "dcgan")),
    Case("quality", "a row without overrides", lambda t: ["--row", "wide"], ("--row", 'NAME="OVERRIDE')),
    Case("quality", "negative minutes", lambda t: ["--minutes", "-1"], ("--minutes", "more than 0 minutes")),
    Case("quality", "evaluations every 0", lambda t: ["--eval-every", "0"], ("--eval-every", "at least 1")),
    Case(
        "quality",
        "timeout before the budget",
        lambda t: ["--timeout-factor", "0.5"],
        ("--timeout-factor", "at least 1"),
    ),
    Case(
        "quality",
        "out holding a row's run",
        lambda t: ["--rows", "dcgan", "--out", str(_quality_out_with_a_row(t))],
        ("--out", "row(s) dcgan", "resume", "new folder"),
    ),
    Case(
        "quality",
        "a GPU profile without the GPU",
        lambda t: ["--rows", "dcgan", "--hardware", "h100"],
        ("--hardware h100", "CUDA GPU", "--hardware cpu"),
    ),
    # ---- python -m benchmarks.sg2_reference
    Case("sg2_reference", "resolution 8", lambda t: ["--resolution", "8"], ("--resolution", "at least 16")),
    Case(
        "sg2_reference",
        "channel base below the resolution",
        lambda t: ["--resolution", "64", "--channel-base", "32"],
        ("--channel-base 32", "--resolution 64", "--channel-base 64"),
    ),
    Case("sg2_reference", "negative warm-up", lambda t: ["--warmup", "-1"], ("--warmup", "at least 0")),
    Case(
        "sg2_reference",
        "cuda without CUDA",
        lambda t: ["--device", "cuda"],
        ("--device cuda", "--device cpu"),
    ),
    Case(
        "sg2_reference",
        "not an NVlabs checkout",
        lambda t: ["--nvlabs-path", str(t / "nowhere")],
        ("--nvlabs-path", "does not exist", "NVlabs/stylegan2-ada-pytorch"),
    ),
    # ---- python -m benchmarks.loader_bench
    Case(
        "loader_bench",
        "size 100",
        lambda t: ["--sizes", "64", "100"],
        ("--sizes", "power of two", "64 or 128"),
    ),
    Case("loader_bench", "no images", lambda t: ["--images", "0"], ("--images", "at least 1")),
    Case(
        "loader_bench",
        "a GPU profile without the GPU",
        lambda t: ["--hardware", "v100"],
        ("--hardware v100", "CUDA GPU", "--hardware cpu"),
    ),
]


# Where each tool's work starts: a case that is not refused stops there at once (instead of training for minutes)
# and counts as a failure.
WORK = {
    "bench": ("run_matrix",),
    "gpu_check": ("probe_environment",),
    "style_bench": ("run_bench",),
    "overhead": ("measure",),
    "op_counts": ("measure",),
    "quality": ("run_rows",),
    "sg2_reference": ("our_pair",),
    "loader_bench": ("write_sources", "step_images_per_second"),
}


class NotRefused(Exception):
    """A bad command line reached the tool's work."""


def _stop_at_the_work(monkeypatch) -> None:
    for tool, names in WORK.items():
        module = importlib.import_module(TOOLS[tool])
        for name in names:

            def reached(*args, _where=f"{tool} reached {name}", **kwargs):
                raise NotRefused(_where)

            monkeypatch.setattr(module, name, reached)


@pytest.fixture
def cpu_machine(monkeypatch):
    """Every case on a machine without a GPU, whatever runs the tests."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with a file's bytes: what a refusal must leave as it found it."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


def _refusal(case: Case, scratch: Path, capsys, monkeypatch) -> str:
    """The paragraph the case is refused with; AssertionError when it is not refused cleanly."""
    main = importlib.import_module(TOOLS[case.tool]).main
    argv = case.args(scratch)
    before = _tree(scratch)
    monkeypatch.chdir(scratch)  # where outputs/<tool>/<time> would go
    capsys.readouterr()
    code = main(argv)
    said = capsys.readouterr()
    assert code == 2, f"exit status {code}"
    assert "Traceback" not in said.out + said.err
    assert said.out == "", f"printed before refusing: {said.out[:300]}"
    lines = [line for line in said.err.splitlines() if line.strip()]
    assert len(lines) == 1, said.err
    assert _tree(scratch) == before, "the refusal wrote or changed files"
    return lines[0]


def test_every_bad_command_line_of_the_benchmark_tools_is_refused_cleanly(
    tmp_path, capsys, monkeypatch, cpu_machine
):
    _stop_at_the_work(monkeypatch)
    refused, failures = Counter(), []
    for number, case in enumerate(CASES):
        scratch = tmp_path / f"case{number}"
        scratch.mkdir()
        try:
            message = _refusal(case, scratch, capsys, monkeypatch)
            missing = [w for w in case.words if w not in message]
            assert not missing, f"{missing} not in: {message}"
        except BaseException as err:  # noqa: BLE001  (every way a case can fail is a failure to report)
            failures.append(f"{case.tool} [{case.name}]: {type(err).__name__}: {str(err)[:400]}")
            continue
        refused[case.tool] += 1
    total = sum(refused.values()) + len(failures)
    with capsys.disabled():
        per_tool = ", ".join(f"{tool} {count}" for tool, count in sorted(refused.items()))
        print(f"\nbad inputs refused cleanly: {sum(refused.values())} of {total} ({per_tool})")
    assert not failures, "\n".join(failures)
    assert set(refused) == set(TOOLS)  # every tool is covered


def test_the_command_lines_the_docs_show_pass_the_checks(tmp_path, monkeypatch, cpu_machine):
    """The start-up checks refuse mistakes, not the documented commands (parsed and checked; nothing runs)."""
    from benchmarks import gan_bench, gpu_check, quality

    monkeypatch.chdir(tmp_path)
    for argv in (
        [],
        [
            "--precisions",
            "32-true",
            "bf16-mixed",
            "--channels-last",
            "false",
            "true",
            "--batch-sizes",
            "32",
            "64",
        ],
        ["--full", "--emulated-bf16"],
        ["--models", "r3gan", "--resolution", "32", "--out", str(tmp_path / "bench")],
    ):
        gan_bench.check_matrix(gan_bench.parse_args(argv))
    assert gan_bench.check_report_from(gan_bench.parse_args(["--report-from", str(_bench_run_dir(tmp_path))]))
    for argv in (
        [
            "--all",
            "--time-limit",
            "540",
            "--out",
            str(tmp_path / "gc"),
            "--work-dir",
            str(tmp_path / "gc_work"),
        ],
        ["--stage", "bench", "--only", "DCGAN-64"],
        ["--stage", "startup", "--only", "stylegan2_paper256", "r3gan_ffhq64"],
        ["--stage", "tests", "--pytest-args", "-m gpu -k 'graphs or r3gan'"],
    ):
        gpu_check.parse_args(argv)
    args = quality.parse_args(
        ["--rows", "dcgan", "stylegan2_small", "r3gan", "--minutes", "2", "--hardware", "auto"]
    )
    quality.check_outputs(args)
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "gc").exists()  # checks create nothing


def test_a_pytest_selection_that_selects_nothing_is_a_failed_tests_stage(tmp_path, monkeypatch, capsys):
    """pytest's exit status 5 (no test collected or all deselected) was tabled "ok": a GPU check that checked
    nothing. It is a failed row saying nothing was selected, and the stage's exit status is 1."""
    from benchmarks import gpu_check
    from tests.test_gpu_check import CPU

    monkeypatch.setattr(gpu_check, "probe_environment", lambda choice, work: CPU)
    printed = "collected 4 items / 4 deselected / 0 selected\n=== 4 deselected in 0.31s ===\n"
    monkeypatch.setattr(
        gpu_check,
        "run_bounded",
        lambda command, timeout, log_path, env=None: gpu_check.StepOutcome(5, False, 0.4, log_path, printed),
    )
    out = tmp_path / "out"
    code = gpu_check.main(
        ["--stage", "tests", "--out", str(out), "--pytest-args", "-m gpu -k nothingmatches"]
    )
    assert code == 1
    row = json.loads((out / "tests.json").read_text())["rows"][0]
    assert row["status"] == "fail" and row["result"].startswith(
        "no test was selected: `-m gpu -k nothingmatches`"
    )
    assert "pytest exit 5" in row["result"] and "4 deselected" in row["result"]
    assert "| pytest |" in capsys.readouterr().out


def test_a_bench_whose_runs_failed_exits_1_naming_the_cells(tmp_path, monkeypatch, capsys, cpu_machine):
    """A matrix that passed the start-up checks but whose runs failed (a model's own refusal in the child, a crash)
    leaves rows of n/a: bench.py says which cells and exits 1, never 0."""
    from benchmarks import gan_bench
    from pixelsmith.perf.flops import cpu_peak_flops

    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path / "cache"))
    cpu_peak_flops("fp32", measure=lambda dtype: 50e9)  # cached: the matrix measures no peak

    def refusing_child(command, **kwargs):  # each run's process refuses, as a model's own check would
        return subprocess.CompletedProcess(command, 2, "", "error: refused in the child\n")

    monkeypatch.setattr(gan_bench.subprocess, "run", refusing_child)
    argv = ["--precisions", "32-true", "--repeats", "1", "--no-breakdown", "--out", str(tmp_path / "bench")]
    assert gan_bench.main(argv) == 1
    said = capsys.readouterr().err
    assert "runs failed in 1 cell(s): dcgan b64 32-true contiguous eager fused-adam (2)" in said
    assert "Errors" in said and "refused in the child" in (tmp_path / "bench" / "bench.md").read_text()


def test_a_report_rebuild_that_cannot_write_keeps_the_previous_report_whole(
    tmp_path, monkeypatch, cpu_machine
):
    """A disk that fills while --report-from writes: one paragraph, and the report that was there stays as it was,
    with no partial file beside it (each file is written aside and moved into place once all are written)."""
    from benchmarks import gan_bench
    from pixelsmith.errors import UnwritableError
    from pixelsmith.perf.flops import cpu_peak_flops

    monkeypatch.setenv("PIXELSMITH_CACHE_DIR", str(tmp_path / "cache"))
    cpu_peak_flops("fp32", measure=lambda dtype: 50e9)
    run = _bench_run_dir(tmp_path, "dcgan_b64_32-true_contiguous_eager_fused-adam")
    before = _tree(run)

    def disk_full(path, report):
        path.write_bytes(b"half a pn")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gan_bench, "bench_png", disk_full)
    args = gan_bench.parse_args(["--report-from", str(run), "--precisions", "32-true"])
    with pytest.raises(UnwritableError, match="the disk is full.*previous one is kept"):
        gan_bench.write_report(gan_bench.check_report_from(args), args, None, None)
    assert _tree(run) == before
