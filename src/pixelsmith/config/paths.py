"""Where the template's own files live: the config tree (CONF_DIR) and the embedded data (DATA_DIR).

One rule: the configs and data are the ones that belong to the code that runs.

- Code imported from a checkout's `src/` (an editable install, `PYTHONPATH=src`, the tests, `python train.py`,
  which puts its own checkout's `src/` first): that checkout's `conf/` and `data/`, beside `src/`. REPO_ROOT is
  that checkout's root.
- A plain install (`pip install .`, a wheel, a container): the copies installed beside the code as the packages
  `pixelsmith.conf` and `pixelsmith.embedded_data` (pyproject.toml's `package-dir` mapping), found with
  `importlib.resources` from any working directory. REPO_ROOT is None: there is no repository.

Why the checkout first: an editable install maps `pixelsmith.conf` to the folder of the clone it was made from. With
one clone's editable install in a venv, another clone's code (its `src/` on the path) found the first clone's configs
through that mapping, so a fork's config changes went untested without a word. `describe_trees()` says at start-up
which trees a run uses when they are not the ones of the current directory's checkout. A zipped install is not
supported (the files are read by path).

Outputs never go to either place: Hydra writes runs under `outputs/` relative to the current working directory
(`conf/hydra/default.yaml`), whatever the install.

The configs reach the embedded data through the resolver `${pixelsmith.data_dir:}` (`paths.data_dir` in
`conf/paths/default.yaml`), registered when this module is imported and by `register_resolvers()`.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from omegaconf import OmegaConf

from pixelsmith.parts import contributed
from pixelsmith.run.launch import register_launch_resolvers

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/pixelsmith (this file is in its config/)
_CHECKOUT = PACKAGE_DIR.parents[1]  # the clone's root if this is <clone>/src/pixelsmith
REPO_ROOT: Path | None = (
    _CHECKOUT if PACKAGE_DIR.parent.name == "src" and (_CHECKOUT / "pyproject.toml").is_file() else None
)


def _resource_dir(package: str, checkout_dir: str) -> Path:
    # The code's own checkout first, whatever an editable install maps `package` to.
    if REPO_ROOT is not None and (REPO_ROOT / checkout_dir).is_dir():
        return REPO_ROOT / checkout_dir
    try:
        return Path(str(importlib.resources.files(package)))
    except ModuleNotFoundError:
        return _CHECKOUT / checkout_dir


CONF_DIR = _resource_dir("pixelsmith.conf", "conf")
DATA_DIR = _resource_dir("pixelsmith.embedded_data", "data")
ASSETS_DIR = PACKAGE_DIR / "assets"


def checkout_of(directory: Path) -> Path | None:
    """The Pixelsmith checkout that contains `directory` (a folder with pyproject.toml, conf/ and
    src/pixelsmith/ at or above it), or None."""
    for candidate in (directory, *directory.parents):
        if (candidate / "pyproject.toml").is_file() and (candidate / "src" / "pixelsmith").is_dir():
            return candidate if (candidate / "conf").is_dir() else None
    return None


def describe_trees(cwd: Path | None = None) -> str | None:
    """None when this run's code and configs are those of the checkout the working directory is in (or when it is in
    none); else one paragraph saying which trees are used and why, for the entry points to log at start-up."""
    here = checkout_of((cwd or Path.cwd()).resolve())
    if here is None or (REPO_ROOT is not None and REPO_ROOT.resolve() == here):
        return None
    source = f"the checkout {REPO_ROOT}" if REPO_ROOT is not None else "the installed package"
    return (
        f"This run uses the code ({PACKAGE_DIR}), configs ({CONF_DIR}) and data ({DATA_DIR}) of {source}, not of "
        f"the checkout {here} you are in: `pixelsmith` is imported from there (the environment's install). To run "
        f"{here}'s own, use its scripts (`python train.py`, `python evaluate.py`, ... in {here}) "
        f"or install it into this environment (`pip install -e {here}`)."
    )


def register_resolvers() -> None:
    """`${pixelsmith.data_dir:}` = DATA_DIR (as a string), for configs that point at the embedded data; and the
    launch resolvers of conf/hydra/default.yaml (`pixelsmith.run.launch`); and each part's own (its `RESOLVERS`,
    e.g. the GAN part's StyleGAN2 'auto' heuristics)."""
    if not OmegaConf.has_resolver("pixelsmith.data_dir"):
        OmegaConf.register_new_resolver("pixelsmith.data_dir", lambda: str(DATA_DIR))
    register_launch_resolvers()  # the run dir's stamp, per-rank log file and .hydra
    for register in contributed("RESOLVERS"):
        register()


register_resolvers()
