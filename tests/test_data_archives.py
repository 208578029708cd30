"""Dataset archives (`data=zip`) and the prepare command (`python prepare.py`): NVlabs' dataset_tool layout read in
place (member names, `dataset.json` labels as NVlabs' `training/dataset.py` reads them), one zip handle per loader
worker, labels reaching the objective, each conversion option checked on pixels, byte-identical reruns, no
half-written archive after a crash, and bad data (a corrupt member, a truncated zip, a broken dataset.json) stopping
or skipping with one paragraph naming the file and the fix."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from pixelsmith.data.archive import ArchiveDataset, ArchiveError, ArchiveSource, ZipDataModule
from pixelsmith.data.prepare import PrepareError, PrepareOptions, main, prepare
from pixelsmith.run.fit import run
from tests.conftest import FAST, compose_config, last_checkpoint, run_cli


def _save(path: Path, array: np.ndarray, mode: str | None = None, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode=mode).save(path, **kwargs)
    return path


def _classes_folder(root: Path, per_class: int = 4) -> Path:
    """cats/ and dogs/ of flat 40x60 images (grey level = 10 x index + 100 x class), plus one broken file."""
    for label, name in enumerate(("cats", "dogs")):
        for i in range(per_class):
            level = 10 * i + 100 * label
            _save(root / name / f"{i}.png", np.full((40, 60, 3), level, dtype=np.uint8))
    (root / "dogs" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return root


def _zip_of(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _png(level: int, size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), level, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


# ---- the prepare command --------------------------------------------------------------------------------------
def test_a_folder_of_class_subfolders_becomes_nvlabs_zip_with_labels_and_a_summary(tmp_path, capsys):
    source = _classes_folder(tmp_path / "images")
    assert main([f"source={source}", f"dest={tmp_path / 'out.zip'}", "resolution=16", "progress=false"]) == 0
    said = capsys.readouterr().out
    assert "wrote 8 images" in said and "2 classes (cats, dogs)" in said
    assert "skipped 1: 1 UnidentifiedImageError" in said and "dogs/broken.jpg" in said
    with zipfile.ZipFile(tmp_path / "out.zip") as archive:
        names = sorted(archive.namelist())
        table = json.loads(archive.read("dataset.json"))["labels"]
        first = Image.open(io.BytesIO(archive.read("00000/img00000000.png")))
        assert first.size == (16, 16) and first.mode == "RGB"
    # dataset_tool's layout: 00000/img00000000.png ... and dataset.json [[name, label], ...] (sorted inputs).
    assert names == [*(f"00000/img{i:08d}.png" for i in range(8)), "dataset.json"]
    assert [label for _, label in table] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert (
        ArchiveSource(tmp_path / "out.zip").label_tensor([n for n, _ in table]).tolist() == [0] * 4 + [1] * 4
    )


def test_running_prepare_twice_gives_the_same_bytes(tmp_path):
    source = _classes_folder(tmp_path / "images")
    for name, workers in (("a.zip", "1"), ("b.zip", "2")):
        main(
            [
                f"source={source}",
                f"dest={tmp_path / name}",
                "resolution=16",
                "progress=false",
                f"workers={workers}",
            ]
        )
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


def test_a_crash_midway_leaves_no_half_written_archive_and_the_old_one_intact(tmp_path, monkeypatch):
    source = _classes_folder(tmp_path / "images")
    dest = tmp_path / "out.zip"
    prepare(PrepareOptions(str(source), str(dest), 8, workers=1, progress=False))  # the previous archive
    previous = dest.read_bytes()
    from pixelsmith.data import prepare as module

    calls = {"n": 0}
    real = module.process

    def dies_on_the_third(item, options):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(item, options)

    monkeypatch.setattr(module, "process", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        prepare(PrepareOptions(str(source), str(dest), 16, workers=1, overwrite=True, progress=False))
    assert dest.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "out.zip"]  # no .partial left
    with pytest.raises(
        PrepareError, match="exists \\(an earlier output of prepare.py\\); set overwrite=true"
    ):
        prepare(PrepareOptions(str(source), str(dest), 16, workers=1, progress=False))


def test_each_conversion_option_on_pixels(tmp_path):
    src = tmp_path / "src"
    # RGBA: left half opaque red, right half fully transparent (its hidden colour green must not show).
    rgba = np.zeros((8, 16, 4), dtype=np.uint8)
    rgba[:, :8] = (255, 0, 0, 255)
    rgba[:, 8:] = (0, 255, 0, 0)
    _save(src / "a_rgba.png", rgba, mode="RGBA")
    # 16-bit grey at 32896 (= 128 x 257) and a ramp for stretch.
    _save(src / "b_grey16.png", np.full((8, 8), 32896, dtype=np.uint16))
    ramp = np.linspace(1000, 2000, 64, dtype=np.uint16).reshape(8, 8)
    _save(src / "c_ramp16.png", ramp)

    def member(options: PrepareOptions, index: int) -> np.ndarray:
        prepare(options)
        with zipfile.ZipFile(options.dest) as archive:
            return np.asarray(Image.open(io.BytesIO(archive.read(f"00000/img{index:08d}.png"))))

    common = dict(source=str(src), workers=1, progress=False, labels="none")
    padded = member(
        PrepareOptions(
            dest=str(tmp_path / "pad.zip"), resolution=16, transform="pad", background="white", **common
        ),
        0,
    )
    # pad: the 16x8 image fills the width, white bands above and below; transparent pixels composited onto white.
    assert padded.shape == (16, 16, 3)
    assert (padded[0] == 255).all() and (padded[-1] == 255).all()
    assert tuple(padded[8, 2]) == (255, 0, 0) and tuple(padded[8, 13]) == (255, 255, 255)
    cropped = member(
        PrepareOptions(dest=str(tmp_path / "crop.zip"), resolution=8, filter="nearest", **common), 0
    )
    assert (
        cropped.shape == (8, 8, 3)
        and tuple(cropped[4, 0]) == (255, 0, 0)
        and tuple(cropped[4, 7]) == (0, 0, 0)
    )
    grey = member(PrepareOptions(dest=str(tmp_path / "grey.zip"), resolution=8, channels=1, **common), 1)
    assert grey.shape == (8, 8) and (grey == 128).all()  # 32896 / 257: scaled, not clipped to 255
    stretched = member(
        PrepareOptions(
            dest=str(tmp_path / "stretch.zip"),
            resolution=8,
            channels=1,
            high_bit_depth="stretch",
            filter="nearest",
            **common,
        ),
        2,
    )
    assert stretched.min() == 0 and stretched.max() == 255  # its own 1000..2000 spread over 0..255
    wide = member(
        PrepareOptions(
            dest=str(tmp_path / "wide.zip"),
            resolution=8,
            transform="center-crop-wide",
            filter="nearest",
            **common,
        ),
        0,
    )
    assert (wide[:2] == 0).all() and (wide[-2:] == 0).all() and tuple(wide[4, 0]) == (255, 0, 0)  # a 2:1 band
    # transform=none: the squares pass, the 16x8 image is skipped and named.
    summary, _, _ = prepare(
        PrepareOptions(dest=str(tmp_path / "none.zip"), resolution=8, transform="none", **common)
    )
    assert summary.written == 2 and summary.skipped == [
        ("a_rgba.png", "ValueError: is 16x8, not 8x8 (transform=none)")
    ]


def test_a_list_of_files_and_a_zip_are_sources_too(tmp_path):
    a = _save(tmp_path / "x" / "a.png", np.full((8, 8, 3), 50, dtype=np.uint8))
    b = _save(tmp_path / "y" / "b.png", np.full((8, 8, 3), 90, dtype=np.uint8))
    listing = tmp_path / "list.txt"
    listing.write_text(f"{b}\t3\n# a comment\n{a}\t1\n")
    summary, dest, _ = prepare(
        PrepareOptions(str(listing), str(tmp_path / "l.zip"), 8, workers=1, progress=False)
    )
    assert summary.written == 2
    assert [label for _, label in json.loads(zipfile.ZipFile(dest).read("dataset.json"))["labels"]] == [1, 3]
    # A zip as the source keeps its labels (here: the one just written, re-prepared at another size).
    summary, dest, _ = prepare(
        PrepareOptions(str(dest), str(tmp_path / "z.zip"), 4, workers=1, progress=False)
    )
    assert [label for _, label in json.loads(zipfile.ZipFile(dest).read("dataset.json"))["labels"]] == [1, 3]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["source=/nowhere", "dest=x.zip", "resolution=8"], "does not exist"),
        (
            ["source=.", "dest=x.zip", "resolution=8", "transform=squash"],
            "center-crop, center-crop-wide, pad",
        ),
        (["source=.", "dest=x.zip", "resolution=8", "resolutoin=9"], "Did you mean resolution"),
        (["source=.", "dest=x.zip"], "resolution=None"),
        (["source=.", "dest=x.zip", "resolution=8", "background=mauve-ish"], "not a colour"),
    ],
)
def test_a_wrong_option_is_one_line_naming_the_fix(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_root_entry_point_runs(tmp_path):
    source = _classes_folder(tmp_path / "images", per_class=1)
    result = run_cli(
        ["prepare.py", f"source={source}", f"dest={tmp_path / 'o.zip'}", "resolution=8"], timeout=120
    )
    assert result.returncode == 0 and "wrote 2 images" in result.stdout, result.stderr[-2000:]


# ---- reading archives -------------------------------------------------------------------------------------------
def test_each_loader_worker_opens_its_own_handle_and_reads_the_same_images(tmp_path):
    archive = _zip_of(tmp_path / "d.zip", {f"00000/img{i:08d}.png": _png(10 * i) for i in range(12)})
    source = ArchiveSource(archive)
    source.read(source.names[0])  # the parent's handle is open ...
    assert pickle.loads(pickle.dumps(source))._zip is None  # ... and never travels to a worker
    dataset = ArchiveDataset(source, source.names, 8, 3)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, shuffle=False)
    levels = torch.cat([images[:, 0, 0, 0] for images, _ in loader]).tolist()
    assert levels == [10 * i for i in range(12)]


def test_a_folder_with_dataset_json_reads_like_the_zip(tmp_path):
    folder = tmp_path / "ds"
    for i in range(3):
        (folder / "00000").mkdir(parents=True, exist_ok=True)
        (folder / "00000" / f"img{i:08d}.png").write_bytes(_png(20 * i))
    (folder / "dataset.json").write_text(
        json.dumps({"labels": [[f"00000/img{i:08d}.png", i] for i in range(3)]})
    )
    module = ZipDataModule(str(folder), resolution=8, labels=True, batch_size=3)
    module.setup()
    image, flag, label = module.train_set[2]
    assert image[0, 0, 0] == 40 and flag == 0 and label == 2


@pytest.mark.parametrize("layout", ["zip", "folder"])
@pytest.mark.parametrize(
    "labels",
    [[7, 2, 9, 0, 5], [[0.5, -1.0], [2.0, 0.0], [0.0, 3.5], [-2.5, 1.0], [1.5, 1.5]]],
    ids=["classes", "vectors"],
)
def test_labels_follow_the_file_names_not_the_order_dataset_json_lists_them(tmp_path, layout, labels):
    # Five images in two folders, each a flat grey level that says which file it is, each with a label no other
    # file has; dataset.json lists them in an order of its own (NVlabs' reader keys them by name).
    names = [f"0000{i // 3}/img{i:08d}.png" for i in range(5)]
    listed = [3, 0, 4, 1, 2]
    members = {names[i]: _png(20 * i) for i in range(5)}
    members["dataset.json"] = json.dumps({"labels": [[names[i], labels[i]] for i in listed]}).encode()
    if layout == "zip":
        path = _zip_of(tmp_path / "d.zip", members)
    else:
        path = tmp_path / "ds"
        for name, data in members.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes(data)
    module = ZipDataModule(str(path), resolution=8, labels=True, batch_size=5)
    module.setup()
    seen = set()
    for k in range(len(module.train_set)):
        image, flag, label = module.train_set[k]
        file_index = int(image[0, 0, 0]) // 20  # which file this image is
        assert flag == 0 and torch.equal(label, torch.as_tensor(labels[file_index], dtype=label.dtype))
        seen.add(file_index)
    assert seen == set(range(5))
    expected_dtype = torch.int64 if isinstance(labels[0], int) else torch.float32
    assert module.train_set[0][2].dtype == expected_dtype


def test_labels_reach_the_objective_in_a_run(tmp_path):
    summary, dest, _ = prepare(
        PrepareOptions(
            str(_classes_folder(tmp_path / "images")), str(tmp_path / "c.zip"), 32, workers=1, progress=False
        )
    )
    cfg = compose_config(
        [
            *FAST,
            "model=r3gan",
            "model.generator.widths=[16,16,16,16]",
            "model.generator.groups=[2,2,2,2]",
            "model.generator.c_dim=2",
            "data=zip",
            f"data.path={dest}",
            "data.resolution=32",
            "data.labels=true",
            "data.batch_size=8",
            "max_steps=2",
            "train.sample_every_n_steps=0",
        ],
        tmp_path / "run",
    )
    seen = []
    from pixelsmith.gan.objectives import R3GANObjective

    original = R3GANObjective.sample_inputs

    def spy(self, phase, batch, z_dim):
        seen.append(batch.labels.clone())
        return original(self, phase, batch, z_dim)

    R3GANObjective.sample_inputs = spy
    try:
        metrics = run(cfg)
    finally:
        R3GANObjective.sample_inputs = original
    assert metrics["iteration"] == 2 and seen and all(set(s.tolist()) <= {0, 1} for s in seen)
    assert torch.cat(seen).unique().tolist() == [0, 1]


# ---- bad data -----------------------------------------------------------------------------------------------------
def _with_a_corrupt_member(tmp_path) -> Path:
    # Members at the resolution the tests train at (16 px): an archive at another is refused.
    members = {f"00000/img{i:08d}.png": _png(30 * i, size=16) for i in range(6)}
    members["00000/img00000003.png"] = b"\x89PNG truncated"
    return _zip_of(tmp_path / "bad.zip", members)


def test_a_corrupt_member_is_skipped_once_and_counted(tmp_path, caplog):
    archive = _with_a_corrupt_member(tmp_path)
    cfg = compose_config(
        [
            *FAST,
            "data=zip",
            f"data.path={archive}",
            "data.resolution=16",
            "data.channels=1",
            "data.batch_size=4",
            "max_steps=3",
            "train.sample_every_n_steps=0",
            "model.generator.ngf=16",
            "model.discriminator.ndf=16",
        ],
        tmp_path / "run",
    )
    with caplog.at_level("WARNING"):
        metrics = run(cfg)
    assert metrics["data/skipped_files"] == 1
    assert "Skipping unreadable 00000/img00000003.png" in caplog.text
    assert last_checkpoint(tmp_path / "run")["pixelsmith"]["iteration"] == 3


def test_a_corrupt_member_stops_an_error_run_before_training_naming_it(tmp_path):
    module = ZipDataModule(
        str(_with_a_corrupt_member(tmp_path)), resolution=16, on_corrupt="error", batch_size=2
    )
    with pytest.raises(
        ArchiveError,
        match=r"1 of 6 images in .*bad.zip cannot be read: 00000/img00000003.png.*on_corrupt=skip",
    ):
        module.setup()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: (p.write_bytes(b"PK\x03\x04 cut short"), p)[1], "is not a zip archive"),
        (lambda p: _zip_of(p, {"notes.txt": b"hello"}), "holds no images"),
        (
            lambda p: _zip_of(p, {"a.png": _png(1), "dataset.json": b"{labels: oops"}),
            "does not parse as NVlabs' dataset.json",
        ),
        (
            lambda p: _zip_of(
                p, {"a.png": _png(1), "b.png": _png(2), "dataset.json": b'{"labels": [["a.png", 0]]}'}
            ),
            "no label for 1 of the 2 images",
        ),
    ],
    ids=["truncated", "no-images", "bad-json", "missing-label"],
)
def test_a_broken_archive_is_one_paragraph_at_set_up(tmp_path, make, message):
    archive = make(tmp_path / "x.zip")
    with pytest.raises(ArchiveError, match=message):
        ZipDataModule(str(archive), resolution=8, batch_size=2).setup()


def test_asking_for_labels_an_archive_lacks_names_the_fix(tmp_path):
    archive = _zip_of(tmp_path / "u.zip", {"a.png": _png(1)})
    with pytest.raises(ArchiveError, match="data.labels=true, but .* has no labels"):
        ZipDataModule(str(archive), resolution=8, labels=True, batch_size=1).setup()


def test_an_archive_smaller_than_one_batch_stops_at_set_up_naming_the_counts(tmp_path):
    from pixelsmith.data.base import BatchSizeError

    archive = _zip_of(tmp_path / "five.zip", {f"00000/img{i:08d}.png": _png(10 * i) for i in range(5)})
    with pytest.raises(
        BatchSizeError, match=r"five.zip' holds 5 images.*\(data.batch_size=8\).*batch_size=5 or"
    ):
        ZipDataModule(str(archive), resolution=8, batch_size=8).check_data()
    module = ZipDataModule(str(archive), resolution=8, batch_size=5)  # exactly one batch is enough
    module.setup()
    assert len(module.train_set) == 5


@pytest.mark.parametrize(
    ("dest", "fmt", "message"),
    [
        ("s3://bucket/x", "shards", "aws s3 sync datasets/x s3://bucket/x"),
        ("gs://bucket/x", "auto", "gcloud storage rsync -r datasets/x gs://bucket/x"),
        ("s3://bucket/x.zip", "auto", "data=zip reads an archive from a local path only"),
        ("s3://bucket/x", "zip", "data=zip reads an archive from a local path only"),
    ],
)
def test_an_object_store_dest_is_refused_and_writes_no_folder_named_after_the_url(
    tmp_path, monkeypatch, capsys, dest, fmt, message
):
    source = _classes_folder(tmp_path / "images", per_class=1)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main([f"source={source}", f"dest={dest}", f"format={fmt}", "resolution=8", "progress=false"]) == 2
    said = capsys.readouterr()
    assert message in said.err and "wrote" not in said.out
    assert list(work.iterdir()) == []  # no `s3:` folder (Path("s3://bucket/x") is s3:/bucket/x)


# ---- archives read within limits --------------------------------------------------------------------------------
def _zip_with_zeros(path: Path, megabytes: int) -> Path:
    """Two small images and `00000/img00000002.png`: `megabytes` MiB of zeros, deflated as it is streamed (never
    held in memory), so the archive is a fraction of a MB."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("00000/img00000000.png", _png(10))
        archive.writestr("00000/img00000001.png", _png(20))
        zeros = bytes(1 << 20)
        with archive.open("00000/img00000002.png", "w") as member:
            for _ in range(megabytes):
                member.write(zeros)
    return path


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bombs")
    # 320 MiB in about 0.3 MB: over the size limit. 32 MiB: under it, at a ratio of about 1000:1.
    return {
        "large": _zip_with_zeros(folder / "large.zip", 320),
        "ratio": _zip_with_zeros(folder / "ratio.zip", 32),
    }


