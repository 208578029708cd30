"""Shared test fixtures and helpers, in one place: compose the real config tree (as `train.py` does) with outputs
under tmp_path, run entry points as a user does, read a run's checkpoint and metrics, free ports, thread limits, and
the default test selection (`pytest` fast, `pytest --all` everything).

The tests run this checkout's code and configs whatever `pixelsmith` the interpreter has installed: an editable
install of another clone in the same venv would otherwise supply its own package (tests/test_packaging.py).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]  # the clone these tests belong to
# Before anything imports pixelsmith: this checkout's src/ first, ahead of any installed pixelsmith.
if str(CHECKOUT / "src") not in sys.path[:1]:
    sys.path.insert(0, str(CHECKOUT / "src"))

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, open_dict

import pixelsmith
from pixelsmith.config.paths import CONF_DIR, REPO_ROOT
from pixelsmith.config.schema import register_configs
from pixelsmith.hardware.settings import register_detected_profile

if REPO_ROOT is None or REPO_ROOT.resolve() != CHECKOUT or CONF_DIR.resolve() != CHECKOUT / "conf":
    pytest.exit(
        f"These tests belong to the checkout {CHECKOUT}, but pixelsmith was imported from "
        f"{Path(pixelsmith.__file__).parent} with its configs from {CONF_DIR}: they would test another tree. Run "
        "pytest with this checkout's interpreter (its .venv), or with nothing else imported before conftest.",
        returncode=4,
    )

register_configs()
# Tests never reach the network: a pretrained file that is not on disk stops with its paragraph, as on a cluster
# without internet (the download itself is tested against a local server, tests/test_weights_download.py).
os.environ["PIXELSMITH_OFFLINE"] = "1"
SESSION_ENVIRON = dict(os.environ)  # as pytest started: what each test's environment goes back to
torch.set_num_threads(min(2, os.cpu_count() or 1))

# Small, quiet, fast: every test run trains on CPU in fp32 unless it asks otherwise.
FAST = [
    "~local",  # a developer's own conf/local/default.yaml must not change what the tests compose
    "hardware=cpu",
    "train.progress_bar=false",
    "logger=csv",
    "data.limit=256",
    "data.batch_size=16",
    "eval.every_n_steps=0",  # tests that check evaluation turn it on
    "train.time_budget_minutes=null",  # a loaded CI machine must not end a test's run early (tests of it set it)
]
# Narrow networks per model so a test trains in seconds.
SMALL = {
    "dcgan": ["model=dcgan", "model.generator.ngf=16", "model.discriminator.ndf=16"],
    "stylegan2": [
        "model=stylegan2",
        "model.generator.channel_base=512",
        "model.generator.channel_max=32",
        "model.generator.z_dim=32",
        "model.generator.w_dim=32",
        "model.generator.mapping_layers=2",
        "model.discriminator.channel_base=512",
        "model.discriminator.channel_max=32",
    ],
    # 16 channels, 2 groups: the reference's 16 channels a group at expansion 2
    "r3gan": ["model=r3gan", "model.generator.widths=[16,16,16,16]", "model.generator.groups=[2,2,2,2]"],
}


# The job the general tests compose on: train.yaml's own (model: dcgan). A style-only fork (README "Removing a
# part") has no dcgan; its general tests compose the fast style model on train.yaml's other defaults instead.
BASE_JOB = [] if (CONF_DIR / "model" / "dcgan.yaml").is_file() else ["model=style_fast"]


def _skip_when_its_part_is_removed(overrides: list[str]) -> None:
    """In a fork without a part (README "Removing a part"), a test composing that part's model or preset, or the
    default model's networks, skips instead of failing."""
    # A test's own config folder on the search path holds configs this checkout's conf/ does not.
    searched_elsewhere = any(o.startswith("hydra.searchpath") for o in overrides)
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        missing = value and not (CONF_DIR / key / f"{value}.yaml").is_file() and not searched_elsewhere
        if key in ("model", "experiment") and missing:
            pytest.skip(f"{key}={value} is removed from this fork (conf/{key}/{value}.yaml)")
        if BASE_JOB and key.startswith(("model.generator.", "model.discriminator.", "model.objective.")):
            pytest.skip(f"{key} belongs to the default GAN model, removed from this fork")


