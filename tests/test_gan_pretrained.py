"""NVlabs' StyleGAN2 pickles in: read as data, mapped onto Pixelsmith's StyleGAN2 with the same outputs, converted into
a checkpoint the other commands take, refused when they would need code or hold another architecture, and
fine-tuned from (experiment=stylegan2_finetune, with Freeze-D).

The fixtures (tests/fixtures/nvlabs/) were written by `make_nvlabs_pickles.py` with NVlabs' own networks
(stylegan2-ada-pytorch d72cc7d041b42ec8e806021a205ed9349f87c6a4) at tiny widths, every tensor perturbed, with NVlabs'
outputs for fixed inputs beside them (`*.expected.pt`), so nothing here needs their code or a download.
"""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pixelsmith.gan.convert import main as convert_main
from pixelsmith.gan.networks.stylegan2 import StyleGAN2Discriminator, StyleGAN2Generator, set_noise_mode
from pixelsmith.gan.nvlabs import NVlabsPickleError, PersistentObject, convert_pickle, read_pickle
from pixelsmith.gan.pretrained import load_generator
from tests.conftest import FAST, compose_config, last_checkpoint

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvlabs"
RESNET = FIXTURES / "sg2ada_resnet_32px.pkl"
SKIP_GRAY = FIXTURES / "sg2ada_skip_gray_32px.pkl"
CONDITIONAL = FIXTURES / "sg2ada_conditional_32px.pkl"


def _expected(pkl: Path) -> dict:
    return torch.load(pkl.with_suffix(".expected.pt"), weights_only=True)


def _one_paragraph(message: str) -> None:
    assert "\n" not in message.strip() and "Traceback" not in message, message


