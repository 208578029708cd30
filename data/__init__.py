"""The embedded data (MNIST digits, style images), installed as the package `pixelsmith.embedded_data`.

This file only makes the folder an importable package, so that a plain install (`pip install .`) carries the data
and `importlib.resources` finds it (see pyproject.toml and `pixelsmith.config.paths`).
"""
