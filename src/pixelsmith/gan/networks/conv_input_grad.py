"""conv2d whose input gradient is an ordinary (differentiable) transposed convolution: cheaper double backward.

R1 and path length differentiate a gradient: ``autograd.grad(D(x), x, create_graph=True)`` records each conv's input
gradient, and the penalty's backward then differentiates that record. With plain ``F.conv2d`` the record is
PyTorch's ``ConvolutionBackward`` node, whose own derivative (``_convolution_double_backward``) convolves transposed
[C, N, H, W] views of the activations: on oneDNN each is first copied to a contiguous tensor, 11% of an R1 step at
32 px in channels_last.

``conv2d`` below computes the same forward, but splits the graph in two:
- the weight (and bias) gradient comes from autograd's native ``ConvolutionBackward`` of ``conv2d(x.detach(), w)``;
- the input gradient comes from ``_InputGradient``, whose backward is ``conv_transpose2d(grad, w)``: the adjoint of
  the convolution, recorded as a first-order op when ``create_graph`` is on. Differentiating it again is that op's
  ordinary backward (a convolution for the gradient's gradient, a weight gradient for ``w``), with no transposed
  copies.

What it leaves out: the weight gradient is first-order in the input (``d(dL/dw)/dx`` is not recorded, since the
weight path sees ``x.detach()``). GAN penalties never need it: R1, R2, path length and WGAN-GP differentiate
gradients w.r.t. the network's *inputs*, whose derivatives w.r.t. the weights and the input are all exact here
(tests/test_networks_conv_input_grad.py checks them against F.conv2d). A fork differentiating weight gradients w.r.t. the
input (meta-learning) uses plain ``F.conv2d`` there.

First-order steps are unchanged in cost (Dmain, Gmain: one input-gradient and one weight-gradient call, as
before); R1's double backward measured 1.06-1.34x faster on a 2-core CPU (`benchmarks/sg2_reference.py`). Where the
input needs no gradient (images into D's first layer in Dmain) it is plain ``F.conv2d``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class _InputGradient(torch.autograd.Function):
    """Identity on ``output`` (= conv2d(x.detach(), weight)) that routes d/dx through conv_transpose2d(., weight)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, output: Tensor, stride: int, padding: int) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(weight)
        ctx.stride, ctx.padding, ctx.input_size = stride, padding, tuple(x.shape[-2:])
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        grad_input = None
        if ctx.needs_input_grad[0]:
            size = weight.shape[-1]
            # A strided conv maps several input sizes to one output size: the adjoint restores the exact one.
            output_padding = [
                inp - ((out - 1) * ctx.stride - 2 * ctx.padding + size)
                for inp, out in zip(ctx.input_size, grad.shape[-2:], strict=True)
            ]
            # Under autocast the forward ran in the autocast dtype; the cast keeps d/dweight flowing to the fp32 weight.
            grad_input = F.conv_transpose2d(
                grad,
                weight.to(grad.dtype),
                stride=ctx.stride,
                padding=ctx.padding,
                output_padding=output_padding,
            )
        return grad_input, None, grad, None, None


def conv2d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0
) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding)`` (no groups, no dilation) with the input gradient as its own
    differentiable transposed convolution (see the module docstring)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return F.conv2d(x, weight, bias, stride=stride, padding=padding)
    output = F.conv2d(x.detach(), weight, bias, stride=stride, padding=padding)
    return _InputGradient.apply(x, weight, output, stride, padding)
