"""What one device call carries to the GPU machine, summed before the call (``h100.py preflight``).

The device sends the working tree of the checkout: its tracked files and the untracked files git does not ignore,
plus a ``shared/`` folder inside it, plus the ignored paths a call names in ``carry`` (here ``.whl``, the wheels);
64 MiB in all, or the call is refused. ``preflight`` sums the same, in the tree it runs in, and fails above
``CARRY_LIMIT_MIB`` (60: room for the device's own rounding), naming the largest folders to shrink.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

MIB = 2**20


def tree_files(repo: Path) -> list[Path]:
    """The files of ``repo``'s working tree that travel: tracked (still present) and untracked-not-ignored, with
    ``shared/`` inside it if there is one."""
    repo = Path(repo)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            check=True, capture_output=True).stdout.decode().split("\0")
    files = {repo / name for name in listed if name}
    shared = repo / "shared"
    if shared.is_dir():
        files |= {p for p in shared.rglob("*") if p.is_file() or p.is_symlink()}
    return sorted(p for p in files if p.is_file() or p.is_symlink())


def path_files(repo: Path, carry: list[str]) -> dict[str, list[Path]]:
    """{carried path: its files} for each path of ``carry`` (relative to ``repo``; a missing one has none)."""
    out = {}
    for name in carry:
        path = Path(repo) / name
        out[name] = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) \
            if path.is_dir() else []
    return out


def size(path: Path) -> int:
    """Bytes a file takes in the transfer (a symbolic link travels as a link)."""
    return path.lstat().st_size


def preflight(repo: Path, carry: list[str], limit_mib: float) -> tuple[bool, str]:
    """(fits, one line): the tree plus ``carry`` against ``limit_mib``; over the limit, the line names the largest
    top-level folders of the tree (two levels under benchmarks/ and src/) and the carried paths' sizes."""
    repo = Path(repo).resolve()
    tree = tree_files(repo)
    carried = path_files(repo, carry)
    tree_bytes = sum(size(p) for p in tree)
    carry_bytes = {name: sum(size(p) for p in files) for name, files in carried.items()}
    total = tree_bytes + sum(carry_bytes.values())
    parts = ", ".join(f"{name} {b / MIB:.1f} MiB" for name, b in carry_bytes.items())
    line = f"a call carries {total / MIB:.1f} MiB: the tree {tree_bytes / MIB:.1f} MiB ({len(tree)} files)"
    line += f", {parts}" if parts else ""
    if total <= limit_mib * MIB:
        return True, f"preflight: {line}, within {limit_mib:g} MiB"
    by_folder: Counter = Counter()
    for path in tree:
        rel = path.relative_to(repo).parts
        depth = 2 if rel[0] in ("benchmarks", "src", "docs") and len(rel) > 2 else 1
        by_folder["/".join(rel[:depth])] += size(path)
    largest = ", ".join(f"{name} {b / MIB:.1f} MiB" for name, b in by_folder.most_common(3))
    return False, (f"preflight: {line}, over the {limit_mib:g} MiB limit (the device refuses above 64): shrink the "
                   f"tree (largest: {largest}) or carry less")
