"""Benchmark tooling for Pixelsmith: the GAN and style-transfer throughput benchmarks, the plain-PyTorch yardstick
loop, the metrics and tiling benchmarks, the template-overhead measurement and the plots of their results.

Not part of the `pixelsmith` wheel: these modules run from a repository checkout (`python bench.py ...` or
`python -m benchmarks.<module>` from the repository root) and import the training package, never the other way
round (`tests/test_architecture.py` checks that nothing under `src/pixelsmith` imports `benchmarks`).
"""
