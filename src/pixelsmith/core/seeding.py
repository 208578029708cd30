"""Per-iteration seeding: fresh, deterministic randomness per (seed, rank, iteration), so latents, augmentation and
dropout are the same whether a run went straight through or was resumed at any iteration."""

from __future__ import annotations

import random

import torch


def mix_seed(seed: int, rank: int, iteration: int) -> int:
    # A fixed affine mix keeps seeds distinct per (rank, iteration) and reproducible across runs and resumes.
    return (seed * 1_000_003 + rank * 7_919 + iteration * 104_729) % (2**63 - 1)


def seed_iteration(seed: int, device: torch.device, host_random: random.Random) -> None:
    """Seed the generators an iteration draws from: torch's CPU generator, the host's `random.Random` (crop offsets,
    indices) and the device's own. Not torch.manual_seed: on a CUDA wheel that also queues a lazy seed for every CUDA
    device and captures a Python stack each call (~1 ms, docs/performance.md). Same streams, same results."""
    torch.default_generator.manual_seed(seed)
    host_random.seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # this device's generator; CUDA is initialised by now, so no lazy stack
    elif device.type == "mps":
        torch.mps.manual_seed(seed)  # an Apple GPU's own generator: what randn on the device draws from
