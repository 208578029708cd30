"""The environment of a benchmark's child process (`python -m benchmarks.<module> --child ...`): standard library
only, so a child that measures its own memory pays for nothing it did not ask for."""

from __future__ import annotations

import os
from pathlib import Path

# The checkout holding `benchmarks/` (and `bench.py`): first on a child's PYTHONPATH, so `-m benchmarks...` and the
# clock's `_target_` resolve whatever the working directory (`python /path/to/bench.py`, the Docker image's /app).
CHECKOUT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout first on PYTHONPATH, plus `extra`."""
    path = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}