def compose_config(overrides: list[str], output_dir: Path, config_name: str = "train") -> DictConfig:
    # As the entry points do before composing: hardware=auto composes the profile detected now (a test that mocks
    # torch.cuda composes inside its mock).
    register_detected_profile()
    GlobalHydra.instance().clear()
    _skip_when_its_part_is_removed(overrides)
    names_a_job = any(o.lstrip("+~").startswith(("experiment=", "model=")) for o in overrides)
    if config_name == "train" and not names_a_job:
        overrides = [*BASE_JOB, *overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
    return cfg


@pytest.fixture
def make_cfg(tmp_path):
    def _make(*overrides: str, fast: bool = True, model: str = "dcgan", output: str = "run") -> DictConfig:
        if not (CONF_DIR / "model" / f"{model}.yaml").is_file():
            # A fork without the part this model belongs to (README "Removing a part"): its general tests that
            # train this model as their vehicle skip.
            pytest.skip(f"model={model} is removed from this fork (conf/model/{model}.yaml)")
        base = [*FAST, *SMALL[model]] if fast else []
        return compose_config([*base, *overrides], tmp_path / output)

    return _make


# For the entry points run as a user runs them (`run_cli(["train.py", ...])`): a narrow DCGAN, quiet, CSV logs.
SMALL_DCGAN = [
    "model.generator.ngf=16",
    "model.discriminator.ndf=16",
    "train.progress_bar=false",
    "logger=csv",
]


def eval_overrides(every_n_steps: int = 3, metrics: str = "fid,pr") -> list[str]:
    """FID-style evaluation small enough for a test: 200 generated images against 1000 reference digits."""
    return [
        f"eval.every_n_steps={every_n_steps}",
        "eval.num_samples=200",
        "eval.reference_samples=1000",
        f"eval.metrics=[{metrics}]",
    ]


def bare_trainer(callbacks=()) -> L.Trainer:
    """A one-CPU Trainer with nothing of its own (no logger, checkpoints, bar or summary): for a module driven
    directly; the training core stops it at `max_steps`."""
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )


