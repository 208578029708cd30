"""A checkpoint's stored run config is data: nothing in it is instantiated, imported or called.

A file that passes `torch.load(weights_only=True)` can still carry Hydra nodes (`_target_: torch.load` with
`weights_only: false` on bytes inside the file, `builtins.open` + `builtins.print`, `os.system`), at any depth of
its stored `pixelsmith_config`. Each gadget below is planted in a real DCGAN checkpoint (real weights) at every
place a config names a class (generator, discriminator, objective, its loss and regularizers, augment, data) and
hidden as a value (a generator's `channels`, the stealth node); every entry point that reads a checkpoint
(`evaluate.py`, `generate.py`, `stylize.py`, a resume, `model.init_from`) must refuse it in one paragraph, exit 2,
or not read it at all, and the marker the payload would write never appears.

Also here: the allow-list is the config tree's (a class `conf/` names at that place, a fork's own included), stored
values are typed by the option's schema, and a stored config that sizes a network beyond its file's weights is
refused before any memory is taken.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pixelsmith.config.paths import REPO_ROOT
from pixelsmith.errors import PixelsmithError
from tests.conftest import FAST, SMALL, compose_config

pytest.importorskip("pixelsmith.gan")
from pixelsmith.gan.networks.dcgan import DCGANGenerator  # noqa: E402


class _WritesMarker:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _gadgets(marker: Path) -> dict[str, dict]:
    """Hydra nodes that, instantiated, write `marker` (the stand-in for any code a file could run)."""
    unsafe_bytes = pickle.dumps(_WritesMarker(marker)).hex()
    torch_load = {
        "_target_": "torch.load",
        "f": {
            "_target_": "io.BytesIO",
            "_args_": [{"_target_": "builtins.bytes.fromhex", "_args_": [unsafe_bytes]}],
        },
        "weights_only": False,
    }
    return {
        "torch.load": torch_load,
        "open+print": {
            "_target_": "builtins.print",
            "_args_": ["echo owned"],
            "file": {"_target_": "builtins.open", "_args_": [str(marker), "a"]},
        },
        "os.system": {"_target_": "os.system", "_args_": [f"touch {marker}"]},
        # Keyword arguments only, no `_args_`: refused by the class allow-list alone.
        "open (keywords)": {"_target_": "builtins.open", "file": str(marker), "mode": "w"},
    }


# Where a gadget is planted: a path into pixelsmith_config, and whether it replaces the node or hides inside it.
PLACES = {
    "generator": ("model", "generator"),
    "discriminator": ("model", "discriminator"),
    "objective": ("model", "objective"),
    "objective.loss": ("model", "objective", "loss"),
    "regularizer": ("model", "objective", "regularizers", "r1"),
    "augment": ("augment",),
    "data": ("data",),
    "generator.channels (stealth)": ("model", "generator", "channels"),
}


def _plant(config: dict, place: tuple[str, ...], gadget: dict) -> dict:
    config = copy.deepcopy(config)
    node = config
    for key in place[:-1]:
        node = node[key]
    if (
        place[-1] == "channels"
    ):  # the stealth variant: a value that builds to 1 and runs the payload on the way
        node[place[-1]] = {"_target_": "builtins.max", "_args_": [1, gadget]}
    else:
        node[place[-1]] = gadget
    return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A real DCGAN run's last checkpoint (two iterations)."""
    from pixelsmith.run.fit import run

    run_dir = tmp_path_factory.mktemp("dcgan") / "run"
    run(compose_config([*FAST, *SMALL["dcgan"], "max_steps=2"], run_dir))
    return run_dir / "checkpoints" / "last.ckpt"


def _with_config(trained: Path, folder: Path, name: str, config: dict) -> Path:
    checkpoint = torch.load(trained, map_location="cpu", weights_only=True)
    checkpoint["pixelsmith_config"] = config
    path = folder / f"{name}.ckpt"
    torch.save(checkpoint, path)
    return path


def _evaluate(path: Path, out: Path):
    from pixelsmith.run.evaluate import evaluate

    cfg = compose_config(
        ["~local", "hardware=cpu", f"ckpt_path={path}", "eval.num_samples=16", "eval.reference_samples=16"],
        out,
        "evaluate",
    )
    return evaluate(cfg)


