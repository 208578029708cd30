"""No code runs from a file a user gives us: every checkpoint, weights file and shard index is read as data only.

Each loader gets a file crafted to run code when unpickled (a `__reduce__` that writes a marker file), as a torch
checkpoint and as a bare pickle; each refuses it in one paragraph naming the key and what to give instead, and the
marker is never written. A source scan keeps every `torch.load` in the package and the entry points data-only.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import re
from pathlib import Path

import pytest
import torch

from pixelsmith.config.paths import REPO_ROOT
from pixelsmith.errors import PixelsmithError
from tests.conftest import compose_config


class _RunsCode:
    """Unpickled in full, this writes `marker`: the stand-in for any code a crafted file could run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _write_crafted(path: Path, marker: Path, how: str) -> Path:
    payload = {
        "state_dict": {},
        "pixelsmith": {"iteration": 1},
        "pixelsmith_config": {"x": _RunsCode(marker)},
    }
    if how == "torch.save":
        torch.save(payload, path)
    else:
        with open(path, "wb") as handle:
            pickle.dump(payload, handle)
    return path


@pytest.fixture(params=["torch.save", "pickle.dump"])
def crafted(request, tmp_path) -> tuple[Path, Path]:
    """(a file that runs code when fully unpickled, the marker that code would write)."""
    # The craft works: a copy loaded the unsafe way runs its code (and writes its own marker, not the tests').
    proof = tmp_path / "proof_ran"
    written = _write_crafted(tmp_path / "proof.ckpt", proof, request.param)
    if request.param == "torch.save":
        torch.load(written, weights_only=False)
    else:
        with open(written, "rb") as handle:
            pickle.load(handle)
    assert proof.exists()
    marker = tmp_path / "code_ran"
    return _write_crafted(tmp_path / "crafted.ckpt", marker, request.param), marker


def _refused(message: str, key: str) -> None:
    assert f"{key}=" in message and "does not load as data only" in message, message
    assert "never" in message and "weights_only=False" not in message  # no advice to unpickle it anyway
    assert "\n" not in message.strip()  # one paragraph


def test_train_refuses_a_crafted_resume_checkpoint(make_cfg, crafted, tmp_path):
    from pixelsmith.run.fit import run

    path, marker = crafted
    with pytest.raises(PixelsmithError) as err:
        run(make_cfg(f"ckpt_path={path}"))
    _refused(str(err.value), "ckpt_path")
    assert not marker.exists()
    assert not (tmp_path / "run" / "config_resolved.yaml").exists()


def test_evaluate_refuses_a_crafted_checkpoint(crafted, tmp_path):
    from pixelsmith.run.evaluate import evaluate

    path, marker = crafted
    cfg = compose_config(["~local", "hardware=cpu", f"ckpt_path={path}"], tmp_path / "eval", "evaluate")
    with pytest.raises(PixelsmithError) as err:
        evaluate(cfg)
    _refused(str(err.value), "ckpt_path")
    assert not marker.exists() and not (tmp_path / "eval" / "metrics.json").exists()


def test_stylize_refuses_a_crafted_checkpoint_without_a_fallback(crafted, tmp_path, capsys):
    pytest.importorskip("pixelsmith.style", reason="a fork without the style part")
    from pixelsmith.style.stylize import main

    path, marker = crafted
    (tmp_path / "in").mkdir()
    code = main([f"ckpt_path={path}", f"input={tmp_path / 'in'}", f"output={tmp_path / 'out'}"])
    said = capsys.readouterr()
    assert code == 2
    _refused(said.err.removeprefix("error: "), "ckpt_path")
    assert "Traceback" not in said.err + said.out and "full pickle" not in said.err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_every_weights_file_loader_refuses_a_crafted_file(crafted):
    from pixelsmith.metrics.extractors import InceptionFeatureExtractor, MnistFeatureExtractor
    from pixelsmith.metrics.image_metrics import build_lpips_network

    path, marker = crafted
    loaders = [
        ("eval.weights_path", lambda: InceptionFeatureExtractor(path)),
        ("eval.weights_path", lambda: MnistFeatureExtractor(path)),
        ("metrics.lpips_backbone_weights", lambda: build_lpips_network("alex", backbone_weights=path)),
    ]
    if importlib.util.find_spec("pixelsmith.style") is not None:  # a fork may have removed the style part
        from pixelsmith.style.loss_network import load_vgg_state_dict

        loaders.append(("model.loss_net.weights_path", lambda: load_vgg_state_dict("vgg16", path)))
    for key, load in loaders:
        with pytest.raises(PixelsmithError) as err:
            load()
        _refused(str(err.value), key)
        assert not marker.exists(), key


