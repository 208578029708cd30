"""What torch.compile did inside one block of code: the graphs Dynamo compiled there and the graphs inductor ran
without the CUDA graphs their compile mode asked for, counted for that block alone.

`torch._dynamo.utils.counters` is process-wide, and `torch._dynamo.reset()` (which every compiled run calls first)
does not clear it: "unique_graphs > 0" after a run only says that something compiled earlier in the process, so a
run that compiled nothing passed. `compile_counts()` takes the difference over the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch._dynamo.utils import counters


@dataclass
class CompileCounts:
    graphs: int = 0  # graphs Dynamo compiled (counters["stats"]["unique_graphs"])
    # Compiled graphs that ran without the CUDA graphs their mode (reduce-overhead, max-autotune) asked for:
    # inductor counts each, silently on a CPU device, with a "skipping cudagraphs due to ..." log on a GPU.
    cudagraph_skips: int = 0


def _now() -> CompileCounts:
    return CompileCounts(counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"])


def _since(before: int, after: int) -> int:
    # A counter cleared inside the block (counters.clear()) restarted from 0: all it holds is the block's.
    return after - before if after >= before else after


@contextmanager
def compile_counts() -> Iterator[CompileCounts]:
    """`with compile_counts() as counts: ...`; afterwards `counts.graphs` and `counts.cudagraph_skips` hold what the
    block alone compiled and skipped."""
    before, counts = _now(), CompileCounts()
    try:
        yield counts
    finally:
        after = _now()
        counts.graphs = _since(before.graphs, after.graphs)
        counts.cudagraph_skips = _since(before.cudagraph_skips, after.cudagraph_skips)