@pytest.mark.parametrize("pkl", [RESNET, SKIP_GRAY], ids=["resnet_d_fp16_config", "skip_d_grayscale"])
def test_converted_networks_give_nvlabs_images_and_logits(pkl):
    converted = convert_pickle(pkl)
    expected = _expected(pkl)
    G = StyleGAN2Generator(**converted.generator).eval()
    G.load_state_dict(converted.state_dicts["G_ema"], strict=True)
    set_noise_mode(G, "const")  # NVlabs' generate.py default: the pickle's own noise maps
    D = StyleGAN2Discriminator(**converted.discriminator).eval()
    D.load_state_dict(converted.state_dicts["D"], strict=True)
    z = expected["z"]
    with torch.no_grad():
        torch.testing.assert_close(G.mapping(z), expected["ws"], rtol=1e-5, atol=1e-5)
        images = G(z)
        torch.testing.assert_close(images, expected["images"], rtol=1e-4, atol=1e-4)
        truncated = G(z, truncation_psi=expected["psi"], truncation_cutoff=expected["cutoff"])
        torch.testing.assert_close(truncated, expected["images_truncated"], rtol=1e-4, atol=1e-4)
        assert (
            truncated - images
        ).abs().max() > 0.01  # truncation changed the images: the comparison has teeth
        torch.testing.assert_close(D(expected["reals"]), expected["logits_reals"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(D(expected["images"]), expected["logits_fakes"], rtol=1e-4, atol=1e-4)
    # Every tensor of the pickle found a place (none dropped but the constant resampling filters).
    assert len(converted.state_dicts["G"]) == len(G.state_dict())
    assert len(converted.state_dicts["D"]) == len(D.state_dict())


def test_settings_are_read_from_the_pickle():
    converted = convert_pickle(SKIP_GRAY)
    assert converted.generator | {"num_fp16_res": 0} == {
        "resolution": 32, "channels": 1, "z_dim": 16, "w_dim": 24, "c_dim": 0, "mapping_layers": 1,
        "mapping_lr_multiplier": 0.01, "channel_base": 256, "channel_max": 16, "use_noise": True,
        "upsampling": "fir", "num_fp16_res": 0, "conv_clamp": None,
    }  # fmt: skip
    assert converted.discriminator["architecture"] == "skip"
    assert converted.discriminator["mbstd_group_size"] == 2
    assert convert_pickle(RESNET).discriminator["num_fp16_res"] == 2


class _FakePersistence:
    """Pickles like NVlabs' `torch_utils.persistence`: the global `torch_utils.persistence._reconstruct_persistent_obj`
    called with meta = {module_src, class_name, state}. Their loader executes module_src; ours must not."""

    def __init__(self, monkeypatch):
        package = types.ModuleType("torch_utils")
        module = types.ModuleType("torch_utils.persistence")

        def _reconstruct_persistent_obj(meta):  # what unpickling with NVlabs' code installed would call
            exec(meta["module_src"], {})
            return meta

        _reconstruct_persistent_obj.__module__ = "torch_utils.persistence"
        _reconstruct_persistent_obj.__qualname__ = "_reconstruct_persistent_obj"
        module._reconstruct_persistent_obj = _reconstruct_persistent_obj
        package.persistence = module
        monkeypatch.setitem(sys.modules, "torch_utils", package)
        monkeypatch.setitem(sys.modules, "torch_utils.persistence", module)
        self.reconstruct = _reconstruct_persistent_obj

    def obj(self, class_name: str, src: str, modules=None, kwargs=None, params=None):
        reconstruct = self.reconstruct

        class Persistent:
            def __reduce__(self):
                state = {"_parameters": params or {}, "_buffers": {}, "_modules": modules or {}}
                state["_init_kwargs"] = kwargs or {}
                return (reconstruct, ({"module_src": src, "class_name": class_name, "state": state},))

        return Persistent()


def test_the_source_a_pickle_carries_is_kept_as_text_and_never_run(monkeypatch, tmp_path):
    marker = tmp_path / "source_ran"
    fake = _FakePersistence(monkeypatch)
    src = f"open({str(marker)!r}, 'w').close()"
    net = {k: fake.obj("Generator", src, params={"w": torch.ones(2)}) for k in ("G", "D", "G_ema")}
    path = tmp_path / "net.pkl"
    path.write_bytes(pickle.dumps(net))
    pickle.loads(path.read_bytes())  # the craft works: loaded the way NVlabs' loader would, the source runs
    assert marker.exists()
    marker.unlink()
    monkeypatch.delitem(sys.modules, "torch_utils.persistence")  # ours needs none of their code
    monkeypatch.delitem(sys.modules, "torch_utils")
    data = read_pickle(path)
    assert not marker.exists()
    assert isinstance(data["G"], PersistentObject) and data["G"].module_src == src
    torch.testing.assert_close(data["G"].tensors()["w"], torch.ones(2))


def test_the_fixtures_load_without_importing_any_nvlabs_module():
    before = set(sys.modules)
    read_pickle(RESNET)
    added = {
        name
        for name in set(sys.modules) - before
        if name.split(".")[0] in ("torch_utils", "dnnlib", "training")
    }
    assert not added, added


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_a_pickle_asking_for_another_global_is_refused_unrun_in_one_paragraph(tmp_path, capsys):
    marker = tmp_path / "code_ran"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"G": _RunsCode(marker), "D": 1, "G_ema": 2}))
    with pytest.raises(NVlabsPickleError) as err:
        read_pickle(path)
    message = str(err.value)
    assert "builtins.exec" in message and "does not load as data only" in message and "never" in message
    _one_paragraph(message)
    assert convert_main([f"source={path}", f"dest={tmp_path / 'out.ckpt'}"]) == 2
    said = capsys.readouterr()
    assert "builtins.exec" in said.err and "Traceback" not in said.err + said.out
    assert not marker.exists() and not (tmp_path / "out.ckpt").exists()


