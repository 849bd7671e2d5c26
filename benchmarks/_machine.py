"""Describe the machine a benchmark runs on, and where its results go.

    from _machine import machine_info, results_dir   # benchmarks/ is on sys.path when run as a script
    info = machine_info()          # dict: CPU, cores, RAM, GPU, library versions (no hostname)
    out = results_dir()            # benchmarks/results/<slug>/, e.g. cpu-2core-amd-epyc or gpu-nvidia-h100-80gb-hbm3

Results of different machines go to different folders so that numbers are never compared across machines
by accident.
"""

from __future__ import annotations

import os
import platform
import re
from importlib import metadata
from pathlib import Path

RESULTS_ROOT = Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else platform.processor(), else 'unknown-cpu'."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown-cpu"


def _ram_gib() -> float | None:
    """Total RAM in GiB from /proc/meminfo, or None where that is unavailable."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _gpu_name() -> str | None:
    """Name of CUDA device 0 via torch, or None without torch or CUDA."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken driver must not stop a CPU benchmark
        return None


def machine_info() -> dict:
    """The machine and software a benchmark ran on (no hostname or user names).

    Keys: cpu_model, logical_cores, usable_cores (this process's CPU affinity), torch_threads, ram_gib,
    gpu (name or None), gpu_count, platform, python, torch, transformers, trl.
    """
    info: dict = {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": _ram_gib(),
        "gpu": _gpu_name(),
        "gpu_count": 0,
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "trl": _version("trl"),
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["gpu_count"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        info["torch_threads"] = None
    return info


def _slugify(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\bprocessor\b", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def machine_slug(info: dict | None = None) -> str:
    """Short folder name for a machine: 'gpu-<gpu name>' with a GPU, else 'cpu-<cores>core-<cpu model>'."""
    info = info or machine_info()
    if info.get("gpu"):
        return "gpu-" + _slugify(info["gpu"])
    return f"cpu-{info.get('usable_cores') or info.get('logical_cores')}core-{_slugify(info['cpu_model'])}"


def results_dir(machine: str | None = None) -> Path:
    """benchmarks/results/<machine>/ (default: this machine's slug), created if missing."""
    path = RESULTS_ROOT / (machine or machine_slug())
    path.mkdir(parents=True, exist_ok=True)
    return path


if __name__ == "__main__":
    import json

    print(json.dumps(machine_info(), indent=2))
    print(results_dir())


def add_threads_argument(parser) -> None:
    """The ``--threads`` option every benchmark shares."""
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice). On a CPU shared with other jobs, 1 "
                        "avoids timing OpenMP threads that wait for a busy core instead of the work itself")


def device_or_none(name: str):
    """``torch.device(name)``, or None after printing an error when CUDA is asked for but absent."""
    import sys

    import torch

    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return None
    return device
