"""`python -m benchmarks.style_folder`: folder throughput of `stylize.py`'s pipeline against fast_neural_style's loop.

    python -m benchmarks.style_folder                                   # CPU: 2K, 4 images, PNG and JPEG out
    python -m benchmarks.style_folder --sizes 2K 4K 8K --images 16      # a GPU: bf16 + nvJPEG for ours
    python -m benchmarks.style_folder --sizes 8K --formats jpg --devices 2

For each size (2K = 2048x1080, 4K = 3840x2160, 8K = 7680x4320, or WxH) a folder of `--images` JPEG photos
(synthetic: smooth colour fields plus grain, which compress like photos) is stylized to PNG and to JPEG by:
- ours: `stylize.py`'s folder pipeline as a user runs it (`pixelsmith.style.stylize.run_job`): tiles planned from
  the free memory (the whole image where it fits), codec worker processes, nvJPEG for JPEG on CUDA, precision
  auto as `stylize.py` (bf16-mixed where the device has native bf16, else fp32; `--precision`), `--devices`
  processes;
- peer: pytorch/examples fast_neural_style's published `stylize` method, written here from its description: for
  each file in turn, Pillow decodes it, the whole image goes through the network in one fp32 forward (0..255
  inputs scaled as the network expects), the result is clamped, copied back and saved with Pillow. One image at a
  time, nothing overlapped.
Both use the paper's network (TransformerNet, 32 base channels, 5 residual blocks, random weights: speed does not
depend on them). Each cell is run `--repeats` times after one warm-up image; the table prints medians of
images/s, the ratio ours / peer, and ours' network TFLOP/s and MFU from the run's summary. Targets: one
H100 >= 20 8K JPEG/s, >= 3 8K PNG/s; a 2-core CPU >= 1.3x the peer at 2K. The peer's 8K forward needs ~35 GB: on a
smaller device its cell says "out of memory" rather than stopping the table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.style_tiling import synthetic_photo
from pixelsmith.style.networks import TransformerNet

SIZES = {"2K": (2048, 1080), "4K": (3840, 2160), "8K": (7680, 4320)}


def parse_size(text: str) -> tuple[str, int, int]:
    if text.upper() in SIZES:
        return (text.upper(), *SIZES[text.upper()])
    width, _, height = text.lower().partition("x")
    return text, int(width), int(height)


def write_checkpoint(path: Path, base_channels: int, residual_blocks: int) -> None:
    torch.manual_seed(0)
    kwargs = {"base_channels": base_channels, "num_residual_blocks": residual_blocks}
    net = TransformerNet(**kwargs)
    torch.save(
        {
            "state_dict": {f"stylizer.{k}": v for k, v in net.state_dict().items()},
            "pixelsmith_config": {"model": {"stylizer": kwargs}},
        },
        path,
    )


def peer_folder(
    net: TransformerNet, sources: list[Path], out: Path, suffix: str, device: torch.device
) -> float:
    """fast_neural_style's stylize loop over a folder, one whole image at a time; returns the seconds taken."""
    start = time.perf_counter()
    with torch.no_grad():
        for source in sources:
            image = np.array(Image.open(source).convert("RGB"))
            content = torch.from_numpy(image).permute(2, 0, 1).float().unsqueeze(0).to(device)
            output = net(content / 255.0) * 255.0  # the peer feeds 0..255; ours takes 0..1: the same FLOPs
            pixels = output[0].clamp(0, 255).permute(1, 2, 0).to(torch.uint8).cpu().numpy()
            Image.fromarray(pixels).save(out / f"{source.stem}{suffix}")
    return time.perf_counter() - start


