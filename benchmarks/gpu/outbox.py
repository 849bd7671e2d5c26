"""What a device call brings back, and where it goes here.

On the machine, ``Outbox`` writes each result into ``$OUT`` as soon as it exists, whole (a temporary name, then a
rename), so that a call killed at any moment still brings back the last complete version of every file. The device
brings back at most 8 files, each at most 16 MiB, no deeper than 2 folders: so a study's folder travels as one
archive (``study-<model>.tgz``: its small files and its finished runs; never weights or checkpoints), re-packed
whenever a run finishes.

Here, ``keep`` files what came back under ``benchmarks/results/<machine>/``: a study archive is merged with the one
already there (the union of their finished runs: a call that started from an older archive loses nothing), a JSON
that would replace a different one moves the old one to ``previous/`` first, logs go to ``logs/`` under the time
they came back. The next call carries that folder, so the study skips its finished runs.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

SMALL_SUFFIXES = (".json", ".jsonl", ".txt", ".png", ".yaml", ".md", ".log", ".csv")
SMALL_BYTES = 4 * 2**20  # a result file larger than this is not a result (a weight file renamed, a runaway log)
SKIP_PARTS = ("checkpoint-", "final", "_incomplete", "completions")


class Outbox:
    """Files in ``out`` (``$OUT``), each replaced whole: a reader (or a kill) never sees half a file."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()

    def _replace(self, name: str, write: Callable[[Path], None]) -> Path:
        path = self.out / name
        tmp = self.out / f".{name}.tmp"
        with self.lock:
            write(tmp)
            os.replace(tmp, path)
        return path

    def write_json(self, name: str, data: dict) -> Path:
        """``data`` as ``OUT/name`` (indented JSON)."""
        return self._replace(name, lambda p: p.write_text(json.dumps(data, indent=1, default=str) + "\n"))

    def pack(self, name: str, root: Path, files: Iterable[Path]) -> Path:
        """``files`` (under ``root``, archived relative to it) as the gzip tar ``OUT/name``."""
        files = sorted(set(files))

        def write(path: Path) -> None:
            with tarfile.open(path, "w:gz") as tar:
                for file in files:
                    tar.add(file, arcname=str(file.relative_to(root)))

        return self._replace(name, write)


def is_small_result(path: Path, root: Path) -> bool:
    """A result worth bringing back: a small text, JSON or figure file, not inside a checkpoint or final model."""
    parts = path.relative_to(root).parts
    return (path.is_file() and path.suffix in SMALL_SUFFIXES and path.stat().st_size <= SMALL_BYTES
            and not any(part.startswith(SKIP_PARTS) for part in parts[:-1]))


def small_files(root: Path) -> list[Path]:
    """Every small result file under ``root`` (see ``is_small_result``)."""
    root = Path(root)
    return [p for p in sorted(root.rglob("*")) if is_small_result(p, root)] if root.is_dir() else []


def study_files(study_dir: Path) -> list[Path]:
    """What of a `pods study` folder travels: its small files, but of its runs only the finished ones (summary.json
    and study_run.json written: the study skips them) with their logs; an unfinished run restarts elsewhere."""
    study_dir = Path(study_dir)
    runs = study_dir / "study" / "runs"
    keep = []
    for path in small_files(study_dir):
        rel = path.relative_to(runs).parts if path.is_relative_to(runs) else None
        if rel is None:
            keep.append(path)
            continue
        name = rel[0][:-len(".log")] if len(rel) == 1 and rel[0].endswith(".log") else rel[0]
        if (runs / name / "study_run.json").is_file():
            keep.append(path)
    return keep


def finished_runs(study_dir: Path) -> list[str]:
    """The names of a study folder's finished runs."""
    runs = Path(study_dir) / "study" / "runs"
    return sorted(p.parent.name for p in runs.glob("*/study_run.json")) if runs.is_dir() else []


def archived_runs(archive: Path) -> list[str]:
    """The names of the finished runs a study archive (``study-<key>.tgz``) holds."""
    with tarfile.open(archive) as tar:
        return sorted({Path(m.name).parts[2] for m in _safe_members(tar)
                       if m.name.startswith("study/runs/") and m.name.endswith("/study_run.json")})


