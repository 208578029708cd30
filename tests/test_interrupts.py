"""Interrupts and resumes: Ctrl-C ends the iteration, writes last.ckpt and exits 130 with the
command that resumes (one process, two DDP processes; a style run with loader workers: test_style_interrupts.py); a second Ctrl-C, or one in
set-up, stops at once and leaves the previous last.ckpt as it was; a resume with another model, a finished run or a
truncated checkpoint is refused at start-up with one paragraph and nothing written."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

import pixelsmith.run.fit as train_module
import pixelsmith.run.trainer as trainer_module
from pixelsmith.config.paths import REPO_ROOT
from pixelsmith.core.preemption import RunPreempted, StoppedAtOnce
from pixelsmith.errors import PixelsmithError
from pixelsmith.run.entry import stopped_at_once_message
from pixelsmith.run.fit import run
from pixelsmith.run.resume import AlreadyFinished, CheckpointMismatchError
from tests.conftest import FAST, SMALL, run_cli
from tests.test_cluster import _ddp_training_until_its_first_checkpoint

SHORT = ["precision=32-true", "train.sample_every_n_steps=0", "train.checkpoint_every_n_steps=2"]


def _iteration(path: Path) -> int:
    return torch.load(path, weights_only=True)["pixelsmith"]["iteration"]


class _SigintReachedTheDefaultHandler(AssertionError):
    pass


@pytest.fixture
def sigint_outside_runs():
    """A Ctrl-C sent by a test that no run handles fails that test (instead of ending pytest with KeyboardInterrupt);
    a run must give this handler back when it ends."""

    def refuse(signum, frame):
        raise _SigintReachedTheDefaultHandler("SIGINT reached the handler the run should have replaced")

    previous = signal.signal(signal.SIGINT, refuse)
    yield refuse
    signal.signal(signal.SIGINT, previous)


def _add_callbacks(monkeypatch, *callbacks: Callback) -> None:
    """The run's Trainer gets these callbacks after its own (checkpoint first), as a user's would be."""
    original = trainer_module._instantiate_group
    monkeypatch.setattr(
        trainer_module,
        "_instantiate_group",
        lambda node: original(node) + (list(callbacks) if node is not None and "checkpoint" in node else []),
    )


class CtrlCAt(Callback):
    """Ctrl-C (SIGINT to this process) in the middle of iteration `at` (1-based)."""

    def __init__(self, at: int):
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.iteration == self.at - 1:
            os.kill(os.getpid(), signal.SIGINT)


class CtrlCWhileSaving(Callback):
    """A second Ctrl-C in the middle of writing the checkpoint of iteration `at`: after its bytes are on disk next to
    last.ckpt, before they are renamed into place."""

    def __init__(self, at: int):
        self.at = at
        self.partial_seen: list[Path] = []

    def on_train_start(self, trainer, pl_module) -> None:
        io = trainer.strategy.checkpoint_io
        write = io.save_checkpoint

        def write_then_ctrl_c(checkpoint, path, storage_options=None):
            write(checkpoint, path, storage_options)
            if pl_module.iteration == self.at:
                self.partial_seen.append(Path(path))
                os.kill(os.getpid(), signal.SIGINT)

        io.save_checkpoint = write_then_ctrl_c


def test_ctrl_c_ends_the_iteration_writes_last_ckpt_exits_130_and_the_rerun_resumes(
    make_cfg, tmp_path, monkeypatch, sigint_outside_runs
):
    common = [*SHORT, "max_steps=6"]
    _add_callbacks(monkeypatch, CtrlCAt(3))
    with pytest.raises(RunPreempted) as info:
        run(make_cfg(*common))
    message = str(info.value)
    assert info.value.exit_code == 130
    assert message.startswith("Interrupted by Ctrl-C (SIGINT): training stopped at the end of iteration 3")
    assert str(tmp_path / "run" / "checkpoints" / "last.ckpt") in message
    assert _iteration(tmp_path / "run" / "checkpoints" / "last.ckpt") == 3
    final = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert final["stop_reason"] == "preempted" and final["iteration"] == 3
    assert signal.getsignal(signal.SIGINT) is sigint_outside_runs  # the process's own handler again

    monkeypatch.undo()
    metrics = run(make_cfg(*common))  # the same run dir: auto-resume from last.ckpt
    assert metrics["iteration"] == 6 and metrics["stop_reason"] == "max_steps"


def test_a_second_ctrl_c_while_last_ckpt_is_written_stops_at_once_and_keeps_the_previous_one(
    make_cfg, tmp_path, monkeypatch, sigint_outside_runs
):
    """Ctrl-C in iteration 3 asks for last.ckpt of iteration 3; a second one while it is written abandons it: the
    partial file goes, last.ckpt is still iteration 2's (the same file as step_0000002.ckpt), nothing half-written."""
    checkpoints = tmp_path / "run" / "checkpoints"
    saving = CtrlCWhileSaving(at=3)
    _add_callbacks(monkeypatch, CtrlCAt(3), saving)
    cfg = make_cfg(*SHORT, "max_steps=6")
    with pytest.raises(StoppedAtOnce) as info:
        run(cfg)
    assert saving.partial_seen and not saving.partial_seen[0].exists()  # it was written, then removed
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step_0000002.ckpt"]
    assert os.path.samefile(checkpoints / "last.ckpt", checkpoints / "step_0000002.ckpt")
    assert _iteration(checkpoints / "last.ckpt") == 2
    assert signal.getsignal(signal.SIGINT) is sigint_outside_runs

    message = stopped_at_once_message(info.value, cfg)
    assert "a second Ctrl-C came before the first one's checkpoint was complete" in message
    assert f"{checkpoints / 'last.ckpt'} (iteration 2) is intact" in message
    assert "status 130" in message

    monkeypatch.undo()
    metrics = run(make_cfg(*SHORT, "max_steps=6"))  # resumes from iteration 2
    assert metrics["iteration"] == 6