def _generate(path: Path, out: Path):
    from pixelsmith.gan.pretrained import load_generator

    return load_generator(str(path))


def _stylize(path: Path, out: Path):
    pytest.importorskip("pixelsmith.style")
    from pixelsmith.style.stylize import load_stylizer_from_checkpoint

    return load_stylizer_from_checkpoint(path)


def _resume(path: Path, out: Path):
    from pixelsmith.run.fit import run

    return run(compose_config([*FAST, *SMALL["dcgan"], "max_steps=3", f"ckpt_path={path}"], out))


def _init_from(path: Path, out: Path):
    from pixelsmith.run.fit import run

    return run(compose_config([*FAST, *SMALL["dcgan"], "max_steps=1", f"model.init_from={path}"], out))


# Entry points that build networks from the stored config (must refuse), and those that only compare it or read
# weights (must not run it; refusing is allowed).
BUILDERS = {"evaluate": _evaluate, "generate": _generate}
READERS = {"stylize": _stylize, "resume": _resume, "init_from": _init_from}


def _refusal(entry, path: Path, out: Path) -> str:
    try:
        entry(path, out)
    except PixelsmithError as err:
        return str(err)
    except RuntimeError as err:  # stylize's own CheckpointFormatError (no stylizer in a GAN checkpoint)
        return str(err)
    raise AssertionError("not refused")


@pytest.mark.parametrize("gadget_name", ["torch.load", "open+print", "os.system", "open (keywords)"])
def test_a_gadget_anywhere_in_the_stored_config_is_refused_and_never_runs(trained, tmp_path, gadget_name):
    marker = tmp_path / "payload_ran"
    # The gadget is real: instantiated the way the old readers did, it writes the marker.
    from hydra.utils import instantiate

    proof = tmp_path / "proof_ran"
    with contextlib.suppress(Exception):  # what the call returns or raises does not matter: the marker does
        instantiate(_gadgets(proof)[gadget_name])
    # (Hydra's own blocklist stops os.system, "best-effort, not a security boundary" in its words: not a defence.)
    assert proof.exists() or gadget_name == "os.system", (
        "the gadget must be able to run code when instantiated"
    )

    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    refused = []
    for place_name, place in PLACES.items():
        path = _with_config(
            trained, tmp_path, place_name.split()[0], _plant(config, place, _gadgets(marker)[gadget_name])
        )
        for entry_name, entry in BUILDERS.items():
            message = _refusal(entry, path, tmp_path / f"{entry_name}_{place_name.split()[0]}")
            assert "\n" not in message.strip(), message
            assert "pixelsmith_config" in message and "refused" in message, message
            assert not marker.exists(), f"{entry_name} ran the payload planted at {place_name}"
            refused.append((entry_name, place_name))
        for entry_name, entry in READERS.items():
            if entry_name != "stylize" and place_name not in ("generator", "data"):
                continue  # a resume and init_from read the file the same way wherever the gadget is
            with contextlib.suppress(PixelsmithError, RuntimeError):
                entry(path, tmp_path / f"{entry_name}_{place_name.split()[0]}")
            assert not marker.exists(), f"{entry_name} ran the payload planted at {place_name}"
    assert len(refused) == len(PLACES) * len(BUILDERS)


def test_the_entry_points_refuse_a_stealth_checkpoint_with_exit_2_and_write_nothing(trained, tmp_path):
    """The stealth variant through the commands themselves: generate.py used to write its PNGs and exit 0."""
    marker = tmp_path / "payload_ran"
    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    stealth = _plant(config, PLACES["generator.channels (stealth)"], _gadgets(marker)["torch.load"])
    path = _with_config(trained, tmp_path, "stealth", stealth)
    environ = {**os.environ, "PIXELSMITH_OFFLINE": "1"}
    commands = {
        "generate.py": ["generate.py", f"ckpt_path={path}", "seeds=0-1", f"outdir={tmp_path / 'generated'}"],
        "evaluate.py": [
            "evaluate.py",
            f"ckpt_path={path}",
            "hardware=cpu",
            f"hydra.run.dir={tmp_path / 'evaluated'}",
        ],
    }
    for name, command in commands.items():
        done = subprocess.run(
            [sys.executable, *command],
            cwd=REPO_ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=300,
        )
        said = done.stdout + done.stderr
        assert done.returncode == 2, f"{name}: exit {done.returncode}\n{said[-2000:]}"
        assert "Traceback" not in said, said[-2000:]
        assert "builtins.max" in said and "generator.channels" in said, said[-2000:]
        assert not marker.exists(), f"{name} ran the payload"
    assert not (tmp_path / "generated").exists() or not any((tmp_path / "generated").iterdir())
    assert not (tmp_path / "evaluated" / "metrics.json").exists()


