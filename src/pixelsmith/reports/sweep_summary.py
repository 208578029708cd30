"""Hydra callback that ends a multirun with a table of every job: overrides, status, objective value or error.

Each job writes `result.json` or `failed.json` into its dir (`pixelsmith.run.entry.guarded_run`); this reads them back,
prints a table, and writes `summary.md` into the sweep dir, best objective first. An Optuna sweep (hparams_search)
adds its study: best parameters, parameter importance, every trial, and `optuna_objective.png`
(`pixelsmith.reports.optuna`). `report.html` beside it compares the jobs (`pixelsmith.reports.html`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("pixelsmith")


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        for name in ("result.json", "failed.json"):
            path = job / name
            if path.exists():
                payload = json.loads(path.read_text())
                payload["dir"] = job.name
                rows.append(payload)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    def sort_key(row):
        value = row.get("value")
        ok = row["status"] == "ok" and isinstance(value, float) and not math.isnan(value)
        return (not ok, value if ok else 0.0)

    objective = next((r["objective"] for r in rows if r.get("objective")), "objective")
    lines = [f"| job | overrides | status | {objective} / error |", "|---|---|---|---|"]
    for row in sorted(rows, key=sort_key):
        overrides = " ".join(row.get("overrides", []))
        outcome = f"{row['value']:.4g}" if row["status"] == "ok" else row.get("error", "")[:160]
        lines.append(f"| {row['dir']} | {overrides} | {row['status']} | {outcome} |")
    return "\n".join(lines)


def _optuna_study(config: DictConfig) -> tuple[str, str] | None:
    """(storage, study name) when the sweep runs an Optuna sweeper (ours or Hydra's) with a persistent storage."""
    sweeper = config.hydra.get("sweeper") or {}
    if "optuna" not in str(sweeper.get("_target_", "")).lower():
        return None
    storage, name = sweeper.get("storage"), sweeper.get("study_name")
    return (str(storage), str(name)) if storage and name else None


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = collect(sweep_dir)
        if not rows:
            return
        table = render(rows)
        text = f"# Sweep summary\n\n{table}\n"
        study = _optuna_study(config)
        if study is not None:
            from pixelsmith.reports.optuna import optuna_section

            text += "\n" + optuna_section(*study, sweep_dir, str(config.get("objective", "objective"))) + "\n"
        (sweep_dir / "summary.md").write_text(text)
        from pixelsmith.reports.html import write_sweep_report

        write_sweep_report(sweep_dir, rows)  # report.html: the jobs side by side, linked to theirs
        failed = sum(r["status"] != "ok" for r in rows)
        log.info(
            "sweep summary (%d jobs, %d failed) -> %s\n%s", len(rows), failed, sweep_dir / "summary.md", table
        )
