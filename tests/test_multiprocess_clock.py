"""`pods train` under `accelerate launch` with 2 CPU ranks (gloo) and the recipes' time-based clock, as GPU users
launch it: every time-based decision (evaluate, save, stop at the time budget, the last evaluation) is taken by
both ranks at the same step, so the job ends by itself, once, with everything saved; SIGTERM stops it with a
complete checkpoint and the resume runs it to the end of its time budget.

The ranks' own clocks drift apart for real: rank 0 writes the logs and checkpoints while rank 1 already waits in
the next step's first collective. ``PODS_FAULT=slow_logs`` makes that drift large (rank 0 takes 0.3 s more per
metrics row), so that a rank deciding on its own clock evaluates, saves or stops at another step than its peer:
gloo then aborts on mismatched collectives, or a rank waits in one its peer never joins."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import multiproc

CLOCK = ["--eval_every_seconds", "3", "--save_every_seconds", "2"]


def _pods_train(run_dir, model_dir, *extra):
    return multiproc.launch_command(
        "train", "--config", "cpu/smoke", "--model_name_or_path", str(model_dir), "--output_dir", str(run_dir),
        "--max_steps", "100000", "--train_limit", "4096", "--eval_num_problems", "16", *CLOCK, *extra)


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _check_finished(run_dir, budget: float) -> dict:
    """The run ended by its time budget, once, with final/, intact checkpoints and its evaluations."""
    from transformers import AutoModelForCausalLM

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train_seconds"] >= budget and "stopped_by" not in summary, summary
    AutoModelForCausalLM.from_pretrained(run_dir / "final")  # one model, loadable
    final_clock = json.loads((run_dir / "final" / "pods_clock.json").read_text())
    assert final_clock["step"] == summary["steps"]
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(checkpoints) >= 2, checkpoints
    for checkpoint in checkpoints:  # every one complete: its clock written last, its weights there
        assert (checkpoint / "pods_clock.json").is_file() and (checkpoint / "model.safetensors").is_file(), checkpoint
    evals = [r for r in _rows(run_dir) if "eval/accuracy" in r]
    steps = [r["step"] for r in evals]
    # Before the first step, at least one timed evaluation between, and after the last step; each logged once.
    assert steps[-1] == summary["steps"] and len(steps) >= 3 and steps == sorted(set(steps)), steps
    assert summary["accuracy_after"] == evals[-1]["eval/accuracy"]
    return summary


@pytest.mark.slow
def test_the_time_clock_is_one_clock_for_all_ranks(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = multiproc.start(_pods_train(run_dir, tiny_model_dir, "--max_train_seconds", "10"),
                           multiproc.launch_env("slow_logs"))
    out, err = multiproc.end(proc, timeout=300)
    assert proc.returncode == 0, err[-4000:]
    _check_finished(run_dir, 10)
    assert out.count("run directory:") == 1  # the end is reported once (rank 0), not once per rank


@pytest.mark.slow
def test_sigterm_stops_every_rank_with_a_checkpoint_and_the_resume_runs_to_the_budget(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    command = _pods_train(run_dir, tiny_model_dir, "--max_train_seconds", "14")
    proc = multiproc.start(command, multiproc.launch_env("slow_logs"))
    deadline = time.monotonic() + 240
    while not list(run_dir.glob("checkpoint-*/pods_clock.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    multiproc.signal_job(proc, signal.SIGTERM)  # as a scheduler does: every process of the job
    out, err = multiproc.end(proc, timeout=120)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["train_seconds"] < 14, (summary, err[-3000:])
    stopped_at = summary["steps"]
    assert json.loads((run_dir / f"checkpoint-{stopped_at}" / "pods_clock.json").read_text())["step"] == stopped_at
    assert not (run_dir / "final").exists()

    command[command.index("--main_process_port") + 1] = str(multiproc.free_port())
    resumed = subprocess.run([*command, "--resume_from_checkpoint", "true"], capture_output=True, text=True,
                             env=multiproc.launch_env("slow_logs"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = _check_finished(run_dir, 14)
    assert summary["steps"] > stopped_at
