"""StyleGAN2-style generator and discriminator in plain PyTorch (no custom CUDA ops).

Written from the design in Karras et al., "Analyzing and Improving the Image Quality of StyleGAN" (CVPR 2020), and
matched to NVlabs' stylegan2-ada-pytorch `training/networks.py` where a switch says so:

* Generator: a mapping network (pixel-norm on z, optionally concatenated with a pixel-normed embedding of a class
  label, equalized-lr linear layers with a learning-rate multiplier, leaky ReLU 0.2) produces w, broadcast to one
  copy per layer (``ws [N, num_ws, w_dim]``, as NVlabs' StyleGAN2-ADA); a running average ``w_avg`` enables the
  truncation trick. In training mode the generator mixes styles: with probability ``style_mixing_prob`` the layers
  from a random cutoff on take the ws of a second latent (the paper's mixing regularisation). The synthesis network
  starts from a learned 4x4 constant and doubles the resolution per block with weight-modulated, demodulated
  3x3 convolutions, per-pixel noise with a learned strength, and the "skip" output architecture (one toRGB per
  resolution, upsampled and summed). Output images are roughly in [-1, 1]; there is no tanh, as in StyleGAN2.
* Discriminator: NVlabs' three architectures (``architecture``): "resnet" (fromRGB at the input resolution, residual
  blocks scaled by 1/sqrt(2); NVlabs' default), "orig" (the same blocks without the residual branch or its scaling;
  their cifar config) or "skip" (plain blocks, plus a fromRGB of the FIR-downsampled image added at every lower
  resolution and at 4x4), then a minibatch standard-deviation layer, a conv and two linear layers down to one logit.
* Equalized learning rate everywhere: parameters are stored N(0, 1) and scaled by He's constant at runtime.

Switches (defaults: NVlabs'; `experiment=mnist_stylegan2` keeps the cheaper first choices):
* G ``upsampling``: "fir" (the modulated weight as a stride-2 transposed conv, then the [1, 3, 3, 1] blur; the skip
  image FIR-upsampled with gain 4) or "bilinear" (bilinear 2x, then the conv: 4x that conv's FLOPs).
* D ``downsampling``: "fir" (blur, then a stride-2 conv; the residual skip blurred-downsampled, then 1x1) or
  "avg_pool". The FIR filters (`fir.py`) keep R1's double backward dense.
* ``num_fp16_res`` / ``conv_clamp``: under fp16 autocast (`16-mixed`) only the N highest resolutions run in fp16, the
  rest, the mapping network and D's epilogue in fp32, and fp16 conv outputs are clamped to +-conv_clamp (NVlabs: 4,
  256); None / None leaves the whole network under the run's autocast, unclamped. bf16 and fp32 runs are unaffected
  (no routing, no clamp: NVlabs' --fp32 config sets conv_clamp=None).

Every conv is `conv_input_grad.conv2d` or `conv_input_grad.conv_transpose2d` (G's FIR upsampling): the same forward,
with the input gradient recorded as the adjoint op (a transposed conv, or a conv), so R1's and path length's double
backward avoid PyTorch's generic one (copies of transposed activations).

Differences left: modulation is applied to activations, not to per-sample weights (see ModulatedConv2d; NVlabs
trains with this same non-fused path), and no custom CUDA kernels (upfirdn2d, bias_act, fma) are used.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from pixelsmith.errors import ConfigError
from pixelsmith.gan.networks.conv_input_grad import conv2d, conv_transpose2d
from pixelsmith.gan.networks.fir import fir_downsample_2x, fir_filter, fir_kernel_2d, fir_upsample_2x

LEAKY_RELU_SLOPE = 0.2
# Keeps the activation variance of a leaky ReLU layer close to that of its input (He et al. gain for ReLU).
LEAKY_RELU_GAIN = math.sqrt(2.0)
# Residual branches are summed, so each is scaled by 1/sqrt(2) to keep the variance of the sum unchanged.
RESIDUAL_GAIN = math.sqrt(0.5)
W_AVG_BETA = 0.995
EPSILON = 1e-8
# Resampling: NVlabs' FIR ([1, 3, 3, 1] filter; G: transposed conv then blur; D: blur then strided conv) or this
# template's first, cheaper choice (G: bilinear then conv; D: 2x2 average pool then conv).
UPSAMPLING = ("fir", "bilinear")
DOWNSAMPLING = ("fir", "avg_pool")
# NVlabs' Discriminator(architecture=...): residual blocks (their default), plain blocks (their cifar config), or plain
# blocks fed a fromRGB of the downsampled image at every resolution. Ours were residual only before the switch, so
# "resnet" stays the default and keeps its parameter names (older checkpoints load).
D_ARCHITECTURES = ("resnet", "orig", "skip")
# NVlabs never runs the 4x4 block in fp16 (`SynthesisNetwork`: fp16_resolution = max(..., 8)).
LOWEST_FP16_RESOLUTION = 8


def channels_at_resolution(resolution: int, channel_base: int, channel_max: int) -> int:
    """Feature maps used at a given resolution: fewer channels where the images are larger."""
    return min(channel_base // resolution, channel_max)


def _check_architecture(
    resolution: int, channels: int, channel_base: int, channel_max: int, net: str = "generator"
) -> None:
    if resolution < 16 or resolution & (resolution - 1) != 0:
        raise ConfigError(
            f"StyleGAN2 needs a resolution that is a power of two >= 16, got {resolution}: set data.resolution="
            f"{max(16, 1 << max(resolution, 1).bit_length() - 1)} (a dataset prepared at it)."
        )
    if channels < 1:
        raise ValueError(f"channels must be >= 1 (1 = grayscale, 3 = RGB), got {channels}")
    if channel_max < 1 or channel_base < resolution:
        raise ConfigError(
            f"model.{net}.channel_base={channel_base} must be at least data.resolution={resolution} and "
            f"model.{net}.channel_max={channel_max} at least 1, otherwise the top block would have zero channels "
            f"(channels at resolution r: min(channel_base / r, channel_max)); e.g. model.{net}.channel_base="
            f"{max(4096, resolution * 32)}."
        )


def _activation_gain(activation: bool) -> float:
    """The leaky ReLU's gain sqrt(2), folded into the weight and bias that feed it: leaky_relu is positively
    homogeneous, so leaky_relu(x) * g == leaky_relu(g * x) for g > 0, and scaling the (tiny) weight tensor replaces an
    elementwise multiply of the activations in forward and another in backward (5-10% of a CPU step at 32 px)."""
    return LEAKY_RELU_GAIN if activation else 1.0


def _at_least_fp32(x: Tensor) -> Tensor:
    """Upcast bf16/fp16 (autocast) tensors to fp32, leave fp32/fp64 alone."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _upsample_2x(x: Tensor) -> Tensor:
    return F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: choose one of {', '.join(allowed)}")


