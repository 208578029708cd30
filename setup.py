"""Setuptools hook for the one packaging setting pyproject.toml cannot express: the package list, discovered.

pyproject.toml holds everything else. A hand-written list there would name every sub-package, so deleting an
optional part (README "Removing a part": `src/pixelsmith/style/` or `src/pixelsmith/gan/`) would break the install
until the list was edited too. Discovery (`find_packages` under src/) needs no edit; the two top-level folders that
install as packages (`pixelsmith.config.paths`: the config tree and the embedded data, mapped in pyproject's
[tool.setuptools.package-dir]) and the hydra_plugins namespace package are added by name because no discovery finds
them: hydra_plugins has no __init__.py (a namespace shared with other plugins; listing it makes an editable install
put src/hydra_plugins on Hydra's plugin search path).
"""

from setuptools import find_packages, setup

MAPPED_PACKAGES = ["pixelsmith.conf", "pixelsmith.embedded_data"]  # conf/ and data/ (pyproject's package-dir)
NAMESPACE_PACKAGES = ["hydra_plugins"]  # the Optuna sweeper's (README "Sweeps")


def discovered_packages() -> list[str]:
    """Every package under src/ (those with an __init__.py), plus the mapped and namespace packages and the
    packages inside the latter (find_packages does not descend into a folder without an __init__.py)."""
    found = find_packages("src", include=["pixelsmith", "pixelsmith.*"])
    for namespace in NAMESPACE_PACKAGES:
        found += [f"{namespace}.{name}" for name in find_packages(f"src/{namespace}")]
    return sorted({*found, *MAPPED_PACKAGES, *NAMESPACE_PACKAGES})


if __name__ == "__main__":  # the build backend runs this file as __main__; tests import discovered_packages
    setup(packages=discovered_packages())
