"""The GPU test set: `pytest -m gpu` on a machine with a CUDA GPU (skipped without one; CPU CI does not run it).

It trains every GPU path of the README for a few iterations with the hardware profiles' own defaults (compile and
channels_last included): each profile (auto, v100, a100, h100) in each precision, each strategy (auto, ddp and fsdp
on one GPU), each model (DCGAN, StyleGAN2 with lazy R1 through ADA and DiffAugment; the style models' cases are in
test_style_gpu.py), each compile mode (default, reduce-overhead and max-autotune, which must then run as CUDA
graphs), with sample grids and FID evaluation between iterations; then `evaluate.py` on the results, and a memory
check. Every run must compile its own graphs (counted for that run alone, `tests/compile_counts.py`) and has no time
budget (a cold compile can take minutes). Budget: under 10 minutes on one H100 (most of it torch.compile; inductor's on-disk cache makes
a second run faster).

`PIXELSMITH_GPU_TESTS_ON_CPU=1 pytest -m gpu` runs the same cases on CPU (cpu profile with compile and
channels_last, the CUDA assertions dropped): a slow dry run of this file's logic for sessions without a GPU.
"""

from __future__ import annotations

import gc
import json
import math
import os

import pytest
import torch
import torch._dynamo
from omegaconf import OmegaConf

from pixelsmith.run.fit import run
from tests.compile_counts import compile_counts
from tests.conftest import SMALL, compose_config, run_cli

ON_CPU = os.environ.get("PIXELSMITH_GPU_TESTS_ON_CPU") == "1"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() or ON_CPU), reason="needs a CUDA GPU (pytest -m gpu on a GPU machine)"
    ),
]

# A few iterations of everything: R1 (R1 interval 2: at iterations 0 and 2), samples and evaluation between them.
COMMON = [
    "train.progress_bar=false",
    "logger=csv",
    "data.limit=1024",
    "max_steps=3",
    "train.log_every_n_steps=1",
    "train.sample_every_n_steps=2",
    "train.checkpoint_every_n_steps=2",
    "eval.every_n_steps=2",
    "eval.num_samples=256",
    "eval.batch_size=128",
    "eval.reference_samples=512",
    "train.time_budget_minutes=null",  # a cold compile (max-autotune: minutes) must not end a case early
]
# torch.compile's modes beyond the profiles' `default`: CUDA graphs (reduce-overhead), plus autotuned kernels
# (max-autotune).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
GAN_CASES = {
    # profile x precision, each with the profile's own compile/channels_last/cudnn/TF32/fused-Adam settings.
    "auto": ["hardware=auto"],
    "auto-32-true": ["hardware=auto", "precision=32-true"],
    "auto-16-mixed": ["hardware=auto", "precision=16-mixed"],
    # v100: 16-mixed with a GradScaler (runs on any sm_70+ GPU and warns that it is tuned for a V100)
    "v100": ["hardware=v100"],
    "v100-32-true": ["hardware=v100", "precision=32-true"],
    "a100": ["hardware=a100"],
    "a100-16-mixed": ["hardware=a100", "precision=16-mixed"],
    "h100": ["hardware=h100"],
    "h100-16-mixed": ["hardware=h100", "precision=16-mixed"],
    "h100-32-true": ["hardware=h100", "precision=32-true"],
    # strategies on one GPU
    "ddp": ["hardware=auto", "strategy=ddp"],
    "ddp-16-mixed": ["hardware=auto", "strategy=ddp", "precision=16-mixed"],
    "fsdp": ["hardware=auto", "strategy=fsdp"],
    "fsdp-16-mixed": ["hardware=auto", "strategy=fsdp", "precision=16-mixed"],
    # StyleGAN2 with lazy R1 through each augmentation, in each precision
    "stylegan2-ada": [*SMALL["stylegan2"], "hardware=auto", "augment=ada", "augment.initial_p=0.5"],
    "stylegan2-ada-16-mixed": [
        *SMALL["stylegan2"],
        "hardware=auto",
        "augment=ada",
        "augment.initial_p=0.5",
        "precision=16-mixed",
    ],
    "stylegan2-diffaugment-32-true": [
        *SMALL["stylegan2"],
        "hardware=auto",
        "augment=diffaugment",
        "precision=32-true",
    ],
    "stylegan2-ada-fsdp": [
        *SMALL["stylegan2"],
        "hardware=auto",
        "augment=ada",
        "augment.initial_p=0.5",
        "strategy=fsdp",
    ],
    "dcgan-r1-ada": [
        "hardware=auto",
        "model.objective.regularizers.r1.gamma=1.0",
        "augment=ada",
        "augment.initial_p=0.5",
    ],
    # R3GAN with every schedule its presets use (device-side under the profiles' CUDA graphs), ADA's p scheduled
    # over bgc + cutout, in bf16 and fp16; WGAN-GP's repeated critic phase on its own draws
    "r3gan-schedules": [
        *SMALL["r3gan"],
        "hardware=auto",
        "augment=ada",
        "augment.target=null",
        "augment.pipeline='bgc,cutout'",
        "model.ema.rampup=null",
        "+model.schedules.lr={start:2e-4,final:5e-5,horizon_kimg:1}",
        "+model.schedules.beta2={start:0.9,final:0.99,horizon_kimg:1}",
        "+model.schedules.gamma={start:0.05,final:0.005,horizon_kimg:1}",
        "+model.schedules.ema_half_life_kimg={start:0,final:0.5,horizon_kimg:1}",
        "+model.schedules.augment_p={start:0.2,final:0.55,horizon_kimg:1}",
    ],
    "r3gan-16-mixed": [*SMALL["r3gan"], "hardware=auto", "precision=16-mixed"],
    "wgan-gp": [
        "hardware=auto",
        "+model/objective=wgan_gp",
        "model.objective.loss=null",
        "model.discriminator.norm=none",
        "data.batch_size=320",  # 5 critic draws of 64
    ],
    # compile modes: CUDA graphs of G and D with samples and evaluation between iterations (other batch sizes,
    # no_grad). hardware.cuda_graphs (the whole iteration as graphs, on in the GPU profiles) would run them as
    # default / max-autotune-no-cudagraphs, so it is off here; the cases above run it.
    "h100-reduce-overhead": [
        "hardware=h100",
        "hardware.compile_mode=reduce-overhead",
        "hardware.cuda_graphs=false",
    ],
    "auto-max-autotune": [
        "hardware=auto",
        "hardware.compile_mode=max-autotune",
        "hardware.cuda_graphs=false",
    ],
    # ... and with lazy R1 through ADA (the R1 forward runs D eagerly, between graph replays)
    "stylegan2-ada-reduce-overhead": [
        *SMALL["stylegan2"],
        "hardware=auto",
        "augment=ada",
        "augment.initial_p=0.5",
        "hardware.compile_mode=reduce-overhead",
        "hardware.cuda_graphs=false",
    ],
}