def _check_precision(num_fp16_res: int | None, conv_clamp: float | None) -> None:
    if num_fp16_res is not None and (isinstance(num_fp16_res, bool) or num_fp16_res < 0):
        raise ValueError(
            f"num_fp16_res must be >= 0 or None (the whole network under autocast), got {num_fp16_res}"
        )
    if conv_clamp is not None and not conv_clamp > 0:
        raise ValueError(f"conv_clamp must be > 0 or None (no clamping), got {conv_clamp}")


def _fp16_resolution(resolution: int, num_fp16_res: int | None) -> int | None:
    """The lowest resolution whose block runs in fp16 under fp16 autocast (NVlabs `SynthesisNetwork`: the
    `num_fp16_res` highest resolutions, never 4x4); None: no routing, the run's autocast covers everything."""
    if num_fp16_res is None:
        return None
    return max(2 ** (int(math.log2(resolution)) + 1 - num_fp16_res), LOWEST_FP16_RESOLUTION)


def _fp16_autocast_active(device_type: str) -> bool:
    return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.float16


def _fp32_under_fp16_autocast(flag: str):
    """Decorate a forward to run in fp32 when fp16 autocast (`16-mixed`) is on and ``getattr(self, flag)`` is true:
    autocast off, floating-point tensor arguments upcast. NVlabs keeps the mapping network, the low-resolution
    blocks and D's epilogue in fp32 (`use_fp16` per block); bf16 autocast and fp32 runs are left as they are
    (bf16 has fp32's range, so nothing overflows there)."""

    def decorate(forward):
        @functools.wraps(forward)
        def routed(self, *args, **kwargs):
            device = next(a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)).device.type
            if not (getattr(self, flag) and _fp16_autocast_active(device)):
                return forward(self, *args, **kwargs)
            args = tuple(_at_least_fp32(a) if isinstance(a, Tensor) else a for a in args)
            kwargs = {k: _at_least_fp32(a) if isinstance(a, Tensor) else a for k, a in kwargs.items()}
            with torch.autocast(device_type=device, enabled=False):
                return forward(self, *args, **kwargs)

        return routed

    return decorate


def _clamp(x: Tensor, conv_clamp: float | None) -> Tensor:
    """NVlabs' conv_clamp (256 in their mixed-precision configs): keeps fp16 activations far from fp16's 65504 limit.
    Applied where the activations are fp16, as NVlabs' --fp32 config sets conv_clamp=None: fp32 and bf16 runs (and
    the fp32 blocks of a 16-mixed run, whose range needs no guard) skip the clamp and its three backward ops."""
    return x if conv_clamp is None or x.dtype != torch.float16 else x.clamp(-conv_clamp, conv_clamp)


def _maybe_checkpoint(enabled: bool, block: nn.Module, *args: Tensor | None):
    # Only checkpoint when a graph is being built: under no_grad there are no activations to save anyway.
    if enabled and torch.is_grad_enabled():
        return checkpoint(block, *args, use_reentrant=False)
    return block(*args)


