"""StyleGAN2 side by side with NVlabs' own networks: images/s and FLOPs of each training phase (Gmain, Dmain, R1).

    git clone https://github.com/NVlabs/stylegan2-ada-pytorch /tmp/nvlabs     # their code, never vendored into ours
    python -m benchmarks.sg2_reference --nvlabs-path /tmp/nvlabs                # 32 px, fp32, batch 16, our default widths
    python -m benchmarks.sg2_reference --repeats 9 --resolution 64 --channel-base 8192
    python -m benchmarks.sg2_reference                                          # without a checkout: ours only
    python -m benchmarks.sg2_reference --device cuda --resolution 256 --batch-size 32 --z-dim 512 --mapping-layers 8 \
        --channel-base 16384 --channel-max 512 --precision bf16 --nvlabs-fp16 --compile --nvlabs-path /tmp/nvlabs

Both sides get identical widths (z = w, mapping layers, channel_base / channel_max, RGB at `--resolution`) and the
same phase code, written as NVlabs' `training/loss.py` `StyleGAN2Loss.accumulate_gradients` runs it with style mixing
and path length off and no augmentation:
- Gmain: D frozen (requires_grad off), softplus(-D(G(z))).mean() backward through D into G;
- Dmain: G frozen, softplus(D(G(z))) + softplus(-D(x)) backward into D;
- R1 (Dreg): dD(x)/dx with create_graph, gamma / 2 * ||.||^2 backward into D (the double backward).
Optimizer steps are left out (the same Adam for both). NVlabs' networks run in fp32 with num_fp16_res=0 and no clamp (their
fp32 config); on CPU their custom CUDA ops fall back to their reference implementations (upfirdn2d as a grouped
conv, bias_act in plain PyTorch). Our networks run as `model=stylegan2` builds them (NVlabs' FIR resampling; its
fp16 routing does nothing in fp32) and, as a third column, with this template's first, cheaper resampling
(bilinear / avg_pool).

Each repeat times every phase of every network once, in turn (so load drift on a shared machine spreads evenly),
after `--warmup` untimed rounds; the table prints medians over repeats (images/s = batch / seconds) and min-max, the
ratios ours / NVlabs' per phase, and the FLOPs each phase counts (`pixelsmith.perf.flops.count_flops`). FLOPs
per step are exact; timings on a shared CPU are not: run it under `nice -n 19` on an idle machine and say so.

On a GPU (`--device cuda`) the clock is read after `torch.cuda.synchronize()`. `--precision bf16` runs our phases
under bf16 autocast (the GPU profiles' precision); `--nvlabs-fp16` gives NVlabs' networks their paper configuration's
mixed precision (fp16 in the top 4 resolutions, conv_clamp 256). NVlabs' custom CUDA ops (bias_act, upfirdn2d) build
with nvcc at first use; where they cannot, NVlabs' own code falls back to its reference ops and the header says so.
`--compile` compiles our G and D as the template does (R1's double backward runs them eagerly, as the template does).
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.arguments import (
    CommandLineError,
    Parser,
    at_least,
    count,
    nvlabs_checkout,
    power_of_two,
    refusals_exit_2,
)
from pixelsmith.gan.networks.stylegan2 import StyleGAN2Discriminator, StyleGAN2Generator
from pixelsmith.perf.flops import count_flops

PHASES = ("Gmain", "Dmain", "R1")
RESULT_PREFIX = "SG2_REFERENCE_RESULT "


@dataclass
class Pair:
    """One G and D and how to call them: `generate(z)` -> images, `discriminate(images)` -> logits [N]."""

    name: str
    generator: torch.nn.Module
    discriminator: torch.nn.Module
    generate: Callable[[torch.Tensor], torch.Tensor]
    discriminate: Callable[[torch.Tensor], torch.Tensor]
    channels_last: bool = (
        False  # weights and the real images in NHWC, as the hardware profiles run the networks
    )


def our_pair(args, name: str, upsampling: str, downsampling: str, channels_last: bool = False) -> Pair:
    generator = StyleGAN2Generator(
        resolution=args.resolution,
        channels=3,
        z_dim=args.z_dim,
        w_dim=args.z_dim,
        mapping_layers=args.mapping_layers,
        channel_base=args.channel_base,
        channel_max=args.channel_max,
        upsampling=upsampling,
    )
    discriminator = StyleGAN2Discriminator(
        resolution=args.resolution,
        channels=3,
        channel_base=args.channel_base,
        channel_max=args.channel_max,
        mbstd_group_size=4,
        downsampling=downsampling,
    )
    if channels_last:
        generator.to(memory_format=torch.channels_last)
        discriminator.to(memory_format=torch.channels_last)
    return Pair(name, generator, discriminator, generator, discriminator, channels_last)


def nvlabs_pair(args) -> Pair:
    """NVlabs' Generator and resnet Discriminator from a checkout of stylegan2-ada-pytorch (imported, not copied)."""
    path = (
        Path(args.nvlabs_path).expanduser().resolve()
    )  # a checkout (`nvlabs_checkout` checked it at start-up)
    sys.path.insert(0, str(path))
    try:
        import requests  # noqa: F401
    except ImportError:  # dnnlib.util imports it for URL downloads, which building the networks never does
        sys.modules["requests"] = types.ModuleType("requests")
    networks = importlib.import_module("training.networks")
    generator = networks.Generator(
        z_dim=args.z_dim,
        c_dim=0,
        w_dim=args.z_dim,
        img_resolution=args.resolution,
        img_channels=3,
        mapping_kwargs={"num_layers": args.mapping_layers},
        synthesis_kwargs={
            "channel_base": args.channel_base,
            "channel_max": args.channel_max,
            "num_fp16_res": 4 if args.nvlabs_fp16 else 0,
            "conv_clamp": 256 if args.nvlabs_fp16 else None,
        },
    )
    discriminator = networks.Discriminator(
        c_dim=0,
        img_resolution=args.resolution,
        img_channels=3,
        architecture="resnet",
        channel_base=args.channel_base,
        channel_max=args.channel_max,
        num_fp16_res=4 if args.nvlabs_fp16 else 0,
        conv_clamp=256 if args.nvlabs_fp16 else None,
        epilogue_kwargs={"mbstd_group_size": 4},
    )
    return Pair(
        "NVlabs",
        generator,
        discriminator,
        lambda z: generator(z, None),
        lambda images: discriminator(images, None).squeeze(1),
    )