def test_a_conditional_discriminator_is_refused_naming_what_differs():
    with pytest.raises(NVlabsPickleError) as err:
        convert_pickle(CONDITIONAL)
    assert "class-conditional discriminator (c_dim=3" in str(err.value) and "cmap" in str(err.value)
    _one_paragraph(str(err.value))


@pytest.mark.parametrize("radial, config", [(True, "-r"), (False, "-t")])
def test_a_stylegan3_pickle_is_refused_naming_what_differs(monkeypatch, tmp_path, radial, config):
    fake = _FakePersistence(monkeypatch)
    src = "class SynthesisInput: pass"
    synthesis = fake.obj("SynthesisNetwork", src, modules={"input": fake.obj("SynthesisInput", src)})
    kwargs = {"z_dim": 8, "w_dim": 8, "img_resolution": 16, "img_channels": 3}
    kwargs["synthesis_kwargs"] = {"conv_kernel": 1, "use_radial_filters": True} if radial else {}
    G = fake.obj("Generator", src, modules={"synthesis": synthesis}, kwargs=kwargs)
    path = tmp_path / "sg3.pkl"
    path.write_bytes(pickle.dumps({"G": G, "D": G, "G_ema": G}))
    with pytest.raises(NVlabsPickleError) as err:
        convert_pickle(path)
    assert f"StyleGAN3 (stylegan3{config}" in str(err.value) and "b4.const" in str(err.value)
    _one_paragraph(str(err.value))


