"""Checks a checkpoint before a run resumes from it, and the command that resumes a stopped run.

Each check runs at start-up, before the run writes anything, and ends in one paragraph naming the cause and the fix:

- `open_checkpoint`: the file is missing, looks truncated or corrupt (then the run's other checkpoints that do load
  are named), or is not a Pixelsmith checkpoint;
- `check_same_model`: the checkpoint holds another model than this run builds (checked first: its iteration says
  nothing about this run);
- `check_not_finished`: the checkpoint is already at `max_steps`, so there is nothing to train (Lightning would only
  say "No training batches"); names the `max_steps` to give instead;
- `check_weights_fit`: the checkpoint's tensors do not fit the model this run built (another model, resolution,
  width...); names what differs between the run config stored in the checkpoint (`pixelsmith_config`) and this run's,
  and how to resume with the checkpoint's own settings or start afresh. `explain_load_error` turns the error of a
  mismatch that only the load itself finds into the same kind of paragraph. It also refuses weights that fit but were
  trained for another function of them (`check_same_function`: a part's FUNCTION_CONFIG_KEYS).

`resume_command` builds the command that continues a run in its own dir (printed after Ctrl-C or a preemption).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from pixelsmith.errors import PixelsmithError
from pixelsmith.parts import contributed
from pixelsmith.run.run_dir import RUN_MARKER
from pixelsmith.safe_load import UnloadableFileError, needs_full_unpickling, not_data_only_message


class CheckpointMismatchError(PixelsmithError):
    """The checkpoint's weights do not fit the model this run builds."""


class AlreadyFinished(PixelsmithError):
    """The checkpoint is already at max_steps: nothing to train. Not a failure: the process exits with status 0."""

    exit_code = 0


# ---- loading ----------------------------------------------------------------------------------------------------
def load_for_resume(path: Path) -> dict[str, Any]:
    """The checkpoint, memory-mapped (its tensors are not read until used). Pixelsmith checkpoints hold tensors and
    plain containers only; anything else needs full unpickling, which can run code, so weights_only stays on."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap can only be used" not in str(err):
            raise
    # Not a zip-format file (a legacy torch.save, a bare pickle, text): read whole, still as data only, so that the
    # refusal says what the file holds rather than calling it truncated.
    return torch.load(path, map_location="cpu", weights_only=True)


def checkpoint_iteration(path: Path) -> int | None:
    """The iteration a checkpoint holds, or None where it does not load (cheap: the tensors are not read)."""
    try:
        return int((load_for_resume(path).get("pixelsmith") or {}).get("iteration", 0))
    except Exception:
        return None


def _loadable_siblings(path: Path) -> list[tuple[Path, int]]:
    """The other checkpoints of the run that load, newest iteration first."""
    found = []
    for other in sorted(path.parent.glob("*.ckpt")):
        if other.resolve() == path.resolve():
            continue
        iteration = checkpoint_iteration(other)
        if iteration is not None:
            found.append((other, iteration))
    return sorted(found, key=lambda item: -item[1])


def open_checkpoint(ckpt_path: str, auto_resumed: bool = False) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to resume from and its contents (memory-mapped), or one paragraph saying why not."""
    path = Path(ckpt_path).expanduser()
    if not path.is_file():
        raise PixelsmithError(
            f"ckpt_path={ckpt_path!r} does not exist. Resume from a run's checkpoints/last.ckpt (or a step_*.ckpt), "
            "e.g. ckpt_path=outputs/train/runs/<date>/checkpoints/last.ckpt."
        )
    if any(path.suffix.lower() == suffix for suffix, _ in contributed("CHECKPOINT_READERS")):
        raise PixelsmithError(_not_a_run_message(ckpt_path))
    try:
        state = load_for_resume(path)
    except Exception as err:
        if needs_full_unpickling(err):
            raise UnloadableFileError(
                not_data_only_message(
                    "ckpt_path",
                    path,
                    err,
                    "Resume from a checkpoint written by train.py (a run's checkpoints/last.ckpt or step_*.ckpt); a "
                    "checkpoint from another project needs converting to a plain state dict first.",
                )
            ) from err
        # The first sentence: torch's zip-reader errors go on for several more about what may have happened.
        first_line = (str(err).strip().splitlines() or [""])[0].split(". ")[0][:200]
        raise PixelsmithError(_truncated_message(path, _naming(path, auto_resumed), err, first_line)) from err
    if not isinstance(state, Mapping) or "pixelsmith" not in state or "state_dict" not in state:
        raise PixelsmithError(
            f"ckpt_path={ckpt_path!r} is not a Pixelsmith training checkpoint (it has no 'pixelsmith' and "
            "'state_dict' entries). Resume from a checkpoint written by train.py (a run's checkpoints/last.ckpt or "
            "step_*.ckpt)."
        )
    return path, state


