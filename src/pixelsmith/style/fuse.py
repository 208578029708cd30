"""Tensor-core friendly stylizers: the 3-channel convolutions padded to a channel multiple, with zeros.

A TransformerNet's first convolution reads 3 channels and its last writes 3; cuDNN's tensor-core kernels (bf16/fp16,
channels_last) want channel counts that are multiples of 8 and fall back to slow paths for 3, and at 8K those two 9x9
layers are a large share of the time. `pad_rgb_convolutions` returns a copy of the network in which each such
convolution works on `multiple` channels instead: the extra input channels are zeros and their weights are zeros,
the extra output channels have zero weights and bias and are dropped right after. In exact arithmetic the output is
the same; in floating point the added terms are exact zeros, so only the summation order can differ (tested).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PAD_CHANNEL_CHOICES = ("auto", "0", "4", "8")


class PaddedConv2d(nn.Module):
    """`conv` with its input channels zero-padded up to `in_total` and its outputs up to `out_total` (sliced back)."""

    def __init__(self, conv: nn.Conv2d, in_total: int, out_total: int):
        super().__init__()
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.extra_in = in_total - conv.in_channels
        weight = torch.zeros(
            out_total, in_total, *conv.kernel_size, dtype=conv.weight.dtype, device=conv.weight.device
        )
        weight[: conv.out_channels, : conv.in_channels] = conv.weight.detach()
        self.conv = nn.Conv2d(
            in_total,
            out_total,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
            device=conv.weight.device,
            dtype=conv.weight.dtype,
        )
        with torch.no_grad():
            self.conv.weight.copy_(weight)
            if conv.bias is not None:
                self.conv.bias.zero_()
                self.conv.bias[: conv.out_channels] = conv.bias.detach()

    def forward(self, x: Tensor) -> Tensor:
        if self.extra_in:
            # Padded on the channel dimension (F.pad's last pair); the result keeps x's memory format.
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_in))
        y = self.conv(x)
        return y[:, : self.out_channels] if y.shape[1] != self.out_channels else y


def resolve_pad_channels(choice: str | int, device: torch.device) -> int:
    """`pad_channels` = auto | 0 | 4 | 8 as a multiple (0: off). auto: 8 on CUDA (tensor cores), off elsewhere (a
    CPU's oneDNN gains nothing from wider zero channels)."""
    text = str(choice).strip().lower()
    if text not in PAD_CHANNEL_CHOICES:
        raise ValueError(f"pad_channels={choice!r}; choose one of {', '.join(PAD_CHANNEL_CHOICES)}.")
    if text == "auto":
        return 8 if device.type == "cuda" else 0
    return int(text)


def pad_rgb_convolutions(model: nn.Module, multiple: int) -> nn.Module:
    """A copy of `model` with every plain Conv2d whose input or output channel count is not a multiple of
    `multiple` wrapped in a `PaddedConv2d` (0 or 1: the model itself, unchanged). Buffers, attributes such as
    `size_multiple`, and the instance-norm layers the tiling swaps are kept as they are."""
    if multiple <= 1:
        return model
    padded = copy.deepcopy(model)
    for parent in list(padded.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Conv2d) or child.groups != 1:
                continue
            in_total = -(-child.in_channels // multiple) * multiple
            out_total = -(-child.out_channels // multiple) * multiple
            if (in_total, out_total) != (child.in_channels, child.out_channels):
                setattr(parent, name, PaddedConv2d(child, in_total, out_total))
    return padded
