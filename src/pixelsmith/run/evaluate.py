"""Evaluate a trained GAN checkpoint: `python evaluate.py ckpt_path=RUN/checkpoints/last.ckpt [eval.*=...]`.

The model and data configs come from the checkpoint (`pixelsmith_config`, written by every training run), so the
network always matches its weights whatever `experiment=` is given (LHT #659); hardware and precision come from
the current command line. Writes `metrics.json` and `metrics.md` into the run dir.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class, get_method
from omegaconf import DictConfig, OmegaConf

from pixelsmith.callbacks.evaluation import build_gan_metric, generate_into
from pixelsmith.config.schema import all_schemas
from pixelsmith.config.stored import trusted_run_config
from pixelsmith.config.validate import validate_evaluation_config, validate_stored_config
from pixelsmith.core.config import PRECISIONS, CoreSettings
from pixelsmith.errors import PixelsmithError
from pixelsmith.hardware.settings import apply_hardware
from pixelsmith.parts import contributed
from pixelsmith.run.build import build_datamodule, build_model, resolve_hardware
from pixelsmith.run.resume import check_resume_path
from pixelsmith.safe_load import build_to_fit, load_data_only

log = logging.getLogger(__name__)


def load_checkpoint(path: str) -> dict[str, Any]:
    # Files a part reads itself (the GAN part: NVlabs' network pickles, as data), by suffix.
    for suffix, reader in contributed("CHECKPOINT_READERS"):
        if Path(path).suffix.lower() == suffix:
            return get_method(reader)(path)
    checkpoint = load_data_only(path, "ckpt_path", "Evaluate a checkpoint written by `python train.py`.")
    if not isinstance(checkpoint, dict) or not checkpoint.get("pixelsmith_config"):
        raise PixelsmithError(
            f"{path} holds no Pixelsmith run config ('pixelsmith_config'); evaluate a checkpoint written by "
            "`python train.py` (its checkpoints/ folder)."
        )
    if not isinstance(checkpoint.get("state_dict"), dict):
        raise PixelsmithError(
            f"{path} holds no 'state_dict': evaluate a checkpoint written by `python train.py`."
        )
    return checkpoint


def run_cfg_data_of(cfg: DictConfig) -> DictConfig:
    return OmegaConf.create(OmegaConf.to_container(cfg.data, resolve=True))


def _check_generates_images(ckpt_path: str, model_cfg: dict) -> None:
    """evaluate.py measures generators (`generate(z)`); another model is refused with what its class says to do
    instead (`evaluate_instead`, formatted with the checkpoint path). General code names no model. The class name
    is one the config tree gives (checked by `trusted_run_config` first)."""
    target = str(model_cfg.get("_target_", ""))
    if not target:
        return
    try:
        model_class = get_class(target)
    except ImportError as err:  # a part this checkout lacks (README "Removing a part")
        raise PixelsmithError(
            f"{ckpt_path} was trained with {target} (model={model_cfg.get('name')}), which this checkout does "
            f"not have: {err}"
        ) from err
    if callable(getattr(model_class, "generate", None)):
        return
    instead = getattr(model_class, "evaluate_instead", "")
    raise PixelsmithError(
        f"{ckpt_path} holds a {model_class.__name__} (model={model_cfg.get('name')}), which generates no images "
        "from latents; evaluate.py measures generators (FID/KID/precision-recall of generated images)."
        + (f" {instead.format(ckpt_path=ckpt_path)}" if instead else "")
    )


# Keys of a data node that only say where data is cached: a stored value would let a file choose where this
# machine writes, so the command's (or the default) is used.
CACHE_KEYS = ("cache_dir",)


def _command_names_data() -> bool:
    """Whether this command gave `data=` or `data.*=` (inside a Hydra app; a direct call gives none)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    return any(o.lstrip("+~").startswith(("data=", "data.")) for o in HydraConfig.get().overrides.task)


def _stored_data(data: dict, source: str) -> dict:
    """The data node a checkpoint stores, as evaluate.py measures against it: local locations only. A remote URL
    would make this machine contact a server the file names, with this user's credentials."""
    for key, value in data.items():
        if isinstance(value, str) and "://" in value:
            raise PixelsmithError(
                f"{source}: its stored run config names the remote data data.{key}={value[:200]}; a stored config "
                "never makes this machine contact a server. Nothing was read. Give the data on the command line "
                f"(data={data.get('name')} data.{key}=...) to measure against it."
            )
    return {k: v for k, v in data.items() if k not in CACHE_KEYS}


def _check_network_sizes(model_cfg: dict, state: dict, source: str) -> None:
    """Each module a stored model node builds (`model.<key>` with a `_target_`, whose weights the checkpoint holds
    under `<key>.`) is built on the meta device first and compared with those weights: sizes a stored config gives
    are taken only when the file holds the tensors they make (`safe_load.build_to_fit`)."""
    from hydra.utils import instantiate

    for key, node in model_cfg.items():
        prefix = f"{key}."
        weights = {
            k[len(prefix) :]: v for k, v in state.items() if isinstance(k, str) and k.startswith(prefix)
        }
        if isinstance(node, dict) and node.get("_target_") and weights:
            build_to_fit(
                lambda node=node: instantiate(node), weights, source, f"model.{key}", check_only=True
            )


