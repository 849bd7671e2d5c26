"""The GPU preset (benchmarks/gpu/h100.py): the commands its steps run, what `pack` brings back from the machine, its
dry run from a tree without package metadata, its plan against the GPU budget, and the wheels it carries
(benchmarks/gpu/wheels.py and its lock). The steps themselves ran end to end on CPU at toy sizes (`h100.py all
--device cpu --tiny`, benchmarks/gpu/README.md); a GPU runs them at full size."""

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture
def preset(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS / "gpu"))
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("h100", None)
    import h100

    return h100


def _args(tmp_path, **kw):
    base = dict(device="cuda", tiny=False, root=tmp_path / "gpu-x", model_dir=tmp_path / "model", study_name=None,
                minutes=8.0, dest=None)
    return argparse.Namespace(**{**base, **kw})


def test_study_command_is_the_h100_plan(preset, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights")
    command = preset.study_argv(_args(tmp_path), "--stage", "runs,report", "--max-minutes", "7.5")
    flags = dict(zip(command[4::2], command[5::2]))  # after python -m pods_rl.commands.cli study
    assert command[1:4] == ["-m", "pods_rl.commands.cli", "study"]
    assert flags["--config"].endswith("benchmarks/gpu/h100.yaml") and flags["--m"] == "16" and flags["--n"] == "64"
    assert flags["--cost-n"] == "16,32,64,128" and flags["--updates"] == "150" and "--use_cpu" not in command
    assert flags["--seeds"] == "3" and flags["--control"] == "none"  # GRPO against PODS only: no random control
    assert "--drop-weights" in command and command[-2:] == ["--max-minutes", "7.5"]
    sha = preset.weights_sha256(tmp_path / "model")
    assert flags["--out"] == str(tmp_path / "gpu-x" / f"study-{sha[:12]}")  # a rebuilt, different model: own folder
    cpu = preset.study_argv(_args(tmp_path, device="cpu", tiny=True))
    assert "--use_cpu" in cpu and cpu[cpu.index("--n") + 1] == "8"


def test_pack_brings_back_results_but_no_weights(preset, tmp_path):
    args = _args(tmp_path, dest=str(tmp_path / "out"))
    run = args.root / "study" / "study" / "runs" / "grpo-n16-s0"
    for name in ("metrics.jsonl", "summary.json", "final/model.safetensors", "checkpoint-5/optimizer.pt",
                 "checkpoint-5/trainer_state.json"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
    (args.root / "study" / "report.txt").write_text("report")
    assert preset.step_pack(args) == 0
    with tarfile.open(tmp_path / "out" / "results.tgz") as tar:
        names = sorted(Path(n).name for n in tar.getnames())
    assert names == ["metrics.jsonl", "report.txt", "summary.json"]


def test_the_plan_fits_the_gpu_budget_with_margin_and_the_old_one_did_not(preset):
    """45 minutes of GPU, machine start included: the plan's estimate stays under MARGIN of it, so that a machine
    lost mid-way (a new start and the model rebuilt, ~8 min) still fits; 12 runs x 200 updates (GRPO, PODS and the
    random control, 4 seeds) did not fit at all."""
    total = sum(seconds for _, seconds in preset.plan_seconds()) / 60
    assert total <= preset.MARGIN * preset.BUDGET_MINUTES and preset.MARGIN <= 0.8
    assert total + (preset.ESTIMATE["machine_start"] + preset.ESTIMATE["model"]) / 60 <= preset.BUDGET_MINUTES
    methods = preset.study_methods(preset.STUDY)
    assert [name for name, _ in methods] == ["grpo-n16", "pods-mv-n64m16"]
    study = preset.STUDY["seeds"] * sum(preset.run_seconds(n, preset.STUDY) for _, n in methods)
    calls = [s for name, s in preset.plan_seconds() if "study" in name]
    assert study <= len(calls) * preset.STUDY_CALL_MINUTES * 60  # the study calls hold every run
    old = {**preset.STUDY, "seeds": 4, "updates": 200}
    old_methods = [*methods, ("pods-random-n64m16", 64)]
    assert sum(seconds for _, seconds in preset.plan_seconds(old, old_methods)) / 60 > preset.BUDGET_MINUTES


def python_without_pods_rl_metadata(tmp_path: Path) -> Path:
    """A virtual environment with every package of this one (linked) except pods-rl: no metadata, no editable
    finder, so ``importlib.metadata.version("pods-rl")`` fails there, as in a tree that was never installed."""
    site = Path(sysconfig.get_paths()["purelib"])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    target = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip())
    for entry in site.iterdir():
        if not re.match(r"(__editable__\.)?pods[_-]rl", entry.name, re.I) and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return python


def test_dry_run_from_a_git_archive_without_package_metadata(tmp_path):
    """#38 item 6: `git archive HEAD` (no egg-info, no dist-info), pods_rl from its src/ on PYTHONPATH, in an
    environment without pods-rl's metadata: `h100.py all --dry-run` imports what every step imports, plans the study
    with `pods study --dry-run` and fits the budget, on CPU, writing nothing."""
    tree = tmp_path / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    assert not list((tree / "src").glob("*.egg-info")) and (tree / "benchmarks" / "gpu" / "h100.py").is_file()
    python = python_without_pods_rl_metadata(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tree / "src"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    probe = subprocess.run([python, "-c", "import importlib.metadata as m; m.version('pods-rl')"], env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0 and "PackageNotFoundError" in probe.stderr
    results = tmp_path / "results"
    done = subprocess.run([python, "benchmarks/gpu/h100.py", "all", "--dry-run", "--root", str(results)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"pods_rl from {tree / 'src' / 'pods_rl' / '__init__.py'} (version 0+unknown)" in out
    assert '"missing": {}' in out and "dry run: ok" in out and "fits under 80%" in out
    runs = re.findall(r"^pods train .*--output_dir \S+/study/runs/(\S+) ", out, re.M)
    assert runs == ["grpo-n16-s0", "pods-mv-n64m16-s0", "grpo-n16-s1", "pods-mv-n64m16-s1", "grpo-n16-s2",
                    "pods-mv-n64m16-s2"], runs  # GRPO against PODS, seed by seed
    assert not results.exists()  # a dry run writes nothing


@pytest.fixture
def wheels(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS / "gpu"))
    sys.modules.pop("wheels", None)
    import wheels

    return wheels


def test_the_wheels_lock_is_complete(wheels):
    """Everything pods-rl's base dependencies reach (their requirements, and theirs...) is in the lock, carried,
    the image's or not needed with a reason; what was seen missing on the image is carried."""
    lock = wheels.load()
    assert wheels.lock_problems(lock) == []
    assert set(lock["roots"]) == {wheels.canonical(re.match(r"[\w.-]+", d).group(0)) for d in wheels.base_dependencies()}
    carried = wheels.carried(lock)
    for name in ("xxhash", "pandas", "psutil", "jinja2", "markupsafe", "trl", "datasets", "dill", "multiprocess",
                 "fsspec", "python-dateutil", "tzdata", "regex", "tokenizers", "safetensors", "pyyaml"):
        assert name in carried, name
    reached = wheels.closure(lock["roots"], lock["packages"])
    for name, package in lock["packages"].items():
        if name in reached:
            assert package["status"] == wheels.status_of(name), name
        else:
            assert package["status"].startswith("not needed: reached only through an extra"), name
    assert carried["trl"] == "1.16.0" and carried["datasets"] == "4.8.5" and Version(carried["fsspec"]) <= Version("2026.2.0")
    assert set(wheels.IMAGE) <= set(lock["packages"])


def test_the_wheels_lock_is_the_packages_own_metadata(wheels):
    """Each lock entry installed here at the same version lists exactly the requirements its metadata declares (the
    lock is what pip resolved, not edited by hand)."""
    lock = wheels.load()
    compared = 0
    for name, package in lock["packages"].items():
        try:
            installed = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if installed.version == package["version"]:
            compared += 1
            assert wheels.requirement_names(installed.requires) == package["requires"], name
    assert compared >= 10, compared  # 58 of 71 when the lock was written; fewer as this environment moves on


def test_wheel_check_names_what_is_missing(wheels, tmp_path):
    """``wheels.py check`` on wheels built here from the lock: complete passes; a missing wheel, another version
    and a requirement outside the lock are each named."""
    lock = wheels.load()

    def wheel(name, version, requires):
        path = tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        meta = "\n".join([f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)])
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "Metadata-Version: 2.1\n" + meta + "\n\n")
        return path

    for name, version in wheels.carried(lock).items():
        wheel(name, version, lock["packages"][name]["requires"])
    assert wheels.wheel_problems(tmp_path, lock) == []
    next(tmp_path.glob("xxhash-*.whl")).unlink()
    wheel("pandas", "3.1.1", ["numpy", "no-such-dist>=1; python_version >= '3.8'"])
    wheel("psutil", "0.1", [])
    problems = wheels.wheel_problems(tmp_path, lock)
    assert any(p.endswith("requires no-such-dist, which is not in the lock") for p in problems), problems
    assert any("psutil 0.1, but the lock carries" in p for p in problems), problems
    assert f"xxhash=={lock['packages']['xxhash']['version']}: no wheel" in problems


def test_check_reports_every_missing_package_at_once(preset, wheels, monkeypatch):
    lock = {"roots": ["packaging"], "packages": {
        "packaging": {"version": "1", "requires": [], "status": "carried"},
        "no-such-dist": {"version": "1", "requires": [], "status": "image"},
        "also-missing": {"version": "1", "requires": [], "status": "carried"},
        "networkx": {"version": "1", "requires": [], "status": "not needed: torch.compile only"}}}
    monkeypatch.setattr(preset.wheels, "load", lambda: lock)
    report = preset.import_report()
    assert report["packaging"] == metadata.version("packaging") and "networkx" not in report
    assert report["no-such-dist"].startswith("MISSING") and report["also-missing"].startswith("MISSING")
    json.dumps(report)
