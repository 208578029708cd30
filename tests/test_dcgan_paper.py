"""`experiment=dcgan_paper` against the DCGAN paper's training table, and the default job's deliberate departures.

The table: Radford, Metz & Chintala, "Unsupervised Representation Learning with Deep Convolutional Generative
Adversarial Networks" (ICLR 2016), section 4 "Details of adversarial training": minibatch 128, weights from
N(0, 0.02), leaky ReLU slope 0.2, Adam with learning rate 0.0002 and beta1 0.5; section 3: batch norm in both
networks, ReLU in G with tanh at its output, no pooling (strided convolutions). The widths are those of the authors'
code (soumith/dcgan.torch, also pytorch/examples dcgan/main.py): nz = 100, ngf = ndf = 64.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pixelsmith.run.build import build_core_settings, build_model, resolve_hardware
from tests.conftest import compose_config

PAPER = {
    "data.batch_size": 128,
    "model.generator.z_dim": 100,
    "model.generator.ngf": 64,
    "model.discriminator.ndf": 64,
    "model.generator.norm": "batch",
    "model.discriminator.norm": "batch",
    "model.g_optimizer.lr": 2e-4,
    "model.d_optimizer.lr": 2e-4,
    "model.g_optimizer.betas": [0.5, 0.999],
    "model.d_optimizer.betas": [0.5, 0.999],
    "model.ema.enabled": False,  # the paper samples from G itself
    "model.objective.regularizers.r1.gamma": 0.0,
    "schedule.name": "constant",
}


def _value(cfg, dotted: str):
    node = cfg
    for key in dotted.split("."):
        node = node[key]
    return list(node) if hasattr(node, "__len__") and not isinstance(node, str) else node


def test_the_preset_equals_the_papers_table(tmp_path):
    cfg = compose_config(["experiment=dcgan_paper"], tmp_path)
    differing = {key: (_value(cfg, key), want) for key, want in PAPER.items() if _value(cfg, key) != want}
    assert not differing, f"experiment=dcgan_paper differs from the paper (ours, paper): {differing}"
    assert not cfg.augment  # augment=none: the paper trains on the images as they are
    assert cfg.train.time_budget_minutes is None  # a preset runs to max_steps


def test_the_preset_builds_the_papers_networks(tmp_path):
    cfg = compose_config(["experiment=dcgan_paper", "hardware=cpu"], tmp_path)
    torch.manual_seed(0)
    module = build_model(cfg, build_core_settings(cfg, resolve_hardware(cfg)))
    g, d = module.generator, module.discriminator
    # 32 px: G projects z to 4 * ngf = 256 maps at 4x4; D's first conv gives ndf = 64 maps, with no norm after it
    assert g.main[0].width == 256 and g.main[0].weight.shape == (100, 256 * 16)
    convs = [m for m in d.main if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 128, 256, 1]
    assert isinstance(d.main[1], nn.LeakyReLU) and d.main[1].negative_slope == 0.2
    assert isinstance(g.main[-1], nn.Tanh)
    weights = torch.cat(
        [
            m.weight.flatten()
            for m in [*g.modules(), *d.modules()]
            if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)
        ]
    )
    assert weights.std().item() == pytest.approx(0.02, rel=0.02) and abs(weights.mean().item()) < 1e-3
    assert getattr(module, "G_ema", None) is None


def test_the_default_job_departs_from_the_paper_where_it_says(tmp_path):
    """The main job's choice by time-to-quality (README "The main job's FID over time"): half the widths (a quarter
    of the FLOPs) and 5x the learning rate; everything else as the paper."""
    cfg = compose_config([], tmp_path)
    assert (cfg.model.generator.ngf, cfg.model.discriminator.ndf) == (32, 32)
    assert (cfg.model.g_optimizer.lr, cfg.model.d_optimizer.lr) == (1e-3, 1e-3)
    assert list(cfg.model.g_optimizer.betas) == [0.5, 0.999] and cfg.model.generator.z_dim == 100
    assert cfg.max_steps == 2500 and cfg.train.time_budget_minutes == 4.5
