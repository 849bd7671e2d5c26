"""The DeepSpeed lane: `pods train` under `accelerate launch` with the shipped `pods accelerate-config zero2|zero3`
files (only the process count and precision overridden), on 2 CPU ranks: DeepSpeed's CPU accelerator over gloo.

Run in its own environment: ``python -m pytest -q --lane deepspeed tests/deepspeed`` (``.ci/lane-deepspeed.sh``
builds it: ``pods-rl[deepspeed]``). What runs for real here: ZeRO's partitioned optimizer state (ZeRO-2) and weights
(ZeRO-3), its checkpoints (``global_step*/`` beside a consolidated ``model.safetensors``), the resume from them,
the time-based clock, SIGTERM, the divergence guard and a rank's death. What only a GPU shows: NCCL, bf16, CPU
offload of optimizer state from GPU memory."""

import json
import os

import pytest

from pods_rl.commands.launch import accelerate_config
from tests import multiproc

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


def test_zero2_time_clock_sigterm_and_exact_resume(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    command = multiproc.pods_train_command(run_dir, tiny_model_dir, "--max_train_seconds", "12",
                                           config_file=accelerate_config("zero2"))
    multiproc.stop_and_resume(command, run_dir, 12, multiproc.launch_env("slow_logs"))
    # ZeRO's own checkpoint layout: each rank's optimizer partition, beside the consolidated weights.
    checkpoint = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    step = checkpoint.name.split("-")[1]
    assert {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= {
        p.name for p in (checkpoint / f"global_step{step}").iterdir()}


def test_zero3_time_clock_then_pods_eval(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    command = multiproc.pods_train_command(run_dir, tiny_model_dir, "--max_train_seconds", "8",
                                           config_file=accelerate_config("zero3"))
    proc = multiproc.start(command, multiproc.launch_env("slow_logs"))
    _, err = multiproc.end(proc, timeout=300)
    assert proc.returncode == 0, err[-4000:]
    multiproc.check_finished(run_dir, 8)
    multiproc.check_pods_eval(run_dir)


def test_zero2_divergence_stops_every_rank_with_the_line(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    command = multiproc.pods_train_command(run_dir, tiny_model_dir, "--max_train_seconds", "60",
                                           "--learning_rate", "1e6", config_file=accelerate_config("zero2"))
    proc = multiproc.start(command, multiproc.launch_env())
    _, err = multiproc.end(proc, timeout=240)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if "training diverged at step" in line]
    assert lines and "--learning_rate" in lines[0], err[-4000:]
    assert not (run_dir / "final").exists()


def test_zero3_a_killed_rank_is_named(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    command = multiproc.pods_train_command(run_dir, tiny_model_dir, "--max_train_seconds", "120",
                                           config_file=accelerate_config("zero3"))
    proc = multiproc.start(command, multiproc.launch_env())
    multiproc.wait_for(run_dir / "checkpoint-*" / "pods_clock.json", proc)
    pid = json.loads((run_dir / ".ranks" / "rank1.json").read_text())["pid"]
    os.kill(pid, 9)
    _, err = multiproc.end(proc, timeout=120)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if f"rank 1 (pid {pid}) was killed by a signal" in line]
    assert len(lines) == 1 and "resume with: " in lines[0], err[-4000:]
