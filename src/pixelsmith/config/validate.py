"""Range checks on a composed run config, at start-up, before anything is written.

The schemas (`config/schema.py` and the `*/config.py` it registers) types every key, so `data.batch_size=abc` fails in Hydra; this adds what a type
cannot say: `data.batch_size=0`, `train.clip_grad_norm=-1` (which silently turned training into gradient ascent),
`model.objective.regularizers.r1.interval=0`, `eval.monitor=foo`, `augment.target=2` (ADA's p could never rise), an
`objective=eval/...` that no run writes, a key added with `+` that nothing reads (`+maxsteps=5`). Every problem
found is reported at once, one line each naming the key, the value and a valid one, in a `ConfigValueError` the
entry points print as one paragraph. A few settings that are legal but surely unintended (a warm-up longer than
the run) are logged as warnings.
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pixelsmith.config.paths import CONF_DIR
from pixelsmith.config.rules import (
    EMA_HALF_LIFE,
    GENERAL_SCHEDULED_RANGES,
    PROBABILITY,
    Range,
    Rule,
    non_negative,
    number,
    optional,
    positive,
    positive_int,
)
from pixelsmith.config.schema import TrainConfig
from pixelsmith.core.config import HOST_SYNC_MODES, SCHEDULES
from pixelsmith.errors import PixelsmithError, UnwritableError, check_writable_folder
from pixelsmith.parts import contributed

log = logging.getLogger(__name__)

# eval.metrics entry -> the score names it produces (what eval.monitor may name)
METRIC_SCORES = {
    "fid": ("fid",),
    "kid": ("kid_mean", "kid_std"),
    "pr": ("precision", "recall"),
    "is": ("is_mean", "is_std"),
}


class ConfigValueError(PixelsmithError, ValueError):
    """One or more config values are out of range; the message lists each key with a valid value."""


GENERAL_RULES: list[Rule] = [
    Rule("max_steps", positive_int, "must be at least 1", "2000"),
    Rule("accumulate", positive_int, "must be at least 1 (1 = no accumulation)", "1"),
    Rule("data.batch_size", optional(positive_int), "must be at least 1 (or null: the profile's)", "64"),
    Rule("data.resolution", lambda v: positive_int(v) and v >= 4, "must be at least 4 pixels", "32"),
    Rule("data.channels", lambda v: v in (1, 3), "must be 1 (grey) or 3 (RGB)", "1"),
    Rule("data.limit", optional(positive_int), "must be at least 1, or null for the whole dataset", "null"),
    Rule("data.num_workers", optional(non_negative), "must be >= 0 (0 = load in the main process)", "2"),
    Rule(
        "hardware.num_workers",
        optional(non_negative),
        "must be >= 0 (loader worker processes; 0 = load in the main process), or null",
        "2",
    ),
    Rule("data.prefetch_factor", positive_int, "must be at least 1", "2"),
    Rule("data.on_corrupt", lambda v: v in ("skip", "error"), "must be skip or error", "skip"),
    Rule("hardware.devices", optional(positive_int), "must be at least 1 (or null: all visible)", "1"),
    Rule("hardware.num_nodes", positive_int, "must be at least 1", "1"),
    Rule("hardware.num_threads", optional(positive_int), "must be at least 1, or null", "null"),
    Rule(
        "hardware.memory_fraction",
        optional(lambda v: positive(v) and v <= 1),
        "must be in (0, 1], or null",
        "0.5",
    ),
    Rule(
        "train.clip_grad_norm",
        optional(positive),
        "must be > 0, or null for no clipping (a negative max norm flips the gradients: gradient ascent)",
        "1.0",
    ),
    Rule("train.log_every_n_steps", positive_int, "must be at least 1", "10"),
    Rule("train.sample_every_n_steps", non_negative, "must be >= 0 (0 = never)", "250"),
    Rule("train.checkpoint_every_n_steps", non_negative, "must be >= 0 (0 = only at the end)", "500"),
    Rule("train.keep_checkpoints", non_negative, "must be >= 0", "3"),
    Rule(
        "train.preemption.check_every_n_steps",
        optional(positive_int),
        "must be at least 1, or null (the logging iterations)",
        "null",
    ),
    Rule(
        "train.nonfinite_max_consecutive",
        non_negative,
        "must be >= 0 (0 = never stop for non-finite steps)",
        "20",
    ),
    Rule(
        "train.host_sync_check",
        lambda v: v in HOST_SYNC_MODES,
        f"must be one of {', '.join(HOST_SYNC_MODES)}",
        "off",
    ),
    Rule(
        "schedule.name", lambda v: v in SCHEDULES, f"must be one of {', '.join(SCHEDULES)}", "warmup_cosine"
    ),
    Rule("schedule.warmup_steps", non_negative, "must be >= 0", "0"),
    Rule("schedule.min_lr_ratio", lambda v: non_negative(v) and v <= 1, "must be in [0, 1]", "0.0"),
    Rule("schedule.total_steps", optional(positive_int), "must be at least 1, or null (= max_steps)", "null"),
    EMA_HALF_LIFE.rule("model.ema.half_life_kimg"),
    Rule(
        "model.ema.rampup",
        optional(positive),
        "must be > 0, or null for no ramp-up (the half-life is limited to rampup x the images seen so far: at 0 or "
        "below the average is a plain copy of G, no average at all)",
        "0.05",
    ),
    Rule(
        "augment.target",
        lambda v: v is None or (positive(v) and v < 1),
        "must be in (0, 1), or null for a p set by model.schedules.augment_p: ADA raises p while r_t = E[sign(D(real))] is above the target and lowers it below; r_t "
        "lies in [-1, 1], so at a target of 1 or above p can never rise (augmentation never starts) and at 0 or "
        "below it rises whenever D calls more reals real than fake",
        "0.6",
    ),
    PROBABILITY.rule("augment.initial_p", "0.0"),
    PROBABILITY.rule("augment.max_p", "1.0"),
    Rule(
        "strategy.timeout_minutes",
        positive,
        "must be > 0 (how long a collective waits for the other processes; at 0 the first one times out)",
        "30",
    ),
    Rule("profiler.every_n_steps", optional(positive_int), "must be at least 1, or null", "null"),
    Rule("profiler.warmup_steps", non_negative, "must be >= 0", "2"),
    Rule("profiler.torch_wait", non_negative, "must be >= 0", "2"),
    Rule("profiler.torch_warmup", non_negative, "must be >= 0", "1"),
    Rule("profiler.torch_active", positive_int, "must be at least 1 (the iterations recorded)", "3"),
    Rule("eval.every_n_steps", non_negative, "must be >= 0 (0 = no evaluation during training)", "500"),
    Rule(
        "eval.num_samples",
        lambda v: positive_int(v) and v >= 2,
        "must be at least 2 (FID's covariance needs two generated images; a few thousand give a stable score)",
        "2000",
    ),
    Rule("eval.batch_size", positive_int, "must be at least 1", "250"),
    Rule("eval.reference_samples", optional(positive_int), "must be at least 1, or null (all)", "null"),
    Rule(
        "eval.metrics",
        lambda v: isinstance(v, list | tuple) and bool(v) and all(m in METRIC_SCORES for m in v),
        f"must be a non-empty list of {', '.join(METRIC_SCORES)}",
        "[fid,kid,pr]",
    ),
    Rule(
        "callbacks.prometheus.port",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 65535,
        "must be a TCP port in 0..65535 (0 picks a free one; below 1024 needs root)",
        "9464",
    ),
]

# Every rule checked at start-up: the general ones and those each part present brings (its part.py's CONFIG_RULES).
RULES: list[Rule] = [*GENERAL_RULES, *contributed("CONFIG_RULES")]

# model.schedules.<name> -> the range its values obey: the same Range objects as the plain keys they move (a part
# adds its own objective's, e.g. the GAN's gamma). `<optimizer>_lr` / `_beta1` / `_beta2` take their suffix's.
SCHEDULED_RANGES: dict[str, Range] = {
    **GENERAL_SCHEDULED_RANGES,
    **dict(contributed("SCHEDULED_RANGES")),
}


def scheduled_range(name: str) -> Range | None:
    """The range of `model.schedules.<name>` (None: a name this table does not know; the model refuses it)."""
    if name in SCHEDULED_RANGES:
        return SCHEDULED_RANGES[name]
    suffix = name.rsplit("_", 1)[-1]
    return SCHEDULED_RANGES.get(suffix) if suffix in ("lr", "beta1", "beta2") else None


def _lookup(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False, None
        node = node[part]
    return True, OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else (
        list(node) if OmegaConf.is_list(node) else node
    )


def _unknown_root_keys(cfg: DictConfig) -> list[str]:
    """Keys at the config's root that no part of Pixelsmith reads (added with `+`), with a suggestion each."""
    known = {f.name for f in fields(TrainConfig)} | {"experiment", "debug", "hparams_search", "local"}
    problems = []
    for key in cfg:
        if key in known or str(key).startswith("_"):
            continue
        close = difflib.get_close_matches(str(key), sorted(known), n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        problems.append(f"{key} is not a Pixelsmith setting and nothing would read it.{hint}")
    return problems


def _unknown_typed_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Keys that a typed node's schema does not have (added with `+`: `data=mnist +data.root=/x`), which the code
    would never read; dict-typed and untyped nodes (`model.objective.regularizers`, `callbacks`) take any key."""
    problems = []
    for key in cfg:
        node = cfg._get_node(key)
        if (
            not isinstance(node, DictConfig)
            or node._is_none()
            or node._is_missing()
            or node._is_interpolation()
        ):
            continue
        path = f"{prefix}{key}"
        schema = OmegaConf.get_type(node)
        if schema is not None and is_dataclass(schema):
            known = sorted(f.name for f in fields(schema))
            for extra in (str(k) for k in node if k not in known and not str(k).startswith("_")):
                close = difflib.get_close_matches(extra, known, n=1)
                hint = f"did you mean {path}.{close[0]}? " if close else ""
                problems.append(
                    f"{path}.{extra} is not a key of {schema.__name__} and nothing would read it ({hint}its keys: "
                    f"{', '.join(k for k in known if not k.startswith('_'))})."
                )
        problems += _unknown_typed_keys(node, f"{path}.")
    return problems


def _missing_model(cfg: DictConfig) -> list[str]:
    """`model` is an optional group (a fork may remove the default's part), so `model=<no such option>` composes
    without a model instead of failing in Hydra: name the options here."""
    node = cfg._get_node("model")
    if node is None or not node._is_missing():
        return []
    options = sorted(
        path.stem for path in (CONF_DIR / "model").glob("*.yaml") if not path.stem.startswith("_")
    )
    return [
        f"model names none of the model group's options (conf/model/), so there is no model to build; choose one "
        f"of {', '.join(options)} (e.g. model={options[0] if options else 'dcgan'})."
    ]


# Environment variables the config or the caches read: one that points nowhere would be ignored, or fail late.
CACHE_VARIABLE = (
    "PIXELSMITH_CACHE"  # FID statistics, image checks, the compile cache (under ~/.cache otherwise)
)
ROOT_VARIABLE = "PIXELSMITH_ROOT"  # paths.root_dir (conf/paths/default.yaml), else the working directory


def environment_problems() -> list[str]:
    """PIXELSMITH_CACHE that cannot hold a folder, and PIXELSMITH_ROOT that names no folder, each in one sentence."""
    problems = []
    cache = os.environ.get(CACHE_VARIABLE)
    if cache:
        try:
            check_writable_folder(
                cache,
                CACHE_VARIABLE,
                f"point {CACHE_VARIABLE} at a folder you can write (it is created if missing), or unset it for "
                "~/.cache/pixelsmith.",
            )
        except UnwritableError as err:
            problems.append(f"The environment variable {err}")
    root = os.environ.get(ROOT_VARIABLE)
    if root and not Path(root).expanduser().is_dir():
        what = "a file" if Path(root).expanduser().exists() else "nothing"
        problems.append(
            f"The environment variable {ROOT_VARIABLE}={root} (paths.root_dir) names {what}, not a folder; point it "
            f"at an existing folder, or unset it (paths.root_dir is then the working directory)."
        )
    return problems


def validate_config(cfg: DictConfig) -> None:
    """Raise ConfigValueError listing every out-of-range value; log warnings for legal but odd combinations."""
    problems = (
        _missing_model(cfg) + environment_problems() + _unknown_root_keys(cfg) + _unknown_typed_keys(cfg)
    )
    problems += _rule_problems(cfg, ("",))
    present, monitor = _lookup(cfg, "eval.monitor")
    _, metrics = _lookup(cfg, "eval.metrics")
    if present and isinstance(metrics, list | tuple) and all(m in METRIC_SCORES for m in metrics):
        scores = [s for m in metrics for s in METRIC_SCORES[m]]
        if monitor not in scores:
            problems.append(
                f"eval.monitor={monitor!r} is not a score the chosen eval.metrics={list(metrics)} produce; choose "
                f"one of {', '.join(scores)} (e.g. eval.monitor=fid)."
            )
    problems += _objective_problems(cfg)
    problems += _schedule_problems(cfg)
    _raise_problems(problems, "train.py")
    _warn_odd_combinations(cfg)


# What `evaluate.py` reads of its composed config (the model and data come from the checkpoint): its rules only, so
# a training-only key (eval.monitor, objective) never refuses an evaluation.
EVALUATION_KEYS = (
    "eval.num_samples",
    "eval.batch_size",
    "eval.reference_samples",
    "eval.metrics",
    "hardware.",
)


def _rule_problems(cfg: DictConfig, prefixes: tuple[str, ...]) -> list[str]:
    """One line for each rule of a key under `prefixes` whose value is out of range."""
    problems = []
    for rule in RULES:
        if rule.key.startswith(prefixes):
            present, value = _lookup(cfg, rule.key)
            if present and not rule.ok(value):
                problems.append(f"{rule.key}={value!r} {rule.requirement}; e.g. {rule.key}={rule.example}.")
    return problems


def validate_evaluation_config(cfg: DictConfig) -> None:
    """`validate_config` for evaluate.py: the rules of the keys it reads, the environment, keys nothing reads."""
    problems = environment_problems() + _unknown_root_keys(cfg) + _unknown_typed_keys(cfg)
    problems += _rule_problems(cfg, EVALUATION_KEYS)
    _raise_problems(problems, "evaluate.py")


# The sections of a run config that evaluate.py and generate.py take from a checkpoint (the rest is the command's).
STORED_SECTIONS = ("model.", "data.", "augment.")


def validate_stored_config(cfg: DictConfig) -> None:
    """The rules of the sections a checkpoint's stored config gives (model, data, augment), on the config evaluate.py
    builds from it: the ranges training checked when it wrote them, checked again because the file may have been
    edited since (pixelsmith.config.stored checks classes and types; this checks values)."""
    problems = _rule_problems(cfg, STORED_SECTIONS) + _objective_problems(cfg) + _schedule_problems(cfg)
    if problems:
        listed = " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        raise ConfigValueError(
            f"The checkpoint's stored run config has {len(problems)} value(s) out of range: {listed} The file was "
            "edited or damaged after training wrote it; nothing was built from it."
        )


def _raise_problems(problems: list[str], program: str) -> None:
    if problems:
        listed = " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        raise ConfigValueError(
            f"The run config has {len(problems)} invalid value(s), found before anything was written: {listed} "
            f"Fix them on the command line or in your config file; `python {program} --cfg job` prints the "
            "composed config."
        )


def _schedule_problems(cfg: DictConfig) -> list[str]:
    """Every value a `model.schedules.<name>` takes over the run obeys the range of the key it moves. Its shapes are
    monotone from `start` to `final` (constant, linear, half a cosine) after a linear warm-up from `warmup_start`, so
    those three are its extremes; the structure (shape, horizon, warm-up) is checked as the model builds it."""
    present, schedules = _lookup(cfg, "model.schedules")
    if not present or not isinstance(schedules, dict):
        return []
    problems = []
    for name, node in schedules.items():
        allowed = scheduled_range(str(name))
        if allowed is None or not isinstance(node, dict) or "start" not in node:
            continue  # the model refuses a name it cannot schedule, or a node that is no schedule, as it builds
        ends = {"start": node.get("start")}
        if node.get("final") is not None:
            ends["final"] = node["final"]
        if number(node.get("warmup_kimg")) and node["warmup_kimg"] > 0:
            ends["warmup_start"] = node.get("warmup_start", 0.0)
        for end, value in ends.items():
            if not allowed.ok(value):
                problems.append(
                    f"model.schedules.{name}.{end}={value!r} {allowed.requirement}: a schedule's every value, "
                    f"{', '.join(f'{k} {v!r}' for k, v in ends.items())} and all between, obeys the rule of the "
                    f"key it moves; e.g. model.schedules.{name}.{end}={allowed.example}."
                )
    return problems


def _objective_problems(cfg: DictConfig) -> list[str]:
    """An `eval/...` objective must be a key the evaluation writes into final_metrics.json: `eval/<score>` for the
    scores of eval.metrics, `eval/best_<eval.monitor>` and `eval/best_iteration`. A sweep over a key no run writes
    would rank every job by NaN. (Other objectives are the model's own training metrics, which only the run knows;
    a run whose final metrics lack its objective says so at the end.)"""
    present, objective = _lookup(cfg, "objective")
    if not present or not isinstance(objective, str) or not objective.startswith("eval/"):
        return []
    has_eval, metrics = _lookup(cfg, "eval.metrics")
    _, monitor = _lookup(cfg, "eval.monitor")
    if not has_eval:
        return [
            f"objective={objective} names an evaluation score, but this config has no evaluation (eval.*); name "
            "one of the model's training metrics instead, e.g. objective=loss/total."
        ]
    if not isinstance(metrics, list | tuple) or not all(m in METRIC_SCORES for m in metrics):
        return []  # eval.metrics itself is reported above
    written = [f"eval/{score}" for m in metrics for score in METRIC_SCORES[m]]
    if f"eval/{monitor}" not in written:
        return []  # eval.monitor is reported above; the objective follows once it is fixed
    written += [f"eval/best_{monitor}", "eval/best_iteration"]
    if objective in written:
        return []
    close = difflib.get_close_matches(objective, written, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    return [
        f"objective={objective} is not a key any run with eval.metrics={list(metrics)} and eval.monitor={monitor} "
        f"writes to final_metrics.json, so a sweep would rank every job by NaN; choose one of {', '.join(written)} "
        f"(e.g. objective=eval/best_{monitor}).{hint}"
    ]


def _warn_odd_combinations(cfg: DictConfig) -> None:
    present, warmup = _lookup(cfg, "schedule.warmup_steps")
    _, total = _lookup(cfg, "schedule.total_steps")
    _, max_steps = _lookup(cfg, "max_steps")
    total = total or max_steps
    if present and total and warmup >= total:
        log.warning(
            "schedule.warmup_steps=%d is not shorter than the %d-iteration schedule: the learning rate never "
            "reaches its peak. Use a warm-up of a few percent of max_steps (e.g. schedule.warmup_steps=%d).",
            warmup,
            total,
            max(1, total // 20),
        )
