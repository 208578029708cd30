"""GanMetrics under torch.distributed: 2 CPU processes (gloo), each feeding its share, give the one-process result.

The shares are uneven (120 + 80 images) so torchmetrics' padded all-gather is exercised; they are contiguous, so
the gathered order equals the single-process order and even the subset-sampled KID and IS must agree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pixelsmith.metrics import (
    GanMetrics,
    MnistFeatureExtractor,
    load_or_compute_reference_stats,
    mnist_reference,
)
from tests.conftest import free_port

MNIST_NPZ = Path(__file__).resolve().parents[1] / "data" / "mnist_5k.npz"
SHARES = (120, 80)
METRIC_OPTIONS = {"kid_subsets": 10, "kid_subset_size": 50}


def _reference(extractor, cache_dir: Path):
    fingerprint, protocol, make_batches = mnist_reference(MNIST_NPZ, seed=0, batch_size=100)
    return load_or_compute_reference_stats(
        make_batches,
        extractor=extractor,
        dataset_fingerprint=fingerprint,
        dataset_protocol=protocol,
        num_samples=300,
        cache_dir=cache_dir,
    )


def _generated_images() -> torch.Tensor:
    generator = torch.Generator().manual_seed(123)
    return (torch.rand(sum(SHARES), 1, 32, 32, generator=generator) * 2 - 1).clamp(-1, 1) * 0.5


def _worker(rank: int, world_size: int, port: int, cache_dir: str, result_path: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        extractor = MnistFeatureExtractor()
        reference = _reference(extractor, Path(cache_dir))  # rank 0 computes, rank 1 reads its file
        metric = GanMetrics(extractor, reference, **METRIC_OPTIONS)
        start = sum(SHARES[:rank])
        share = _generated_images()[start : start + SHARES[rank]]
        for batch in share.split(32):
            metric.update(batch)
        result = metric.compute()
        result["reference_recomputed"] = reference.recomputed
        Path(f"{result_path}.rank{rank}").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_give_the_single_process_scores(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    mp.spawn(_worker, args=(2, free_port(), str(cache_dir), str(tmp_path / "result")), nprocs=2, join=True)
    per_rank = [json.loads((tmp_path / f"result.rank{rank}").read_text()) for rank in range(2)]
    assert per_rank[0]["reference_recomputed"] and not per_rank[1]["reference_recomputed"]

    extractor = MnistFeatureExtractor()
    metric = GanMetrics(extractor, _reference(extractor, cache_dir), **METRIC_OPTIONS)
    for batch in _generated_images().split(32):
        metric.update(batch)
    single = metric.compute()
    assert single["num_generated"] == sum(SHARES)
    for result in per_rank:  # every rank gets the synced numbers
        assert result["num_generated"] == sum(SHARES)
        for name in ("fid", "kid_mean", "is_mean", "precision", "recall"):
            assert result[name] == pytest.approx(single[name], rel=1e-6), name
