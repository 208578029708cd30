"""Aten operations per iteration, template against the plain loop: `python -m benchmarks.op_counts`.

A CPU proxy for the template's per-iteration bookkeeping on the GPU: every aten operation that is not a view is a
kernel there (or a host-side scalar op in its place). The template runs its graphed iteration
(`hardware.cuda_graphs=true`, uncaptured on CPU: the same code a capture records) with fused Adam; the plain loop
(`benchmarks/plain_loop.py`) runs the same networks, objective, optimizer and EMA by hand. Each iteration's
operations are counted with a `TorchDispatchMode` between the start and the end of the iteration; logging
iterations are reported apart (they read values on the host).

Bookkeeping that grows with the number of parameter tensors (a copy or a cast per gradient) shows as a count that
grows with the model's depth: `count_per_iteration` at two resolutions of the same network tells them apart.

A second count stands in for the eager iteration's host time: torch calls made from Python (each a dispatch on
the host, a kernel or not: `.to()` to the device a tensor is on launches nothing but still costs the host a call),
template eager (`hardware.cuda_graphs=false`) against the plain loop, fp32. Host work per parameter tensor shows there
as a difference that grows with depth, as above.

Both precisions are counted: bf16-mixed (the GPU profiles' precision) adds autocast's casts to both loops alike, and
any bookkeeping of the template's own that depends on the precision shows as a different ratio.

A third count is of convolution calls in the regularised steps (`convolution_calls`): R1 on StyleGAN2's D, path
length on its G, R1 + R2 on R3GAN's D at several group counts, each a step of the objective's own code, its
forward passes against the whole step (forward, the gradient with `create_graph`, the penalty's backward).
PyTorch's generic convolution double backward makes one call per group of a grouped conv; the networks'
first-order adjoints (`gan/networks/conv_input_grad.py`) make a fixed number per conv. `--generic` puts the plain
`F.conv2d` / `F.conv_transpose2d` back into the networks for comparison.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.arguments import Parser, power_of_two, refusals_exit_2

TARGET = "benchmarks.op_counts.OpCounter"
LOG_EVERY = 10
SMALL = {
    "dcgan": ["model=dcgan", "model.generator.ngf=8", "model.discriminator.ndf=8"],
    "stylegan2": [
        "model=stylegan2",
        "model.generator.channel_base=256",
        "model.generator.channel_max=16",
        "model.generator.z_dim=16",
        "model.generator.w_dim=16",
        "model.generator.mapping_layers=2",
        "model.discriminator.channel_base=256",
        "model.discriminator.channel_max=16",
    ],
}
COMMON = [
    "hardware=cpu",
    "precision=32-true",
    "hardware.channels_last=false",
    "hardware.optimizer_impl=fused",
    "hardware.cuda_graphs=true",
    "data.batch_size=4",
    "data.limit=64",
    "train.progress_bar=false",
    "train.sample_every_n_steps=0",
    "train.checkpoint_every_n_steps=0",
    f"train.log_every_n_steps={LOG_EVERY}",
    "logger=none",
    "eval.every_n_steps=0",
]


class _Counter(TorchDispatchMode):
    """Counts aten operations that are not views (a view launches no kernel)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _Calls(TorchFunctionMode):
    """Counts torch functions and tensor methods called from Python (attribute reads such as `.grad` excluded)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") != "__get__":
            self.count += 1
        return func(*args, **(kwargs or {}))


class OpCounter(Callback):
    """Operations of every training iteration of a template run (class-level, read after `run()`)."""

    counts: list[int] = []
    _mode: _Counter | _Calls | None = None
    counter: type = _Counter  # what is counted: aten operations, or torch calls from Python (`_Calls`)

    def on_train_start(self, trainer, pl_module) -> None:
        OpCounter.counts = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        OpCounter._mode = OpCounter.counter()
        OpCounter._mode.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        mode, OpCounter._mode = OpCounter._mode, None
        mode.__exit__(None, None, None)
        OpCounter.counts.append(mode.count)


def _config(model: str, resolution: int, iterations: int, output_dir: Path, extra: list[str]):
    from omegaconf import open_dict

    from benchmarks.harness import compose

    overrides = [*SMALL[model], *COMMON, f"data.resolution={resolution}", f"max_steps={iterations}", *extra]
    cfg = compose(overrides, output_dir)
    with open_dict(cfg):
        cfg.callbacks.op_counter = {"_target_": TARGET}
    return cfg


def template_counts(
    model: str,
    resolution: int,
    iterations: int,
    workdir: Path,
    extra=(),
    precision: str = "32-true",
    counter: type = _Counter,
) -> list[int]:
    # The instance Hydra makes is of this module as imported by name, not of `__main__` when run with -m.
    from benchmarks.op_counts import OpCounter as by_name
    from pixelsmith.run.fit import run

    run_dir = workdir / f"template-{model}-{resolution}-{precision}-{counter.__name__}"
    cfg = _config(model, resolution, iterations, run_dir, [f"precision={precision}", *extra])
    by_name.counter = counter
    try:
        run(cfg)
    finally:
        by_name.counter = _Counter
    return list(by_name.counts)


def plain_counts(
    model: str,
    resolution: int,
    iterations: int,
    workdir: Path,
    precision: str = "32-true",
    counter: type = _Counter,
) -> list[int]:
    import lightning as L

    from benchmarks.plain_loop import build_plain_gan, endless, plain_loader
    from pixelsmith.run.build import resolve_hardware

    run_dir = workdir / f"plain-{model}-{resolution}-{precision}-{counter.__name__}"
    cfg = _config(model, resolution, iterations, run_dir, [f"precision={precision}"])
    hardware = resolve_hardware(cfg)
    L.seed_everything(cfg.seed, verbose=False)
    gan = build_plain_gan(cfg, hardware, "fused")
    batches = endless(plain_loader(cfg, hardware))
    counts = []
    for _ in range(iterations):
        images = next(batches)
        with counter() as mode:
            gan.step(images)
        counts.append(mode.count)
    return counts


def per_iteration(counts: list[int], skip: int = 2) -> dict[str, float]:
    """Mean operations of the iterations after `skip` (lazy state), over whole logging intervals where possible:
    `all` every iteration, `quiet` those that log nothing, `logging` those that do (1-based multiples of LOG_EVERY,
    and the last)."""
    kept = list(enumerate(counts, start=1))[skip:]
    last = len(
        counts
    )  # the last iteration logs too (its own values, read at once, and the previous interval's)
    quiet = [c for i, c in kept if i % LOG_EVERY and i != last]
    logging = [c for i, c in kept if not i % LOG_EVERY or i == last]
    return {
        "all": statistics.fmean(c for _, c in kept),
        "quiet": statistics.fmean(quiet) if quiet else float("nan"),
        "logging": statistics.fmean(logging) if logging else float("nan"),
    }


PRECISIONS = ("32-true", "bf16-mixed")


def eager_calls(model: str, resolution: int, iterations: int, workdir: Path) -> dict[str, dict[str, float]]:
    """Torch calls from Python per iteration, the template's eager path and the plain loop, fp32."""
    eager = ["hardware.cuda_graphs=false"]
    template = template_counts(model, resolution, iterations, workdir, eager, counter=_Calls)
    plain = plain_counts(model, resolution, iterations, workdir, counter=_Calls)
    return {"template": per_iteration(template), "plain": per_iteration(plain)}


