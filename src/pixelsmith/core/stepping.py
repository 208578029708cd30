"""The optimizer step of the training core: all-reduce, unscale, finite check, clip, fused step, gradient norm.

`OptimizerStepper` keeps what lies between a model's `loss_backward` calls and its `step(name)`: each optimizer's
micro-batch losses (folded into the finite check, one check a step rather than a chain of scalar kernels a
micro-batch) and its backward count (a backward left without its step is an error). With fused Adam (every hardware
profile) the whole step stays on the device: the skip decision reaches the fused kernel as its `found_inf`, which
leaves the weights, moments and step count as they were. Other Adam implementations need the host to decide (one
synchronisation a step, which `host_synced` reports).

Clipping uses unscaled gradients whatever the precision (Lightning #18089 clips scaled ones).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from pixelsmith.errors import PixelsmithError


def nonfinite(value: torch.Tensor) -> torch.Tensor:
    """True where `value` is inf or NaN, in two kernels (`torch.isfinite` is four): x * 0 is 0 exactly for finite x."""
    return value.mul(0).ne(0)


def skip_flag(value: torch.Tensor) -> torch.Tensor:
    """1.0 where `value` is inf or NaN, else 0.0 (or -0.0), in two kernels: x * 0 is zero for finite x and NaN
    otherwise. A float, because that is what the fused optimizer's `found_inf` and the guard's counters take: no cast
    kernel between the check and its uses."""
    # float32 whatever the loss's dtype (a float64 loss would give a float64 flag, which the fused kernel refuses);
    # no kernel where it is float32 already.
    flag = value.mul(0).nan_to_num_(nan=1.0)
    return flag if flag.dtype == torch.float32 else flag.float()


def global_norm(grads: list[torch.Tensor], one_group: bool = False) -> torch.Tensor:
    """L2 norm over all gradients as one vector. Sharded (DTensor) gradients give the norm over every rank's
    shard (DTensor reduces the partial norms), so clipping and the finite check agree on all ranks.

    `one_group`: the caller knows every gradient is a plain tensor of one device and dtype (`OptimizerStepper` finds
    it once per optimizer). Then the norm is what `get_total_norm` computes for such a list, one foreach norm and one
    norm of their stack, without its per-tensor grouping and `.to()` calls: host time that grows with the number of
    parameter tensors in an eager iteration (StyleGAN2 has hundreds)."""
    if one_group:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    sharded = [g for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    norms = [torch.nn.utils.get_total_norm(group) for group in (sharded, plain) if group]
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    return norms[0] if len(norms) == 1 else torch.nn.utils.get_total_norm(norms)


def all_reduce_gradients(params: list[nn.Parameter], loss_flag: torch.Tensor, world: int) -> torch.Tensor:
    """Average gradients (and OR the non-finite loss flags) across ranks in one flat all-reduce; returns the summed
    flag. FSDP2 has already averaged the gradients of sharded (DTensor) parameters in backward: only the flag (and any
    parameter outside the sharded networks) is reduced here."""
    params = [p for p in params if not isinstance(p, DTensor)]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads] + [loss_flag.reshape(1).float()])
    torch.distributed.all_reduce(flat)
    flat.div_(world)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(g).to(g.dtype)
        offset += n
    return flat[-1] * world


def average_buffers(buffers: list[torch.Tensor], world: int) -> None:
    """Average floating buffers (BatchNorm statistics, StyleGAN's w_avg) over ranks in one flat all-reduce."""
    flat = torch.cat([b.reshape(-1).float() for b in buffers])
    torch.distributed.all_reduce(flat)
    flat.div_(world)
    offset = 0
    for b in buffers:
        b.copy_(flat[offset : offset + b.numel()].view_as(b))
        offset += b.numel()


class OptimizerStepper:
    def __init__(self, accumulate: int, clip_grad_norm: float | None):
        self.accumulate = accumulate
        self.clip_grad_norm = clip_grad_norm
        self.losses: dict[str, list[torch.Tensor]] = {}  # each optimizer's micro-batch losses since its step
        self.backward_calls: dict[str, int] = {}  # loss_backward calls per optimizer since its last step
        self.last_grad_norm: dict[str, torch.Tensor] = {}  # per optimizer, its latest step's (device tensor)
        self.allreduces = 0  # gradient all-reduces since the count was last reset (one an optimizer step)
        self.host_synced = False  # a non-fused step made the host wait since the flag was last reset
        # Per optimizer: its parameters share one device and dtype, none sharded (`_one_group`).
        self._one_group_by_name: dict[str, bool] = {}

    def _one_group(self, name: str, opt: torch.optim.Optimizer) -> bool:
        """Whether every parameter of `opt` is a plain tensor of one device and dtype (so are their gradients, and
        any subset that has gradients in an iteration); worked out once per optimizer."""
        known = self._one_group_by_name.get(name)
        if known is None:
            params = [p for group in opt.param_groups for p in group["params"]]
            first = params[0] if params else None
            known = self._one_group_by_name[name] = first is not None and all(
                not isinstance(p, DTensor) and p.device == first.device and p.dtype == first.dtype
                for p in params
            )
        return known

    def backward_done(self, name: str, loss: torch.Tensor) -> int:
        """Note one micro-batch's loss for optimizer `name`; returns its backward count since its last step."""
        self.losses.setdefault(name, []).append(loss.detach())
        calls = self.backward_calls[name] = self.backward_calls.get(name, 0) + 1
        return calls

    def unstepped(self) -> list[str]:
        """Optimizers with a backward since their last step (their gradients would leak into the next iteration)."""
        return sorted(name for name, calls in self.backward_calls.items() if calls)

    def forget(self) -> None:
        """Drop the pending losses and counts of an iteration that did not finish."""
        self.backward_calls.clear()
        self.losses.clear()

    def step(
        self,
        name: str,
        opt: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        world_size: int,
        device: torch.device,
        sharded: bool,
        record: Callable[[str, torch.Tensor, torch.Tensor | None], None],
    ) -> torch.Tensor:
        """All-reduce, unscale, check, clip and apply `opt`; `record(name, skip, amp_overflow)` gets the outcome
        (the non-finite guard). Returns the step's skip flag: a device float, 1.0 where the step was skipped."""
        params = [p for group in opt.param_groups for p in group["params"] if p.requires_grad]
        calls = self.backward_calls.pop(name, 0)
        if sharded and 0 < calls < self.accumulate:
            raise PixelsmithError(
                f"Optimizer {name} stepped after {calls} loss_backward call(s) with accumulate={self.accumulate}: "
                "under strategy=fsdp gradients are synchronised on the accumulate-th call, so call "
                "self.loss_backward(loss, name) once per micro-batch (see self.micro_batches)."
            )
        losses = self.losses.pop(name, [])
        # Non-finite exactly where one of the losses is (a sum of finite losses stays finite).
        loss_term = losses[0] if len(losses) == 1 else sum(losses[1:], losses[0]) if losses else None
        if world_size > 1:
            flag = nonfinite(loss_term).float() if loss_term is not None else torch.zeros((), device=device)
            flag = all_reduce_gradients(params, flag, world_size)  # every rank's flags, so all skip alike
            self.allreduces += 1
            loss_term = torch.where(flag > 0, float("nan"), 0.0)
        if scaler is not None:
            scaler.unscale_(opt)  # after the all-reduce, so every rank sees the same inf/NaN and skips alike
        with_grad = [p for p in params if p.grad is not None]
        grads = [p.grad for p in with_grad]
        norm = global_norm(grads, self._one_group(name, opt)) if grads else torch.zeros((), device=device)
        amp_overflow = None
        if scaler is not None:
            # The guard tells an fp16 overflow (finite loss, non-finite gradients) from a guard event.
            grads_bad = nonfinite(norm)
            loss_bad = nonfinite(loss_term) if loss_term is not None else torch.zeros_like(grads_bad)
            skip = (loss_bad | grads_bad).float()
            amp_overflow = (grads_bad & ~loss_bad).float()
        else:
            # One check for losses and gradients: the sum is non-finite exactly where either is (a finite norm is far
            # below float32's range: its squares would have overflowed first).
            skip = skip_flag(norm if loss_term is None else norm + loss_term)
        if self.clip_grad_norm is not None and grads:
            # A non-finite norm is replaced so the clip stays finite; that step is skipped below anyway.
            safe_norm = torch.nan_to_num(norm, nan=0.0, posinf=0.0)
            torch.nn.utils.clip_grads_with_norm_(with_grad, self.clip_grad_norm, safe_norm)
        fused = bool(opt.defaults.get("fused"))
        if fused:
            # The fused kernel skips the update where found_inf is non-zero and takes back its step-count increment.
            opt.found_inf = skip
            opt.grad_scale = None  # the gradients are unscaled already
            try:
                opt.step()
            finally:
                opt.found_inf = None
        elif not skip.item():  # the host decides: the one synchronisation of a non-fused step
            opt.step()
        if scaler is not None:
            # update() reads the inf checks unscale_ recorded: an fp16 overflow halves the scale, a good step counts
            # towards growing it. A non-finite loss with finite gradients is a guard event, not an overflow.
            scaler.update()
        record(name, skip, amp_overflow)
        opt.zero_grad(set_to_none=True)
        self.last_grad_norm[name] = norm.detach()
        self.host_synced |= not fused
        return skip
