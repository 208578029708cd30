"""Benchmark the template: `python bench.py [--full] [--repeats N] ...` (see docs/performance.md).

Thin on purpose: the matrix, the fresh-process runs, the plain-loop baseline and the reports live in
`benchmarks.gan_bench` (the `benchmarks/` package beside this file; the other benchmarks run as
`python -m benchmarks.<module>`).
"""

import sys
from pathlib import Path

# This checkout's code first, ahead of any pixelsmith installed in the environment: an editable install of another
# clone would otherwise run here, with this checkout's configs (pixelsmith.config.paths).
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from benchmarks.gan_bench import main

if __name__ == "__main__":
    sys.exit(main())