def _on_device(overrides: list[str]) -> list[str]:
    if not ON_CPU:
        return overrides
    # The dry run: the cpu profile with the GPU profiles' compile and channels_last, fp32 where the case says bf16.
    kept = [o for o in overrides if not o.startswith("hardware=")]
    # The GPU profiles' CUDA graphs too, unless the case sets them (uncaptured on CPU: the graphed code path).
    graphs = [] if any(o.startswith("hardware.cuda_graphs=") for o in kept) else ["hardware.cuda_graphs=true"]
    return [*kept, "hardware=cpu", "hardware.compile=true", "hardware.channels_last=true", *graphs]


def _config(overrides: list[str], out):
    return compose_config([*COMMON, *_on_device(overrides)], out)


def _train(overrides: list[str], out) -> dict[str, float]:
    cfg = _config(overrides, out)
    r1 = OmegaConf.select(cfg, "model.objective.regularizers.r1")
    with_r1 = r1 is not None and r1.gamma > 0
    if with_r1:
        r1.interval = 2
    with compile_counts() as compiled:
        metrics = run(cfg)
    hardware = json.loads(json.dumps(_resolved(out)["runtime_plan"]))
    assert metrics["iteration"] == 3
    if not ON_CPU:
        assert hardware["accelerator"] == "cuda"
    assert hardware["compile"] and hardware["channels_last"], "the GPU profiles compile and use channels_last"
    assert hardware["compile_mode"] == (cfg.hardware.compile_mode or "default")
    assert compiled.graphs > 0, "this run compiled nothing"
    if hardware["compile_mode"] in CUDA_GRAPH_MODES and not ON_CPU:
        assert compiled.cudagraph_skips == 0, (
            f"compile_mode={hardware['compile_mode']}: {compiled.cudagraph_skips} compiled graph(s) ran without CUDA "
            "graphs; TORCH_LOGS=cudagraphs prints inductor's reasons"
        )
    finite = {k: v for k, v in metrics.items() if k.startswith("loss/")}
    assert finite and all(math.isfinite(v) for v in finite.values()), finite
    if with_r1:
        assert metrics["loss/r1"] > 0
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["pixelsmith"]["iteration"] == 3
    assert not [k for k in state["state_dict"] if "_orig_mod" in k]
    return metrics


def _resolved(out):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(out / "config_resolved.yaml"))


