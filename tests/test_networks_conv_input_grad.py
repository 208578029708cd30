"""conv_input_grad.conv2d: the same values and first and second derivatives as F.conv2d, in fp32, fp64 and bf16.

The function reroutes only how autograd records the input gradient (as a transposed conv) so that R1's and path
length's double backward skip PyTorch's generic convolution double backward; everything here compares it with
plain F.conv2d, which is the independent reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pixelsmith.gan.networks.conv_input_grad import conv2d

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


def test_bf16_autocast_gradients_reach_the_fp32_weight_and_input():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    weight = torch.randn(6, 4, 3, 3, requires_grad=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = conv2d(x, weight, None, padding=1)
        assert out.dtype == torch.bfloat16
        (grad,) = torch.autograd.grad(out.float().square().sum(), x, create_graph=True)
    grad.square().sum().backward()
    assert grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    reference_weight = weight.detach().clone().requires_grad_(True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        ref_out = F.conv2d(x, reference_weight, None, padding=1)
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