def phase_step(
    pair: Pair, phase: str, z: torch.Tensor, real: torch.Tensor, r1_gamma: float = 1.0, autocast=None
) -> None:
    from pixelsmith.core.compile import eager

    if autocast is not None and phase != "R1":
        with autocast():
            return phase_step(pair, phase, z, real, r1_gamma)
    if phase == "R1" and any(getattr(m, "_compiled_call_impl", None) for m in pair.discriminator.modules()):
        with eager(
            pair.discriminator
        ):  # AOTAutograd's backward is not differentiable: the template runs R1 eager
            return phase_step(pair, phase, z, real, r1_gamma)
    generator, discriminator = pair.generator, pair.discriminator
    if pair.channels_last:
        real = real.contiguous(memory_format=torch.channels_last)
    generator.requires_grad_(phase == "Gmain")
    discriminator.requires_grad_(phase != "Gmain")
    if phase == "Gmain":
        F.softplus(-pair.discriminate(pair.generate(z))).mean().backward()
    elif phase == "Dmain":
        fake_logits = pair.discriminate(pair.generate(z))
        real_logits = pair.discriminate(real)
        (F.softplus(fake_logits) + F.softplus(-real_logits)).mean().backward()
    else:
        real = real.detach().requires_grad_(True)
        logits = pair.discriminate(real)
        (gradient,) = torch.autograd.grad(logits.sum(), real, create_graph=True)
        penalty = gradient.square().sum(dim=(1, 2, 3))
        (logits * 0 + penalty * (r1_gamma / 2)).mean().backward()
    generator.zero_grad(set_to_none=True)
    discriminator.zero_grad(set_to_none=True)


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.sg2_reference", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nvlabs-path", type=nvlabs_checkout, default=None, help="a checkout of NVlabs/stylegan2-ada-pytorch"
    )
    parser.add_argument("--resolution", type=power_of_two(16), default=32)
    parser.add_argument("--batch-size", type=count, default=16)
    parser.add_argument("--z-dim", type=count, default=128, help="z and w size (model=stylegan2: 128)")
    parser.add_argument("--mapping-layers", type=count, default=4)
    parser.add_argument("--channel-base", type=count, default=4096, help="at least --resolution")
    parser.add_argument("--channel-max", type=count, default=256)
    parser.add_argument("--repeats", type=count, default=7)
    parser.add_argument("--warmup", type=at_least(0), default=2)
    parser.add_argument("--threads", type=count, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-legacy", action="store_true", help="leave out the bilinear / avg_pool column")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="ours: bf16 = autocast")
    parser.add_argument("--nvlabs-fp16", action="store_true", help="NVlabs: num_fp16_res=4, conv_clamp=256")
    parser.add_argument(
        "--compile", action="store_true", help="ours: torch.compile G and D (as the template)"
    )
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="add a column: ours (fir) in channels_last, as every hardware profile runs it (hardware.channels_last)",
    )
    args = parser.parse_args(argv)
    if args.channel_base < args.resolution:
        parser.error(
            f"--channel-base {args.channel_base} is below --resolution {args.resolution}: the networks would have "
            f"no channels at full size; give --channel-base {args.resolution} or more"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CommandLineError(
            f"--device cuda, but torch {torch.__version__} sees no CUDA device here. Nothing was run. Fix: "
            "--device cpu."
        )
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    pairs = [our_pair(args, "ours (fir)", "fir", "fir")]
    if args.channels_last:
        pairs.append(our_pair(args, "ours (fir, channels_last)", "fir", "fir", channels_last=True))
    if not args.no_legacy:
        pairs.append(our_pair(args, "ours (bilinear/avg_pool)", "bilinear", "avg_pool"))
    if args.nvlabs_path:
        pairs.append(nvlabs_pair(args))
    device = torch.device(args.device)
    for pair in pairs:
        pair.generator.to(device)
        pair.discriminator.to(device)
    z = torch.randn(args.batch_size, args.z_dim, device=device)
    real = torch.randn(args.batch_size, 3, args.resolution, args.resolution, device=device)

    flops = {
        (pair.name, phase): count_flops(lambda p=pair, ph=phase: phase_step(p, ph, z, real))
        for pair in pairs
        for phase in PHASES
    }
    if args.compile:
        for pair in pairs:
            if pair.name.startswith("ours"):
                pair.generator.compile(dynamic=False)
                pair.discriminator.compile(dynamic=False)

    def autocast_for(pair):
        if args.precision != "bf16" or not pair.name.startswith("ours"):
            return None
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in flops}
    for repeat in range(args.warmup + args.repeats):
        for phase in PHASES:
            for pair in pairs if repeat % 2 == 0 else reversed(pairs):
                synchronize()
                start = time.perf_counter()
                phase_step(pair, phase, z, real, autocast=autocast_for(pair))
                synchronize()
                if repeat >= args.warmup:
                    seconds[(pair.name, phase)].append(time.perf_counter() - start)

    ops = ""
    if args.nvlabs_path and device.type == "cuda":
        from torch_utils.ops import bias_act, upfirdn2d  # NVlabs' modules (their checkout is on sys.path)

        built = bias_act._plugin is not None and upfirdn2d._plugin is not None
        ops = "; NVlabs' custom CUDA ops " + (
            "built and used" if built else "NOT built: NVlabs ran its reference ops"
        )
    print(
        f"StyleGAN2 {args.resolution} px RGB, batch {args.batch_size}, {device.type}, ours {args.precision}"
        f"{' compiled' if args.compile else ''}, NVlabs {'fp16 top 4 res' if args.nvlabs_fp16 else 'fp32'}{ops}, "
        f"z=w={args.z_dim}, "
        f"{args.mapping_layers} mapping layers, channel_base {args.channel_base}, channel_max {args.channel_max}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.repeats} repeats "
        "(min-max), images/s"
    )
    header = f"{'phase':<7}" + "".join(f"{pair.name:>34}" for pair in pairs)
    reference = "NVlabs" if args.nvlabs_path else None
    if reference:
        header += "".join(f"{pair.name + ' / NVlabs':>38}" for pair in pairs if pair.name != reference)
    print(header)
    for phase in PHASES:
        row = f"{phase:<7}"
        rates = {}
        for pair in pairs:
            times = seconds[(pair.name, phase)]
            rates[pair.name] = args.batch_size / statistics.median(times)
            low, high = args.batch_size / max(times), args.batch_size / min(times)
            row += f"{rates[pair.name]:>16.1f} ({low:6.1f}-{high:6.1f})  "
        if reference:
            row += "".join(
                f"{rates[p.name] / rates[reference]:>37.2f}x" for p in pairs if p.name != reference
            )
        print(row)
    # One machine-readable line for `gpu_check --stage bench`: images/s per network pair and phase.
    rates = {
        pair.name: {
            phase: args.batch_size / statistics.median(seconds[(pair.name, phase)]) for phase in PHASES
        }
        for pair in pairs
    }
    print(RESULT_PREFIX + json.dumps({"rates": rates, "header": ops.lstrip("; ") or None}), flush=True)
    print("\nGFLOPs per phase step (FlopCounterMode: convolutions, matmuls)")
    print(f"{'phase':<7}" + "".join(f"{pair.name:>34}" for pair in pairs))
    for phase in PHASES:
        print(f"{phase:<7}" + "".join(f"{flops[(pair.name, phase)] / 1e9:>34.3f}" for pair in pairs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
