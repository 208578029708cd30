"""ADA: adaptive discriminator augmentation (Karras et al. 2020, "Training GANs with Limited Data").

Each op is applied per sample with probability p times its multiplier, and p follows D's overfitting heuristic
r_t = E[sign(D(real))]: every `interval` iterations p += sign(r_t - target) * images / (speed_kimg * 1000),
clamped to [0, max_p], where `images` counts what D saw (all ranks) since the last adjustment.

The ops, their distributions and constants, their order and the way they compose are those of NVlabs' AugmentPipe
(github.com/NVlabs/stylegan2-ada-pytorch, training/augment.py), and `pipeline` takes the names of its train.py
`augpipe_specs` (default `bgc`, every multiplier 1):

- geometric, composed into ONE inverse matrix per sample (output pixel -> input pixel, centred pixel coordinates)
  and resampled once: x-flip (with probability 1/2 once drawn), k quarter turns (k uniform in 0..3), integer
  translation round(U(-xint_max, xint_max) * size), isotropic scale 2^N(0, scale_std), pre-rotation
  U(-1, 1) * pi * rotate_max, anisotropic scale (2^N(0, aniso_std) in x, its inverse in y), post-rotation, and
  fractional translation N(0, xfrac_std) * size. The two rotations each run with 1 - sqrt(1 - rotate * p), so that
  one or both run with probability rotate * p;
- colour, composed into one affine map of RGB in [-1, 1] (NVlabs' 4x4 matrix, written out): brightness
  + N(0, brightness_std), contrast x 2^N(0, contrast_std), luma flip (the Householder reflection about the luma axis
  v = (1, 1, 1) / sqrt(3), with probability 1/2 once drawn), hue rotation about v by U(-1, 1) * pi * hue_max, and
  saturation x 2^N(0, saturation_std) of the part orthogonal to v. Nothing is clamped.

Grayscale (1 channel, MNIST) follows NVlabs: hue and saturation are skipped (they act on chroma, which one channel
does not have) and the other colour ops act through the mean of the RGB map's rows, so brightness adds b, contrast
scales and a luma flip negates; other channel counts (NVlabs refuses them) get that map on every channel.

The warp (`warp`): `lowpass` is NVlabs' 2x-oversampled symlet-6 resampling (`augment.warp.warp_inverse_lowpass`),
`bilinear` one bilinear gather at the image's resolution, 6-14x cheaper on CPU and blurrier/aliased under rotation and
down-scaling (benchmarks/augment_bench.py prints both). Both are our own gather-based code, differentiable twice on
CUDA (lazy R1 backpropagates twice through the augmentation; `F.grid_sample` has no double backward there, which is
why the reference ships its own grid-sample op).

Unlike kornia's random transforms (uniform factors, HSV with clamps, one resampling per op), nothing here
synchronises with the host: the gates are tensors compared with p on the device, every op not drawn takes its
identity value, and a sample that drew no geometric op keeps its pixels bit-exact (row selection on CPU, torch.where
on accelerators). At p=0 the images come back untouched. Deviations from the reference: image-space filtering and
noise (NVlabs' 'bgcfnc' extras) are not implemented (cutout is: op `cutout`, which R3GAN's pipeline adds); the
lowpass warp reflects the image for any distance where NVlabs' data-dependent padding stops at W - 1 pixels and pads
with zeros beyond.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pixelsmith.augment.base import GANAugment, apply_to_selected_rows
from pixelsmith.augment.warp import SYMLET6, warp_inverse_bilinear, warp_inverse_lowpass

GEOMETRIC_OPS = ("xflip", "rotate90", "xint", "scale", "rotate", "aniso", "xfrac")
COLOUR_OPS = ("brightness", "contrast", "lumaflip", "hue", "saturation")
OPS = GEOMETRIC_OPS + COLOUR_OPS + ("cutout",)
# NVlabs' train.py augpipe_specs, restricted to the ops implemented here (every listed multiplier is 1). R3GAN's
# pipeline is `bgc,cutout` with the colour multipliers at 0.5 (`brownvc/R3GAN` train.py).
PIPELINES: dict[str, tuple[str, ...]] = {
    "blit": ("xflip", "rotate90", "xint"),
    "geom": ("scale", "rotate", "aniso", "xfrac"),
    "color": COLOUR_OPS,
    "bg": GEOMETRIC_OPS,
    "bgc": GEOMETRIC_OPS + COLOUR_OPS,
}
WARPS = ("lowpass", "bilinear")
# Gates drawn per sample, in this order; rotate has two (pre and post), each with 1 - sqrt(1 - rotate * p).
_GATES = (
    "xflip",
    "rotate90",
    "xint",
    "scale",
    "rotate_pre",
    "aniso",
    "rotate_post",
    "xfrac",
    "brightness",
    "contrast",
    "lumaflip",
    "hue",
    "saturation",
)
_GATE_MULTIPLIER = tuple("rotate" if gate.startswith("rotate_") else gate for gate in _GATES)
_FLOAT32_STATE = ("p", "sign_stats", "last_rt", "gate_multipliers", "lowpass_taps")


@dataclass
class AugmentDraws:
    """Per-sample random parameters of one call, (N,) tensors (xint and xfrac (N, 2), in pixels). Every op not
    drawn holds its identity value (0 for flips, turns, translations, angles and brightness, 1 for the scales,
    contrast and saturation); `gates` says which were drawn (rotate_pre and rotate_post for the two rotations)."""

    gates: dict[str, Tensor]
    xflip: Tensor
    rotate90: Tensor
    xint: Tensor
    scale: Tensor
    rotate_pre: Tensor
    aniso: Tensor
    rotate_post: Tensor
    xfrac: Tensor
    brightness: Tensor
    contrast: Tensor
    lumaflip: Tensor
    hue: Tensor
    saturation: Tensor
    # Cutout (NVlabs' AugmentPipe `cutout`, drawn only when its multiplier is > 0, so the other ops' random streams
    # do not depend on it): a rectangle of cutout_size x the image, centred at `cutout_centre` (N, 2) in [0, 1),
    # zeroed where `cutout_gate` drew it.
    cutout_gate: Tensor | None = None
    cutout_centre: Tensor | None = None


class AdaptiveAugment(GANAugment):
    """ADA with p stored, together with its accumulators, as buffers so a resumed run continues exactly.

    The sign statistics are summed over ranks every iteration (a 2-element all-reduce), so the buffers hold
    global totals that are identical on every rank: a checkpoint written by rank 0 is complete, and a DDP-style
    broadcast of buffers from rank 0 cannot overwrite other ranks' unreduced counts. p is adjusted on the device,
    so `forward` and `update` never make the host wait; the host keeps only the iteration and image counters and an
    upper bound on p (each adjustment moves p by at most images / (speed_kimg * 1000)) that lets p=0 skip all work.
    `stats()` and `probability` read the device (logging iterations only) and tighten that bound to p itself.
    The float buffers stay float32 even if the owning module is cast to bf16/fp16 (steps of ~1e-4 would vanish).

    `pipeline` is one of NVlabs' names (blit, geom, color, bg, bgc) or a comma-separated list of ops (xflip,
    rotate90, xint, scale, rotate, aniso, xfrac, brightness, contrast, lumaflip, hue, saturation), each with
    multiplier 1; `multipliers` overrides single ops' multipliers ({"lumaflip": 0.5}; 0 turns an op off).
    """

    def __init__(
        self,
        target: float = 0.6,
        interval: int = 4,
        speed_kimg: float = 500.0,
        initial_p: float = 0.0,
        max_p: float = 1.0,
        pipeline: str = "bgc",
        multipliers: Mapping[str, float] | None = None,
        warp: str = "lowpass",
        xint_max: float = 0.125,
        scale_std: float = 0.2,
        rotate_max: float = 1.0,
        aniso_std: float = 0.2,
        xfrac_std: float = 0.125,
        brightness_std: float = 0.2,
        contrast_std: float = 0.5,
        hue_max: float = 1.0,
        saturation_std: float = 1.0,
        cutout_size: float = 0.5,
    ):
        super().__init__()
        if interval < 1:
            raise ValueError(f"interval must be >= 1 iteration, got {interval}.")
        if speed_kimg <= 0:
            raise ValueError(
                f"speed_kimg must be > 0 (thousands of images for p to move by 1), got {speed_kimg}."
            )
        if not 0.0 <= max_p <= 1.0 or not 0.0 <= initial_p <= max_p:
            raise ValueError(f"Need 0 <= initial_p <= max_p <= 1, got initial_p={initial_p}, max_p={max_p}.")
        strengths = dict(
            xint_max=xint_max,
            scale_std=scale_std,
            rotate_max=rotate_max,
            aniso_std=aniso_std,
            xfrac_std=xfrac_std,
            brightness_std=brightness_std,
            contrast_std=contrast_std,
            hue_max=hue_max,
            saturation_std=saturation_std,
        )
        ops = _pipeline_multipliers(pipeline)
        ops.update(_checked_multipliers(multipliers))
        negative = {name: value for name, value in strengths.items() if value < 0}
        if negative:
            raise ValueError(f"ADA's op strengths must be >= 0, got {negative}.")
        if warp not in WARPS:
            raise ValueError(
                f"augment.warp={warp!r} is not a warp: choose lowpass (NVlabs' 2x-oversampled symlet-6 resampling, "
                "the default) or bilinear (one bilinear gather, 6-14x cheaper on CPU, blurrier and aliased under "
                "rotation and down-scaling)."
            )
        # target None: p is not adapted but set from outside (`model.schedules.augment_p`, R3GAN's fixed ramp).
        self.target = None if target is None else float(target)
        self.cutout_size = float(cutout_size)
        self.interval = int(interval)
        self.speed_kimg = float(speed_kimg)
        self.max_p = float(max_p)
        self.multipliers = {op: float(ops[op]) for op in OPS}
        self.warp = warp
        for name, value in strengths.items():
            setattr(self, name, float(value))

        self.register_buffer("p", torch.tensor(initial_p, dtype=torch.float32))
        # Return the images untouched while the host knows p is 0 (saves the warp). A captured CUDA graph must
        # launch the same kernels whatever p is, so the GAN module turns this off under hardware.cuda_graphs; the
        # ops at p = 0 leave every pixel bit-exact, so both give the same images.
        self.skip_when_off = True
        # [sum of sign(D(real logits)), number of logits] since the last adjustment, summed over ranks.
        self.register_buffer("sign_stats", torch.zeros(2, dtype=torch.float32))
        self.register_buffer("images_since_adjust", torch.zeros((), dtype=torch.int64))
        self.register_buffer("iterations_since_adjust", torch.zeros((), dtype=torch.int64))
        self.register_buffer("last_rt", torch.tensor(float("nan"), dtype=torch.float32))
        # Constants the forward pass needs on the device, made once here: a tensor built from Python numbers inside
        # the training step would be a host-to-device copy, which a CUDA graph capture refuses. Not persistent: they
        # follow the config, and checkpoints from before they existed load unchanged.
        gate_multipliers = torch.tensor(
            [self.multipliers[op] for op in _GATE_MULTIPLIER], dtype=torch.float32
        )
        self.register_buffer("gate_multipliers", gate_multipliers, persistent=False)
        taps = torch.tensor(SYMLET6, dtype=torch.float64)
        self.register_buffer("lowpass_taps", (taps / taps.sum()).float(), persistent=False)
        # This rank's signs since the last update(); reduced and folded into sign_stats by update(). A plain
        # attribute, not a buffer: it is always empty between iterations, where checkpoints are written.
        self._pending_signs: Tensor | None = None
        self._sync_mirrors_from_buffers()
        self.register_load_state_dict_post_hook(_refresh_mirrors_after_load)

    def extra_repr(self) -> str:
        enabled = ", ".join(f"{op}={m:g}" for op, m in self.multipliers.items() if m > 0) or "none"
        return (
            f"p={float(self.p):.4f}, target={self.target}, interval={self.interval}, speed_kimg={self.speed_kimg}, "
            f"max_p={self.max_p}, warp={self.warp}, ops=({enabled}), xint_max={self.xint_max}, "
            f"scale_std={self.scale_std}, rotate_max={self.rotate_max}, aniso_std={self.aniso_std}, "
            f"xfrac_std={self.xfrac_std}, brightness_std={self.brightness_std}, contrast_std={self.contrast_std}, "
            f"hue_max={self.hue_max}, saturation_std={self.saturation_std}"
        )

    # ---- adaptation --------------------------------------------------------------------------------------------
    @property
    def probability(self) -> float:
        """The current p (reads the device)."""
        self._p_bound = float(self.p)
        return self._p_bound

    def stats(self) -> dict[str, float]:
        """{"p": current p, "rt": r_t of the last adjustment (nan before the first)}; reads the device."""
        return {"p": self.probability, "rt": float(self.last_rt)}

    def observe_real_logits(self, logits: Tensor) -> None:
        signs = torch.sign(logits.detach().float())
        observed = torch.stack([signs.sum(), signs.new_full((), signs.numel())])
        self._pending_signs = observed if self._pending_signs is None else self._pending_signs + observed

    def set_p(self, value: float | Tensor) -> None:
        """p from a schedule (`model.schedules.augment_p`, with `augment.target=null`): a float from the host, or a
        device tensor inside a CUDA-graph replay."""
        if self.target is not None:
            raise ValueError(
                f"model.schedules.augment_p sets ADA's p, but augment.target={self.target} adapts it: set "
                "augment.target=null for a scheduled p (R3GAN's presets do)."
            )
        if isinstance(value, Tensor):
            self.p.copy_(value.clamp(0.0, self.max_p))
        else:
            clamped = min(max(float(value), 0.0), self.max_p)
            self.p.fill_(clamped)
            self._p_bound = clamped  # from the host's number: reading p back would wait for the device

    def advance(self, num_images: int) -> bool:
        """The host's half of `update`: count the iteration and say whether it adjusts p. Called once per iteration
        before it runs, so a CUDA graph of the iteration (which cannot run Python) gets the decision as its plan."""
        if self.target is None:  # a scheduled p: nothing to adapt (set_p keeps the host's bound)
            return False
        self._images_since_adjust += int(num_images)
        self._iterations_since_adjust += 1
        if self._iterations_since_adjust < self.interval:
            return False
        largest_step = self._images_since_adjust / (self.speed_kimg * 1000.0)
        self._p_bound = min(self._p_bound + largest_step, self.max_p)
        self._images_since_adjust = 0
        self._iterations_since_adjust = 0
        return True

    def apply_update(
        self, num_images: int, adjust: bool, all_reduce: Callable[[Tensor], Tensor] | None = None
    ) -> None:
        """The device's half of `update`: fold this iteration's signs into the statistics and, where `advance`
        said so, adjust p. Device tensors only: the same kernels every time, as a captured graph needs."""
        pending = self._pending_signs
        self._pending_signs = None
        if self.target is None:
            return
        if pending is None:
            pending = torch.zeros_like(self.sign_stats)
        if all_reduce is not None:
            # Every rank calls update() every iteration, so reducing here is collective. A fresh tensor is passed
            # because some reducers (torch.distributed.all_reduce) work in place and return None.
            reduced = all_reduce(pending)
            pending = pending if reduced is None else reduced
        self.sign_stats.add_(pending.to(self.sign_stats.device, self.sign_stats.dtype))
        self.images_since_adjust.add_(int(num_images))
        self.iterations_since_adjust.add_(1)
        if adjust:
            self._adjust()

    def discard_pending(self) -> None:
        """Forget signs observed in an iteration that did not finish (a CUDA-graph capture that failed)."""
        self._pending_signs = None

    def _adjust(self) -> None:
        # On the device: the host never waits for r_t (a lazy host read here cost one sync per `interval`).
        sign_sum, count = self.sign_stats.unbind()
        observed = count > 0  # nothing observed (e.g. update() without observe_real_logits()): keep p
        rt = sign_sum / count.clamp(min=1.0)
        # In float64 and then float32: the bits of the host's float step (images / (speed_kimg * 1000)).
        largest_step = (self.images_since_adjust.double() / (self.speed_kimg * 1000.0)).float()
        new_p = (self.p + torch.sign(rt - self.target) * largest_step).clamp(0.0, self.max_p)
        self.p.copy_(torch.where(observed, new_p, self.p))
        self.last_rt.copy_(torch.where(observed, rt, self.last_rt))
        self.sign_stats.zero_()
        self.images_since_adjust.zero_()
        self.iterations_since_adjust.zero_()

    def _sync_mirrors_from_buffers(self) -> None:
        self._p_bound = float(self.p)
        self._images_since_adjust = int(self.images_since_adjust)
        self._iterations_since_adjust = int(self.iterations_since_adjust)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> AdaptiveAugment:
        # Module.to(torch.bfloat16) / .half() would quantise p to 2-3 digits and stop it moving by small steps:
        # let devices change but keep the float32 originals' values and dtype.
        before = {name: self._buffers[name] for name in _FLOAT32_STATE}
        super()._apply(fn, recurse)
        for name, original in before.items():
            converted = self._buffers[name]
            if converted.dtype != torch.float32:
                self._buffers[name] = original.to(converted.device)
        return self

    # ---- augmentation ------------------------------------------------------------------------------------------
    def _augment(self, images: Tensor) -> Tensor:
        # The per-sample parameters are drawn whatever happens next (a few (N,)-vectors): the random streams must
        # not depend on the host's bound on p, or a run resumed between logging iterations (bound reset to p)
        # would draw other latents than a straight run.
        draws = self.sample(images)
        if (
            self._p_bound <= 0.0 and self.skip_when_off
        ):  # p is surely 0: no op drawn, the images pass untouched
            return images
        return self.augment_with(images, draws)

    def sample(self, images: Tensor) -> AugmentDraws:
        """Draw every op's gate and value for each sample of `images` (on its device, at the current p)."""
        n, _, height, width = images.shape
        device = images.device
        # One call per distribution: rows of `uniform` are the 13 gates, then x-flip coin, quarter turns, integer
        # translation x and y, pre- and post-rotation angles, luma-flip coin and hue angle; rows of `normal` are the
        # isotropic and anisotropic scales, fractional translation x and y, brightness, contrast and saturation.
        uniform = torch.rand(len(_GATES) + 8, n, device=device)
        normal = torch.randn(7, n, device=device)
        probability = self.p.to(device) * self.gate_multipliers.to(device)
        # The rotations: P(pre or post) = 1 - (1 - p_rot)^2 = rotate * p.
        rotation = 1 - torch.sqrt((1 - probability).clamp(0, 1))
        probability = _select_rotation_gates(probability, rotation)
        gate_rows = uniform[: len(_GATES)] < probability.unsqueeze(1)
        gates = dict(zip(_GATES, gate_rows.unbind(0), strict=True))
        coin_flip, quarter, shift_x, shift_y, angle_pre, angle_post, coin_luma, angle_hue = uniform[
            len(_GATES) :
        ]
        log_scale, log_aniso, frac_x, frac_y, bright, log_contrast, log_saturation = normal

        def drawn(gate: str, value: Tensor, identity: float) -> Tensor:
            return torch.where(gates[gate], value, identity)

        half_turn = math.pi
        return AugmentDraws(
            gates=gates,
            xflip=drawn("xflip", torch.floor(coin_flip * 2), 0.0),
            rotate90=drawn("rotate90", torch.floor(quarter * 4).clamp_(max=3), 0.0),
            xint=torch.where(
                gates["xint"].unsqueeze(1),
                torch.round(
                    torch.stack(
                        [
                            (shift_x * 2 - 1) * (self.xint_max * width),
                            (shift_y * 2 - 1) * (self.xint_max * height),
                        ],
                        1,
                    )
                ),
                0.0,
            ),
            scale=drawn("scale", torch.exp2(log_scale * self.scale_std), 1.0),
            rotate_pre=drawn("rotate_pre", (angle_pre * 2 - 1) * (half_turn * self.rotate_max), 0.0),
            aniso=drawn("aniso", torch.exp2(log_aniso * self.aniso_std), 1.0),
            rotate_post=drawn("rotate_post", (angle_post * 2 - 1) * (half_turn * self.rotate_max), 0.0),
            xfrac=torch.where(
                gates["xfrac"].unsqueeze(1),
                torch.stack([frac_x * (self.xfrac_std * width), frac_y * (self.xfrac_std * height)], 1),
                0.0,
            ),
            brightness=drawn("brightness", bright * self.brightness_std, 0.0),
            contrast=drawn("contrast", torch.exp2(log_contrast * self.contrast_std), 1.0),
            lumaflip=drawn("lumaflip", torch.floor(coin_luma * 2), 0.0),
            hue=drawn("hue", (angle_hue * 2 - 1) * (half_turn * self.hue_max), 0.0),
            saturation=drawn("saturation", torch.exp2(log_saturation * self.saturation_std), 1.0),
            **self._sample_cutout(n, device),
        )

    def _sample_cutout(self, n: int, device: torch.device) -> dict[str, Tensor]:
        if self.multipliers["cutout"] <= 0:
            return {}
        draws = torch.rand(3, n, device=device)
        gate = draws[0] < self.p.to(device) * self.multipliers["cutout"]
        return {"cutout_gate": gate, "cutout_centre": draws[1:].T}

    def augment_with(self, images: Tensor, draws: AugmentDraws) -> Tensor:
        """Apply the given draws: the geometric ops as one warp of the samples whose map is not the identity, then
        the colour map (exactly the identity for samples that drew no colour op)."""
        n, channels, height, width = images.shape
        if any(self.multipliers[op] > 0 for op in GEOMETRIC_OPS):
            linear, offset = geometric_inverse(draws)
            identity = torch.eye(2, device=linear.device, dtype=linear.dtype)
            moved = (linear != identity).flatten(1).any(1) | (offset != 0).any(1)
            inverse = _centred_to_index(linear, offset, height, width)
            warp = self._warp_rows
            images = apply_to_selected_rows(
                images,
                moved,
                lambda rows, index: warp(rows, inverse if index is None else inverse[index]),
                gather_rows=_warp_selected_rows_only(images.device),
            )
        colour_ops = ("brightness", "contrast", "lumaflip") + (("hue", "saturation") if channels == 3 else ())
        if any(self.multipliers[op] > 0 for op in colour_ops):
            images = apply_colour(images, draws)
        if draws.cutout_gate is not None:
            images = apply_cutout(images, draws.cutout_gate, draws.cutout_centre, self.cutout_size)
        return images

    def _warp_rows(self, images: Tensor, inverse: Tensor) -> Tensor:
        if self.warp == "bilinear":
            return warp_inverse_bilinear(images, inverse)
        return warp_inverse_lowpass(images, inverse, self.lowpass_taps)


