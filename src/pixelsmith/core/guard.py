"""The non-finite guard: counts optimizer steps skipped for non-finite losses or gradients, and stops a run whose
optimizer keeps skipping.

Its state lives on the device (a replayed CUDA graph updates it with no host in the loop):
- `counts`: [guard events, fp16 overflows] over the run;
- `streaks`: consecutive skips per optimizer (a D that never steps while G does must still stop the run);
- `trips`: per optimizer, the iteration at which its streak last reached the limit (-1 while it has not).

`record` is a handful of in-place kernels on views of those tensors, whatever the number of parameters, and
`record_iteration` the same for all optimizers of an iteration at once. The host
reads them only in `check` (a synchronisation), which the core calls at logging iterations, at the last one, before
a checkpoint, and in an iteration that already waited for the device.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pixelsmith.core.precision import NO_FLOAT64_DEVICES
from pixelsmith.errors import PixelsmithError

log = logging.getLogger(__name__)


class NonFiniteError(PixelsmithError, RuntimeError):
    """Raised after too many consecutive non-finite steps; checkpoints written before it are kept intact."""


class NonFiniteGuard:
    def __init__(self, max_consecutive: int):
        self.max_consecutive = max_consecutive  # 0: never stop
        self._state: dict[str, torch.Tensor] | None = None
        self.names: list[str] = []  # optimizer names, in the order of `streaks` and `trips`
        self._from_host: dict[str, Any] | None = None  # from a checkpoint, until the device state exists
        self._reported = 0  # skipped steps already warned about
        self._checked_at = 0  # the iteration of the last check
        self._ones: dict[tuple[int, torch.device], torch.Tensor] = {}  # `record_iteration`'s row of ones

    def state(self, device: torch.device, names: list[str]) -> dict[str, torch.Tensor]:
        """The device state, made on first use (from a checkpoint's counts where one was loaded) and moved with the
        model. `names`: the optimizers known now (empty before the optimizers exist)."""
        if self._state is not None and self._state["counts"].device != device:
            self._state = {key: value.to(device) for key, value in self._state.items()}
        if self._state is None:
            host = self._from_host or {}
            streaks = host.get("streaks", {})
            names = list(names) or list(streaks)
            # Below the limit (a resume may lower it): such a streak trips at its next skip, where it reaches the limit.
            ceiling = (self.max_consecutive or 2**62) - 1
            # float32, as the steps' skip flags are (the fused optimizer's found_inf): the updates need no cast.
            # Counts and streaks are exact to 2^24 skipped steps; the trips hold iteration numbers, exact in float64
            # (float32 where a device has no float64).
            wide = torch.float32 if torch.device(device).type in NO_FLOAT64_DEVICES else torch.float64
            ceiling = min(ceiling, 2**24)
            self._state = {
                "counts": torch.tensor(
                    [host.get("nonfinite_skipped", 0), host.get("amp_overflow_skipped", 0)],
                    dtype=torch.float32,
                    device=device,
                ),
                "streaks": torch.tensor(
                    [min(streaks.get(n, 0), ceiling) for n in names], dtype=torch.float32, device=device
                ),
                "trips": torch.full((len(names),), -1, dtype=wide, device=device),
            }
            self.names = names
            self._from_host = None
        return self._state

    def record(
        self,
        state: dict[str, torch.Tensor],
        name: str,
        skip: torch.Tensor,
        amp_overflow: torch.Tensor | None,
        iteration: int | torch.Tensor,
    ) -> None:
        """Count one optimizer step's outcome. `iteration`: the host's number in an eager run, the device's own
        counter under CUDA graphs (a replay cannot read the host's)."""
        if name not in self.names:  # state built before this optimizer was known (e.g. read before fit)
            self.names.append(name)
            state["streaks"] = torch.cat([state["streaks"], state["streaks"].new_zeros(1)])
            state["trips"] = torch.cat([state["trips"], state["trips"].new_full((1,), -1)])
        index = self.names.index(name)
        # An fp16 overflow is the scaler doing its job (it halves the scale and retries); a non-finite loss, or NaN
        # gradients without a scaler, is a guard event. Both extend the streak: K skips in a row mean the scale has
        # fallen by 2^K and the gradients are NaN for another reason.
        if amp_overflow is None:
            state["counts"][0].add_(skip)
        else:
            state["counts"].add_(
                torch.stack([skip - amp_overflow, amp_overflow])
            )  # 0/1 flags: an overflow is a skip
        streak = state["streaks"][index]
        streak.add_(1).mul_(skip)
        if self.max_consecutive:
            _mark_trips(streak, self.max_consecutive, iteration, state["trips"][index])

    def record_iteration(
        self,
        state: dict[str, torch.Tensor],
        steps: list[tuple[str, torch.Tensor, torch.Tensor | None]],
        iteration: int | torch.Tensor,
    ) -> None:
        """Count one iteration's steps, [(optimizer, skip, amp_overflow)] in order. Where every optimizer stepped
        once without fp16 loss scaling (the usual iteration), all of them in five kernels, whatever their number
        (stack, one matrix-vector add for the count, two for the streaks, one `where` for the trips plus its
        comparison); otherwise step by step (`record`)."""
        names = [name for name, _, _ in steps]
        together = (
            len(names) > 1
            and all(overflow is None for _, _, overflow in steps)
            and sorted(names) == sorted(self.names)
            and len(set(names)) == len(names)
        )
        if not together:
            for name, skip, overflow in steps:
                self.record(state, name, skip, overflow, iteration)
            return
        skips = torch.stack([steps[names.index(name)][1] for name in self.names])
        ones = self._ones.get((len(names), skips.device))
        if ones is None:
            ones = self._ones[len(names), skips.device] = skips.new_ones(1, len(names))
        state["counts"][:1].addmv_(ones, skips)  # guard events += the skips' sum, in one kernel
        state["streaks"].add_(1).mul_(skips)
        if self.max_consecutive:
            _mark_trips(state["streaks"], self.max_consecutive, iteration, state["trips"])

    def check(self, state: dict[str, torch.Tensor], iteration: int) -> None:
        """Read the device state (a synchronisation) and `check_values` it."""
        self.check_values(state["counts"].tolist(), state["trips"].tolist(), iteration)

    def check_values(self, counts: list, trips: list, iteration: int) -> None:
        """Warn about steps skipped since the last check, and stop the run at `iteration` if a streak reached the
        limit; `counts` and `trips` are the device state read on the host (now, or staged an interval ago)."""
        counts = [int(c) for c in counts]
        trips = [int(t) for t in trips]
        tripped = [(at, index) for index, at in enumerate(trips) if at >= 0]
        trip_iteration, trip_index = min(tripped) if tripped else (-1, -1)
        new_skips = sum(counts) - self._reported
        if new_skips > 0:
            log.warning(
                "Iterations %d-%d: %d optimizer step(s) skipped for non-finite losses or gradients (%d so far: %d "
                "guard events, %d fp16 overflows).",
                self._checked_at + 1,
                iteration,
                new_skips,
                sum(counts),
                counts[0],
                counts[1],
            )
            self._reported = sum(counts)
        self._checked_at = iteration
        if trip_iteration < 0:
            return
        raise NonFiniteError(
            f"Stopped at iteration {iteration}: {self.max_consecutive} consecutive steps of optimizer "
            f"{self.names[trip_index]} had non-finite losses or gradients (fp16 overflows included), the last at "
            f"iteration {trip_iteration}; skipped steps leave the weights unchanged. The last checkpoint written "
            "before this is intact. Usual fixes: a lower learning rate, train.clip_grad_norm=1.0, "
            "precision=32-true to rule out overflow, or a look at the data for NaNs. The limit is "
            "train.nonfinite_max_consecutive."
        )

    def host_state(self, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The counts and streaks as Python numbers, for a checkpoint (reads the device)."""
        counts = [int(c) for c in state["counts"].tolist()]
        return {
            "nonfinite_skipped": counts[0],
            "amp_overflow_skipped": counts[1],
            "streaks": dict(zip(self.names, [int(s) for s in state["streaks"].tolist()], strict=True)),
        }

    def load_host_state(self, host: dict[str, Any], iteration: int) -> None:
        """Continue from a checkpoint's counts: the device state is rebuilt from them on first use."""
        self._from_host = host
        self._state = None
        self._reported = host["nonfinite_skipped"] + host["amp_overflow_skipped"]
        self._checked_at = iteration


def _mark_trips(
    streaks: torch.Tensor, limit: int, iteration: int | torch.Tensor, trips: torch.Tensor
) -> None:
    """trips = iteration where a streak reached the limit, in place. The device's iteration counter (graphed) goes
    straight into `trips` (`out=`: no copy kernel); a host number (eager) reaches the kernel as an argument, never as
    a host-to-device copy (which would wait on CUDA)."""
    reached = streaks == limit
    if isinstance(iteration, torch.Tensor):
        torch.where(reached, iteration, trips, out=trips)
    else:
        trips.copy_(torch.where(reached, iteration, trips))
