"""What every Hydra entry point does around its job: one-paragraph errors, and multirun jobs that fail alone.

A PixelsmithError (bad config value, missing file or weights, impossible hardware request) is logged as its message,
without a traceback, and the process exits with status 2. In a multirun the failing job writes `failed.json` in its
dir and returns NaN so the other jobs still run; `pixelsmith.sweep_summary` tabulates them at the end.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pixelsmith.errors import PixelsmithError

log = logging.getLogger("pixelsmith")


def _is_multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # HydraConfig not set: called outside @hydra.main (tests)
        return False


def guarded_run(job: Callable[[DictConfig], dict[str, Any]], cfg: DictConfig, objective: str) -> float | None:
    output_dir = Path(cfg.paths.output_dir)
    try:
        metrics = job(cfg)
    except PixelsmithError as err:
        log.error("%s", err)
        if _is_multirun():
            _record(output_dir, {"status": "failed", "error": str(err)})
            return math.nan
        sys.exit(2)
    except Exception as err:
        if not _is_multirun():
            raise
        # One job's crash (an OOM, an invalid combination) must not end the sweep: record it and go on.
        log.error("Job failed: %s\n%s", err, traceback.format_exc())
        _record(output_dir, {"status": "failed", "error": f"{type(err).__name__}: {err}"})
        return math.nan
    value = metrics.get(objective, math.nan)
    if objective not in metrics and _is_multirun() and int(os.environ.get("RANK", 0)) == 0:
        log.warning(
            "objective=%s is not among this run's final metrics (%s); the sweep sees NaN. Set objective= to one "
            "of them (e.g. objective=loss/G when evaluation is off).",
            objective,
            ", ".join(sorted(metrics)),
        )
    if _is_multirun():
        _record(output_dir, {"status": "ok", "objective": objective, "value": value, "metrics": metrics})
    return value


def _record(output_dir: Path, payload: dict[str, Any]) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:
        overrides = []
    payload["overrides"] = overrides
    name = "failed.json" if payload["status"] == "failed" else "result.json"
    (output_dir / name).write_text(json.dumps(payload, indent=2, default=str))