def test_truncated_missing_and_foreign_files_exit_2_and_write_nothing(tmp_path, capsys):
    truncated = tmp_path / "cut.pkl"
    truncated.write_bytes(RESNET.read_bytes()[:5000])
    foreign = tmp_path / "foreign.pkl"
    foreign.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    cases = {
        truncated: "truncated",
        tmp_path / "gone.pkl": "does not exist",
        foreign: "not an NVlabs network",
    }
    for source, says in cases.items():
        dest = tmp_path / "out.ckpt"
        assert convert_main([f"source={source}", f"dest={dest}"]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
        _one_paragraph(err)
        assert not dest.exists() and not list(tmp_path.glob(".out.ckpt*"))


def test_convert_writes_a_checkpoint_generate_evaluate_and_init_from_take(tmp_path, capsys):
    dest = tmp_path / "net.ckpt"
    assert convert_main([f"source={RESNET}", f"dest={dest}"]) == 0
    out = capsys.readouterr().out
    assert "mapped G_ema: 64 tensors" in out and "model.generator.z_dim=24" in out and "wrote" in out
    checkpoint = torch.load(dest, map_location="cpu", weights_only=True)  # data only, as every checkpoint
    config = checkpoint["pixelsmith_config"]
    assert config["model"]["generator"]["z_dim"] == 24 and config["data"]["resolution"] == 32
    assert config["model"]["discriminator"]["architecture"] == "resnet"
    assert checkpoint["pixelsmith"]["iteration"] == 0
    from_ckpt, info = load_generator(str(dest))
    from_pkl, _ = load_generator(str(RESNET))
    assert info["has_w"] and info["model"] == "stylegan2"
    for net in (from_ckpt, from_pkl):
        set_noise_mode(net, "const")
    z = _expected(RESNET)["z"]
    torch.testing.assert_close(from_ckpt(z), _expected(RESNET)["images"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(from_ckpt(z), from_pkl(z))
    assert convert_main([f"source={RESNET}", f"dest={dest}"]) == 2  # no silent overwrite
    assert "overwrite=true" in capsys.readouterr().err


def test_train_refuses_a_pickle_or_converted_checkpoint_as_a_resume_point(make_cfg, tmp_path):
    from pixelsmith.errors import PixelsmithError
    from pixelsmith.run.fit import run

    dest = tmp_path / "net.ckpt"
    assert convert_main([f"source={RESNET}", f"dest={dest}"]) == 0
    for path in (RESNET, dest):
        with pytest.raises(PixelsmithError, match=r"no optimizer state .* model.init_from="):
            run(make_cfg(f"ckpt_path={path}", model="stylegan2"))
        assert not (tmp_path / "run" / "checkpoints").exists()


def _image_folder(root: Path, count: int = 8) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index in range(count):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / f"{index}.png")
    return root


def test_finetuning_starts_from_the_pickle_trains_and_keeps_frozen_layers(tmp_path):
    from pixelsmith.gan.pretrained import network_overrides
    from pixelsmith.run.fit import run

    converted = convert_pickle(RESNET)
    frozen = 3  # NVlabs' --freezed=3: fromRGB, then the first block's conv0 and conv1
    overrides = [
        "experiment=stylegan2_finetune",
        *FAST,
        f"data.root={_image_folder(tmp_path / 'images')}",
        "data.batch_size=4",
        f"model.init_from={RESNET}",
        f"model.discriminator.freeze_layers={frozen}",
        *network_overrides(converted),
        "train.time_budget_minutes=null",
    ]
    run(compose_config([*overrides, "max_steps=2"], tmp_path / "run"))
    # The run resumes from its own checkpoint (the pickle's noise maps included), not from the pickle again.
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    run(compose_config([*overrides, "max_steps=3", f"ckpt_path={last}"], tmp_path / "run"))
    checkpoint = last_checkpoint(tmp_path / "run")
    assert checkpoint["pixelsmith"]["iteration"] == 3
    state = checkpoint["state_dict"]
    assert "generator.synthesis.blocks.1.conv0.noise_const" in state
    theirs = converted.state_dicts
    frozen_keys = [
        k for k in theirs["D"] if k.startswith(("from_image.", "blocks.0.conv0.", "blocks.0.conv1."))
    ]
    assert len(frozen_keys) == 6
    for key in frozen_keys:
        torch.testing.assert_close(state[f"discriminator.{key}"], theirs["D"][key], rtol=0, atol=0)
    trained = [k for k in theirs["D"] if k not in frozen_keys]
    assert all(not torch.equal(state[f"discriminator.{k}"], theirs["D"][k]) for k in trained)
    # G trained a little from the pickle's weights, not from a fresh init: close to them, but moved.
    for key in (
        "synthesis.blocks.0.const",
        "mapping.layers.0.weight",
        "synthesis.blocks.3.to_image.conv.weight",
    ):
        ours, start = state[f"generator.{key}"], theirs["G"][key]
        assert not torch.equal(ours, start)
        assert (ours - start).norm() < 0.1 * start.norm(), key
    # G_ema started from the pickle's G_ema (perturbed apart from its G in the fixture), and at a 20 kimg half-life
    # 12 images barely move it.
    key = "synthesis.blocks.1.conv0.conv.weight"
    ema, start = state[f"G_ema.model.{key}"], theirs["G_ema"][key]
    assert (ema - start).norm() < 0.01 * start.norm() < (theirs["G"][key] - start).norm()


@pytest.mark.parametrize("form", ["pkl", "converted_ckpt"])
def test_evaluate_measures_a_pickle_against_the_commands_images(tmp_path, form):
    from pixelsmith.run.evaluate import evaluate

    source = SKIP_GRAY
    if form == "converted_ckpt":
        source = tmp_path / "net.ckpt"
        assert convert_main([f"source={SKIP_GRAY}", f"dest={source}"]) == 0

    root = tmp_path / "digits"
    root.mkdir()
    rng = np.random.default_rng(0)
    for index in range(32):
        Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8)).save(root / f"{index}.png")
    overrides = ["~local", "hardware=cpu", f"ckpt_path={source}", "data=image_folder", f"data.root={root}"]
    overrides += [
        "data.batch_size=16",
        "eval.num_samples=32",
        "eval.reference_samples=32",
        "eval.metrics=[fid]",
    ]
    overrides += ["eval.extractor=mnist", "eval.batch_size=16"]
    scores = evaluate(compose_config(overrides, tmp_path / "eval", "evaluate"))
    assert scores["num_generated"] == 32 and scores["num_real"] == 32 and scores["fid"] > 0
    assert "model: stylegan2, iteration 0" in (tmp_path / "eval" / "metrics.md").read_text()


