"""Exponential moving average of a network's weights, with StyleGAN2-ADA's half-life-in-images parameterisation.

beta = 0.5 ** (images_per_iteration / ema_nimg), where ema_nimg = half_life_kimg * 1000, limited during ramp-up to
rampup * images_seen: early on the average follows the fast-changing weights closely, later it smooths over
half_life_kimg thousand images whatever the batch size.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn

from pixelsmith.core.precision import NO_FLOAT64_DEVICES

# The longest ramp-up (in iterations) whose betas the graphed path tabulates (8 bytes each on the device); a longer
# one is computed on the device each iteration. Up to WHOLE_TABLE iterations the table reaches the run's last
# iteration, so its index needs no clamp (a few hundred kilobytes, built in well under a second).
MAX_TABLE = 1 << 20
WHOLE_TABLE = 1 << 16


class EMA(nn.Module):
    """Holds a frozen copy of `source` in `self.model`; part of the owner's state_dict, so it resumes exactly."""

    def __init__(self, source: nn.Module, half_life_kimg: float = 10.0, rampup: float | None = 0.05):
        super().__init__()
        if half_life_kimg <= 0:
            raise ValueError(f"ema.half_life_kimg={half_life_kimg} must be positive.")
        self.half_life_kimg = half_life_kimg
        self.rampup = rampup
        self.model = copy.deepcopy(source).eval().requires_grad_(False)
        # The half-life in images on the device, which a CUDA-graph replay reads (and `model.schedules.
        # ema_half_life_kimg` writes there); not persistent: the config or the schedule gives it.
        self.register_buffer(
            "half_life_nimg", torch.tensor(half_life_kimg * 1000.0, dtype=torch.float64), False
        )
        self._scheduled = False  # a schedule writes the half-life on the device: betas only the device knows
        # The graphed path's per-iteration betas and weights (`_betas_by_iteration`): key -> (betas, weights).
        self._tables: dict[tuple, tuple[Tensor, Tensor] | None] = {}

    def _apply(self, fn, recurse=True):
        # MPS has no float64: moved to an Apple GPU, the half-life (read only by a CUDA-graph replay) goes float32,
        # where `.to("mps")` would refuse the float64 buffer and with it the whole model.
        if self.half_life_nimg.dtype == torch.float64 and _target_device_type(fn) in NO_FLOAT64_DEVICES:
            self.half_life_nimg = self.half_life_nimg.float()
        return super()._apply(fn, recurse)

    def set_half_life_kimg(self, value: float | Tensor) -> None:
        """A scheduled half-life (R3GAN's ramps from 0): a float on the host, or a device tensor inside a replay. 0 is
        allowed here (the average then copies G), unlike at construction."""
        if isinstance(value, Tensor):
            self._scheduled = True
            self.half_life_nimg.copy_(value * 1000.0)
        else:
            self.half_life_kimg = float(value)
            self.half_life_nimg.fill_(float(value) * 1000.0)

    def beta(self, images_per_iteration: int, images_seen: int | Tensor) -> float | Tensor:
        """The decay for this iteration; a device tensor when `images_seen` is one (a CUDA-graph replay cannot read
        the host's count), computed in float64 there so it equals the host's Python float."""
        ema_nimg = self.half_life_kimg * 1000.0
        if isinstance(images_seen, Tensor):
            nimg = self.half_life_nimg.to(images_seen.device, torch.float64)
            if self.rampup is not None:
                nimg = torch.minimum(nimg, images_seen.double() * self.rampup)
            return torch.pow(0.5, images_per_iteration / nimg.clamp(min=1e-8))
        if self.rampup is not None:
            ema_nimg = min(ema_nimg, images_seen * self.rampup)
        return 0.5 ** (images_per_iteration / max(ema_nimg, 1e-8))

    def _betas_by_iteration(
        self,
        images_per_iteration: int,
        iteration: int,
        images_seen: int,
        last_iteration: int,
        device: torch.device,
    ) -> float | tuple[Tensor, bool] | None:
        """The graphed path's betas, worked out on the host from the host's `iteration` and `images_seen` at the
        run's start (later iterations add `images_per_iteration` each: a graphed run's batch is fixed):
        - a float: beta is constant from here on (no ramp-up, or the ramp-up is over), the eager path's number;
        - (rows, whole): rows [lerp weight, beta] (float32; the weight is 1 - beta as the eager path's kernel rounds
          it) for every iteration from 0 to the ramp-up's end, or to `last_iteration` where that is short (`whole`:
          no clamp of the index needed). A replay then reads its beta with one index instead of a chain of scalar
          kernels;
        - None where the device must compute it: a scheduled half-life, a ramp-up longer than MAX_TABLE iterations,
          or another batch size than the one the table was made for (its rows are the first one's; graphs already
          captured keep reading them)."""
        key = (
            images_per_iteration,
            iteration,
            images_seen,
            last_iteration,
            device,
            self.half_life_kimg,
            self.rampup,
        )
        if key in self._tables:
            return self._tables[key]
        if self._tables or self._scheduled:
            return None
        ramp_images = (
            self.half_life_kimg * 1000.0 / self.rampup if self.rampup else 0.0
        )  # beta constant from here
        if images_seen >= ramp_images:
            plan: float | tuple[Tensor, bool] | None = self.beta(images_per_iteration, images_seen)
        else:
            end = iteration + math.ceil(
                (ramp_images - images_seen) / images_per_iteration
            )  # constant from here
            whole = max(end, last_iteration) <= WHOLE_TABLE
            end = max(end, last_iteration) if whole else end
            plan = None
            if end <= MAX_TABLE:
                start = max(iteration, 0)
                betas = [
                    self.beta(images_per_iteration, images_seen + (k - iteration) * images_per_iteration)
                    for k in range(start, end + 1)
                ]
                betas = [betas[0]] * start + betas  # iterations before this run's start: never read
                rows = torch.tensor([[1.0 - b, b] for b in betas], dtype=torch.float32)
                plan = (rows.to(device), whole)
        self._tables[key] = plan  # kept for the run: captured graphs read its rows
        return plan

    @torch.no_grad()
    def update(
        self,
        source: nn.Module,
        images_per_iteration: int,
        images_seen: int | Tensor,
        iteration_now: Tensor | None = None,
        host_start: tuple[int, int, int] | None = None,
    ) -> float | Tensor:
        """Move the average towards `source`; returns this iteration's beta. On the graphed path `images_seen` and
        `iteration_now` are the device's counters and `host_start` = (iteration, images_seen, last iteration) the
        host's at the run's start: the beta then comes from the host where it can (`_betas_by_iteration`)."""
        ema_params = list(self.model.parameters())
        src_params = [p.detach() for p in source.parameters()]
        plan = None
        if isinstance(images_seen, Tensor) and iteration_now is not None and host_start is not None:
            plan = self._betas_by_iteration(images_per_iteration, *host_start, images_seen.device)
        if isinstance(plan, tuple):
            rows, whole = plan
            # index_select with a one-element index: `rows[0-dim tensor]` would read the index on the host.
            index = (iteration_now if whole else iteration_now.clamp(max=len(rows) - 1)).reshape(1)
            weight, beta = (column.reshape(()) for column in rows.index_select(0, index).unbind(1))
        elif (
            plan is not None
        ):  # constant: the host's number, as the eager path uses it (a replay bakes it in)
            beta = plan
            weight = 1.0 - beta
        else:
            beta = self.beta(images_per_iteration, images_seen)
            # In float32 where beta is a tensor, as the float weight is inside the kernel: both give the same bits.
            weight = (1.0 - beta).float() if isinstance(beta, Tensor) else 1.0 - beta
        if isinstance(weight, Tensor):
            # A tensor weight per parameter (the List overload; a lone 0-dim tensor would be read as a host Scalar,
            # a sync that a CUDA graph would bake in).
            weight = [weight.expand_as(p) for p in ema_params]
        torch._foreach_lerp_(ema_params, src_params, weight)
        # Buffers (BatchNorm statistics, StyleGAN's w_avg) are copied, as in StyleGAN2-ADA.
        for ema_buf, src_buf in zip(self.model.buffers(), source.buffers(), strict=True):
            ema_buf.copy_(src_buf)
        return beta

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def train(self, mode: bool = True):
        # The average is only ever evaluated; keep BatchNorm in eval mode even when the owner goes to train().
        super().train(False)
        return self


def _target_device_type(fn) -> str | None:
    """Where a Module._apply function sends tensors (`.to(device)`, `.cuda()`), probed on an empty tensor; None for a
    function that takes no plain tensor."""
    try:
        return fn(torch.empty(0)).device.type
    except Exception:  # a probe only: such a function moves nothing to MPS
        return None