@pytest.mark.parametrize("case", list(GAN_CASES))
def test_gan_trains_on_the_gpu(case, tmp_path):
    _train(GAN_CASES[case], tmp_path / "run")
    history = json.loads((tmp_path / "run" / "eval_history.json").read_text())["history"]
    assert [e["iteration"] for e in history] == [0, 2, 3]
    assert all(math.isfinite(e["fid"]) for e in history)
    assert sorted(p.name for p in (tmp_path / "run" / "samples").glob("*.png"))[:2] == [
        "step_0000000.png",
        "step_0000002.png",
    ]


def test_a_jpeg_zip_trains_with_its_batches_decoded_on_the_gpu(tmp_path):
    """data=zip of JPEGs: nvJPEG decodes each batch on the device (`data.decoder=auto` picks it on CUDA), its pixels
    within JPEG-decoder tolerance of Pillow's, and a run trains on them."""
    import io

    import numpy as np
    from PIL import Image

    from pixelsmith.data.decode import decode_batch_on_device
    from pixelsmith.data.image_folder import decode_square
    from pixelsmith.data.prepare import PrepareOptions, prepare

    source = tmp_path / "jpegs"
    source.mkdir()
    rng = np.random.default_rng(0)
    for i in range(96):
        pixels = (np.linspace(0, 200, 64)[None, :, None] + rng.random((64, 64, 3)) * 50).astype(np.uint8)
        Image.fromarray(pixels).save(source / f"{i:03d}.jpg", quality=92)
    dest = prepare(PrepareOptions(str(source), str(tmp_path / "j.zip"), 32, encoding="jpeg", progress=False))[
        1
    ]
    device = torch.device("cuda" if not ON_CPU else "cpu")
    data = (source / "000.jpg").read_bytes()
    on_device = decode_batch_on_device([torch.frombuffer(bytearray(data), dtype=torch.uint8)], 32, 3, device)
    pil = decode_square(io.BytesIO(data), 32, 3)
    assert on_device.device.type == device.type
    assert (on_device[0].cpu().float() - pil.float()).abs().mean() < 3.0
    out = tmp_path / "run"
    # No evaluation: an image dataset's FID needs the Inception weights file, which this test does not assume.
    zip_case = ["hardware=auto", "data=zip", f"data.path={dest}", "data.resolution=32", "data.channels=3"]
    _train([*zip_case, "eval.every_n_steps=0"], out)
    if not ON_CPU:
        assert "decodes with nvjpeg" in (out / "train.log").read_text()


def test_evaluate_runs_on_cuda(tmp_path):
    gan = tmp_path / "gan"
    _train(["hardware=auto"], gan)
    result = run_cli(
        [
            "evaluate.py",
            f"ckpt_path={gan / 'checkpoints' / 'last.ckpt'}",
            *_on_device(["hardware=auto"]),
            "eval.num_samples=256",
            "eval.reference_samples=512",
            f"hydra.run.dir={tmp_path / 'evaluation'}",
        ]
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "evaluation" / "metrics.json").read_text())
    assert math.isfinite(report["metrics"]["fid"])


@pytest.mark.skipif(ON_CPU, reason="CUDA memory counters")
def test_gpu_memory_is_released_after_a_run(tmp_path):
    """Peak memory of a short run is bounded, and a finished run leaves nothing allocated behind it (a sweep runs
    its jobs in one process)."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _train(["hardware=auto"], tmp_path / "run")
    peak = torch.cuda.max_memory_allocated()
    torch._dynamo.reset()
    gc.collect()
    leftover = torch.cuda.memory_allocated() - baseline
    assert peak < 8 * 2**30, f"peak {peak / 2**30:.1f} GiB for a 32 px DCGAN"
    assert leftover < 64 * 2**20, f"{leftover / 2**20:.0f} MiB still allocated after the run"


SYNC_FREE_CASES = {
    "auto": ["hardware=auto"],
    "auto-16-mixed": ["hardware=auto", "precision=16-mixed"],
    "stylegan2-ada-r1": [*SMALL["stylegan2"], "hardware=auto", "augment=ada", "augment.initial_p=0.5"],
}


@pytest.mark.parametrize("case", list(SYNC_FREE_CASES))
def test_iterations_that_log_nothing_never_synchronise(case, tmp_path, monkeypatch):
    """`torch.cuda.set_sync_debug_mode("error")` (train.host_sync_check=error) on every iteration that logs nothing,
    with the profile's compile, fused Adam, EMA, lazy R1 (every 2nd iteration) through ADA and the schedule."""
    assert_quiet_iterations_never_synchronise(SYNC_FREE_CASES[case], tmp_path, monkeypatch)