def test_ctrl_c_during_set_up_stops_at_once_and_writes_nothing(
    make_cfg, tmp_path, monkeypatch, sigint_outside_runs
):
    build = train_module.build_datamodule

    def build_then_ctrl_c(*args, **kwargs):
        datamodule = build(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return datamodule

    monkeypatch.setattr(train_module, "build_datamodule", build_then_ctrl_c)
    cfg = make_cfg(*SHORT, "max_steps=6")
    with pytest.raises(StoppedAtOnce) as info:
        run(cfg)
    assert not (tmp_path / "run" / "config_resolved.yaml").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert signal.getsignal(signal.SIGINT) is sigint_outside_runs
    message = stopped_at_once_message(info.value, cfg)
    assert "outside the training loop" in message and "no checkpoint of this run had been written" in message


# ---- resumes refused at start-up ----------------------------------------------------------------------------------
def _nothing_written(run_dir: Path) -> bool:
    return not any(
        (run_dir / name).exists() for name in ("config_resolved.yaml", "metrics.csv", "checkpoints")
    )


def test_resuming_with_another_model_or_z_size_is_refused_at_start_up_naming_the_difference(
    make_cfg, tmp_path
):
    run(make_cfg(*SHORT, "max_steps=2", output="dcgan"))
    last = tmp_path / "dcgan" / "checkpoints" / "last.ckpt"

    with pytest.raises(CheckpointMismatchError) as info:
        run(make_cfg(*SHORT, "max_steps=4", f"ckpt_path={last}", model="stylegan2", output="stylegan2"))
    message = str(info.value)
    assert f"ckpt_path={last} was written by another model" in message
    assert "model: dcgan in the checkpoint, stylegan2 here" in message
    assert "model=dcgan" in message and "leave out ckpt_path" in message
    assert "\n" not in message and "written before it existed" not in message
    assert _nothing_written(tmp_path / "stylegan2")

    with pytest.raises(CheckpointMismatchError) as info:
        run(make_cfg(*SHORT, "max_steps=4", "model.generator.z_dim=64", f"ckpt_path={last}", output="z64"))
    assert "model.generator.z_dim: 100 in the checkpoint, 64 here" in str(info.value)
    assert "this run's command with model.generator.z_dim=100 " in str(info.value)  # how to resume it
    assert "model:" not in str(info.value)  # the same model: only the key that differs
    assert _nothing_written(tmp_path / "z64")


def test_weights_that_do_not_fit_although_the_configs_agree_are_one_paragraph(make_cfg, tmp_path):
    """A tensor of another size (found at start-up) and one of the same size in another shape (found only by the
    load inside fit): both are one paragraph naming the tensor, neither a load_state_dict traceback."""
    run(make_cfg(*SHORT, "max_steps=2", output="source"))
    state = torch.load(tmp_path / "source" / "checkpoints" / "last.ckpt", weights_only=True)
    key = "discriminator.main.2.weight"
    assert state["state_dict"][key].ndim == 4, sorted(
        state["state_dict"]
    )  # a convolution of the discriminator
    weight = state["state_dict"][key]

    state["state_dict"][key] = torch.zeros(weight.shape[0] + 1, *weight.shape[1:])
    torch.save(state, tmp_path / "resized.ckpt")
    with pytest.raises(CheckpointMismatchError) as info:
        run(make_cfg(*SHORT, "max_steps=4", f"ckpt_path={tmp_path / 'resized.ckpt'}", output="resized"))
    assert "agree with the config stored in it" in str(info.value) and key in str(info.value)
    assert _nothing_written(tmp_path / "resized")

    state["state_dict"][key] = weight.transpose(0, 1).contiguous()  # same element count, another shape
    torch.save(state, tmp_path / "transposed.ckpt")
    with pytest.raises(CheckpointMismatchError) as info:
        run(make_cfg(*SHORT, "max_steps=4", f"ckpt_path={tmp_path / 'transposed.ckpt'}", output="transposed"))
    assert f"size mismatch for {key}" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "transposed" / "checkpoints").exists()  # stopped before the first iteration


