"""`python -m benchmarks.style_network`: the stylizer network alone, per speed variant: TFLOP/s and error vs fp32.

    python -m benchmarks.style_network                                  # GPU: 8K whole and as 1024-px tiles, all variants
    python -m benchmarks.style_network --size 256x192 --tile 128 --variants eager_fp32 eager_bf16_cl padded

Each variant runs TransformerNet (32/5 by default, random weights: speed does not depend on them) on the same
input, `--warmup` passes then `--repeats` timed passes (the device synchronised around each), as the whole image
(one forward of WxH) and as a batch of `--tile-batch` tiles of `--tile` px (what `stylize.py` compiles). Printed per
variant and shape: milliseconds per forward, TFLOP/s of useful work (the unpadded network's FLOPs, counted once by
FlopCounterMode on a probe, times the pixels; padding's zero channels do not count) and the mean absolute
difference from the fp32 eager output in 8-bit levels (the acceptance bound is 1.0). Variants, each adding to the one
before unless named otherwise:
- eager_fp32: NCHW fp32, the reference;
- eager_bf16: bf16 autocast, NCHW (what an uncompiled stylize.py runs on a GPU);
- eager_bf16_cl: bf16 autocast and channels_last;
- padded: + the 3-channel first and last convolutions zero-padded to 8 channels (`style.fuse`);
- compiled: + torch.compile (default mode: instance norm, ReLU and padding fused by Inductor);
- autotuned: + mode max-autotune-no-cudagraphs (convolution and Triton kernel autotuning);
- graphed: + mode max-autotune (the tiles also captured as CUDA graphs; CUDA only).
A CPU runs them (at a small --size) to prove the variants work; its timings say nothing about a GPU, and on a shared
or loaded machine not much about the CPU either.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pixelsmith.style.fuse import pad_rgb_convolutions
from pixelsmith.style.networks import TransformerNet
from pixelsmith.style.pipeline import network_flops_per_pixel
from pixelsmith.style.tiling import autocast_for

VARIANTS = ("eager_fp32", "eager_bf16", "eager_bf16_cl", "padded", "compiled", "autotuned", "graphed")
COMPILE_MODE = {"compiled": "default", "autotuned": "max-autotune-no-cudagraphs", "graphed": "max-autotune"}


def build(net: TransformerNet, variant: str, device: torch.device):
    """(forward(x) -> y, channels_last) for `variant`."""
    channels_last = variant not in ("eager_fp32", "eager_bf16")
    model = pad_rgb_convolutions(net, 8) if VARIANTS.index(variant) >= VARIANTS.index("padded") else net
    model = model.eval().to(
        device, memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    if variant in COMPILE_MODE:
        model = torch.compile(model, dynamic=False, mode=COMPILE_MODE[variant])
    precision = "32-true" if variant == "eager_fp32" else "bf16-mixed"

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), autocast_for(precision, device):
            return model(x).float()

    return forward, channels_last


def time_forward(forward, x: torch.Tensor, warmup: int, repeats: int) -> tuple[float, torch.Tensor]:
    """Median seconds per forward, and the last output (cloned: a CUDA-graph replay reuses its memory)."""
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        forward(x)
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        y = forward(x)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), y.clone()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="7680x4320", help="WxH of the whole image [8K]")
    parser.add_argument("--tile", type=int, default=1024)
    parser.add_argument("--tile-batch", type=int, default=4)
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=None, help="default: all the device runs"
    )
    parser.add_argument("--base-channels", type=int, default=32)
    parser.add_argument("--residual-blocks", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    width, height = (int(v) for v in args.size.lower().split("x"))
    variants = args.variants or [v for v in VARIANTS if device.type == "cuda" or v != "graphed"]
    torch.manual_seed(0)
    net = TransformerNet(base_channels=args.base_channels, num_residual_blocks=args.residual_blocks).eval()
    flops_per_pixel = network_flops_per_pixel(net)
    shapes = {
        f"whole {width}x{height}": torch.rand(1, 3, height, width),
        f"tiles {args.tile_batch}x{args.tile}px": torch.rand(args.tile_batch, 3, args.tile, args.tile),
    }
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"stylizer network on {device} ({name}), torch {torch.__version__}; {flops_per_pixel / 1e3:.1f} kFLOP/px"
    )
    print("| variant | input | ms per forward | TFLOP/s | mean abs error vs fp32 (8-bit levels) |")
    print("|---|---|---:|---:|---:|")
    results = []
    for shape, cpu_input in shapes.items():
        reference = None
        for variant in variants:
            forward, channels_last = build(net, variant, device)
            x = cpu_input.to(device)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            try:
                seconds, y = time_forward(forward, x, args.warmup, args.repeats)
            except torch.OutOfMemoryError:
                print(f"| {variant} | {shape} | out of memory | | |")
                torch.cuda.empty_cache()
                continue
            if reference is None and variant == "eager_fp32":
                reference = y
            error = (y - reference).abs().mean().item() * 255 if reference is not None else float("nan")
            tflops = flops_per_pixel * x.shape[0] * x.shape[2] * x.shape[3] / seconds / 1e12
            results.append(
                {"variant": variant, "shape": shape, "seconds": seconds, "tflops": tflops, "error": error}
            )
            print(f"| {variant} | {shape} | {seconds * 1e3:.1f} | {tflops:.3f} | {error:.3f} |", flush=True)
    return results


if __name__ == "__main__":
    main()
