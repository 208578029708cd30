"""Images out of a trained or published GAN: `python generate.py ckpt_path=X mode=images|grid|mixing|video|project`.

The generator is the checkpoint's EMA one (G where a run kept none), from a Pixelsmith checkpoint or an NVlabs
network pickle (read as data: `pixelsmith.gan.nvlabs`). Modes (conf/generate.yaml lists every key):

- images: one PNG per seed (`seeds=[0,1,2]` or `seeds="0-7"`), at `truncation_psi` (and `truncation_cutoff`),
  with `class_idx` for a conditional model. z of seed s is `np.random.RandomState(s).randn(1, z_dim)`, as NVlabs'
  generate.py draws it, so a converted network gives their images for their seeds.
- grid: the same images tiled into one PNG (`grid_columns`).
- mixing: NVlabs' style-mixing figure (style_mixing.py): image (row, column) takes its first `mixing.coarse_layers`
  ws (coarse styles) from the row's seed and the rest (fine styles) from the column's; the top row and left column
  show the sources.
- video: an interpolation between consecutive `seeds` (in W where the model has one, else z by slerp), looping back
  to the first: a GIF (Pillow) or, with imageio[ffmpeg] installed, an MP4.
- project: NVlabs' projector.py: fit one w (broadcast to every layer), starting at w_avg, with Adam, their lr ramp
  and w noise ramp, the noise maps optimised under their regularisation, to `project.target` under an LPIPS
  (VGG16 by default, as theirs) or pixel loss; writes the target, the fitted image and the latent (projected_w.pt).

Truncation, mixing and projection need W (StyleGAN2); DCGAN and R3GAN refuse them in one sentence. Bad input stops
in one paragraph (exit 2); every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import Tensor, nn

from pixelsmith.errors import PixelsmithError, check_writable_folder

MODES = ("images", "grid", "mixing", "video", "project")


class GenerateError(PixelsmithError):
    """Bad options or a mode the model does not support; the message says what to do instead."""


@dataclass
class Generator:
    """The network and what it supports."""

    net: nn.Module
    name: str
    has_w: bool
    c_dim: int
    device: torch.device

    @property
    def z_dim(self) -> int:
        return int(self.net.z_dim)

    def needs_w(self, what: str) -> None:
        if not self.has_w:
            raise GenerateError(
                f"{what} needs a style (W) space, which model={self.name} has no mapping network for: use a "
                "StyleGAN2 checkpoint or NVlabs pickle, or mode=images|grid|video without truncation."
            )


# ---- inputs ----------------------------------------------------------------------------------------------------------


def parse_seeds(value: Any) -> list[int]:
    """[0, 1, 2], 3, "0-7", "1,5,9-11" -> a list of ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        seeds: list[int] = []
        for part in value.replace(" ", "").split(","):
            if not part:
                continue
            start, dash, end = part.partition("-")
            try:
                seeds += list(range(int(start), int(end) + 1)) if dash else [int(part)]
            except ValueError:
                raise GenerateError(
                    f"seeds={value!r}: give integers or ranges, e.g. seeds=0-7 or seeds=[1,5,9]"
                ) from None
        return seeds
    if isinstance(value, Iterable):
        return [s for item in value for s in parse_seeds(item)]
    raise GenerateError(f"seeds={value!r}: give integers or ranges, e.g. seeds=0-7 or seeds=[1,5,9]")


def seed_z(seed: int, z_dim: int) -> Tensor:
    """NVlabs' z for a seed (generate.py: np.random.RandomState(seed).randn(1, z_dim))."""
    return torch.from_numpy(np.random.RandomState(seed).randn(1, z_dim)).float()


def labels(gen: Generator, class_idx: int | None, count: int) -> Tensor | None:
    if not gen.c_dim:
        if class_idx is not None:
            raise GenerateError(
                f"class_idx={class_idx}: model={gen.name} is unconditional; leave class_idx unset."
            )
        return None
    if class_idx is None or not 0 <= int(class_idx) < gen.c_dim:
        raise GenerateError(
            f"model={gen.name} is class-conditional ({gen.c_dim} classes): give class_idx=0..{gen.c_dim - 1}."
        )
    return F.one_hot(torch.full((count,), int(class_idx)), gen.c_dim).float().to(gen.device)