class Repacker:
    """Calls ``pack()`` every ``every`` seconds while ``signature()`` changes (e.g. the finished runs), and once
    more at ``stop()``: the archive in ``$OUT`` follows the study as it runs."""

    def __init__(self, pack: Callable[[], object], signature: Callable[[], object], every: float = 15.0):
        self.pack, self.signature, self.every = pack, signature, every
        self.done = threading.Event()
        self.last = signature()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Repacker:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.done.wait(self.every):
            now = self.signature()
            if now != self.last:
                self.last = now
                self.pack()

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self.pack()


def _safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Regular files with relative paths that stay inside the destination (no links, no '..')."""
    return [m for m in tar.getmembers() if m.isfile() and not Path(m.name).is_absolute()
            and ".." not in Path(m.name).parts]


def unpack_missing(archive: Path, dest: Path) -> int:
    """Extract from ``archive`` the files ``dest`` does not have yet (a warm machine's own newer files stay);
    returns how many were extracted."""
    count = 0
    with tarfile.open(archive) as tar:
        for member in _safe_members(tar):
            target = Path(dest) / member.name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                count += 1
    return count


def merge_archives(old: Path, new: Path, dest: Path) -> dict:
    """``dest`` = ``new``'s files, plus ``old``'s files that ``new`` lacks except those of runs that ``new`` holds
    finished (a run's files come from one archive); returns {"runs": the finished runs in dest, "added_from_old":
    those only ``old`` had}."""
    files: dict[str, bytes] = {}
    for archive in (old, new):  # new's copy of a file wins
        with tarfile.open(archive) as tar:
            for member in _safe_members(tar):
                files[member.name] = tar.extractfile(member).read()
    with tarfile.open(new) as tar:
        new_names = {m.name for m in _safe_members(tar)}
    runs_new = {Path(n).parts[2] for n in new_names if n.startswith("study/runs/") and n.endswith("/study_run.json")}
    kept = {}
    for name, data in files.items():  # an old file of a run that new holds finished is new's business
        parts = Path(name).parts
        in_runs = len(parts) >= 3 and parts[:2] == ("study", "runs")
        if name in new_names or not in_runs or parts[2].removesuffix(".log") not in runs_new:
            kept[name] = data
    tmp = Path(dest).with_name(f".{Path(dest).name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in sorted(kept):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(kept[name]), int(time.time())
            tar.addfile(info, io.BytesIO(kept[name]))
    os.replace(tmp, dest)
    runs = sorted({Path(n).parts[2] for n in kept if n.startswith("study/runs/") and n.endswith("/study_run.json")})
    return {"runs": runs, "added_from_old": sorted(set(runs) - runs_new)}


def keep(src: Path, results_root: Path, stamp: str | None = None) -> list[str]:
    """File a call's returned files (``src``: the device's files_at) under ``results_root/<machine>/``; returns one
    line per file saying where it went. The machine's folder name comes from the call's JSON (``results_dir``)."""
    src, stamp = Path(src), stamp or time.strftime("%Y%m%d-%H%M%S")
    records = [json.loads(p.read_text()) for p in sorted(src.glob("*.json"))]
    slug = next((r["results_dir"] for r in records if isinstance(r, dict) and r.get("results_dir")), None)
    if slug is None:
        raise ValueError(f"{src} holds no call record (answer.json or study-call.json with results_dir): is it a "
                         "device call's files_at?")
    dest = Path(results_root) / slug
    dest.mkdir(parents=True, exist_ok=True)
    lines = []
    for path in sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith(".")):
        target = dest / path.name
        if path.suffix == ".log":
            target = dest / "logs" / f"{stamp}-{path.name}"
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(path, target)
        elif path.name.startswith("study-") and path.name.endswith(".tgz") and target.exists():
            merged = merge_archives(target, path, target)
            lines.append(f"{target}: merged, {len(merged['runs'])} finished runs"
                         + (f" ({len(merged['added_from_old'])} kept from the archive there)"
                            if merged["added_from_old"] else ""))
            continue
        else:
            if target.exists() and target.read_bytes() != path.read_bytes():
                aside = dest / "previous" / f"{stamp}-{path.name}"
                aside.parent.mkdir(exist_ok=True)
                shutil.move(str(target), aside)
                lines.append(f"{target}: the one there moved to {aside}")
            shutil.copyfile(path, target)
        lines.append(f"{path.name} -> {target}")
    return lines