def test_a_class_the_tree_names_elsewhere_is_refused_at_a_place_it_does_not(trained, tmp_path):
    """The allow-list is by place: the discriminator class at model.generator, a logger class at model.objective
    (both named somewhere in conf/) are refused, naming what the tree allows there."""
    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    swapped = copy.deepcopy(config)
    swapped["model"]["generator"]["_target_"] = config["model"]["discriminator"]["_target_"]
    message = _refusal(_generate, _with_config(trained, tmp_path, "swapped", swapped), tmp_path)
    assert "model.generator._target_" in message and "DCGANGenerator" in message, message
    logger = copy.deepcopy(config)
    logger["model"]["objective"] = {
        "_target_": "lightning.pytorch.loggers.TensorBoardLogger",
        "save_dir": "x",
    }
    message = _refusal(_evaluate, _with_config(trained, tmp_path, "logger", logger), tmp_path / "ev")
    assert "TensorBoardLogger" in message and "model.objective._target_" in message, message
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (
            lambda c: c["model"]["generator"].update(ngf="many"),
            ("model.generator", "ngf", "schema DCGANModelConfig"),
        ),  # wrong type
        (lambda c: c["model"]["generator"].update(nfg=16), ("nfg", "schema DCGANModelConfig")),  # unknown key
        (
            lambda c: c["model"]["generator"].update(norm="telepathy"),
            ("telepathy", "batch", "schema DCGANModelConfig"),
        ),  # not a choice
        (lambda c: c["model"]["generator"].update(_recursive_=True), ("_recursive_",)),
        (lambda c: c["model"]["objective"].update(gamma=1.0), ("gamma", "GANObjective")),  # not an argument
        (lambda c: c["data"].update(resolution="${oc.env:HOME}"), ("interpolation",)),
        (lambda c: c["model"].update(name="no_such_model"), ("no_such_model", "conf/model/")),
    ],
)
def test_stored_values_are_typed_by_the_options_schema(trained, tmp_path, edit, words):
    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    edited = copy.deepcopy(config)
    edit(edited)
    path = _with_config(trained, tmp_path, "edited", edited)
    for entry in (_generate, _evaluate):
        message = _refusal(entry, path, tmp_path / entry.__name__)
        missing = [w for w in words if w not in message]
        assert not missing, f"{missing} not in: {message}"
        assert "\n" not in message.strip()


def test_a_forks_class_named_by_a_yaml_of_its_own_is_allowed(trained, tmp_path, monkeypatch):
    """The allow-list comes from conf/: a generator class a (fork's) YAML names at model.generator is taken."""
    from pixelsmith.config import stored

    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    forked = copy.deepcopy(config)
    forked["model"]["generator"]["_target_"] = "tests.test_checkpoint_configs.ForkGenerator"
    path = _with_config(trained, tmp_path, "fork", forked)
    message = _refusal(_generate, path, tmp_path)
    assert "ForkGenerator" in message and "conf/" in message  # not named by the tree: refused
    classes = dict(stored.classes_in_tree())
    classes[("model", "generator")] = classes[("model", "generator")] | {
        forked["model"]["generator"]["_target_"]
    }
    monkeypatch.setattr(stored, "classes_in_tree", lambda: classes)
    generator, info = _generate(path, tmp_path)
    assert isinstance(generator, ForkGenerator) and info["model"] == "dcgan"


