"""The StyleGAN2 presets (`experiment=stylegan2_paper256`, `stylegan2_cifar`, `stylegan2_auto`) against NVlabs'
StyleGAN2-ADA configurations, composed from the real configs for an arbitrary `data.root`.

Reference: NVlabs/stylegan2-ada-pytorch, `train.py`, `setup_training_loop_kwargs` (commit 0e4e93e8 of the stored
copy): the `cfg_specs` table, the 'auto' heuristic below it, and the settings every config shares (z = w = 512,
channel_base = fmaps * 32768, channel_max 512, Adam betas (0, 0.99) eps 1e-8, ADA target 0.6; cifar sets pl_weight
= 0 and style_mixing_prob = 0); `training/loss.py` `StyleGAN2Loss` defaults (style mixing 0.9, pl weight 2, pl decay
0.01, pl batch shrink 2); `training/training_loop.py` (G_reg_interval 4, D_reg_interval 16, phases Gmain, Greg,
Dmain, Dreg; ADA interval 4, ada_kimg 500); `training/networks.py` `MappingNetwork` (lr_multiplier 0.01).
D's architecture: `train.py` sets `args.D_kwargs.architecture = 'orig'` for cifar only (`Discriminator` defaults to
'resnet'); `training/networks.py` `DiscriminatorBlock` / `DiscriminatorEpilogue` (commit d72cc7d) for what each means.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image

from pixelsmith.config.validate import validate_config
from pixelsmith.run.fit import run
from tests.conftest import compose_config, last_checkpoint, metrics_rows

# cfg_specs as written in NVlabs' train.py (kimg, mb, mbstd, fmaps, lrate, gamma, ema, ramp, map); the values the
# presets must reproduce, copied here by hand from the reference, not from our YAML.
NVLABS_CFG_SPECS = {
    "paper256": dict(kimg=25000, mb=64, mbstd=8, fmaps=0.5, lrate=0.0025, gamma=1, ema=20, ramp=None, map=8),
    "cifar": dict(kimg=100000, mb=64, mbstd=32, fmaps=1, lrate=0.0025, gamma=0.01, ema=500, ramp=0.05, map=2),
}
# Shared by every NVlabs config (train.py / loss.py / training_loop.py defaults); cifar overrides the last two.
NVLABS_COMMON = dict(z_dim=512, w_dim=512, channel_max=512, betas=[0.0, 0.99], eps=1e-8, ada_target=0.6)
NVLABS_LOSS = dict(style_mixing_prob=0.9, pl_weight=2.0)
NVLABS_CIFAR_LOSS = dict(style_mixing_prob=0.0, pl_weight=0.0)
# D's architecture per config (train.py: 'orig' for cifar, the Discriminator's default 'resnet' otherwise).
NVLABS_D_ARCHITECTURE = {"paper256": "resnet", "cifar": "orig", "auto": "resnet"}

# NVlabs' G and D parameter counts (c_dim=0, RGB) per preset, obtained by instantiating NVlabs' own
# `training.networks.Generator` / `Discriminator` (stylegan2-ada-pytorch commit d72cc7d) on CPU with each config's
# train.py kwargs (z = w = 512, mapping num_layers = map, channel_base = fmaps * 32768, channel_max 512,
# num_fp16_res 4, conv_clamp 256, mbstd group, D architecture) and summing `p.numel()` over `parameters()`; copied
# here by hand. The auto rows are its fmaps at each resolution (0.5 below 512 px, else 1) with map 2.
NVLABS_PARAMETER_COUNTS = {
    # (preset, overrides): (G, D)
    ("stylegan2_paper256", ()): (24_767_458, 24_001_089),
    ("stylegan2_cifar", ()): (19_947_539, 20_720_641),  # 'orig' D; their 'resnet' D would have 21,507,073
    ("stylegan2_auto", ("data.resolution=32",)): (19_947_539, 21_507_073),
    ("stylegan2_auto", ("data.resolution=256",)): (23_191_522, 24_001_089),
    ("stylegan2_auto", ("data.resolution=512",)): (28_700_647, 28_982_849),
    ("stylegan2_auto", ("data.resolution=1024",)): (28_794_124, 29_012_513),
}
# The same, for the D architectures the presets do not use (NVlabs' Discriminator with architecture= each).
NVLABS_D_COUNTS_BY_ARCHITECTURE = {
    # (preset, architecture): D
    ("stylegan2_cifar", "resnet"): 21_507_073,
    ("stylegan2_cifar", "skip"): 20_726_785,
    ("stylegan2_paper256", "orig"): 23_042_625,
    ("stylegan2_paper256", "skip"): 23_052_353,
}

# The 'auto' heuristic worked out by hand for a few (resolution, GPUs): mb = max(min(gpus * min(4096 // res, 32),
# 64), gpus), mbstd = min(mb // gpus, 4), fmaps = 1 if res >= 512 else 0.5, lrate = 0.002 if res >= 1024 else 0.0025,
# gamma = 0.0002 * res^2 / mb, ema = mb * 10 / 32; ramp 0.05, map 2, kimg 25000.
AUTO_BY_HAND = {
    # (res, gpus): (mb, mbstd, fmaps, lrate, gamma, ema)
    (32, 1): (32, 4, 0.5, 0.0025, 0.0064, 10.0),  # 0.0002 * 1024 / 32
    (32, 2): (64, 4, 0.5, 0.0025, 0.0032, 20.0),  # min(2 * 32, 64) = 64; mbstd min(32, 4)
    (256, 1): (16, 4, 0.5, 0.0025, 0.8192, 5.0),  # 4096 // 256 = 16; 0.0002 * 65536 / 16
    (256, 8): (64, 4, 0.5, 0.0025, 0.2048, 20.0),  # min(8 * 16, 64) = 64
    (512, 4): (32, 4, 1, 0.0025, 1.6384, 10.0),  # min(4 * 8, 64) = 32; 0.0002 * 262144 / 32
    (1024, 8): (32, 4, 1, 0.002, 6.5536, 10.0),  # min(8 * 4, 64) = 32; 0.0002 * 1048576 / 32
    (1024, 1): (4, 4, 1, 0.002, 52.4288, 1.25),  # 4096 // 1024 = 4
}


def _compose(tmp_path, preset: str, *overrides: str):
    cfg = compose_config(
        [f"experiment={preset}", f"data.root={tmp_path / 'any folder'}", "~local", *overrides],
        tmp_path / "run",
    )
    validate_config(cfg)
    return cfg


def _assert_matches(cfg, *, kimg, mb, mbstd, fmaps, lrate, gamma, ema, ramp, map, loss, architecture, gpus=1):
    G, D, objective = cfg.model.generator, cfg.model.discriminator, cfg.model.objective
    assert D.architecture == architecture
    r1, pl = objective.regularizers.r1, objective.regularizers.path_length
    assert cfg.data.batch_size * cfg.accumulate == mb
    assert cfg.max_steps * mb == pytest.approx(kimg * 1000, rel=0, abs=mb)  # the training length in images
    assert D.mbstd_group_size == mbstd
    assert G.channel_base == D.channel_base == int(fmaps * 32768)
    assert G.channel_max == D.channel_max == NVLABS_COMMON["channel_max"]
    assert (G.z_dim, G.w_dim) == (NVLABS_COMMON["z_dim"], NVLABS_COMMON["w_dim"])
    assert G.mapping_layers == map and G.mapping_lr_multiplier == 0.01
    for optimizer in (cfg.model.g_optimizer, cfg.model.d_optimizer):
        assert optimizer._target_ == "torch.optim.Adam"
        assert optimizer.lr == pytest.approx(lrate, rel=1e-12)
        assert list(optimizer.betas) == NVLABS_COMMON["betas"] and optimizer.eps == NVLABS_COMMON["eps"]
    assert r1.gamma == pytest.approx(gamma, rel=1e-12) and r1.interval == 16
    assert pl.weight == loss["pl_weight"] and pl.interval == 4 and pl.decay == 0.01 and pl.batch_shrink == 2
    assert G.style_mixing_prob == loss["style_mixing_prob"]
    assert cfg.model.ema.enabled and cfg.model.ema.half_life_kimg == pytest.approx(ema, rel=1e-12)
    assert cfg.model.ema.rampup == ramp
    assert list(objective.order) == ["G", "D"]  # Gmain, Greg, Dmain, Dreg
    assert cfg.augment._target_ == "pixelsmith.augment.AdaptiveAugment"
    assert cfg.augment.target == NVLABS_COMMON["ada_target"]
    assert cfg.augment.interval == 4 and cfg.augment.speed_kimg == 500  # ada_interval, ada_kimg
    assert cfg.data._target_ == "pixelsmith.data.image_folder.ImageFolderDataModule"
    assert cfg.hardware.devices * cfg.hardware.num_nodes == gpus


def test_paper256_reproduces_nvlabs_cfg_specs(tmp_path):
    cfg = _compose(tmp_path, "stylegan2_paper256")
    assert cfg.data.resolution == 256
    _assert_matches(
        cfg, **NVLABS_CFG_SPECS["paper256"], loss=NVLABS_LOSS, architecture=NVLABS_D_ARCHITECTURE["paper256"]
    )


def test_cifar_reproduces_nvlabs_cfg_specs(tmp_path):
    cfg = _compose(tmp_path, "stylegan2_cifar")
    assert cfg.data.resolution == 32
    _assert_matches(
        cfg, **NVLABS_CFG_SPECS["cifar"], loss=NVLABS_CIFAR_LOSS, architecture=NVLABS_D_ARCHITECTURE["cifar"]
    )


@pytest.mark.parametrize(("resolution", "gpus"), list(AUTO_BY_HAND))
def test_auto_follows_the_resolution_and_the_gpu_count_as_nvlabs(tmp_path, resolution, gpus):
    mb, mbstd, fmaps, lrate, gamma, ema = AUTO_BY_HAND[(resolution, gpus)]
    cfg = _compose(tmp_path, "stylegan2_auto", f"data.resolution={resolution}", f"hardware.devices={gpus}")
    spec = dict(
        kimg=25000, mb=mb, mbstd=mbstd, fmaps=fmaps, lrate=lrate, gamma=gamma, ema=ema, ramp=0.05, map=2
    )
    _assert_matches(cfg, **spec, loss=NVLABS_LOSS, architecture=NVLABS_D_ARCHITECTURE["auto"], gpus=gpus)


def _parameter_counts(cfg) -> tuple[int, int]:
    # On the meta device: shapes without storage, so the 1024 px networks cost nothing to build.
    with torch.device("meta"):
        G, D = instantiate(cfg.model.generator), instantiate(cfg.model.discriminator)
    return sum(p.numel() for p in G.parameters()), sum(p.numel() for p in D.parameters())


@pytest.mark.parametrize(("preset", "overrides"), list(NVLABS_PARAMETER_COUNTS))
def test_every_presets_networks_have_nvlabs_parameter_counts(tmp_path, preset, overrides):
    assert (
        _parameter_counts(_compose(tmp_path, preset, *overrides))
        == NVLABS_PARAMETER_COUNTS[(preset, overrides)]
    )


@pytest.mark.parametrize(("preset", "architecture"), list(NVLABS_D_COUNTS_BY_ARCHITECTURE))
def test_each_d_architecture_has_nvlabs_parameter_count(tmp_path, preset, architecture):
    cfg = _compose(tmp_path, preset, f"model.discriminator.architecture={architecture}")
    assert _parameter_counts(cfg)[1] == NVLABS_D_COUNTS_BY_ARCHITECTURE[(preset, architecture)]


def test_an_unknown_d_architecture_is_refused_at_composition_naming_the_choices(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        _compose(tmp_path, "stylegan2_cifar", "model.discriminator.architecture=residual")
    text = f"{err.value} {err.value.__cause__}"
    assert "model.discriminator.architecture" in text and "choose one of resnet, orig, skip" in text


def test_auto_counts_gpus_over_nodes_and_keeps_the_heuristic_under_a_batch_override(tmp_path):
    # 2 nodes x 4 GPUs at 256 px is the 8-GPU row; NVlabs' --batch changes the batch but not gamma, EMA or mbstd.
    cfg = _compose(
        tmp_path, "stylegan2_auto", "data.resolution=256", "hardware.devices=4", "hardware.num_nodes=2"
    )
    assert (cfg.data.batch_size, cfg.model.objective.regularizers.r1.gamma) == (64, pytest.approx(0.2048))
    cfg = _compose(tmp_path, "stylegan2_auto", "data.resolution=256", "data.batch_size=8")
    assert cfg.data.batch_size == 8 and cfg.max_steps == 25000 * 1000 // 8
    assert cfg.model.objective.regularizers.r1.gamma == pytest.approx(0.8192)
    assert cfg.model.ema.half_life_kimg == 5.0 and cfg.model.discriminator.mbstd_group_size == 4


def test_auto_refuses_a_resolution_its_heuristic_cannot_take(tmp_path):
    from omegaconf.errors import InterpolationResolutionError

    with pytest.raises(InterpolationResolutionError, match="powers of two"):
        _compose(tmp_path, "stylegan2_auto", "data.resolution=48")


def _run_tiny(tmp_path, preset: str, *overrides: str) -> list[dict[str, str]]:
    """`preset` for a few iterations at widths and a resolution a CPU test can afford; metrics.csv's rows."""
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    cfg = compose_config(
        [
            f"experiment={preset}",
            f"data.root={folder}",
            "~local",
            "hardware=cpu",
            "precision=32-true",
            "logger=csv",
            "train.progress_bar=false",
            "train.time_budget_minutes=null",
            "eval.every_n_steps=0",
            "train.sample_every_n_steps=0",
            "train.log_every_n_steps=1",
            "data.resolution=16",
            "data.batch_size=4",
            "model.generator.z_dim=16",
            "model.generator.w_dim=16",
            "model.generator.mapping_layers=2",
            "model.generator.channel_base=128",
            "model.generator.channel_max=8",
            "model.discriminator.channel_base=128",
            "model.discriminator.channel_max=8",
            *overrides,
        ],
        tmp_path / "run",
    )
    run(cfg)
    return metrics_rows(tmp_path / "run")


