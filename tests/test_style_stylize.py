"""stylize.py: checkpoint contract, file/folder stylization, alpha/16-bit/EXIF handling, and the key=value CLI."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.config.paths import REPO_ROOT
from pixelsmith.style.data import HighBitDepthWarning, ImageReadError, StyleImageError
from pixelsmith.style.loss_network import LossNetworkWeightsNotFoundError
from pixelsmith.style.networks import AdaINNet, TransformerNet
from pixelsmith.style.stylize import (
    CheckpointFormatError,
    StylizeInputError,
    StylizeOptions,
    load_stylizer_from_checkpoint,
    main,
    parse_args,
    stylize_paths,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"
)
SMALL = {"base_channels": 8, "num_residual_blocks": 1}


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
    return np.asarray(small.resize((width, height), Image.Resampling.BICUBIC)).copy()


@pytest.fixture(scope="module")
def fast_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    net = TransformerNet(**SMALL)
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"stylizer.{k}": v for k, v in net.state_dict().items()},
            "pixelsmith_config": {"model": {"_target_": "x.Module", "stylizer": dict(SMALL)}},
        },
        path,
    )
    return path, net


def test_fast_checkpoint_round_trip(fast_ckpt):
    path, net = fast_ckpt
    loaded = load_stylizer_from_checkpoint(path)
    assert isinstance(loaded, TransformerNet) and not loaded.training
    for key, value in net.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)


def test_adain_checkpoint_with_and_without_stored_encoder(tmp_path, monkeypatch):
    torch.manual_seed(0)
    net = AdaINNet.build(pretrained=False, decoder={"width": 0.25})
    state = {f"decoder.{k}": v for k, v in net.decoder.state_dict().items()}
    state |= {f"encoder.{k}": v for k, v in net.encoder.state_dict().items()}
    config = {"model": {"decoder": {"width": 0.25}, "loss_net": {"pretrained": True}}}
    torch.save({"state_dict": state, "pixelsmith_config": config}, tmp_path / "adain.ckpt")
    loaded = load_stylizer_from_checkpoint(tmp_path / "adain.ckpt")
    assert isinstance(loaded, AdaINNet)
    torch.testing.assert_close(loaded.encoder.features[0].weight, net.encoder.features[0].weight)
    # Without encoder weights in the checkpoint the VGG19 file is needed, and its absence is explained.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    state = {k: v for k, v in state.items() if k.startswith("decoder.")}
    torch.save({"state_dict": state, "pixelsmith_config": config}, tmp_path / "adain_no_encoder.ckpt")
    with pytest.raises(LossNetworkWeightsNotFoundError, match="vgg19-dcbb9e9d.pth"):
        load_stylizer_from_checkpoint(tmp_path / "adain_no_encoder.ckpt")


def test_bad_checkpoints_are_explained(tmp_path):
    torch.save({"state_dict": {"generator.w": torch.zeros(1)}}, tmp_path / "gan.ckpt")
    with pytest.raises(CheckpointFormatError, match="stylizer.*decoder.*generator"):
        load_stylizer_from_checkpoint(tmp_path / "gan.ckpt")
    net = TransformerNet(**SMALL)
    state = {f"stylizer.{k}": v for k, v in net.state_dict().items()}
    torch.save({"state_dict": state, "pixelsmith_config": {"model": {}}}, tmp_path / "wrong_config.ckpt")
    with pytest.raises(CheckpointFormatError, match="different architecture"):
        load_stylizer_from_checkpoint(tmp_path / "wrong_config.ckpt")  # default 32 channels vs stored 8
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        load_stylizer_from_checkpoint(tmp_path / "missing.ckpt")


def test_file_and_folder_stylization(fast_ckpt, tmp_path):
    _, net = fast_ckpt
    (tmp_path / "in" / "sub").mkdir(parents=True)
    Image.fromarray(photo(90, 70)).save(tmp_path / "in" / "a.jpg")
    Image.fromarray(photo(64, 130, 1)).save(tmp_path / "in" / "sub" / "b.png")
    (tmp_path / "in" / "notes.txt").write_text("not an image")
    written = stylize_paths(net, tmp_path / "in", tmp_path / "out", tile=64, overlap=16, progress=False)
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in written) == ["a.jpg", "sub/b.png"]
    assert Image.open(tmp_path / "out" / "sub" / "b.png").size == (64, 130)
    single = stylize_paths(net, tmp_path / "in" / "a.jpg", tmp_path / "single.png", tile=64, overlap=16)
    assert single == [tmp_path / "single.png"] and Image.open(single[0]).size == (90, 70)
    with pytest.raises(StylizeInputError, match="must be a folder"):
        stylize_paths(net, tmp_path / "in", tmp_path / "x.png")
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        stylize_paths(net, tmp_path / "nothing_here", tmp_path / "out")


def test_rgba_keeps_alpha_in_png_and_drops_it_with_a_warning_in_jpeg(fast_ckpt, tmp_path):
    _, net = fast_ckpt
    rgba = np.dstack([photo(48, 40), np.linspace(0, 255, 48 * 40, dtype=np.uint8).reshape(40, 48)])
    Image.fromarray(rgba, "RGBA").save(tmp_path / "in.png")
    stylize_paths(net, tmp_path / "in.png", tmp_path / "out.png", tile=64, overlap=16, progress=False)
    out = Image.open(tmp_path / "out.png")
    assert out.mode == "RGBA"
    np.testing.assert_array_equal(np.asarray(out)[..., 3], rgba[..., 3])
    assert not np.array_equal(np.asarray(out)[..., :3], rgba[..., :3])  # the colours were stylized
    with pytest.warns(UserWarning, match="alpha channel was dropped"):
        stylize_paths(net, tmp_path / "in.png", tmp_path / "out.jpg", tile=64, overlap=16, progress=False)
    assert Image.open(tmp_path / "out.jpg").mode == "RGB"
    with pytest.raises(ImageReadError, match="transparency=refuse"):
        stylize_paths(net, tmp_path / "in.png", tmp_path / "o.png", transparency="refuse", progress=False)


def test_16bit_input_and_exif_orientation(fast_ckpt, tmp_path):
    _, net = fast_ckpt
    Image.fromarray(photo(40, 30)[..., 0].astype(np.uint16) * 257).save(tmp_path / "deep.png")
    with pytest.warns(HighBitDepthWarning):
        stylize_paths(
            net, tmp_path / "deep.png", tmp_path / "deep_out.png", tile=64, overlap=16, progress=False
        )
    assert Image.open(tmp_path / "deep_out.png").mode == "RGB"
    with pytest.raises(ImageReadError, match="16-bit"):
        stylize_paths(net, tmp_path / "deep.png", tmp_path / "x.png", high_bit_depth="refuse", progress=False)
    exif = Image.Exif()
    exif[0x0112] = 8  # rotate 90 CCW to display
    Image.fromarray(photo(60, 30)).save(tmp_path / "camera.jpg", exif=exif)
    stylize_paths(net, tmp_path / "camera.jpg", tmp_path / "upright.jpg", tile=64, overlap=16, progress=False)
    upright = Image.open(tmp_path / "upright.jpg")
    assert upright.size == (30, 60) and upright.getexif().get(0x0112, 1) == 1


def test_adain_needs_a_readable_style(tmp_path):
    torch.manual_seed(0)
    net = AdaINNet.build(pretrained=False, decoder={"width": 0.25})
    Image.fromarray(photo(40, 40)).save(tmp_path / "in.png")
    with pytest.raises(StylizeInputError, match="style="):
        stylize_paths(net, tmp_path / "in.png", tmp_path / "out.png", progress=False)
    with pytest.raises(StyleImageError, match="missing_style.jpg"):
        stylize_paths(net, tmp_path / "in.png", tmp_path / "out.png", style=tmp_path / "missing_style.jpg")
    Image.fromarray(photo(50, 50, 3)).save(tmp_path / "style.png")
    stylize_paths(net, tmp_path / "in.png", tmp_path / "out.png", style=tmp_path / "style.png", alpha=0.5)
    assert Image.open(tmp_path / "out.png").size == (40, 40)


def test_key_value_arguments():
    options = parse_args(
        ["ckpt_path=a.ckpt", "input=in", "output=out", "tile=256", "overwrite=false", "style=null"]
    )
    assert (options.tile, options.overwrite, options.style, options.overlap) == (256, False, None, 64)
    with pytest.raises(StylizeInputError, match="Did you mean overlap"):
        parse_args(["overlapp=3"])
    with pytest.raises(StylizeInputError, match="expected a int"):
        parse_args(["overlap=big"])
    assert parse_args(["tile=auto"]).tile == "auto" and StylizeOptions().tile == "auto"
    with pytest.raises(StylizeInputError, match="key=value"):
        parse_args(["photo.jpg"])


def test_cli_main(fast_ckpt, tmp_path, capsys):
    path, _ = fast_ckpt
    Image.fromarray(photo(50, 40)).save(tmp_path / "in.jpg")
    code = main(
        [
            f"ckpt_path={path}",
            f"input={tmp_path / 'in.jpg'}",
            f"output={tmp_path / 'o.jpg'}",
            "tile=64",
            "overlap=8",
        ]
    )
    assert code == 0 and Image.open(tmp_path / "o.jpg").size == (50, 40)
    assert main(["ckpt_path=nowhere.ckpt", "input=a", "output=b"]) == 2
    assert "Checkpoint not found: nowhere.ckpt" in capsys.readouterr().err
    assert main(["input=a", "output=b"]) == 2 and "ckpt_path=... is required" in capsys.readouterr().err
    assert main([f"ckpt_path={path}", f"input={tmp_path / 'in.jpg'}", "output=x.jpg", "tile=64"]) == 2
    assert "overlap=64 must be smaller than tile=64" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*torch.jit.load.* is deprecated:FutureWarning")
def test_cli_export_flag_writes_a_checked_torchscript_file(fast_ckpt, tmp_path, capsys):
    path, net = fast_ckpt
    assert main([f"ckpt_path={path}", f"export_dir={tmp_path}", "export_formats=torchscript"]) == 0
    assert "exported torchscript" in capsys.readouterr().out
    x = torch.rand(1, 3, 36, 52)
    with torch.inference_mode():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "stylizer.pt"))(x), net.eval()(x))


@pytest.mark.slow  # a subprocess: the full run (`pytest --all`) only
def test_entry_point_help_runs_as_a_script():
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "stylize.py"), "--help"], capture_output=True, text=True, check=True
    )
    for words in (
        "ckpt_path=RUN/checkpoints/last.ckpt input=IN output=OUT",
        "tile",
        "overlap",
        "alpha",
        "style",
    ):
        assert words in result.stdout


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"precision": "fp8"}, "precision='fp8' is unknown"),
        ({"tile_batch": 0}, "tile_batch=0 must be at least 1"),
        ({"thumbnail": 0}, "thumbnail=0 must be at least 16"),
        ({"tile": 8, "overlap": 2}, "tile=8 must be at least 16"),
        ({"alpha": 1.5}, "alpha=1.5 must be in"),
        ({"tile": "huge"}, "tile='huge': a number of pixels or auto"),
        ({"memory_fraction": 0.0}, "memory_fraction=0.0 must be in"),
        ({"compile": "yes"}, "compile='yes'; choose one of auto, true, false"),
    ],
)
def test_bad_options_are_one_message_not_a_traceback(fast_ckpt, tmp_path, option, message):
    _, net = fast_ckpt
    Image.fromarray(photo(40, 30)).save(tmp_path / "in.png")
    kwargs = {"tile": 64, "overlap": 16, "progress": False, **option}
    with pytest.raises(StylizeInputError, match=message):
        stylize_paths(net, tmp_path / "in.png", tmp_path / "out.png", **kwargs)


def test_one_unreadable_file_in_a_folder_is_skipped_reported_and_the_rest_written(
    fast_ckpt, tmp_path, capsys
):
    path, _ = fast_ckpt
    folder = tmp_path / "in"
    folder.mkdir()
    Image.fromarray(photo(40, 30)).save(folder / "a.png")
    Image.fromarray(photo(40, 30, 1)).save(folder / "c.png")
    (folder / "b.jpg").write_text("not an image")
    Image.fromarray(photo(1, 1)).save(folder / "tiny.png")  # 1x1: too small, named rather than a traceback
    code = main(
        [f"ckpt_path={path}", f"input={folder}", f"output={tmp_path / 'out'}", "tile=64", "overlap=16"]
        + ["progress=false", "device=cpu"]
    )
    err = capsys.readouterr().err
    assert code == 1  # finished, but not every file: a script can tell
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.png", "c.png"]
    assert "b.jpg" in err and "tiny.png" in err and "1x1: too small" in err and "FAILED: 2 file(s)" in err
    assert "Traceback" not in err


def test_a_folder_with_prefetch_writes_the_same_images_and_times_every_stage(fast_ckpt, tmp_path):
    """Decode-ahead and background encode change when work happens, not what is written."""
    from pixelsmith.style.tiling import StageTimes

    _, net = fast_ckpt
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(photo(48 + 8 * i, 40, i)).save(folder / f"{i}.png")
    outputs = {}
    for prefetch in (False, True):
        times = StageTimes()
        written = stylize_paths(
            net,
            folder,
            tmp_path / f"out_{prefetch}",
            tile=32,
            overlap=8,
            progress=False,
            prefetch=prefetch,
            times=times,
        )
        outputs[prefetch] = [np.asarray(Image.open(p)) for p in written]
        assert [p.name for p in written] == ["0.png", "1.png", "2.png"]
        assert times.decode > 0 and times.network > 0 and times.blend > 0 and times.encode > 0
    for sequential, overlapped in zip(outputs[False], outputs[True], strict=True):
        assert np.array_equal(sequential, overlapped)


def test_the_cli_says_where_the_time_went(fast_ckpt, tmp_path, capsys):
    path, _ = fast_ckpt
    Image.fromarray(photo(40, 30)).save(tmp_path / "in.png")
    code = main(
        [
            f"ckpt_path={path}",
            f"input={tmp_path / 'in.png'}",
            f"output={tmp_path / 'out.png'}",
            "progress=false",
        ]
    )
    assert code == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("time per stage:"))
    for stage in ("decode", "copy in", "network", "blend", "copy out", "encode"):
        assert f"{stage} " in line


def test_the_stylize_entry_point_is_installed():
    """`pixelsmith-stylize` (the style part's command) is declared in pyproject.toml; a fork that deletes the part
    still installs, and only that command fails then (README "Removing a part")."""
    import tomllib

    from tests.conftest import CHECKOUT

    scripts = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pixelsmith-stylize"] == "pixelsmith.style.stylize:main"


def test_a_folders_pixels_do_not_depend_on_the_images_before_it(fast_ckpt, tmp_path, monkeypatch):
    """compile=true over a folder of more image sizes than torch's recompile limit (lowered to 2 here): every image
    is written with the pixels it gets stylized alone in a fresh process, and a rerun after a kill (overwrite=false
    over a half-written folder) redoes the missing ones identically. Only the declared tile shapes are compiled, so
    no image's path depends on how many shapes came before it (it did: the first 8 sizes compiled, the rest eager)."""
    import torch._dynamo

    _, net = fast_ckpt
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    sizes = [(40, 56), (72, 48), (64, 64), (100, 76), (88, 120), (52, 44)]  # 6 sizes; 3 fit a 64-px tile
    folder = tmp_path / "in"
    folder.mkdir()
    for i, (width, height) in enumerate(sizes):
        Image.fromarray(photo(width, height, i)).save(folder / f"{i}.png")
    settings = dict(tile=64, overlap=16, tile_batch=2, compile="true", progress=False, prefetch=False)

    def fresh() -> None:  # a new process's compile state: nothing cached in this one
        torch._dynamo.reset()

    fresh()
    written = stylize_paths(net, folder, tmp_path / "folder", **settings)
    together = {p.name: np.asarray(Image.open(p)) for p in written}
    assert sorted(together) == [f"{i}.png" for i in range(len(sizes))]
    for name, pixels in together.items():
        fresh()
        alone = stylize_paths(net, folder / name, tmp_path / "alone" / name, **settings)[0]
        assert np.array_equal(np.asarray(Image.open(alone)), pixels), name

    for name in ("1.png", "3.png", "4.png"):  # killed before these were written
        (tmp_path / "folder" / name).unlink()
    fresh()
    redone = stylize_paths(net, folder, tmp_path / "folder", **settings, overwrite=False)
    assert sorted(p.name for p in redone) == ["1.png", "3.png", "4.png"]
    for path in redone:
        assert np.array_equal(np.asarray(Image.open(path)), together[path.name]), path.name


def _tiny_style_checkpoint(folder: Path) -> Path:
    net = TransformerNet(base_channels=8, num_residual_blocks=1)
    path = folder / "style.ckpt"
    config = {"model": {"stylizer": {"base_channels": 8, "num_residual_blocks": 1}}}
    torch.save(
        {
            "state_dict": {f"stylizer.{k}": v for k, v in net.state_dict().items()},
            "pixelsmith_config": config,
        },
        path,
    )
    return path


def test_a_single_photo_written_into_its_own_folder_in_another_format_leaves_the_photo(tmp_path):
    """format= applies to a single input file too: output=<the photo's folder> format=png writes photo.png beside
    photo.jpg and leaves the photo as it was (it used to write photo.jpg over the input)."""
    from pixelsmith.style.stylize import main

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.full((24, 32, 3), 120, np.uint8)).save(photos / "photo.jpg")
    original = (photos / "photo.jpg").read_bytes()
    ckpt = _tiny_style_checkpoint(tmp_path)
    code = main(
        [
            f"ckpt_path={ckpt}",
            f"input={photos / 'photo.jpg'}",
            f"output={photos}",
            "format=png",
            "progress=false",
        ]
    )
    assert code == 0
    assert (photos / "photo.jpg").read_bytes() == original
    assert Image.open(photos / "photo.png").size == (32, 24)


