"""The bad-input list: every mistake a user can make at each entry point (train.py, evaluate.py, stylize.py,
prepare.py), with the words its one-paragraph refusal must contain. One test runs them all and prints how many were
refused cleanly: a PixelsmithError (or the script's exit status 2 with one line on stderr) naming the cause and the
fix, no traceback, and for a training run nothing in its run dir that would make the corrected command refuse it.

The train.py config values of tests/test_config_ranges.py are part of the list; the cases here add one per config
group they did not cover (strategy, profiler, callbacks, logger, experiment, paths, eval) and the data, model and
destination mistakes that used to end in a traceback or pass without a word.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.errors import PixelsmithError
from pixelsmith.run.run_dir import RUN_MARKER
from tests.conftest import FAST, SMALL, compose_config
from tests.test_config_ranges import BAD_VALUES


@dataclass
class Case:
    entry: str  # train | evaluate | generate | stylize | prepare
    name: str
    args: Callable[
        [Path], list[str]
    ]  # overrides (train, evaluate, generate) or key=value arguments, given a scratch folder
    words: tuple[str, ...]  # what the paragraph must say: the cause and the fix
    env: Callable[[Path], dict[str, str]] | None = (
        None  # environment variables set for the case, given the folder
    )
    untouched: bool = False  # nothing in the scratch folder is written, changed or removed by the refusal


def _png(path: Path, width: int, height: int, level: int = 90) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((height, width, 3), level, dtype=np.uint8)).save(path)
    return path


def _folder_with_a_speck(tmp: Path) -> Path:
    """Eight 24x24 images and one 1x1: trained at 32 px, the speck would be a solid square."""
    for i in range(8):
        _png(tmp / "images" / f"{i}.png", 24, 24, 20 * i)
    _png(tmp / "images" / "speck.png", 1, 1)
    return tmp / "images"


def _zip_at(tmp: Path, size: int) -> Path:
    path = tmp / f"at{size}.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(4):
            buffer = io.BytesIO()
            Image.fromarray(np.full((size, size, 3), 40 * i, dtype=np.uint8)).save(buffer, format="PNG")
            archive.writestr(f"00000/img{i:08d}.png", buffer.getvalue())
    return path


def _shards_at(tmp: Path, size: int) -> Path:
    pytest.importorskip("litdata")
    from pixelsmith.data.prepare import PrepareOptions, prepare

    for i in range(4):
        _png(tmp / "shard_src" / f"{i}.png", 16, 16, 30 * i)
    dest = tmp / "shards"
    prepare(
        PrepareOptions(str(tmp / "shard_src"), str(dest), size, format="shards", workers=1, progress=False)
    )
    return dest


def _a_file(tmp: Path) -> Path:
    (tmp / "a_file").write_text("not a folder")
    return tmp / "a_file"


def _checkpoint_stub(tmp: Path) -> Path:
    """A style checkpoint as stylize reads it (tiny TransformerNet)."""
    pytest.importorskip("pixelsmith.style", reason="a fork without the style part")
    from pixelsmith.style.networks import TransformerNet

    net = TransformerNet(base_channels=8, num_residual_blocks=1)
    path = tmp / "style.ckpt"
    torch.save(
        {
            "state_dict": {f"stylizer.{k}": v for k, v in net.state_dict().items()},
            "pixelsmith_config": {"model": {"stylizer": {"base_channels": 8, "num_residual_blocks": 1}}},
        },
        path,
    )
    return path


def _truncated(tmp: Path) -> Path:
    torch.save({"state_dict": {"w": torch.zeros(64)}}, tmp / "whole.ckpt")
    data = (tmp / "whole.ckpt").read_bytes()
    (tmp / "cut.ckpt").write_bytes(data[: len(data) // 2])
    return tmp / "cut.ckpt"


def _stylize(tmp: Path, **extra: str) -> list[str]:
    _png(tmp / "photos" / "a.png", 40, 32)
    options = {
        "ckpt_path": str(_checkpoint_stub(tmp)),
        "input": str(tmp / "photos"),
        "output": str(tmp / "out"),
    }
    options.update(extra)
    return [f"{k}={v}" for k, v in options.items()] + ["progress=false"]


STYLE_PART = importlib.util.find_spec("pixelsmith.style") is not None
R3 = SMALL["r3gan"]
SG2 = SMALL["stylegan2"]
CASES = [
    # ---- train.py: config groups the range table did not cover
    Case(
        "train",
        "strategy",
        lambda t: ["strategy=ddp", "strategy.timeout_minutes=0"],
        ("strategy.timeout_minutes",),
    ),
    Case(
        "train",
        "profiler",
        lambda t: ["profiler=torch", "profiler.torch_active=0"],
        ("profiler.torch_active=3",),
    ),
    Case(
        "train",
        "callbacks",
        lambda t: ["callbacks=prometheus", "callbacks.prometheus.port=-1"],
        ("callbacks.prometheus.port=",),
    ),
    Case(
        "train",
        "eval weights",
        lambda t: ["eval.every_n_steps=1", "eval.extractor=inception", f"eval.weights_path={t / 'none.pth'}"],
        ("eval.weights_path",),
    ),
    Case(
        "train",
        "experiment",
        lambda t: ["experiment=mnist_r3gan", *R3[1:], "data.batch_size=7"],
        ("multiple of 2", "data.batch_size="),
    ),
    Case("train", "paths", lambda t: [f"paths.output_dir={_a_file(t) / 'run'}"], ("a file, not a folder",)),
    # ---- train.py: data and model mistakes that passed without a word or ended in a traceback
    Case(
        "train",
        "speck in a folder",
        lambda t: [
            "data=image_folder",
            f"data.root={_folder_with_a_speck(t)}",
            "data.resolution=32",
            "data.on_corrupt=error",
        ],
        ("1 of 9 images", "far smaller than data.resolution=32", "speck.png", "data.on_corrupt=skip"),
    ),
    Case(
        "train",
        "zip at another resolution",
        lambda t: ["data=zip", f"data.path={_zip_at(t, 16)}", "data.resolution=32"],
        ("holds 16x16 images", "data.resolution=16", "prepare.py", "resolution=32"),
    ),
    Case(
        "train",
        "shards at another resolution",
        lambda t: ["data=shards", f"data.path={_shards_at(t, 16)}", "data.resolution=32"],
        ("hold 16x16 images", "resolution=32"),
    ),
    Case(
        "train",
        "labels beyond c_dim",
        lambda t: [*R3, "data.labels=true", "model.generator.c_dim=5", "data.limit=null"],
        ("span 10 classes", "model.generator.c_dim=10"),
    ),
    Case(
        "train",
        "c_dim without labels",
        lambda t: [*R3, "model.generator.c_dim=10"],
        ("yields no labels", "data.labels=true"),
    ),
    Case(
        "train",
        "mbstd group not filled",
        lambda t: [*SG2, "data.batch_size=1"],
        ("mbstd_group_size=4", "data.batch_size=4", "mbstd_group_size=1"),
    ),
    Case(
        "train",
        "mbstd group does not divide",
        lambda t: [*SG2, "data.batch_size=6"],
        ("min(group, batch)", "data.batch_size=8"),
    ),
    Case("train", "resolution no power of two", lambda t: ["data.resolution=24"], ("data.resolution=16",)),
    # ---- evaluate.py
    Case("evaluate", "missing checkpoint", lambda t: [f"ckpt_path={t / 'none.ckpt'}"], ("does not exist",)),
    Case(
        "evaluate",
        "truncated checkpoint",
        lambda t: [f"ckpt_path={_truncated(t)}"],
        ("truncated or corrupt",),
    ),
    # ---- stylize.py
    Case(
        "stylize",
        "output under a file",
        lambda t: _stylize(t, output=str(_a_file(t) / "out")),
        ("output=", "a file, not a folder"),
    ),
    Case(
        "stylize",
        "output on /proc",
        lambda t: _stylize(t, output="/proc/pixelsmith-test/out"),
        ("output=", "cannot be written"),
    ),
    Case(
        "stylize",
        "truncated checkpoint",
        lambda t: [*_stylize(t)[1:], f"ckpt_path={_truncated(t)}"],
        ("truncated or corrupt",),
    ),
    Case("stylize", "tile too small", lambda t: _stylize(t, tile="8"), ("tile=8",)),
    # ---- prepare.py
    Case(
        "prepare",
        "resolution no power of two",
        lambda t: [f"source={_folder_with_a_speck(t)}", f"dest={t / 'o.zip'}", "resolution=33"],
        ("resolution=32", "resolution=64"),
    ),
    Case(
        "prepare",
        "dest under a file",
        lambda t: [f"source={_folder_with_a_speck(t)}", f"dest={_a_file(t) / 'o.zip'}", "resolution=16"],
        ("dest=", "a file, not a folder"),
    ),
    Case(
        "prepare",
        "dest on /proc",
        lambda t: [f"source={_folder_with_a_speck(t)}", "dest=/proc/pixelsmith-test/o.zip", "resolution=16"],
        ("dest=", "cannot be written"),
    ),
    Case(
        "prepare",
        "only specks",
        lambda t: [f"source={_png(t / 's' / 'a.png', 1, 1).parent}", f"dest={t / 'o.zip'}", "resolution=16"],
        ("None of the 1 images", "ImageTooSmallError"),
    ),
]
# The config values of the range table, as train.py cases.
CASES += [
    Case("train", override, lambda t, o=override: [*o.split(), "eval.metrics=[fid,pr]"], (key, fix))
    for override, key, fix in BAD_VALUES
]
if importlib.util.find_spec("wandb") is None:
    CASES.append(Case("train", "logger", lambda t: ["logger=wandb"], ("pip install", "logger=csv")))


# ---- prepare.py: a dest that is, holds or lies inside its source, or that it did not write; a count of nothing.
def _prepare(tmp: Path, dest: Path, *extra: str) -> list[str]:
    return [f"source={_folder_with_a_speck(tmp)}", f"dest={dest}", "resolution=16", *extra]


def _a_folder_of_the_users(tmp: Path) -> Path:
    (tmp / "datasets").mkdir()
    (tmp / "datasets" / "notes.txt").write_text("the user's")
    return tmp / "datasets"


CASES += [
    Case(
        "prepare",
        "dest=source format=shards overwrite",
        lambda t: _prepare(t, t / "images", "format=shards", "overwrite=true"),
        ("is the input source=", "nothing was written or removed", "dest="),
    ),
    Case(
        "prepare",
        "dest holds the source, overwrite",
        lambda t: _prepare(t, t, "overwrite=true"),
        ("holds the input source=", "would remove it", "outside the source"),
    ),
    Case(
        "prepare",
        "dest inside the source",
        lambda t: _prepare(t, t / "images" / "o.zip"),
        ("lies inside the input source=", "outside the source"),
    ),
    Case(
        "prepare",
        "a folder as a zip's dest, overwrite",
        lambda t: _prepare(t, _a_folder_of_the_users(t), "format=zip", "overwrite=true"),
        ("a zip never replaces a folder", "Choose another dest="),
    ),
    Case(
        "prepare",
        "a folder of the user's as dest, overwrite",
        lambda t: _prepare(t, _a_folder_of_the_users(t), "format=shards", "overwrite=true"),
        ("not an earlier output of prepare.py", "Choose another dest="),
    ),
    Case(
        "prepare",
        "max_images=0",
        lambda t: _prepare(t, t / "o.zip", "max_images=0"),
        ("max_images=0", "leave max_images out"),
    ),
]


# ---- Command lines a new user tried at stylize.py, evaluate.py, generate.py and train.py, and Hydra's own refusals
# of a command line (an unknown option, a wrong type, a key no schema has), each now one paragraph at start-up.
# `untouched`: the user's files (the photo, the training run's record) are byte for byte what they were.
PKL = Path(__file__).resolve().parent / "fixtures" / "nvlabs" / "sg2ada_resnet_32px.pkl"
GAN_PART = importlib.util.find_spec("pixelsmith.gan") is not None


def _training_run(tmp: Path) -> Path:
    """What a finished training run leaves in its dir (the parts evaluate.py must not replace)."""
    run = tmp / "trained"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- max_steps=2\n")
    (run / RUN_MARKER).write_text("max_steps: 2\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"a checkpoint")
    return run


def _finished_checkpoint(tmp: Path, model: str, iteration: int) -> Path:
    """A checkpoint of `model` at `iteration` (its run finished there), with its stored run config."""
    path = tmp / f"{model}.ckpt"
    torch.save(
        {
            "state_dict": {"net.weight": torch.zeros(2)},
            "pixelsmith": {"iteration": iteration},
            "pixelsmith_config": {"model": {"name": model}, "max_steps": iteration},
        },
        path,
    )
    return path


def _hard_link(photo: Path, link: Path) -> Path:
    """`photo` (made by `_stylize`'s arguments first) under a second name."""
    _png(photo, 40, 32)
    os.link(photo, link)
    return photo


def _generate(tmp: Path, *extra: str) -> list[str]:
    return [f"ckpt_path={PKL}", "progress_bar=false", "device=cpu", f"outdir={tmp / 'images'}", *extra]


CASES += [
    # stylize.py: an output that is, or lies inside, an input
    Case(
        "stylize",
        "output is the input photo",
        lambda t: _stylize(t, input=str(t / "photos" / "a.png"), output=str(t / "photos" / "a.png")),
        ("output=", "would overwrite input=", "Nothing was written", "a_stylized.png"),
        untouched=True,
    ),
    Case(
        "stylize",
        "output is another name of the input photo (a hard link)",
        lambda t: _stylize(
            t, input=str(_hard_link(t / "photos" / "a.png", t / "link.png")), output=str(t / "link.png")
        ),
        ("would overwrite input=",),
        untouched=True,
    ),
    Case(
        "stylize",
        "output folder holds the input photo",
        lambda t: _stylize(t, input=str(t / "photos" / "a.png"), output=str(t / "photos")),
        ("would overwrite input=",),
        untouched=True,
    ),
    Case(
        "stylize",
        "output is the input folder",
        lambda t: _stylize(t, output=str(t / "photos")),
        ("is the input folder", "photos_stylized"),
        untouched=True,
    ),
    Case(
        "stylize",
        "output inside the input folder",
        lambda t: _stylize(t, output=str(t / "photos" / "stylized")),
        ("inside the input folder",),
        untouched=True,
    ),
    Case("stylize", "negative workers", lambda t: _stylize(t, workers="-1"), ("workers=-1", "or auto")),
    # evaluate.py
    Case("evaluate", "no checkpoint", lambda t: [], ("ckpt_path=", "checkpoints/last.ckpt")),
    Case(
        "evaluate",
        "unknown metric",
        lambda t: [f"ckpt_path={t / 'x.ckpt'}", "eval.metrics=[fud]"],
        ("eval.metrics=['fud']", "fid, kid, pr, is"),
    ),
    Case(
        "evaluate",
        "no samples",
        lambda t: [f"ckpt_path={t / 'x.ckpt'}", "eval.num_samples=0"],
        ("eval.num_samples=0", "at least 2", "eval.num_samples=2000"),
    ),
    Case(
        "evaluate",
        "into the training run's dir",
        lambda t: [
            f"ckpt_path={_training_run(t) / 'checkpoints' / 'last.ckpt'}",
            f"hydra.run.dir={t / 'trained'}",
        ],
        ("hydra.run.dir=", "a training run", ".hydra/", "Leave hydra.run.dir unset"),
        untouched=True,
    ),
    # generate.py (checked before the network loads, so the pickle is never read)
    Case(
        "generate",
        "video on /proc",
        lambda t: _generate(t, "mode=video", "seeds=[0,1]", "video.path=/proc/walk.gif"),
        ("video.path=/proc/walk.gif", "cannot be written"),
    ),
    Case(
        "generate",
        "outdir is a file",
        lambda t: [*_generate(t), f"outdir={_a_file(t)}"],
        ("outdir=", "a file, not a folder"),
        untouched=True,
    ),
    Case(
        "generate",
        "negative psi",
        lambda t: _generate(t, "truncation_psi=-3"),
        ("truncation_psi=-3", "[-1, 2]"),
    ),
    Case(
        "generate",
        "negative cutoff",
        lambda t: _generate(t, "truncation_cutoff=-1"),
        ("truncation_cutoff=-1",),
    ),
    Case(
        "generate",
        "noise mode",
        lambda t: _generate(t, "noise_mode=bogus"),
        ("noise_mode=bogus", "const, random"),
    ),
    Case("generate", "batch of 0", lambda t: _generate(t, "batch_size=0"), ("batch_size=0", "batch_size=16")),
    Case(
        "generate",
        "grid of 0 columns",
        lambda t: _generate(t, "mode=grid", "grid_columns=0"),
        ("grid_columns=0",),
    ),
    Case(
        "generate",
        "projection target among the outputs",
        lambda t: _generate(t, "mode=project", f"project.target={_png(t / 'images' / 'target.png', 32, 32)}"),
        ("project.target=", "would be overwritten", "outdir="),
        untouched=True,
    ),
    # train.py: ranges, checkpoints of another model, the environment
    Case("train", "z_dim 0", lambda t: ["model.generator.z_dim=0"], ("model.generator.z_dim=0", "z_dim=128")),
    Case(
        "train",
        "prometheus port",
        lambda t: ["callbacks=prometheus", "callbacks.prometheus.port=99999"],
        ("callbacks.prometheus.port=99999", "0..65535"),
    ),
    Case(
        "train",
        "a finished style checkpoint",
        lambda t: [f"ckpt_path={_finished_checkpoint(t, 'style_fast', 5000)}"],
        ("model: style_fast in the checkpoint, dcgan here", "leave out ckpt_path"),
    ),
    Case(
        "train",
        "a finished DCGAN checkpoint under model=stylegan2",
        lambda t: [*SG2, "max_steps=2", f"ckpt_path={_finished_checkpoint(t, 'dcgan', 2)}"],
        ("model: dcgan in the checkpoint, stylegan2 here",),
    ),
    Case(
        "train",
        "PIXELSMITH_CACHE a file",
        lambda t: [],
        ("PIXELSMITH_CACHE=", "a file, not a folder"),
        env=lambda t: {"PIXELSMITH_CACHE": str(_a_file(t))},
    ),
    Case(
        "train",
        "PIXELSMITH_ROOT nowhere",
        lambda t: [],
        ("PIXELSMITH_ROOT=", "not a folder", "unset it"),
        env=lambda t: {"PIXELSMITH_ROOT": str(t / "nonexistent")},
    ),
    Case("train", "no such model", lambda t: ["model=foo"], ("model group's options", "dcgan", "stylegan2")),
    Case(
        "train",
        "optuna storage no driver opens",
        lambda t: ["-m", "hparams_search=gan_optuna", "hydra.sweeper.storage=notadb://x"],
        ("hydra.sweeper.storage=notadb://x", "sqlite:///"),
    ),
    # Hydra's own refusals, composing the config
    Case(
        "train",
        "unknown precision",
        lambda t: ["precision=8-mixed"],
        ("precision=8-mixed", "config group precision", "16-mixed, 32-true, auto, bf16-mixed"),
    ),
    Case("train", "seed of the wrong type", lambda t: ["seed=abc"], ("seed=abc", "an integer", "seed=42")),
    Case(
        "train",
        "a key of another model",
        lambda t: ["model.generator.channel_base=0"],
        ("model.generator.channel_base is not a key", "ngf", "model=stylegan2"),
    ),
    Case(
        "train",
        "R3GAN's lists at another resolution",
        lambda t: ["model=r3gan", "data.resolution=16"],
        ("data.resolution=16", "model.generator.widths", "3 values", "data.resolution=32"),
    ),
    Case("train", "an override Hydra cannot parse", lambda t: ["seed=[1"], ("'seed=[1'", "override grammar")),
]


# ---- Hostile files a user may be handed: checkpoints whose stored config names code, a network pickle that is
# damaged, a style checkpoint sized far beyond its weights, a dataset.json that is not [name, label] pairs. Each is
# refused like a bad command line: one paragraph, at start-up, nothing run (tests/test_checkpoint_configs.py and
# tests/test_gan_nvlabs_hostile.py hold the full sets).
def _gan_checkpoint(tmp: Path, edit: Callable[[dict], None]) -> Path:
    """A DCGAN checkpoint (real, untrained weights) whose stored run config `edit` changes."""
    from omegaconf import OmegaConf

    from pixelsmith.run.build import build_core_settings, build_model, resolve_hardware

    cfg = compose_config([*FAST, *SMALL["dcgan"]], tmp / "trained")
    model = build_model(cfg, build_core_settings(cfg, resolve_hardware(cfg)))
    config = OmegaConf.to_container(cfg, resolve=True)
    edit(config)
    path = tmp / "shared.ckpt"
    torch.save(
        {"state_dict": model.state_dict(), "pixelsmith": {"iteration": 1}, "pixelsmith_config": config}, path
    )
    return path


def _code_node(tmp: Path) -> dict:
    return {"_target_": "builtins.open", "file": str(tmp / "payload_ran"), "mode": "w"}


def _stealth(config: dict, tmp: Path) -> None:
    config["model"]["generator"]["channels"] = {"_target_": "builtins.max", "_args_": [1, _code_node(tmp)]}


def _damaged_pickle(tmp: Path) -> Path:
    data = (Path(__file__).resolve().parent / "fixtures" / "nvlabs" / "sg2ada_resnet_32px.pkl").read_bytes()
    (tmp / "cut.pkl").write_bytes(data[: len(data) // 3])
    return tmp / "cut.pkl"


def _wide_style_checkpoint(tmp: Path) -> Path:
    from pixelsmith.style.networks import TransformerNet

    state = {
        f"stylizer.{k}": v
        for k, v in TransformerNet(base_channels=4, num_residual_blocks=1).state_dict().items()
    }
    config = {"model": {"stylizer": {"base_channels": 20_000, "num_residual_blocks": 1}}}
    torch.save({"state_dict": state, "pixelsmith_config": config}, tmp / "wide.ckpt")
    return tmp / "wide.ckpt"


def _zip_with_labels(tmp: Path, labels: object) -> Path:
    path = _zip_at(tmp, 16)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("dataset.json", json.dumps({"labels": labels}))
    return path


CASES += [
    Case(
        "evaluate",
        "a checkpoint whose objective is code",
        lambda t: [f"ckpt_path={_gan_checkpoint(t, lambda c: c['model'].update(objective=_code_node(t)))}"],
        ("model.objective._target_", "builtins.open", "never called"),
        untouched=True,
    ),
    Case(
        "evaluate",
        "a checkpoint whose data node is code",
        lambda t: [f"ckpt_path={_gan_checkpoint(t, lambda c: c.update(data=_code_node(t)))}"],
        ("'builtins.open'", "conf/data/"),
        untouched=True,
    ),
    Case(
        "generate",
        "the stealth checkpoint",
        lambda t: [f"ckpt_path={_gan_checkpoint(t, lambda c: _stealth(c, t))}", f"outdir={t / 'out'}"],
        ("model.generator.channels._target_", "builtins.max"),
        untouched=True,
    ),
    Case(
        "generate",
        "a checkpoint sized beyond its weights",
        lambda t: [
            f"ckpt_path={_gan_checkpoint(t, lambda c: c['model']['generator'].update(ngf=200_000))}",
            f"outdir={t / 'out'}",
        ],
        ("do not fit its own stored config", "Nothing was allocated"),
        untouched=True,
    ),
    Case(
        "generate",
        "a damaged NVlabs pickle",
        lambda t: [f"ckpt_path={_damaged_pickle(t)}", f"outdir={t / 'out'}"],
        ("is damaged or is not an NVlabs network pickle",),
        untouched=True,
    ),
    Case(
        "train",
        "labels as a dict in dataset.json",
        lambda t: [
            "data=zip",
            f"data.path={_zip_with_labels(t, {'00000/img00000000.png': 1})}",
            "data.resolution=16",
        ],
        ("dataset.json",),
    ),
    Case(
        "prepare",
        "negative labels in dataset.json",
        lambda t: [
            f"source={_zip_with_labels(t, [[f'00000/img{i:08d}.png', -1] for i in range(4)])}",
            f"dest={t / 'o.zip'}",
            "resolution=16",
        ],
        ("dataset.json",),
    ),
]
if STYLE_PART:
    CASES.append(
        Case(
            "stylize",
            "a style checkpoint sized beyond its weights",
            lambda t: [*_stylize(t)[1:], f"ckpt_path={_wide_style_checkpoint(t)}"],
            ("do not fit its own stored config", "Nothing was allocated"),
        )
    )


def _refusal(case: Case, tmp: Path, capsys) -> str:
    """The paragraph the case is refused with; raises AssertionError when it is not refused cleanly."""
    args = case.args(tmp)
    before = _snapshot(tmp) if case.untouched else None
    env = case.env(tmp) if case.env is not None else {}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        message = _refusal_of(case.entry, args, tmp, capsys)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if before is not None:
        assert _snapshot(tmp) == before, "the refusal changed the user's files"
    return message


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"/" for p in folder.rglob("*")}


def _one_line(said) -> str:
    assert "Traceback" not in said.out + said.err
    lines = [line for line in said.err.splitlines() if line.strip()]
    assert len(lines) == 1, said.err
    return lines[0]


def _compose_with_hydra(overrides: list[str], config_name: str):
    """The config as `@hydra.main` composes it, Hydra's own node included (its callbacks, its sweeper)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from pixelsmith.config.paths import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=True)


class _NoJobs:
    """A sweep's launcher for a refusal: a refused sweep starts no job."""

    def launch(self, *args, **kwargs):
        raise AssertionError("a job was launched")


def _refusal_of(entry: str, args: list[str], tmp: Path, capsys) -> str:
    if entry in ("stylize", "prepare"):
        if entry == "stylize":
            from pixelsmith.style.stylize import main
        else:
            from pixelsmith.data.prepare import main

        capsys.readouterr()
        code = main(args)
        said = capsys.readouterr()
        assert code == 2, f"exit status {code}"
        return _one_line(said)
    from hydra.errors import HydraException
    from hydra.utils import instantiate
    from omegaconf.errors import OmegaConfBaseException

    from pixelsmith.config.hydra_errors import composition_error_message

    given = [a.split("=", 1)[1] for a in args if a.startswith(("paths.output_dir=", "hydra.run.dir="))]
    run_dir = Path(given[0]) if given else tmp / "run"
    args = [a for a in args if not a.startswith("paths.output_dir=")]
    names_a_job = any(a.startswith(("model=", "experiment=")) for a in args)
    base = [*FAST] if names_a_job else [*FAST, *SMALL["dcgan"]]
    config_name = {"train": "train", "evaluate": "evaluate", "generate": "generate"}[entry]
    overrides = {
        "train": [*base, "max_steps=2", *args],
        "evaluate": ["~local", "hardware=cpu", *args],
        "generate": args,
    }[entry]
    sweep = "-m" in overrides
    overrides = [o for o in overrides if o != "-m"]
    hydra_run_dir = any(o.startswith("hydra.run.dir=") for o in overrides)
    try:
        if sweep or hydra_run_dir:
            # What Hydra runs before the job: the run dir's callback, or the sweeper starting its study.
            hydra_cfg = _compose_with_hydra(overrides, config_name)
            capsys.readouterr()
            try:
                if sweep:
                    sweeper = instantiate(hydra_cfg.hydra.sweeper)
                    sweeper.config, sweeper.launcher = hydra_cfg, _NoJobs()
                    sweeper.sweep([])
                else:
                    for callback in hydra_cfg.hydra.callbacks.values():
                        instantiate(callback).on_run_start(hydra_cfg)
            except SystemExit as stop:
                assert stop.code == 2, f"exit status {stop.code}"
                return _one_line(capsys.readouterr())
            assert not sweep, "the sweep was not refused"
        if entry == "generate":
            from pixelsmith.gan.generate import run as job

            cfg = compose_config(overrides, run_dir, "generate")
        elif entry == "evaluate":
            from pixelsmith.run.evaluate import evaluate as job

            cfg = compose_config(overrides, run_dir, "evaluate")
        else:
            from pixelsmith.run.fit import run as job

            cfg = compose_config(overrides, run_dir)
    except (HydraException, OmegaConfBaseException) as err:  # Hydra's refusal, as the entry points print it
        message = composition_error_message(err)
        assert message is not None, f"{type(err).__name__}: {err}"
        return message
    try:
        job(cfg)
    except PixelsmithError as err:
        message = str(err)
    else:
        raise AssertionError("not refused")
    assert "\n" not in message.strip(), message
    if not given:
        # The run dir holds nothing that would make the corrected command refuse it (run_dir.RUN_MARKER).
        assert not (run_dir / RUN_MARKER).exists() and not (run_dir / "checkpoints").exists()
    return message


def test_every_bad_input_is_refused_cleanly_at_every_entry_point(tmp_path, capsys):
    refused, failures = Counter(), []
    for number, case in enumerate(CASES):
        scratch = tmp_path / f"case{number}"
        scratch.mkdir()
        try:
            message = _refusal(case, scratch, capsys)
            missing = [w for w in case.words if w not in message]
            assert not missing, f"{missing} not in: {message}"
        except pytest.skip.Exception:
            continue
        except BaseException as err:  # noqa: BLE001  (every way a case can fail is a failure to report)
            failures.append(f"{case.entry} [{case.name}]: {type(err).__name__}: {str(err)[:400]}")
            continue
        refused[case.entry] += 1
    total = sum(refused.values()) + len(failures)
    with capsys.disabled():
        per_entry = ", ".join(f"{entry} {count}" for entry, count in sorted(refused.items()))
        print(f"\nbad inputs refused cleanly: {sum(refused.values())} of {total} ({per_entry})")
    assert not failures, "\n".join(failures)
    entry_points = (
        {"train", "evaluate", "prepare"}
        | ({"stylize"} if STYLE_PART else set())
        | ({"generate"} if GAN_PART else set())
    )
    assert set(refused) == entry_points  # every entry point is covered


def test_a_refused_run_leaves_its_run_dir_to_the_corrected_command(make_cfg, tmp_path, caplog):
    """A data refusal at start-up, then the corrected command with the same run dir: it runs, without
    train.overwrite, and the images left out are counted in one warning."""
    from pixelsmith.run.fit import run

    folder = _folder_with_a_speck(tmp_path)
    data = ["data=image_folder", f"data.root={folder}", "data.resolution=32", "train.sample_every_n_steps=0"]
    with pytest.raises(PixelsmithError, match="far smaller"):
        run(make_cfg(*data, "data.on_corrupt=error", "max_steps=1"))
    with caplog.at_level("WARNING"):
        metrics = run(make_cfg(*data, "data.on_corrupt=skip", "data.batch_size=4", "max_steps=1"))
    assert metrics["iteration"] == 1 and metrics["data/skipped_files"] == 1
    warned = [r.getMessage() for r in caplog.records if "far smaller" in r.getMessage()]
    assert len(warned) == 1 and "1 of 9 images" in warned[0] and "left out of training" in warned[0]


def test_a_refusal_inside_lightnings_set_up_gives_the_run_dir_back(make_cfg, tmp_path, monkeypatch):
    """Refused after config_resolved.yaml was written (a check that runs in Lightning's set-up): the marker goes,
    so the corrected command is not told the dir holds another run."""
    from pixelsmith.data.mnist import MNISTDataModule
    from pixelsmith.run.fit import run

    original = MNISTDataModule.setup

    def refuse(self, stage=None):
        raise PixelsmithError("refused in set-up (a stand-in for any set-up check)")

    monkeypatch.setattr(MNISTDataModule, "setup", refuse)
    with pytest.raises(PixelsmithError, match="stand-in"):
        run(make_cfg("max_steps=1"))
    assert not (tmp_path / "run" / RUN_MARKER).exists()
    monkeypatch.setattr(MNISTDataModule, "setup", original)
    assert run(make_cfg("max_steps=1", "train.sample_every_n_steps=0"))["iteration"] == 1


def test_train_py_refuses_a_run_dir_it_cannot_create_in_one_paragraph(tmp_path, capsys):
    """The Hydra callback that claims the run dir before Hydra writes into it: an OSError there was a traceback."""
    from omegaconf import OmegaConf

    from pixelsmith.run.run_dir import ClaimRunDirFirst

    config = OmegaConf.create(
        {"hydra": {"run": {"dir": str(_a_file(tmp_path) / "run")}}, "train": {"auto_resume": True}}
    )
    with pytest.raises(SystemExit) as stop:
        ClaimRunDirFirst().on_run_start(config)
    said = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in said and said.count("\n") == 1
    assert "cannot be created or written: a part of the path is a file" in said and "hydra.run.dir=" in said


def test_prepare_skips_and_counts_images_far_smaller_than_the_resolution(tmp_path, capsys):
    from pixelsmith.data.prepare import main

    folder = _folder_with_a_speck(tmp_path)
    assert main([f"source={folder}", f"dest={tmp_path / 'o.zip'}", "resolution=32", "progress=false"]) == 0
    said = capsys.readouterr().out
    assert "wrote 8 images" in said and "skipped 1: 1 ImageTooSmallError" in said and "speck.png: " in said
    with zipfile.ZipFile(tmp_path / "o.zip") as archive:
        assert json.loads(archive.read("dataset.json"))["labels"] is None


@pytest.mark.slow  # several entry points started as a user starts them (about 5 s each)
def test_the_entry_points_print_hydras_refusals_and_start_up_checks_as_one_paragraph(tmp_path):
    """What only the running scripts show: Hydra's refusals (composing the config, before any Pixelsmith code runs)
    and the run-dir callback's reach the user as one `[pixelsmith]` paragraph with exit status 2 and no traceback;
    a refusal in the job (R3GAN's lists) too; and evaluate.py leaves a training run's `.hydra/` record as it was."""
    from tests.conftest import run_cli

    trained = _training_run(tmp_path)
    record = _snapshot(trained)
    commands = [
        (["train.py", "precision=8-mixed"], "config group precision: choose one of 16-mixed, 32-true, auto"),
        (
            ["train.py", "-m", "precision=8-mixed"],
            "config group precision",
        ),  # a sweep's config, composed first
        (["train.py", "seed=abc"], "seed takes an integer, e.g. seed=42"),
        (["train.py", "model.generator.channel_base=0"], "It is a key of model=stylegan2"),
        (
            [
                "train.py",
                "hardware=cpu",
                "model=r3gan",
                "data.resolution=16",
                f"hydra.run.dir={tmp_path / 'r3'}",
            ],
            "must each list 3 values",
        ),
        (["evaluate.py", "hardware=cpu", f"hydra.run.dir={tmp_path / 'e'}"], "none is given: add ckpt_path="),
        (
            ["evaluate.py", f"ckpt_path={trained / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={trained}"],
            "already holds another command's outputs",
        ),
    ]
    if GAN_PART:
        commands.append(
            (
                ["generate.py", f"ckpt_path={PKL}", "noise_mode=bogus", f"hydra.run.dir={tmp_path / 'g'}"],
                "noise_mode=bogus: choose one of const, random, none",
            )
        )
    for args, says in commands:
        result = run_cli(args, timeout=300)
        said = result.stdout + result.stderr
        assert result.returncode == 2, (args, said[-2000:])
        assert "Traceback" not in said and "HYDRA_FULL_ERROR" not in said, (args, said[-2000:])
        lines = [line for line in said.splitlines() if says in line]
        assert len(lines) == 1, (args, said[-2000:])
    assert _snapshot(trained) == record  # no .run.lock, no replaced .hydra/overrides.yaml
