"""Starting from a published or earlier network: `model.init_from=`, the converted checkpoint convert.py writes, and
the generator the image tools load (`generate.py`).

A source is an NVlabs network pickle (`.pkl`, read as data by `pixelsmith.gan.nvlabs`) or a Pixelsmith checkpoint
(`.ckpt`, read with `torch.load(weights_only=True)`). Either gives the G, D and G_ema weights; a pickle also gives
the `model.generator.*` / `model.discriminator.*` settings that build its networks.
"""

from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pixelsmith.config.stored import trusted_run_config
from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.nvlabs import Converted, convert_pickle, load_into
from pixelsmith.parts import contributed
from pixelsmith.safe_load import build_to_fit, load_data_only

log = logging.getLogger(__name__)

# What a preset that needs a starting network puts in model.init_from (a `???` would not survive the merge onto the
# schema's null): refused with what to give.
REQUIRED = "required"
# State-dict prefixes of each network inside a Pixelsmith GAN checkpoint (GANModule's attributes).
PREFIXES = {"G": "generator.", "D": "discriminator.", "G_ema": "G_ema.model."}
CHECKPOINT_ADVICE = (
    "Give an NVlabs network pickle (.pkl) or a Pixelsmith checkpoint (a run's checkpoints/last.ckpt, or what "
    "`python convert.py source=X.pkl dest=X.ckpt` writes)."
)


_STYLEGAN2_GENERATOR = "pixelsmith.gan.networks.stylegan2.StyleGAN2Generator"


