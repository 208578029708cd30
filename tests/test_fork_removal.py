"""Removing a part (README "Removing a part"): deleting the paths FORK_PARTS lists for one part, and nothing else,
leaves a template that works. Each check runs on a copy of this checkout (its git-tracked and untracked-unignored
files) in tmp_path, with the part deleted:

- GAN-only fork (style deleted): every remaining module of src/pixelsmith imports, `train.yaml` composes alone and
  with each remaining experiment, the GAN main job trains a few iterations, the remaining tests collect without an
  error, and the fast general tests of the import layers and the configs pass.
- Style-only fork (GAN deleted): the same, with the style job: every remaining module imports (and `pixelsmith.gan`
  does not, not even through this checkout's editable install), the remaining experiments compose, the style job
  trains a few iterations, the remaining tests collect without an error, and the same fast general tests pass.

FORK_PARTS is the one list of what belongs to each part; the README quotes it and a fast test here checks that
every entry still matches something and that the README names it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CHECKOUT, FAST, LAUNCH_VARIABLES, SMALL, free_port

# What a fork deletes to drop a part (paths relative to the repository root; globs as pathlib's; a trailing "/"
# is a whole folder). Nothing outside these lists needs an edit.
FORK_PARTS: dict[str, tuple[str, ...]] = {
    "style": (
        "src/pixelsmith/style/",
        "conf/model/style_*.yaml",
        "conf/data/style_content.yaml",
        "conf/experiment/style_*.yaml",
        "data/style/",
        "stylize.py",
        "benchmarks/style_*.py",
        "tests/test_style_*.py",
    ),
    "gan": (
        "src/pixelsmith/gan/",
        "conf/model/dcgan.yaml",
        "conf/model/stylegan2.yaml",
        "conf/model/r3gan.yaml",
        "conf/model/objective/",
        "conf/experiment/dcgan_paper.yaml",
        "conf/experiment/mnist_*.yaml",
        "conf/experiment/stylegan2_*.yaml",
        "conf/experiment/r3gan_*.yaml",
        "conf/hparams_search/gan_optuna.yaml",
        "tests/test_gan_*.py",
        "tests/test_networks_*.py",
        "tests/test_train_gan.py",
        "tests/test_dcgan_paper.py",
        "tests/test_stylegan2_presets.py",
        "tests/fixtures/nvlabs/",
        "convert.py",
        "generate.py",
        "conf/generate.yaml",
    ),
}
# The GAN main job, tiny (as the other CLI tests run it): a narrow DCGAN on 256 MNIST digits, on CPU.
GAN_JOB = [*FAST, *SMALL["dcgan"], "max_steps=3"]
# The style job, tiny (as tests/test_style_train.py runs it): random VGG weights, 32 px crops, 8-channel networks.
STYLE_JOB = [
    "experiment=style_fast",
    "~local",
    "hardware=cpu",
    "train.progress_bar=false",
    "logger=csv",
    "max_steps=2",
    "model.loss_net.pretrained=false",
    "model.stylizer.base_channels=8",
    "model.stylizer.num_residual_blocks=1",
    "model.style_size=64",
    "model.validation.num_pairs=1",
    "model.validation.size=32",
    "data.batch_size=2",
    "data.resolution=32",
    "data.resize_shorter=48",
    "data.num_workers=0",
    "train.sample_every_n_steps=0",
]

# Imports every module of the copy's src/pixelsmith, then composes train.yaml alone and with each experiment left.
PROBE = """
import importlib, json, pkgutil, sys
sys.path.insert(0, "src")
import pixelsmith
assert pixelsmith.__file__.startswith(sys.argv[1]), pixelsmith.__file__
modules = [m.name for m in pkgutil.walk_packages(pixelsmith.__path__, "pixelsmith.")]
for name in modules:
    importlib.import_module(name)
from hydra import compose, initialize_config_dir
from pixelsmith.config.schema import register_configs
from pixelsmith.hardware.settings import register_detected_profile
from pixelsmith.parts import part_names
from pixelsmith.config.paths import CONF_DIR
register_configs()
register_detected_profile()
experiments = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))
models = {}
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    compose("evaluate")
    for overrides in [[], *[[f"experiment={name}"] for name in experiments]]:
        cfg = compose("train", overrides)
        models[" ".join(overrides) or "(main job)"] = cfg.model.get("_target_") if "model" in cfg else None
