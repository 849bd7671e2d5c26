"""The machine and software a measurement ran on: CPU, cores, RAM, GPU, library versions (no host or user names).

Used by ``pods cost`` and the benchmarks (``benchmarks/_machine.py`` re-exports ``machine_info``), so that every timing
is stored with what produced it."""

from __future__ import annotations

import os
import platform
from importlib import metadata


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


def pods_rl_version() -> str:
    """pods-rl's version from its installed metadata (pyproject.toml's, pip install -e included), read at each call;
    ``"0+unknown"`` for a source tree on ``sys.path`` that was never installed (``PYTHONPATH=src``, a git archive).

    The one place that reads it: ``pods_rl.__version__`` and the model card both come from here."""
    return _version("pods-rl") or "0+unknown"


def machine_info() -> dict:
    """The machine and software a benchmark ran on (no hostname or user names).

    Keys: cpu_model, logical_cores, usable_cores (this process's CPU affinity), torch_threads, ram_gib, gpu (name or
    None), gpu_count, platform, python, torch, transformers, trl."""
    info: dict = {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": _ram_gib(),
        "gpu": None,
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
        if torch.cuda.is_available():
            info["gpu"], info["gpu_count"] = torch.cuda.get_device_name(0), torch.cuda.device_count()
    except Exception:  # no torch, or a broken driver: that must not stop a CPU benchmark
        info.setdefault("torch_threads", None)
    return info
