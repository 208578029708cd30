"""Two checkouts, one environment: the code, configs and data a run or a test uses are those of the checkout it runs
from, never silently another's (pixelsmith.config.paths). The environment's pixelsmith is this checkout's (its editable
install, or src/ on the path); a second checkout is made in tmp_path by copying what a run needs, with a marker in its
config (max_steps) and its code, and each way of running it must use its own tree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pixelsmith.config.paths import CONF_DIR, REPO_ROOT, describe_trees
from tests.conftest import CHECKOUT, run_cli

JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "outputs")
MARKER_STEPS = 1234  # the other checkout's max_steps; this one's is 1500


@pytest.fixture(scope="module")
def other_checkout(tmp_path_factory) -> Path:
    """A second clone: src/, conf/, data/, the entry point, pyproject.toml and the tests' conftest, copied."""
    clone = tmp_path_factory.mktemp("second") / "clone"
    for folder in ("src", "conf", "data"):
        shutil.copytree(CHECKOUT / folder, clone / folder, ignore=JUNK)
    (clone / "tests").mkdir()
    for name in ("pyproject.toml", "train.py", "tests/__init__.py", "tests/conftest.py"):
        shutil.copy2(CHECKOUT / name, clone / name)
    train_yaml = clone / "conf" / "train.yaml"
    text = train_yaml.read_text()
    assert "\nmax_steps: 2500 " in text
    train_yaml.write_text(text.replace("\nmax_steps: 2500 ", f"\nmax_steps: {MARKER_STEPS} "))
    with open(clone / "src" / "pixelsmith" / "__init__.py", "a") as init:
        init.write('\nWHICH_CHECKOUT = "the second one"\n')
    return clone


# Nothing on PYTHONPATH: only the environment's own pixelsmith (this checkout's) can be found by a plain import, so
# whatever tree the other checkout's run uses, its entry point or conftest chose it.
NO_PYTHONPATH = {"PYTHONPATH": ""}


def test_the_package_imported_from_a_checkout_uses_that_checkouts_configs_and_data(other_checkout):
    """The other checkout's src/ first on the path, this checkout's pixelsmith installed: its configs and data are
    the other checkout's (an editable install maps `pixelsmith.conf` to its own clone's conf/)."""
    probe = (
        "import json, pixelsmith, pixelsmith.config.paths as p; print(json.dumps({'package': pixelsmith.__file__, "
        "'conf': str(p.CONF_DIR), 'data': str(p.DATA_DIR), 'root': str(p.REPO_ROOT)}))"
    )
    result = run_cli(
        ["-c", probe], cwd=other_checkout, timeout=120, env_extra={"PYTHONPATH": str(other_checkout / "src")}
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    found = {k: Path(v).resolve() for k, v in json.loads(result.stdout.strip().splitlines()[-1]).items()}
    assert found["package"] == other_checkout / "src" / "pixelsmith" / "__init__.py"
    assert found["conf"] == other_checkout / "conf" and found["data"] == other_checkout / "data"
    assert found["root"] == other_checkout


@pytest.mark.slow  # two subprocesses that import torch
def test_train_py_and_the_tests_of_a_checkout_run_its_own_code_and_configs(other_checkout):
    # `python train.py` in the other checkout: its conf/ (Hydra's config_path), and its code (its data dir below,
    # which the code's pixelsmith.config.paths resolves), though the environment's pixelsmith is this checkout's.
    for package, expected in (
        ("max_steps", str(MARKER_STEPS)),
        ("paths.data_dir", str(other_checkout / "data")),
    ):
        result = run_cli(
            ["train.py", "--cfg", "job", "--resolve", "--package", package, "hardware=cpu"],
            cwd=other_checkout,
            timeout=300,
            env_extra=NO_PYTHONPATH,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert result.stdout.strip().splitlines()[-1] == expected, result.stdout[-1000:]

    # pytest in the other checkout: its conftest imports its own code and composes its own configs.
    (other_checkout / "tests" / "test_which_tree.py").write_text(
        "from pathlib import Path\n\n"
        "import pixelsmith\n"
        "from pixelsmith.config.paths import CONF_DIR\n"
        "from tests.conftest import compose_config\n\n\n"
        "def test_this_checkouts_tree(tmp_path):\n"
        "    assert pixelsmith.WHICH_CHECKOUT == 'the second one'\n"
        "    assert CONF_DIR == Path(__file__).resolve().parents[1] / 'conf'\n"
        f"    assert compose_config([], tmp_path).max_steps == {MARKER_STEPS}\n"
    )
    result = run_cli(
        ["-m", "pytest", "-p", "no:cacheprovider", "tests/test_which_tree.py"],
        cwd=other_checkout,
        timeout=300,
        env_extra=NO_PYTHONPATH,
    )
    assert result.returncode == 0 and "1 passed" in result.stdout, (
        result.stdout[-3000:] + result.stderr[-2000:]
    )
    assert f"pixelsmith code and configs: {other_checkout / 'src' / 'pixelsmith'}" in result.stdout


def test_a_run_inside_another_checkout_says_which_trees_it_uses(other_checkout, tmp_path):
    """`pixelsmith-train` (this checkout's, installed) started inside the other checkout: one paragraph naming both
    and how to run the other's own. Inside this checkout, or outside any, nothing is said."""
    assert REPO_ROOT == CHECKOUT and CONF_DIR == CHECKOUT / "conf"
    note = describe_trees(other_checkout / "conf")
    assert note is not None
    assert f"configs ({CHECKOUT / 'conf'})" in note and f"not of the checkout {other_checkout}" in note
    assert f"pip install -e {other_checkout}" in note
    assert describe_trees(CHECKOUT / "tests") is None
    assert describe_trees(tmp_path) is None