print(json.dumps({"modules": modules, "parts": part_names(), "models": models}))
"""


def _matches(root: Path, pattern: str) -> list[Path]:
    return sorted(root.glob(pattern.rstrip("/")))


def _fork(tmp_path: Path, part: str) -> Path:
    """A copy of this checkout without `part`, as a fork would have it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=CHECKOUT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    fork = tmp_path / f"without-{part}"
    for name in filter(None, listed.split("\0")):
        source = CHECKOUT / name
        if source.is_file():  # a deleted-but-still-listed file is not copied
            (fork / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, fork / name)
    for pattern in FORK_PARTS[part]:
        found = _matches(fork, pattern)
        assert found, f"FORK_PARTS[{part!r}]: {pattern} matches nothing"
        for path in found:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return fork


# An editable install (`pip install -e .`) adds an import finder that maps `pixelsmith` to this checkout's src/: it
# would hand the fork a deleted part (`import pixelsmith.gan` found here, not there). Python imports
# `sitecustomize` after the install's .pth files, so one on the fork's PYTHONPATH can drop that finder first.
DROP_EDITABLE_FINDERS = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""


def _run(fork: Path, args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """A command in the fork, with only the fork's code: its src/ and no editable install of this checkout on the
    import path, no launcher variables, its own port."""
    isolation = fork / ".isolation"
    isolation.mkdir(exist_ok=True)
    (isolation / "sitecustomize.py").write_text(DROP_EDITABLE_FINDERS)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and k != "PYTHONPATH"}
    env.update(
        HYDRA_FULL_ERROR="0",
        MASTER_PORT=str(free_port()),
        PYTHONPATH=os.pathsep.join([str(isolation), str(fork / "src")]),
    )
    return subprocess.run(
        [sys.executable, *args],
        cwd=fork,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def _probe(fork: Path) -> dict:
    return json.loads(_ok(_run(fork, ["-c", PROBE, str(fork)], timeout=300)).strip().splitlines()[-1])


def test_every_fork_part_entry_matches_the_tree_and_the_readme_quotes_it():
    from pixelsmith.parts import part_names

    readme = (CHECKOUT / "README.md").read_text()
    present = set(part_names())  # in a fork, the part it removed matches nothing, as it should
    assert present, "no part left"
    for part, patterns in FORK_PARTS.items():
        if part not in present:
            continue
        for pattern in patterns:
            assert _matches(CHECKOUT, pattern), f"FORK_PARTS[{part!r}]: {pattern} matches nothing"
            assert f"`{pattern}`" in readme, f'README "Removing a part" does not list `{pattern}`'
    assert "tests/test_fork_removal.py" in readme


@pytest.mark.slow
def test_a_gan_only_fork_trains_imports_composes_and_collects_its_tests(tmp_path):
    fork = _fork(tmp_path, "style")
    found = _probe(fork)
    assert found["parts"] == ["gan"]
    assert not [name for name in found["modules"] if name.split(".")[:2] == ["pixelsmith", "style"]]
    assert found["models"]["(main job)"] == "pixelsmith.gan.module.GANModule"

    run_dir = tmp_path / "gan-run"
    _ok(_run(fork, ["train.py", *GAN_JOB, f"hydra.run.dir={run_dir}"]))
    assert json.loads((run_dir / "final_metrics.json").read_text())["iteration"] == 3

    collected = _ok(_run(fork, ["-m", "pytest", "--collect-only", "-q", "--all", "-p", "no:cacheprovider"]))
    assert "error" not in collected.lower().split("collected")[-1], collected[-3000:]
    assert "tests/test_style_" not in collected
    fast = ["tests/test_architecture.py", "tests/test_config.py", "tests/test_config_ranges.py"]
    _ok(_run(fork, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *fast]))


@pytest.mark.slow
def test_a_style_only_fork_imports_composes_trains_and_collects_its_tests(tmp_path):
    fork = _fork(tmp_path, "gan")
    found = _probe(fork)
    assert found["parts"] == ["style"]
    assert not [name for name in found["modules"] if name.split(".")[:2] == ["pixelsmith", "gan"]]
    assert found["models"]["experiment=style_fast"] == "pixelsmith.style.module.FastStyleModule"

    run_dir = tmp_path / "style-run"
    _ok(_run(fork, ["train.py", *STYLE_JOB, f"hydra.run.dir={run_dir}"]))
    assert json.loads((run_dir / "final_metrics.json").read_text())["iteration"] == 2

    assert _run(fork, ["-c", "import pixelsmith.gan"]).returncode != 0  # not even through an editable install
    collected = _ok(_run(fork, ["-m", "pytest", "--collect-only", "-q", "--all", "-p", "no:cacheprovider"]))
    assert "error" not in collected.lower().split("collected")[-1], collected[-3000:]
    assert "tests/test_gan_" not in collected
    fast = ["tests/test_architecture.py", "tests/test_config.py", "tests/test_config_ranges.py"]
    _ok(_run(fork, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *fast]))
