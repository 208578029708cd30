"""The hand-captured CUDA-graph step of `bench.py`'s third column (`benchmarks/plain_loop.py` GraphedPlainGAN).

Capture itself needs CUDA; here the same code path runs with capture disabled: the static batch buffer, the two
step variants (with and without lazy R1) and the iteration bookkeeping must train exactly as the plain loop does.
"""

from __future__ import annotations

import pytest
import torch

# General code checked with the GAN part as its vehicle: a fork without it (README "Removing a part") skips
# this file rather than failing to import it.
pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")

from benchmarks.plain_loop import (  # noqa: E402
    GraphedPlainGAN,
    StaticGraphStep,
    build_plain_gan,
    endless,
    plain_loader,
)
from pixelsmith.errors import PixelsmithError  # noqa: E402
from pixelsmith.run.build import resolve_hardware  # noqa: E402
from tests.conftest import FAST, SMALL, compose_config  # noqa: E402

pytestmark = pytest.mark.bench

R1 = [
    "model.objective.regularizers.r1.gamma=0.1",
    "model.objective.regularizers.r1.interval=2",
    "data.batch_size=8",
]


def _plain_gan(tmp_path, *overrides: str, capturable: bool = False):
    cfg = compose_config([*FAST, *SMALL["dcgan"], *R1, *overrides], tmp_path / "run")
    hardware = resolve_hardware(cfg)
    torch.manual_seed(0)
    return build_plain_gan(cfg, hardware, "fused", capturable=capturable), plain_loader(cfg, hardware)


def test_graphed_step_without_capture_trains_exactly_as_the_plain_loop(tmp_path):
    plain, loader = _plain_gan(tmp_path)
    twin, _ = _plain_gan(tmp_path)
    batches = endless(loader)
    images = [next(batches).clone() for _ in range(5)]
    graphed = GraphedPlainGAN(twin, images[0], capture=False)
    used = []
    for step in (graphed.main, graphed.regularized):
        original = step.step
        step.step = lambda x, original=original, step=step: (
            used.append(step is graphed.regularized),
            original(x),
        )
    buffer = graphed.main.static_images.data_ptr()

    torch.manual_seed(1)
    for batch in images:
        plain.step(batch)
    torch.manual_seed(1)
    for batch in images:
        graphed.step(batch)

    assert used == [True, False, True, False, True]  # lazy R1 on iterations 0, 2, 4, through its own graph
    assert graphed.iteration == 5 and twin.iteration == 5
    assert graphed.main.static_images.data_ptr() == buffer  # one static buffer, refilled in place
    assert torch.equal(graphed.main.static_images, images[3])  # iteration 3 ran without R1
    for a, b in zip(plain.G.parameters(), twin.G.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(plain.D.parameters(), twin.D.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_static_buffer_is_a_copy_so_callers_may_reuse_their_tensor():
    seen = []
    step = StaticGraphStep(lambda x: seen.append(x.clone()), torch.zeros(2, 3), capture=False)
    batch = torch.ones(2, 3)
    step(batch)
    batch.fill_(7.0)  # the caller's next batch written into the same tensor
    assert torch.equal(seen[0], torch.ones(2, 3)) and torch.equal(step.static_images, torch.ones(2, 3))


def test_fp16_is_refused_with_the_reason_and_the_fix(tmp_path):
    gan, loader = _plain_gan(tmp_path, "precision=16-mixed")
    with pytest.raises(PixelsmithError, match="GradScaler decides on the host.*bf16-mixed"):
        GraphedPlainGAN(gan, next(endless(loader)), capture=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a CUDA GPU")
@pytest.mark.gpu
def test_captured_step_replays_and_trains_on_the_gpu(tmp_path):
    gan, loader = _plain_gan(tmp_path, "hardware=auto", "precision=bf16-mixed", capturable=True)
    batches = endless(loader)
    graphed = GraphedPlainGAN(gan, next(batches), capture=True)
    before = [p.detach().clone() for p in gan.G.parameters()]
    for _ in range(4):
        graphed.step(next(batches))
    torch.cuda.synchronize()
    assert graphed.main.graph is not None and graphed.regularized.graph is not None
    assert any(not torch.equal(a, b) for a, b in zip(before, gan.G.parameters(), strict=True))
    assert all(torch.isfinite(p).all() for p in gan.G.parameters())
