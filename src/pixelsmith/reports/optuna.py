"""The Optuna part of a sweep's summary: the study's trials, best parameters, parameter importance and a plot.

Written by `pixelsmith.reports.sweep_summary.SweepSummary` at the end of `python train.py -m hparams_search=gan_optuna` from
the study's storage (so it covers every trial of the study, including those of earlier, interrupted invocations):
a markdown section appended to `summary.md` and `optuna_objective.png` (objective per trial and the best so far).

Importance is the absolute Spearman rank correlation between each parameter and the objective over the completed
trials, normalised to sum to 1 (categorical values ranked in their sorted order). It needs no extra package (Optuna's
fANOVA evaluator needs scikit-learn) and reads as "how monotonically the objective follows this parameter";
interactions are not captured.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        stop = start
        while stop + 1 < len(order) and values[order[stop + 1]] == values[order[start]]:
            stop += 1
        for k in range(start, stop + 1):
            ranks[order[k]] = (start + stop) / 2.0  # ties share their mean rank
        start = stop + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx > 0 and sy > 0 else 0.0


def importances(trials: list[dict[str, Any]]) -> dict[str, float]:
    """Normalised |Spearman| of each parameter against the value, over trials with a finite value."""
    done = [t for t in trials if t["value"] is not None and math.isfinite(t["value"])]
    if len(done) < 3:
        return {}
    names = sorted({name for t in done for name in t["params"]})
    raw = {}
    for name in names:
        present = [t for t in done if name in t["params"]]
        raw_values = [t["params"][name] for t in present]
        if all(isinstance(v, int | float) for v in raw_values):
            xs = [float(v) for v in raw_values]
        else:
            categories = sorted({str(v) for v in raw_values})
            xs = [float(categories.index(str(v))) for v in raw_values]
        raw[name] = abs(spearman(xs, [t["value"] for t in present]))
    total = sum(raw.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in sorted(raw.items(), key=lambda kv: -kv[1])}


def load_trials(storage: str, study_name: str) -> tuple[list[dict[str, Any]], str]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    trials = [
        {
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "params": dict(t.params),
            "reported": dict(t.intermediate_values),
        }
        for t in study.trials
    ]
    return trials, study.direction.name


def plot(trials: list[dict[str, Any]], minimize: bool, path: Path, title: str) -> None:
    """Objective per trial (dots) and the best so far (line), as a PNG (Pillow only)."""
    done = [t for t in trials if t["value"] is not None and math.isfinite(t["value"])]
    width, height, margin = 720, 400, 60
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((margin, 15), title, fill="black")
    draw.line([(margin, height - margin), (width - 20, height - margin)], fill="black")
    draw.line([(margin, 40), (margin, height - margin)], fill="black")
    if done:
        values = [t["value"] for t in done]
        low, high = min(values), max(values)
        span = (high - low) or 1.0
        last = max(t["number"] for t in done) or 1

        def at(number: int, value: float) -> tuple[float, float]:
            x = margin + (width - 20 - margin) * number / last
            y = height - margin - (height - margin - 40) * (value - low) / span
            return x, y

        best, line = None, []
        for t in sorted(done, key=lambda t: t["number"]):
            best = (
                t["value"] if best is None else (min(best, t["value"]) if minimize else max(best, t["value"]))
            )
            line.append(at(t["number"], best))
            x, y = at(t["number"], t["value"])
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=(31, 119, 180))
        if len(line) > 1:
            draw.line(line, fill=(214, 39, 40), width=2)
        draw.text((5, 40), f"{high:.4g}", fill="black")
        draw.text((5, height - margin - 10), f"{low:.4g}", fill="black")
        draw.text((width // 2 - 60, height - margin + 15), f"trial 0 .. {last}", fill="black")
        draw.text((width - 260, 15), "dots: trials   line: best so far", fill="black")
    image.save(path)


def optuna_section(storage: str, study_name: str, sweep_dir: Path, objective: str) -> str:
    trials, direction = load_trials(storage, study_name)
    minimize = direction == "MINIMIZE"
    plot(trials, minimize, sweep_dir / "optuna_objective.png", f"{study_name}: {objective} per trial")
    done = [t for t in trials if t["value"] is not None and math.isfinite(t["value"])]
    lines = [f"## Optuna study `{study_name}` ({direction.lower()} {objective})", ""]
    lines.append(
        f"Storage `{storage}`: {len(trials)} trials, {len(done)} with a value. ![](optuna_objective.png)"
    )
    if done:
        best = (min if minimize else max)(done, key=lambda t: t["value"])
        lines += ["", f"Best: trial {best['number']}, {objective} = {best['value']:.4g}, with"]
        lines += [f"- `{name}={value}`" for name, value in sorted(best["params"].items())]
    weights = importances(trials)
    if weights:
        lines += ["", "| parameter | importance (normalised \\|Spearman\\|) |", "|---|---:|"]
        lines += [f"| `{name}` | {weight:.2f} |" for name, weight in weights.items()]
    else:
        lines += ["", "Parameter importance needs at least 3 trials with a value."]
    lines += [
        "",
        "| trial | state | value | last evaluation reported | parameters |",
        "|---:|---|---:|---|---|",
    ]
    for t in trials:
        value = f"{t['value']:.4g}" if t["value"] is not None else ""
        reported = max(t["reported"], default=None)
        last = f"{reported}: {t['reported'][reported]:.4g}" if reported is not None else ""
        params = " ".join(f"{k}={v}" for k, v in sorted(t["params"].items()))
        lines.append(f"| {t['number']} | {t['state'].lower()} | {value} | {last} | {params} |")
    return "\n".join(lines)
