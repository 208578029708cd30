"""ADA's two warps side by side: `python -m benchmarks.augment_bench [--sizes 32 64] [--batch 16] [--device cpu]`.

For each image size it times, per call at p = 1 with NVlabs' bgc pipeline (every sample warped and colour-mapped):
- `aug`: the augmentation's forward pass;
- `aug+R1`: the forward pass, D's input gradient with create_graph (R1's first backward) and the backward of its
  squared norm (the double backward lazy R1 runs through the augmentation), with a two-conv stand-in D;
for `warp=lowpass` (NVlabs' 2x-oversampled symlet-6 resampling) and `warp=bilinear` (one gather at 1x), and prints
the medians and the ratio. The same for the warp alone (no colour, no sampling) as `warp`. On a GPU each timing is
bracketed by synchronisations; on CPU the thread count is `--threads` (default 2, the CI machines').
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from pixelsmith.augment import AdaptiveAugment
from pixelsmith.augment import ada as ada_module
from pixelsmith.augment.warp import warp_inverse_bilinear, warp_inverse_lowpass


def _timed(fn, device: torch.device, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def bench(
    size: int, batch: int, channels: int, device: torch.device, repeats: int
) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    images = torch.rand(batch, channels, size, size, device=device) * 2 - 1
    discriminator = nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.LeakyReLU(0.2), nn.Conv2d(16, 1, 3, padding=1)
    ).to(device)
    results: dict[str, dict[str, float]] = {}
    for warp in ("lowpass", "bilinear"):
        aug = AdaptiveAugment(initial_p=1.0, warp=warp).to(device)
        draws = aug.sample(images)
        linear, offset = ada_module.geometric_inverse(draws)
        inverse = ada_module._centred_to_index(linear, offset, size, size)
        warp_fn = warp_inverse_lowpass if warp == "lowpass" else warp_inverse_bilinear

        def r1_step(aug=aug) -> None:
            real = images.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(discriminator(aug(real)).sum(), real, create_graph=True)
            grad.square().sum().backward()

        with torch.no_grad():
            warp_ms = _timed(
                lambda warp_fn=warp_fn, inverse=inverse: warp_fn(images, inverse), device, repeats
            )
            aug_ms = _timed(lambda aug=aug: aug(images), device, repeats)
        results[warp] = {"warp": warp_ms, "aug": aug_ms, "aug+R1": _timed(r1_step, device, repeats)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(
        f"ADA bgc at p=1, batch {args.batch}, {args.channels} channels, float32, {where}; median ms per call"
    )
    print(f"{'size':>5} {'what':>7} {'lowpass':>9} {'bilinear':>9} {'ratio':>6}")
    for size in args.sizes:
        results = bench(size, args.batch, args.channels, device, args.repeats)
        for what in ("warp", "aug", "aug+R1"):
            low, bil = results["lowpass"][what], results["bilinear"][what]
            print(f"{size:>5} {what:>7} {low:>9.2f} {bil:>9.2f} {low / bil:>5.1f}x")


if __name__ == "__main__":
    main()