def ours_folder(options, folder: Path, out: Path, devices: int):
    from pixelsmith.style.devices import launch, resolve_devices
    from pixelsmith.style.stylize import run_job

    options.input, options.output = str(folder), str(out)
    names = resolve_devices(devices, options.device)
    return run_job(options, names[0]) if len(names) == 1 else launch(run_job, options, names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.style_folder", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--sizes", nargs="+", default=None, help="2K 4K 8K or WxH (default: 2K on CPU, all on GPU)"
    )
    parser.add_argument(
        "--images", type=int, default=None, help="images per folder (default 4 on CPU, 16 on GPU)"
    )
    parser.add_argument("--formats", nargs="+", default=["png", "jpg"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--devices", type=int, default=1, help="processes for ours (one per device)")
    parser.add_argument(
        "--precision",
        default="auto",
        help="ours' precision (auto, as stylize.py: bf16 where the device has it)",
    )
    parser.add_argument("--png-compress-level", type=int, default=6)
    parser.add_argument("--base-channels", type=int, default=32)
    parser.add_argument("--residual-blocks", type=int, default=5)
    parser.add_argument("--no-peer", action="store_true", help="ours only")
    parser.add_argument(
        "--peer-images",
        type=int,
        default=None,
        help="the peer stylizes only the first N images of each folder (its rate is per image; default: all)",
    )
    parser.add_argument(
        "--peer-once",
        action="store_true",
        help="time the peer once per cell (after ours' warm-up round) instead of every repeat: it has no warm-up "
        "to amortise, and at 8K to PNG each of its rounds costs a minute",
    )
    parser.add_argument(
        "--png-encoder", default="auto", help="ours' png_encoder (auto | threaded | pil | fpng)"
    )
    parser.add_argument(
        "--compile-mode",
        default="auto",
        help="ours' compile_mode (auto | default | max-autotune-no-cudagraphs | ...): a first run with "
        "max-autotune-no-cudagraphs fills the compile cache that a later compile_mode=auto run takes",
    )
    args = parser.parse_args(argv)

    from pixelsmith.style.stylize import StylizeOptions, resolve_device

    device = torch.device(resolve_device(args.device))
    on_gpu = device.type == "cuda"
    sizes = [parse_size(s) for s in (args.sizes or (["2K", "4K", "8K"] if on_gpu else ["2K"]))]
    count = args.images or (16 if on_gpu else 4)
    from pixelsmith.style.pipeline import resolve_precision

    precision = resolve_precision(args.precision, device)
    print(
        f"stylize folder benchmark: {device} ({torch.cuda.get_device_name(device) if on_gpu else 'CPU'}), "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; TransformerNet {args.base_channels}/"
        f"{args.residual_blocks}; {count} JPEG photos per folder; ours {precision} on {args.devices} device(s), "
        f"peer fp32 one whole image at a time; medians of {args.repeats}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="pixelsmith-stylize-bench-") as scratch:
        scratch = Path(scratch)
        checkpoint = scratch / "net.ckpt"
        write_checkpoint(checkpoint, args.base_channels, args.residual_blocks)
        peer_net = TransformerNet(base_channels=args.base_channels, num_residual_blocks=args.residual_blocks)
        peer_net = peer_net.eval().to(device)
        for label, width, height in sizes:
            folder = scratch / f"in_{label}"
            folder.mkdir()
            for index in range(count):
                synthetic_photo(width, height, index).save(folder / f"{index:03d}.jpg", quality=92)
            sources = sorted(folder.iterdir())
            for fmt in args.formats:
                suffix = f".{fmt}"
                options = StylizeOptions(
                    ckpt_path=str(checkpoint),
                    device=str(device),
                    precision=precision,
                    progress=False,
                    png_compress_level=args.png_compress_level,
                    png_encoder=args.png_encoder,
                    compile_mode=args.compile_mode,
                    format=fmt,
                )
                ours_rates, peer_rates, tflops, mfu = [], [], [], []
                for repeat in range(args.repeats + 1):  # the first round warms up (compile caches, allocator)
                    out = scratch / f"out_{label}_{fmt}_{repeat}"
                    out.mkdir()
                    start = time.perf_counter()
                    summary = ours_folder(options, folder, out, args.devices)
                    seconds = time.perf_counter() - start
                    if summary.failed:
                        raise SystemExit(f"ours failed: {summary.failed}")
                    peer_seconds = None
                    peer_sources = sources[: args.peer_images] if args.peer_images else sources
                    if not args.no_peer and not (args.peer_once and repeat != 1):
                        peer_out = scratch / f"peer_{label}_{fmt}_{repeat}"
                        peer_out.mkdir()
                        try:
                            peer_seconds = peer_folder(peer_net, peer_sources, peer_out, suffix, device)
                        except torch.OutOfMemoryError:
                            peer_seconds = float("nan")
                            if on_gpu:
                                torch.cuda.empty_cache()
                    if repeat == 0:
                        continue
                    ours_rates.append(count / seconds)
                    if peer_seconds is not None:
                        peer_rates.append(len(peer_sources) / peer_seconds)
                    flops = summary.flops_per_pixel * summary.pixels
                    tflops.append(flops / summary.wall_seconds / 1e12)
                    if summary.peak_flops:
                        mfu.append(flops / summary.wall_seconds / summary.peak_flops)
                ours = statistics.median(ours_rates)
                peer = statistics.median(peer_rates) if peer_rates else float("nan")
                rows.append(
                    (
                        label,
                        fmt,
                        ours,
                        peer,
                        ours / peer if peer == peer and peer > 0 else float("nan"),
                        statistics.median(tflops),
                        statistics.median(mfu) if mfu else float("nan"),
                    )
                )
                print(f"  {label} -> {fmt}: ours {ours:.3f} img/s, peer {peer:.3f} img/s", flush=True)
    print("\n| size | output | ours img/s | peer img/s | ours / peer | ours TFLOP/s | ours MFU |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, fmt, ours, peer, ratio, tflops, mfu in rows:
        print(f"| {label} | {fmt} | {ours:.3f} | {peer:.3f} | {ratio:.2f}x | {tflops:.3f} | {mfu:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
