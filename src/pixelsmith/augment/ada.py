"""ADA: adaptive discriminator augmentation (Karras et al. 2020, "Training GANs with Limited Data").

Each op is applied per sample with probability p, and p follows D's overfitting heuristic
r_t = E[sign(D(real))]: every `interval` iterations p += sign(r_t - target) * images / (speed_kimg * 1000),
clamped to [0, max_p], where `images` counts what D saw (all ranks) since the last adjustment.

Ops and distributions follow the reference "bgc" pipeline (github.com/NVlabs/stylegan2-ada-pytorch,
training/augment.py), restricted to: x-flip, rotation by multiples of 90 degrees, integer translation,
isotropic scaling 2^N(0, scale_std), rotation U(-rotate_max_deg, rotate_max_deg); brightness +N(0, brightness),
contrast x 2^N(0, contrast), hue rotation about the luma axis U(-hue, hue) * 180 degrees and saturation
x 2^N(0, saturation) around the luma axis. As in the reference:

- all geometric ops are folded into one affine matrix per sample and resampled once (bilinear, reflection
  padding), so stacking ops costs one warp and blurs once. The warp is our own gather-based
  `augment.warp.warp_affine_reflect` (the values of kornia's `warp_affine`): kornia's calls `F.grid_sample`,
  which has no double backward on CUDA, and lazy R1 backpropagates twice through the warp (the reference ships
  its own grid-sample op for the same reason);
- all colour ops are folded into one affine colour map per sample (3x3 matrix plus offset) applied to the [-1, 1]
  values, so contrast scales about mid-grey and nothing is clamped.
kornia's RandomAffine/RandomRotation/RandomBrightness/RandomContrast/RandomSaturation/RandomHue are not used:
they draw uniform factors (ADA draws normal and log-normal ones), saturation and hue work in HSV with [0, 1]
clamps, each geometric op resamples (and blurs) separately, and below p=1 kornia transforms every sample and then
keeps the untransformed ones with torch.where, so p=0.05 costs as much as p=1. Here p=0 skips all work and, on
CPU, only the samples that drew a geometric op are warped.

Deviations from the reference: no anisotropic scaling or fractional translation (not in this API); one rotation
with probability p instead of two with 1 - sqrt(1 - p) (the same distribution for rotate_max_deg=180); no
wavelet up/down-sampling around the warp (plain bilinear). On grayscale images only brightness and contrast run:
hue and saturation act on chroma, which one channel does not have.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from pixelsmith.augment.base import GANAugment, apply_to_selected_rows
from pixelsmith.augment.warp import warp_affine_reflect

_FLOAT32_STATE = ("p", "sign_stats", "last_rt")


class AdaptiveAugment(GANAugment):
    """ADA with p stored, together with its accumulators, as buffers so a resumed run continues exactly.

    The sign statistics are summed over ranks every iteration (a 2-element all-reduce), so the buffers hold
    global totals that are identical on every rank: a checkpoint written by rank 0 is complete, and a DDP-style
    broadcast of buffers from rank 0 cannot overwrite other ranks' unreduced counts. p is adjusted on the device,
    so `forward` and `update` never make the host wait; the host keeps only the iteration and image counters and an
    upper bound on p (each adjustment moves p by at most images / (speed_kimg * 1000)) that lets p=0 skip all work.
    `stats()` and `probability` read the device (logging iterations only) and tighten that bound to p itself.
    The float buffers stay float32 even if the owning module is cast to bf16/fp16 (steps of ~1e-4 would vanish).
    """

    def __init__(
        self,
        target: float = 0.6,
        interval: int = 4,
        speed_kimg: float = 500.0,
        initial_p: float = 0.0,
        max_p: float = 1.0,
        xflip: bool = True,
        rotate90: bool = True,
        translate: float = 0.125,
        scale_std: float = 0.2,
        rotate_max_deg: float = 180.0,
        brightness: float = 0.2,
        contrast: float = 0.5,
        saturation: float = 1.0,
        hue: float = 0.0,
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
            translate=translate,
            scale_std=scale_std,
            rotate_max_deg=rotate_max_deg,
            brightness=brightness,
            contrast=contrast,
            saturation=saturation,
            hue=hue,
        )
        negative = {name: value for name, value in strengths.items() if value < 0}
        if negative:
            raise ValueError(f"Augmentation strengths must be >= 0 (0 disables the op), got {negative}.")
        if hue > 1.0:
            raise ValueError(f"hue is a fraction of a half turn and must be in [0, 1], got {hue}.")
        self.target = float(target)
        self.interval = int(interval)
        self.speed_kimg = float(speed_kimg)
        self.max_p = float(max_p)
        self.xflip = bool(xflip)
        self.rotate90 = bool(rotate90)
        self.translate = float(translate)
        self.scale_std = float(scale_std)
        self.rotate_max_deg = float(rotate_max_deg)
        self.brightness = float(brightness)
        self.contrast = float(contrast)
        self.saturation = float(saturation)
        self.hue = float(hue)

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
        # This rank's signs since the last update(); reduced and folded into sign_stats by update(). A plain
        # attribute, not a buffer: it is always empty between iterations, where checkpoints are written.
        self._pending_signs: Tensor | None = None
        self._sync_mirrors_from_buffers()
        self.register_load_state_dict_post_hook(_refresh_mirrors_after_load)

    def extra_repr(self) -> str:
        return (
            f"p={float(self.p):.4f}, target={self.target}, interval={self.interval}, speed_kimg={self.speed_kimg}, "
            f"max_p={self.max_p}, xflip={self.xflip}, rotate90={self.rotate90}, translate={self.translate}, "
            f"scale_std={self.scale_std}, rotate_max_deg={self.rotate_max_deg}, brightness={self.brightness}, "
            f"contrast={self.contrast}, saturation={self.saturation}, hue={self.hue}"
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

    def advance(self, num_images: int) -> bool:
        """The host's half of `update`: count the iteration and say whether it adjusts p. Called once per iteration
        before it runs, so a CUDA graph of the iteration (which cannot run Python) gets the decision as its plan."""
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
        p = self.p
        # The per-sample parameters are drawn whatever happens next (a few (N,)-vectors): the random streams must
        # not depend on the host's bound on p, or a run resumed between logging iterations (bound reset to p)
        # would draw other latents than a straight run.
        geometric = self._geometric_matrices(images, p)
        colour = self._colour_transform(images, p)
        if (
            self._p_bound <= 0.0 and self.skip_when_off
        ):  # p is surely 0: no op drawn, the images pass untouched
            return images
        if geometric is not None:
            matrices, applied = geometric
            images = apply_to_selected_rows(
                images,
                applied,
                lambda rows, index: _warp(rows, matrices if index is None else matrices[index]),
                gather_rows=_warp_selected_rows_only(images.device),
            )
        if colour is not None:
            # Samples that drew no colour op get exactly gain 1 / the identity matrix and offset 0, which leaves them
            # bit-exact, so this pass needs no row selection.
            images = _apply_colour(images, *colour)
        return images

    def _geometric_matrices(self, images: Tensor, p: float) -> tuple[Tensor, Tensor] | None:
        """Per-sample source-to-destination pixel matrices (N, 2, 3) and which samples drew any geometric op.

        Reference order, each op about the image centre: x-flip f, k quarter turns, integer translation t,
        scale s, rotation theta. The linear part s R(theta) R(k 90) diag(f, 1) = s R(theta + k 90) diag(f, 1) and the
        translation s R(theta) t are a few elementwise ops on (N,) vectors (one kernel launch each on a GPU) instead
        of a chain of 3x3 products. An op not drawn for a sample takes its identity value.
        """
        if not (
            self.xflip or self.rotate90 or self.translate > 0 or self.scale_std > 0 or self.rotate_max_deg > 0
        ):
            return None
        n, _, height, width = images.shape
        device = images.device
        # Rows: gates (flip, rot90, translate, scale, rotate), flip coin, quarter turns, shift x, shift y, angle.
        uniform = torch.rand(10, n, device=device)
        gates = uniform[:5] < p
        applied = torch.zeros(n, dtype=torch.bool, device=device)
        zero, one = torch.zeros(n, device=device), torch.ones(n, device=device)
        flip, cos_k, sin_k, shift_x, shift_y, scale, cos_t, sin_t = one, one, zero, zero, zero, one, one, zero
        if self.xflip:
            applied = applied | gates[0]
            flip = torch.where(gates[0] & (uniform[5] < 0.5), -1.0, 1.0)  # reference: with p, flip with 1/2
        if self.rotate90:
            applied = applied | gates[1]
            quarter_turns = torch.where(gates[1], (uniform[6] * 4).long().clamp_(max=3), 0)
            # Exact cosines/sines of k * 90 degrees (cos(pi/2) in float32 is -4e-8, not 0).
            cos_k = (quarter_turns == 0).float() - (quarter_turns == 2).float()
            sin_k = (quarter_turns == 1).float() - (quarter_turns == 3).float()
        if self.translate > 0:
            applied = applied | gates[2]
            shift_x = torch.where(gates[2], torch.round((uniform[7] * 2 - 1) * (self.translate * width)), 0.0)
            shift_y = torch.where(
                gates[2], torch.round((uniform[8] * 2 - 1) * (self.translate * height)), 0.0
            )
        if self.scale_std > 0:
            applied = applied | gates[3]
            scale = torch.where(gates[3], torch.exp2(torch.randn(n, device=device) * self.scale_std), 1.0)
        if self.rotate_max_deg > 0:
            applied = applied | gates[4]
            theta = torch.where(gates[4], (uniform[9] * 2 - 1) * math.radians(self.rotate_max_deg), 0.0)
            cos_t, sin_t = torch.cos(theta), torch.sin(theta)
        cos_total = cos_t * cos_k - sin_t * sin_k
        sin_total = sin_t * cos_k + cos_t * sin_k
        a, b = scale * cos_total * flip, -scale * sin_total
        c, d = scale * sin_total * flip, scale * cos_total
        shift_x, shift_y = (
            scale * (cos_t * shift_x - sin_t * shift_y),
            scale * (sin_t * shift_x + cos_t * shift_y),
        )
        # About the centre: x' = L (x - centre) + t + centre; align_corners=True puts pixel centres at 0..W-1.
        centre_x, centre_y = (width - 1) / 2, (height - 1) / 2
        shift_x = shift_x + centre_x - (a * centre_x + b * centre_y)
        shift_y = shift_y + centre_y - (c * centre_x + d * centre_y)
        return torch.stack([a, b, shift_x, c, d, shift_y], dim=1).view(n, 2, 3), applied

    def _colour_transform(self, images: Tensor, p: float) -> tuple[Tensor, Tensor] | None:
        """Per-sample colour map on [-1, 1] values: (gain (N,) or matrix (N, 3, 3), offset (N,)).

        Reference order: brightness b, contrast c, hue rotation theta about the luma axis v, saturation s (a scale
        of the chroma, the part orthogonal to v). With P = v v^T, Q = I - P and K = [v]x (cross-product matrix):
            hue R = P + cos(theta) Q + sin(theta) K (Rodrigues), saturation S = P + s Q, and since R 1 = S 1 = 1,
            x' = S R c (x + b) = c (I + (s cos(theta) - 1) Q + s sin(theta) K) x + c b.
        Without chroma ops (or on non-RGB images) this is the gain c and offset c b.
        """
        n, channels = images.shape[:2]
        chroma = channels == 3 and (self.hue > 0 or self.saturation > 0)
        if not (self.brightness > 0 or self.contrast > 0 or chroma):
            return None
        device = images.device
        uniform = torch.rand(5, n, device=device)  # gates (brightness, contrast, hue, saturation), hue angle
        normal = torch.randn(3, n, device=device)  # brightness, contrast, saturation
        gates = uniform[:4] < p
        zero, one = torch.zeros(n, device=device), torch.ones(n, device=device)
        offset = torch.where(gates[0], normal[0] * self.brightness, 0.0) if self.brightness > 0 else zero
        gain = torch.where(gates[1], torch.exp2(normal[1] * self.contrast), 1.0) if self.contrast > 0 else one
        offset = gain * offset
        if not chroma:
            return gain, offset
        theta = (
            torch.where(gates[2], (uniform[4] * 2 - 1) * (math.pi * self.hue), 0.0) if self.hue > 0 else zero
        )
        saturation = (
            torch.where(gates[3], torch.exp2(normal[2] * self.saturation), 1.0)
            if self.saturation > 0
            else one
        )
        identity = torch.eye(3, device=device)
        chroma_projection = identity - 1 / 3  # Q = I - v v^T with v = (1, 1, 1) / sqrt(3)
        # K = [v]x: K[i, i+1] = -1/sqrt(3), K[i, i-1] = +1/sqrt(3) (indices mod 3); built on the device, no copy.
        axis_cross = (identity.roll(-1, dims=1) - identity.roll(1, dims=1)) / math.sqrt(3)
        scaled_cos = (saturation * torch.cos(theta) - 1).view(n, 1, 1)
        scaled_sin = (saturation * torch.sin(theta)).view(n, 1, 1)
        matrix = gain.view(n, 1, 1) * (identity + scaled_cos * chroma_projection + scaled_sin * axis_cross)
        return matrix, offset


def _warp_selected_rows_only(device: torch.device) -> bool:
    # Selecting rows needs nonzero(), which makes the host wait for the device; on CPU that wait does not exist.
    return device.type == "cpu"


def _refresh_mirrors_after_load(module: torch.nn.Module, incompatible_keys: Any) -> None:
    module._sync_mirrors_from_buffers()
    module._pending_signs = None


def _warp(images: Tensor, matrices: Tensor) -> Tensor:
    # Reflection padding, as in the reference: the padded border continues the image instead of adding a grey or
    # black frame that D could use to tell augmented images apart. Differentiable twice (R1) on every device; the
    # random matrices get no gradient.
    return warp_affine_reflect(images, matrices)


def _apply_colour(images: Tensor, transform: Tensor, offset: Tensor) -> Tensor:
    n, channels, height, width = images.shape
    transform, offset = transform.to(images.dtype), offset.to(images.dtype)
    if transform.ndim == 1:
        return torch.addcmul(offset.view(n, 1, 1, 1), images, transform.view(n, 1, 1, 1))
    flat = images.reshape(n, channels, height * width)
    return torch.baddbmm(offset.view(n, 1, 1), transform, flat).view(n, channels, height, width)
