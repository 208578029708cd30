"""Benchmark the template: `python bench.py [--full] [--repeats N] ...` (see docs/performance.md).

Thin on purpose: the matrix, the fresh-process runs, the plain-loop baseline and the reports live in
`benchmarks.gan_bench` (the `benchmarks/` package beside this file; the other benchmarks run as
`python -m benchmarks.<module>`).
"""

import sys

from benchmarks.gan_bench import main

if __name__ == "__main__":
    sys.exit(main())
