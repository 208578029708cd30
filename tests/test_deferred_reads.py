"""Logging and stopping without making the GPU wait (core/iteration_log.py, core/agreement.py), proved on a CPU.

A logging iteration stages its values and hands the previous logging iteration's to the loggers, at that
iteration's own logger step; the last iteration hands over its own too. Staging reads nothing (the dispatch-mode
counter of `train.host_sync_check` finds no read), and GPU ranks agree on stopping one check interval late.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from pixelsmith.callbacks.host_sync import SyncCounter
from pixelsmith.core.agreement import RankAgreement
from pixelsmith.core.config import CoreSettings
from pixelsmith.core.iteration_log import GUARD_COUNTS, IterationLog
from tests.test_core import TinyCore, _fit  # the core tests' regression model


class RecordingLogger(Logger):
    """Keeps (the module's iteration when called, the step given, the metrics)."""

    def __init__(self, module: TinyCore):
        super().__init__()
        self.module = module
        self.calls: list[tuple[int, int, dict]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((self.module.iteration, step, dict(metrics)))


def _fit_logged(module: TinyCore) -> RecordingLogger:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=gen)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)
    logger = RecordingLogger(module)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=-1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    return logger


def test_a_logging_iteration_hands_over_the_previous_ones_values_at_their_own_step():
    module = TinyCore(CoreSettings(max_steps=12, log_every_n_steps=4, optimizer_impl="fused"))
    logger = _fit_logged(module)
    ours = [
        (at, step, metrics["train/iteration"])
        for at, step, metrics in logger.calls
        if "train/iteration" in metrics
    ]
    # Iteration 4's values reach the loggers at iteration 8 with iteration 4's step (3, Lightning's count of batches
    # before it); the last iteration hands over iteration 8's and its own.
    assert ours == [(8, 3, 4.0), (12, 7, 8.0), (12, 11, 12.0)]
    last = logger.calls[-1][2]
    assert last["guard/nonfinite_skipped"] == 0.0 and "lr/net" in last and "epoch" in last
    assert GUARD_COUNTS not in last  # the guard's own staging keys stay internal
    # The progress bar and callbacks hold the last values, as host tensors (no copy to a device).
    assert float(module.trainer.callback_metrics["train/iteration"]) == 12.0


def test_staging_a_logging_iterations_values_reads_nothing():
    module = TinyCore(CoreSettings(max_steps=4, log_every_n_steps=4, optimizer_impl="fused"))
    _fit(module)
    log = IterationLog()
    with SyncCounter(raise_on_sync=True) as counter:
        log.add({"loss/x": torch.tensor(2.5)})
        staged = log.stage(log.metrics(module), module.iteration, step=3, epoch=0)
    assert counter.events == []
    values = staged.read()
    assert values["loss/x"] == 2.5 and values["train/iteration"] == 4.0 and values[GUARD_COUNTS] == [0, 0]


def test_ranks_agree_on_stopping_one_check_late_and_alike():
    """Two ranks' agreements over a stand-in all-reduce (the maximum of both ranks' posted flags): each check returns
    the previous check's agreed flags, the same on both ranks."""
    agreements = [RankAgreement(), RankAgreement()]

    def exchange_all(flags_per_rank: list[list[float]]) -> list:
        agreed = torch.tensor(flags_per_rank).amax(dim=0)  # what the all-reduce (max) leaves on every rank

        def reduce_max(tensor: torch.Tensor) -> None:
            tensor.copy_(agreed)

        return [
            agreement.exchange(flags, reduce_max, torch.device("cpu"))
            for agreement, flags in zip(agreements, flags_per_rank, strict=True)
        ]

    assert exchange_all([[0.0, 0.0], [0.0, 0.0]]) == [None, None]  # nothing agreed before the first check
    assert exchange_all([[0.0, 15.0], [1.0, 0.0]]) == [[0.0, 0.0], [0.0, 0.0]]
    # Rank 0 got SIGTERM (15), rank 1's budget ran out: both learn both at the next check.
    assert exchange_all([[0.0, 0.0], [0.0, 0.0]]) == [[1.0, 15.0], [1.0, 15.0]]