@pytest.mark.parametrize("entry", ["convert", "init_from", "generate", "evaluate"])
def test_nvlabs_pickle_readers_refuse_a_crafted_pickle(make_cfg, crafted, tmp_path, capsys, entry):
    """Every road an NVlabs network pickle (.pkl) takes in: convert.py source=, model.init_from=, generate.py and
    evaluate.py ckpt_path=. Their restricted unpickler never calls what a file asks for beyond tensors' rebuild."""
    pytest.importorskip("pixelsmith.gan", reason="a fork without the GAN part")
    path, marker = crafted
    pkl = path.rename(path.with_suffix(".pkl"))
    if entry == "convert":
        from pixelsmith.gan.convert import main

        assert main([f"source={pkl}", f"dest={tmp_path / 'out.ckpt'}"]) == 2
        message, key = capsys.readouterr().err.removeprefix("error: "), "source"
        assert not (tmp_path / "out.ckpt").exists()
    else:
        with pytest.raises(PixelsmithError) as err:
            if entry == "init_from":
                from pixelsmith.run.fit import run

                run(make_cfg(f"model.init_from={pkl}", model="stylegan2"))
            elif entry == "generate":
                from pixelsmith.gan.pretrained import load_generator

                load_generator(str(pkl))
            else:
                from pixelsmith.run.evaluate import load_checkpoint

                load_checkpoint(str(pkl))
        message = str(err.value)
        key = "model.init_from" if entry == "init_from" else "ckpt_path"
    _refused(message, key)
    assert not marker.exists()


def test_shards_whose_index_declares_pickled_fields_are_refused_before_a_chunk_is_read(tmp_path):
    pytest.importorskip("litdata")
    from pixelsmith.data.shards import ShardsDataModule, ShardsError

    marker = tmp_path / "code_ran"
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "chunk-0-0.bin").write_bytes(pickle.dumps(_RunsCode(marker)))
    config = {"data_format": ["int", "pickle", "int"], "item_loader": "PyTreeLoader", "chunk_bytes": 1 << 20}
    chunks = [{"filename": "chunk-0-0.bin", "chunk_size": 1, "chunk_bytes": 10, "dim": None}]
    (folder / "index.json").write_text(json.dumps({"config": config, "chunks": chunks}))
    module = ShardsDataModule(str(folder), resolution=8, batch_size=1)
    with pytest.raises(ShardsError, match=r"stored as pickle .*can run any code.*prepare.py"):
        module.setup()
    assert not marker.exists()


def test_every_torch_load_in_the_code_is_data_only():
    """A new loader that forgets weights_only=True (or unpickles by another road) fails here, not in a user's hands.
    The one torch.jit.load reads back the TorchScript file the export itself just wrote."""
    roots = [REPO_ROOT / "src" / "pixelsmith", *(REPO_ROOT / name for name in ("train.py", "evaluate.py"))]
    files = [p for root in roots for p in ([root] if root.is_file() else root.rglob("*.py"))]
    files += [REPO_ROOT / "stylize.py", REPO_ROOT / "prepare.py", REPO_ROOT / "bench.py"]
    offenders = []
    for path in files:
        text = path.read_text()
        for match in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", text):
            if "weights_only=True" not in match.group(0):
                offenders.append(f"{path.name}: {match.group(0)[:80]}")
        for unsafe in ("pickle.load(", "pickle.loads(", "allow_pickle=True", "weights_only=False)"):
            if unsafe in text.replace("save_checkpoint(tmp, weights_only=False)", ""):
                offenders.append(f"{path.name}: {unsafe}")
        offenders += [
            f"{path.name}: np.load without allow_pickle=False"
            for line in text.splitlines()
            if "np.load(" in line and "allow_pickle=False" not in line
        ]
    assert not offenders, offenders
