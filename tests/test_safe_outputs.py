"""prepare.py never deletes what it did not make: `overwrite=true` replaces only an earlier output of prepare.py
(recognised by its mark and by holding nothing else), a destination that is, lies inside, or would remove the
source is refused, and a failure at any step leaves the old output whole. Each refusal is one paragraph with exit
status 2, and every file under the test's folder is byte-for-byte what it was before the command."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pixelsmith import owned_outputs
from pixelsmith.data import prepare as prepare_module
from pixelsmith.data.prepare import PrepareOptions, main, prepare
from pixelsmith.errors import UnwritableError


def _images(folder: Path, count: int = 3, size: int = 12) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(np.full((size, size, 3), 40 * i, dtype=np.uint8)).save(folder / f"{i}.jpg")
    return folder


def _snapshot(root: Path) -> dict[str, object]:
    """Every entry under `root`: a file's bytes, a link's target, or "dir"."""
    tree: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        key = path.relative_to(root).as_posix()
        if path.is_symlink():
            tree[key] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            tree[key] = "dir"
        else:
            tree[key] = path.read_bytes()
    return tree


def _refused(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(["progress=false", "workers=1", *argv]) == 2
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err and not said.out
    lines = [line for line in said.err.splitlines() if line.strip()]
    assert len(lines) == 1, said.err
    return lines[0]


def _prepared(source: Path, dest: Path, resolution: int = 8, **options) -> Path:
    prepare(PrepareOptions(str(source), str(dest), resolution, workers=1, progress=False, **options))
    return dest


def _folder_of_images_as_dest(tmp: Path) -> list[str]:
    return [f"source={_images(tmp / 'src')}", f"dest={_images(tmp / 'my_photos')}", "format=shards"]


def _working_directory_as_dest(tmp: Path) -> list[str]:
    """The test runs in `tmp`: dest=. is the folder that holds the source and the user's notes."""
    _images(tmp / "src")
    (tmp / "notes.txt").write_text("the user's own notes")
    return ["source=src", "dest=."]


def _source_as_dest(tmp: Path) -> list[str]:
    return [f"source={_images(tmp / 'src')}", f"dest={tmp / 'src'}", "format=shards"]


def _inside_source(tmp: Path) -> list[str]:
    return [f"source={_images(tmp / 'src')}", f"dest={tmp / 'src' / 'out.zip'}"]


def _folder_as_zip_dest(tmp: Path) -> list[str]:
    (tmp / "datasets" / "old").mkdir(parents=True)
    (tmp / "datasets" / "old" / "keep.txt").write_text("kept")
    return [f"source={_images(tmp / 'src')}", f"dest={tmp / 'datasets'}", "format=zip"]


def _a_shards_output_as_zip_dest(tmp: Path) -> list[str]:
    shards = _prepared(_images(tmp / "src"), tmp / "shards", format="shards")
    return [f"source={tmp / 'src'}", f"dest={shards}", "format=zip"]


def _another_programs_zip(tmp: Path) -> list[str]:
    with zipfile.ZipFile(tmp / "backup.zip", "w") as archive:
        archive.writestr("thesis.tex", "the only copy")
    return [f"source={_images(tmp / 'src')}", f"dest={tmp / 'backup.zip'}"]


def _a_prepare_zip_the_user_added_to(tmp: Path) -> list[str]:
    dest = _prepared(_images(tmp / "src"), tmp / "out.zip")
    with zipfile.ZipFile(dest, "a") as archive:  # keeps prepare.py's comment
        archive.writestr("README.txt", "added by hand")
    return [f"source={tmp / 'src'}", f"dest={dest}"]


def _a_shards_output_the_user_added_to(tmp: Path) -> list[str]:
    dest = _prepared(_images(tmp / "src"), tmp / "shards", format="shards")
    (dest / "notes.txt").write_text("mine")
    return [f"source={tmp / 'src'}", f"dest={dest}", "format=shards"]


