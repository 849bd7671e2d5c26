"""The repository travels (#52): its tracked files stay under 30 MiB, what a user clones and what a GPU call carries
(64 MiB a call, wheels included). A study's raw runs are committed packed (``runs.tar.xz``, ``pods_rl.runlog.packed``).

In a git checkout the tracked files are ``git ls-files``; elsewhere (an sdist, an unpacked archive) every file but
version control, virtual environments, caches and build outputs.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MIB = 30
# Outside git: never part of the source (the .gitignore's folders); hidden folders (.git, .venv*, caches) neither.
NOT_SOURCE = {"__pycache__", "build", "dist", "site", "runs", "node_modules"}


def git_files(root: Path) -> list[str] | None:
    """The tracked files of the git checkout whose top is ``root`` (relative paths), None if it is not one."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=60)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [name for name in listed.stdout.decode().split("\0") if name]


def walked_files(root: Path) -> list[str]:
    """Every file under ``root`` but hidden folders, ``NOT_SOURCE`` folders and ``*.egg-info`` (relative paths)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in NOT_SOURCE and not d.endswith(".egg-info")]
        found += [Path(folder, f).relative_to(root).as_posix() for f in files]
    return found


def file_sizes(root: Path) -> dict[str, int]:
    """{relative path: bytes} of the repository's files: tracked ones in a git checkout (a tracked file deleted
    from the work tree counts 0), else those ``walked_files`` finds."""
    names = git_files(root)
    names = walked_files(root) if names is None else names
    return {name: (root / name).stat().st_size if (root / name).is_file() else 0 for name in names}


def heaviest_folders(sizes: dict[str, int], depth: int = 4, top: int = 5) -> list[tuple[str, int]]:
    """The ``top`` heaviest folders, each file counted in its folder cut to ``depth`` levels: [(folder, bytes)]."""
    weights = Counter()
    for name, size in sizes.items():
        parts = Path(name).parts[:-1][:depth]
        weights["/".join(parts) or "."] += size
    return weights.most_common(top)


def size_problem(sizes: dict[str, int], limit_mib: float = LIMIT_MIB) -> str | None:
    """One line saying the files weigh more than ``limit_mib`` and which folders weigh most; None within it."""
    total = sum(sizes.values())
    if total <= limit_mib * 2**20:
        return None
    folders = ", ".join(f"{folder}/ {size / 2**20:.1f} MiB" for folder, size in heaviest_folders(sizes))
    return (f"the tracked files weigh {total / 2**20:.1f} MiB, over the {limit_mib} MiB a clone and a GPU call "
            f"should carry; heaviest: {folders}; pack a study's runs with `python benchmarks/pack_runs.py pack STUDY "
            "--remove` (see benchmarks/results/cpu-2core-amd-epyc/README.md), or leave big files out")


def test_the_tracked_tree_stays_under_30_mib():
    sizes = file_sizes(ROOT)
    assert sizes, f"no files found under {ROOT}"
    problem = size_problem(sizes)
    assert problem is None, problem


def test_the_size_check_names_the_heaviest_folders():
    sizes = {"benchmarks/results/cpu/a/study/runs/x/metrics.jsonl": 20 * 2**20, "src/pods_rl/x.py": 11 * 2**20,
             "README.md": 1000}
    problem = size_problem(sizes)
    assert problem.startswith("the tracked files weigh 31.0 MiB, over the 30 MiB")
    assert "heaviest: benchmarks/results/cpu/a/ 20.0 MiB, src/pods_rl/ 11.0 MiB, ./ 0.0 MiB" in problem
    assert "\n" not in problem
    assert size_problem({"a": 30 * 2**20}) is None


def test_outside_git_the_walk_leaves_out_environments_and_caches(tmp_path):
    for name, size in {"src/pods_rl/a.py": 10, ".venv/lib/torch.so": 10**6, ".git/objects/x": 10**6,
                       "src/pods_rl/__pycache__/a.pyc": 10**6, "pods_rl.egg-info/SOURCES.txt": 10**6,
                       "benchmarks/results/x/runs.tar.xz": 500}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * size)
    assert git_files(tmp_path) is None  # tmp_path is no checkout's top
    assert file_sizes(tmp_path) == {"src/pods_rl/a.py": 10, "benchmarks/results/x/runs.tar.xz": 500}