def test_paper256_trains_as_a_phase_table_of_nvlabs_order(tmp_path):
    """The preset's switches together (style mixing, path length w.r.t. the ws, G first, ADA, EMA without ramp-up)
    for a few iterations, at widths and a resolution a CPU test can afford."""
    rows = _run_tiny(
        tmp_path,
        "stylegan2_paper256",
        "data.mirror=true",
        "max_steps=5",
        "model.objective.regularizers.r1.interval=4",
    )
    assert [bool(r.get("loss/pl")) for r in rows][:5] == [True, False, False, False, True]  # Greg every 4
    assert all(r.get("loss/G") and r.get("loss/D") for r in rows[:5])


def test_cifar_trains_with_the_orig_discriminator(tmp_path):
    """The cifar preset's 'orig' D through training (R1's double backward every 2 iterations, the mbstd group of 32
    falling back to the batch of 4): finite losses, and the checkpoint's D has plain blocks, no residual `skip`."""
    rows = _run_tiny(tmp_path, "stylegan2_cifar", "max_steps=3", "model.objective.regularizers.r1.interval=2")
    assert [bool(r.get("loss/r1")) for r in rows][:3] == [True, False, True]  # Dreg every 2
    losses = [float(r[k]) for r in rows[:3] for k in ("loss/G", "loss/D")]
    assert len(losses) == 6 and np.isfinite(losses).all()
    keys = [
        k for k in last_checkpoint(tmp_path / "run")["state_dict"] if k.startswith("discriminator.blocks.")
    ]
    assert keys and not any(".skip." in k for k in keys)
    assert {k.split(".")[3] for k in keys} == {"conv0", "conv1"}
