"""Affine warps with reflection padding for ADA, built from gathers and plain convolutions so that they have
derivatives of every order on every device.

Two resamplers of the same geometric map:
- `warp_affine_reflect` / `warp_inverse_bilinear`: one bilinear gather at the image's own resolution (cheap; the
  interpolation blurs a little and aliases when the map shrinks the image);
- `warp_inverse_lowpass`: NVlabs' scheme (stylegan2-ada-pytorch, training/augment.py, AugmentPipe.forward): upsample
  2x through the symlet-6 low-pass filter, warp bilinearly at twice the resolution, low-pass and downsample 2x. The
  oversampled warp keeps the result band-limited, so rotations and down-scalings alias much less, at 6-14x the
  work of the bilinear warp (benchmarks/augment_bench.py prints both).

Why not kornia's `warp_affine` or `F.grid_sample`: grid_sample's double backward exists on CPU but not on CUDA
("derivative for aten::grid_sampler_2d_backward is not implemented"), and lazy R1 is a double backward through the
augmentation (the penalty ||dD(aug(x))/dx||^2 is differentiated w.r.t. D's weights), so ADA + R1 crashed on GPUs
while CPU CI passed. StyleGAN2-ADA ships its own grid-sample op for the same reason. Here the bilinear step is a
weighted sum of four neighbour pixels fetched with one `gather`, with indices and weights that depend on the
matrices only: the warp is linear in the images, the backward of a gather is a scatter-add whose backward is again a
gather, and the filters are single-channel convolutions (dense, groups=1), so autograd provides every order natively.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "SYMLET6",
    "warp_affine_reflect",
    "warp_inverse_bilinear",
    "warp_inverse_lowpass",
]

# Symlet-6 low-pass (scaling) filter, 12 taps: the orthogonal wavelet NVlabs' AugmentPipe uses around its warp
# ('sym6' in training/augment.py; the same numbers as PyWavelets' `Wavelet("sym6").rec_lo`). Normalised to sum 1
# below; tests check orthogonality to its even shifts and the 6 vanishing moments of its high-pass mirror.
SYMLET6 = (
    0.015404109327027373,
    0.0034907120842174702,
    -0.11799011114819057,
    -0.048311742585633,
    0.4910559419267466,
    0.787641141030194,
    0.3379294217276218,
    -0.07263752278646252,
    -0.021060292512300564,
    0.04472490177066578,
    0.0017677118642428036,
    -0.007800708325034148,
)
_TAPS = len(SYMLET6)
# An upsampled pixel u takes low-res pixels i with u - 2i in [-_LEFT, _TAPS - 1 - _LEFT]: the low-res image needs
# _PAD reflected pixels per side, and the warped high-res grid _MARGIN extra pixels per side for the downsampling.
_LEFT = _TAPS // 2 - 1  # 5
_PAD = (_TAPS - _LEFT) // 2  # 3
_MARGIN = _LEFT  # 5


def warp_affine_reflect(images: Tensor, matrices: Tensor) -> Tensor:
    """Resample NCHW `images` through per-sample source-to-destination pixel matrices `matrices` (N or 1, 2, 3).

    Output pixel (u, v) (column, row; pixel centres at 0..W-1 and 0..H-1) is the bilinear interpolation of the
    input at M^-1 (u, v), and positions outside the image are reflected about the border pixel centres. These are
    the values of kornia's `warp_affine(images, matrices, (H, W), mode="bilinear", padding_mode="reflection",
    align_corners=True)`, i.e. of `F.grid_sample(..., padding_mode="reflection", align_corners=True)`.
    The matrices are detached: differentiable to any order w.r.t. `images` only.
    """
    _check(images, matrices)
    n = images.shape[0]
    dtype = _coordinate_dtype(images)
    m = matrices.detach().to(device=images.device, dtype=dtype).expand(n, 2, 3)
    # Inverse of x' = A x + t, i.e. x = A^-1 x' - A^-1 t, with the 2x2 inverse written out (no linalg.inv, which
    # checks invertibility on the host).
    a, b, tx, c, d, ty = m.reshape(n, 6).unbind(1)
    inv_det = 1.0 / (a * d - b * c)
    ia, ib, ic, id_ = d * inv_det, -b * inv_det, -c * inv_det, a * inv_det
    inverse = torch.stack([ia, ib, -(ia * tx + ib * ty), ic, id_, -(ic * tx + id_ * ty)], dim=1).view(n, 2, 3)
    return warp_inverse_bilinear(images, inverse)


def warp_inverse_bilinear(images: Tensor, inverse: Tensor) -> Tensor:
    """Bilinear resampling through destination-to-source maps `inverse` (N or 1, 2, 3) in pixel-index coordinates
    (pixel centres at 0..W-1, 0..H-1): output pixel (u, v) takes the input at inverse @ (u, v, 1), reflected about
    the border pixel centres. Identity maps return the images bit-exact (weights exactly 1 and 0).

    Differentiable to any order w.r.t. `images` only. Positions and weights are computed in float32 (float64 for
    float64 images; half-precision positions are off by more than half a pixel at 256 px), the pixel data keep
    their dtype. A channels_last input gives a channels_last output, any other input a contiguous one. No
    host-device synchronisation (no data-dependent shapes), so the warp can be captured in a CUDA graph.
    """
    _check(images, inverse)
    n, _, height, width = images.shape
    inverse = inverse.detach().to(device=images.device, dtype=_coordinate_dtype(images)).expand(n, 2, 3)
    index, weights = _bilinear_taps(
        inverse, (height, width), (height, width), ((0.0, width - 1.0), (0.0, height - 1.0))
    )
    # Gathering from channel planes beats fetching pixel rows of a channels_last tensor for 1-4 channels
    # (index_select of 3-value rows is 2x slower on CPU), so channels_last inputs are resampled plane-wise too and
    # only the result is converted back.
    planes = images.reshape(n, images.shape[1], height * width)
    return _gather_bilinear(planes, index, weights, (height, width), _keeps_channels_last(images))


def warp_inverse_lowpass(images: Tensor, inverse: Tensor, taps: Tensor | None = None) -> Tensor:
    """The same map as `warp_inverse_bilinear`, resampled as NVlabs' AugmentPipe does: 2x oversampled through the
    symlet-6 low-pass filter `taps` (12 values summing to 1; default `SYMLET6` normalised).

    Steps, with NVlabs' conventions: upsample 2x (zero insertion, the filter with gain 2 per axis; low-res pixel i
    lands on high-res pixel 2i), sample bilinearly at twice the resolution on a grid 5 pixels wider on each side,
    then filter and keep every second sample. Outside the image the upsampled signal is that of the image reflected
    about its border pixel centres, for any distance: reflecting the low-res image about pixel 0 turns the
    upsampling filter f[k] into f[10 - k] (symlet-6 is not symmetric), so the upsampled image is made with both
    filters on each axis (4 variants) and each bilinear tap reads the variant of its reflection parity. NVlabs
    reflect-pads the low-res image by a margin computed from the batch's matrices (a host read) and up to W - 1
    pixels, then zero-pads: the values agree wherever their padding reaches. An identity map returns the image to
    rounding (the filter is orthogonal to its even shifts), not bit-exact: callers warp only the samples that
    drew a geometric op. Differentiable to any order w.r.t. `images`; no host-device synchronisation.
    """
    _check(images, inverse)
    n, channels, height, width = images.shape
    dtype = _coordinate_dtype(images)
    inverse = inverse.detach().to(device=images.device, dtype=dtype).expand(n, 2, 3)
    if taps is None:
        taps = torch.tensor(SYMLET6, dtype=torch.float64)
        taps = taps / taps.sum()
    taps = taps.to(device=images.device, dtype=images.dtype)
    variants = _upsample2x_variants(images, taps)  # (N, C, 4 * 2H * 2W): [y parity, x parity] variants
    # Output index w of the high-res grid sits at high-res position w - margin, i.e. at low-res index
    # (w - margin) / 2, and the source's low-res index s sits at high-res 2s: the high-res map keeps the linear
    # part L and has the offset 2 (t + o L 1) with o = -margin / 2.
    linear, offset = inverse[:, :, :2], inverse[:, :, 2]
    high_offset = 2 * (offset - (_MARGIN / 2) * linear.sum(2))
    high_inverse = torch.cat([linear, high_offset.unsqueeze(2)], dim=2)
    out_size = (2 * height + 2 * _MARGIN, 2 * width + 2 * _MARGIN)
    index, weights = _reflected_taps(high_inverse, out_size, (2 * height, 2 * width))
    warped = _gather_bilinear(variants, index, weights, out_size, channels_last=False)
    return _downsample2x(warped, taps, _keeps_channels_last(images))


def _check(images: Tensor, matrices: Tensor) -> None:
    if images.ndim != 4:
        raise ValueError(f"The warp expects NCHW images, got shape {tuple(images.shape)}.")
    n = images.shape[0]
    if matrices.ndim != 3 or matrices.shape[1:] != (2, 3) or matrices.shape[0] not in (1, n):
        raise ValueError(f"Expected ({n} or 1, 2, 3) matrices for {n} images, got {tuple(matrices.shape)}.")


def _coordinate_dtype(images: Tensor) -> torch.dtype:
    return torch.float64 if images.dtype == torch.float64 else torch.float32


def _keeps_channels_last(images: Tensor) -> bool:
    return images.shape[1] > 1 and images.is_contiguous(memory_format=torch.channels_last)


def _gather_bilinear(
    planes: Tensor, index: Tensor, weights: Tensor, out_size: tuple[int, int], channels_last: bool
) -> Tensor:
    """sum over the 4 taps of weight * planes[index]: (N, C, source pixels) -> (N, C, *out_size)."""
    n, channels, _ = planes.shape
    out_pixels = out_size[0] * out_size[1]
    taps = planes.gather(2, index.view(n, 1, -1).expand(n, channels, -1)).view(n, channels, 4, out_pixels)
    out = (taps * weights.to(planes.dtype).unsqueeze(1)).sum(2).view(n, channels, *out_size)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out


def _bilinear_taps(
    inverse: Tensor,
    out_size: tuple[int, int],
    in_size: tuple[int, int],
    bounds: tuple[tuple[float, float], tuple[float, float]],
) -> tuple[Tensor, Tensor]:
    """Flat source indices (int64) and bilinear weights of the 4 neighbours of every output pixel, (N, 4, H*W).

    `inverse` (N, 2, 3) maps output (column, row) indices to source ones; source positions are reflected into
    `bounds` ((x_lo, x_hi), (y_lo, y_hi)), which must lie within the source's pixel centres. Neighbour order:
    top-left, top-right, bottom-left, bottom-right. The weights carry no autograd history. Every constant is made on
    the device (arange, not torch.tensor of a Python list), so nothing is copied from the host.
    """
    n = inverse.shape[0]
    device, dtype = inverse.device, inverse.dtype
    (out_height, out_width), (in_height, in_width) = out_size, in_size
    cols = torch.arange(out_width, device=device, dtype=dtype).view(1, 1, out_width)
    rows = torch.arange(out_height, device=device, dtype=dtype).view(1, out_height, 1)
    inverse = inverse.view(n, 2, 3, 1, 1)
    # Elementwise, not a matmul: under TF32 (the a100/h100 profiles) a float32 matmul keeps 10 mantissa bits, which
    # misplaces pixels by a fraction of a pixel at 256 px.
    source = torch.addcmul(inverse[:, :, 2] + rows * inverse[:, :, 1], cols, inverse[:, :, 0])  # (N, 2, H, W)
    source = source.view(n, 2, out_height * out_width)  # source column x and row y of every output pixel
    # Reflection about lo and hi folds x - lo to its distance from the nearest multiple of 2 (hi - lo), a triangle
    # wave (cheaper than remainder). A zero span (a 1-pixel axis) pins the axis to lo.
    axis = torch.arange(2, device=device, dtype=dtype).view(1, 2, 1)  # 0: x, 1: y
    (x_lo, x_hi), (y_lo, y_hi) = bounds
    lo = axis * (y_lo - x_lo) + x_lo
    span = axis * ((y_hi - y_lo) - (x_hi - x_lo)) + (x_hi - x_lo)
    period = (2 * span).clamp(min=1e-30)
    relative = source - lo
    folded = torch.addcmul(relative, torch.round(relative / period), period, value=-1).abs_()
    folded = torch.minimum(folded, span) + lo
    # The floor is capped at size - 2 so that both neighbours lie inside the source (x = size - 1 becomes floor
    # size - 2 with fraction 1: the same value) and no index needs clamping. On a 1-pixel axis both taps sit on
    # its only pixel, and the weights sum to 1 whatever the fraction.
    top = axis * (max(in_height - 2, 0) - max(in_width - 2, 0)) + max(in_width - 2, 0)
    floor = torch.minimum(folded.floor(), top)
    fraction = folded - floor
    floor = floor.long()
    top_left = floor[:, 1:] * in_width + floor[:, :1]  # (N, 1, H*W)
    step_x, step_y = int(in_width > 1), in_width * int(in_height > 1)
    tap = torch.arange(4, device=device).view(1, 4, 1)
    index = top_left + ((tap % 2) * step_x + (tap // 2) * step_y)  # (N, 4, H*W)
    # Per axis, (1 - f, f) for the (first, second) tap; the 4 weights are the outer product, y-major.
    axis_weights = torch.stack([1 - fraction, fraction], dim=2)  # (N, axis, tap, H*W)
    weights = (axis_weights[:, 1, :, None] * axis_weights[:, 0, None, :]).view(n, 4, out_height * out_width)
    return index, weights


def _reflected_taps(
    inverse: Tensor, out_size: tuple[int, int], in_size: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """For `warp_inverse_lowpass`: the flat indices into the 4 stacked upsampled variants (N, 4, H*W) and the
    bilinear weights of the 4 neighbours of every output pixel.

    Each neighbour (an integer high-res position g per axis) is reflected about 0 and S - 2 (the border pixel
    centres, S = 2 * low-res size) on its own, and an odd number of reflections selects the variant made with the
    reflected filter. Positions and weights carry no autograd history; nothing is copied from the host.
    """
    n = inverse.shape[0]
    device, dtype = inverse.device, inverse.dtype
    (out_height, out_width), (in_height, in_width) = out_size, in_size
    cols = torch.arange(out_width, device=device, dtype=dtype).view(1, 1, out_width)
    rows = torch.arange(out_height, device=device, dtype=dtype).view(1, out_height, 1)
    inverse = inverse.view(n, 2, 3, 1, 1)
    source = torch.addcmul(inverse[:, :, 2] + rows * inverse[:, :, 1], cols, inverse[:, :, 0])
    source = source.view(n, 2, 1, out_height * out_width)  # (N, axis, 1, P)
    floor = source.floor()
    fraction = source - floor
    neighbours = floor + torch.arange(2, device=device, dtype=dtype).view(1, 1, 2, 1)  # (N, axis, tap, P)
    axis = torch.arange(2, device=device, dtype=dtype).view(1, 2, 1, 1)  # 0: x, 1: y
    span_x, span_y = max(in_width - 2, 0), max(in_height - 2, 0)
    span = axis * (span_y - span_x) + span_x
    period = (2 * span).clamp(min=1)  # a 1-pixel low-res axis (span 0) folds everything onto 0
    wrapped = torch.addcmul(neighbours, torch.round(neighbours / period), period, value=-1)
    wrapped = torch.minimum(torch.maximum(wrapped, -span), span)
    odd = (wrapped < 0).long()
    folded = wrapped.abs().long()
    plane = in_height * in_width
    # Variant (y parity, x parity) -> plane 2 * y + x; index = plane offset + row * width + column.
    x_part = folded[:, 0] + odd[:, 0] * plane  # (N, tap, P)
    y_part = folded[:, 1] * in_width + odd[:, 1] * (2 * plane)
    index = (y_part[:, :, None, :] + x_part[:, None, :, :]).view(n, 4, out_height * out_width)
    axis_weights = torch.cat([1 - fraction, fraction], dim=2)  # (N, axis, tap, P)
    weights = (axis_weights[:, 1, :, None] * axis_weights[:, 0, None, :]).view(n, 4, out_height * out_width)
    return index, weights


def _reflect_index(size: int, pad: int, device: torch.device) -> Tensor:
    """Indices 0..size-1 extended by `pad` on both sides, reflected about the border pixel centres (as
    F.pad(mode="reflect"), but for any size, also smaller than the padding)."""
    position = torch.arange(-pad, size + pad, device=device)
    if size == 1:
        return torch.zeros_like(position)
    period = 2 * (size - 1)
    folded = torch.remainder(position, period)
    return torch.minimum(folded, period - folded)


def _upsample_weights(taps: Tensor) -> Tensor:
    """Transposed-convolution weights (1, 2, 13) of the two upsampling filters, gain 2: out[o] = sum_i x[i] w[o - 2i]
    on the image padded by 3 gives, at o = u + 12, U[u] = 2 sum_i f[u - 2i + 5] x[i] (channel 0) and the reflected
    image's 2 sum_i f[5 - u + 2i] x[i] (channel 1)."""
    zero = taps.new_zeros(1)
    forward = torch.cat([zero, taps])  # w[k] = f[k - 1]
    reflected = torch.cat([taps.flip(0), zero])  # w[k] = f[11 - k]
    return (2 * torch.stack([forward, reflected])).view(1, 2, _TAPS + 1)


def _upsample2x_variants(images: Tensor, taps: Tensor) -> Tensor:
    """The image upsampled 2x with the forward and the reflected filter on each axis, (N, C, 4 * 2H * 2W) with the
    variants ordered (y parity, x parity)."""
    n, channels, height, width = images.shape
    device = images.device
    padded = images.index_select(2, _reflect_index(height, _PAD, device))
    padded = padded.index_select(3, _reflect_index(width, _PAD, device))
    weights = _upsample_weights(taps)
    crop = _TAPS  # o = u + 12
    # Along x: (N*C, 1, H+6, W+6) -> (N*C, 2, H+6, 2W), channel = x parity.
    planes = padded.reshape(n * channels, 1, height + 2 * _PAD, width + 2 * _PAD)
    planes = F.conv_transpose2d(planes, weights.view(1, 2, 1, _TAPS + 1), stride=(1, 2))
    planes = planes[..., crop : crop + 2 * width]
    # Along y, each x variant on its own (a dense single-channel transposed conv, not a grouped one):
    # (N*C*2, 1, H+6, 2W) -> (N*C*2, 2, 2H, 2W), channel = y parity.
    planes = planes.reshape(n * channels * 2, 1, height + 2 * _PAD, 2 * width)
    planes = F.conv_transpose2d(planes, weights.view(1, 2, _TAPS + 1, 1), stride=(2, 1))
    planes = planes[:, :, crop : crop + 2 * height]
    # (N, C, x parity, y parity, 2H, 2W) -> (N, C, y parity, x parity, 2H, 2W), flattened.
    planes = planes.reshape(n, channels, 2, 2, 2 * height, 2 * width).transpose(2, 3)
    return planes.reshape(n, channels, 4 * 2 * height * 2 * width)


def _downsample2x(images: Tensor, taps: Tensor, channels_last: bool) -> Tensor:
    """out[j] = sum_k f[k] Y[2j + k] along each axis: (N, C, 2H + 10, 2W + 10) -> (N, C, H, W)."""
    n, channels, height, width = images.shape
    planes = images.reshape(n * channels, 1, height, width)
    planes = F.conv2d(planes, taps.view(1, 1, _TAPS, 1), stride=(2, 1))
    planes = F.conv2d(planes, taps.view(1, 1, 1, _TAPS), stride=(1, 2))
    out = planes.view(n, channels, (height - 2 * _MARGIN) // 2, (width - 2 * _MARGIN) // 2)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out
