"""FLOPs of one iteration of the plain GAN loop (`benchmarks.plain_loop.PlainGAN`), without and with lazy R1: the
numerator of the MFU that `bench.py` reports for the plain and graphed columns.

The counting itself (`count_flops`, FlopCounterMode without its module tracker) is the training package's
(`pixelsmith.perf.flops`), the same the throughput callback uses on template runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pixelsmith.perf.flops import count_flops


@dataclass(frozen=True)
class GANIterationFlops:
    """FLOPs of one GAN iteration of each kind: `common`, and `r1` (an iteration with lazy R1, every
    `r1_interval`-th; equal to `common` when R1 is off)."""

    common: int
    r1: int
    r1_interval: int

    @property
    def amortised(self) -> float:
        """The long-run mean per iteration: one R1 iteration in every `r1_interval`."""
        return self.common + (self.r1 - self.common) / self.r1_interval

    def mean_over(self, iterations: range) -> float:
        """Mean FLOPs per iteration over these iteration numbers (R1 runs where `iteration % r1_interval == 0`)."""
        if len(iterations) == 0:
            return float(self.common)
        with_r1 = sum(1 for i in iterations if i % self.r1_interval == 0) if self.r1 != self.common else 0
        return self.common + with_r1 * (self.r1 - self.common) / len(iterations)


def count_gan_iteration_flops(gan, images) -> GANIterationFlops:
    """Count a `benchmarks.plain_loop.PlainGAN` iteration on `images` without and with lazy R1 (two real
    steps: weights and optimizer state change, which FLOPs do not depend on; `gan.iteration` is restored)."""
    saved = gan.iteration
    r1_interval = gan.objective.interval_of("Dreg")  # None: R1 off
    interval = max(1, r1_interval or 1)
    lazy_r1 = r1_interval is not None
    try:
        gan.iteration = 1  # not an R1 iteration (unless r1_interval is 1: then every iteration has R1)
        common = count_flops(lambda: gan.step(images))
        if lazy_r1 and interval > 1:
            gan.iteration = 0
            r1 = count_flops(lambda: gan.step(images))
        else:
            r1 = common
    finally:
        gan.iteration = saved
    return GANIterationFlops(common=common, r1=r1, r1_interval=interval)
