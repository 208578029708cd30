"""Bilinear affine warp with reflection padding, built from gathers so that it has derivatives of every order.

Why not kornia's `warp_affine`: it calls `F.grid_sample`, whose double backward exists on CPU but not on CUDA
("derivative for aten::grid_sampler_2d_backward is not implemented"), and lazy R1 is a double backward through the
augmentation (the penalty ||dD(aug(x))/dx||^2 is differentiated w.r.t. D's weights), so ADA + R1 crashed on GPUs
while CPU CI passed. StyleGAN2-ADA ships its own grid-sample op for the same reason. Here the output is a weighted
sum of four neighbour pixels fetched with one `gather`, with indices and weights that depend on the matrices only:
the warp is linear in the images, the backward of a gather is a scatter-add whose backward is again a gather, and
autograd provides every order natively on every device.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["warp_affine_reflect"]


def warp_affine_reflect(images: Tensor, matrices: Tensor) -> Tensor:
    """Resample NCHW `images` through per-sample source-to-destination pixel matrices `matrices` (N or 1, 2, 3).

    Output pixel (u, v) (column, row; pixel centres at 0..W-1 and 0..H-1) is the bilinear interpolation of the
    input at M^-1 (u, v), and positions outside the image are reflected about the border pixel centres. These are
    the values of kornia's `warp_affine(images, matrices, (H, W), mode="bilinear", padding_mode="reflection",
    align_corners=True)`, i.e. of `F.grid_sample(..., padding_mode="reflection", align_corners=True)`.

    Differentiable to any order w.r.t. `images` only: the matrices are detached (ADA draws them at random) and get
    no gradient. Sampling positions and weights are computed once per call in float32 (float64 for float64
    images; half-precision positions are off by more than half a pixel at 256 px), the pixel data keep their
    dtype. A channels_last input gives a channels_last output, any other input a contiguous one. No host-device
    synchronisation (no data-dependent shapes), so the warp can be captured in a CUDA graph.
    """
    if images.ndim != 4:
        raise ValueError(f"warp_affine_reflect expects NCHW images, got shape {tuple(images.shape)}.")
    n, channels, height, width = images.shape
    if matrices.ndim != 3 or matrices.shape[1:] != (2, 3) or matrices.shape[0] not in (1, n):
        raise ValueError(f"Expected ({n} or 1, 2, 3) matrices for {n} images, got {tuple(matrices.shape)}.")
    index, weights = _bilinear_taps(matrices, images)  # (N, 4, H*W) each
    channels_last = channels > 1 and images.is_contiguous(memory_format=torch.channels_last)
    # Gathering from channel planes beats fetching pixel rows of a channels_last tensor for 1-4 channels
    # (index_select of 3-value rows is 2x slower on CPU), so channels_last inputs are resampled plane-wise too and
    # only the result is converted back.
    planes = images.reshape(n, channels, height * width)
    taps = planes.gather(2, index.view(n, 1, -1).expand(n, channels, -1)).view(n, channels, 4, height * width)
    out = (taps * weights.to(images.dtype).unsqueeze(1)).sum(2).view(n, channels, height, width)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out


def _bilinear_taps(matrices: Tensor, images: Tensor) -> tuple[Tensor, Tensor]:
    """Flat source indices (int64) and bilinear weights of the 4 neighbours of every output pixel, (N, 4, H*W).

    Neighbour order: top-left, top-right, bottom-left, bottom-right. The weights are in float32 (float64 for
    float64 images) and carry no autograd history. Every constant is made on the device (arange, not
    torch.tensor of a Python list), so nothing is copied from the host.
    """
    n, _, height, width = images.shape
    device = images.device
    dtype = torch.float64 if images.dtype == torch.float64 else torch.float32
    m = matrices.detach().to(device=device, dtype=dtype).expand(n, 2, 3)
    # Inverse of the affine map x' = A x + t, i.e. x = A^-1 x' - A^-1 t, with the 2x2 inverse written out (no
    # linalg.inv, which checks invertibility on the host). Rows: source x, source y; columns: per unit of the
    # destination column u, per unit of the destination row v, offset.
    a, b, tx, c, d, ty = m.reshape(n, 6).unbind(1)
    inv_det = 1.0 / (a * d - b * c)
    ia, ib, ic, id_ = d * inv_det, -b * inv_det, -c * inv_det, a * inv_det
    inverse = torch.stack([ia, ib, -(ia * tx + ib * ty), ic, id_, -(ic * tx + id_ * ty)], dim=1)
    inverse = inverse.view(n, 2, 3, 1, 1)
    cols = torch.arange(width, device=device, dtype=dtype).view(1, 1, width)
    rows = torch.arange(height, device=device, dtype=dtype).view(1, height, 1)
    # Elementwise, not a matmul: under TF32 (the a100/h100 profiles) a float32 matmul keeps 10 mantissa bits, which
    # misplaces pixels by a fraction of a pixel at 256 px.
    source = torch.addcmul(inverse[:, :, 2] + rows * inverse[:, :, 1], cols, inverse[:, :, 0])  # (N, 2, H, W)
    source = source.view(n, 2, height * width)  # source column x and row y of every output pixel
    # Reflection about the border pixel centres 0 and span = size - 1 (grid_sample's reflection with
    # align_corners=True) folds x to its distance from the nearest multiple of 2 span, a triangle wave (cheaper
    # than remainder). The floor is capped at span - 1 so that both neighbours lie inside the image (x = span
    # becomes floor span - 1 with fraction 1: the same value) and no index needs clamping. A 1-pixel axis uses
    # span 1 and puts both taps on its only pixel: the weights sum to 1 whatever the fraction.
    span_x, span_y = max(width - 1, 1), max(height - 1, 1)
    axis = torch.arange(2, device=device, dtype=dtype).view(1, 2, 1)  # 0: x, 1: y
    span = axis * (span_y - span_x) + span_x
    period = 2 * span
    folded = torch.addcmul(source, torch.round(source / period), period, value=-1).abs_()
    floor = torch.minimum(folded.floor(), span - 1)
    fraction = folded - floor
    floor = floor.long()
    top_left = floor[:, 1:] * width + floor[:, :1]  # (N, 1, H*W)
    step_x, step_y = int(width > 1), width * int(height > 1)
    tap = torch.arange(4, device=device).view(1, 4, 1)
    index = top_left + ((tap % 2) * step_x + (tap // 2) * step_y)  # (N, 4, H*W)
    # Per axis, (1 - f, f) for the (first, second) tap; the 4 weights are the outer product, y-major.
    axis_weights = torch.stack([1 - fraction, fraction], dim=2)  # (N, axis, tap, H*W)
    weights = (axis_weights[:, 1, :, None] * axis_weights[:, 0, None, :]).view(n, 4, height * width)
    return index, weights
