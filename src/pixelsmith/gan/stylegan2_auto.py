"""NVlabs' StyleGAN2-ADA 'auto' config as OmegaConf resolvers: the batch, minibatch-std group, widths, learning rate,
R1 gamma and EMA half-life that their `train.py` (`setup_training_loop_kwargs`, cfg='auto') derives from the
resolution and the GPU count, for `experiment=stylegan2_auto`; and `kimg_to_steps`, a training length in thousands of
images as this template's iterations.

    ${pixelsmith.stylegan2_auto:gamma,${data.resolution},${hardware.devices},${hardware.num_nodes}}
    ${pixelsmith.kimg_to_steps:25000,${data.batch_size},${accumulate}}

Registered with the other resolvers (`pixelsmith.config.paths.register_resolvers`). Pure Python without Pixelsmith imports: it
runs at composition, below every other part (a bad value is a ValueError, which OmegaConf reports with the key).
"""

from __future__ import annotations

import math

from omegaconf import OmegaConf

AUTO_KEYS = ("batch", "mbstd", "channel_base", "lr", "gamma", "ema_kimg")


def stylegan2_auto(resolution: int, gpus: int) -> dict[str, float | int]:
    """NVlabs' cfg='auto' spec for `resolution` px and `gpus` GPUs (their train.py, after `cfg_specs`):
    mb = max(min(gpus * min(4096 // res, 32), 64), gpus); mbstd = min(mb // gpus, 4); fmaps = 1 if res >= 512 else
    0.5 (channel_base = fmaps * 32768); lrate = 0.002 if res >= 1024 else 0.0025; gamma = 0.0002 * res^2 / mb;
    ema = mb * 10 / 32 (kimg)."""
    res, gpus = int(resolution), int(gpus)
    if res < 1 or res & (res - 1) or gpus < 1 or gpus & (gpus - 1):
        raise ValueError(
            f"experiment=stylegan2_auto derives its settings from data.resolution={res} and the GPU count "
            f"(hardware.devices x hardware.num_nodes = {gpus}); NVlabs' heuristic needs both to be powers of two. "
            "Set data.resolution (e.g. 256) and hardware.devices to powers of two."
        )
    batch = max(min(gpus * min(4096 // res, 32), 64), gpus)
    fmaps = 1 if res >= 512 else 0.5
    return {
        "batch": batch,
        "mbstd": min(batch // gpus, 4),
        "channel_base": int(fmaps * 32768),
        "lr": 0.002 if res >= 1024 else 0.0025,
        "gamma": 0.0002 * res**2 / batch,
        "ema_kimg": batch * 10 / 32,
    }


def _auto_resolver(key: str, resolution, devices=1, num_nodes=1):
    if key not in AUTO_KEYS:
        raise ValueError(
            f"${{pixelsmith.stylegan2_auto:{key},...}}: unknown key {key!r}; it gives one of {', '.join(AUTO_KEYS)}."
        )
    # hardware.devices null means one device per process (as the hardware settings read it)
    return stylegan2_auto(resolution, int(devices or 1) * int(num_nodes or 1))[key]


def kimg_to_steps(kimg, batch, accumulate=1) -> int:
    """Iterations that show `kimg` thousand images at `batch` x `accumulate` images per iteration (rounded up)."""
    images_per_iteration = int(batch) * int(accumulate or 1)
    if images_per_iteration < 1:
        raise ValueError(
            f"${{pixelsmith.kimg_to_steps:...}} needs a batch of at least 1 image, got data.batch_size={batch} x "
            f"accumulate={accumulate}; set data.batch_size."
        )
    return math.ceil(float(kimg) * 1000 / images_per_iteration)


def register_stylegan2_resolvers() -> None:
    if not OmegaConf.has_resolver("pixelsmith.stylegan2_auto"):
        OmegaConf.register_new_resolver("pixelsmith.stylegan2_auto", _auto_resolver)
    if not OmegaConf.has_resolver("pixelsmith.kimg_to_steps"):
        OmegaConf.register_new_resolver("pixelsmith.kimg_to_steps", kimg_to_steps)
