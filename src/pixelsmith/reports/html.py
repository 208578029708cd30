"""`report.html`: one self-contained page per run (and one per sweep) that opens offline in any browser.

Everything is inside the file: charts are inline SVG drawn here (no JavaScript, no CDN), images are base64 PNGs. A run
report shows the stop reason and final metrics, the loss, learning-rate, gradient-norm and throughput curves from
`metrics.csv`, the evaluation curves (FID, KID, precision/recall from `eval_history.json`; a model's validation
metrics from any `<name>_validation.json` history its callbacks write), sample grids over time, the
step-time breakdown and throughput/MFU/memory when the run was profiled (`perf/`), and the resolved config. A sweep
report (`pixelsmith.reports.sweep_summary`) compares its jobs: objective per job, their overrides and links to their reports.

    python -m pixelsmith.reports.html outputs/train/runs/<run>      # (re)write a run's report by hand
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import sys
from pathlib import Path
from typing import Any

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: .9em; } td, th { border: 1px solid #ddd; padding: .25em .6em; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; } figure { margin: 0; } figcaption { font-size: .85em; }
.samples img { max-width: 280px; image-rendering: pixelated; border: 1px solid #ccc; }
.samples { display: flex; flex-wrap: wrap; gap: .8em; } pre { background: #f6f6f6; padding: 1em; overflow: auto; }
"""


def _esc(text: Any) -> str:
    return html.escape(str(text))


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else _esc(value)


