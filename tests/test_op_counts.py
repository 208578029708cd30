"""The template's per-iteration bookkeeping stays a handful of kernels (`benchmarks/op_counts.py`): aten operations
of its graphed iteration (uncaptured on CPU) against the plain loop's, DCGAN at two depths.

Work per parameter tensor (a cast, a copy or a check per gradient) would make the template's count grow faster
than the plain loop's from 16 px to 32 px (two more layers in G and D); a chain of scalar operations would raise
the fixed difference."""

from __future__ import annotations

import pytest

# DCGAN and StyleGAN2 are the vehicles: a fork without the GAN part (README "Removing a part") skips this file.
pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")

from benchmarks import op_counts  # noqa: E402

# The template's operations beyond the plain loop's in an iteration that logs nothing: per optimizer the gradient
# norm, one finite check over norm and loss, the fused step's found_inf and the guard's counters; EMA's device beta;
# the iteration counters and the static batch copy. 41 when this was written (97 before the bookkeeping was
# batched); the margin lets a scalar op or two in, not work per parameter.
MAX_EXTRA_OPS = 46


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("op_counts")
    result = {}
    for resolution in (16, 32):
        template = op_counts.template_counts("dcgan", resolution, 12, tmp)
        plain = op_counts.plain_counts("dcgan", resolution, 12, tmp)
        result[resolution] = (op_counts.per_iteration(template), op_counts.per_iteration(plain))
    return result


def test_bookkeeping_does_not_grow_with_the_parameter_tensors(counts):
    (template16, plain16), (template32, plain32) = counts[16], counts[32]
    assert plain32["quiet"] > plain16["quiet"]  # the deeper networks do launch more
    assert template32["quiet"] - template16["quiet"] <= plain32["quiet"] - plain16["quiet"] + 1


def test_bookkeeping_is_a_handful_of_operations(counts):
    template, plain = counts[16]
    assert template["quiet"] - plain["quiet"] <= MAX_EXTRA_OPS