def check_command(cfg: DictConfig) -> None:
    """evaluate.py's own options, at start-up (before a checkpoint is read or an image generated): a checkpoint is
    given, and the keys it reads are in range (`validate_evaluation_config`)."""
    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.get("ckpt_path"):
        raise PixelsmithError(
            "evaluate.py measures a checkpoint, and none is given: add ckpt_path=<a run's checkpoints/last.ckpt> (or "
            "an NVlabs network .pkl), e.g. python evaluate.py ckpt_path=outputs/train/runs/<run>/checkpoints/last.ckpt."
        )
    validate_evaluation_config(cfg)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    check_command(cfg)
    read_by_a_part = any(
        str(cfg.ckpt_path).lower().endswith(suffix) for suffix, _ in contributed("CHECKPOINT_READERS")
    )
    # A part's own format (an NVlabs pickle) is a network, not a run: its reader checks it, not the resume checks.
    ckpt_path = str(Path(cfg.ckpt_path).expanduser()) if read_by_a_part else check_resume_path(cfg.ckpt_path)
    checkpoint = load_checkpoint(ckpt_path)
    # Checked as data before anything is built: a stored _target_ is a class the config tree names there.
    stored = trusted_run_config(checkpoint["pixelsmith_config"], ckpt_path, all_schemas())
    _check_generates_images(ckpt_path, stored["model"])
    if OmegaConf.to_container(cfg.model, resolve=True) != stored["model"]:
        log.warning(
            "The composed model config differs from the checkpoint's; using the checkpoint's (%s).",
            stored["model"].get("name"),
        )
    if cfg.precision.name == "auto" and stored["precision"] in PRECISIONS:
        # Evaluate in the precision the run trained (and was evaluated) in, unless told otherwise.
        cfg = OmegaConf.merge(cfg, {"precision": {"name": stored["precision"]}})
    hardware = resolve_hardware(cfg)
    apply_hardware(
        hardware
    )  # the profile's switches (matmul precision, cudnn.benchmark, threads) as in training
    # Replace, not merge: the composed model node may be another architecture with other keys. The stored nodes
    # were typed by their own option's schema above; the config rules check the values as at training start-up.
    run_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    run_cfg.model = stored["model"]
    run_cfg.data = _stored_data(stored["data"], ckpt_path)
    if checkpoint.get("converted_from") or _command_names_data():
        # A converted network was never trained here, and a command that names its data measures against that: the
        # data is this command's, at the network's resolution and channels.
        run_cfg.data = OmegaConf.merge(
            run_cfg_data_of(cfg),
            {"resolution": stored["data"].get("resolution"), "channels": stored["data"].get("channels")},
        )
    if run_cfg.model.get("init_from"):
        run_cfg.model.init_from = None  # the checkpoint's own weights are the ones measured
    run_cfg.augment = stored["augment"]
    validate_stored_config(run_cfg)
    _check_network_sizes(stored["model"], checkpoint["state_dict"], ckpt_path)
    try:
        model = build_model(run_cfg, CoreSettings(precision=hardware.precision, seed=stored["seed"]))
    except PixelsmithError:
        raise
    except Exception as err:  # noqa: BLE001 (whatever a class raises for the values a file gave it)
        cause = err.__cause__ if err.__cause__ is not None else err
        detail = (str(cause).strip().splitlines() or [""])[0][:300]
        raise PixelsmithError(
            f"{ckpt_path}: its stored model config does not build ({type(cause).__name__}: {detail}). Nothing was "
            "measured; evaluate a checkpoint as train.py wrote it."
        ) from None
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except (RuntimeError, TypeError, AttributeError) as err:
        first = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()), str(err))[:300]
        raise PixelsmithError(
            f"{ckpt_path}: its weights do not fit the networks its own stored config builds ({first}); the file is "
            "damaged or was edited. Evaluate a checkpoint as train.py wrote it."
        ) from None
    device = torch.device(hardware.accelerator)
    model.to(device).eval()
    datamodule = build_datamodule(run_cfg, hardware)
    datamodule.setup("fit")
    ev = cfg.eval
    metric = build_gan_metric(
        datamodule,
        ev.extractor,
        ev.weights_path,
        list(ev.metrics),
        ev.reference_samples,
        ev.cache_dir,
        device,
        ev.seed,
        ev.num_samples,
    )
    generate_into(metric, model, ev.num_samples, ev.batch_size, ev.seed)
    scores = metric.compute()
    progress = checkpoint.get("pixelsmith") if isinstance(checkpoint.get("pixelsmith"), dict) else {}
    iteration = progress.get("iteration", 0)
    scores["iteration"] = float(iteration) if isinstance(iteration, int | float) else 0.0
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "checkpoint": ckpt_path,
        "model": stored["model"].get("name"),
        "precision": hardware.precision,
        "metrics": scores,
    }
    (output_dir / "metrics.json").write_text(json.dumps(report, indent=2))
    rows = "\n".join(f"| {k} | {v:.6g} |" for k, v in scores.items())
    (output_dir / "metrics.md").write_text(
        f"# Evaluation of `{ckpt_path}`\n\nmodel: {stored['model'].get('name')}, iteration {int(scores['iteration'])}, "
        f"extractor: {metric.extractor.name}, {ev.num_samples} generated vs {int(scores['num_real'])} real images\n\n"
        f"| metric | value |\n|---|---|\n{rows}\n"
    )
    log.info("metrics -> %s\n%s", output_dir / "metrics.md", rows)
    return scores
