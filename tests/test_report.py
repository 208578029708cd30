"""report.html: one self-contained page per run, with its curves, evaluation, samples, performance and config; and
rendered in a real browser (headless Chromium) where one is installed."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from pixelsmith.run.fit import run
from tests.conftest import eval_overrides

EVAL = eval_overrides()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from tests.conftest import FAST, SMALL, compose_config

    out = tmp_path_factory.mktemp("report") / "run"
    cfg = compose_config(
        [
            *FAST,
            *SMALL["dcgan"],
            *EVAL,
            "precision=32-true",
            "max_steps=6",
            "train.sample_every_n_steps=2",
            "train.log_every_n_steps=1",
            "profiler=breakdown",
        ],
        out,
    )
    run(cfg)
    return out / "report.html"


def test_every_run_writes_a_self_contained_report(report):
    page = report.read_text()
    assert "<script" not in page and not re.search(
        r'(src|href)="(https?:|file:|/)', page
    )  # nothing outside it
    assert page.count("data:image/png;base64,") == 4  # sample grids at iterations 0, 2, 4, 6
    for title in (
        "Losses",
        "Learning rates",
        "Gradient norms",
        "Throughput (img/s)",
        "eval: fid",
        "eval: precision, recall",
        "Step-time breakdown (median per iteration)",
    ):
        assert f">{title}<" in page, title
    losses = re.search(r">Losses<.*?</svg>", page, re.S).group(0)
    assert [len(p.split()) for p in re.findall(r'points="([^"]+)"', losses)] == [
        6,
        6,
    ]  # loss/D, loss/G x 6 logs
    assert "stop_reason" in page and "max_steps: 6" in page  # result and the resolved config


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    pytest.skip(
        "Chromium is not installed here (no chromium, chromium-browser or google-chrome on PATH), so report.html "
        "is not rendered in a real browser: `apt-get install chromium` (Debian), as .ci/run does where it can"
    )


@pytest.mark.chromium
@pytest.mark.slow  # a subprocess: the full run (`pytest --all`) only
def test_headless_chromium_renders_the_images_and_charts(report, tmp_path):
    browser = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [browser, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count("<img") == 4 and dom.count("<svg") >= 8  # as parsed and laid out by the browser
    shot = tmp_path / "report.png"
    subprocess.run(
        [browser, *flags, f"--screenshot={shot}", "--window-size=1280,2600", report.as_uri()],
        capture_output=True,
        timeout=120,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)
    blue = np.all(np.abs(pixels.astype(int) - [31, 119, 180]) < 12, axis=1).sum()  # chart lines and bars
    grey = np.all(np.abs(pixels.astype(int) - 127) < 30, axis=1).sum()  # the (early, grey) sample grids
    assert blue > 2000 and grey > 20000, (blue, grey)
