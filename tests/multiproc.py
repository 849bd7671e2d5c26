"""Launching `pods train` as GPU users do, on CPU: ``accelerate launch`` of 2 ranks over gloo, through
tests/scripts/pods_rank_fault.py (`pods` with a task that can misbehave on one rank, and ``PODS_FAULT`` faults)."""

import os
import signal
import socket
import subprocess
import sys
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