def test_the_tree_allow_list_is_read_from_conf():
    """Every shipped network, objective part, datamodule and augment pipe is allowed where conf/ puts it, and
    nothing from a logger or callback group leaks into the model's places."""
    from pixelsmith.config.stored import classes_in_tree

    classes = classes_in_tree()
    assert "pixelsmith.gan.networks.stylegan2.StyleGAN2Generator" in classes[("model", "generator")]
    assert "pixelsmith.gan.objectives.R3GANObjective" in classes[("model", "objective")]
    assert "pixelsmith.gan.objectives.R1Penalty" in classes[("model", "objective", "regularizers", "*")]
    assert "pixelsmith.gan.objectives.HingeLoss" in classes[("model", "objective", "loss")]
    assert "pixelsmith.data.mnist.MNISTDataModule" in classes[("data",)]
    assert "pixelsmith.augment.AdaptiveAugment" in classes[("augment",)]
    assert "torch.optim.Adam" in classes[("model", "g_optimizer")]  # a schema's default
    model_places = {path: targets for path, targets in classes.items() if path[:1] == ("model",)}
    assert not any("logger" in t.lower() or "callbacks" in t for ts in model_places.values() for t in ts)


def test_a_stored_width_beyond_the_files_weights_allocates_nothing(trained, tmp_path):
    """A stored config asking for a huge network beside small weights is refused on the meta device: the width
    (ngf 200,000: tens of GB) and the count (a network of more modules than the file's tensors) alike."""
    import resource

    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    wide = copy.deepcopy(config)
    wide["model"]["generator"]["ngf"] = 200_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    message = _refusal(_generate, _with_config(trained, tmp_path, "wide", wide), tmp_path)
    assert "do not fit its own stored config" in message and "Nothing was allocated" in message, message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KiB: no GB-sized tensor
    message = _refusal(_evaluate, _with_config(trained, tmp_path, "wide", wide), tmp_path / "ev")
    assert "do not fit" in message, message


def test_the_style_checkpoint_width_is_checked_before_allocation(tmp_path):
    """A 1 KB style checkpoint whose config says base_channels 20000 (28.8 GB) is refused in one paragraph."""
    pytest.importorskip("pixelsmith.style")
    from pixelsmith.style.networks import TransformerNet
    from pixelsmith.style.stylize import CheckpointFormatError, load_stylizer_from_checkpoint

    small = {"base_channels": 4, "num_residual_blocks": 1}
    state = {f"stylizer.{k}": v for k, v in TransformerNet(**small).state_dict().items()}
    for bad in (
        {"base_channels": 20_000, "num_residual_blocks": 1},
        {"base_channels": 4, "num_residual_blocks": 10**7},
    ):
        torch.save(
            {"state_dict": state, "pixelsmith_config": {"model": {"stylizer": bad}}}, tmp_path / "s.ckpt"
        )
        with pytest.raises(CheckpointFormatError) as refused:
            load_stylizer_from_checkpoint(tmp_path / "s.ckpt")
        assert "Nothing was allocated" in str(refused.value), refused.value
    torch.save(
        {"state_dict": state, "pixelsmith_config": {"model": {"stylizer": small}}}, tmp_path / "ok.ckpt"
    )
    assert isinstance(load_stylizer_from_checkpoint(tmp_path / "ok.ckpt"), TransformerNet)


class ForkGenerator(DCGANGenerator):
    """A fork's generator: the DCGAN generator under another class name (same arguments and weights)."""


def _gadget_in_a_list_of_lists(config: dict, marker: Path) -> None:
    config["model"]["objective"]["order"] = [[_gadgets(marker)["open (keywords)"]]]


@pytest.mark.parametrize(
    ("name", "edit", "words"),
    [
        ("a class in a list of lists", _gadget_in_a_list_of_lists, ("model.objective.order.[].[]._target_",)),
        (
            "a null _target_",
            lambda c, m: c["model"]["objective"]["loss"].update(_target_=None),
            ("NoneType",),
        ),
        ("a seed beyond 2^32", lambda c, m: c.update(seed=2**35), ("seed",)),
        ("the missing marker", lambda c, m: c["model"]["generator"].update(z_dim="???"), ("'???'",)),
        (
            "a dotted regularizer name",
            lambda c, m: c["model"]["objective"]["regularizers"].update({"a.b": {}}),
            ("'a.b'", "no config key"),
        ),
        (
            "an argument the loss does not take",
            lambda c, m: c["model"]["objective"]["loss"].update(foo=1),
            ("['foo']", "NonSaturatingLoss"),
        ),
    ],
)
def test_what_an_attack_on_the_check_tried_is_refused(trained, tmp_path, name, edit, words):
    """A review attacked the check with these (the first ran code through Hydra's recursion into nested lists)."""
    marker = tmp_path / "payload_ran"
    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    edited = copy.deepcopy(config)
    edit(edited, marker)
    path = _with_config(trained, tmp_path, "attack", edited)
    for entry in (_generate, _evaluate):
        message = _refusal(entry, path, tmp_path / entry.__name__)
        missing = [w for w in words if w not in message]
        assert not missing, f"{name}: {missing} not in: {message}"
        assert not marker.exists()