# ---- a run's outputs -------------------------------------------------------------------------------------------
def last_checkpoint(run_dir: Path, name: str = "last.ckpt") -> dict:
    """A run's checkpoint as saved (weights_only: what a resume loads, so nothing in it may need full unpickling)."""
    return torch.load(Path(run_dir) / "checkpoints" / name, map_location="cpu", weights_only=True)


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    """The rows of a run's metrics.csv (one per logging iteration; a key not logged there is empty)."""
    with open(Path(run_dir) / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def series(rows: list[dict[str, str]], key: str) -> list[float]:
    """One metric's logged values, in order, from `metrics_rows`."""
    return [float(r[key]) for r in rows if r.get(key) not in (None, "")]


# ---- this machine ----------------------------------------------------------------------------------------------
def cpu_flags() -> set[str] | None:
    """This machine's CPU feature flags as the kernel reports them (/proc/cpuinfo "flags"), read independently of
    torch; None where there is no such file or line (not Linux, or not x86)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = {
        f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()
    }
    return flags or None


# ---- processes, ports and threads ------------------------------------------------------------------------------
def free_port() -> int:
    """A free TCP port for a rendezvous, below Linux's ephemeral range (32768-60999): a port picked from that range
    (the OS's or Lightning's default) can be taken by the ranks' own gloo sockets before the store binds it (the
    EADDRINUSE flakes of parallel DDP tests)."""
    while True:
        port = random.randint(20000, 29999)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


# What a launcher (Lightning's, torchrun, an in-process DDP/FSDP run) writes into os.environ. A child that inherits
# LOCAL_RANK believes it was started by a launcher: Lightning then spawns no other rank and waits for them forever.
LAUNCH_VARIABLES = (
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def run_cli(args: list[str], cwd: Path = CHECKOUT, timeout: int = 600, env_extra: dict | None = None):
    """Run an entry point the way a user does, with this checkout's code; returns the CompletedProcess (stdout and
    stderr). It starts as a fresh launch: no launcher variables inherited, and a rendezvous port of its own."""
    if args and Path(args[0]).name == "train.py":
        _skip_when_its_part_is_removed([a for a in args[1:] if "=" in a])
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    pythonpath = os.pathsep.join(filter(None, [str(CHECKOUT / "src"), env.get("PYTHONPATH")]))
    env.update(HYDRA_FULL_ERROR="0", MASTER_PORT=str(free_port()), PYTHONPATH=pythonpath)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def publish_test_weights(monkeypatch: pytest.MonkeyPatch, key: str, path: Path) -> None:
    """Make ``path``, a test's stand-in for a pretrained file written under its published name in torch hub's cache,
    the published file of ``PUBLISHED[key]``: the table then holds its full SHA-256 and length, as it holds the real
    file's (any other file under that name is refused)."""
    from pixelsmith.metrics.weights import PUBLISHED

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    published = dataclasses.replace(PUBLISHED[key], sha256=digest, size=path.stat().st_size)
    monkeypatch.setitem(PUBLISHED, key, published)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` inside the block, as they were after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny tensors gain nothing from two, and on the shared 2-core CI machine two OpenMP threads
    waiting on each other made a 4-step run 15x slower (33 s instead of 2 s, measured)."""
    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def _process_state_is_restored():
    """Each test leaves the process as it found it: an in-process run with a DDP/FSDP strategy writes LOCAL_RANK,
    NODE_RANK, MASTER_PORT and OMP_NUM_THREADS into os.environ and keeps its process group. Left there, the next DDP
    subprocess inherited LOCAL_RANK=0, spawned no second rank and waited for it forever (the hang of
    `pytest --all tests/test_fsdp.py` followed by a 2-process test); tests/test_conftest.py checks this."""
    environ = dict(os.environ)
    threads = torch.get_num_threads()
    recompile_limit = torch._dynamo.config.recompile_limit  # compile_scope=blocks raises it
    yield
    torch._dynamo.config.recompile_limit = recompile_limit
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    # Launch variables go back to the session's even when a module-scoped fixture's run wrote them before this
    # test's snapshot.
    for key in LAUNCH_VARIABLES:
        environ.pop(key, None)
        if key in SESSION_ENVIRON:
            environ[key] = SESSION_ENVIRON[key]
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _name_the_test_that_timed_out() -> None:
    """pytest-timeout's thread method (pyproject.toml) dumps every thread's stack and ends the session; say first
    which test it was, so the CI log names it in one line."""
    try:
        import pytest_timeout
    except ImportError:  # not installed: no timeout, nothing to name
        return
    dump_stacks_and_exit = getattr(pytest_timeout, "timeout_timer", None)
    if dump_stacks_and_exit is None or getattr(dump_stacks_and_exit, "names_the_test", False):
        return

    def name_then_dump(item, settings):
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(item)
        item.config.get_terminal_writer().line(
            f"TIMEOUT: {item.nodeid} ran past {settings.timeout:g} s ([tool.pytest.ini_options] timeout); "
            "the stacks below show where it waits."
        )
        dump_stacks_and_exit(item, settings)

    name_then_dump.names_the_test = True
    pytest_timeout.timeout_timer = name_then_dump


_name_the_test_that_timed_out()


# ---- which tests run -------------------------------------------------------------------------------------------
# The fast default: `pytest` runs what checks behaviour in-process (about 2 minutes on 2 cores); `pytest --all` adds
# the slow tests (subprocesses, several processes, sweeps) and the benchmark tooling's tests, as CI does. An explicit
# `-m` expression (`pytest -m gpu`, `-m bench`) is honoured as given. A test file named on the command line
# (`pytest tests/test_compile_cpu.py`, or one of its tests by id) runs all its tests, whatever their marks.
FAST_SELECTION = "not slow and not bench"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        default=False,
        help=f"run every test; without it (and without -m) only `{FAST_SELECTION}` runs, except in the test "
        "files named on the command line",
    )


def _fast_default(config: pytest.Config) -> bool:
    return not config.getoption("--all") and not config.option.markexpr


def _named_files(config: pytest.Config) -> set[Path]:
    """The test files given on the command line, by path or by test id (`tests/test_x.py::test_y`)."""
    base = Path(config.invocation_params.dir)
    named = set()
    for arg in config.args:
        path = (base / str(arg).split("::")[0]).resolve()
        if path.is_file():
            named.add(path)
    return named


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _fast_default(config):
        return
    named = _named_files(config)
    kept, deselected = [], []
    for item in items:
        slow = item.get_closest_marker("slow") or item.get_closest_marker("bench")
        (deselected if slow and Path(item.path).resolve() not in named else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not _fast_default(config):
        selection = config.option.markexpr or "every test"
    else:
        selection = f"{FAST_SELECTION}, except in the test files named on the command line"
    return [
        f"pixelsmith test selection: {selection} (`pytest --all` runs every test, as CI does)",
        f"pixelsmith code and configs: {Path(pixelsmith.__file__).parent} and {CONF_DIR}",
    ]