def measure(
    models=("dcgan", "stylegan2"),
    resolution: int = 16,
    iterations: int = 2 * LOG_EVERY + 2,
    precisions=PRECISIONS,
):
    """{(model, precision): {"template": per_iteration(...), "plain": per_iteration(...)}}, and under
    (model, "calls") the eager path's torch calls from Python (`eager_calls`)."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            for precision in precisions:
                counts = template_counts(model, resolution, iterations, Path(tmp), precision=precision)
                plain = plain_counts(model, resolution, iterations, Path(tmp), precision)
                results[model, precision] = {"template": per_iteration(counts), "plain": per_iteration(plain)}
            results[model, "calls"] = eager_calls(model, resolution, iterations, Path(tmp))
    return results


def report(results: dict) -> str:
    lines = ["aten ops per iteration (views excluded), template graphed path vs plain loop, CPU"]
    lines.append(
        f"{'model':<10} {'precision':<11} {'plain':>8} {'template':>9} {'ratio':>6} {'quiet':>7} {'logging':>8}"
    )
    rows = [(key, r) for key, r in results.items() if key[1] != "calls"]
    calls = [(key, r) for key, r in results.items() if key[1] == "calls"]
    for (model, precision), r in rows:
        plain, template = r["plain"]["all"], r["template"]
        lines.append(
            f"{model:<10} {precision:<11} {plain:8.1f} {template['all']:9.1f} {template['all'] / plain:6.2f} "
            f"{template['quiet'] / r['plain']['quiet']:7.2f} {template['logging'] / r['plain']['logging']:8.2f}"
        )
    lines.append("ratio: every iteration; quiet: iterations that log nothing; logging: a logging iteration")
    if calls:
        lines += [
            "",
            "torch calls from Python per iteration (host dispatches), template eager path vs plain loop, fp32",
        ]
        lines.append(f"{'model':<10} {'plain':>8} {'template':>9} {'ratio':>6} {'quiet':>7} {'logging':>8}")
        for (model, _), r in calls:
            plain, template = r["plain"], r["template"]
            lines.append(
                f"{model:<10} {plain['all']:8.1f} {template['all']:9.1f} {template['all'] / plain['all']:6.2f} "
                f"{template['quiet'] / plain['quiet']:7.2f} {template['logging'] / plain['logging']:8.2f}"
            )
    return "\n".join(lines)


# ---- convolution calls of the regularised steps ------------------------------------------------------------------
# aten::convolution and aten::convolution_backward (what autograd and F dispatch), and the backend ops a fork's
# custom code may call directly (_convolution, mkldnn_convolution, cudnn_convolution_transpose, slow_conv2d, ...).
_CONVOLUTION_OP = re.compile(r"conv(olution|_depthwise|_transpose|\dd)")


class ConvolutionCalls(TorchDispatchMode):
    """Counts convolution calls, split into `forward` (outside the autograd engine) and `backward` (inside it: the
    gradients, `create_graph` ones included, and the penalty's backward)."""

    def __init__(self):
        super().__init__()
        self.forward = 0
        self.backward = 0

    @property
    def total(self) -> int:
        return self.forward + self.backward

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _CONVOLUTION_OP.search(func.name()):
            if torch._C._current_autograd_node() is None:
                self.forward += 1
            else:
                self.backward += 1
        return func(*args, **(kwargs or {}))


class _Loop:
    """A `GANLoop` for the objectives' phases on one process in fp32: no autocast, no augmentation, no loss scale.
    `fakes`, when given, is what `G_forward(grad=False)` returns (R3GAN's D step: G's detached samples, drawn before
    the count so that the count is D's)."""

    def __init__(self, G, D, fakes=None):
        self.G, self.D, self.device, self.fakes = G, D, torch.device("cpu"), fakes

    def G_forward(self, z, *conditions, grad=True):
        if not grad and self.fakes is not None:
            return self.fakes
        with torch.set_grad_enabled(grad):
            return self.G(z, *conditions)

    def D_forward(self, images, *conditions, reals=False):
        return self.D(images, *conditions)

    def autocast(self):
        return contextlib.nullcontext()

    def loss_scale(self):
        return torch.ones(())

    def mean_over_ranks(self, tensor):
        return tensor


@contextlib.contextmanager
def generic_convolutions() -> Iterator[None]:
    """The networks with PyTorch's plain `F.conv2d` / `F.conv_transpose2d` in place of their first-order adjoints
    (the FIR filters keep theirs): the generic double backward, for comparison."""
    import torch.nn.functional as F

    from pixelsmith.gan.networks import r3gan, stylegan2

    patched = [(r3gan, "conv2d", F.conv2d), (stylegan2, "conv2d", F.conv2d)]
    patched.append((stylegan2, "conv_transpose2d", F.conv_transpose2d))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patched]
    try:
        for module, name, function in patched:
            setattr(module, name, function)
        yield
    finally:
        for module, name, function in saved:
            setattr(module, name, function)


