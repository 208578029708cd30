"""R3GAN and WGAN-GP run wherever the other GANs run: fp16 (GradScaler on the CPU) and bf16 autocast, torch.compile
(inductor on the CPU), the sample grid and FID evaluation in the run, and 2 processes under DDP and FSDP (gloo),
where the two must agree bit for bit (tests/test_fsdp.py explains why) and the ranks' weights stay identical
(the `ddp_check` callback's report). Resume bit-exactness with every schedule: tests/test_train_gan.py."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from pixelsmith.run.fit import run
from tests.conftest import last_checkpoint, metrics_rows, run_cli

pytest.importorskip("pixelsmith.gan")

SCHEDULED = [
    "+model.schedules.lr={start:2e-3,final:5e-4,horizon_kimg:0.1}",
    "+model.schedules.gamma={start:0.2,final:0.02,horizon_kimg:0.1}",
]
EVAL = [
    "eval.every_n_steps=4",
    "eval.num_samples=64",
    "eval.batch_size=32",
    "eval.reference_samples=256",
    "train.sample_every_n_steps=4",
    "train.log_every_n_steps=1",
]


@pytest.mark.parametrize(
    ("precision", "compile_"),
    [("16-mixed", False), ("bf16-mixed", False), pytest.param("32-true", True, marks=pytest.mark.slow)],
)
def test_r3gan_trains_in_each_precision_and_compiled_with_samples_and_fid(
    make_cfg, tmp_path, precision, compile_
):
    cfg = make_cfg(
        f"precision={precision}",
        f"hardware.compile={str(compile_).lower()}",
        "max_steps=4",
        *SCHEDULED,
        *EVAL,
        model="r3gan",
    )
    metrics = run(cfg)
    out = tmp_path / "run"
    assert metrics["iteration"] == 4
    losses = [r for r in metrics_rows(out) if r.get("loss/D")]
    assert len(losses) == 4 and all(math.isfinite(float(r["loss/D"])) for r in losses)
    # fp16: the GradScaler's first scale (2^16) may overflow R1's inner gradient once; that step is skipped and the
    # scale halved, as for any fp16 overflow. From then on the penalties are finite.
    skipped = int(float(losses[-1].get("guard/nonfinite_skipped") or 0))
    assert skipped <= (1 if precision == "16-mixed" else 0)
    assert all(math.isfinite(float(r["loss/r1"])) and float(r["loss/r1"]) > 0 for r in losses[skipped:])
    assert sorted(p.name for p in (out / "samples").glob("*.png"))[-1] == "step_0000004.png"
    assert math.isfinite(metrics["eval/fid"]) and metrics["eval/fid"] > 0
    if precision == "16-mixed":
        assert last_checkpoint(out)["pixelsmith"]["grad_scaler"]["scale"] > 0  # the scaler ran and is saved


R3GAN_CPU = [
    "hardware=cpu",
    "hardware.channels_last=false",
    "train.progress_bar=false",
    "logger=csv",
    "eval.every_n_steps=0",
    "model=r3gan",
    "model.generator.widths=[16,16,16,16]",
    "model.generator.groups=[2,2,2,2]",
]
WGAN_CPU = [
    "hardware=cpu",
    "hardware.channels_last=false",
    "train.progress_bar=false",
    "logger=csv",
    "eval.every_n_steps=0",
    "model.generator.ngf=16",
    "model.discriminator.ndf=16",
    "model.discriminator.norm=none",
    "+model/objective=wgan_gp",
    "model.objective.loss=null",
    "data.batch_size=20",  # 2 ranks x 5 draws x 2
]


def _train(run_dir, debug: str, *overrides: str) -> dict:
    result = run_cli(["train.py", f"debug={debug}", *overrides, f"hydra.run.dir={run_dir}"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return last_checkpoint(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["r3gan", "wgan_gp"])
def test_under_ddp_and_fsdp_the_ranks_agree_and_the_two_strategies_match_bit_for_bit(tmp_path, objective):
    common = [
        *(R3GAN_CPU + SCHEDULED if objective == "r3gan" else WGAN_CPU),
        "precision=32-true",
        "max_steps=3",
        "train.checkpoint_every_n_steps=3",
        "callbacks.ddp_check.every_n_steps=3",
    ]
    with ThreadPoolExecutor(2) as pool:
        fsdp = pool.submit(_train, tmp_path / "fsdp", "fsdp", *common)
        ddp = pool.submit(_train, tmp_path / "ddp", "ddp", *common)
        fsdp, ddp = fsdp.result(), ddp.result()
    for name in ("fsdp", "ddp"):
        report = json.loads((tmp_path / name / "ddp_consistency.json").read_text())
        assert report["world_size"] == 2 and report["max_abs_diff"] == 0.0, (name, report)
    assert fsdp["pixelsmith"]["images_seen"] == ddp["pixelsmith"]["images_seen"]
    # R3GAN counts D's draw (half of each rank's batch), WGAN-GP all five critic draws.
    per_iteration = {"r3gan": 16 // 2, "wgan_gp": 20}[objective]
    assert fsdp["pixelsmith"]["images_seen"] == 3 * per_iteration
    for key, value in ddp["state_dict"].items():
        assert (value.double() - fsdp["state_dict"][key].double()).abs().max() == 0.0, key
