"""Describe the machine a benchmark runs on, and where its results go.

    from _machine import machine_info, results_dir   # benchmarks/ is on sys.path when run as a script
    info = machine_info()          # dict: CPU, cores, RAM, GPU, library versions (no hostname)
    out = results_dir()            # benchmarks/results/<slug>/, e.g. cpu-2core-amd-epyc or gpu-nvidia-h100-80gb-hbm3

Results of different machines go to different folders so that numbers are never compared across machines
by accident.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install
from pods_rl.machine import machine_info  # noqa: E402  (re-exported: the benchmarks import it from here)

RESULTS_ROOT = Path(__file__).resolve().parent / "results"


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