def assert_quiet_iterations_never_synchronise(overrides: list[str], tmp_path, monkeypatch) -> None:
    if ON_CPU:  # the GPU code path of ADA (no row selection by nonzero())
        from pixelsmith.augment import ada

        monkeypatch.setattr(ada, "_warp_selected_rows_only", lambda device: False)
    cfg = _config(overrides, tmp_path / "run")
    cfg.max_steps = 9
    cfg.train.log_every_n_steps = 4
    cfg.train.host_sync_check = "error"
    cfg.train.clip_grad_norm = 1.0
    cfg.eval.every_n_steps = 0
    r1 = OmegaConf.select(cfg, "model.objective.regularizers.r1")
    if r1 is not None:
        r1.gamma = r1.gamma or 0.1
        r1.interval = 2
    metrics = run(cfg)  # raises HostSyncError / CUDA's sync error at the first synchronising call
    assert metrics["iteration"] == 9


PLANTED_READER = "tests.test_host_sync.ReadsTheDeviceAtEveryBatchEnd"


LOOP_CASES = {
    # The main job's data path (the dataset on the device), compiled as the profile says (a DataLoader one:
    # test_style_gpu.py's style_fast case).
    "dcgan-on-device-data": ["hardware=auto"],
}
QUIET_LOOP = {
    "max_steps": 10,
    "train.log_every_n_steps": 5,  # iterations 1-3 and 5-8 are checked (0 sets up, 4 and 9 log)
    "train.sample_every_n_steps": 5,
    "train.checkpoint_every_n_steps": 5,
    "eval.every_n_steps": 0,
    "train.progress_bar": True,  # the bar and the csv logger run in the loop being checked
    "train.host_sync_check": "error",
    "train.host_sync_scope": "loop",
    "train.time_budget_minutes": None,
}


def _quiet_loop_config(overrides: list[str], out):
    cfg = _config(overrides, out)
    for key, value in QUIET_LOOP.items():
        OmegaConf.update(cfg, key, value, force_add=False)
    return cfg


@pytest.mark.parametrize("case", list(LOOP_CASES))
def test_no_host_sync_across_the_whole_lightning_loop(case, tmp_path, monkeypatch):
    """`torch.cuda.set_sync_debug_mode("error")` from one iteration's `on_train_batch_start` to the next one's, on
    every iteration that logs nothing: the module's step, every callback's batch end (progress bar, checkpoint and
    sample callbacks, loggers), Lightning's bookkeeping and the next batch's fetch."""
    assert_no_host_sync_across_the_loop(LOOP_CASES[case], tmp_path, monkeypatch)


def assert_no_host_sync_across_the_loop(overrides: list[str], tmp_path, monkeypatch) -> None:
    from pixelsmith.callbacks.host_sync import HostSyncCheck

    checks: list[HostSyncCheck] = []
    original = HostSyncCheck.on_train_start

    def recording(self, trainer, pl_module):
        checks.append(self)
        original(self, trainer, pl_module)

    monkeypatch.setattr(HostSyncCheck, "on_train_start", recording)
    metrics = run(_quiet_loop_config(overrides, tmp_path / "run"))
    assert metrics["iteration"] == 10
    (check,) = checks
    assert check.scope == "loop" and check.checked == 7 and check.events == []
    if not ON_CPU:
        assert torch.cuda.get_sync_debug_mode() == 0  # the window is closed after the run


@pytest.mark.parametrize("where", ["another-callbacks-batch-end", "the-batch-fetch"])
def test_a_sync_outside_the_step_fails_the_whole_loop_check(where, tmp_path, monkeypatch):
    """The same check can fail: a device read planted outside `training_step` stops the run (CUDA's sync debug
    mode raises; the CPU dry run's counter raises HostSyncError)."""
    from omegaconf import open_dict

    cfg = _quiet_loop_config(["hardware=auto", "hardware.compile=false"], tmp_path / "run")
    if where == "the-batch-fetch":
        from pixelsmith.data.on_device import DeviceResidentBatches

        indices = DeviceResidentBatches.indices

        def indices_read_on_the_host(self, iteration):
            chosen = indices(self, iteration)
            int(chosen[0])  # the planted sync: a fetch that decides something on the host
            return chosen

        monkeypatch.setattr(DeviceResidentBatches, "indices", indices_read_on_the_host)
    else:
        with open_dict(cfg):
            cfg.callbacks.reader = {"_target_": PLANTED_READER}
    with pytest.raises(RuntimeError, match="synchroniz|made the host wait"):
        run(cfg)
    if not ON_CPU:
        assert torch.cuda.get_sync_debug_mode() == 0  # closed on the exception too
