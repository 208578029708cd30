"""conv2d and conv_transpose2d whose input gradient is the other one, a first-order op: a cheap double backward.

R1, R2 and path length differentiate a gradient: ``autograd.grad(D(x), x, create_graph=True)`` records each conv's
input gradient, and the penalty's backward then differentiates that record. With plain ``F.conv2d`` or
``F.conv_transpose2d`` the record is PyTorch's ``ConvolutionBackward`` node, whose own derivative
(``_convolution_double_backward``) is generic:
- it convolves transposed [C, N, H, W] views of the activations: on oneDNN each is first copied to a contiguous
  tensor, 11% of an R1 step at 32 px in channels_last;
- for a grouped conv it runs one small convolution *per group* (the weight's part of the double backward): a
  depthwise conv of C channels makes C + 2 convolution calls there, R3GAN's D at 16 groups 17.8x the calls of its
  forward passes, growing with the groups.

``conv2d`` and ``conv_transpose2d`` below compute the same forward, but split the graph in two:
- the weight (and bias) gradient comes from autograd's native ``ConvolutionBackward`` of the op on ``x.detach()``;
- the input gradient comes from ``_InputGradient``, whose backward is the op's adjoint, with the same weight,
  stride, padding, dilation and groups: ``conv_transpose2d(grad, w)`` for a conv, ``conv2d(grad, w)`` for a
  transposed conv. It is recorded as an ordinary first-order op when ``create_graph`` is on, so differentiating it
  again is that op's own first-order backward (one convolution for the gradient's gradient, one weight gradient
  for ``w``, both grouped natively by oneDNN and cuDNN): no transposed copies, no loop over groups.

What it leaves out: the weight gradient is first-order in the input (``d(dL/dw)/dx`` is not recorded, since the
weight path sees ``x.detach()``). GAN penalties never need it: R1, R2, path length and WGAN-GP differentiate
gradients w.r.t. the network's *inputs*, whose derivatives w.r.t. the weights and the input are all exact here
(tests/test_networks_conv_input_grad.py checks them against F.conv2d and F.conv_transpose2d). A fork differentiating
weight gradients w.r.t. the input (meta-learning) uses the plain ``F`` functions there.

First-order steps make the same kernels (Dmain, Gmain: one input-gradient and one weight-gradient computation, as
before, two dispatches instead of one); R1's double backward measured 1.06-1.34x faster on a 2-core CPU
(`benchmarks/sg2_reference.py`). Where the input needs no gradient (images into D's first layer in Dmain) each is
the plain ``F`` function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IntPair = int | tuple[int, int]


def _pair(value: IntPair) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class _InputGradient(torch.autograd.Function):
    """Identity on ``output`` (the op applied to ``x.detach()``) that routes d/dx through the op's adjoint: for a
    conv (``transposed`` False) the transposed conv with the same weight and geometry, for a transposed conv the
    conv."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight: Tensor,
        output: Tensor,
        transposed: bool,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        groups: int,
    ) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.geometry = (transposed, stride, padding, dilation, groups)
        ctx.input_size = tuple(x.shape[-2:])
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        transposed, stride, padding, dilation, groups = ctx.geometry
        grad_input = None
        if ctx.needs_input_grad[0]:
            # Under autocast the forward ran in the autocast dtype; the cast keeps d/dweight flowing to the fp32 weight.
            weight = weight.to(grad.dtype)
            if transposed:
                grad_input = F.conv2d(
                    grad, weight, stride=stride, padding=padding, dilation=dilation, groups=groups
                )
                # With output_padding >= stride (allowed when the dilation is larger) the conv reads past the
                # input's size: those rows and columns belong to no input pixel.
                grad_input = grad_input[..., : ctx.input_size[0], : ctx.input_size[1]]
            else:
                size = weight.shape[-2:]
                # A strided conv maps several input sizes to one output size: the adjoint restores the exact one.
                output_padding = [
                    inp - ((out - 1) * s - 2 * p + d * (k - 1) + 1)
                    for inp, out, s, p, d, k in zip(
                        ctx.input_size, grad.shape[-2:], stride, padding, dilation, size, strict=True
                    )
                ]
                grad_input = F.conv_transpose2d(
                    grad,
                    weight,
                    stride=stride,
                    padding=padding,
                    output_padding=output_padding,
                    groups=groups,
                    dilation=dilation,
                )
        return grad_input, None, grad, None, None, None, None, None


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair = 0,
    dilation: IntPair = 1,
    groups: int = 1,
) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups)`` (numeric padding) with the input gradient as
    its own differentiable transposed convolution (see the module docstring)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    output = F.conv2d(
        x.detach(), weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    return _InputGradient.apply(x, weight, output, False, stride, padding, dilation, groups)


def conv_transpose2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair = 0,
    output_padding: IntPair = 0,
    groups: int = 1,
    dilation: IntPair = 1,
) -> Tensor:
    """``F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation)`` (its argument
    order) with the input gradient as its own differentiable convolution (see the module docstring)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation)
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    output = F.conv_transpose2d(x.detach(), weight, bias, stride, padding, output_padding, groups, dilation)
    return _InputGradient.apply(x, weight, output, True, stride, padding, dilation, groups)
