"""The training core's own entry in a checkpoint (`checkpoint["pixelsmith"]`): the iteration and images seen, the
non-finite guard's counts and streaks, the GradScaler and the count of files substituted for unreadable ones; and
the resolved run config (`checkpoint["pixelsmith_config"]`). A resume continues from them bit for bit."""

from __future__ import annotations

from typing import Any

import torch


def save_core_state(core: Any, checkpoint: dict[str, Any]) -> None:
    # A checkpoint reads the device anyway: a streak that reached the limit since the last logging iteration stops
    # the run here rather than being saved, unnoticed, into a checkpoint a resume would continue from.
    core._check_guard()
    # Every rank saves (only rank 0 writes): the run's count of later-broken files is the sum over ranks.
    skipped = torch.as_tensor(core.skipped_files, device=core.device).detach().clone()
    core.world_all_reduce(skipped)
    guard = core.guard.host_state(core._guard_state())
    checkpoint["pixelsmith"] = {
        "iteration": core.iteration,
        "images_seen": core.images_seen,
        "nonfinite_skipped": guard["nonfinite_skipped"],
        "amp_overflow_skipped": guard["amp_overflow_skipped"],
        "nonfinite_streaks": guard["streaks"],
        "grad_scaler": core.mixed_precision.state_dict(),
        "precision": core.core.precision,
        "skipped_files": int(skipped),  # later-broken files' substitutions, all ranks: a resume keeps them
    }
    checkpoint["pixelsmith_config"] = core.core.run_config


def load_core_state(core: Any, checkpoint: dict[str, Any]) -> None:
    state = checkpoint.get("pixelsmith")
    if state is None:
        raise ValueError(
            "This checkpoint was not written by a Pixelsmith model (no 'pixelsmith' entry); "
            "resume with a checkpoint from a Pixelsmith run's checkpoints/ folder."
        )
    core.iteration = int(state["iteration"])
    core.images_seen = int(state["images_seen"])
    # The run's total, restored on rank 0 only: the logged metric sums the ranks' counts.
    core.skipped_files = int(state.get("skipped_files", 0)) if core.global_rank == 0 else 0
    core.guard.load_host_state(
        {
            "nonfinite_skipped": int(state["nonfinite_skipped"]),
            "amp_overflow_skipped": int(state["amp_overflow_skipped"]),
            "streaks": {k: int(v) for k, v in state.get("nonfinite_streaks", {}).items()},
        },
        core.iteration,
    )
    core._pending_precision_state = state.get("grad_scaler") or None
    core._precision = None
