"""Where the template's own files live: the config tree (CONF_DIR) and the embedded data (DATA_DIR).

One rule: both are package resources, found with `importlib.resources`. The repository keeps them at its top level
(`conf/`, `data/`: edit them there), and pyproject.toml installs those two folders as the packages
`pixelsmith.conf` and `pixelsmith.embedded_data` (a `package-dir` mapping), so

- in an editable install of a clone (`pip install -e .`) they ARE the clone's `conf/` and `data/`;
- in a plain install (`pip install .`, a wheel, a container) they are the copies installed beside the code
  (`site-packages/pixelsmith/conf`, `site-packages/pixelsmith/embedded_data`), found from any working directory.

Fallback: when those packages cannot be imported because `pixelsmith` was put on `sys.path` straight from a
checkout's `src/` (`PYTHONPATH=src`, or an editable install made before the mapping existed), the checkout's
`conf/` and `data/` two levels above this package are used. A zipped install is not supported (the files are read
by path).

Outputs never go to either place: Hydra writes runs under `outputs/` relative to the current working directory
(`conf/hydra/default.yaml`), whatever the install. REPO_ROOT is the clone's root when the package is imported from
a clone's `src/` (editable install, tests), else None (plain install: there is no repository).

The configs reach the embedded data through the resolver `${pixelsmith.data_dir:}` (`paths.data_dir` in
`conf/paths/default.yaml`), registered when this module is imported and by `register_resolvers()`.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from omegaconf import OmegaConf

from pixelsmith.launch import register_launch_resolvers

PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE_DIR.parents[1]  # the clone's root if this is <clone>/src/pixelsmith
REPO_ROOT: Path | None = (
    _CHECKOUT if PACKAGE_DIR.parent.name == "src" and (_CHECKOUT / "pyproject.toml").is_file() else None
)


def _resource_dir(package: str, checkout_dir: str) -> Path:
    try:
        return Path(str(importlib.resources.files(package)))
    except ModuleNotFoundError:
        return _CHECKOUT / checkout_dir


CONF_DIR = _resource_dir("pixelsmith.conf", "conf")
DATA_DIR = _resource_dir("pixelsmith.embedded_data", "data")
ASSETS_DIR = PACKAGE_DIR / "assets"


def register_resolvers() -> None:
    """`${pixelsmith.data_dir:}` = DATA_DIR (as a string), for configs that point at the embedded data; and the
    launch resolvers of conf/hydra/default.yaml (`pixelsmith.launch`)."""
    if not OmegaConf.has_resolver("pixelsmith.data_dir"):
        OmegaConf.register_new_resolver("pixelsmith.data_dir", lambda: str(DATA_DIR))
    register_launch_resolvers()  # the run dir's stamp, per-rank log file and .hydra


register_resolvers()
