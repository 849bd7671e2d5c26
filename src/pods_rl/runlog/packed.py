"""A study's runs packed into one archive, ``runs.tar.xz`` beside its study.json: written, checked, read, unpacked.

Its thousands of small run files pack to about a twelfth; weights and figures are left out.

    pack_runs(study, remove=False)  # study/runs.tar.xz from study/{study,sweep,runs}/, checked against the files
    unpack_runs(study)              # back into study/ (refused over other run files)
    with runs_root(study) as root:  # study itself, or a temporary unpacking of its archive
        ...

Deterministic (sorted, time stamps 0, owner 0/0): the same files give the same bytes. Standard library only, so
``benchmarks/pack_runs.py`` can load this file without pods-rl installed."""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

ARCHIVE = "runs.tar.xz"
# The folders of a study that hold its runs: `pods study`'s study/runs and sweep/runs, older scripts' runs/.
RUN_FOLDERS = ("study", "sweep", "runs")
# Never packed: model weights and scratch (the .gitignore of benchmarks/results says the same), and figures drawn
# from the runs' data. The names are those of pods_rl.runlog (store.SET_ASIDE_DIR, lock.LOCK_FILE);
# tests/test_packed_runs.py checks they agree.
LEFT_OUT_DIRS = ("final", "completions", "_incomplete", "_set_aside", "__pycache__")
LEFT_OUT_PREFIXES = ("checkpoint-",)
LEFT_OUT_FILES = (".pods-train.lock",)
LEFT_OUT_SUFFIXES = (".png", ".pdf")
PRESET = 9 | lzma.PRESET_EXTREME


def run_folders(study_dir: str | os.PathLike) -> list[Path]:
    """The run folders present in ``study_dir`` (of ``RUN_FOLDERS``), in that order."""
    return [Path(study_dir) / name for name in RUN_FOLDERS if (Path(study_dir) / name).is_dir()]


def _left_out(relative: PurePosixPath) -> bool:
    """Whether a path (relative to the study) is weights, scratch or a figure, which an archive never holds."""
    return (any(part in LEFT_OUT_DIRS or part.startswith(LEFT_OUT_PREFIXES) for part in relative.parts[:-1])
            or relative.name in LEFT_OUT_FILES or relative.suffix in LEFT_OUT_SUFFIXES)


def files_to_pack(study_dir: str | os.PathLike) -> tuple[list[str], list[str]]:
    """(files held, files left out) of ``study_dir``'s run folders; ValueError on a link or special file."""
    study_dir = Path(study_dir)
    kept, left = [], []
    for folder in run_folders(study_dir):
        for path in sorted(folder.rglob("*")):
            relative = PurePosixPath(path.relative_to(study_dir).as_posix())
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise ValueError(f"{path} is a link or a special file: an archive of runs holds regular files "
                                 "only; replace it by the file itself or remove it")
            if path.is_file():
                (left if _left_out(relative) else kept).append(str(relative))
    return sorted(kept), sorted(left)


