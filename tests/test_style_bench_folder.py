"""The folder benchmark (`benchmarks/style_folder.py`) runs ours and the peer loop side by side and prints a table
whose ratio column is ours / peer."""

from __future__ import annotations

import re

import pytest

from benchmarks import style_folder

pytestmark = pytest.mark.bench


def test_the_folder_bench_prints_ours_and_the_peer_per_size_and_format(capsys):
    tiny = [
        "--sizes",
        "96x64",
        "--images",
        "2",
        "--repeats",
        "1",
        "--base-channels",
        "4",
        "--residual-blocks",
        "1",
    ]
    assert style_folder.main([*tiny, "--formats", "png", "jpg", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"\| 96x64 \| (png|jpg) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|", out)
    assert [r[0] for r in rows] == ["png", "jpg"], out
    for _, ours, peer, ratio in rows:
        assert float(ours) > 0 and float(peer) > 0
        assert float(ratio) == pytest.approx(float(ours) / float(peer), abs=0.01)


def test_sizes_are_named_or_given_as_width_x_height():
    assert style_folder.parse_size("8k") == ("8K", 7680, 4320)
    assert style_folder.parse_size("640x360") == ("640x360", 640, 360)


def test_the_peer_can_run_once_on_fewer_images(monkeypatch, capsys):
    """--peer-once --peer-images 1: the peer loop runs once per cell (not in the warm-up round, not every repeat) on
    one image, and its rate is per image it did."""
    calls: list[int] = []

    def counted_peer(net, sources, out, suffix, device):
        calls.append(len(sources))
        return 0.5 * len(sources)  # 2 images/s, whatever the count

    monkeypatch.setattr(style_folder, "peer_folder", counted_peer)
    tiny = [
        "--sizes",
        "64x48",
        "--images",
        "2",
        "--repeats",
        "2",
        "--base-channels",
        "4",
        "--residual-blocks",
        "1",
    ]
    assert (
        style_folder.main([*tiny, "--formats", "png", "--device", "cpu", "--peer-images", "1", "--peer-once"])
        == 0
    )
    assert calls == [1]
    rows = re.findall(r"\| 64x48 \| png \| ([\d.]+) \| ([\d.]+) \|", capsys.readouterr().out)
    assert float(rows[0][1]) == pytest.approx(2.0)