def is_pickle(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() == ".pkl"


def networks_of_checkpoint(checkpoint: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
    state = checkpoint.get("state_dict")
    state = {k: v for k, v in state.items() if isinstance(k, str)} if isinstance(state, dict) else {}
    return {
        name: {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        for name, prefix in PREFIXES.items()
    }


def init_module_from(module: nn.Module, source: str) -> None:
    """Load G, D and G_ema of `module` (a GANModule) from `source` (model.init_from), refusing what does not fit."""
    if source == REQUIRED:
        raise PixelsmithError(
            "model.init_from is required here (experiment=stylegan2_finetune starts from a trained network): give "
            "model.init_from=NETWORK.pkl (an NVlabs pickle) or a Pixelsmith .ckpt; docs/pretrained.md says where "
            "NVlabs' networks are."
        )
    networks = {"G": module.generator, "D": module.discriminator}
    if getattr(module, "G_ema", None) is not None:
        networks["G_ema"] = module.G_ema.model
    path = Path(source).expanduser()
    if is_pickle(path):
        converted = convert_pickle(path, key="model.init_from")
        load_into(converted, networks, path)
        log.info("model.init_from=%s: %s", path, "; ".join(converted.report))
        return
    checkpoint = load_data_only(path, "model.init_from", CHECKPOINT_ADVICE)
    states = networks_of_checkpoint(checkpoint if isinstance(checkpoint, dict) else {})
    if "G_ema" in networks and not states["G_ema"]:
        states["G_ema"] = states["G"]  # a run without EMA: its G is the best it has
    for name, network in networks.items():
        try:
            network.load_state_dict(states[name], strict=True)
        except RuntimeError as err:
            first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
            raise PixelsmithError(
                f"model.init_from={path}: its {name} weights do not fit the {name} this config builds ({first[:300]}"
                "). Give the model.generator.* / model.discriminator.* settings the checkpoint was trained with "
                "(its pixelsmith_config, or what convert.py printed)."
            ) from None
    log.info("model.init_from=%s: G, D%s loaded", path, " and G_ema" if "G_ema" in networks else "")


def compose_run_config(overrides: list[str]) -> Any:
    """The training config with these overrides, composed as train.py composes it (inside a Hydra app as well)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from pixelsmith.config.paths import CONF_DIR, register_resolvers
    from pixelsmith.hardware.settings import register_detected_profile

    # The schemas are registered by the entry point (convert.py, pixelsmith.cli.convert, evaluate.py), as for
    # every composition: pixelsmith.config sits above this part.
    register_resolvers()
    register_detected_profile()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="train", overrides=overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def network_overrides(converted: Converted) -> list[str]:
    """convert's settings as overrides of experiment=stylegan2_finetune (resolution and channels via data.*)."""
    overrides = [
        o
        for o in converted.overrides()
        if o.split("=")[0].rsplit(".", 1)[1] not in ("resolution", "channels")
    ]
    return [
        f"data.resolution={converted.generator['resolution']}",
        f"data.channels={converted.generator['channels']}",
        *overrides,
    ]


def checkpoint_from_pickle(
    path: str | os.PathLike, key: str = "source", extra: list[str] | None = None
) -> dict:
    """A Pixelsmith checkpoint (what train.py writes, at iteration 0) holding the pickle's G, D and G_ema, with the
    run config of `experiment=stylegan2_finetune` at the pickle's settings: evaluate.py, generate.py and
    model.init_from take it."""
    from omegaconf import OmegaConf, open_dict

    from pixelsmith.run.build import build_core_settings, build_model, resolve_hardware

    path = Path(path).expanduser()
    converted = convert_pickle(path, key=key)
    overrides = [
        "experiment=stylegan2_finetune",
        "hardware=cpu",
        "precision=32-true",
        "model.init_from=null",
        *network_overrides(converted),
        *(extra or []),
    ]
    cfg = compose_run_config(overrides)
    with open_dict(cfg):
        # `${hydra:runtime.output_dir}` outside a Hydra run: this config never runs, the pickle's folder stands in.
        cfg.paths.output_dir = str(path.parent)
    hardware = resolve_hardware(cfg)
    model = build_model(cfg, build_core_settings(cfg, hardware))
    networks = {"G": model.generator, "D": model.discriminator, "G_ema": model.G_ema.model}
    load_into(converted, networks, path)
    run_config = OmegaConf.to_container(cfg, resolve=True)
    run_config["runtime_plan"] = hardware.__dict__.copy()
    return {
        "state_dict": model.state_dict(),
        "pixelsmith": {"iteration": 0, "images_seen": 0},
        "pixelsmith_config": run_config,
        "converted_from": {
            "source": str(path),
            "overrides": network_overrides(converted),
            "report": converted.report,
            **{k: v for k, v in converted.extras.items() if k == "augment_p"},
        },
    }, converted


def read_checkpoint_pickle(path: str) -> dict:
    """evaluate.py's reader for `ckpt_path=X.pkl` (gan/part.py CHECKPOINT_READERS)."""
    return checkpoint_from_pickle(path, key="ckpt_path")[0]


def save_atomically(obj: Any, dest: Path, zip_comment: bytes = b"") -> None:
    """torch.save to a temporary file beside `dest`, then rename: a failure leaves nothing half-written.
    `zip_comment` marks the file as its writer's (torch writes a zip; its loader ignores the comment)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(handle)
    try:
        torch.save(obj, tmp)
        if zip_comment:
            with zipfile.ZipFile(tmp, "a") as archive:
                archive.comment = zip_comment
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600 would make the checkpoint private
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _check_generator_ranges(generator_cfg: dict[str, Any], source: str) -> None:
    """The GAN part's range rules of `model.generator.*` on a stored generator node, before it is built: a count
    such as `mapping_layers` sizes lists and modules before any weight could be compared with the file's."""
    from pixelsmith.gan.rules import CONFIG_RULES, STORED_NETWORK_RULES

    problems = [
        f"{rule.key}={generator_cfg[name]!r} {rule.requirement}"
        for rule in [*CONFIG_RULES, *STORED_NETWORK_RULES]
        if rule.key.startswith("model.generator.")
        and (name := rule.key.rsplit(".", 1)[1]) in generator_cfg
        and not rule.ok(generator_cfg[name])
    ]
    if problems:
        raise PixelsmithError(
            f"{source}: its stored generator config is out of range ({'; '.join(problems)}). Nothing was built from "
            "it; the file is damaged or was edited."
        )


def load_generator(ckpt_path: str, key: str = "ckpt_path") -> tuple[nn.Module, dict[str, Any]]:
    """The EMA generator of a checkpoint or NVlabs pickle (G where a run kept no EMA), in eval mode on the CPU,
    and a description: {"model": name, "source": path, "has_w": bool, "c_dim": int}."""
    from hydra.utils import instantiate

    from pixelsmith.gan.networks.stylegan2 import StyleGAN2Generator

    path = Path(ckpt_path).expanduser()
    if is_pickle(path):
        converted = convert_pickle(path, key=key)
        generator = StyleGAN2Generator(**converted.generator)
        load_into(converted, {"G_ema": generator}, path)
        name = "stylegan2"
    else:
        checkpoint = load_data_only(path, key, CHECKPOINT_ADVICE)
        stored = checkpoint.get("pixelsmith_config") if isinstance(checkpoint, dict) else None
        model_cfg = (stored or {}).get("model") if isinstance(stored, dict) else None
        if not isinstance(model_cfg, dict) or not isinstance(model_cfg.get("generator"), dict):
            raise PixelsmithError(
                f"{key}={path} holds no GAN generator config (pixelsmith_config.model.generator): it was not "
                f"written by a GAN training run. {CHECKPOINT_ADVICE}"
            )
        # Checked as data first, as evaluate.py checks it: every _target_ one the config tree names at its place,
        # the values those of the model option's typed schema. Only then is the (allowed) generator class built.
        trusted = trusted_run_config(stored, f"{key}={path}", contributed("SCHEMAS"), required=("model",))
        generator_cfg = trusted["model"]["generator"]
        name = trusted["model"].get("name")
        _check_generator_ranges(generator_cfg, f"{key}={path}")
        states = networks_of_checkpoint(checkpoint)
        state = states["G_ema"] or states["G"]
        generator = build_to_fit(lambda: instantiate(generator_cfg), state, f"{key}={path}", "generator")
        name = str(name or model_cfg.get("_target_"))
    generator.eval().requires_grad_(False)
    info = {
        "model": name,
        "source": str(path),
        "has_w": hasattr(generator, "mapping") and hasattr(generator, "synthesis"),
        "c_dim": int(getattr(generator, "c_dim", 0) or 0),
    }
    return generator, info