def test_evaluate_never_contacts_a_server_a_stored_config_names_nor_builds_a_huge_sample_grid(
    trained, tmp_path
):
    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    remote = copy.deepcopy(config)
    remote["data"] = {
        **remote["data"],
        "name": "shards",
        "_target_": "pixelsmith.data.shards.ShardsDataModule",
    }
    remote["data"] = {k: v for k, v in remote["data"].items() if k not in ("mirror", "labels", "on_device")}
    remote["data"]["path"] = "s3://somebody-elses-bucket/x"
    message = _refusal(_evaluate, _with_config(trained, tmp_path, "remote", remote), tmp_path / "remote")
    assert (
        "s3://somebody-elses-bucket/x" in message and "never makes this machine contact a server" in message
    )
    grid = copy.deepcopy(config)
    grid["model"]["sample_grid_size"] = 6_000_000
    message = _refusal(_evaluate, _with_config(trained, tmp_path, "grid", grid), tmp_path / "grid")
    assert "model.sample_grid_size" in message, message


def _stretched(state: dict, prefix: str) -> dict:
    """Every tensor under `prefix` as a zero-stride view of one value: any shape for a few bytes of file."""
    return {k: (torch.zeros(()).expand(v.shape) if k.startswith(prefix) else v) for k, v in state.items()}


def test_weights_that_are_views_cannot_size_a_network(trained, tmp_path):
    """A file can declare any shape at almost no size with stretched (stride-0) or shared views: the shape check
    alone would then let ngf 2048 (gigabytes) through. Each tensor must be backed by its own bytes."""
    checkpoint = torch.load(trained, map_location="cpu", weights_only=True)
    state = checkpoint["state_dict"]
    checkpoint["state_dict"] = _stretched(state, "G_ema.model.")
    torch.save(checkpoint, tmp_path / "stretched.ckpt")
    message = _refusal(_generate, tmp_path / "stretched.ckpt", tmp_path)
    assert "stretched view" in message, message
    base = torch.zeros(max(v.numel() for k, v in state.items() if k.startswith("G_ema.model.")))
    checkpoint["state_dict"] = {
        k: (base[: v.numel()].view(v.shape) if k.startswith("G_ema.model.") else v) for k, v in state.items()
    }
    torch.save(checkpoint, tmp_path / "shared.ckpt")
    message = _refusal(_generate, tmp_path / "shared.ckpt", tmp_path)
    assert "sharing one storage" in message, message


def test_counts_that_size_lists_and_modules_are_bounded_before_building(trained, tmp_path):
    """A count in a stored config sizes Python lists and modules before any weight can be compared: the range rules
    bound it first (resolution, channels, mapping layers), and the meta build counts every module and parameter the
    moment it exists, so a network of far more layers than the file's tensors stops at once."""
    import time

    from pixelsmith.safe_load import NetworkMismatchError, build_to_fit

    config = torch.load(trained, map_location="cpu", weights_only=True)["pixelsmith_config"]
    huge = copy.deepcopy(config)
    huge["model"]["generator"]["resolution"] = 2**20
    message = _refusal(_generate, _with_config(trained, tmp_path, "huge", huge), tmp_path)
    assert "model.generator.resolution=1048576" in message and "4..8192" in message, message
    state = {"0.weight": torch.zeros(2, 2), "0.bias": torch.zeros(2)}
    started = time.perf_counter()
    with pytest.raises(NetworkMismatchError, match="more than 72 modules and parameters"):
        build_to_fit(
            lambda: torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(200_000))), state, "x", "net"
        )
    assert time.perf_counter() - started < 5  # stopped at the budget, not after building 200,000 layers
