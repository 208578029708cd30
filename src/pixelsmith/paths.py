"""Where the template's own files live (config tree, committed data), found relative to this package.

The package is installed in editable mode from a clone (`pip install -e .`), so the repository root is two levels
above `src/pixelsmith/`; a fork that moves `conf/` or `data/` changes it here once.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]
CONF_DIR = REPO_ROOT / "conf"
DATA_DIR = REPO_ROOT / "data"
ASSETS_DIR = PACKAGE_DIR / "assets"
