"""The environment of a benchmark's child process (`python -m benchmarks.<module> --child ...`): standard library
only, so a child that measures its own memory pays for nothing it did not ask for."""

from __future__ import annotations

import os
from pathlib import Path

# The checkout holding `benchmarks/` (and `bench.py`): first on a child's PYTHONPATH, so `-m benchmarks...` and the
# clock's `_target_` resolve whatever the working directory (`python /path/to/bench.py`, the Docker image's /app).
CHECKOUT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout (and its `src/`) first on PYTHONPATH, plus `extra`."""
    # src/ too: with pixelsmith installed editable from another checkout (a git worktree beside the main one), a
    # child would otherwise import that checkout's code and measure it instead of this one's.
    source = CHECKOUT / "src"
    own = [str(CHECKOUT), *([str(source)] if (source / "pixelsmith").is_dir() else [])]
    path = os.pathsep.join(filter(None, [*own, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}
