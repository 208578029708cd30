"""Entry points of an installed package: `pixelsmith-train`, `pixelsmith-evaluate` and `pixelsmith-prepare` (also
`python -m pixelsmith.cli.train` / `.evaluate` / `.prepare`), plus `pixelsmith-stylize`
(`pixelsmith.style.stylize`, which lives in the style part: README "Removing a part"), `pixelsmith-generate`
(`pixelsmith.gan.generate`, in the GAN part) and `pixelsmith-convert` (`.convert` here registers the schemas, then
runs the GAN part's converter by its dotted path).
The benchmarks (`bench.py`, `benchmarks/`) are not part of the package: they run from a clone.

They do what `train.py`, `evaluate.py` and `prepare.py` at the repository root do, from any working directory: Hydra
composes the config tree installed with the package (`pixelsmith.config.paths.CONF_DIR`: the clone's `conf/` in an editable
install, `site-packages/pixelsmith/conf` in a plain one) and runs are written under `./outputs/` of the working
directory; `pixelsmith-prepare` takes key=value options of its own (no Hydra) and writes where `dest=` says.
"""