@pytest.mark.parametrize(
    "architecture, layers", [("resnet", 1 + 3 * 4), ("orig", 1 + 2 * 3), ("skip", 3 * 3)]
)
def test_freeze_d_counts_layers_as_nvlabs_and_keeps_them_out_of_the_optimizer(architecture, layers):
    from pixelsmith.errors import ConfigError

    def build(freeze: int) -> StyleGAN2Discriminator:
        return StyleGAN2Discriminator(
            resolution=32 if architecture != "resnet" else 64, channels=3, channel_base=128, channel_max=8,
            architecture=architecture, freeze_layers=freeze,
        )  # fmt: skip

    assert len(build(0).layers_in_order()) == layers
    D = build(2)
    frozen = {id(t) for layer in D.layers_in_order()[:2] for t in layer.buffers()}
    assert frozen and not frozen & {id(p) for p in D.parameters()}
    assert set(D.state_dict()) == set(build(0).state_dict())  # the same keys: checkpoints load either way
    D.requires_grad_(True)  # as a phase toggles D: frozen weights stay buffers
    assert len(list(D.parameters())) == len(list(build(0).parameters())) - 2 * 2  # weight and bias of each
    with pytest.raises(ConfigError, match=f"give 0 to {layers}"):
        build(layers + 1)


@pytest.mark.parametrize("model", ["dcgan", "r3gan", "stylegan2"])
def test_the_image_tools_load_any_gan_checkpoints_ema_generator(model, tmp_path):
    from hydra.utils import instantiate

    configs = {
        "dcgan": {"_target_": "pixelsmith.gan.networks.dcgan.DCGANGenerator", "resolution": 32, "channels": 1,
                  "z_dim": 8, "ngf": 8},
        "r3gan": {"_target_": "pixelsmith.gan.networks.r3gan.R3GANGenerator", "resolution": 16, "channels": 3,
                  "z_dim": 8, "widths": [8, 8, 8], "groups": [2, 2, 2], "c_dim": 3},
        "stylegan2": {"_target_": "pixelsmith.gan.networks.stylegan2.StyleGAN2Generator", "resolution": 16,
                      "channels": 3, "z_dim": 8, "w_dim": 8, "mapping_layers": 1, "channel_base": 64,
                      "channel_max": 8},
    }  # fmt: skip
    torch.manual_seed(0)
    G, G_ema = instantiate(configs[model]), instantiate(configs[model])
    state = {f"generator.{k}": v for k, v in G.state_dict().items()}
    state |= {f"G_ema.model.{k}": v for k, v in G_ema.state_dict().items()}
    path = tmp_path / "run.ckpt"
    torch.save(
        {"state_dict": state, "pixelsmith_config": {"model": {"name": model, "generator": configs[model]}}},
        path,
    )
    loaded, info = load_generator(str(path))
    assert info["model"] == model and info["has_w"] == (model == "stylegan2")
    assert info["c_dim"] == (3 if model == "r3gan" else 0)
    for key, tensor in G_ema.state_dict().items():  # the EMA generator, not G
        assert torch.equal(loaded.state_dict()[key], tensor), key


def test_the_finetune_preset_without_a_network_stops_before_training(tmp_path):
    from pixelsmith.errors import PixelsmithError
    from pixelsmith.run.fit import run

    cfg = compose_config(
        ["experiment=stylegan2_finetune", *FAST, f"data.root={_image_folder(tmp_path / 'i')}"],
        tmp_path / "run",
    )
    with pytest.raises(
        PixelsmithError, match=r"model.init_from is required here .*model.init_from=NETWORK.pkl"
    ):
        run(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()
