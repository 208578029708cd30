"""The test machinery itself (tests/conftest.py, pyproject's pytest settings): a test leaves no launcher variables
behind for the next one, entry points start as fresh launches, a test file named on the command line runs all its
tests, and a hanging test fails with its name."""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from tests.conftest import CHECKOUT, LAUNCH_VARIABLES, run_cli


def test_a_test_may_leave_launcher_variables_behind():
    """What an in-process DDP/FSDP run does (Lightning writes these): the next test must not see them."""
    os.environ.update(LOCAL_RANK="0", NODE_RANK="0", MASTER_PORT="29123", PIXELSMITH_LEFT_BEHIND="1")


def test_the_next_test_starts_without_them():
    # Runs after the test above (pytest keeps a file's order): conftest's _process_state_is_restored cleaned up.
    assert "LOCAL_RANK" not in os.environ and "NODE_RANK" not in os.environ
    assert "PIXELSMITH_LEFT_BEHIND" not in os.environ
    assert os.environ.get("MASTER_PORT") != "29123"


def test_an_entry_point_starts_as_a_fresh_launch(monkeypatch):
    """A child that inherited LOCAL_RANK would think a launcher started it: Lightning spawns no second rank and waits
    for one forever (the hang after tests/test_fsdp.py). run_cli drops them and gives a fresh rendezvous port."""
    for key in LAUNCH_VARIABLES:
        monkeypatch.setenv(key, "0")
    probe = (
        f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {list(LAUNCH_VARIABLES)!r}}}))"
    )
    result = run_cli(["-c", probe], timeout=60)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in seen.items() if v is not None} == {"MASTER_PORT": seen["MASTER_PORT"]}
    assert 20000 <= int(seen["MASTER_PORT"]) < 30000  # below the ephemeral range the ranks' sockets use
    forced = run_cli(
        ["-c", "import os; print(os.environ['LOCAL_RANK'])"], timeout=60, env_extra={"LOCAL_RANK": "1"}
    )
    assert forced.stdout.strip() == "1"  # a test that means to set one still can


KEYWORDS = "compile_cpu or a_budget_must_be_positive"  # a slow file and a fast test elsewhere


@pytest.mark.slow  # pytest in subprocesses
def test_a_named_test_file_runs_its_slow_tests_and_a_directory_does_not():
    slow_in_file = (
        "test_compile_modes_beyond_default_train_on_cpu_without_cuda_graphs"  # the file is all slow
    )
    named = run_cli(
        ["-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "tests/test_compile_cpu.py"], timeout=300
    )
    assert named.returncode == 0, named.stdout[-2000:] + named.stderr[-2000:]
    assert slow_in_file in named.stdout and "deselected" not in named.stdout
    folder = run_cli(
        ["-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "tests/", "-k", KEYWORDS], timeout=300
    )
    assert folder.returncode == 0, folder.stdout[-2000:] + folder.stderr[-2000:]
    assert slow_in_file not in folder.stdout and "test_a_budget_must_be_positive" in folder.stdout
    everything = run_cli(
        ["-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--all", "tests/", "-k", KEYWORDS],
        timeout=300,
    )
    assert slow_in_file in everything.stdout


@pytest.mark.slow  # pytest in a subprocess
def test_a_hanging_test_fails_fast_with_its_name(tmp_path):
    settings = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert settings["timeout_method"] == "thread" and 600 <= settings["timeout"] <= 1800
    hang = tmp_path / "test_hangs.py"
    hang.write_text("import time\n\n\ndef test_waits_forever():\n    time.sleep(600)\n")
    # This checkout's pytest settings and conftest (as a plugin: the file is outside tests/), a 3 s limit.
    args = [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        "pyproject.toml",
        "--rootdir",
        str(tmp_path),
    ]
    result = run_cli([*args, "-p", "tests.conftest", "-o", "timeout=3", str(hang)], timeout=300)
    assert result.returncode != 0
    assert "TIMEOUT: test_hangs.py::test_waits_forever ran past 3 s" in result.stdout, result.stdout[-2000:]
    assert "time.sleep(600)" in result.stdout  # the stack says where it waits
