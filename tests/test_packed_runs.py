"""A study's runs packed into one archive (#52, ``pods_rl.runlog.packed``): packed whole and deterministically,
unpacked without loss or surprise, and read by `pods study`'s report as if unpacked: a committed study's report,
computed again from its archive alone, is the committed one."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pods_rl.runlog import packed

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc"


def make_study(root: Path) -> dict[str, bytes]:
    """A small study folder: two runs with logs, a sweep run, weights, scratch, figures; {packed path: bytes}."""
    files = {"study/runs/grpo-n8-s0/metrics.jsonl": b'{"step": 1}\n' * 50, "study/runs/grpo-n8-s0/summary.json": b"{}",
             "study/runs/grpo-n8-s0.log": b"training\n", "study/runs/pods-mv-n32m8-s0/summary.json": b'{"steps": 3}',
             "sweep/runs/grpo-n8-lr0.0001-s0/config.yaml": b"learning_rate: 0.0001\n"}
    left_out = ["study/runs/grpo-n8-s0/checkpoint-3/model.safetensors", "study/runs/grpo-n8-s0/final/model.safetensors",
                "study/runs/grpo-n8-s0/.pods-train.lock", "study/runs/grpo-n8-s0/_set_aside/checkpoint-2/x.bin",
                "study/runs/grpo-n8-s0/accuracy_vs_time.png", "study/runs/grpo-n8-s0/accuracy_vs_time.pdf"]
    for name, data in {**files, **dict.fromkeys(left_out, b"weights")}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "study.json").write_text("{}")  # beside the run folders: not theirs, never packed
    return files


def test_pack_holds_every_run_file_but_weights_and_figures_and_unpacks_them_unchanged(tmp_path):
    study = tmp_path / "st"
    files = make_study(study)
    archive = packed.pack_runs(study)
    assert archive == study / "runs.tar.xz"
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(files)  # sorted, files only, no weights or figures, nothing else
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    out = packed.unpack_runs(study, tmp_path / "copy")
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == files


def test_pack_is_deterministic(tmp_path):
    """The same files give the same bytes, whatever their time stamps, and an unpacked archive packs to itself."""
    first, second = tmp_path / "a", tmp_path / "b"
    make_study(first)
    make_study(second)
    for path in second.rglob("*"):
        os.utime(path, (1e9, 1e9))
    assert packed.pack_runs(first).read_bytes() == packed.pack_runs(second).read_bytes()
    assert packed.check_archive(first).endswith("packs again to the same bytes")


def test_pack_remove_deletes_only_what_the_archive_holds(tmp_path):
    study = tmp_path / "st"
    files = make_study(study)
    packed.pack_runs(study, remove=True)
    assert not any((study / name).exists() for name in files)
    assert not (study / "sweep").exists()  # emptied, so removed
    assert (study / "study/runs/grpo-n8-s0/checkpoint-3/model.safetensors").read_bytes() == b"weights"  # kept
    assert (study / "study/runs/grpo-n8-s0/accuracy_vs_time.png").is_file()
    assert (study / "study.json").is_file()


def test_unpack_refuses_to_mix_two_versions_of_the_runs(tmp_path):
    study = tmp_path / "st"
    make_study(study)
    packed.pack_runs(study)
    with pytest.raises(ValueError, match=r"already holds study/, sweep/: unpacking .* would mix two versions"):
        packed.unpack_runs(study)


def test_pack_refuses_links_and_unpack_refuses_foreign_members(tmp_path):
    study = tmp_path / "st"
    make_study(study)
    (study / "study/runs/link").symlink_to(study / "study.json")
    with pytest.raises(ValueError, match="is a link or a special file"):
        packed.pack_runs(study)
    for name in ("../escape", "/etc/passwd", "notes/x.txt"):
        other = tmp_path / name.strip("/").replace("/", "_")
        other.mkdir()
        with tarfile.open(other / "runs.tar.xz", "w:xz") as tar:
            tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
        with pytest.raises(ValueError, match="is not a file under study/, sweep/, runs/"):
            packed.unpack_runs(other, tmp_path / "out")
    with pytest.raises(ValueError, match="holds no run folder"):
        packed.pack_runs(tmp_path / "out")


def test_the_left_out_names_are_runlogs():
    from pods_rl.runlog import LOCK_FILE, SET_ASIDE_DIR

    assert SET_ASIDE_DIR in packed.LEFT_OUT_DIRS and LOCK_FILE in packed.LEFT_OUT_FILES


def test_runs_root_prefers_run_files_and_cleans_up(tmp_path):
    study = tmp_path / "st"
    make_study(study)
    packed.pack_runs(study, remove=True)  # the weights stay: they are no runs to read
    with packed.runs_root(study) as root:
        assert root != study and (root / "study/runs/grpo-n8-s0.log").read_bytes() == b"training\n"
    assert not root.exists()
    (study / "study/runs/new-s0").mkdir(parents=True)
    (study / "study/runs/new-s0/metrics.jsonl").write_text("")  # a study writing its runs again: its folders win
    with packed.runs_root(study) as root:
        assert root == study


def test_a_report_names_runs_relative_to_where_they_unpacked(tmp_path):
    """The report's run folders, read from an unpacked archive, are named relative to its root (what replaced
    naming them where they would unpack); a longer name that only starts with the root is left alone."""
    from pods_rl.commands.study_paths import portable

    report = {"seeds": [{"run_dir": f"{tmp_path}/study/runs/a", "seed": 0}], "label": f"{tmp_path}x", "n": 1}
    moved = portable(report, tmp_path)
    assert moved == {"seeds": [{"run_dir": "study/runs/a", "seed": 0}], "label": f"{tmp_path}x", "n": 1}


def test_the_script_packs_without_pods_installed(tmp_path):
    """benchmarks/pack_runs.py loads packed.py by its path: a Python without pods-rl (-I: no site, no PYTHONPATH)."""
    study = tmp_path / "st"
    make_study(study)
    script = str(ROOT / "benchmarks" / "pack_runs.py")
    done = subprocess.run([sys.executable, "-I", "-S", script, "pack", str(study), "--remove"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "st/runs.tar.xz: 5 files" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-I", "-S", script, "unpack", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("pack_runs: error:") and "holds no packed runs" in \
        done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_study_stages_unpack_a_packed_study_to_continue_it(tmp_path, capsys):
    from pods_rl.commands.study import _unpack_to_continue

    study = tmp_path / "st"
    files = make_study(study)
    packed.pack_runs(study, remove=True)
    _unpack_to_continue(study)  # back beside the weights left there, which a resumed run needs
    assert all((study / name).read_bytes() == data for name, data in files.items())
    assert (study / "study/runs/grpo-n8-s0/checkpoint-3/model.safetensors").is_file()
    assert "unpacking" in capsys.readouterr().out
    _unpack_to_continue(study)  # the folders are there: nothing to do
    assert capsys.readouterr().out == ""


def test_a_committed_studys_report_is_computed_again_from_its_archive(tmp_path, capsys):
    """The report stage on evidence/strong-levels (part 3 of the evidence, 128 runs), from ``runs.tar.xz`` alone:
    every number of the committed study.json again (plan, cost, study, headline), and the same printed report."""
    from pods_rl.commands.study_report import write_report

    committed_dir = RESULTS / "evidence" / "strong-levels"
    assert (committed_dir / "runs.tar.xz").is_file() and not packed.run_folders(committed_dir)
    committed = json.loads((committed_dir / "study.json").read_text())
    out = tmp_path / "strong-levels"
    out.mkdir()
    for name in ("runs.tar.xz", "cost.json"):
        shutil.copy(committed_dir / name, out / name)
    report = json.loads(json.dumps(write_report(out, committed["plan"], committed["command"]), default=float))
    capsys.readouterr()

    def without_paths(value):  # the run folders' names: where the study ran, or where the archive would unpack
        if isinstance(value, dict):
            return {k: without_paths(v) for k, v in value.items() if k != "run_dir"}
        return [without_paths(v) for v in value] if isinstance(value, list) else value

    for key in ("plan", "cost", "sweep", "study", "headline"):
        assert without_paths(report[key]) == without_paths(committed[key]), key
    run_dirs = {s["run_dir"] for s in report["study"]["comparisons"]["time/peak"]["labels"]["grpo-n16"]["seeds"]}
    first, seeds = committed["plan"]["first_seed"], committed["plan"]["seeds"]
    assert run_dirs == {f"study/runs/grpo-n16-s{seed}" for seed in range(first, first + seeds)}  # relative to the study
    assert (out / "report.txt").read_text() == (committed_dir / "report.txt").read_text()
    assert not packed.run_folders(out)  # read where it is: nothing unpacked beside it
