"""FIR resampling for StyleGAN2 ([1, 3, 3, 1] low-pass filter), with a double backward that stays dense.

Karras et al. (StyleGAN2, and StyleGAN before it) low-pass filter every 2x resampling with the separable binomial
filter [1, 3, 3, 1] (normalised to sum 1 per axis). Three operations use it here:

* ``fir_downsample_2x``: filter, then keep every other pixel (D's residual skip, before its 1x1 conv);
* ``fir_upsample_2x``: insert zeros, filter with gain 4 (G's skip path, the RGB image from one block to the next);
* ``fir_filter``: filter at stride 1 with a given padding and gain (D's blur before its stride-2 3x3 conv; G's blur
  after its stride-2 transposed 3x3 conv).

Each is a depthwise convolution with a fixed 4x4 kernel. Written as a plain grouped ``F.conv2d``, autograd's double
backward of it (R1 and path length differentiate a gradient) goes through PyTorch's generic convolution double
backward, which for ``groups=C`` runs one small convolution per channel: at D's sizes it was 5-10x slower than
the forward. The filters are linear with a constant kernel, so the gradient of ``conv(x, f)`` w.r.t. x is the
transposed depthwise conv with the same kernel, and *its* gradient is ``conv(., f)`` again. ``_DepthwiseFIR`` and
``_DepthwiseFIRTranspose`` below are that pair of autograd Functions, each the other's backward, so any order of
derivative is one depthwise (transposed) conv call per filter, as fast as the forward.

The filters run in their input's dtype (autocast off): they only average neighbours, so fp16/bf16 lose nothing a
convolution would keep, and their backward needs no autocast state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# The binomial filter of StyleGAN2 (NVlabs `training/networks.py`: resample_filter=[1, 3, 3, 1]).
BINOMIAL_TAPS = (1.0, 3.0, 3.0, 1.0)


def fir_kernel_2d(taps: tuple[float, ...] = BINOMIAL_TAPS) -> Tensor:
    """The separable 2-D kernel outer(taps, taps), normalised to sum 1 ([k, k], fp32)."""
    taps_1d = torch.tensor(taps, dtype=torch.float32)
    kernel = torch.outer(taps_1d, taps_1d)
    return kernel / kernel.sum()


def _depthwise(kernel: Tensor, channels: int, dtype: torch.dtype) -> Tensor:
    return kernel.to(dtype)[None, None].expand(channels, 1, *kernel.shape)


class _DepthwiseFIR(torch.autograd.Function):
    """y = depthwise conv2d(x, kernel, stride, padding); backward: the transposed conv (``_DepthwiseFIRTranspose``)."""

    @staticmethod
    def forward(ctx, x: Tensor, kernel: Tensor, stride: int, padding: int) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(kernel)
        ctx.stride, ctx.padding, ctx.input_size = stride, padding, tuple(x.shape[-2:])
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.conv2d(
                x, _depthwise(kernel, x.shape[1], x.dtype), stride=stride, padding=padding, groups=x.shape[1]
            )

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (kernel,) = ctx.saved_tensors
        return (
            _DepthwiseFIRTranspose.apply(grad, kernel, ctx.stride, ctx.padding, ctx.input_size),
            None,
            None,
            None,
        )


class _DepthwiseFIRTranspose(torch.autograd.Function):
    """The adjoint of ``_DepthwiseFIR`` (a transposed depthwise conv) to an output of ``output_size``; backward: it."""

    @staticmethod
    def forward(
        ctx, x: Tensor, kernel: Tensor, stride: int, padding: int, output_size: tuple[int, int]
    ) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(kernel)
        ctx.stride, ctx.padding = stride, padding
        size = kernel.shape[-1]
        # A strided conv maps several input sizes to one output size; the extra rows/columns go at the end.
        output_padding = [
            out - ((inp - 1) * stride - 2 * padding + size)
            for out, inp in zip(output_size, x.shape[-2:], strict=True)
        ]
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.conv_transpose2d(
                x,
                _depthwise(kernel, x.shape[1], x.dtype),
                stride=stride,
                padding=padding,
                output_padding=output_padding,
                groups=x.shape[1],
            )

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (kernel,) = ctx.saved_tensors
        return _DepthwiseFIR.apply(grad, kernel, ctx.stride, ctx.padding), None, None, None, None


def fir_filter(x: Tensor, kernel: Tensor, padding: int, gain: float = 1.0) -> Tensor:
    """Filter each channel of x [N, C, H, W] with ``kernel * gain`` at stride 1, zero-padding ``padding`` pixels on
    every side (a 4x4 kernel with padding 1 maps H to H - 1, with padding 2 to H + 1)."""
    return _DepthwiseFIR.apply(x, kernel * gain, 1, padding)


def fir_downsample_2x(x: Tensor, kernel: Tensor) -> Tensor:
    """Low-pass filter and keep every other pixel: [N, C, H, W] -> [N, C, H // 2, W // 2] (NVlabs
    ``upfirdn2d.downsample2d`` with its default padding: 1 pixel each side for the 4-tap filter, gain 1)."""
    return _DepthwiseFIR.apply(x, kernel, 2, (kernel.shape[-1] - 2) // 2)


def fir_upsample_2x(x: Tensor, kernel: Tensor) -> Tensor:
    """Insert zeros and low-pass filter with gain 4 (so a constant image stays constant): [N, C, H, W] ->
    [N, C, 2H, 2W] (NVlabs ``upfirdn2d.upsample2d``: padding 2 before, 1 after for the 4-tap filter). The transposed
    stride-2 conv of the kernel is exactly that: the adjoint of ``fir_downsample_2x``, times 4."""
    height, width = x.shape[-2:]
    return _DepthwiseFIRTranspose.apply(
        x, kernel * 4.0, 2, (kernel.shape[-1] - 2) // 2, (2 * height, 2 * width)
    )
