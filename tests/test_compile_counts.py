"""`tests.compile_counts` counts what one block compiled, so a "did it compile" check can fail: a block that compiles
nothing counts 0 even after other compilations and `torch._dynamo.reset()`, which the process-wide counter the GPU
test set used to read does not show."""

from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tests.compile_counts import compile_counts


def _tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def test_a_compiled_block_counts_its_graphs_and_an_eager_one_counts_none():
    x = torch.randn(5, 3)
    # Dynamo's "eager" backend: Dynamo traces and counts as with inductor, without inductor's C++ compile time.
    compiled = torch.compile(_tiny(), backend="eager")
    with compile_counts() as first:
        torch._dynamo.reset()  # what a compiled training run does first
        compiled(x).sum().backward()
    assert first.graphs == 1 and first.cudagraph_skips == 0
    with compile_counts() as again:
        compiled(x)  # the cached graph: nothing new compiled
    assert again.graphs == 0

    with compile_counts() as eager:
        torch._dynamo.reset()
        _tiny()(x).sum().backward()
    assert eager.graphs == 0
    # The old check read the process-wide counter, which still holds the first block's graph: it would have passed.
    assert counters["stats"]["unique_graphs"] >= 1


def test_a_counter_cleared_inside_the_block_counts_from_zero():
    x = torch.randn(2, 3)
    torch.compile(_tiny(), backend="eager")(x)  # something compiled before: the counter is above 0
    with compile_counts() as counts:
        counters.clear()
        torch._dynamo.reset()
        torch.compile(_tiny(), backend="eager")(x)
    assert counts.graphs == 1
