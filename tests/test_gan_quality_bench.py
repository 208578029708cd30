"""benchmarks/quality.py: FID-against-time rows, run end to end on a tiny budget, and the table's reading of a curve."""

from __future__ import annotations

import json

import pytest

from benchmarks.arguments import CommandLineError
from benchmarks.quality import parse_args, quality_markdown, row_command, run_rows, value_at

pytestmark = pytest.mark.bench

CURVE = [
    {"iteration": 0, "kimg": 0.0, "seconds": 8.0, "fid": 1190.0},
    {"iteration": 100, "kimg": 6.4, "seconds": 70.0, "fid": 200.0},
    {"iteration": 200, "kimg": 12.8, "seconds": 131.0, "fid": 90.0},
]


def test_the_table_reads_the_last_evaluation_a_user_stopping_there_would_have():
    assert value_at(CURVE, "seconds", 69.9) == 1190.0
    assert value_at(CURVE, "seconds", 70.0) == 200.0
    assert value_at(CURVE, "kimg", 100.0) == 90.0
    assert value_at(CURVE, "seconds", 5.0) is None
    report = {
        "created": "now",
        "machine": {"cpu_count": 2, "load_average": [0.1, 0.1, 0.1]},
        "budget": {"minutes": 2.0, "kimg": None, "eval_every": 100},
        "hardware": "cpu",
        "rows": {"dcgan": {"overrides": [], "curve": CURVE, "iterations": 210.0, "error": None}},
    }
    row = quality_markdown(report).splitlines()[-1]
    # quarter (30 s): 1190; half (60 s): 1190; three quarters (90 s): 200; final 90; best 90; 210 iterations
    assert row.startswith("| dcgan | 1190.0 | 1190.0 | 200.0 | 90.0 | 90.0 | 210 | 0.624 |"), row


def test_rows_get_the_same_budget_and_evaluation_cadence(tmp_path):
    args = parse_args(["--minutes", "3", "--eval-every", "50", "--row", "narrow=model.generator.ngf=8"])
    command = row_command(["model.generator.ngf=8"], args, tmp_path / "narrow")
    assert "train.time_budget_minutes=3.0" in command and "eval.every_n_steps=50" in command
    by_images = parse_args(["--kimg", "6.4", "--hardware", "cpu"])
    command = row_command(["data.batch_size=32"], by_images, tmp_path / "small")
    assert "max_steps=200" in command and "train.time_budget_minutes=null" in command  # 6400 images / 32
    with pytest.raises(CommandLineError, match="unknown row.*nonexistent"):
        parse_args(["--rows", "nonexistent"])


@pytest.mark.slow
def test_two_rows_train_and_the_table_names_both(tmp_path):
    tiny = "model.generator.ngf=8 model.discriminator.ndf=8 data.batch_size=16 data.limit=256 eval.num_samples=256"
    args = parse_args(
        ["--rows", "--row", f"a={tiny}", "--row", f"b={tiny} seed=7", "--kimg", "0.32", "--eval-every", "10"]
        + ["--hardware", "cpu", "--out", str(tmp_path)]
    )
    report = run_rows(args)
    assert set(report["rows"]) == {"a", "b"} and not any(r["error"] for r in report["rows"].values())
    for row in report["rows"].values():
        assert [p["iteration"] for p in row["curve"]] == [0.0, 10.0, 20.0]
        assert row["iterations"] == 20
    saved = json.loads((tmp_path / "quality.json").read_text())
    assert saved["rows"]["a"]["curve"] == report["rows"]["a"]["curve"]
    assert (
        "| a |" in (tmp_path / "quality.md").read_text() and "| b |" in (tmp_path / "quality.md").read_text()
    )