def test_resuming_a_finished_run_says_so_and_leaves_its_outputs_as_they_are(make_cfg, tmp_path):
    run(make_cfg(*SHORT, "max_steps=2"))
    outputs = ["final_metrics.json", "metrics.csv", "config_resolved.yaml", "checkpoints/last.ckpt"]
    before = {name: (tmp_path / "run" / name).read_bytes() for name in outputs}
    with pytest.raises(AlreadyFinished) as info:
        run(make_cfg(*SHORT, "max_steps=2"))
    assert info.value.exit_code == 0
    assert "is already at iteration 2 and max_steps=2" in str(info.value)
    assert "resume with a larger max_steps" in str(info.value) and "max_steps=4" in str(info.value)
    assert {name: (tmp_path / "run" / name).read_bytes() for name in outputs} == before


def test_a_truncated_checkpoint_is_named_with_the_checkpoints_of_its_run_that_load(make_cfg, tmp_path):
    run(make_cfg(*SHORT, "max_steps=6", "train.keep_checkpoints=3"))
    checkpoints = tmp_path / "run" / "checkpoints"
    # last.ckpt and step_0000006.ckpt are one file (a hard link): truncate a copy put in last.ckpt's place, and
    # step_0000002.ckpt in place, so that only step_0000004.ckpt and step_0000006.ckpt still load.
    data = (checkpoints / "last.ckpt").read_bytes()
    (checkpoints / "cut").write_bytes(data[: len(data) // 2])
    os.replace(checkpoints / "cut", checkpoints / "last.ckpt")
    step_2 = checkpoints / "step_0000002.ckpt"
    step_2.write_bytes(step_2.read_bytes()[:1000])

    with pytest.raises(PixelsmithError) as info:
        run(make_cfg(*SHORT, "max_steps=8", f"ckpt_path={checkpoints / 'last.ckpt'}"))
    message = str(info.value)
    assert "last.ckpt looks truncated or corrupt" in message
    assert "step_0000006.ckpt (iteration 6), step_0000004.ckpt (iteration 4);" in message
    assert "step_0000002" not in message
    assert f"ckpt_path={checkpoints / 'step_0000006.ckpt'}" in message
    assert "Invalid argument" not in message


# ---- the real command line ----------------------------------------------------------------------------------------
def _ctrl_c_to_a_training_process_group(run_dir: Path, *overrides: str) -> tuple[subprocess.Popen, str]:
    """`python train.py ...` in a process group of its own, sent SIGINT once it has written its first last.ckpt, as
    a terminal's Ctrl-C reaches every process of the foreground group (loader workers included)."""
    args = [
        sys.executable,
        "train.py",
        *FAST,
        "precision=32-true",
        "max_steps=400",
        "train.checkpoint_every_n_steps=2",
        "train.sample_every_n_steps=0",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.Popen(
        args,
        cwd=REPO_ROOT,
        env={**os.environ, "HYDRA_FULL_ERROR": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "last.ckpt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=180)
    return proc, output


@pytest.mark.slow  # a subprocess or many compositions: the full run (`pytest --all`) only
def test_ctrl_c_to_train_py_exits_130_with_last_ckpt_and_the_command_it_prints_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc, output = _ctrl_c_to_a_training_process_group(run_dir, *SMALL["dcgan"])
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "graceful shutdown" not in output
    stopped = int(
        re.search(
            r"Interrupted by Ctrl-C \(SIGINT\): training stopped at the end of iteration (\d+)", output
        ).group(1)
    )
    assert _iteration(run_dir / "checkpoints" / "last.ckpt") == stopped < 400

    printed = re.search(r"Resume with: (python train\.py .*)$", output, re.MULTILINE).group(1)
    command = shlex.split(printed)
    assert command[-1] == f"hydra.run.dir={run_dir}" and "max_steps=400" in command
    command = [sys.executable, *command[1:]]
    command[command.index("max_steps=400")] = (
        f"max_steps={stopped + 2}"  # the printed command, trained briefly
    )
    result = run_cli(command[1:], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Resuming from" in result.stdout + result.stderr
    assert _iteration(run_dir / "checkpoints" / "last.ckpt") == stopped + 2


def _rank_1_of(proc: subprocess.Popen) -> int:
    """The pid of the rank Lightning's launcher started: rank 0's child that runs train.py."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    ranks = [int(pid) for pid in children if b"train.py" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(ranks) == 1, children
    return ranks[0]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_ctrl_c_to_one_rank_of_two_processes_stops_both_at_one_iteration_with_last_ckpt(tmp_path, rank):
    """As SIGTERM (tests/test_cluster.py), whichever rank gets it: the ranks agree at the next check (every 2
    iterations here), both stop there, last.ckpt holds that iteration; the run's status (rank 0's) is 130."""
    run_dir = tmp_path / "run"
    proc = _ddp_training_until_its_first_checkpoint(
        run_dir, "train.preemption.check_every_n_steps=2", "callbacks.ddp_check.every_n_steps=2"
    )
    os.kill(proc.pid if rank == 0 else _rank_1_of(proc), signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output[-4000:]
    stopped = int(re.search(r"training stopped at the end of iteration (\d+)", output).group(1))
    assert stopped % 2 == 0 and _iteration(run_dir / "checkpoints" / "last.ckpt") == stopped
    assert "Traceback" not in output
    report = json.loads((run_dir / "ddp_consistency.json").read_text())
    assert report["world_size"] == 2 and report["max_abs_diff"] == 0.0


@pytest.mark.slow
def test_train_py_refuses_another_models_checkpoint_in_one_paragraph_and_a_finished_one_with_status_0(
    tmp_path,
):
    first = ["train.py", *FAST, *SMALL["dcgan"], *SHORT, "max_steps=2", f"hydra.run.dir={tmp_path / 'dcgan'}"]
    assert run_cli(first, timeout=300).returncode == 0
    last = tmp_path / "dcgan" / "checkpoints" / "last.ckpt"

    result = run_cli(first, timeout=300)  # the same command again: the run is finished
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (
        "Nothing to train" in result.stdout + result.stderr and "max_steps=4" in result.stdout + result.stderr
    )

    other = ["train.py", *FAST, *SMALL["stylegan2"], *SHORT, "max_steps=4", f"ckpt_path={last}"]
    result = run_cli([*other, f"hydra.run.dir={tmp_path / 'stylegan2'}"], timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert (
        "Traceback" not in output
        and "load_state_dict" not in output
        and "written before it existed" not in output
    )
    [paragraph] = [line for line in output.splitlines() if "was written by another model" in line]
    assert "model: dcgan in the checkpoint, stylegan2 here" in paragraph
    # The command that wrote the checkpoint, from its run dir's .hydra/overrides.yaml
    assert "the command that wrote it: python train.py" in paragraph and "model.generator.ngf=16" in paragraph


# ---- a stop at once is bounded: the watchdog ------------------------------------------------------------------
def test_the_watchdog_decides_as_the_handlers_do_and_ends_a_run_the_main_thread_cannot_leave(
    sigint_outside_runs,
):
    """In the loop a first Ctrl-C lets the iteration end; the second, or one outside the loop, starts the grace after
    which the watchdog ends the process (here: records it). Leaving the run in time cancels it."""
    import threading

    from pixelsmith.core import preemption

    fired: list[str] = []
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # Python's C handler reports it on the wakeup fd

    def force(when: str) -> None:
        fired.append(when)
        done.set()

    def wait_until(condition) -> None:
        for _ in range(500):
            if condition():
                return
            time.sleep(0.01)
        raise AssertionError("the watchdog never saw the signal")

    watchdog = preemption._Watchdog(0.1, force)
    try:
        watchdog.enter_loop([signal.SIGINT, signal.SIGTERM], lambda: False)
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: watchdog._first_seen)
        assert watchdog._timer is None  # the first one finishes the iteration: nothing to force
        os.kill(os.getpid(), signal.SIGINT)
        assert done.wait(30) and fired == [preemption.SECOND_CTRL_C]
    finally:
        watchdog.stop()

    patient = preemption._Watchdog(60.0, force)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # outside the loop: at once
        wait_until(lambda: patient._timer is not None)
    finally:
        patient.stop()  # the main thread left the run in time
    assert patient._timer.finished.is_set() and fired == [preemption.SECOND_CTRL_C]  # cancelled, never fired


_STUCK_DRIVER = """
import os, runpy, signal, sys, time

phase, args = sys.argv[1], sys.argv[2:]
sys.argv = ["train.py", *args]


def stuck():
    # From here the main thread stays in native code that does not return (SIGINT is blocked in it, so the
    # interpreter cannot run its Python handler there): the second Ctrl-C must end the run anyway.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(600)


from pixelsmith.core import module as core_module

step = core_module.TrainingCore.training_step


def first_ctrl_c_in_iteration_2(self, batch, batch_idx):
    if self.iteration == 1:
        os.kill(os.getpid(), signal.SIGINT)
    return step(self, batch, batch_idx)


core_module.TrainingCore.training_step = first_ctrl_c_in_iteration_2
if phase == "save":
    from pixelsmith.callbacks import checkpoint

    save = checkpoint.IterationCheckpoint._save

    def stuck_in_the_save_of_iteration_2(self, trainer, iteration, periodic):
        if iteration == 2:
            stuck()
        return save(self, trainer, iteration, periodic)

    checkpoint.IterationCheckpoint._save = stuck_in_the_save_of_iteration_2
else:
    from pixelsmith.callbacks import evaluation

    evaluate = evaluation.GANEvaluation._evaluate

    def stuck_in_the_evaluation_of_iteration_2(self, trainer, pl_module):
        if pl_module.iteration == 2:
            stuck()
        return evaluate(self, trainer, pl_module)

    evaluation.GANEvaluation._evaluate = stuck_in_the_evaluation_of_iteration_2
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow  # a subprocess: the full run (`pytest --all`) only
@pytest.mark.parametrize("phase", ["save", "evaluation"])
def test_a_second_ctrl_c_while_the_main_thread_is_stuck_ends_the_run_at_once(tmp_path, phase):
    """The fault is injected where the second Ctrl-C hurt: inside the write of last.ckpt, or inside an evaluation, with
    the main thread in a call that never returns. The watchdog ends the process with status 130 and the paragraph
    (this test would otherwise wait 600 s and time out); the previous last.ckpt is intact."""
    driver = tmp_path / "driver.py"
    driver.write_text(_STUCK_DRIVER)
    run_dir = tmp_path / "run"
    settings = [*FAST, *SMALL["dcgan"], *SHORT[:2], "train.checkpoint_every_n_steps=1", "max_steps=6"]
    if phase == "evaluation":
        settings += [
            "eval.every_n_steps=2",
            "eval.num_samples=40",
            "eval.batch_size=40",
            "eval.reference_samples=100",
            "eval.metrics=[fid]",
            f"eval.cache_dir={tmp_path / 'cache'}",
        ]
    result = run_cli([str(driver), phase, *settings, f"hydra.run.dir={run_dir}"], timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "Stopped at once: a second Ctrl-C" in output, output[-3000:]
    checkpoints = run_dir / "checkpoints"
    assert _iteration(checkpoints / "last.ckpt") == (1 if phase == "save" else 2)
    assert f"{checkpoints / 'last.ckpt'} (iteration" in output and "Go on with:" in output
