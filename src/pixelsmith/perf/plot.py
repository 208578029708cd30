"""Horizontal bar charts as PNG, drawn with Pillow (already a dependency; matplotlib is not, and two simple charts
do not justify ~40 MB of it): the region shares of a step-time breakdown and the images/s of a benchmark matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

SERIES_COLOURS = ["#3b6fb6", "#e08a2c", "#4f9d5b", "#b8433f", "#7d5ba6"]


@dataclass
class Bar:
    value: float
    low: float | None = None  # whisker (e.g. min of the repeats); None draws none
    high: float | None = None


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow built without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def bar_chart(
    path: Path,
    title: str,
    labels: Sequence[str],
    series: Sequence[Sequence[Bar]],
    series_names: Sequence[str],
    value_format: str = "{:.1f}",
    unit: str = "",
) -> Path:
    """One group of bars per label (one bar per series), values written at the bar ends."""
    font, small = _font(14), _font(12)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    label_width = max([probe.textlength(text, font=font) for text in labels] + [60]) + 20
    bar_h, gap, plot_w = 16, 10, 560
    group_h = bar_h * len(series) + gap
    top = 40 + (22 if len(series) > 1 else 0)
    height = int(top + group_h * len(labels) + 40)
    width = int(label_width + plot_w + 150)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((10, 10), title, fill="black", font=font)
    if len(series) > 1:
        x = 10
        for index, name in enumerate(series_names):
            draw.rectangle([x, 36, x + 12, 48], fill=SERIES_COLOURS[index % len(SERIES_COLOURS)])
            draw.text((x + 16, 34), name, fill="black", font=small)
            x += int(probe.textlength(name, font=small)) + 40
    peak = max((b.high if b.high is not None else b.value) for bars in series for b in bars) or 1.0
    scale = plot_w / peak
    x0 = label_width
    for row, label in enumerate(labels):
        y = top + row * group_h
        draw.text((10, y + (group_h - gap) / 2 - 8), label, fill="black", font=font)
        for index, bars in enumerate(series):
            bar = bars[row]
            yb = y + index * bar_h
            colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
            draw.rectangle([x0, yb + 2, x0 + max(1.0, bar.value * scale), yb + bar_h - 2], fill=colour)
            end = x0 + bar.value * scale
            if bar.low is not None and bar.high is not None:
                lo, hi = x0 + bar.low * scale, x0 + bar.high * scale
                mid = yb + bar_h / 2
                draw.line([lo, mid, hi, mid], fill="black", width=1)
                draw.line([lo, yb + 4, lo, yb + bar_h - 4], fill="black", width=1)
                draw.line([hi, yb + 4, hi, yb + bar_h - 4], fill="black", width=1)
                end = max(end, hi)
            draw.text((end + 6, yb + 1), value_format.format(bar.value) + unit, fill="black", font=small)
    draw.line([x0, top - 4, x0, height - 30], fill="#888888", width=1)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path
