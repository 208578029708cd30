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

# The template's operations beyond the plain loop's in an iteration that logs nothing (19 when this was written, 41
# before the guard, the counters and EMA's beta were batched, 97 before the bookkeeping was batched at all):
# - per optimizer: the gradient norm (3), one finite check over norm and loss that is also the fused step's found_inf
#   (3), and the fused step's taking back of its step count where it skipped (1);
# - the guard, every optimizer together (5): stack, one matrix-vector add for the count, two for the streaks, one
#   `where` into the trips plus its comparison;
# - EMA's beta, one row of a per-iteration table (1); both iteration counters (1); the static batch copy (1).
# On this vehicle (128 plain operations) that is 1.15x the plain loop. The margin lets two scalar ops in, not work
# per parameter.
MAX_EXTRA_OPS = 21


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


def test_bf16_adds_autocasts_casts_to_both_loops_alike(counts, tmp_path):
    """bf16-mixed, the GPU profiles' precision: autocast's casts are in both loops; the template's own bookkeeping is
    the same handful as in fp32 (no cast of its own per gradient, no precision-dependent step)."""
    template = op_counts.per_iteration(
        op_counts.template_counts("dcgan", 16, 12, tmp_path, precision="bf16-mixed")
    )
    plain = op_counts.per_iteration(op_counts.plain_counts("dcgan", 16, 12, tmp_path, "bf16-mixed"))
    fp32_template, fp32_plain = counts[16]
    assert plain["quiet"] > fp32_plain["quiet"]  # autocast really casts (weights and activations to bf16)
    assert template["quiet"] - plain["quiet"] <= MAX_EXTRA_OPS
    assert template["quiet"] - plain["quiet"] <= fp32_template["quiet"] - fp32_plain["quiet"] + 1


# The eager iteration's torch calls from Python beyond the plain loop's, in an iteration that logs nothing (33 when
# this was written, 59 before the guard's norm stopped calling `.to()` per gradient): detaches and casts of the logged
# values, the guard's norm, finite check and counters, the skip flag handed to fused Adam (whose take-back of its step
# count is torch's own). Each is host time in an eager GPU iteration, kernel or not.
MAX_EXTRA_CALLS = 36


def test_the_eager_iterations_host_calls_are_a_handful_and_do_not_grow_with_the_parameter_tensors(tmp_path):
    """`op_counts.eager_calls`: torch calls made from Python in the template's eager iteration against the plain
    loop's. Per-tensor host work (a `.to()` or a check per gradient, as `get_total_norm` does) grows with depth."""
    shallow = op_counts.eager_calls("dcgan", 16, 12, tmp_path)
    deep = op_counts.eager_calls("dcgan", 32, 12, tmp_path)
    extra = {
        name: r["template"]["quiet"] - r["plain"]["quiet"] for name, r in (("16", shallow), ("32", deep))
    }
    assert deep["plain"]["quiet"] > shallow["plain"]["quiet"]  # the deeper networks call more
    assert extra["32"] <= extra["16"] + 1, extra
    assert extra["16"] <= MAX_EXTRA_CALLS, extra


# ---- convolution calls of the regularised steps ------------------------------------------------------------------
# A conv on a penalty's path makes 5 calls in a regularised step (forward, input gradient, its recorded backward,
# the input gradient again and the weight gradient), the FIR filters 4: a step stays under 5x its forward passes.
# PyTorch's generic double backward adds a call per group of each grouped conv instead, so the bound is checked at
# two group counts (R3GAN's D at 16 groups was 17.8x with it).
MAX_STEP_TO_FORWARD = 5
R3GAN_GROUPS = (4, 16)


def test_a_regularised_step_makes_at_most_5x_the_convolutions_of_its_forward_passes_whatever_the_groups():
    rows = op_counts.convolution_calls(R3GAN_GROUPS)
    assert set(rows) == {
        "stylegan2 D, R1",
        "stylegan2 G, path length",
        *(f"r3gan D, R1 + R2, {groups} groups" for groups in R3GAN_GROUPS),
    }
    for name, calls in rows.items():
        assert calls.forward > 0 and calls.backward > 0, name
        assert calls.total <= MAX_STEP_TO_FORWARD * calls.forward, (name, calls.forward, calls.total)
    few, many = (rows[f"r3gan D, R1 + R2, {groups} groups"] for groups in R3GAN_GROUPS)
    assert (few.forward, few.total) == (many.forward, many.total)


def test_the_count_sees_pytorchs_generic_double_backward_loop_over_groups():
    """The same steps with plain F.conv2d / F.conv_transpose2d in the networks: R3GAN's D passes the bound no more,
    and its count grows with the groups (what the test above would catch)."""
    with op_counts.generic_convolutions():
        rows = op_counts.convolution_calls(R3GAN_GROUPS)
    few, many = (rows[f"r3gan D, R1 + R2, {groups} groups"] for groups in R3GAN_GROUPS)
    assert many.total > few.total > MAX_STEP_TO_FORWARD * few.forward
    # and the patch is undone: the networks are back to their adjoints
    again = op_counts.convolution_calls(R3GAN_GROUPS[-1:])
    assert again[f"r3gan D, R1 + R2, {R3GAN_GROUPS[-1]} groups"].total <= MAX_STEP_TO_FORWARD * many.forward