@pytest.mark.parametrize(
    ("kind", "words"), [("large", "declares 335,544,320 bytes unpacked, above the"), ("ratio", "a zip bomb")]
)
def test_a_zip_bomb_member_is_refused_before_any_byte_of_it_is_unpacked(bombs, monkeypatch, kind, words):
    opened = []
    real_open = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    source = ArchiveSource(bombs[kind])
    assert bombs[kind].stat().st_size < 1 << 20
    with pytest.raises(ArchiveError, match=words) as refused:
        source.read("00000/img00000002.png")
    assert "\n" not in str(refused.value) and "00000/img00000002.png" in str(refused.value)
    assert "00000/img00000002.png" not in opened  # refused from the zip's directory alone
    assert source.read("00000/img00000000.png") == _png(10)  # the others read as before


def test_prepare_skips_a_bomb_and_data_zip_leaves_it_out(bombs, tmp_path, capsys):
    assert (
        main([f"source={bombs['large']}", f"dest={tmp_path / 'o.zip'}", "resolution=8", "progress=false"])
        == 0
    )
    said = capsys.readouterr().out
    assert "wrote 2 images" in said and "skipped 1: 1 ArchiveError" in said and "img00000002.png" in said
    with pytest.raises(ArchiveError, match=r"1 of 3 images .*img00000002.png \(ArchiveError: .*a zip bomb"):
        ZipDataModule(str(bombs["ratio"]), resolution=8, on_corrupt="error", batch_size=2).setup()
    module = ZipDataModule(str(bombs["large"]), resolution=8, batch_size=2)
    module.setup()
    assert len(module.train_set) == 2 and module.skipped_file_count == 1


