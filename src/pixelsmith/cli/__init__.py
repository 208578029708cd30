"""Entry points of an installed package: `pixelsmith-train` and `pixelsmith-evaluate` (also `python -m
pixelsmith.cli.train` / `python -m pixelsmith.cli.evaluate`), plus `pixelsmith-stylize`
(`pixelsmith.style.stylize`, which lives in the style part: README "Removing a part").
The benchmarks (`bench.py`, `benchmarks/`) are not part of the package: they run from a clone.

They do what `train.py` and `evaluate.py` at the repository root do, from any working directory: Hydra composes
the config tree installed with the package (`pixelsmith.paths.CONF_DIR`: the clone's `conf/` in an editable install,
`site-packages/pixelsmith/conf` in a plain one) and runs are written under `./outputs/` of the working directory.
"""