def _a_link_to_a_prepare_zip(tmp: Path) -> list[str]:
    target = _prepared(_images(tmp / "src"), tmp / "big_disk" / "out.zip")
    (tmp / "link.zip").symlink_to(target)
    return [f"source={tmp / 'src'}", f"dest={tmp / 'link.zip'}"]


def _the_source_zip_itself(tmp: Path) -> list[str]:
    dest = _prepared(_images(tmp / "src"), tmp / "data.zip")
    return [f"source={dest}", f"dest={dest}"]


def _a_listed_image(tmp: Path) -> list[str]:
    """A .txt source names an earlier prepare.py zip among its images, and dest is that zip."""
    old = _prepared(_images(tmp / "src"), tmp / "old.zip")
    (tmp / "list.txt").write_text(f"{tmp / 'src' / '0.jpg'}\n{old}\n")
    return [f"source={tmp / 'list.txt'}", f"dest={old}"]


CASES = {
    "a folder of the user's images": (_folder_of_images_as_dest, "no pixelsmith.json naming prepare.py"),
    "dest=. (the working directory)": (_working_directory_as_dest, "holds the input source=src"),
    "dest=source, format=shards": (_source_as_dest, "is the input source="),
    "dest inside the source": (_inside_source, "lies inside the input source="),
    "a folder as a zip's dest": (_folder_as_zip_dest, "a zip never replaces a folder"),
    "a shards output as a zip's dest": (_a_shards_output_as_zip_dest, "a zip never replaces a folder"),
    "another program's zip": (_another_programs_zip, "comment carries no prepare.py mark"),
    "a prepare zip with a member added": (_a_prepare_zip_the_user_added_to, "holds 'README.txt'"),
    "a shards output with a file added": (_a_shards_output_the_user_added_to, "holds 'notes.txt'"),
    "a link to a prepare zip": (_a_link_to_a_prepare_zip, "symbolic link"),
    "the source zip itself": (_the_source_zip_itself, "is the input source="),
    "an image listed in a .txt source": (_a_listed_image, "listed in source="),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_overwrite_refuses_what_prepare_did_not_write_and_every_file_is_intact(
    case, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    make, words = CASES[case]
    argv = make(tmp_path)
    before = _snapshot(tmp_path)
    message = _refused([*argv, "resolution=8", "overwrite=true"], capsys)
    assert words in message and "nothing was written" in message, message
    assert _snapshot(tmp_path) == before


def test_without_overwrite_an_earlier_output_is_named_and_kept(tmp_path, capsys):
    dest = _prepared(_images(tmp_path / "src"), tmp_path / "out.zip")
    before = _snapshot(tmp_path)
    message = _refused([f"source={tmp_path / 'src'}", f"dest={dest}", "resolution=8"], capsys)
    assert "an earlier output of prepare.py" in message and "overwrite=true" in message
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("fmt", ["zip", "shards"])
def test_an_earlier_prepare_output_is_replaced_and_nothing_is_left_beside_it(tmp_path, fmt):
    pytest.importorskip("litdata") if fmt == "shards" else None
    source = _images(tmp_path / "src")
    dest = tmp_path / ("out.zip" if fmt == "zip" else "shards")
    _prepared(source, dest, 8, format=fmt)
    summary, _, _ = prepare(
        PrepareOptions(str(source), str(dest), 16, format=fmt, overwrite=True, workers=1, progress=False)
    )
    assert summary.written == 3
    if fmt == "zip":
        with zipfile.ZipFile(dest) as archive:
            assert archive.comment == prepare_module.MARK.encode()
            size = Image.open(archive.open("00000/img00000000.png")).size
        assert size == (16, 16)
    else:
        assert '"resolution": 16' in (dest / "pixelsmith.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src", dest.name])  # no .partial, no .old
    assert prepare_module.not_an_earlier_output(dest, fmt) is None  # and the new one is replaceable in turn


@pytest.mark.parametrize("fmt", ["zip", "shards"])
def test_a_failure_mid_write_leaves_the_old_output_intact(tmp_path, monkeypatch, fmt):
    pytest.importorskip("litdata") if fmt == "shards" else None
    source = _images(tmp_path / "src")
    dest = _prepared(source, tmp_path / ("out.zip" if fmt == "zip" else "shards"), format=fmt)
    before = _snapshot(tmp_path)
    real = prepare_module.write_zip if fmt == "zip" else prepare_module.write_shards

    def writes_then_dies(items, options, partial):
        real(items, options, partial)  # the new output exists in full under its temporary name ...
        raise KeyboardInterrupt  # ... and the process is stopped before it is renamed

    monkeypatch.setattr(prepare_module, f"write_{fmt}", writes_then_dies)
    with pytest.raises(KeyboardInterrupt):
        prepare(
            PrepareOptions(str(source), str(dest), 16, format=fmt, overwrite=True, workers=1, progress=False)
        )
    assert _snapshot(tmp_path) == before


def test_a_failed_rename_puts_the_old_shards_folder_back(tmp_path, monkeypatch):
    """The folder swap's middle step fails (the old folder already moved aside): it is moved back, whole."""
    pytest.importorskip("litdata")
    source = _images(tmp_path / "src")
    dest = _prepared(source, tmp_path / "shards", format="shards")
    before = _snapshot(tmp_path)
    real_replace, moves = os.replace, []

    def renaming_the_new_folder_in_fails(src, dst):
        if Path(dst) == dest and str(src).endswith(".partial"):
            moves.append("new in: failed")
            raise OSError(28, "No space left on device")
        if Path(src) == dest or Path(dst) == dest:
            moves.append("old aside" if Path(src) == dest else "old back")
        return real_replace(src, dst)

    monkeypatch.setattr(owned_outputs.os, "replace", renaming_the_new_folder_in_fails)
    with pytest.raises(UnwritableError, match="the disk is full .*kept as it was"):
        prepare(
            PrepareOptions(
                str(source), str(dest), 16, format="shards", overwrite=True, workers=1, progress=False
            )
        )
    assert moves == ["old aside", "new in: failed", "old back"]
    assert _snapshot(tmp_path) == before


def test_a_dest_changed_while_prepare_ran_is_not_replaced(tmp_path, monkeypatch):
    """The check runs again just before the swap: a file the user put into the old shards folder meanwhile stays."""
    pytest.importorskip("litdata")
    source = _images(tmp_path / "src")
    dest = _prepared(source, tmp_path / "shards", format="shards")
    real = prepare_module.write_shards

    def user_adds_a_file_meanwhile(items, options, partial):
        summary = real(items, options, partial)
        (dest / "added_meanwhile.txt").write_text("mine")
        return summary

    monkeypatch.setattr(prepare_module, "write_shards", user_adds_a_file_meanwhile)
    with pytest.raises(prepare_module.PrepareError, match="holds 'added_meanwhile.txt'"):
        prepare(
            PrepareOptions(
                str(source), str(dest), 16, format="shards", overwrite=True, workers=1, progress=False
            )
        )
    assert (dest / "added_meanwhile.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards", "src"]


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("max_images=0", "max_images=0 would take no image"),
        ("max_images=-3", "leave max_images out to take them all"),
        ("workers=0", "workers=0: give the number of decode processes"),
        ("workers=many", "workers=auto"),
        ("chunk_mb=0", "chunk_mb=0: give the shard chunk size"),
    ],
)
def test_a_count_that_means_nothing_is_refused(tmp_path, capsys, option, words):
    message = _refused(
        [f"source={_images(tmp_path / 'src')}", f"dest={tmp_path / 'o.zip'}", "resolution=8", option], capsys
    )
    assert words in message
    assert not (tmp_path / "o.zip").exists()


def test_max_images_takes_that_many(tmp_path):
    summary, _, _ = prepare(
        PrepareOptions(
            str(_images(tmp_path / "src")),
            str(tmp_path / "o.zip"),
            8,
            max_images=2,
            workers=1,
            progress=False,
        )
    )
    assert summary.written == 2
