"""Packaging: a plain (non-editable) install carries the config tree and the embedded data and trains from any
working directory; pyproject.toml declares supported ranges and constraints.txt pins the tested set."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pixelsmith.config.paths import CONF_DIR, DATA_DIR, REPO_ROOT
from tests.conftest import SMALL, run_cli

REPO = Path(__file__).resolve().parents[1]
# What the build reads; copied so that the build's build/ and *.egg-info never land in the working tree.
BUILD_INPUTS = ["pyproject.toml", "setup.py", "README.md", "src", "conf", "data"]
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
# The general entry points; a part's own (pixelsmith-stylize) is checked by the part's tests (test_style_stylize.py).
SCRIPTS = {
    "pixelsmith-train": "pixelsmith.cli.train:main",
    "pixelsmith-evaluate": "pixelsmith.cli.evaluate:main",
    "pixelsmith-prepare": "pixelsmith.cli.prepare:main",
}


def _files(folder: Path) -> list[Path]:
    return sorted(
        p.relative_to(folder)
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            pins[canonicalize_name(name)] = version.strip()
    return pins


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` would install, built (without dependencies or network) from a copy of the tree."""
    root = tmp_path_factory.mktemp("wheel")
    tree = root / "tree"
    tree.mkdir()
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=JUNK)
        else:
            shutil.copy2(source, tree / name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--disable-pip-version-check", "-q", "-w", str(root / "dist"), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (built,) = (root / "dist").glob("pixelsmith-*.whl")
    return built


@pytest.mark.slow
def test_wheel_carries_every_config_data_file_module_and_entry_point(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    expected = {
        # conf/local/default.yaml is a developer's own (git-ignored, excluded from the wheel)
        "pixelsmith/conf": [p for p in _files(REPO / "conf") if p.as_posix() != "local/default.yaml"],
        "pixelsmith/embedded_data": _files(REPO / "data"),
        "pixelsmith": _files(REPO / "src" / "pixelsmith"),
        "hydra_plugins": _files(REPO / "src" / "hydra_plugins"),  # the Optuna sweeper plugin
    }
    assert any(p.name == "train.yaml" for p in expected["pixelsmith/conf"])
    assert Path("mnist_5k.npz") in expected["pixelsmith/embedded_data"]
    for prefix, files in expected.items():
        missing = [str(p) for p in files if f"{prefix}/{p.as_posix()}" not in names]
        assert not missing, (
            f"not in the wheel under {prefix}/: {missing} (package-data globs in pyproject.toml, "
            "[tool.setuptools] packages in pyproject.toml)"
        )
    for script, target in SCRIPTS.items():
        assert f"{script} = {target}" in scripts


@pytest.mark.slow
def test_plain_install_trains_from_any_directory_with_packaged_configs_and_data(wheel, tmp_path):
    site = tmp_path / "site"  # the wheel unpacked = what `pip install .` puts in site-packages
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    work = tmp_path / "work"  # an unrelated working directory: no conf/, no data/
    work.mkdir()
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}

    # pixelsmith, its configs and its data come from the wheel, not from this checkout's src/.
    probe = """
import json, pixelsmith, pixelsmith.cli.train
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from pixelsmith.config.schema import register_configs
from pixelsmith.config.paths import CONF_DIR, DATA_DIR, REPO_ROOT
register_configs()
sweepers = [f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)]
import hydra_plugins.pixelsmith_optuna_sweeper.optuna_sweeper as sweeper_module
def data_keys(node, prefix=""):  # the dotted keys of every value that names the embedded data
    if isinstance(node, dict):
        for key, value in node.items():
            yield from data_keys(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from data_keys(value, f"{prefix}{index}.")
    elif isinstance(node, str) and "${paths.data_dir}" in node:
        yield prefix[:-1]
data_paths = {}  # every experiment's data paths (a model's content photos, style images, ...), resolved
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    for experiment in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        cfg = compose("train", [f"experiment={experiment.stem}"])
        for key in data_keys(OmegaConf.to_container(cfg, resolve=False)):
            data_paths[f"{experiment.stem}: {key}"] = OmegaConf.select(cfg, key)
print(json.dumps({
    "package": pixelsmith.__file__, "cli": pixelsmith.cli.train.__file__, "conf": str(CONF_DIR),
    "data": str(DATA_DIR), "repo_root": None if REPO_ROOT is None else str(REPO_ROOT),
    "data_paths": data_paths, "sweepers": sweepers, "sweeper_file": sweeper_module.__file__,
}))
"""
    result = run_cli(["-c", probe], cwd=work, timeout=120, env_extra=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    package = (site / "pixelsmith").resolve()
    assert Path(found["package"]).resolve() == package / "__init__.py"
    assert Path(found["cli"]).resolve() == package / "cli" / "train.py"
    assert Path(found["conf"]).resolve() == package / "conf"
    assert Path(found["data"]).resolve() == package / "embedded_data"
    assert found["repo_root"] is None
    # Every experiment's embedded-data path (conf/paths data_dir) exists inside the installed package.
    for where, path in found["data_paths"].items():
        assert Path(path).exists() and Path(path).resolve().is_relative_to(package / "embedded_data"), where
    # Hydra's plugin scan finds the Optuna sweeper the wheel installs (hparams_search=gan_optuna needs it).
    assert "hydra_plugins.pixelsmith_optuna_sweeper.optuna_sweeper.OptunaSweeper" in found["sweepers"]
    assert Path(found["sweeper_file"]).resolve().is_relative_to(site.resolve() / "hydra_plugins")

    # `python -m pixelsmith.cli.train` (what `pixelsmith-train` calls) trains on the packaged MNIST digits and
    # writes its run under ./outputs of the working directory.
    args = ["debug=fast", "max_steps=2", "hardware=cpu", "train.progress_bar=false", "logger=csv"]
    args += ["eval.every_n_steps=0", *SMALL["dcgan"]]
    result = run_cli(["-m", "pixelsmith.cli.train", *args], cwd=work, timeout=300, env_extra=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(p.name for p in work.iterdir()) == ["outputs"]
    (run_dir,) = (work / "outputs" / "debug" / "runs").iterdir()
    assert json.loads((run_dir / "final_metrics.json").read_text())["iteration"] == 2
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "samples" / "step_0000002.png").is_file()
    assert (run_dir / "train.log").is_file()  # Hydra's job name is the entry point's, as with train.py
    resolved = OmegaConf.load(run_dir / "config_resolved.yaml")
    assert Path(resolved.paths.data_dir).resolve() == package / "embedded_data"
    sources = OmegaConf.load(run_dir / ".hydra" / "hydra.yaml").hydra.runtime.config_sources
    assert any(s.provider == "main" and Path(s.path).resolve() == package / "conf" for s in sources)


@pytest.mark.slow
def test_plain_install_prepares_a_dataset_with_pixelsmith_prepare(wheel, tmp_path):
    """`python -m pixelsmith.cli.prepare` (what `pixelsmith-prepare` calls) from the wheel alone: images -> a zip."""
    from PIL import Image

    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        Image.new("RGB", (20, 12), (40 * i, 0, 0)).save(images / f"{i}.png")
    work = tmp_path / "work"
    work.mkdir()
    env = {"PYTHONPATH": str(site)}
    probe = "import pixelsmith.cli.prepare as m; print(m.__file__)"
    result = run_cli(["-c", probe], cwd=work, timeout=60, env_extra=env)
    assert Path(result.stdout.strip()).resolve() == (site / "pixelsmith" / "cli" / "prepare.py").resolve()
    args = [
        "-m",
        "pixelsmith.cli.prepare",
        f"source={images}",
        "dest=out.zip",
        "resolution=8",
        "progress=false",
    ]
    result = run_cli(args, cwd=work, timeout=120, env_extra=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "wrote 3 images to out.zip (8x8, 3 channels" in result.stdout
    with zipfile.ZipFile(work / "out.zip") as archive:
        assert sorted(archive.namelist()) == [
            "00000/img00000000.png",
            "00000/img00000001.png",
            "00000/img00000002.png",
            "dataset.json",
        ]
    result = run_cli(["-m", "pixelsmith.cli.prepare", "--help"], cwd=work, timeout=60, env_extra=env)
    assert "pixelsmith-prepare source=IN dest=OUT.zip resolution=N" in result.stdout
    result = run_cli(
        ["-m", "pixelsmith.cli.prepare", "source=x", "dest=y.zip"], cwd=work, timeout=60, env_extra=env
    )
    assert result.returncode == 2 and result.stderr.startswith("pixelsmith-prepare: ")


def test_checkout_resolves_conf_and_data_to_the_repository_folders():
    # In this checkout (editable install or src/ on sys.path) the resources are the repo's own conf/ and data/.
    assert CONF_DIR.resolve() == REPO / "conf" and DATA_DIR.resolve() == REPO / "data"
    assert REPO_ROOT is not None and REPO_ROOT.resolve() == REPO
    cfg = OmegaConf.load(CONF_DIR / "paths" / "default.yaml")
    assert Path(cfg.data_dir) == DATA_DIR  # the ${pixelsmith.data_dir:} resolver
    assert (DATA_DIR / "mnist_5k.npz").is_file() and (CONF_DIR / "hardware" / "cpu.yaml").is_file()


def test_hydra_finds_the_optuna_sweeper_plugin_of_this_checkout():
    # Hydra discovers plugins by scanning the hydra_plugins namespace package. An editable install hides a namespace
    # package's folder from that scan unless pyproject.toml lists "hydra_plugins" among the packages.
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    module = "hydra_plugins.pixelsmith_optuna_sweeper.optuna_sweeper"
    (found,) = [c for c in Plugins.instance().discover(Sweeper) if c.__module__ == module]
    assert found.__name__ == "OptunaSweeper"
    assert (
        Path(sys.modules[found.__module__].__file__).resolve().is_relative_to(REPO / "src" / "hydra_plugins")
    )
    assert {"hydra_plugins", "hydra_plugins.pixelsmith_optuna_sweeper"} <= set(_setup_packages())


def _setup_packages() -> list[str]:
    """The package list setup.py gives setuptools (discovered, so a deleted part needs no edit)."""
    return runpy.run_path(str(REPO / "setup.py"), run_name="discovery")["discovered_packages"]()


def test_the_package_list_is_discovered_so_a_part_can_be_deleted():
    packages = set(_setup_packages())
    assert "packages" not in _pyproject()["tool"]["setuptools"], "discovered by setup.py, not listed by hand"
    under_src = {
        ".".join(init.parent.relative_to(REPO / "src").parts) for init in (REPO / "src").rglob("__init__.py")
    }
    assert under_src <= packages
    assert {"pixelsmith.conf", "pixelsmith.embedded_data", "hydra_plugins"} <= packages


def test_pyproject_declares_ranges_and_constraints_pin_a_tested_point_in_them():
    project = _pyproject()["project"]
    runtime = [Requirement(r) for r in project["dependencies"]]
    extras = [Requirement(r) for reqs in project["optional-dependencies"].values() for r in reqs]
    by_name = {canonicalize_name(r.name): r for r in runtime}

    for req in runtime:  # ranges, never exact pins: an installed compatible torch (a CUDA build) is kept
        operators = {spec.operator for spec in req.specifier}
        assert not operators & {"==", "==="}, (
            f"{req}: declare a range in pyproject.toml, pin in constraints.txt"
        )
        assert ">=" in operators and "<" in operators, f"{req}: needs a lower and an upper bound"
    for name, admitted, refused in [
        ("torch", ["2.6.0", "2.11.0", "2.14.1"], ["2.5.1", "3.0.0"]),
        ("torchvision", ["0.21.0", "0.26.0", "0.29.1"], ["1.0.0"]),
        ("lightning", ["2.5.0", "2.6.6"], ["3.0.0"]),
    ]:
        spec = by_name[name].specifier
        assert all(spec.contains(v) for v in admitted) and not any(spec.contains(v) for v in refused), spec
    python = Requirement(f"python{project['requires-python']}").specifier
    assert all(python.contains(v) for v in ["3.11.0", "3.12.0", "3.13.0"])

    pins = _constraints()
    for req in runtime + extras:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} has no pin in constraints.txt"
        assert req.specifier.contains(pins[name]), f"constraints.txt pins {name}=={pins[name]} outside {req}"
    first = (REPO / "constraints.txt").read_text().splitlines()[0]
    assert first.startswith("#") and "tested" in first and "torch " + pins["torch"] in first

    # The documented install and CI install the tested set.
    assert 'pip install -q -c constraints.txt -e ".[dev]"' in (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert readme.count('pip install -q -c constraints.txt -e ".[dev]"') >= 2
    assert set(project["scripts"]) >= set(SCRIPTS)


def test_the_license_file_and_the_pre_commit_hooks_match_the_project():
    import yaml

    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    assert _pyproject()["project"]["license"] == "MIT"
    (hooks,) = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"]
    assert hooks["repo"].endswith("/ruff-pre-commit")
    assert hooks["rev"] == "v" + _constraints()["ruff"]  # the ruff CI runs, not another minor's formatting
    assert {hook["id"] for hook in hooks["hooks"]} == {"ruff", "ruff-format"}