def _select_rotation_gates(probability: Tensor, rotation: Tensor) -> Tensor:
    # Gate rows 4 and 6 (rotate_pre, rotate_post) use the split probability; slices, not a mask made on the host.
    return torch.cat([probability[:4], rotation[4:5], probability[5:6], rotation[6:7], probability[7:]])


def _rotation(angle_cos: Tensor, angle_sin: Tensor) -> Tensor:
    """(N, 2, 2) rotations [[cos, -sin], [sin, cos]] (NVlabs' rotate2d)."""
    return torch.stack([angle_cos, -angle_sin, angle_sin, angle_cos], dim=1).view(-1, 2, 2)


def _diagonal(x_scale: Tensor, y_scale: Tensor) -> Tensor:
    zero = torch.zeros_like(x_scale)
    return torch.stack([x_scale, zero, zero, y_scale], dim=1).view(-1, 2, 2)


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    # Elementwise, not torch.matmul: under TF32 (the a100/h100 profiles) a float32 matmul keeps 10 mantissa bits,
    # which would misplace pixels by a fraction of a pixel at 256 px.
    if b.ndim == a.ndim - 1:
        return (a * b.unsqueeze(-2)).sum(-1)
    return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)


def geometric_inverse(draws: AugmentDraws) -> tuple[Tensor, Tensor]:
    """The composed inverse map (output pixel -> input pixel, centred pixel coordinates, x = column, y = row) as
    its linear part (N, 2, 2) and offset (N, 2).

    NVlabs' G_inv = F^-1 R90^-1 Tint^-1 S^-1 Rpre^-1 A^-1 Rpost^-1 Tfrac^-1 (training/augment.py), written as
    x_in = F R (M (x_out - t_frac) - t_int) with F = diag(1 - 2 flip, 1), R the quarter turns' rotation (exact
    cosines: cos(pi / 2) in float32 is -4e-8, not 0) and M = R(pre) diag(1 / a, a) R(post) / s.
    """
    turns = draws.rotate90
    turn_cos = (turns == 0).to(turns.dtype) - (turns == 2).to(turns.dtype)
    turn_sin = (turns == 1).to(turns.dtype) - (turns == 3).to(turns.dtype)
    flip_turn = _matmul(_diagonal(1 - 2 * draws.xflip, torch.ones_like(turns)), _rotation(turn_cos, turn_sin))
    pre = _rotation(torch.cos(draws.rotate_pre), torch.sin(draws.rotate_pre))
    post = _rotation(torch.cos(draws.rotate_post), torch.sin(draws.rotate_post))
    general = _matmul(_matmul(pre, _diagonal(1 / draws.aniso, draws.aniso)), post) / draws.scale.view(
        -1, 1, 1
    )
    linear = _matmul(flip_turn, general)
    offset = -(_matmul(linear, draws.xfrac) + _matmul(flip_turn, draws.xint))
    return linear, offset


