"""strategy=fsdp (FSDP2 per network) on 2 CPU processes over gloo, compared with strategy=ddp, plus the checkpoint
format conversions it relies on.

Why the FSDP and DDP runs are compared bit for bit, not within a tolerance: with the same seeds, the same per-rank
data and the same kernels, FSDP2's gradient reduce-scatter of two ranks computes (a + b) / 2 per element exactly as
the DDP all-reduce does (a sum of two floats does not depend on the order), and Adam and the EMA are elementwise, so
a shard updates exactly like the same slice of the full tensor. Any difference would show as a jump of about 2 x lr
(Adam's first steps move each weight by ~lr x sign(grad), so a last-bit change in a near-zero gradient flips the
sign): a float tolerance would have to be ~1e-3 to absorb that and would then hide real bugs. Both runs use
`hardware.channels_last=false` because FSDP2 keeps weights contiguous and channels_last weights select different
CPU convolution kernels (that alone moves weights by 2 x lr after one step).
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

from pixelsmith.core.fsdp import fqn_keyed_to_plain, plain_to_fqn_keyed
from tests.conftest import SMALL_DCGAN, compose_config, free_port, last_checkpoint, run_cli

CPU_DCGAN = ["hardware=cpu", "hardware.channels_last=false", *SMALL_DCGAN]


def _no_evaluation(tmp_path) -> list[str]:
    # FID evaluation during training (when the tree has it) is not what these tests measure and costs most of a run.
    return ["eval.every_n_steps=0"] if "eval" in compose_config(CPU_DCGAN, tmp_path / "cfg") else []


def _train(run_dir, debug: str, *overrides: str) -> dict:
    args = ["train.py", f"debug={debug}", *CPU_DCGAN, *overrides, f"hydra.run.dir={run_dir}"]
    result = run_cli(args, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return last_checkpoint(run_dir)


def _train_fsdp_and_ddp(tmp_path, *overrides: str) -> tuple[dict, dict]:
    # Side by side: much of a run is process start-up, so two at once take little more than one.
    with ThreadPoolExecutor(2) as pool:
        fsdp = pool.submit(_train, tmp_path / "fsdp", "fsdp", *overrides)
        ddp = pool.submit(_train, tmp_path / "ddp", "ddp", *overrides)
        return fsdp.result(), ddp.result()


def _max_state_diff(a: dict, b: dict) -> float:
    """Largest absolute difference over every weight, buffer and Adam state of two checkpoints."""
    assert a["state_dict"].keys() == b["state_dict"].keys()
    diffs = [(a["state_dict"][k].double() - b["state_dict"][k].double()).abs().max() for k in a["state_dict"]]
    for opt_a, opt_b in zip(a["optimizer_states"], b["optimizer_states"], strict=True):
        assert opt_a["param_groups"] == opt_b["param_groups"]
        assert opt_a["state"].keys() == opt_b["state"].keys()
        for index, state in opt_a["state"].items():
            diffs += [(state[k].double() - opt_b["state"][index][k].double()).abs().max() for k in state]
    return float(max(diffs))


@pytest.mark.slow
def test_fsdp_matches_ddp_writes_plain_checkpoints_and_resumes_exactly(tmp_path):
    common = [
        "precision=32-true",
        "accumulate=2",
        "max_steps=6",
        "train.checkpoint_every_n_steps=3",
        "callbacks.ddp_check.every_n_steps=3",
        *_no_evaluation(tmp_path),
    ]
    fsdp, ddp = _train_fsdp_and_ddp(tmp_path, *common)

    report = json.loads((tmp_path / "fsdp" / "ddp_consistency.json").read_text())
    assert report["world_size"] == 2 and report["iteration"] == 6
    assert report["max_abs_diff"] == 0.0  # gathered weights and the unsharded BatchNorm buffers agree
    # Under FSDP the core's per-step all-reduce carries only the non-finite flag: one per optimizer step.
    assert report["grad_allreduce_calls_per_rank"] == [12, 12]
    assert fsdp["pixelsmith"]["iteration"] == 6 and fsdp["pixelsmith"]["images_seen"] == 6 * 16 * 2

    # The same run under DDP: identical weights, buffers and Adam states (see the module docstring).
    assert _max_state_diff(fsdp, ddp) == 0.0

    # last.ckpt is a plain single-process checkpoint: torch tensors only, optimizer states keyed by index, and it
    # loads into a freshly built model and a plain Adam on one process.
    assert all(type(t) is torch.Tensor for t in fsdp["state_dict"].values())
    for opt in fsdp["optimizer_states"]:
        assert len(opt["state"]) > 0 and sorted(opt["state"]) == list(range(len(opt["state"])))
        assert all(type(t) is torch.Tensor for s in opt["state"].values() for t in s.values())
    from pixelsmith.core.config import CoreSettings
    from pixelsmith.run.build import build_model

    model = build_model(compose_config(CPU_DCGAN, tmp_path / "load"), CoreSettings())
    model.load_state_dict(fsdp["state_dict"], strict=True)
    first = model.generator.main[0].weight
    assert torch.equal(first, fsdp["state_dict"]["generator.main.0.weight"])
    plain_adam = torch.optim.Adam(model.generator.parameters())
    plain_adam.load_state_dict(fsdp["optimizer_states"][0])  # G's optimizer (the core's optimizer order)
    assert plain_adam.state[first]["exp_avg"].shape == first.shape

    # Resume under FSDP from the step-3 checkpoint of the FSDP run: 3 + 3 iterations == 6 straight, bit for bit.
    step3 = tmp_path / "fsdp" / "checkpoints" / "step_0000003.ckpt"
    resumed = _train(tmp_path / "resumed", "fsdp", *common, f"ckpt_path={step3}")
    assert resumed["pixelsmith"]["iteration"] == 6
    assert _max_state_diff(resumed, fsdp) == 0.0
    assert resumed["lr_schedulers"] == fsdp["lr_schedulers"]


@pytest.mark.slow
def test_fsdp_with_r1_fp16_and_clipping_matches_ddp(tmp_path):
    # R1 differentiates through D's input gradient (a double backward that needs D's gathered weights after the
    # first backward); fp16 runs the GradScaler on sharded gradients (an inf in one rank's shard must skip the step
    # on every rank); the clipping path multiplies sharded gradients (by exactly 1 here: a threshold that never
    # bites keeps the comparison exact, as a real clip factor computed from per-shard sums may differ in its last
    # bit, which fp16 activations then amplify to ~1e-5).
    fsdp, ddp = _train_fsdp_and_ddp(
        tmp_path,
        "precision=16-mixed",
        "accumulate=2",
        "max_steps=3",
        "model.objective.regularizers.r1.gamma=1.0",
        "model.objective.regularizers.r1.interval=1",
        "train.clip_grad_norm=1e6",
        "train.log_every_n_steps=1",
        "callbacks.ddp_check.every_n_steps=0",
        *_no_evaluation(tmp_path),
    )
    # The same skip decisions and loss scale, and the same weights, buffers and Adam states.
    assert fsdp["pixelsmith"] == ddp["pixelsmith"] and fsdp["pixelsmith"]["grad_scaler"]
    assert _max_state_diff(fsdp, ddp) == 0.0
    # The logged gradient norms are global norms over all shards (a per-shard norm would be ~1/sqrt(2) of it).
    rows = {}
    for name in ("fsdp", "ddp"):
        lines = (tmp_path / name / "metrics.csv").read_text().splitlines()
        header = lines[0].split(",")
        rows[name] = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    norms = {
        name: [float(r["grad_norm/G"]) for r in table if r.get("grad_norm/G")] for name, table in rows.items()
    }
    assert len(norms["fsdp"]) == 3
    assert norms["fsdp"] == pytest.approx(norms["ddp"], rel=1e-6, nan_ok=True)


def test_optimizer_state_round_trips_between_plain_and_name_keyed():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.Adam(
        [
            {"params": [model[0].weight, model[2].weight]},
            {"params": [model[0].bias, model[2].bias], "lr": 0.1},
        ]
    )
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    plain = opt.state_dict()
    names = {id(p): name for name, p in model.named_parameters()}
    by_name = plain_to_fqn_keyed(plain, opt, names)
    assert by_name["param_groups"][0]["params"] == ["0.weight", "2.weight"]
    assert by_name["param_groups"][1]["params"] == ["0.bias", "2.bias"]
    assert torch.equal(by_name["state"]["2.bias"]["exp_avg"], opt.state[model[2].bias]["exp_avg"])
    back = fqn_keyed_to_plain(by_name)
    assert back["param_groups"] == plain["param_groups"]
    assert back["state"].keys() == plain["state"].keys()
    for index, state in plain["state"].items():
        assert all(torch.equal(v, back["state"][index][k]) for k, v in state.items())


def test_plain_optimizer_state_of_another_model_is_refused():
    small, big = nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    saved = torch.optim.Adam(small.parameters()).state_dict()
    opt = torch.optim.Adam(big.parameters())
    with pytest.raises(ValueError, match="different model configuration"):
        plain_to_fqn_keyed(saved, opt, {id(p): n for n, p in big.named_parameters()})


def test_fsdp_shards_every_gan_network_including_stylegan2(make_cfg, tmp_path, monkeypatch):
    """FSDP2 refuses 0-d parameters (StyleGAN2's noise strengths were scalars); one process shards all the same.
    Both regularisers run every iteration: R1 through D and path length through G (its forward gathers G)."""
    from pixelsmith.run.fit import run

    cfg = make_cfg(
        "strategy=fsdp",
        "max_steps=2",
        "model.objective.regularizers.r1.interval=1",
        "model.objective.regularizers.path_length.weight=2.0",
        "model.objective.regularizers.path_length.interval=1",
        "hardware.channels_last=false",
        model="stylegan2",
    )
    # The run's process group, and the LOCAL_RANK and MASTER_PORT Lightning writes into os.environ, end with the
    # test (conftest's _process_state_is_restored): a later DDP subprocess must not inherit them.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    metrics = run(cfg)
    assert metrics["iteration"] == 2 and metrics["loss/r1"] > 0
    assert math.isfinite(metrics["loss/pl"]) and metrics["pl/mean"] > 0
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    strengths = [v for k, v in state["state_dict"].items() if k.endswith("noise_strength")]
    assert strengths and all(v.shape == (1,) for v in strengths)


def test_stylegan2_loads_checkpoints_with_scalar_noise_strengths():
    stylegan2 = pytest.importorskip("pixelsmith.gan.networks.stylegan2", reason="the GAN part is removed")
    StyleGAN2Generator = stylegan2.StyleGAN2Generator

    kwargs = dict(
        resolution=16, channels=1, z_dim=8, w_dim=8, mapping_layers=1, channel_base=64, channel_max=16
    )
    old = StyleGAN2Generator(**kwargs).state_dict()
    old = {k: (torch.full((), 0.25) if k.endswith("noise_strength") else v) for k, v in old.items()}
    generator = StyleGAN2Generator(**kwargs)
    generator.load_state_dict(old)
    strengths = [p for n, p in generator.named_parameters() if n.endswith("noise_strength")]
    assert strengths and all(p.shape == (1,) and p.item() == 0.25 for p in strengths)