def _member(name: str, size: int, executable: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o755 if executable else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_runs(study_dir: str | os.PathLike, remove: bool = False) -> Path:
    """Write ``study_dir/runs.tar.xz`` from its run folders, check it, return its path; ``remove``: then delete
    the packed files. ValueError on nothing to pack or a link; RuntimeError if it does not read back."""
    study_dir = Path(study_dir)
    names, _ = files_to_pack(study_dir)
    if not names:
        raise ValueError(f"{study_dir} holds no run folder ({', '.join(f'{n}/' for n in RUN_FOLDERS)}) with files "
                         "to pack; name a study's folder")
    digests = {}
    target = study_dir / ARCHIVE
    partial = target.with_name(target.name + ".partial")
    with lzma.open(partial, "wb", preset=PRESET) as xz, tarfile.open(fileobj=xz, mode="w",
                                                                     format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            data = (study_dir / name).read_bytes()
            digests[name] = hashlib.sha256(data).hexdigest()
            tar.addfile(_member(name, len(data), os.access(study_dir / name, os.X_OK)), io.BytesIO(data))
    read_back = archive_digests(partial)
    if read_back != digests:
        partial.unlink()
        raise RuntimeError(f"{target}: the archive written does not read back as the files it packed; nothing "
                           "was changed")
    partial.replace(target)
    if remove:
        for name in names:
            (study_dir / name).unlink()
        for folder in run_folders(study_dir):
            for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
            if not any(folder.iterdir()):
                folder.rmdir()
    return target


def archive_digests(archive: str | os.PathLike) -> dict[str, str]:
    """{member path: sha256 of its bytes} of an archive of runs (regular files only, checked as ``unpack_runs``)."""
    digests = {}
    with tarfile.open(archive, "r:xz") as tar:
        for info in tar:
            _check_member(info, archive)
            if info.isfile():
                digests[info.name] = hashlib.sha256(tar.extractfile(info).read()).hexdigest()
    return digests


def _check_member(info: tarfile.TarInfo, archive) -> None:
    """Refuse what an archive of runs never holds: links, devices, absolute paths, paths leaving the folder."""
    path = PurePosixPath(info.name)
    if not (info.isfile() or info.isdir()) or path.is_absolute() or ".." in path.parts or not path.parts \
            or path.parts[0] not in RUN_FOLDERS:
        raise ValueError(f"{archive}: member {info.name!r} is not a file under {'/, '.join(RUN_FOLDERS)}/; this "
                         "is not an archive of runs written by pods-rl (unpack it by hand if you trust it)")


def holds_runs(study_dir: str | os.PathLike) -> bool:
    """Whether ``study_dir``'s run folders hold a file an archive would hold (not only weights or scratch)."""
    return bool(files_to_pack(study_dir)[0])


def unpack_runs(study_dir: str | os.PathLike, dest: str | os.PathLike | None = None) -> Path:
    """Unpack ``study_dir/runs.tar.xz`` into ``dest`` (default ``study_dir``); return ``dest``. Refuses
    (ValueError, before writing) when ``dest``'s run folders already hold run files."""
    study_dir = Path(study_dir)
    archive = study_dir / ARCHIVE
    dest = Path(study_dir if dest is None else dest)
    if not archive.is_file():
        raise ValueError(f"{archive} does not exist: {study_dir} holds no packed runs")
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        for info in members:
            _check_member(info, archive)
        holding = {PurePosixPath(name).parts[0] for name in files_to_pack(dest)[0]}
        clash = sorted({PurePosixPath(m.name).parts[0] for m in members} & holding)
        if clash:
            raise ValueError(f"{dest} already holds {', '.join(f'{c}/' for c in clash)}: unpacking {archive} there "
                             "would mix two versions of the runs; move them away, or unpack elsewhere")
        dest.mkdir(parents=True, exist_ok=True)
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: the safe filter (members checked above)
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)
    return dest


@contextmanager
def runs_root(study_dir: str | os.PathLike) -> Iterator[Path]:
    """The folder holding a study's run folders, for reading: ``study_dir`` when its folders hold run files
    or there is no archive, else a temporary unpacking of ``runs.tar.xz``, removed on exit."""
    study_dir = Path(study_dir)
    if holds_runs(study_dir) or not (study_dir / ARCHIVE).is_file():
        yield study_dir
        return
    scratch = Path(tempfile.mkdtemp(prefix="pods-runs-"))
    try:
        yield unpack_runs(study_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_archive(study_dir: str | os.PathLike) -> str:
    """Unpack and pack ``study_dir/runs.tar.xz`` again: the bytes must match. A one-line summary, or ValueError."""
    archive = Path(study_dir) / ARCHIVE
    with tempfile.TemporaryDirectory(prefix="pods-runs-check-") as scratch:
        unpack_runs(study_dir, scratch)
        again = pack_runs(scratch)
        if again.read_bytes() != archive.read_bytes():
            raise ValueError(f"{archive}: packing its own files again gives other bytes ({again.stat().st_size} "
                             f"against {archive.stat().st_size}); pack the study again with `pack`")
        files = len(archive_digests(archive))
    return f"{archive}: {files} files, {archive.stat().st_size / 2**20:.2f} MiB, packs again to the same bytes"


def main(argv: list[str] | None = None) -> int:
    """``python -m pods_rl.runlog.packed {pack,unpack,check} STUDY...`` (or ``python benchmarks/pack_runs.py``)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="pack_runs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("pack", help=f"write STUDY/{ARCHIVE} from STUDY/{{{','.join(RUN_FOLDERS)}}}/")
    pack.add_argument("studies", nargs="+", type=Path, metavar="STUDY")
    pack.add_argument("--remove", action="store_true", help="then delete the packed files (weights, figures stay)")
    unpack = commands.add_parser("unpack", help=f"unpack STUDY/{ARCHIVE} into STUDY (or --to DIR)")
    unpack.add_argument("studies", nargs="+", type=Path, metavar="STUDY")
    unpack.add_argument("--to", type=Path, default=None, help="unpack here instead (one STUDY)")
    check = commands.add_parser("check", help="unpacking and packing again gives the archive's bytes")
    check.add_argument("studies", nargs="+", type=Path, metavar="STUDY")
    args = parser.parse_args(argv)
    try:
        if args.command == "unpack" and args.to is not None and len(args.studies) > 1:
            raise ValueError("--to takes one STUDY: each study's runs unpack into a folder of their own")
        for study in args.studies:
            if args.command == "pack":
                kept, left = files_to_pack(study)
                path = pack_runs(study, remove=args.remove)
                print(f"{path}: {len(kept)} files, {path.stat().st_size / 2**20:.2f} MiB"
                      + (f"; left out (weights, scratch, figures): {len(left)} files, still there" if left else "")
                      + ("; the packed files removed" if args.remove else ""))
            elif args.command == "unpack":
                print(f"{study / ARCHIVE} -> {unpack_runs(study, args.to)}")
            else:
                print(check_archive(study))
    except (ValueError, RuntimeError, OSError, tarfile.TarError, lzma.LZMAError) as e:
        print(f"pack_runs: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