def to_uint8(images: Tensor) -> np.ndarray:
    """[N, C, H, W] in about [-1, 1] -> [N, H, W, C] uint8, as NVlabs writes them (x * 127.5 + 128, clamped)."""
    array = (images.detach().float().cpu() * 127.5 + 128).clamp(0, 255).to(torch.uint8)
    return array.permute(0, 2, 3, 1).numpy()


def _pil(array: np.ndarray) -> Image.Image:
    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomically(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(handle)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make outputs private
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def save_png(array: np.ndarray, path: Path) -> Path:
    return _write_atomically(path, lambda tmp: _pil(array).save(tmp, format="PNG"))


def tile(arrays: np.ndarray, columns: int) -> np.ndarray:
    """[N, H, W, C] -> one [rows * H, columns * W, C] image (blank cells left black)."""
    count, height, width, channels = arrays.shape
    rows = math.ceil(count / columns)
    canvas = np.zeros((rows * height, columns * width, channels), dtype=arrays.dtype)
    for index, image in enumerate(arrays):
        row, col = divmod(index, columns)
        canvas[row * height : (row + 1) * height, col * width : (col + 1) * width] = image
    return canvas


# ---- sampling ----------------------------------------------------------------------------------------------------


def ws_of(gen: Generator, zs: Tensor, c: Tensor | None, psi: float, cutoff: int | None) -> Tensor:
    return gen.net.mapping(zs.to(gen.device), c, truncation_psi=psi, truncation_cutoff=cutoff)


def _draws_random_noise(net: nn.Module) -> bool:
    for module in net.modules():
        noisy = getattr(module, "noise_strength", None) is not None and hasattr(module, "noise_mode")
        if noisy and (
            module.noise_mode == "random"
            or (module.noise_mode == "const" and "noise_const" not in module._buffers)
        ):
            return True
    return False


@torch.no_grad()
def images_for_seeds(
    gen: Generator,
    seeds: list[int],
    psi: float = 1.0,
    cutoff: int | None = None,
    class_idx: int | None = None,
    batch_size: int = 16,
    progress=None,
) -> Tensor:
    """One image per seed, [N, C, H, W] on the CPU. The same seed always gives the same image: z from the seed, and
    random noise (where the model draws any) from a generator seeded with it."""
    if (psi != 1.0 or cutoff is not None) and not gen.has_w:
        gen.needs_w(f"truncation_psi={psi}")
    # Random noise maps are drawn per image from a generator seeded with its seed, so an image never depends on the
    # seeds beside it in a batch: such a network runs one seed at a time.
    step = 1 if _draws_random_noise(gen.net) else max(1, batch_size)
    out = []
    for start in range(0, len(seeds), step):
        chunk = seeds[start : start + step]
        zs = torch.cat([seed_z(s, gen.z_dim) for s in chunk]).to(gen.device)
        c = labels(gen, class_idx, len(chunk))
        torch.manual_seed(chunk[0])
        if gen.has_w:
            images = gen.net.synthesis(ws_of(gen, zs, c, psi, cutoff))
        else:
            images = gen.net(zs) if c is None else gen.net(zs, c)
        out.append(images.float().cpu())
        if progress is not None:
            progress(len(chunk))
    return torch.cat(out)


@torch.no_grad()
def mixing_grid(
    gen: Generator,
    row_seeds: list[int],
    col_seeds: list[int],
    coarse_layers: int,
    psi: float = 1.0,
    cutoff: int | None = None,
    class_idx: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(mixed [R, C, ...] images, row sources [R, ...], column sources [C, ...]): image (r, c) synthesised from the
    row's ws in layers [0, coarse_layers) and the column's in the rest."""
    gen.needs_w("Style mixing")
    num_ws = int(gen.net.synthesis.num_ws)
    if not 0 < coarse_layers < num_ws:
        raise GenerateError(
            f"mixing.coarse_layers={coarse_layers}: this generator has {num_ws} style layers; give 1..{num_ws - 1} "
            "(the layers taken from the row's seed; the column's give the rest)."
        )
    all_seeds = row_seeds + col_seeds
    zs = torch.cat([seed_z(s, gen.z_dim) for s in all_seeds])
    ws = ws_of(gen, zs, labels(gen, class_idx, len(all_seeds)), psi, cutoff)
    row_ws, col_ws = ws[: len(row_seeds)], ws[len(row_seeds) :]
    mixed = row_ws[:, None].repeat(1, len(col_seeds), 1, 1)
    mixed[:, :, coarse_layers:] = col_ws[None, :, coarse_layers:]
    synth = gen.net.synthesis
    images = synth(mixed.flatten(0, 1)).float().cpu()
    images = images.reshape(len(row_seeds), len(col_seeds), *images.shape[1:])
    return images, synth(row_ws).float().cpu(), synth(col_ws).float().cpu()


def _slerp(a: Tensor, b: Tensor, t: float) -> Tensor:
    a_n, b_n = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    omega = torch.acos((a_n * b_n).sum(-1, keepdim=True).clamp(-1, 1))
    so = torch.sin(omega)
    if float(so.abs().min()) < 1e-6:
        return torch.lerp(a, b, t)
    return (torch.sin((1 - t) * omega) / so) * a + (torch.sin(t * omega) / so) * b


@torch.no_grad()
def interpolation_frames(
    gen: Generator,
    seeds: list[int],
    frames_per_transition: int,
    psi: float = 1.0,
    cutoff: int | None = None,
    class_idx: int | None = None,
    progress=None,
) -> list[np.ndarray]:
    if len(seeds) < 2:
        raise GenerateError(f"mode=video interpolates between seeds: give two or more, got seeds={seeds}.")
    if frames_per_transition < 1:
        raise GenerateError(f"video.frames_per_transition={frames_per_transition}: give 1 or more.")
    zs = torch.cat([seed_z(s, gen.z_dim) for s in seeds]).to(gen.device)
    c = labels(gen, class_idx, 1)
    if gen.has_w:
        points = ws_of(gen, zs, None if c is None else c.repeat(len(seeds), 1), psi, cutoff)
    else:
        if psi != 1.0 or cutoff is not None:
            gen.needs_w(f"truncation_psi={psi}")
        points = zs
    frames = []
    for index in range(len(seeds)):
        a, b = points[index : index + 1], points[(index + 1) % len(seeds)][None]
        for step in range(frames_per_transition):
            t = step / frames_per_transition
            torch.manual_seed(0)  # the same noise in every frame: only the latent moves
            if gen.has_w:
                image = gen.net.synthesis(torch.lerp(a, b, t))
            else:
                z = _slerp(a, b, t)
                image = gen.net(z) if c is None else gen.net(z, c)
            frames.append(to_uint8(image)[0])
            if progress is not None:
                progress(1)
    return frames


def write_video(frames: list[np.ndarray], path: Path, fps: int) -> Path:
    """GIF through Pillow; MP4 through imageio-ffmpeg (pip install imageio[ffmpeg]), refused without it."""
    if path.suffix.lower() == ".gif":
        images = [_pil(frame) for frame in frames]
        return _write_atomically(
            path,
            lambda tmp: images[0].save(
                tmp, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0
            ),
        )
    if path.suffix.lower() != ".mp4":
        raise GenerateError(f"video.path={path}: give a .gif (Pillow) or .mp4 (imageio[ffmpeg]) file name.")
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise GenerateError(
            "An MP4 needs imageio with its ffmpeg plugin: pip install 'pixelsmith[video]' (imageio[ffmpeg]); "
            "or write a GIF with video.path=interpolation.gif."
        ) from None

    def write(tmp: str) -> None:
        with imageio.get_writer(tmp, format="FFMPEG", fps=fps, codec="libx264", quality=8) as writer:
            for frame in frames:
                writer.append_data(frame if frame.shape[-1] == 3 else np.repeat(frame, 3, axis=-1))

    return _write_atomically(path, write)


# ---- projection (NVlabs projector.py) --------------------------------------------------------------------------------


def _noise_buffers(G: nn.Module) -> list[Tensor]:
    """Each synthesis layer's noise map as an optimisable tensor (NVlabs optimises their noise_const buffers); a
    layer without one (a network trained here) gets one of its resolution."""
    from pixelsmith.gan.networks.stylegan2 import SynthesisLayer, set_noise_mode

    buffers = []
    for index, block in enumerate(G.synthesis.blocks):
        resolution = 4 * 2**index
        for layer in (block.conv0, block.conv1):
            if not isinstance(layer, SynthesisLayer) or layer.noise_strength is None:
                continue
            if "noise_const" not in layer._buffers:
                layer.register_buffer(
                    "noise_const", torch.randn(resolution, resolution, device=layer.bias.device)
                )
            buffers.append(layer._buffers["noise_const"])
    set_noise_mode(G, "const")
    return buffers


def _noise_regularisation(buffers: list[Tensor]) -> Tensor | float:
    loss: Tensor | float = 0.0
    for buffer in buffers:
        noise = buffer[None, None]
        while True:
            loss = loss + (noise * torch.roll(noise, shifts=1, dims=3)).mean() ** 2
            loss = loss + (noise * torch.roll(noise, shifts=1, dims=2)).mean() ** 2
            if noise.shape[2] <= 8:
                break
            noise = F.avg_pool2d(noise, kernel_size=2)
    return loss


def _distance(kind: str, options: Any, device: torch.device):
    """target, synth in [-1, 1] -> a scalar distance."""
    if kind == "pixel":
        return lambda a, b: (a - b).square().mean()
    if kind != "lpips":
        raise GenerateError(f"project.loss={kind}: choose lpips (NVlabs' VGG16 features) or pixel.")
    from pixelsmith.metrics.image_metrics import build_lpips_network

    net = build_lpips_network(
        str(options.get("lpips_net", "vgg")),
        backbone_weights=options.get("lpips_backbone_weights"),
        config_key="project.lpips_backbone_weights",
    )
    net = net.eval().requires_grad_(False).to(device)

    def lpips(a: Tensor, b: Tensor) -> Tensor:
        if a.shape[1] == 1:
            a, b = a.repeat(1, 3, 1, 1), b.repeat(1, 3, 1, 1)
        if (
            a.shape[-1] > 256
        ):  # NVlabs: VGG was built for 224 px, so larger images are area-downsampled to 256
            a, b = (
                F.interpolate(a, size=(256, 256), mode="area"),
                F.interpolate(b, size=(256, 256), mode="area"),
            )
        return net(a.clamp(-1, 1), b.clamp(-1, 1), normalize=False).sum()

    return lpips


def project(
    gen: Generator,
    target: Tensor,
    steps: int = 1000,
    loss: str = "lpips",
    lr: float = 0.1,
    w_avg_samples: int = 10000,
    initial_noise_factor: float = 0.05,
    lr_rampdown_length: float = 0.25,
    lr_rampup_length: float = 0.05,
    noise_ramp_length: float = 0.75,
    regularize_noise_weight: float = 1e5,
    optimize_noise: bool = True,
    seed: int = 303,
    loss_options: Any = None,
    progress=None,
) -> dict[str, Any]:
    """NVlabs' `projector.project` on our generator: returns {"w": [1, num_ws, w_dim], "image": [1, C, H, W],
    "losses": per-step distances}. `target`: [C, H, W] in [-1, 1] at the generator's resolution."""
    gen.needs_w("Projection")
    if steps < 1:
        raise GenerateError(f"project.steps={steps}: give 1 or more.")
    torch.manual_seed(seed)
    np.random.seed(seed)
    G = copy.deepcopy(gen.net).eval().requires_grad_(False).to(gen.device)
    c = (
        labels(gen, loss_options.get("class_idx") if loss_options else None, w_avg_samples)
        if gen.c_dim
        else None
    )
    with torch.no_grad():
        z_samples = torch.from_numpy(np.random.RandomState(123).randn(w_avg_samples, gen.z_dim)).float()
        w_samples = G.mapping(z_samples.to(gen.device), c)[:, :1, :]
        w_avg = w_samples.mean(dim=0, keepdim=True)
        w_std = float(((w_samples - w_avg).square().sum() / w_avg_samples) ** 0.5)
    buffers = _noise_buffers(G) if optimize_noise else []
    if not optimize_noise:
        from pixelsmith.gan.networks.stylegan2 import set_noise_mode

        set_noise_mode(G, "const")  # the network's own const noise where it has it (else random, seeded)
    distance = _distance(loss, loss_options or {}, gen.device)
    target = target[None].to(gen.device).float()
    w_opt = w_avg.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([w_opt, *buffers], betas=(0.9, 0.999), lr=lr)
    with torch.no_grad():
        for buffer in buffers:
            buffer.copy_(torch.randn_like(buffer))
    for buffer in buffers:
        buffer.requires_grad_(True)
    losses = []
    num_ws = int(G.synthesis.num_ws)
    for step in range(steps):
        t = step / steps
        w_noise_scale = w_std * initial_noise_factor * max(0.0, 1.0 - t / noise_ramp_length) ** 2
        ramp = min(1.0, (1.0 - t) / lr_rampdown_length)
        ramp = (0.5 - 0.5 * math.cos(ramp * math.pi)) * min(1.0, t / lr_rampup_length)
        for group in optimizer.param_groups:
            group["lr"] = lr * ramp
        ws = (w_opt + torch.randn_like(w_opt) * w_noise_scale).repeat(1, num_ws, 1)
        torch.manual_seed(seed + step)
        dist = distance(G.synthesis(ws), target)
        total = dist + _noise_regularisation(buffers) * regularize_noise_weight
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
        losses.append(float(dist.detach()))
        with torch.no_grad():
            for buffer in buffers:
                buffer -= buffer.mean()
                buffer *= buffer.square().mean().rsqrt()
        if progress is not None:
            progress(1)
    w = w_opt.detach().repeat(1, num_ws, 1)
    with torch.no_grad():
        torch.manual_seed(seed)
        image = G.synthesis(w).float().cpu()
        final = float(distance(image.to(gen.device), target))
    return {"w": w.cpu(), "image": image, "losses": losses, "final_loss": final, "generator": G}


def load_target(path: str, resolution: int, channels: int) -> Tensor:
    """An image file -> [C, H, W] in [-1, 1]: centre-cropped to a square and resized (Lanczos), as NVlabs."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise GenerateError(
            f"project.target={file} does not exist: give the photo to project (PNG, JPEG, ...)."
        )
    try:
        with Image.open(file) as opened:
            image = opened.convert("L" if channels == 1 else "RGB")
    except OSError as err:
        raise GenerateError(f"project.target={file} is not an image Pillow can read ({err}).") from None
    width, height = image.size
    side = min(width, height)
    image = image.crop(((width - side) // 2, (height - side) // 2, (width + side) // 2, (height + side) // 2))
    image = image.resize((resolution, resolution), Image.LANCZOS)
    array = np.asarray(image, dtype=np.float32).reshape(resolution, resolution, channels)
    return torch.from_numpy(array).permute(2, 0, 1) / 127.5 - 1


# ---- the command ---------------------------------------------------------------------------------------------------


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise GenerateError(f"device={name}, but no CUDA GPU is visible: give device=cpu (or auto).")
    try:
        return torch.device(name)
    except RuntimeError:
        raise GenerateError(f"device={name}: give auto, cpu, cuda or cuda:N (a GPU's index).") from None


def load(ckpt_path: str, device: str = "auto", noise_mode: str = "const") -> Generator:
    from pixelsmith.gan.networks.stylegan2 import set_noise_mode
    from pixelsmith.gan.pretrained import load_generator

    net, info = load_generator(ckpt_path)
    where = _device(device)
    if info["has_w"]:
        set_noise_mode(net, noise_mode)
    return Generator(net.to(where), info["model"], info["has_w"], info["c_dim"], where)


class _Progress:
    """A rich progress bar (a dependency already), off with progress_bar=false."""

    def __init__(self, enabled: bool, total: int, what: str):
        self.bar = None
        if enabled:
            from rich.progress import Progress

            self.bar = Progress(transient=False)
            self.task = self.bar.add_task(what, total=total)

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __call__(self, count: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, count)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


NOISE_MODES = ("const", "random", "none")  # NVlabs' generate.py: click.Choice(['const', 'random', 'none'])
# truncation_psi's range. NVlabs' generate.py takes any float; w = w_avg + psi (w - w_avg), so [0, 1) truncates toward
# the average, (1, 2] spreads away from it, and [-1, 0) mirrors through it (StyleGAN's figure 8 shows psi down to
# -1). Further out every image is an artefact of extrapolation; a value there is a typo far more often than a wish.
PSI_RANGE = (-1.0, 2.0)
SEED_LIMIT = 2**32  # numpy's RandomState takes seeds in [0, 2**32)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_seeds(key: str, seeds: list[int]) -> None:
    bad = [s for s in seeds if not 0 <= s < SEED_LIMIT]
    if bad:
        raise GenerateError(
            f"{key}: seed {bad[0]} is outside 0..{SEED_LIMIT - 1} (NVlabs' seeds draw z with numpy's "
            f"RandomState); give seeds in that range, e.g. {key}=0-7."
        )


def check_options(cfg: DictConfig) -> list[int]:
    """Every option checked at start-up, before the network is read or an image made; returns the parsed seeds.
    Refusals name the key and a valid value (bounds that need the network, such as truncation_cutoff's and
    mixing.coarse_layers' upper ones, are checked once it is loaded, still before anything is written)."""
    mode = str(cfg.mode)
    if mode not in MODES:
        raise GenerateError(f"mode={mode}: choose one of {', '.join(MODES)}.")
    if not cfg.get("ckpt_path"):
        raise GenerateError("ckpt_path=... is required: a Pixelsmith checkpoint or an NVlabs network pickle.")
    if str(cfg.noise_mode) not in NOISE_MODES:
        raise GenerateError(
            f"noise_mode={cfg.noise_mode}: choose one of {', '.join(NOISE_MODES)} (const: a converted network's "
            "fixed noise maps, random: drawn per image from its seed, none: no noise)."
        )
    psi = cfg.truncation_psi
    if not isinstance(psi, int | float) or isinstance(psi, bool) or not PSI_RANGE[0] <= psi <= PSI_RANGE[1]:
        raise GenerateError(
            f"truncation_psi={psi}: give a number in [{PSI_RANGE[0]:g}, {PSI_RANGE[1]:g}]: 1 is no truncation, 0.7 "
            "NVlabs' usual, 0 the average image for every seed; below 0 mirrors through the average, above 1 "
            "spreads away from it."
        )
    cutoff = cfg.get("truncation_cutoff")
    if cutoff is not None and not (_integer(cutoff) and cutoff >= 1):
        raise GenerateError(
            f"truncation_cutoff={cutoff}: give the number of style layers to truncate, from the first (coarse) "
            "one: 1 or more, or null for all of them."
        )
    class_idx = cfg.get("class_idx")
    if class_idx is not None and not (_integer(class_idx) and class_idx >= 0):
        raise GenerateError(f"class_idx={class_idx}: give a class label (0 or more), or null for none.")
    if not (_integer(cfg.batch_size) and cfg.batch_size >= 1):
        raise GenerateError(
            f"batch_size={cfg.batch_size}: give 1 or more images per batch, e.g. batch_size=16."
        )
    columns = cfg.get("grid_columns")
    if columns is not None and not (_integer(columns) and columns >= 1):
        raise GenerateError(f"grid_columns={columns}: give 1 or more columns, or null for a square-ish grid.")
    _device(str(cfg.device))
    seeds = parse_seeds(cfg.seeds)
    _check_seeds("seeds", seeds)
    if mode in ("images", "grid") and not seeds:
        raise GenerateError("seeds=... is empty: give the seeds to draw, e.g. seeds=0-7.")
    if mode == "mixing":
        for key in ("row_seeds", "col_seeds"):
            found = parse_seeds(cfg.mixing[key])
            if not found:
                raise GenerateError(
                    f"mixing.{key} is empty: give one seed or more, e.g. mixing.{key}=[0,1,2]."
                )
            _check_seeds(f"mixing.{key}", found)
        if not (_integer(cfg.mixing.coarse_layers) and cfg.mixing.coarse_layers >= 1):
            raise GenerateError(
                f"mixing.coarse_layers={cfg.mixing.coarse_layers}: give 1 or more (the style layers taken from the "
                "row's seed; NVlabs: 4)."
            )
    if mode == "video":
        if len(seeds) < 2:
            raise GenerateError(
                f"mode=video interpolates between seeds: give two or more, got seeds={seeds}."
            )
        for key, example in (("frames_per_transition", 30), ("fps", 30)):
            value = cfg.video[key]
            if not (_integer(value) and value >= 1):
                raise GenerateError(f"video.{key}={value}: give 1 or more, e.g. video.{key}={example}.")
        suffix = Path(str(cfg.video.path)).suffix.lower()
        if suffix not in (".gif", ".mp4"):
            raise GenerateError(
                f"video.path={cfg.video.path}: give a .gif (Pillow) or .mp4 (imageio[ffmpeg]) file name."
            )
        if suffix == ".mp4" and importlib.util.find_spec("imageio") is None:
            raise GenerateError(
                "An MP4 needs imageio with its ffmpeg plugin: pip install 'pixelsmith[video]' (imageio[ffmpeg]); "
                "or write a GIF with video.path=interpolation.gif."
            )
    if mode == "project":
        options = cfg.project
        if not options.get("target"):
            raise GenerateError("mode=project needs project.target=PHOTO (the image to fit).")
        if not Path(str(options.target)).expanduser().is_file():
            raise GenerateError(
                f"project.target={options.target} does not exist: give the photo to project (PNG, JPEG, ...)."
            )
        for key, least in (("steps", 1), ("w_avg_samples", 1)):
            if not (_integer(options[key]) and options[key] >= least):
                raise GenerateError(f"project.{key}={options[key]}: give {least} or more.")
        if str(options.loss) not in ("lpips", "pixel"):
            raise GenerateError(
                f"project.loss={options.loss}: choose lpips (NVlabs' VGG16 features) or pixel."
            )
        if not (isinstance(options.lr, int | float) and options.lr > 0):
            raise GenerateError(
                f"project.lr={options.lr}: give a learning rate above 0, e.g. project.lr=0.1."
            )
    return seeds


def planned_outputs(cfg: DictConfig, seeds: list[int]) -> list[Path]:
    """The files a command writes (each to a temporary name first, then renamed), for the start-up checks."""
    outdir = Path(str(cfg.outdir)).expanduser()
    mode = str(cfg.mode)
    if mode == "images":
        return [outdir / f"seed{seed:04d}.png" for seed in seeds]
    if mode in ("grid", "mixing"):
        return [outdir / f"{mode}.png"]
    if mode == "video":
        return [outdir / str(cfg.video.path)]
    return [outdir / "target.png", outdir / "projected.png", outdir / "projected_w.pt"]


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_destinations(cfg: DictConfig, seeds: list[int]) -> None:
    """Refuse, before the network loads, outputs this process cannot write (outdir a file, a folder on /proc) and an
    output that would replace one of the command's inputs (the checkpoint, project.target)."""
    outdir = Path(str(cfg.outdir)).expanduser()
    outputs = planned_outputs(cfg, seeds)
    check_writable_folder(outdir, "outdir", "choose a folder you can write (outdir=...).", given=cfg.outdir)
    if str(cfg.mode) == "video":
        check_writable_folder(
            outputs[0].parent,
            "video.path",
            "choose a file name in a folder you can write (video.path=walk.gif, under outdir).",
            given=cfg.video.path,
        )
    inputs = [("ckpt_path", Path(str(cfg.ckpt_path)).expanduser())]
    if str(cfg.mode) == "project":
        inputs.append(("project.target", Path(str(cfg.project.target)).expanduser()))
    for key, source in inputs:
        for output in outputs:
            if _same_file(output, source):
                raise GenerateError(
                    f"{key}={source} would be overwritten: it is also this command's output {output}. Nothing was "
                    "written. Write the outputs elsewhere (outdir=<another folder>"
                    + (", or another video.path" if str(cfg.mode) == "video" else "")
                    + "), or keep the input somewhere else."
                )


def run(cfg: DictConfig) -> dict[str, Any]:
    """The generate command's job (`generate.py`): writes into `outdir`, returns what it wrote."""
    seeds = check_options(cfg)
    check_destinations(cfg, seeds)
    mode = str(cfg.mode)
    outdir = Path(str(cfg.outdir)).expanduser()
    gen = load(str(cfg.ckpt_path), str(cfg.device), str(cfg.noise_mode))
    psi, cutoff, class_idx = float(cfg.truncation_psi), cfg.get("truncation_cutoff"), cfg.get("class_idx")
    if gen.has_w and cutoff is not None and cutoff > int(gen.net.synthesis.num_ws):
        raise GenerateError(
            f"truncation_cutoff={cutoff}: this generator has {int(gen.net.synthesis.num_ws)} style layers; give "
            f"1..{int(gen.net.synthesis.num_ws)}, or null for all of them."
        )
    written: list[str] = []
    if mode in ("images", "grid"):
        with _Progress(cfg.progress_bar, len(seeds), f"{mode}: {len(seeds)} images") as bar:
            images = to_uint8(images_for_seeds(gen, seeds, psi, cutoff, class_idx, int(cfg.batch_size), bar))
        if mode == "images":
            written += [
                str(save_png(image, outdir / f"seed{seed:04d}.png"))
                for seed, image in zip(seeds, images, strict=True)
            ]
        else:
            columns = int(cfg.grid_columns or math.ceil(math.sqrt(len(seeds))))
            written.append(str(save_png(tile(images, columns), outdir / "grid.png")))
    elif mode == "mixing":
        rows, cols = parse_seeds(cfg.mixing.row_seeds), parse_seeds(cfg.mixing.col_seeds)
        mixed, row_images, col_images = mixing_grid(
            gen, rows, cols, int(cfg.mixing.coarse_layers), psi, cutoff, class_idx
        )
        blank = torch.full_like(row_images[:1], -1.0)
        cells = [blank, col_images] + [torch.cat([row_images[r : r + 1], mixed[r]]) for r in range(len(rows))]
        grid = tile(to_uint8(torch.cat(cells)), len(cols) + 1)
        written.append(str(save_png(grid, outdir / "mixing.png")))
    elif mode == "video":
        count = len(seeds) * int(cfg.video.frames_per_transition)
        with _Progress(cfg.progress_bar, count, f"video: {count} frames") as bar:
            frames = interpolation_frames(
                gen, seeds, int(cfg.video.frames_per_transition), psi, cutoff, class_idx, bar
            )
        written.append(str(write_video(frames, outdir / str(cfg.video.path), int(cfg.video.fps))))
    else:
        options = cfg.project
        if not options.get("target"):
            raise GenerateError("mode=project needs project.target=PHOTO (the image to fit).")
        gen.needs_w("Projection")
        net = gen.net
        target = load_target(str(options.target), int(net.resolution), int(net.channels))
        with _Progress(cfg.progress_bar, int(options.steps), "project") as bar:
            result = project(
                gen,
                target,
                steps=int(options.steps),
                loss=str(options.loss),
                lr=float(options.lr),
                w_avg_samples=int(options.w_avg_samples),
                optimize_noise=bool(options.optimize_noise),
                seed=int(options.seed),
                loss_options=OmegaConf.to_container(options, resolve=True) | {"class_idx": class_idx},
                progress=bar,
            )
        written.append(str(save_png(to_uint8(target[None])[0], outdir / "target.png")))
        written.append(str(save_png(to_uint8(result["image"])[0], outdir / "projected.png")))
        latent = {"w": result["w"], "losses": torch.tensor(result["losses"]), "source": str(cfg.ckpt_path)}
        written.append(str(_write_atomically(outdir / "projected_w.pt", lambda tmp: torch.save(latent, tmp))))
    for path in written:
        print(path)
    return {"written": float(len(written))}


def main() -> None:
    """`python generate.py` / `pixelsmith-generate`: Hydra composes conf/generate.yaml (the packaged tree in a plain
    install); a PixelsmithError, and a command line Hydra refuses (`config.hydra_errors`), is one paragraph on stderr
    and exit 2, never a traceback."""
    import sys

    import hydra

    from pixelsmith.config.hydra_errors import report_composition_errors
    from pixelsmith.config.paths import CONF_DIR

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="generate")
    def _main(cfg: DictConfig) -> None:
        try:
            run(cfg)
        except PixelsmithError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    report_composition_errors(_main)
