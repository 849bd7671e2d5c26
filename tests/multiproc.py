"""Launching `pods train` as GPU users do, on CPU: ``accelerate launch`` of 2 ranks over gloo, through
tests/scripts/pods_rank_fault.py (`pods` with a task that can misbehave on one rank, and ``PODS_FAULT`` faults)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "pods_rank_fault.py"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def free_port() -> int:
    """A TCP port nothing listens on now (the rendezvous of one launch)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(*pods_args, num_processes: int = 2, config_file=None) -> list[str]:
    """``accelerate launch`` of ``pods <pods_args>`` on ``num_processes`` CPU ranks; ``config_file`` (a shipped
    ``pods accelerate-config`` file) as users pass it, only the process count and precision overridden."""
    # `--multi_gpu` selects accelerate's torchrun launcher; with no GPU, torch.distributed falls back to gloo
    # (`--cpu` would pick the single-process launcher).
    engine = ["--config_file", str(config_file)] if config_file else ["--multi_gpu", "--num_machines", "1",
                                                                       "--dynamo_backend", "no"]
    return [sys.executable, "-m", "accelerate.commands.launch", *engine, "--num_processes", str(num_processes),
            "--mixed_precision", "no", "--main_process_port", str(free_port()), str(SCRIPT), *pods_args]


def launch_env(fault: str = "none", **extra) -> dict:
    """The environment of a launch: one thread per rank, our source tree first, ``PODS_FAULT`` and ``extra``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PODS_FAULT": fault,
            "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def start(command: list[str], env: dict) -> subprocess.Popen:
    """Start a launch in a session of its own (``end`` can then reach the launcher and every rank)."""
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def end(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Wait for a launch (``timeout`` seconds at most), then SIGKILL whatever of it is left; (stdout, stderr)."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the launcher and every rank
            proc.communicate()


def signal_job(proc: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to every process of a launch, as a scheduler (SLURM, Kubernetes) ends a job."""
    os.killpg(proc.pid, signum)


# The recipes' time-based clock, small: evaluate every 3 s, save every 2 s of training time.
CLOCK = ["--eval_every_seconds", "3", "--save_every_seconds", "2"]


def pods_train_command(run_dir, model_dir, *extra, config_file=None) -> list[str]:
    """`pods train` (cpu/smoke on ``model_dir``, the time-based clock, no step limit) under ``launch_command``."""
    return launch_command(
        "train", "--config", "cpu/smoke", "--model_name_or_path", str(model_dir), "--output_dir", str(run_dir),
        "--max_steps", "100000", "--train_limit", "4096", "--eval_num_problems", "16", *CLOCK, *extra,
        config_file=config_file)


def metrics_rows(run_dir) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    text = (Path(run_dir) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def check_finished(run_dir, budget: float) -> dict:
    """Assert that the run ended by its time budget, once, with final/ (one model that loads), intact checkpoints
    and its evaluations (before, timed, after; each logged once); returns summary.json."""
    from transformers import AutoModelForCausalLM

    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train_seconds"] >= budget and "stopped_by" not in summary, summary
    AutoModelForCausalLM.from_pretrained(run_dir / "final")  # one model, loadable
    final_clock = json.loads((run_dir / "final" / "pods_clock.json").read_text())
    assert final_clock["step"] == summary["steps"]
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(checkpoints) >= 2, checkpoints
    for checkpoint in checkpoints:  # every one complete: its clock written last, its weights there
        assert (checkpoint / "pods_clock.json").is_file() and (checkpoint / "model.safetensors").is_file(), checkpoint
    evals = [r for r in metrics_rows(run_dir) if "eval/accuracy" in r]
    steps = [r["step"] for r in evals]
    # Before the first step, at least one timed evaluation between, and after the last step; each logged once.
    assert steps[-1] == summary["steps"] and len(steps) >= 3 and steps == sorted(set(steps)), steps
    assert summary["accuracy_after"] == evals[-1]["eval/accuracy"]
    return summary


def stop_and_resume(command: list[str], run_dir, budget: float, env: dict) -> dict:
    """Run ``command`` (a launch of `pods train` with ``--max_train_seconds budget``), SIGTERM every process of it
    once its first checkpoint is complete, check that every rank stopped at one step with a complete checkpoint
    there, then resume it with the same command and check that it runs to the end of its budget; returns the
    resumed run's summary.json."""
    run_dir = Path(run_dir)
    proc = start(command, env)
    wait_for(run_dir / "checkpoint-*" / "pods_clock.json", proc)
    signal_job(proc, signal.SIGTERM)  # as a scheduler does: every process of the job
    _, err = end(proc, timeout=120)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["train_seconds"] < budget, (summary, err[-3000:])
    stopped_at = summary["steps"]
    assert json.loads((run_dir / f"checkpoint-{stopped_at}" / "pods_clock.json").read_text())["step"] == stopped_at
    assert not (run_dir / "final").exists()

    command = list(command)
    command[command.index("--main_process_port") + 1] = str(free_port())
    resumed = subprocess.run([*command, "--resume_from_checkpoint", "true"], capture_output=True, text=True, env=env,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = check_finished(run_dir, budget)
    assert summary["steps"] > stopped_at
    # Exact: the resume went on from the stop's step with its state; no step was trained (and logged) twice.
    steps = [r["step"] for r in metrics_rows(run_dir) if "loss" in r]
    assert stopped_at in steps and steps == sorted(set(steps)), steps
    return summary


def check_pods_eval(run_dir) -> list[dict]:
    """Run `pods eval` on a finished run (in this process, as a user would after the launch) and assert that it
    evaluated every checkpoint and final/ (once per step); returns the records of eval.json."""
    from pods_rl.commands.cli import main as pods

    run_dir = Path(run_dir)
    assert pods(["eval", str(run_dir), "--task", "arithmetic", "--limit", "8", "--k", "2", "--max-new-tokens",
                 "16"]) == 0
    records = json.loads((run_dir / "eval.json").read_text())
    evaluated = {Path(str(r["checkpoint"])).name for r in records if isinstance(r, dict) and "accuracy" in r}
    expected = {p.name for p in run_dir.glob("checkpoint-*")}
    final_step = json.loads((run_dir / "final" / "pods_clock.json").read_text())["step"]
    if f"checkpoint-{final_step}" not in expected:  # (final/ of the last checkpoint's step is evaluated as that one)
        expected.add("final")
    assert expected <= evaluated, (expected, evaluated)
    return records


def wait_for(pattern, proc: subprocess.Popen, seconds: float = 240) -> Path:
    """Wait until a file matching ``pattern`` (a path, possibly with glob characters) exists, while ``proc`` runs."""
    pattern = Path(pattern)
    deadline = time.monotonic() + seconds
    while True:
        found = sorted(pattern.parent.parent.glob(f"{pattern.parent.name}/{pattern.name}"))
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{pattern} never appeared"
        time.sleep(0.2)