def refuse_converted(ckpt_path: str, checkpoint: Mapping[str, Any]) -> None:
    """A resume from what convert.py wrote: it holds weights and a config but no run (evaluate.py takes it)."""
    if checkpoint.get("converted_from"):
        raise PixelsmithError(_not_a_run_message(ckpt_path))


def _not_a_run_message(ckpt_path: str) -> str:
    return (
        f"ckpt_path={ckpt_path!r} holds a published network (an NVlabs pickle, or what convert.py made of one), not "
        "a training run: there is no optimizer state or iteration to resume. Start a run from its weights instead: "
        f"model.init_from={ckpt_path} (experiment=stylegan2_finetune; docs/pretrained.md)."
    )


def _naming(path: Path, auto_resumed: bool) -> str:
    """How a message names the checkpoint: as given, or as the one train.auto_resume found."""
    return (
        f"This run dir's {path} (train.auto_resume resumes from it)" if auto_resumed else f"ckpt_path={path}"
    )


def _truncated_message(path: Path, named: str, err: Exception, first_line: str) -> str:
    others = _loadable_siblings(path)
    if others:
        loading = ", ".join(f"{other.name} (iteration {iteration})" for other, iteration in others)
        alternative = (
            f"These checkpoints of the same run load: {loading}; resume from the newest with "
            f"ckpt_path={others[0][0]}."
        )
    else:
        alternative = (
            f"No other checkpoint in {path.parent} loads; start the run afresh (leave out ckpt_path, in a new run "
            "dir)."
        )
    return (
        f"{named} looks truncated or corrupt: it does not read as a complete checkpoint "
        f"({path.stat().st_size} bytes; {type(err).__name__}: {first_line}). A copy that stopped early, a full "
        "disk or a file edited by hand does this; train.py itself writes checkpoints whole or not at all. "
        + alternative
    )


# ---- finished runs ----------------------------------------------------------------------------------------------
def check_not_finished(path: Path, iteration: int, max_steps: int, auto_resumed: bool) -> None:
    """Refuse, before anything is written, to resume a checkpoint that is already at max_steps."""
    if iteration < max_steps:
        return
    larger = max(2 * iteration, iteration + 1)
    # Resumed by train.auto_resume: the command must name this run dir, or it would start afresh in a new one.
    run_dir = path.parent.parent.resolve() if auto_resumed else None
    command = resume_command(replace={"max_steps": str(larger)}, run_dir=run_dir)
    how = f"e.g. {command}" if command else f"e.g. the same command with max_steps={larger}"
    raise AlreadyFinished(
        f"Nothing to train: {_naming(path, auto_resumed)} is already at iteration {iteration} and max_steps={max_steps}, so the run "
        f"is finished (its outputs are left as they are). To train further, resume with a larger max_steps, {how}"
    )


# ---- does the checkpoint fit this run's model? -------------------------------------------------------------------
def check_same_model(checkpoint: Mapping[str, Any], path: Path, cfg: DictConfig, auto_resumed: bool) -> None:
    """Refuse, before the finished-run check, a checkpoint of another model than this run's (a style checkpoint in
    a GAN run, a DCGAN one under model=stylegan2): its iteration says nothing about this run, so "nothing to
    train" would be the wrong answer. Compared by the model's name in the stored run config; the tensors are
    compared once the model is built (`check_weights_fit`)."""
    stored = checkpoint.get("pixelsmith_config")
    if not isinstance(stored, Mapping) or not isinstance(stored.get("model"), Mapping):
        return
    current = OmegaConf.to_container(cfg, resolve=True)
    if _model_name(stored) != _model_name(current):
        raise mismatch_error([], stored, path, cfg, auto_resumed)