def svg_chart(
    title: str, series: dict[str, list[tuple[float, float]]], width: int = 560, height: int = 300
) -> str:
    """A line chart of (x, y) series as inline SVG, with axes, extreme values and a legend."""
    points = [p for values in series.values() for p in values if math.isfinite(p[1])]
    if not points:
        return ""
    left, right, top, bottom = 60, 20, 30, 40
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    sx, sy = (x1 - x0) or 1.0, (y1 - y0) or 1.0

    def xy(x: float, y: float) -> str:
        return (
            f"{left + (width - left - right) * (x - x0) / sx:.1f},"
            f"{height - bottom - (height - top - bottom) * (y - y0) / sy:.1f}"
        )

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{_esc(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#444"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#444"/>',
        f'<text x="4" y="{top + 10}" font-size="11">{y1:.4g}</text>',
        f'<text x="4" y="{height - bottom}" font-size="11">{y0:.4g}</text>',
        f'<text x="{left}" y="{height - 22}" font-size="11">{x0:g}</text>',
        f'<text x="{width - right - 40}" y="{height - 22}" font-size="11">{x1:g}</text>',
    ]
    for index, (name, values) in enumerate(series.items()):
        color = PALETTE[index % len(PALETTE)]
        finite = [p for p in values if math.isfinite(p[1])]
        if len(finite) > 1:
            path = " ".join(xy(x, y) for x, y in finite)
            parts.append(
                f'<polyline class="series" fill="none" stroke="{color}" stroke-width="1.8" points="{path}"/>'
            )
        for x, y in finite if len(finite) <= 40 else []:
            cx, cy = xy(x, y).split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
        parts.append(
            f'<text x="{left + 10 + 130 * (index % 4)}" y="{height - 6 - 0 * index}" font-size="11" '
            f'fill="{color}">{_esc(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def svg_bars(title: str, bars: list[tuple[str, float]], unit: str, width: int = 560) -> str:
    if not bars:
        return ""
    height = 40 + 22 * len(bars)
    peak = max(v for _, v in bars) or 1.0
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="18" font-size="13" font-weight="bold">{_esc(title)}</text>',
    ]
    for index, (label, value) in enumerate(bars):
        y = 30 + 22 * index
        length = (width - 260) * value / peak
        parts.append(f'<text x="10" y="{y + 13}" font-size="11">{_esc(label)}</text>')
        parts.append(f'<rect x="150" y="{y}" width="{length:.1f}" height="16" fill="{PALETTE[0]}"/>')
        parts.append(f'<text x="{155 + length:.1f}" y="{y + 13}" font-size="11">{value:.3g} {unit}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _png_tag(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(caption)}"><figcaption>{_esc(caption)}</figcaption></figure>'


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _metric_series(run_dir: Path) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return series
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            x = row.get("train/iteration") or row.get("step")
            if not x:
                continue
            for key, value in row.items():
                if key in ("step", "train/iteration", "epoch") or not value:
                    continue
                try:
                    series.setdefault(key, []).append((float(x), float(value)))
                except ValueError:
                    continue
    return series


def _grouped_charts(series: dict[str, list[tuple[float, float]]]) -> list[str]:
    groups = {
        "Losses": lambda k: k.startswith("loss/"),
        "Learning rates": lambda k: k.startswith("lr/"),
        "Gradient norms": lambda k: k.startswith("grad_norm/"),
        "Throughput (img/s)": lambda k: k == "img/s",
        "Logits": lambda k: k.startswith("logits/"),
        "Augmentation": lambda k: k.startswith("augment/"),
    }
    return [
        chart
        for title, wanted in groups.items()
        if (chart := svg_chart(title, {k: v for k, v in series.items() if wanted(k)}))
    ]


# Evaluation scores drawn together (one chart per group); any other numeric score gets a chart of its own.
HISTORY_GROUPS = (("fid",), ("kid_mean",), ("precision", "recall"), ("inception_score",))
HISTORY_SKIPPED = {"iteration", "num_generated", "num_real", "kid_std", "kimg", "seconds"}


def _history_charts(history: list[dict[str, Any]], prefix: str) -> list[str]:
    keys = {
        k for h in history for k, v in h.items() if k not in HISTORY_SKIPPED and isinstance(v, int | float)
    }
    grouped = {k for group in HISTORY_GROUPS for k in group}
    groups = [[k for k in group if k in keys] for group in HISTORY_GROUPS]
    groups += [[k] for k in sorted(keys - grouped)]
    charts = [
        svg_chart(
            f"{prefix}{', '.join(group)}",
            {k: [(h["iteration"], h[k]) for h in history if k in h] for k in group},
        )
        for group in groups
        if group
    ]
    return [c for c in charts if c]


def _samples(run_dir: Path, limit: int = 8) -> str:
    files = sorted((run_dir / "samples").glob("step_*.png"))
    if not files:
        return ""
    count = min(limit, len(files))  # evenly spread over the run, first and last included
    picked = [files[round(i * (len(files) - 1) / max(1, count - 1))] for i in range(count)]
    picked = list(dict.fromkeys(picked))
    tags = [_png_tag(p, f"iteration {int(p.stem.split('_')[1])}") for p in picked]
    return '<div class="samples">' + "".join(tags) + "</div>"


def _table(pairs: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in pairs.items())
    return f"<table>{rows}</table>"


def _page(title: str, body: list[str]) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{_esc(title)}</h1>" + "\n".join(body) + "</body></html>\n"
    )


def write_run_report(run_dir: Path) -> Path:
    """Write `<run_dir>/report.html` from what the run wrote; returns its path."""
    run_dir = Path(run_dir)
    body: list[str] = [f"<p>Run dir: <code>{_esc(run_dir)}</code></p>"]
    final = _read_json(run_dir / "final_metrics.json") or {}
    if final:
        headline = {k: final[k] for k in ("stop_reason", "iteration", "eval/best_fid", "img/s") if k in final}
        body += ["<h2>Result</h2>", _table(headline)]
    charts = _grouped_charts(_metric_series(run_dir))
    evaluation = _read_json(run_dir / "eval_history.json") or {}
    charts += _history_charts(evaluation.get("history", []), "eval: ")
    # Any model's validation history (a list of {"iteration": ..., metric: value}): general code names no model.
    for path in sorted(run_dir.glob("*_validation.json")):
        history = _read_json(path)
        if isinstance(history, list):
            charts += _history_charts(history, f"{path.stem.replace('_', ' ')}: ")
    if charts:
        body += ["<h2>Curves</h2>", '<div class="charts">' + "".join(charts) + "</div>"]
    samples = _samples(run_dir)
    if samples:
        body += ["<h2>Samples over time</h2>", samples]
    breakdown = _read_json(run_dir / "perf" / "breakdown.json")
    throughput = _read_json(run_dir / "perf" / "throughput.json")
    if breakdown or throughput:
        body.append("<h2>Performance</h2>")
        if breakdown:
            bars = [
                (r["phase"], float(r.get("median_ms", r.get("mean_ms", 0.0))))
                for r in breakdown.get("rows", [])
            ]
            body.append(svg_bars("Step-time breakdown (median per iteration)", bars, "ms"))
        if throughput:
            body.append(_table({k: v for k, v in throughput.items() if isinstance(v, int | float | str)}))
    if final:
        body += ["<h2>Final metrics</h2>", _table({k: v for k, v in sorted(final.items())})]
    config = run_dir / "config_resolved.yaml"
    if config.is_file():
        body += [
            "<h2>Config</h2>",
            f"<details><summary>config_resolved.yaml</summary><pre>{_esc(config.read_text())}</pre></details>",
        ]
    path = run_dir / "report.html"
    partial = run_dir / ".report.html.partial"
    partial.write_text(_page(f"Pixelsmith run {run_dir.name}", body))
    partial.replace(path)
    return path


def write_sweep_report(sweep_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """`<sweep_dir>/report.html`: the jobs side by side (rows as `sweep_summary.collect` reads them)."""
    sweep_dir = Path(sweep_dir)
    objective = next((r["objective"] for r in rows if r.get("objective")), "objective")
    ok = [
        r
        for r in rows
        if r["status"] == "ok" and isinstance(r.get("value"), float) and math.isfinite(r["value"])
    ]
    body = [f"<p>Sweep dir: <code>{_esc(sweep_dir)}</code>; {len(rows)} jobs, {len(ok)} with a value.</p>"]
    chart = svg_chart(
        f"{objective} per job",
        {objective: sorted((float(r["dir"]), r["value"]) for r in ok if r["dir"].isdigit())},
    )
    if chart:
        body += ["<h2>Objective</h2>", chart]
    lines = [
        "<table><tr><th>job</th><th>status</th><th>"
        + _esc(objective)
        + "</th><th>overrides</th><th>report</th></tr>"
    ]
    for row in sorted(rows, key=lambda r: (r not in ok, r.get("value") if r in ok else 0.0)):
        link = (
            f'<a href="{_esc(row["dir"])}/report.html">report</a>'
            if (sweep_dir / row["dir"] / "report.html").is_file()
            else ""
        )
        value = _fmt(row["value"]) if row in ok else _esc(row.get("error", ""))[:160]
        overrides = _esc(" ".join(row.get("overrides", [])))
        lines.append(
            f"<tr><td>{_esc(row['dir'])}</td><td>{_esc(row['status'])}</td><td>{value}</td><td>{overrides}</td><td>{link}</td></tr>"
        )
    body += ["<h2>Jobs</h2>", "".join(lines) + "</table>"]
    plot = sweep_dir / "optuna_objective.png"
    if plot.is_file():
        body += ["<h2>Optuna study</h2>", _png_tag(plot, "objective per trial and the best so far")]
    path = sweep_dir / "report.html"
    path.write_text(_page(f"Pixelsmith sweep {sweep_dir.name}", body))
    return path


if __name__ == "__main__":
    for argument in sys.argv[1:] or ["."]:
        print(write_run_report(Path(argument)))
