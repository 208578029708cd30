"""Clusters and faults: preemption signals, auto-resume, run dirs owned by one run, launcher topology,
one run dir under torchrun (one node x 2 and 2 nodes x 1 over gloo on 127.0.0.1), a dead rank reported by name,
the SLURM launcher's sbatch script (golden file) and a sweep under submitit's local executor. A dead loader worker:
tests/test_data.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from pixelsmith.config.paths import REPO_ROOT
from pixelsmith.core.preemption import RunPreempted
from pixelsmith.run import launch
from pixelsmith.run.fit import run
from pixelsmith.run.run_dir import RunDirError, _lock
from tests.conftest import FAST, SMALL, free_port, last_checkpoint, metrics_rows, run_cli, series

SHORT = ["precision=32-true", "train.sample_every_n_steps=0", "train.checkpoint_every_n_steps=0"]


class SignalAt(Callback):
    """Sends `signum` to this process in the middle of iteration `at` (1-based), as a scheduler would."""

    def __init__(self, signum: int, at: int):
        self.signum, self.at = signum, at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.iteration == self.at - 1:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_preemption_signal_ends_the_iteration_with_last_ckpt_and_the_rerun_resumes_bit_for_bit(
    make_cfg, tmp_path, monkeypatch, signum
):
    import pixelsmith.run.trainer as train_module

    common = [
        *SHORT,
        "schedule=warmup_cosine",
        "schedule.warmup_steps=2",
        "schedule.total_steps=6",
        "max_steps=6",
    ]
    run(make_cfg(*common, output="straight"))

    original = train_module._instantiate_group
    monkeypatch.setattr(
        train_module,
        "_instantiate_group",
        lambda node: (
            original(node) + ([SignalAt(signum, at=3)] if node is not None and "checkpoint" in node else [])
        ),
    )
    with pytest.raises(RunPreempted) as info:
        run(make_cfg(*common, output="preempted"))
    assert info.value.exit_code == 128 + signum
    assert "end of iteration 3" in str(info.value) and "last.ckpt" in str(info.value)
    assert last_checkpoint(tmp_path / "preempted")["pixelsmith"]["iteration"] == 3
    final = json.loads((tmp_path / "preempted" / "final_metrics.json").read_text())
    assert final["stop_reason"] == "preempted" and final["iteration"] == 3
    # The handlers are the process's own again after the run.
    assert signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)

    monkeypatch.setattr(train_module, "_instantiate_group", original)
    metrics = run(make_cfg(*common, output="preempted"))  # same run dir, no ckpt_path: auto-resume
    assert metrics["iteration"] == 6 and metrics["stop_reason"] == "max_steps"
    straight, resumed = last_checkpoint(tmp_path / "straight"), last_checkpoint(tmp_path / "preempted")
    for key, value in straight["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key
    assert straight["lr_schedulers"] == resumed["lr_schedulers"]
    # The resumed run appends to the metrics the preempted one wrote (Lightning's CSV logger deleted them).
    assert series(metrics_rows(tmp_path / "preempted"), "train/iteration") == [3.0, 6.0]


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_a_signalled_training_process_exits_for_requeue_and_its_rerun_resumes(tmp_path):
    """SIGTERM to a real `python train.py`: status 143, last.ckpt at the iteration it names; the same command again
    resumes there by itself."""
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "train.py",
        *FAST,
        *SMALL["dcgan"],
        "precision=32-true",
        "max_steps=400",
        "train.checkpoint_every_n_steps=2",
        "train.sample_every_n_steps=0",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.Popen(
        args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "last.ckpt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]
    stopped = int(re.search(r"stops at the end of iteration (\d+)", output).group(1))
    assert last_checkpoint(run_dir)["pixelsmith"]["iteration"] == stopped < 400
    assert "Preempted by SIGTERM" in output and "Traceback" not in output

    args[args.index("max_steps=400")] = f"max_steps={stopped + 2}"
    result = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Resuming from" in result.stdout + result.stderr
    assert last_checkpoint(run_dir)["pixelsmith"]["iteration"] == stopped + 2


def test_a_run_dir_in_use_by_another_run_is_refused_naming_its_pid(make_cfg, tmp_path):
    fd = _lock(tmp_path / "run")  # another run holds it
    try:
        with pytest.raises(RunDirError, match=rf"in use by another run \(pid@host {os.getpid()}@"):
            run(make_cfg(*SHORT, "max_steps=1"))
    finally:
        os.close(fd)
    assert not (tmp_path / "run" / "config_resolved.yaml").exists()  # nothing written


def test_a_run_dir_holding_a_run_is_resumed_refused_or_overwritten_on_request(
    make_cfg, tmp_path, monkeypatch
):
    run(make_cfg(*SHORT, "max_steps=2", "train.checkpoint_every_n_steps=0"))
    assert run(make_cfg(*SHORT, "max_steps=3"))["iteration"] == 3  # auto-resume from last.ckpt
    with pytest.raises(RunDirError, match="train.auto_resume=false"):
        run(make_cfg(*SHORT, "max_steps=3", "train.auto_resume=false"))
    assert last_checkpoint(tmp_path / "run")["pixelsmith"]["iteration"] == 3  # untouched
    assert (
        run(make_cfg(*SHORT, "max_steps=1", "train.auto_resume=false", "train.overwrite=true"))["iteration"]
        == 1
    )

    (tmp_path / "run" / "checkpoints" / "last.ckpt").unlink()  # a run that left no checkpoint
    with pytest.raises(RunDirError, match="no checkpoints/last.ckpt to resume from") as info:
        run(make_cfg(*SHORT, "max_steps=1"))
    assert "train.overwrite=true" in str(info.value) and "hydra.run.dir" in str(info.value)
    # A requeued job whose first attempt died before its first checkpoint starts afresh in its own dir.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert run(make_cfg(*SHORT, "max_steps=1"))["iteration"] == 1


def test_metrics_end_at_the_resumed_iteration_and_an_overwritten_runs_move_aside(tmp_path):
    from pixelsmith.loggers.csv import align_metrics_with_resume

    path = tmp_path / "metrics.csv"
    path.write_text("step,train/iteration,loss/G\n" + "".join(f"{2 * i},{i},0.{i}\n" for i in range(1, 6)))
    align_metrics_with_resume(path, 3)  # a crash after iteration 5, resumed from the checkpoint of 3
    assert [row["train/iteration"] for row in metrics_rows(tmp_path)] == ["1", "2", "3"]
    align_metrics_with_resume(path, None)  # train.overwrite=true: a fresh start keeps the old file aside
    assert not path.exists() and len(list(tmp_path.glob("metrics.replaced-*.csv"))) == 1


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_a_refused_command_line_run_writes_nothing_into_the_dir(tmp_path):
    """`python train.py hydra.run.dir=<a dir another run owns>`: exit 2 with one paragraph, before Hydra saves its
    config or opens its log there."""
    run_dir = tmp_path / "finished"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("earlier: run\n")
    (run_dir / "config_resolved.yaml").write_text("earlier: run\n")  # a run that left no last.ckpt
    result = run_cli(["train.py", "hardware=cpu", f"hydra.run.dir={run_dir}"], timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "already holds another run" in result.stderr and "Traceback" not in result.stderr
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "earlier: run\n"
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", ".run.lock", "config_resolved.yaml"]

    busy = tmp_path / "busy"
    fd = _lock(busy)  # a run in progress holds it
    try:
        result = run_cli(["train.py", "hardware=cpu", f"hydra.run.dir={busy}"], timeout=120)
    finally:
        os.close(fd)
    assert result.returncode == 2 and f"in use by another run (pid@host {os.getpid()}@" in result.stderr
    assert not (busy / ".hydra").exists()


def test_the_launcher_decides_nodes_and_processes(monkeypatch, make_cfg):
    from pixelsmith.run.build import resolve_hardware

    for key in list(os.environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_")) or key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(key)
    assert launch.launch_topology() is None and launch.global_rank() == 0
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "3")
    assert launch.launch_topology() == launch.LaunchTopology("torchrun", 2, 2)
    assert (
        launch.global_rank() == 3
        and launch.hydra_subdir() is None
        and launch.log_name("train") == "train_rank3"
    )
    hardware = resolve_hardware(make_cfg("hardware.devices=1"))  # the launcher wins over the config
    assert (hardware.num_nodes, hardware.devices, hardware.strategy) == (2, 2, "ddp")

    for key in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert launch.launch_topology() == launch.LaunchTopology("slurm", 2, 4)
    assert launch.run_stamp() == "slurm-4242"  # a requeued job keeps its id, so its run dir
    monkeypatch.setenv("SLURM_STEP_ID", "1")  # the second srun of a job script: a dir of its own
    assert launch.run_stamp() == "slurm-4242.1"
    monkeypatch.delenv("SLURM_STEP_ID")
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # an interactive allocation: a fresh stamp per run
    assert launch.run_stamp().startswith("20") and launch.launch_topology() is None


def _torchrun(tmp_path: Path, node_args: list[list[str]], port: int) -> list[subprocess.CompletedProcess]:
    train = [
        str(REPO_ROOT / "train.py"),
        "debug=ddp",
        "hardware=cpu",
        "precision=32-true",
        "max_steps=4",
        "train.checkpoint_every_n_steps=2",
        "callbacks.ddp_check.every_n_steps=2",
        "train.progress_bar=false",
        "logger=csv",
        "eval.every_n_steps=0",
        "model.generator.ngf=16",
        "model.discriminator.ndf=16",
    ]
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *args, f"--master-port={port}", *train],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for args in node_args
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=600), p.stdout.read(), "") for p in procs]


@pytest.mark.slow
@pytest.mark.parametrize(
    "nodes",
    [
        [["--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1"]],
        [
            ["--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=1", "--master-addr=127.0.0.1"]
            for rank in (0, 1)
        ],
    ],
    ids=["1node_x2", "2nodes_x1"],
)
def test_torchrun_makes_one_run_dir_with_identical_ranks(tmp_path, nodes):
    results = _torchrun(tmp_path, nodes, port=free_port())
    for result in results:
        assert result.returncode == 0, result.stdout[-4000:]
    (run_dir,) = (tmp_path / "outputs" / "train" / "runs").iterdir()  # one run dir for the whole launch
    report = json.loads((run_dir / "ddp_consistency.json").read_text())
    assert report["world_size"] == 2 and report["iteration"] == 4 and report["max_abs_diff"] == 0.0
    assert last_checkpoint(run_dir)["pixelsmith"]["iteration"] == 4
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "train.log").is_file() and (run_dir / "train_rank1.log").is_file()
    node_count, per_node = (2, 1) if len(nodes) == 2 else (1, 2)
    assert f"nodes={node_count} devices={per_node}" in (run_dir / "train.log").read_text()


@pytest.mark.slow
def test_a_rank_killed_mid_run_ends_the_job_within_60s_naming_it(tmp_path):
    """kill -9 one of 2 gloo processes: the job exits non-zero well within 60 s and says which rank died."""
    run_dir = tmp_path / "run"
    proc = _ddp_training_until_its_first_checkpoint(run_dir, "callbacks.ddp_check.every_n_steps=0")
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "rank 1 was not started"
    os.kill(int(children[0]), signal.SIGKILL)
    killed_at = time.monotonic()
    output, _ = proc.communicate(timeout=120)
    assert time.monotonic() - killed_at < 60
    assert proc.returncode != 0
    assert re.search(r"rank:? 1\b", output), output[-3000:]


SBATCH_DOUBLE = """#!/bin/sh
# Test double for SLURM's sbatch: keeps the submitted script, refuses the submission.
for last; do :; done
cp "$last" "$SBATCH_COPY"
echo "sbatch: error: test double, no SLURM here" >&2
exit 1
"""


@pytest.mark.slow  # a subprocess: the full run (`pytest --all`) only
def test_the_slurm_launcher_renders_the_golden_sbatch_script(tmp_path):
    """`python train.py -m hydra/launcher=slurm ...` through hydra-submitit-launcher, up to the sbatch call: nodes,
    tasks and GPUs follow the hardware keys, and the time, partition, requeue and warning signal are set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(SBATCH_DOUBLE)
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit only checks that srun exists
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    sweep, copy = tmp_path / "sweep", tmp_path / "job.sh"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SBATCH_COPY": str(copy)}
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.timeout_min=600",
            "hardware=a100",
            "hardware.devices=4",
            "hardware.num_nodes=2",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "test double, no SLURM here" in result.stderr, result.stdout[-2000:] + result.stderr[-2000:]
    rendered = copy.read_text().replace(str(sweep), "<SWEEP_DIR>").replace(sys.executable, "<PYTHON>")
    assert rendered == (Path(__file__).parent / "golden" / "sbatch_a100_2nodes_x4.sh").read_text()