RESOLUTION = 16
BATCH = 4
# R3GAN's D: this width at every stage, so its blocks' grouped convs have 64 channels: up to 64 groups (depthwise).
R3GAN_WIDTH = 32
REPORTED_GROUPS = (4, 16, 64)


def _stylegan2_networks():
    from pixelsmith.gan.networks.stylegan2 import StyleGAN2Discriminator, StyleGAN2Generator

    # NVlabs' switches (FIR resampling, resnet D), fp32 (no fp16 routing, no clamp), demo widths.
    common = {"resolution": RESOLUTION, "channels": 1, "channel_base": 256, "channel_max": 16}
    common |= {"num_fp16_res": None, "conv_clamp": None}
    G = StyleGAN2Generator(z_dim=16, w_dim=16, mapping_layers=2, upsampling="fir", **common)
    D = StyleGAN2Discriminator(downsampling="fir", architecture="resnet", **common)
    return G, D


def _r3gan_discriminator(groups: int):
    from pixelsmith.gan.networks.r3gan import R3GANDiscriminator

    return R3GANDiscriminator(
        resolution=RESOLUTION, channels=1, widths=[R3GAN_WIDTH] * 3, groups=[groups] * 3, blocks=1
    )


def _count_step(loss) -> ConvolutionCalls:
    """Convolution calls of one phase: `loss()` (forward passes and any `create_graph` gradient), then its backward."""
    with ConvolutionCalls() as calls:
        loss().loss.backward()
    return calls


def convolution_calls(r3gan_groups=(4, 16), seed: int = 0) -> dict[str, ConvolutionCalls]:
    """{row: the convolution calls of one regularised step}: StyleGAN2's R1 (Dreg) and path length (Greg), and
    R3GAN's D step (R1 + R2, every D step) at each of `r3gan_groups`."""
    from pixelsmith.gan.objectives import PathLengthPenalty, Phase, R1Penalty, R3GANObjective

    torch.manual_seed(seed)
    reals = torch.randn(BATCH, 1, RESOLUTION, RESOLUTION)
    G, D = _stylegan2_networks()
    rows = {}
    loop = _Loop(G, D)
    rows["stylegan2 D, R1"] = _count_step(
        lambda: R1Penalty(gamma=1.0, interval=1).loss(loop, {"real": reals})
    )
    z = torch.randn(BATCH, G.z_dim)
    path_length = PathLengthPenalty(weight=2.0, interval=1)
    rows["stylegan2 G, path length"] = _count_step(lambda: path_length.loss(loop, {"z": z}))
    fakes = torch.randn_like(reals)
    for groups in r3gan_groups:
        loop = _Loop(None, _r3gan_discriminator(groups), fakes=fakes)
        step = {"real": reals, "z": torch.randn(BATCH, 64)}
        rows[f"r3gan D, R1 + R2, {groups} groups"] = _count_step(
            lambda loop=loop, step=step: R3GANObjective(gamma=1.0).loss(Phase("Dmain", "D"), loop, step)
        )
    return rows


def convolution_report(
    rows: dict[str, ConvolutionCalls], generic: dict[str, ConvolutionCalls] | None = None
) -> str:
    lines = [
        f"convolution calls per regularised step, CPU fp32, batch {BATCH}, {RESOLUTION} px "
        "(forward: the step's forward passes; step: forward, gradient and the penalty's backward)"
    ]
    header = f"{'step':<32} {'forward':>7} {'step':>6} {'ratio':>6}"
    lines.append(header + (f" {'generic':>8} {'ratio':>6}" if generic else ""))
    for name, calls in rows.items():
        line = f"{name:<32} {calls.forward:7d} {calls.total:6d} {calls.total / calls.forward:6.2f}"
        if generic:
            plain = generic[name]
            line += f" {plain.total:8d} {plain.total / plain.forward:6.2f}"
        lines.append(line)
    if generic:
        lines.append(
            "generic: the same step with plain F.conv2d / F.conv_transpose2d (PyTorch's double backward)"
        )
    return "\n".join(lines)


@refusals_exit_2
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.op_counts", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["dcgan", "stylegan2"], choices=sorted(SMALL))
    # StyleGAN2 builds from 16 px up, and its small config's channel_base (256) caps the side.
    parser.add_argument("--resolution", type=power_of_two(16, 256), default=16)
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument(
        "--convolutions-only",
        action="store_true",
        help="only the convolution calls of the regularised steps (seconds; the iteration counts take minutes)",
    )
    parser.add_argument(
        "--generic",
        action="store_true",
        help="also count the regularised steps with PyTorch's plain convolutions (its generic double backward)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if not args.convolutions_only:
        print(report(measure(tuple(args.models), args.resolution, precisions=tuple(args.precisions))))
        print()
    generic = None
    if args.generic:
        with generic_convolutions():
            generic = convolution_calls(REPORTED_GROUPS)
    print(convolution_report(convolution_calls(REPORTED_GROUPS), generic))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