def _centred_to_index(linear: Tensor, offset: Tensor, height: int, width: int) -> Tensor:
    """(N, 2, 3) maps in pixel-index coordinates (pixel centres at 0..W-1): x_in = L (x_out - c) + o + c."""
    centre = _centre(linear, height, width)
    index_offset = offset + centre - _matmul(linear, centre.expand_as(offset))
    return torch.cat([linear, index_offset.unsqueeze(2)], dim=2)


def _centre(like: Tensor, height: int, width: int) -> Tensor:
    # ((W - 1) / 2, (H - 1) / 2) made on the device (arange and arithmetic), without copying from the host.
    axis = torch.arange(2, device=like.device, dtype=like.dtype)
    return (axis * (height - width) + (width - 1)) / 2


def apply_colour(images: Tensor, draws: AugmentDraws) -> Tensor:
    """NVlabs' colour matrix C = Sat Hue Luma Contrast Bright on RGB, written out.

    With P = v v^T (v the luma axis), Q = I - P and K = [v]x (cross product with v), every factor but brightness is
    a combination of P, Q and K, and those multiply like P Q = 0, Q K = K Q = K: C x = c ((1 - 2 f) P + s cos(h) Q +
    s sin(h) K) (x + b) for contrast c, luma flip f, saturation s, hue h and brightness b. Since P x is the channel
    mean m (on every channel), K x = (roll(x, 1) - roll(x, -1)) / sqrt(3) and K 1 = Q 1 = 0, that is
        c s cos(h) x + c ((1 - 2 f) - s cos(h)) m + c s sin(h) K x + c (1 - 2 f) b,
    four elementwise passes with exact identity coefficients (1, 0, 0, 0) for samples that drew nothing. On other
    channel counts (no hue or saturation): NVlabs' grayscale rule, x c (1 - 2 f) + c (1 - 2 f) b.
    """
    n, channels = images.shape[:2]
    dtype = images.dtype

    def column(value: Tensor) -> Tensor:
        return value.to(dtype).view(n, 1, 1, 1)

    luma_gain = draws.contrast * (1 - 2 * draws.lumaflip)
    offset = column(luma_gain * draws.brightness)
    if channels != 3:
        return torch.addcmul(offset, images, column(luma_gain))
    chroma = draws.contrast * draws.saturation
    chroma_cos, chroma_sin = chroma * torch.cos(draws.hue), chroma * torch.sin(draws.hue)
    mean = images.mean(1, keepdim=True)
    out = torch.addcmul(offset, mean, column(luma_gain - chroma_cos))
    out = torch.addcmul(out, images, column(chroma_cos))
    cross = images.roll(1, dims=1) - images.roll(-1, dims=1)
    out = torch.addcmul(out, cross, column(chroma_sin / math.sqrt(3)))
    return out.contiguous(memory_format=torch.channels_last) if _is_channels_last(images) else out


