"""Cross-rank consistency check for data-parallel runs (StyleGAN2-ADA's check_ddp_consistency, as a callback).

Every `every_n_steps` iterations and at the end, each rank's parameters and buffers are all-gathered and compared
with rank 0's; the largest absolute difference and the gradient all-reduce count are written to
`<run>/ddp_consistency.json`, and a difference above `tolerance` stops the run (ranks silently diverging is the
failure that otherwise shows up only as a worse FID days later). Enabled by `debug=ddp` and `debug=fsdp`.

Under FSDP a sharded parameter (DTensor) is gathered into its full tensor first (a collective, in the same order on
every rank); it is identical on all ranks by construction, so what this catches there is drift of everything FSDP
does not shard: buffers such as BatchNorm statistics, unsharded parameters, fixed latents.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from torch.distributed.tensor import DTensor

from pixelsmith.errors import PixelsmithError


class DDPConsistencyCheck(Callback):
    def __init__(self, output_dir: str, every_n_steps: int = 0, tolerance: float = 0.0):
        self.output_dir = Path(output_dir)
        self.every_n_steps = every_n_steps
        self.tolerance = tolerance

    def _check(self, trainer, pl_module) -> None:
        if trainer.world_size <= 1:
            return
        named = [
            (k, (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().reshape(-1))
            for k, t in pl_module.state_dict().items()
            if torch.is_tensor(t)
        ]
        flat = torch.cat([t for _, t in named])
        gathered = [torch.empty_like(flat) for _ in range(trainer.world_size)]
        torch.distributed.all_gather(gathered, flat)
        diff = torch.stack([(g - gathered[0]).abs() for g in gathered]).amax(dim=0)
        max_diff = float(diff.max())
        worst, offset, worst_diff = None, 0, 0.0
        for key, t in named:
            d = float(diff[offset : offset + t.numel()].max()) if t.numel() else 0.0
            if d > worst_diff:
                worst, worst_diff = key, d
            offset += t.numel()
        allreduce_calls = torch.tensor([float(pl_module.grad_allreduce_calls)], device=flat.device)
        calls = [torch.empty_like(allreduce_calls) for _ in range(trainer.world_size)]
        torch.distributed.all_gather(calls, allreduce_calls)
        if trainer.is_global_zero:
            report = {
                "iteration": int(pl_module.iteration),
                "world_size": trainer.world_size,
                "max_abs_diff": max_diff,
                "worst_tensor": worst,
                "grad_allreduce_calls_per_rank": [int(c.item()) for c in calls],
                "numel": int(flat.numel()),
            }
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "ddp_consistency.json").write_text(json.dumps(report, indent=2))
        if max_diff > self.tolerance:
            raise PixelsmithError(
                f"Ranks diverged at iteration {pl_module.iteration}: parameters differ by up to {max_diff:g} "
                f"(tolerance {self.tolerance:g}), most in {worst}. A model that draws per-rank randomness into its weights or "
                "updates buffers without syncing them causes this."
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every_n_steps > 0 and pl_module.iteration % self.every_n_steps == 0:
            self._check(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._check(trainer, pl_module)