def test_a_link_planted_at_the_temporary_name_is_never_written_through(tmp_path):
    """Each image is written to a new temporary file (O_EXCL) and renamed into place: a link left at the old fixed
    `.NAME.partial` name pointing at another file leaves that file as it was."""
    from pixelsmith.style.stylize import main

    Image.fromarray(np.full((24, 32, 3), 60, np.uint8)).save(tmp_path / "a.jpg")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".a.jpg.partial").symlink_to(victim)
    code = main(
        [
            f"ckpt_path={_tiny_style_checkpoint(tmp_path)}",
            f"input={tmp_path / 'a.jpg'}",
            f"output={out / 'a.jpg'}",
            "progress=false",
        ]
    )
    assert code == 0
    assert victim.read_text() == "the user's"
    assert (out / "a.jpg").is_file() and not (out / "a.jpg").is_symlink()
    assert oct((out / "a.jpg").stat().st_mode & 0o777) != oct(0o600)  # not private like a bare mkstemp file


def test_two_photos_planned_onto_one_output_are_refused_before_anything_is_written(tmp_path, capsys):
    from pixelsmith.style.stylize import main

    photos = tmp_path / "photos"
    photos.mkdir()
    for suffix in ("jpg", "png"):
        Image.fromarray(np.full((24, 32, 3), 90, np.uint8)).save(photos / f"a.{suffix}")
    code = main(
        [
            f"ckpt_path={_tiny_style_checkpoint(tmp_path)}",
            f"input={photos}",
            f"output={tmp_path / 'out'}",
            "format=png",
        ]
    )
    assert code == 2
    said = capsys.readouterr().err
    assert "a.jpg and a.png" in said and "one result would be lost" in said, said
    assert not (tmp_path / "out").exists()