# The config keys that decide the networks' tensors, compared to explain a mismatch (optimizer settings, loss
# weights and the like change no tensor and are free to differ on a resume).
# The models' own come from their parts (each part's SHAPING_CONFIG_PREFIXES, pixelsmith.parts).
_SHAPING_PREFIXES = ("model.ema.enabled",)


def _shaping_prefixes() -> tuple[str, ...]:
    return (*_SHAPING_PREFIXES, *contributed("SHAPING_CONFIG_PREFIXES"))


_SHAPING_KEYS = ("data.resolution", "data.channels", "augment._target_")
# Same tensors either way (Freeze-D keeps frozen weights as buffers of the same names), so a resume may change them.
_NOT_SHAPING = ("gradient_checkpointing", "freeze_layers")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _shaping(flat: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value
        for key, value in flat.items()
        if (key in _SHAPING_KEYS or key.startswith(_shaping_prefixes()) or _matches_shaping_pattern(key))
        and not any(part in key for part in _NOT_SHAPING)
    }


def _matches_shaping_pattern(key: str) -> bool:
    # A part's keys that add tensors by their value (a GAN regularizer with state: the path-length mean).
    return any(re.fullmatch(pattern, key) for pattern in contributed("SHAPING_CONFIG_PATTERNS"))


def _model_name(config: Mapping[str, Any]) -> str:
    model = config.get("model") or {}
    return str(model.get("name") or model.get("_target_") or "?")


def config_differences(stored: Mapping[str, Any] | None, current: Mapping[str, Any]) -> list[str]:
    """What differs between the checkpoint's run config and this run's, in the keys that shape the networks, as
    "key: <checkpoint's> in the checkpoint, <this run's> here"; empty where nothing does (or nothing is stored)."""
    if not stored:
        return []
    differences = []
    ours, theirs = _model_name(current), _model_name(stored)
    if ours != theirs:
        differences.append(f"model: {theirs} in the checkpoint, {ours} here")
    flat_stored, flat_current = _shaping(_flatten(stored)), _shaping(_flatten(current))
    for key in sorted(set(flat_stored) | set(flat_current)):
        if ours != theirs and key.startswith("model."):
            continue  # another model: every one of its network keys differs; the model's name says it
        mine, stored_value = flat_current.get(key, "(absent)"), flat_stored.get(key, "(absent)")
        if mine != stored_value:
            differences.append(f"{key}: {stored_value} in the checkpoint, {mine} here")
    return differences


def _tensor_differences(model_state: Mapping[str, Any], saved: Mapping[str, Any]) -> list[str]:
    """What `load_state_dict(strict=True)` would refuse, compared by element count: the networks' own load hooks
    reshape some older tensors (a 4-D DCGAN projection, a 0-d noise strength), never change their size. Missing
    `objective.*` tensors are no mismatch: the GAN module starts them afresh (state added after the checkpoint)."""
    problems = []
    for key, tensor in model_state.items():
        if key not in saved:
            if not key.startswith("objective."):
                problems.append(f"{key} is missing from the checkpoint")
        elif torch.is_tensor(saved[key]) and saved[key].numel() != tensor.numel():
            problems.append(
                f"{key} has shape {list(saved[key].shape)} in the checkpoint, {list(tensor.shape)} here"
            )
    problems += [f"{key} is in the checkpoint only" for key in saved if key not in model_state]
    return problems


def check_weights_fit(
    model: torch.nn.Module, checkpoint: Mapping[str, Any], path: Path, cfg: DictConfig, auto_resumed: bool
) -> None:
    """Refuse, at start-up, a checkpoint whose tensors do not fit `model` (built, not yet trained)."""
    saved = checkpoint.get("state_dict") or {}
    # Buffers a network registers as it loads them (a converted NVlabs network's noise maps): the model says which.
    registers_on_load = getattr(model, "registers_on_load", None)
    if callable(registers_on_load):
        own = model.state_dict()
        saved = {k: v for k, v in saved.items() if k in own or not registers_on_load(k)}
    problems = _tensor_differences(model.state_dict(), saved)
    if problems:
        raise mismatch_error(problems, checkpoint.get("pixelsmith_config"), path, cfg, auto_resumed)
    check_same_function(checkpoint.get("pixelsmith_config"), path, cfg, auto_resumed)


def check_same_function(
    stored: Mapping[str, Any] | None, path: Path, cfg: DictConfig, auto_resumed: bool
) -> None:
    """Refuse weights that fit this run's networks but were trained for another function of them: the keys each
    part names in its FUNCTION_CONFIG_KEYS (StyleGAN2's resampling), whose other value would load the same tensors
    and silently make another network of them."""
    if not stored or _model_name(stored) != _model_name(OmegaConf.to_container(cfg, resolve=True)):
        return
    flat_stored = _flatten(stored)
    current = _flatten(OmegaConf.to_container(cfg, resolve=True))
    differ = [
        (key, flat_stored[key], current[key])
        for key in contributed("FUNCTION_CONFIG_KEYS")
        if key in flat_stored and key in current and flat_stored[key] != current[key]
    ]
    if not differ:
        return
    named = "; ".join(f"{key}: {theirs} in the checkpoint, {ours} here" for key, theirs, ours in differ)
    given = " ".join(f"{key}={theirs}" for key, theirs, _ in differ)
    afresh = (
        "give this run its own dir (leave hydra.run.dir unset)"
        if auto_resumed
        else "leave out ckpt_path (the run starts from random weights)"
    )
    raise CheckpointMismatchError(
        f"{_naming(path, auto_resumed)} was trained with other network settings than this run asks for ({named}). "
        "Its weights have the same shapes, so they would load, but as another network: these settings change the "
        f"function the same weights compute. To resume it, add {given} to the command; to train with the settings "
        f"this run asks for, {afresh}."
    )


def mismatch_error(
    problems: list[str], stored: Mapping[str, Any] | None, path: Path, cfg: DictConfig, auto_resumed: bool
) -> CheckpointMismatchError:
    current = OmegaConf.to_container(cfg, resolve=True)
    differences = config_differences(stored, current)
    where = _naming(path, auto_resumed)
    if differences:
        cause = f"was written by another model than this run builds: {'; '.join(differences[:8])}"
        if len(differences) > 8:
            cause += f"; and {len(differences) - 8} more"
    else:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        cause = (
            "does not fit the model this run builds, although the settings that shape the networks agree with "
            f"the config stored in it: {shown} (a checkpoint written by another version of the code, or one "
            "converted by hand)"
        )
    afresh = (
        "give this run its own dir (leave hydra.run.dir unset)"
        if auto_resumed
        else "leave out ckpt_path (the run starts from random weights)"
    )
    return CheckpointMismatchError(
        f"{where} {cause}, so its weights cannot be loaded. To resume it, run with the checkpoint's own "
        f"settings, {_own_settings(path, stored, cfg)}; to train this model instead, {afresh}."
    )


def _own_settings(path: Path, stored: Mapping[str, Any] | None, cfg: DictConfig) -> str:
    """How to run with the checkpoint's settings: the command of the run that wrote it, where its run dir still has
    that run's overrides; else this run's command with the checkpoint's values of the keys that differ."""
    run_dir = path.parent.parent
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    # In this run's own dir (train.auto_resume) Hydra has already replaced that file with this run's overrides.
    this_run = run_dir.resolve() == Path(str(cfg.paths.output_dir)).resolve()
    if path.parent.name == "checkpoints" and overrides_file.is_file() and not this_run:
        try:
            overrides = [str(o) for o in yaml.safe_load(overrides_file.read_text()) or []]
        except (OSError, yaml.YAMLError):
            overrides = None
        if overrides is not None:
            kept = [o for o in overrides if _key(o) != "ckpt_path"]
            return "the command that wrote it: " + " ".join(
                [_program(), *map(shlex.quote, kept), shlex.quote(f"ckpt_path={path}")]
            )
    current = OmegaConf.to_container(cfg, resolve=True)
    own = {}
    if _model_name(stored or {}) != _model_name(current):
        own["model"] = _model_name(stored or {})
    flat_stored, flat_current = _shaping(_flatten(stored or {})), _shaping(_flatten(current))
    for key, value in flat_stored.items():
        another_model = "model" in own and key.startswith("model.")  # model=<name> brings its own keys
        if (
            not another_model
            and key in flat_current
            and flat_current[key] != value
            and not key.endswith("_target_")
        ):
            own[key] = _override_value(value)
    stored_where = "its 'pixelsmith_config', also the config_resolved.yaml of the run that wrote it"
    if not own:
        return f"the settings stored in it ({stored_where})"
    given = " ".join(f"{key}={value}" for key, value in own.items())
    return f"this run's command with {given} (the values stored in it: {stored_where})"


def _override_value(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def explain_load_error(
    err: BaseException, path: str | None, cfg: DictConfig
) -> CheckpointMismatchError | None:
    """The error of `load_state_dict` inside `Trainer.fit` (a mismatch `check_weights_fit` did not see) as one
    paragraph; None for any other error."""
    text = str(err)
    if path is None or not isinstance(err, RuntimeError) or "Error(s) in loading state_dict" not in text:
        return None
    problems = [
        line.strip().rstrip(".")[:200]
        for line in text.splitlines()
        if line.strip().startswith(("size mismatch", "Missing key", "Unexpected key"))
    ]
    stored = None
    with contextlib.suppress(Exception):  # it loaded a moment ago; the paragraph does without its config
        stored = load_for_resume(Path(path)).get("pixelsmith_config")
    return mismatch_error(
        problems or [text.splitlines()[0][:200]], stored, Path(path), cfg, auto_resumed=False
    )


# ---- the command that resumes -------------------------------------------------------------------------------------
def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _program() -> str:
    """How this entry point was started: `python train.py`, or `pixelsmith-train` for the installed command."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "train.py"
    return f"python {argv0}" if argv0.endswith(".py") else Path(argv0).name


def _task_overrides() -> list[str] | None:
    """The overrides of this run's command line (None outside a Hydra entry point: a run started from Python)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return [str(o) for o in HydraConfig.get().overrides.task]
    except (ImportError, ValueError):
        return None


def resume_command(
    replace: Mapping[str, str] | None = None, drop: tuple[str, ...] = (), run_dir: Path | None = None
) -> str | None:
    """This run's command with `replace`d keys (added where absent), `drop`ped keys, and `hydra.run.dir=run_dir`
    when given; None outside a Hydra entry point."""
    overrides = _task_overrides()
    if overrides is None:
        return None
    replace = dict(replace or {})
    kept = [o for o in overrides if _key(o) not in replace and _key(o) not in drop]
    kept += [f"{key}={value}" for key, value in replace.items()]
    if run_dir is not None:
        kept.append(f"hydra.run.dir={run_dir}")
    return " ".join([_program(), *map(shlex.quote, kept)])


def continue_command(output_dir: Path, auto_resume: bool) -> str | None:
    """The command that continues this run in its own dir: from its last.ckpt where it has one (by itself under
    train.auto_resume), else the same start again in that dir."""
    last = output_dir / "checkpoints" / "last.ckpt"
    if last.is_file():
        replace = {} if auto_resume else {"ckpt_path": str(last)}
        return resume_command(replace, drop=("ckpt_path",), run_dir=output_dir.resolve())
    # Nothing to resume: the same command again, in this dir (which an earlier start already claimed).
    replace = {"train.overwrite": "true"} if (output_dir / RUN_MARKER).is_file() else {}
    return resume_command(replace, run_dir=output_dir.resolve())


def check_resume_path(ckpt_path: str | None) -> str | None:
    """The checkpoint path, checked to load (None without one); for evaluate.py."""
    return str(open_checkpoint(ckpt_path)[0]) if ckpt_path is not None else None