class EqualizedLinear(nn.Module):
    """Linear layer with equalized learning rate and an optional learning-rate multiplier.

    The weight is stored as N(0, 1) / lr_multiplier and multiplied by lr_multiplier / sqrt(in_features) in
    forward, so the effective initial weight has He scaling while Adam's step size, which is relative to the
    stored parameter, is divided by lr_multiplier (the mapping network uses 0.01).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        bias_init: float = 0.0,
        lr_multiplier: float = 1.0,
        activation: bool = False,
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / lr_multiplier)
        self.bias = nn.Parameter(torch.full([out_features], bias_init / lr_multiplier)) if bias else None
        self.weight_gain = lr_multiplier / math.sqrt(in_features)
        self.bias_gain = lr_multiplier
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        gain = _activation_gain(self.activation)
        bias = self.bias * (self.bias_gain * gain) if self.bias is not None else None
        x = F.linear(x, self.weight * (self.weight_gain * gain), bias)
        return F.leaky_relu(x, LEAKY_RELU_SLOPE) if self.activation else x

    def extra_repr(self) -> str:
        out_features, in_features = self.weight.shape
        return f"in={in_features}, out={out_features}, lr_mul={self.bias_gain}, act={self.activation}"


class EqualizedConv2d(nn.Module):
    """Conv layer with equalized learning rate, optional 2x downsampling and output clamp (``conv_clamp``).

    ``downsample``: None; "fir" as NVlabs' `Conv2dLayer(down=2)` (`conv2d_resample`): a 3x3 conv blurs with the
    [1, 3, 3, 1] filter (padding 2) and convolves at stride 2, a 1x1 conv FIR-downsamples then convolves; or
    "avg_pool": 2x2 average pool, then the conv at the lower resolution. Both convolve at the lower resolution, a
    quarter of the FLOPs of convolving first; the blur is a depthwise filter on top.

    ``output_gain``: the output (activation and clamp bound included) times this positive constant, folded into the
    weight and bias (D's residual branches use it for their 1/sqrt(2), sparing an elementwise multiply).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        bias: bool = True,
        activation: bool = False,
        downsample: str | None = None,
        conv_clamp: float | None = None,
        output_gain: float = 1.0,
    ):
        super().__init__()
        if downsample is not None:
            _check_choice("downsampling", downsample, DOWNSAMPLING)
        if not output_gain > 0:
            raise ValueError(
                f"output_gain must be > 0 (it is folded through the leaky ReLU), got {output_gain}"
            )
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.weight_gain = 1.0 / math.sqrt(in_channels * kernel_size * kernel_size)
        self.activation = activation
        self.downsample = downsample
        self.output_gain = output_gain
        self.conv_clamp = None if conv_clamp is None else conv_clamp * output_gain
        if downsample == "fir":  # not persistent: a constant, and checkpoints keep the keys they always had
            self.register_buffer("resample_filter", fir_kernel_2d(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        gain = _activation_gain(self.activation) * self.output_gain
        weight = self.weight * (self.weight_gain * gain)
        bias = None if self.bias is None else (self.bias * gain if gain != 1.0 else self.bias)
        kernel_size = self.weight.shape[-1]
        if self.downsample == "fir" and kernel_size > 1:
            # NVlabs pads by 2 = (filter 4 - down 2 + 1) // 2 + conv padding 1, then a stride-2 valid conv.
            x = fir_filter(x, self.resample_filter, padding=2)
            x = conv2d(x, weight, bias, stride=2)
        else:
            if self.downsample == "fir":
                x = fir_downsample_2x(x, self.resample_filter)
            elif self.downsample == "avg_pool":
                x = F.avg_pool2d(x, 2)
            x = conv2d(x, weight, bias, padding=kernel_size // 2)
        return _clamp(F.leaky_relu(x, LEAKY_RELU_SLOPE) if self.activation else x, self.conv_clamp)


class ModulatedConv2d(nn.Module):
    """StyleGAN2 weight modulation and demodulation, implemented by scaling activations.

    The paper's per-sample weight is w'[n,o,i,k] = W[o,i,k] * s[n,i] * d[n,o] with the demodulation
    d[n,o] = 1 / sqrt(sum_{i,k} (W[o,i,k] * s[n,i])^2 + eps). Because s scales input channels and d scales
    output channels, conv(x, w'[n]) == d[n] * conv(x * s[n], W): one ordinary batched conv with the shared
    weight, with d computed from an [N, I] x [I, O] matmul. Measured on CPU (1 thread, batch 32, fwd+bwd,
    milliseconds; this path vs the grouped-conv trick vs einsum per-sample weights + unfold/bmm):
    256->256 ch at 8x8: 55 vs 613 vs 560; at 16x16: 203 vs 782 vs 779; 256->128 at 32x32: 470 vs 722 vs 1203;
    128->128 at 32x32: 320 vs 308 vs 519. The per-sample variants materialise and back-propagate through an
    [N, O, I, k, k] weight tensor (19M floats for 256->256, batch 32), which dominates at low resolution, and
    oneDNN runs grouped convs with many groups no faster than the plain conv. The official StyleGAN2 code uses
    this same non-fused path for training.

    ``upsample``: None; "fir" as NVlabs' `modulated_conv2d(up=2)` -> `conv2d_resample`: the weight applied as a
    stride-2 transposed conv (a true convolution of the zero-upsampled input: NVlabs passes flip_weight=False for
    up=2), then the [1, 3, 3, 1] blur with gain 4 (padding 1); the conv runs at the input resolution, a quarter of the
    FLOPs of "bilinear": bilinear 2x upsampling, then the conv at the output resolution.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        w_dim: int,
        demodulate: bool = True,
        upsample: str | None = None,
    ):
        super().__init__()
        if upsample is not None:
            _check_choice("upsampling", upsample, UPSAMPLING)
        # Styles start at 1 (bias_init=1) so that modulation is initially close to the identity.
        self.affine = EqualizedLinear(w_dim, in_channels, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size))
        self.weight_gain = 1.0 / math.sqrt(in_channels * kernel_size * kernel_size)
        self.demodulate = demodulate
        self.upsample = upsample
        if upsample == "fir":  # not persistent: a constant, and checkpoints keep the keys they always had
            self.register_buffer("resample_filter", fir_kernel_2d(), persistent=False)

    def forward(self, x: Tensor, w: Tensor, output_gain: float = 1.0) -> Tensor:
        """``output_gain``: the result times this constant, folded into the demodulation's [N, O] coefficients
        (or the weight, without demodulation) instead of a pass over the activations."""
        weight = self.weight * self.weight_gain
        if output_gain != 1.0 and not self.demodulate:
            weight = weight * output_gain
        if x.dtype == torch.float16 or _fp16_autocast_active(x.device.type):
            # As NVlabs under fp16: the styles in fp32 and, where demodulation cancels any per-sample scale of them,
            # divided by their largest magnitude (their pre-normalisation), so that x * styles stays in fp16's range.
            with torch.autocast(device_type=x.device.type, enabled=False):
                styles = self.affine(_at_least_fp32(w))
            if self.demodulate:
                styles = styles / styles.abs().amax(dim=1, keepdim=True)
        else:
            styles = self.affine(w)
        # Modulating before upsampling is exact (per-channel scaling commutes with the upsampling and the conv's
        # sum over input channels) and touches 4x fewer elements.
        x = x * styles.to(x.dtype)[:, :, None, None]
        if self.upsample == "fir":
            # conv_transpose2d takes [in, out, k, k]: the same parameter, transposed; output 2H + k - 2, which the
            # 4-tap blur with padding 1 brings to 2H.
            x = conv_transpose2d(x, weight.transpose(0, 1), stride=2)
            x = fir_filter(x, self.resample_filter, padding=1, gain=4.0)
        else:
            if self.upsample == "bilinear":
                x = _upsample_2x(x)
            x = conv2d(x, weight, padding=self.weight.shape[-1] // 2)
        if self.demodulate:
            # In fp32 even under autocast: the sum of squares loses too many bits in bf16.
            with torch.autocast(device_type=x.device.type, enabled=False):
                demod = torch.rsqrt(
                    styles.to(weight.dtype).square() @ weight.square().sum(dim=(2, 3)).T + EPSILON
                )
                if output_gain != 1.0:
                    demod = demod * output_gain
            x = x * demod.to(x.dtype)[:, :, None, None]
        return x


class SynthesisLayer(nn.Module):
    """Modulated 3x3 conv (optionally upsampling 2x), noise injection, bias, leaky ReLU with gain sqrt(2), clamp."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        w_dim: int,
        upsample: str | None,
        use_noise: bool,
        conv_clamp: float | None = None,
    ):
        super().__init__()
        self.conv = ModulatedConv2d(in_channels, out_channels, 3, w_dim, demodulate=True, upsample=upsample)
        self.conv_clamp = conv_clamp
        # Starts at zero so that noise is only used where training finds it helpful. Shape (1,), not a scalar: FSDP2
        # cannot shard a 0-d parameter (strategy=fsdp refused the whole generator).
        self.noise_strength = nn.Parameter(torch.zeros(1)) if use_noise else None
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        strength = state_dict.get(prefix + "noise_strength")
        if strength is not None and strength.ndim == 0:  # checkpoints from before the (1,) shape
            state_dict[prefix + "noise_strength"] = strength.reshape(1)
        const = state_dict.get(prefix + "noise_const")
        if const is not None and "noise_const" not in self._buffers:
            # Only networks converted from NVlabs' pickles carry it: registered on load, so every other checkpoint
            # keeps the keys it always had and this one loads strictly.
            self.register_buffer("noise_const", torch.empty_like(const, device=self.bias.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # "random": fresh noise per call (training; NVlabs' default); "const": the layer's `noise_const` buffer where it
    # has one (a network converted from an NVlabs pickle: their generate.py's default), else random; "none": no
    # noise. `set_noise_mode` sets it for a whole generator.
    noise_mode = "random"

    def _noise(self, x: Tensor) -> Tensor | None:
        if self.noise_strength is None or self.noise_mode == "none":
            return None
        const = self._buffers.get("noise_const")
        if self.noise_mode == "const" and const is not None:
            return const.to(x.dtype)[None, None]
        batch, _, height, width = x.shape
        return torch.randn(batch, 1, height, width, device=x.device, dtype=x.dtype)

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        # leaky_relu(v) * sqrt(2) == leaky_relu(sqrt(2) * v): the gain rides on the demodulation coefficients, the
        # noise strength and the bias, so no pass over the activations multiplies by it.
        x = self.conv(x, w, output_gain=LEAKY_RELU_GAIN)
        noise = self._noise(x)
        if noise is not None:
            x = x + noise * (self.noise_strength * LEAKY_RELU_GAIN).to(x.dtype)
        bias = (self.bias * LEAKY_RELU_GAIN).to(x.dtype)[None, :, None, None]
        return _clamp(F.leaky_relu(x + bias, LEAKY_RELU_SLOPE), self.conv_clamp)


class ToImage(nn.Module):
    """toRGB: modulated 1x1 conv without demodulation (the output scale matters) plus bias, no activation, clamp."""

    def __init__(self, in_channels: int, image_channels: int, w_dim: int, conv_clamp: float | None = None):
        super().__init__()
        self.conv = ModulatedConv2d(in_channels, image_channels, 1, w_dim, demodulate=False)
        self.bias = nn.Parameter(torch.zeros(image_channels))
        self.conv_clamp = conv_clamp

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        x = self.conv(x, w)
        return _clamp(x + self.bias.to(x.dtype)[None, :, None, None], self.conv_clamp)


class SynthesisBlock(nn.Module):
    """One resolution of the synthesis network: (const | upsampling conv) -> conv -> toRGB, skip-summed image.

    ``upsampling`` "fir" upsamples both the features (transposed conv + blur) and the skip image (FIR, gain 4) as
    NVlabs does; "bilinear" both bilinearly. ``in_fp32``: under fp16 autocast this block runs in fp32 (NVlabs'
    use_fp16=False), see `_fp32_under_fp16_autocast`.

    Takes ``num_conv + num_torgb`` consecutive ws ([N, k, w_dim]): one per conv, then the toRGB's, which is also the
    next block's first conv's (NVlabs' ``SynthesisNetwork`` advances its w index by ``num_conv`` per block).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        w_dim: int,
        image_channels: int,
        use_noise: bool,
        is_first: bool,
        upsampling: str = "fir",
        conv_clamp: float | None = None,
        in_fp32: bool = False,
    ):
        super().__init__()
        _check_choice("upsampling", upsampling, UPSAMPLING)
        if is_first:
            self.const = nn.Parameter(torch.randn(out_channels, 4, 4))
            self.conv0 = None
        else:
            self.const = None
            self.conv0 = SynthesisLayer(
                in_channels,
                out_channels,
                w_dim,
                upsample=upsampling,
                use_noise=use_noise,
                conv_clamp=conv_clamp,
            )
        self.conv1 = SynthesisLayer(
            out_channels, out_channels, w_dim, upsample=None, use_noise=use_noise, conv_clamp=conv_clamp
        )
        self.to_image = ToImage(out_channels, image_channels, w_dim, conv_clamp=conv_clamp)
        self.upsampling = upsampling
        self.num_conv = 1 if is_first else 2
        self.num_torgb = 1
        self.in_fp32 = in_fp32
        if upsampling == "fir" and not is_first:  # not persistent: a constant, checkpoints keep their keys
            self.register_buffer("resample_filter", fir_kernel_2d(), persistent=False)

    def _upsample_image(self, image: Tensor) -> Tensor:
        return (
            fir_upsample_2x(image, self.resample_filter) if self.upsampling == "fir" else _upsample_2x(image)
        )

    @_fp32_under_fp16_autocast("in_fp32")
    def forward(self, x: Tensor | None, image: Tensor | None, ws: Tensor) -> tuple[Tensor, Tensor]:
        layer_ws = ws.unbind(dim=1)
        if self.const is None:
            x = self.conv0(x, layer_ws[0])
        else:
            x = self.const[None].expand(ws.shape[0], -1, -1, -1)
        x = self.conv1(x, layer_ws[self.num_conv - 1])
        # The image is accumulated in fp32 even under autocast: it is the sum of one term per resolution.
        y = _at_least_fp32(self.to_image(x, layer_ws[self.num_conv]))
        image = y if image is None else self._upsample_image(image) + y
        return x, image


def _normalize_2nd_moment(x: Tensor) -> Tensor:
    """Pixel norm: each row scaled to unit mean square (z, and the label embedding, before the MLP)."""
    return x * torch.rsqrt(x.square().mean(dim=1, keepdim=True) + EPSILON)


class MappingNetwork(nn.Module):
    """(z, c) -> ws [N, num_ws, w_dim]: pixel norm on z (and on an embedding of the label c when `c_dim` > 0,
    concatenated to it), an equalized-lr MLP, w broadcast to one copy per synthesis layer (None: w [N, w_dim]).
    Tracks `w_avg` (EMA of w in training mode, beta 0.995) for the truncation trick, as NVlabs' `MappingNetwork`.
    """

    def __init__(
        self,
        z_dim: int,
        w_dim: int,
        num_layers: int,
        lr_multiplier: float,
        num_ws: int | None = None,
        c_dim: int = 0,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"mapping_layers must be >= 1, got {num_layers}")
        if c_dim < 0:
            raise ValueError(f"c_dim must be >= 0 (0 = unconditional), got {c_dim}")
        self.num_ws = num_ws
        self.c_dim = c_dim
        # NVlabs embeds the label to w_dim features with an ordinary (lr multiplier 1) equalized linear layer.
        self.embed = EqualizedLinear(c_dim, w_dim) if c_dim > 0 else None
        features = [z_dim + (w_dim if c_dim > 0 else 0)] + [w_dim] * num_layers
        self.layers = nn.Sequential(
            *(
                EqualizedLinear(fan_in, fan_out, lr_multiplier=lr_multiplier, activation=True)
                for fan_in, fan_out in zip(features[:-1], features[1:], strict=True)
            )
        )
        self.register_buffer("w_avg", torch.zeros(w_dim))

    in_fp32 = False  # under fp16 autocast (the generator sets it where num_fp16_res is given, as NVlabs)

    @_fp32_under_fp16_autocast("in_fp32")
    def forward(
        self,
        z: Tensor,
        c: Tensor | None = None,
        truncation_psi: float = 1.0,
        truncation_cutoff: int | None = None,
        update_w_avg: bool = True,
    ) -> Tensor:
        x = _normalize_2nd_moment(_at_least_fp32(z))
        if self.embed is not None:
            if c is None:
                raise ValueError(
                    f"This generator is conditional (c_dim={self.c_dim}): pass the labels as c, one-hot [N, c_dim]."
                )
            x = torch.cat([x, _normalize_2nd_moment(self.embed(_at_least_fp32(c).to(x.dtype)))], dim=1)
        w = self.layers(x)
        if self.training and update_w_avg:
            with torch.no_grad():
                self.w_avg.copy_(w.detach().to(self.w_avg.dtype).mean(dim=0).lerp(self.w_avg, W_AVG_BETA))
        ws = w if self.num_ws is None else w.unsqueeze(1).expand(-1, self.num_ws, -1)
        if truncation_psi != 1.0:
            truncated = self.w_avg.to(ws.dtype).expand_as(ws).lerp(ws, truncation_psi)
            if truncation_cutoff is None or ws.ndim == 2:
                ws = truncated
            else:  # only the first `truncation_cutoff` layers (coarse styles), as NVlabs' truncation_cutoff
                ws = torch.cat([truncated[:, :truncation_cutoff], ws[:, truncation_cutoff:]], dim=1)
        return ws


class SynthesisNetwork(nn.Module):
    """ws [N, num_ws, w_dim] -> image through blocks at 4, 8, ..., resolution (skip architecture).

    `num_ws` counts NVlabs' way: every conv takes a w of its own, and each block's toRGB shares the next block's first
    conv's, so the last toRGB adds one: 2 * log2(resolution) - 2 in all (8 at 32 px, 14 at 256 px)."""

    def __init__(
        self,
        resolution: int,
        channels: int,
        w_dim: int,
        channel_base: int,
        channel_max: int,
        use_noise: bool,
        gradient_checkpointing: bool,
        upsampling: str = "fir",
        num_fp16_res: int | None = None,
        conv_clamp: float | None = None,
    ):
        super().__init__()
        self.gradient_checkpointing = gradient_checkpointing
        fp16_resolution = _fp16_resolution(resolution, num_fp16_res)
        blocks = []
        for log2_res in range(2, int(math.log2(resolution)) + 1):
            res = 2**log2_res
            in_channels = channels_at_resolution(res // 2, channel_base, channel_max) if res > 4 else 0
            out_channels = channels_at_resolution(res, channel_base, channel_max)
            blocks.append(
                SynthesisBlock(
                    in_channels,
                    out_channels,
                    w_dim,
                    channels,
                    use_noise,
                    is_first=res == 4,
                    upsampling=upsampling,
                    conv_clamp=conv_clamp,
                    in_fp32=fp16_resolution is not None and res < fp16_resolution,
                )
            )
        self.blocks = nn.ModuleList(blocks)
        self.num_ws = sum(block.num_conv for block in blocks) + blocks[-1].num_torgb

    def forward(self, ws: Tensor) -> Tensor:
        if ws.ndim == 2:  # one w for every layer
            ws = ws.unsqueeze(1).expand(-1, self.num_ws, -1)
        if ws.shape[1] != self.num_ws:
            raise ValueError(
                f"the synthesis network takes {self.num_ws} ws per image, got ws of shape {tuple(ws.shape)}"
            )
        x = image = None
        first = 0
        for block in self.blocks:
            block_ws = ws.narrow(1, first, block.num_conv + block.num_torgb)
            x, image = _maybe_checkpoint(self.gradient_checkpointing, block, x, image, block_ws)
            first += block.num_conv
        return image


class StyleGAN2Generator(nn.Module):
    """StyleGAN2 generator: ``G(z, c, truncation_psi) -> images [N, channels, resolution, resolution]`` (fp32).

    ``G.mapping(z, c, psi)`` -> ws [N, num_ws, w_dim] and ``G.synthesis(ws)`` are exposed separately;
    ``G(z, return_ws=True)`` returns the images and the ws they were synthesised from (path-length regularisation
    differentiates w.r.t. them). ``c`` is a one-hot label [N, c_dim] when ``c_dim`` > 0 (NVlabs' conditioning).
    In training mode, with probability ``style_mixing_prob``, the layers from a cutoff drawn uniformly in
    [1, num_ws) on take the ws of a second latent (NVlabs' ``StyleGAN2Loss.run_G``: one cutoff per call, the
    second latent's mapping leaves ``w_avg`` alone). Evaluation mode (sampling, EMA, FID) never mixes.
    """

    def __init__(
        self,
        resolution: int = 32,
        channels: int = 1,
        z_dim: int = 128,
        w_dim: int = 128,
        mapping_layers: int = 4,
        channel_base: int = 4096,
        channel_max: int = 256,
        mapping_lr_multiplier: float = 0.01,
        use_noise: bool = True,
        gradient_checkpointing: bool = False,
        upsampling: str = "fir",
        num_fp16_res: int | None = 4,
        conv_clamp: float | None = 256.0,
        style_mixing_prob: float = 0.0,
        c_dim: int = 0,
    ):
        super().__init__()
        _check_architecture(resolution, channels, channel_base, channel_max)
        _check_choice("upsampling", upsampling, UPSAMPLING)
        _check_precision(num_fp16_res, conv_clamp)
        if not 0.0 <= style_mixing_prob <= 1.0:
            raise ValueError(
                f"style_mixing_prob must be in [0, 1] (NVlabs: 0.9; 0 turns it off), got {style_mixing_prob}"
            )
        self.resolution = resolution
        self.channels = channels
        self.z_dim = z_dim
        self.w_dim = w_dim
        self.c_dim = c_dim
        self.style_mixing_prob = float(style_mixing_prob)
        self.synthesis = SynthesisNetwork(
            resolution,
            channels,
            w_dim,
            channel_base,
            channel_max,
            use_noise,
            gradient_checkpointing,
            upsampling=upsampling,
            num_fp16_res=num_fp16_res,
            conv_clamp=conv_clamp,
        )
        self.num_ws = self.synthesis.num_ws
        self.mapping = MappingNetwork(
            z_dim, w_dim, mapping_layers, mapping_lr_multiplier, num_ws=self.num_ws, c_dim=c_dim
        )
        # NVlabs runs the mapping network in fp32 whatever the blocks do.
        self.mapping.in_fp32 = num_fp16_res is not None

    def compile_units(self) -> list[nn.Module]:
        """What `hardware.compile_scope=blocks` compiles, each its own graph: the mapping network and each
        synthesis block (style mixing stays eager: a few small ops)."""
        return [self.mapping, *self.synthesis.blocks]

    def mix_styles(self, z: Tensor, c: Tensor | None, ws: Tensor) -> Tensor:
        """ws with the layers from a random cutoff on replaced by those of a second latent, with probability
        `style_mixing_prob` (else the cutoff is num_ws: nothing replaced). All on the device: no host read and no
        branch on a random value, so a CUDA graph can capture it; the same random draws, in the same order, as
        NVlabs (cutoff, then the coin, then the second latent)."""
        num_ws = ws.shape[1]
        cutoff = torch.randint(1, num_ws, (), device=ws.device)
        mixing = torch.rand((), device=ws.device) < self.style_mixing_prob
        cutoff = torch.where(mixing, cutoff, torch.full_like(cutoff, num_ws))
        second = self.mapping(torch.randn_like(z), c, update_w_avg=False)
        from_second = torch.arange(num_ws, device=ws.device)[None, :, None] >= cutoff
        return torch.where(from_second, second.to(ws.dtype), ws)

    def forward(
        self,
        z: Tensor,
        c: Tensor | None = None,
        truncation_psi: float = 1.0,
        truncation_cutoff: int | None = None,
        return_ws: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Images; with `return_ws` also the ws they were synthesised from (path-length regularisation
        differentiates the images w.r.t. them, through this forward so FSDP's and compile's hooks still apply)."""
        ws = self.mapping(z, c, truncation_psi, truncation_cutoff)
        if self.training and self.style_mixing_prob > 0:
            ws = self.mix_styles(z, c, ws)
        images = self.synthesis(ws)
        return (images, ws) if return_ws else images


def minibatch_stddev(x: Tensor, group_size: int) -> Tensor:
    """Append one feature map: the average std of the features over a group of samples.

    The group size is the largest divisor of the batch size not above ``group_size``, so any batch size works
    (batch 1 gives a zero-ish statistic instead of an error; a prime batch size groups the samples one by one).
    Samples n and n + k * (N // group) share a group.
    """
    batch, num_channels, height, width = x.shape
    group = next(g for g in range(min(group_size, batch), 0, -1) if batch % g == 0)
    y = _at_least_fp32(x).reshape(group, batch // group, num_channels, height, width)
    y = (y - y.mean(dim=0)).square().mean(dim=0)
    y = (y + EPSILON).sqrt().mean(dim=(1, 2, 3))
    y = (
        y.reshape(1, batch // group, 1, 1, 1)
        .expand(group, -1, 1, height, width)
        .reshape(batch, 1, height, width)
    )
    return torch.cat([x, y.to(x.dtype)], dim=1)


class DiscriminatorBlock(nn.Module):
    """A block halving the resolution, in one of NVlabs' D architectures (their `DiscriminatorBlock`):

    * "resnet": (conv3x3 -> down+conv3x3) + (down+conv1x1 `skip`), times 1/sqrt(2). Each branch is clamped before the
      sum (NVlabs clamps each at conv_clamp * sqrt(0.5) after scaling it by sqrt(0.5): the same).
    * "orig": conv3x3 -> down+conv3x3, no second branch and no 1/sqrt(2) (NVlabs' `conv1(x)` without a gain).
    * "skip": as "orig", after adding this block's fromRGB of the image (``from_image_channels``: the image's channels;
      None for the top block, whose fromRGB is the discriminator's `from_image`); forward takes and returns the image
      too, downsampled 2x for the next block (NVlabs `upfirdn2d.downsample2d`, or a 2x2 average with "avg_pool").

    ``downsampling``: "fir" (NVlabs: blur then stride-2 conv; the skip FIR-downsampled then 1x1) or "avg_pool".
    ``in_fp32``: under fp16 autocast this block runs in fp32 (NVlabs' use_fp16=False).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        downsampling: str = "fir",
        conv_clamp: float | None = None,
        in_fp32: bool = False,
        architecture: str = "resnet",
        from_image_channels: int | None = None,
    ):
        super().__init__()
        _check_choice("downsampling", downsampling, DOWNSAMPLING)
        _check_choice("architecture", architecture, D_ARCHITECTURES)
        self.architecture = architecture
        self.downsampling = downsampling
        # NVlabs' skip block: `fromrgb` with the block's conv_clamp, its output added to x before conv0.
        self.from_image = (
            EqualizedConv2d(from_image_channels, in_channels, 1, activation=True, conv_clamp=conv_clamp)
            if architecture == "skip" and from_image_channels is not None
            else None
        )
        self.conv0 = EqualizedConv2d(in_channels, in_channels, 3, activation=True, conv_clamp=conv_clamp)
        residual = architecture == "resnet"
        # resnet: the 1/sqrt(2) of the sum rides on both branches' weights (and their clamp bounds, as NVlabs' clamp at
        # conv_clamp * sqrt(0.5) after the scaling), sparing a multiply of the sum in forward and backward. orig and
        # skip have no sum, so NVlabs applies no gain there.
        self.conv1 = EqualizedConv2d(
            in_channels,
            out_channels,
            3,
            activation=True,
            downsample=downsampling,
            conv_clamp=conv_clamp,
            output_gain=RESIDUAL_GAIN if residual else 1.0,
        )
        if residual:  # only resnet has it: orig and skip keep no parameter they never use
            self.skip = EqualizedConv2d(
                in_channels,
                out_channels,
                1,
                bias=False,
                downsample=downsampling,
                conv_clamp=conv_clamp,
                output_gain=RESIDUAL_GAIN,
            )
        # Not persistent: a constant, and no checkpoint key to carry.
        if architecture == "skip" and downsampling == "fir":
            self.register_buffer("image_filter", fir_kernel_2d(), persistent=False)
        self.in_fp32 = in_fp32

    def _downsample_image(self, image: Tensor) -> Tensor:
        if self.downsampling == "fir":
            return fir_downsample_2x(image, self.image_filter)
        return F.avg_pool2d(image, 2)

    @_fp32_under_fp16_autocast("in_fp32")
    def forward(self, x: Tensor, image: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """x -> x at half the resolution; with "skip", (x, image) -> (x, image) both at half the resolution."""
        if self.architecture == "resnet":
            return self.skip(x) + self.conv1(self.conv0(x))
        if self.architecture == "orig":
            return self.conv1(self.conv0(x))
        if image is None:
            raise ValueError("a 'skip' discriminator block takes the image too: block(x, image)")
        if self.from_image is not None:
            x = x + self.from_image(image)
        return self.conv1(self.conv0(x)), self._downsample_image(image)


def set_noise_mode(generator: nn.Module, mode: str) -> None:
    """Every synthesis layer's noise: "random", "const" (the converted `noise_const` buffers) or "none"."""
    _check_choice("noise_mode", mode, ("random", "const", "none"))
    for module in generator.modules():
        if isinstance(module, SynthesisLayer):
            module.noise_mode = mode


def _freeze(layers: list[nn.Module], count: int) -> int:
    """NVlabs' Freeze-D (`--freezed=N`, `Conv2dLayer(trainable=False)`): the first `count` layers keep their weights
    as buffers, not parameters. The optimizer never sees them and no phase's requires_grad_ toggling revives them;
    the state_dict keys stay the same, so checkpoints load either way."""
    if isinstance(count, bool) or not 0 <= count <= len(layers):
        raise ConfigError(
            f"model.discriminator.freeze_layers={count}: this discriminator has {len(layers)} conv layers to "
            f"freeze (NVlabs' --freezed counts fromRGB, conv0, conv1 and skip per block); give 0 to {len(layers)}."
        )
    for layer in layers[:count]:
        for name, param in list(layer._parameters.items()):
            if param is not None:
                del layer._parameters[name]
                layer.register_buffer(name, param.detach())
    return count


class StyleGAN2Discriminator(nn.Module):
    """StyleGAN2 discriminator: ``D(images [N, channels, R, R]) -> logits [N]`` (fp32).

    ``architecture``: "resnet" (NVlabs' default), "orig" (their cifar config) or "skip" (DiscriminatorBlock says how
    each differs; "skip" adds `epilogue_from_image`, NVlabs' epilogue fromRGB, unclamped as theirs).
    ``downsampling``: "fir" (NVlabs) or "avg_pool" (this template's first, cheaper choice). ``num_fp16_res``: under
    fp16 autocast (`16-mixed`) only the blocks at the N highest resolutions (and fromRGB with the first) run in fp16,
    the rest and the epilogue in fp32, as NVlabs; None leaves the whole network under the run's autocast.
    ``conv_clamp``: clamp every conv layer's output to +-conv_clamp (NVlabs: 256 with fp16), None: no clamp.
    """

    def __init__(
        self,
        resolution: int = 32,
        channels: int = 1,
        channel_base: int = 4096,
        channel_max: int = 256,
        mbstd_group_size: int = 4,
        gradient_checkpointing: bool = False,
        downsampling: str = "fir",
        num_fp16_res: int | None = 4,
        conv_clamp: float | None = 256.0,
        architecture: str = "resnet",
        freeze_layers: int = 0,
    ):
        super().__init__()
        _check_architecture(resolution, channels, channel_base, channel_max, "discriminator")
        _check_choice("downsampling", downsampling, DOWNSAMPLING)
        _check_choice("architecture", architecture, D_ARCHITECTURES)
        _check_precision(num_fp16_res, conv_clamp)
        if mbstd_group_size < 1:
            raise ValueError(f"mbstd_group_size must be >= 1, got {mbstd_group_size}")
        self.resolution = resolution
        self.channels = channels
        self.mbstd_group_size = mbstd_group_size
        self.gradient_checkpointing = gradient_checkpointing
        self.architecture = architecture

        def ch(res: int) -> int:
            return channels_at_resolution(res, channel_base, channel_max)

        fp16_resolution = _fp16_resolution(resolution, num_fp16_res)

        def in_fp32(res: int) -> bool:
            return fp16_resolution is not None and res < fp16_resolution

        self.from_image = EqualizedConv2d(channels, ch(resolution), 1, activation=True, conv_clamp=conv_clamp)
        self.from_image_in_fp32 = in_fp32(resolution)
        # The top block's fromRGB is `from_image` in every architecture (its name from before the switch); with "skip"
        # each lower block reads the downsampled image through a fromRGB of its own.
        self.blocks = nn.ModuleList(
            DiscriminatorBlock(
                ch(2**log2_res),
                ch(2 ** (log2_res - 1)),
                downsampling=downsampling,
                conv_clamp=conv_clamp,
                in_fp32=in_fp32(2**log2_res),
                architecture=architecture,
                from_image_channels=channels if 2**log2_res < resolution else None,
            )
            for log2_res in range(int(math.log2(resolution)), 2, -1)
        )
        # NVlabs' DiscriminatorEpilogue builds its skip fromRGB without conv_clamp (its conv has one).
        self.epilogue_from_image = (
            EqualizedConv2d(channels, ch(4), 1, activation=True) if architecture == "skip" else None
        )
        self.epilogue_conv = EqualizedConv2d(ch(4) + 1, ch(4), 3, activation=True, conv_clamp=conv_clamp)
        self.epilogue_fc = EqualizedLinear(ch(4) * 4 * 4, ch(4), activation=True)
        self.out = EqualizedLinear(ch(4), 1)
        self.epilogue_in_fp32 = num_fp16_res is not None
        self.freeze_layers = _freeze(self.layers_in_order(), freeze_layers)

    def layers_in_order(self) -> list[nn.Module]:
        """D's conv layers counted as NVlabs' `DiscriminatorBlock` counts them for `freeze_layers` (fromRGB, conv0,
        conv1, skip per block, from the input resolution down; the epilogue is never frozen)."""
        layers: list[nn.Module] = [self.from_image]
        for block in self.blocks:
            if block.from_image is not None:
                layers.append(block.from_image)
            layers += [block.conv0, block.conv1]
            if self.architecture == "resnet":
                layers.append(block.skip)
        return layers

    def compile_units(self) -> list[nn.Module]:
        """What `hardware.compile_scope=blocks` compiles, each its own graph: fromRGB, each block (with its own
        fromRGB under "skip"), the epilogue's layers (the minibatch-stddev statistic between them stays eager)."""
        epilogue_from_image = [] if self.epilogue_from_image is None else [self.epilogue_from_image]
        return [
            self.from_image,
            *self.blocks,
            *epilogue_from_image,
            self.epilogue_conv,
            self.epilogue_fc,
            self.out,
        ]

    @_fp32_under_fp16_autocast("from_image_in_fp32")
    def _from_image(self, images: Tensor) -> Tensor:
        return self.from_image(images)

    @_fp32_under_fp16_autocast("epilogue_in_fp32")
    def _epilogue(self, x: Tensor, image: Tensor | None = None) -> Tensor:
        if self.epilogue_from_image is not None:
            x = x + self.epilogue_from_image(image)
        x = minibatch_stddev(x, self.mbstd_group_size)
        x = self.epilogue_conv(x)
        x = self.epilogue_fc(x.flatten(1))
        return self.out(x).squeeze(1)

    def forward(self, images: Tensor) -> Tensor:
        x = self._from_image(images)
        if self.architecture != "skip":
            for block in self.blocks:
                x = _maybe_checkpoint(self.gradient_checkpointing, block, x)
            return _at_least_fp32(self._epilogue(x))
        image = images
        for block in self.blocks:
            x, image = _maybe_checkpoint(self.gradient_checkpointing, block, x, image)
        return _at_least_fp32(self._epilogue(x, image))
