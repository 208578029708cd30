"""The config tree, installed as the package `pixelsmith.conf` (see pyproject.toml and `pixelsmith.config.paths`).

This file only makes the folder an importable package, so that a plain install (`pip install .`) carries the configs
and `importlib.resources` / Hydra's `pkg://pixelsmith.conf` find them; edit the YAML files beside it.
"""
