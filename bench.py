"""Benchmark the template: `python bench.py [--full] [--repeats N] ...` (see docs/performance.md).

Thin on purpose: the matrix, the fresh-process runs, the plain-loop baseline and the reports live in
`pixelsmith.perf.bench`.
"""

import sys

from pixelsmith.perf.bench import main

if __name__ == "__main__":
    sys.exit(main())