@pytest.mark.slow
def test_prepare_on_a_zip_bomb_stays_within_memory_in_a_child_process(bombs, tmp_path):
    """The peak resident memory of a child that prepares the 320 MiB bomb grows by far less than the member."""
    script = (
        "import resource, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'src')!r})\n"
        "from pixelsmith.data.prepare import main\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"code = main(['source={bombs['large']}', 'dest={tmp_path / 'o.zip'}', 'resolution=8', 'progress=false', "
        "'workers=1'])\n"
        "print(code, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    code, growth_mb = result.stdout.split()[-2:]
    assert code == "0", result.stderr[-2000:]
    assert int(growth_mb) < 64, f"peak memory grew by {growth_mb} MB"


def _forge_declared_size(path: Path, name: str, size: int) -> None:
    """Rewrite `name`'s uncompressed size in the zip's local header and central directory."""
    data = bytearray(path.read_bytes())
    encoded = name.encode()
    local = data.index(b"PK\x03\x04" + data[4:4])  # the first local header is the member's (one-member zip)
    assert data[local + 30 : local + 30 + len(encoded)] == encoded
    data[local + 22 : local + 26] = size.to_bytes(4, "little")
    central = data.index(b"PK\x01\x02")
    assert data[central + 46 : central + 46 + len(encoded)] == encoded
    data[central + 24 : central + 28] = size.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_a_member_that_unpacks_to_more_than_it_declares_is_read_no_further(tmp_path, monkeypatch):
    path = tmp_path / "liar.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("a.png", bytes(8 << 20))  # 8 MiB of zeros, declared below as 4000 bytes
    _forge_declared_size(path, "a.png", 4000)
    asked = []
    real_read = zipfile.ZipExtFile.read

    def spy(self, n=-1):
        asked.append(n)
        return real_read(self, n)

    monkeypatch.setattr(zipfile.ZipExtFile, "read", spy)
    with pytest.raises(ArchiveError, match=r"liar.zip!a.png does not unpack \(BadZipFile: Bad CRC-32"):
        ArchiveSource(path).read("a.png")
    assert asked == [4001]  # one bounded read: declared size + 1, never "everything"


def test_a_member_packed_with_bzip2_is_refused_unread(tmp_path):
    path = tmp_path / "bz.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_BZIP2) as archive:
        archive.writestr("a.png", _png(1))
    with pytest.raises(ArchiveError, match="compressed with method 12 .* stored or deflated only"):
        ArchiveSource(path).read("a.png")


def test_a_file_in_a_folder_archive_over_the_limit_is_refused(tmp_path, monkeypatch):
    from pixelsmith.data import archive as archive_module

    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "a.png").write_bytes(_png(1, size=64))
    monkeypatch.setattr(archive_module, "MAX_MEMBER_BYTES", 100)
    with pytest.raises(ArchiveError, match=r"ds/a.png is \d+ bytes, above the 100 bytes"):
        ArchiveSource(folder).read("a.png")


_DEEP = 100_000
HOSTILE_LABELS = {
    "labels as a dict": (
        '{"labels": {"a.png": 0}}',
        "its labels are a dict, not a list of [name, label] pairs",
    ),
    "100k nested lists": ('{"labels": ' + "[" * _DEEP + "]" * _DEEP + "}", "does not parse"),
    "100k nested as a label": (
        '{"labels": [["a.png", ' + "[" * _DEEP + "]" * _DEEP + "]]}",
        "does not parse",
    ),
    "nested within the parser's depth": (
        '{"labels": [["a.png", ' + "[" * 500 + "]" * 500 + "]]}",
        "entry 0 ('a.png', list) has a label that is neither a class index (0..99999) nor a list of numbers",
    ),
    "a negative label": ('{"labels": [["a.png", -1]]}', "entry 0 ('a.png', -1) has a label that is neither"),
    "a fractional label": ('{"labels": [["a.png", 1.5]]}', "('a.png', 1.5) has a label that is neither"),
    "a string label": ('{"labels": [["a.png", "cat"]]}', "('a.png', str) has a label that is neither"),
    "a boolean label": ('{"labels": [["a.png", true]]}', "('a.png', True) has a label that is neither"),
    "a null label": ('{"labels": [["a.png", null]]}', "('a.png', None) has a label that is neither"),
    "a label past the class limit": (
        '{"labels": [["a.png", 1000000000]]}',
        "('a.png', 1000000000) has a label",
    ),
    "a NaN in a vector": (
        '{"labels": [["a.png", [1.0, NaN]]]}',
        "('a.png', list) has a label that is neither",
    ),
    "an index and a vector": (
        '{"labels": [["a.png", 0], ["b.png", [1.0]]]}',
        "entry 1 ('b.png', list) has a label of another kind than the first entry's (a class index)",
    ),
    "vectors of two lengths": (
        '{"labels": [["a.png", [1.0]], ["b.png", [1.0, 2.0]]]}',
        "another kind than the first entry's (a list of 1 numbers)",
    ),
    "an entry that is no pair": (
        '{"labels": [["a.png"]]}',
        "entry 0 (a list of 1 items) is not a [name, label] pair",
    ),
    "a name that is no string": (
        '{"labels": [[7, 0]]}',
        "entry 0 (a list of 2 items) is not a [name, label] pair",
    ),
    "a list at the top": ('[["a.png", 0]]', "holds a JSON list, not NVlabs' object"),
}


@pytest.mark.parametrize("case", HOSTILE_LABELS, ids=list(HOSTILE_LABELS))
def test_a_hostile_dataset_json_is_one_paragraph(tmp_path, capsys, case):
    text, words = HOSTILE_LABELS[case]
    archive = _zip_of(tmp_path / "x.zip", {"a.png": _png(1), "b.png": _png(2), "dataset.json": text.encode()})
    with pytest.raises(ArchiveError) as refused:
        ArchiveSource(archive)
    message = str(refused.value)
    assert words in message and "\n" not in message and "x.zip!dataset.json" in message, message
    assert len(message) < 600  # the entry is described, never printed whole
    # prepare.py reads a zip source's labels the same way: exit 2, one line, nothing written.
    capsys.readouterr()
    assert main([f"source={archive}", f"dest={tmp_path / 'o.zip'}", "resolution=8", "progress=false"]) == 2
    said = capsys.readouterr()
    assert words in said.err and said.err.count("\n") == 1 and "Traceback" not in said.err
    assert not (tmp_path / "o.zip").exists()


def test_a_list_source_refuses_a_negative_label(tmp_path, capsys):
    image = tmp_path / "a.png"
    image.write_bytes(_png(1, size=16))
    (tmp_path / "list.txt").write_text(f"{image}\t-2\n")
    args = [f"source={tmp_path / 'list.txt'}", f"dest={tmp_path / 'o.zip'}", "resolution=8", "progress=false"]
    assert main(args) == 2
    assert "list.txt:1: the label -2 is no class index" in capsys.readouterr().err