def apply_cutout(images: Tensor, gate: Tensor, centre: Tensor, size: float) -> Tensor:
    """NVlabs' cutout: zero a `size` x `size` (fractions of the image) rectangle centred at `centre` (N, 2: x, y in
    [0, 1)) in the samples where `gate` is set; pixel centres at (i + 0.5) / width inside half the size are cut."""
    n, _, height, width = images.shape
    xs = (torch.arange(width, device=images.device) + 0.5) / width
    ys = (torch.arange(height, device=images.device) + 0.5) / height
    half = torch.where(gate, size / 2, 0.0).view(n, 1)
    outside_x = (xs.view(1, -1) - centre[:, :1]).abs() >= half  # (N, W)
    outside_y = (ys.view(1, -1) - centre[:, 1:]).abs() >= half  # (N, H)
    keep = (outside_x.unsqueeze(1) | outside_y.unsqueeze(2)).unsqueeze(1)  # (N, 1, H, W)
    return images * keep.to(images.dtype)


def _is_channels_last(images: Tensor) -> bool:
    return images.shape[1] > 1 and images.is_contiguous(memory_format=torch.channels_last)


def _pipeline_multipliers(pipeline: str) -> dict[str, float]:
    names = [part.strip() for part in str(pipeline).split(",") if part.strip()]
    ops = [op for name in names for op in PIPELINES.get(name, (name,))]
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(
            f"augment.pipeline={pipeline!r} names no ADA op or pipeline: {', '.join(unknown)}. It takes NVlabs' "
            f"pipeline names ({', '.join(PIPELINES)}; bgc is the paper's default) or a comma-separated list of ops "
            f"({', '.join(OPS)}), e.g. augment.pipeline=bgc or augment.pipeline=xflip,xint. Filtering and noise "
            "(NVlabs' bgcfnc) are not implemented."
        )
    return {op: (1.0 if op in ops else 0.0) for op in OPS}


def _checked_multipliers(multipliers: Mapping[str, float] | None) -> dict[str, float]:
    given = dict(multipliers or {})
    unknown = [op for op in given if op not in OPS]
    negative = {op: m for op, m in given.items() if op in OPS and float(m) < 0}
    if unknown or negative:
        raise ValueError(
            f"augment.multipliers={given} is not valid ({'unknown ops ' + ', '.join(unknown) if unknown else ''}"
            f"{'; ' if unknown and negative else ''}{'negative ' + str(negative) if negative else ''}): it maps ops "
            f"({', '.join(OPS)}) to probability multipliers >= 0 (p times the multiplier is the op's probability; "
            "0 turns it off), e.g. augment.multipliers={lumaflip:0}."
        )
    return {op: float(m) for op, m in given.items()}


def _warp_selected_rows_only(device: torch.device) -> bool:
    # Selecting rows needs nonzero(), which makes the host wait for the device; on CPU that wait does not exist.
    return device.type == "cpu"


def _refresh_mirrors_after_load(module: torch.nn.Module, incompatible_keys: Any) -> None:
    module._sync_mirrors_from_buffers()
    module._pending_signs = None
