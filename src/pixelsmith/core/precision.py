"""Mixed precision owned by the training core: autocast for the forward passes and our own GradScaler for fp16.

Lightning's precision plugin unscales inside `optimizer.step()`, after any clipping the module did (Lightning
#18089), and on CPU it silently replaces 16-mixed with bf16. Owning the scaler gives one order of operations for
every precision: backward(scaled) -> all-reduce -> unscale -> finite check -> clip -> step -> update.
The Trainer itself always runs with precision="32-true".
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

AUTOCAST_DTYPES = {"32-true": None, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
# Device types without float64 tensors (Apple's Metal): what is kept in float64 elsewhere is float32 there.
NO_FLOAT64_DEVICES = frozenset({"mps"})


class MixedPrecision:
    def __init__(self, name: str, device_type: str):
        if name not in AUTOCAST_DTYPES:
            raise ValueError(f"precision={name!r} is unknown; choose one of {', '.join(AUTOCAST_DTYPES)}.")
        self.name = name
        self.device_type = device_type
        self.dtype = AUTOCAST_DTYPES[name]
        # bf16 has fp32's exponent range, so only fp16 needs loss scaling.
        self.scaler = torch.amp.GradScaler(device_type) if name == "16-mixed" else None

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
