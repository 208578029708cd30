"""convert.py's destination: `overwrite=true` replaces only a checkpoint convert.py wrote (the mark in its zip
comment), never a folder, a link, the source or another file; a place that cannot be written is refused before the
pickle is read. Each refusal is one paragraph with exit status 2, and every file in the test's folder is intact."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from pixelsmith.errors import PixelsmithError
from pixelsmith.gan.convert import MARK
from pixelsmith.gan.convert import main as convert_main
from tests.test_gan_pretrained import RESNET
from tests.test_safe_outputs import _snapshot


def _refused(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert convert_main(argv) == 2
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err and not said.out
    lines = [line for line in said.err.splitlines() if line.strip()]
    assert len(lines) == 1, said.err
    return lines[0]


def _a_folder(tmp: Path) -> Path:
    (tmp / "runs" / "keep.txt").parent.mkdir(parents=True)
    (tmp / "runs" / "keep.txt").write_text("kept")
    return tmp / "runs"


def _a_users_file(tmp: Path) -> Path:
    (tmp / "notes.ckpt").write_text("not a checkpoint at all")
    return tmp / "notes.ckpt"


def _another_checkpoint(tmp: Path) -> Path:
    torch.save({"state_dict": {"w": torch.ones(3)}}, tmp / "trained.ckpt")  # a zip, without convert.py's mark
    return tmp / "trained.ckpt"


def _a_link(tmp: Path) -> Path:
    (tmp / "elsewhere.ckpt").write_bytes(b"x")
    (tmp / "link.ckpt").symlink_to(tmp / "elsewhere.ckpt")
    return tmp / "link.ckpt"


CASES = {
    "a folder": (_a_folder, "is a folder: give the checkpoint's file name"),
    "the user's file": (_a_users_file, "exists and is not a checkpoint convert.py wrote"),
    "another checkpoint": (_another_checkpoint, "exists and is not a checkpoint convert.py wrote"),
    "a symbolic link": (_a_link, "exists and is a symbolic link"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_overwrite_refuses_what_convert_did_not_write(tmp_path, capsys, case):
    make, words = CASES[case]
    dest = make(tmp_path)
    before = _snapshot(tmp_path)
    message = _refused([f"source={RESNET}", f"dest={dest}", "overwrite=true"], capsys)
    assert words in message, message
    assert _snapshot(tmp_path) == before


def test_the_source_itself_is_refused(tmp_path, capsys):
    source = tmp_path / "network.bin"  # not named .pkl, so only the source check stands in the way
    shutil.copy(RESNET, source)
    message = _refused([f"source={source}", f"dest={source}", "overwrite=true"], capsys)
    assert "is the source pickle itself" in message
    assert source.read_bytes() == RESNET.read_bytes()


@pytest.mark.parametrize("dest", ["/proc/out.ckpt", "/proc/pixelsmith-test/out.ckpt"])
def test_a_dest_that_cannot_be_written_is_refused_before_the_pickle_is_read(capsys, monkeypatch, dest):
    import pixelsmith.gan.pretrained as pretrained

    def must_not_run(*args, **kwargs):
        raise AssertionError("the pickle was read before the dest was checked")

    monkeypatch.setattr(pretrained, "checkpoint_from_pickle", must_not_run)
    message = _refused([f"source={RESNET}", f"dest={dest}"], capsys)
    assert f"dest={dest} cannot be written" in message


def test_an_earlier_convert_output_is_replaced_only_with_overwrite(tmp_path, capsys):
    dest = tmp_path / "net.ckpt"
    assert convert_main([f"source={RESNET}", f"dest={dest}"]) == 0
    with zipfile.ZipFile(dest) as archive:
        assert archive.comment == MARK
    first = dest.read_bytes()
    message = _refused([f"source={RESNET}", f"dest={dest}"], capsys)
    assert "exists (a checkpoint convert.py wrote)" in message and "overwrite=true" in message
    assert dest.read_bytes() == first
    assert convert_main([f"source={RESNET}", f"dest={dest}", "overwrite=true"]) == 0
    assert torch.load(dest, weights_only=True)["pixelsmith"]["iteration"] == 0  # a whole checkpoint, loadable
    assert [p.name for p in tmp_path.iterdir()] == ["net.ckpt"]  # nothing left beside it


def test_a_users_file_with_a_marked_checkpoint_appended_is_not_convert_s_own(tmp_path):
    """A zip reader accepts bytes before an archive: a file of the user's followed by a copy of convert's output is
    not convert's output (its first byte is not the archive's), and neither is a marked zip that holds other members
    than torch.save writes."""
    from pixelsmith.gan.convert import check_dest
    from pixelsmith.gan.pretrained import save_atomically

    save_atomically({"w": torch.zeros(3)}, tmp_path / "ours.ckpt", zip_comment=MARK)
    check_dest(str(tmp_path / "net.pkl"), str(tmp_path / "ours.ckpt"), tmp_path / "ours.ckpt", overwrite=True)
    glued = tmp_path / "glued.ckpt"
    glued.write_bytes(b"the user's notes\n" * 100 + (tmp_path / "ours.ckpt").read_bytes())
    forged = tmp_path / "forged.ckpt"
    with zipfile.ZipFile(forged, "w") as archive:
        archive.writestr("thesis.tex", "the user's")
        archive.comment = MARK
    for path in (glued, forged):
        before = path.read_bytes()
        with pytest.raises(PixelsmithError, match="not a checkpoint convert.py wrote"):
            check_dest(str(tmp_path / "net.pkl"), str(path), path, overwrite=True)
        assert path.read_bytes() == before