@pytest.mark.slow
def test_a_sweep_runs_under_submitits_local_executor(tmp_path):
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=10",
            *FAST,
            *SMALL["dcgan"],
            "precision=32-true",
            "max_steps=2",
            "seed=1,2",
            "objective=loss/G",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for job in ("0", "1"):
        payload = json.loads((sweep / job / "result.json").read_text())
        assert payload["status"] == "ok" and payload["metrics"]["iteration"] == 2.0
        assert last_checkpoint(sweep / job)["pixelsmith"]["iteration"] == 2
    summary = (sweep / "summary.md").read_text()
    assert "seed=1" in summary and "seed=2" in summary and "loss/G" in summary


@pytest.mark.slow
def test_sigterm_to_rank_0_of_two_processes_stops_both_at_one_iteration_with_last_ckpt(tmp_path):
    """Kubernetes signals the container's first process only: rank 0 of Lightning's launcher. The ranks agree at
    the next check (every 2 iterations here), both stop there, last.ckpt holds that iteration, status 143."""
    run_dir = tmp_path / "run"
    proc = _ddp_training_until_its_first_checkpoint(
        run_dir, "train.preemption.check_every_n_steps=2", "callbacks.ddp_check.every_n_steps=2"
    )
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-4000:]
    stopped = int(re.search(r"stops at the end of iteration (\d+)", output).group(1))
    assert stopped % 2 == 0 and last_checkpoint(run_dir)["pixelsmith"]["iteration"] == stopped
    report = json.loads((run_dir / "ddp_consistency.json").read_text())
    assert report["world_size"] == 2 and report["max_abs_diff"] == 0.0


def _ddp_training_until_its_first_checkpoint(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """`python train.py debug=ddp ...` (2 gloo processes, endless max_steps) started and waited on until it has
    written its first last.ckpt (at iteration 2): a run in progress to signal or to kill a rank of."""
    args = [
        sys.executable,
        "train.py",
        "debug=ddp",
        "hardware=cpu",
        "precision=32-true",
        "max_steps=100000",
        "train.progress_bar=false",
        "logger=csv",
        "eval.every_n_steps=0",
        "train.sample_every_n_steps=0",
        "train.checkpoint_every_n_steps=2",
        "model.generator.ngf=16",
        "model.discriminator.ndf=16",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "MASTER_PORT": str(free_port())}
    proc = subprocess.Popen(
        args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "last.ckpt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc
