"""conv_input_grad.conv2d and .conv_transpose2d: the same values and first and second derivatives as F.conv2d and
F.conv_transpose2d (grouped, depthwise, strided, padded, dilated), in fp32, fp64 and bf16, and a double backward
whose convolution calls do not grow with the groups.

The functions reroute only how autograd records the input gradient (as the adjoint op) so that R1's, R2's and path
length's double backward skip PyTorch's generic convolution double backward; everything here compares them with
plain F.conv2d / F.conv_transpose2d, the independent reference, and with finite differences (gradcheck,
gradgradcheck)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.op_counts import ConvolutionCalls
from pixelsmith.gan.networks.conv_input_grad import conv2d, conv_transpose2d

# (stride, padding, kernel, input size): D's 3x3 convs, its stride-2 conv after the blur (odd input: H + 1), the 1x1s.
CASES = [(1, 1, 3, 8), (2, 0, 3, 9), (2, 0, 3, 8), (1, 0, 1, 6), (2, 1, 3, 7)]


def r1_style_penalty(conv, x, weight, bias):
    """sum of squared d(sum(tanh(conv)))/dx, differentiated again w.r.t. x, weight and bias (R1's structure)."""
    x = x.detach().requires_grad_(True)
    out = torch.tanh(conv(x, weight, bias))
    (grad,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    penalty = grad.square().sum() + out.sum() * 0.3
    return torch.autograd.grad(penalty, (x, weight, bias))


@pytest.mark.parametrize(("stride", "padding", "kernel", "size"), CASES)
def test_values_and_first_and_second_derivatives_equal_plain_conv2d(stride, padding, kernel, size):
    torch.manual_seed(0)
    x = torch.randn(3, 4, size, size, dtype=torch.float64)
    weight = torch.randn(5, 4, kernel, kernel, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def plain(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding)

    def ours(x, w, b):
        return conv2d(x, w, b, stride=stride, padding=padding)

    torch.testing.assert_close(ours(x, weight, bias), plain(x, weight, bias), rtol=0, atol=0)
    for got, expected in zip(
        r1_style_penalty(ours, x, weight, bias), r1_style_penalty(plain, x, weight, bias), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    # And against finite differences: second derivatives through the input path, the weight a constant.
    x_leaf = x.clone().requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda x: ours(x, weight.detach(), bias.detach()).tanh(), (x_leaf,))


def test_the_weight_gradient_is_first_order_in_the_input_as_documented():
    # The one derivative the split leaves out: d(dL/dweight)/dx (no GAN penalty uses it: R1, R2, path length and
    # WGAN-GP differentiate input gradients). Pinned here so that a change of it is a decision, not an accident.
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    (grad_weight,) = torch.autograd.grad(
        conv2d(x, weight, padding=1).square().sum(), weight, create_graph=True
    )
    (through_plain,) = torch.autograd.grad(
        torch.autograd.grad(F.conv2d(x, weight, padding=1).square().sum(), weight, create_graph=True)[
            0
        ].sum(),
        x,
    )
    (through_ours,) = torch.autograd.grad(grad_weight.sum(), x, allow_unused=True)
    assert through_plain.abs().sum() > 0
    assert through_ours is None or not torch.allclose(through_ours, through_plain)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_bf16_autocast_gradients_reach_the_fp32_weight_and_input(groups):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    weight = torch.randn(8, 4 // groups, 3, 3, requires_grad=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = conv2d(x, weight, None, padding=1, groups=groups)
        assert out.dtype == torch.bfloat16
        (grad,) = torch.autograd.grad(out.float().square().sum(), x, create_graph=True)
    grad.square().sum().backward()
    assert grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    reference_weight = weight.detach().clone().requires_grad_(True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        ref_out = F.conv2d(x, reference_weight, None, padding=1, groups=groups)
        (ref_grad,) = torch.autograd.grad(ref_out.float().square().sum(), x, create_graph=True)
    ref_grad.square().sum().backward()
    torch.testing.assert_close(grad, ref_grad, rtol=2e-2, atol=2e-2 * ref_grad.abs().max().item())
    torch.testing.assert_close(
        weight.grad, reference_weight.grad, rtol=2e-2, atol=2e-2 * reference_weight.grad.abs().max().item()
    )


def test_without_an_input_gradient_it_is_plain_conv2d_and_records_only_the_weight():
    x = torch.randn(2, 3, 8, 8)
    weight = torch.randn(4, 3, 1, 1, requires_grad=True)
    out = conv2d(x, weight)
    assert type(out.grad_fn).__name__ == "ConvolutionBackward0"
    out_with_input = conv2d(x.requires_grad_(True), weight)
    assert type(out_with_input.grad_fn).__name__ == "_InputGradientBackward"
    transposed = conv_transpose2d(x, torch.randn(3, 4, 3, 3), stride=2)
    assert type(transposed.grad_fn).__name__ == "_InputGradientBackward"
    assert (
        type(conv_transpose2d(x.detach(), weight.transpose(0, 1)).grad_fn).__name__ == "ConvolutionBackward0"
    )


# Grouped convs: (in, out, groups, stride, padding, dilation, kernel, input size). R3GAN's blocks (grouped 3x3, 'same'
# padding), its D's head (depthwise 4x4 on 4x4 -> 1x1), a depthwise conv with a channel multiplier at stride 2 on
# an odd size, a dilated grouped one, and a depthwise one with more channels than the others.
GROUPED = [
    (8, 8, 2, 1, 1, 1, 3, 8),
    (8, 8, 4, 1, 1, 1, 3, 6),
    (4, 4, 4, 1, 0, 1, 4, 4),
    (4, 8, 4, 2, 0, 1, 3, 9),
    (6, 6, 3, 2, 1, 2, 3, 9),
    (12, 12, 12, 1, 1, 1, 3, 5),
]
# Transposed convs: (in, out, groups, stride, padding, output_padding, dilation, kernel, input size). StyleGAN2's
# upsampling conv (stride 2, no padding), grouped and depthwise ones with padding and output_padding, a dilated one
# whose output_padding is at least its stride (allowed as it is below the dilation).
TRANSPOSED = [
    (4, 6, 1, 2, 0, 0, 1, 3, 5),
    (4, 8, 2, 2, 1, 1, 1, 3, 5),
    (4, 4, 4, 1, 1, 0, 1, 3, 6),
    (6, 6, 3, 2, 1, 1, 2, 3, 5),
    (4, 4, 4, 2, 1, 2, 3, 3, 4),
]


def _grouped_case(in_channels, out_channels, groups, stride, padding, dilation, kernel, size):
    torch.manual_seed(0)
    x = torch.randn(2, in_channels, size, size, dtype=torch.float64)
    weight = torch.randn(out_channels, in_channels // groups, kernel, kernel, dtype=torch.float64)
    bias = torch.randn(out_channels, dtype=torch.float64)
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}

    def plain(x, w, b):
        return F.conv2d(x, w, b, **geometry)

    def ours(x, w, b):
        return conv2d(x, w, b, **geometry)

    return x, weight.requires_grad_(True), bias.requires_grad_(True), plain, ours


def _transposed_case(
    in_channels, out_channels, groups, stride, padding, output_padding, dilation, kernel, size
):
    torch.manual_seed(0)
    x = torch.randn(2, in_channels, size, size, dtype=torch.float64)
    weight = torch.randn(in_channels, out_channels // groups, kernel, kernel, dtype=torch.float64)
    bias = torch.randn(out_channels, dtype=torch.float64)
    geometry = {
        "stride": stride,
        "padding": padding,
        "output_padding": output_padding,
        "groups": groups,
        "dilation": dilation,
    }

    def plain(x, w, b):
        return F.conv_transpose2d(x, w, b, **geometry)

    def ours(x, w, b):
        return conv_transpose2d(x, w, b, **geometry)

    return x, weight.requires_grad_(True), bias.requires_grad_(True), plain, ours


CASES_BOTH = [pytest.param(_grouped_case, case, id=f"conv2d{case}") for case in GROUPED] + [
    pytest.param(_transposed_case, case, id=f"conv_transpose2d{case}") for case in TRANSPOSED
]


@pytest.mark.parametrize(("make", "case"), CASES_BOTH)
def test_grouped_and_transposed_values_and_penalty_derivatives_equal_pytorchs(make, case):
    x, weight, bias, plain, ours = make(*case)
    torch.testing.assert_close(ours(x, weight, bias), plain(x, weight, bias), rtol=0, atol=0)
    # The first derivatives (the gradient with create_graph, as R1 takes it) and the second (the penalty's gradient
    # w.r.t. the input, the weight and the bias) against PyTorch's generic convolution backward and double backward.
    x_leaf = x.clone().requires_grad_(True)
    first_ours = torch.autograd.grad(ours(x_leaf, weight, bias).tanh().sum(), (x_leaf, weight, bias))
    first_plain = torch.autograd.grad(plain(x_leaf, weight, bias).tanh().sum(), (x_leaf, weight, bias))
    for got, expected in zip(first_ours, first_plain, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    for got, expected in zip(
        r1_style_penalty(ours, x, weight, bias), r1_style_penalty(plain, x, weight, bias), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("make", "case"), CASES_BOTH)
def test_grouped_and_transposed_second_derivatives_match_finite_differences(make, case):
    x, weight, bias, _, ours = make(*case)
    # Through the input path, the weight a constant: every derivative order of the input gradient.
    x_leaf = x.clone().requires_grad_(True)
    # fast_mode: the Jacobians projected on random vectors, seconds instead of a column per input element.
    assert torch.autograd.gradgradcheck(
        lambda x: ours(x, weight.detach(), bias.detach()).tanh(), (x_leaf,), fast_mode=True
    )

    # A gradient-norm penalty as a function of the input, the weight and the bias: its gradient (the double
    # backward R1 needs) against central differences of the penalty itself.
    def penalty(x, w, b):
        x_inner = x if x.requires_grad else x.requires_grad_(True)
        (grad,) = torch.autograd.grad(ours(x_inner, w, b).tanh().square().sum(), x_inner, create_graph=True)
        return grad.square().sum()

    assert torch.autograd.gradcheck(penalty, (x_leaf, weight, bias), fast_mode=True)


def _double_backward_calls(conv, channels: int, groups: int, transposed: bool) -> ConvolutionCalls:
    x = torch.randn(2, channels, 8, 8, requires_grad=True)
    weight = torch.randn(channels, channels // groups, 3, 3, requires_grad=True)
    with ConvolutionCalls() as calls:
        out = conv(x, weight, None, 2, 1, 1, groups) if transposed else conv(x, weight, None, 1, 1, 1, groups)
        (grad,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        grad.square().sum().backward()
    return calls


@pytest.mark.parametrize(
    ("ours", "plain", "transposed"),
    [(conv2d, F.conv2d, False), (conv_transpose2d, F.conv_transpose2d, True)],
    ids=["conv2d", "conv_transpose2d"],
)
def test_the_double_backward_makes_a_fixed_number_of_convolution_calls_whatever_the_groups(
    ours, plain, transposed
):
    # The forward; the input gradient (the adjoint); then the penalty's backward: the recorded adjoint's backward (one
    # call for its input and its weight), the adjoint again (the gradient reaching the conv's output goes on to x) and
    # the forward's weight gradient. PyTorch's generic double backward runs one convolution per group for the
    # weight's part instead of one.
    counts = {groups: _double_backward_calls(ours, 64, groups, transposed).total for groups in (1, 16, 64)}
    assert counts == {1: 5, 16: 5, 64: 5}
    generic = {groups: _double_backward_calls(plain, 64, groups, transposed).total for groups in (16, 64)}
    assert generic[64] - generic[16] == 48  # the counter sees the per-group calls where they happen
