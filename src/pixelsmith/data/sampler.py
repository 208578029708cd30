"""A sampler that is a pure function of (seed, rank, world size, iteration): resuming at iteration k yields exactly
the batches a straight run would have drawn from k on, and ranks draw disjoint shares of each global batch.

Lightning restarts a dataloader from its first batch when resuming mid-epoch; with this sampler the datamodule
simply starts the stream at the restored iteration.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class IterationSampler(Sampler[int]):
    """Indices for iterations [start_iteration, start_iteration + num_iterations) of an endless shuffled stream.

    Position p of the global stream (all ranks) is item p % n of the permutation for epoch p // n; iteration i
    takes global positions [i * B * W, (i + 1) * B * W), and rank r the r-th block of B of them.
    """

    def __init__(
        self,
        dataset_len: int,
        batch_per_rank: int,
        seed: int,
        start_iteration: int,
        num_iterations: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ):
        if dataset_len <= 0:
            raise ValueError("IterationSampler needs a non-empty dataset.")
        self.n = dataset_len
        self.batch_per_rank = batch_per_rank
        self.seed = seed
        self.start = start_iteration
        self.num_iterations = max(0, num_iterations)
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle

    def permutation(self, epoch: int) -> torch.Tensor:
        """The dataset order of `epoch` (the same on every rank)."""
        if not self.shuffle:
            return torch.arange(self.n)
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 9_973 + epoch))

    def __iter__(self) -> Iterator[int]:
        global_batch = self.batch_per_rank * self.world_size
        epoch, perm = -1, None
        for iteration in range(self.start, self.start + self.num_iterations):
            first = iteration * global_batch + self.rank * self.batch_per_rank
            for position in range(first, first + self.batch_per_rank):
                e, k = divmod(position, self.n)
                if e != epoch:
                    # One list per epoch instead of a tensor index and an int() per sample.
                    epoch, perm = e, self.permutation(e).tolist()
                yield perm[k]

    def __len__(self) -> int:
        return self.num_iterations * self.batch_per_rank
