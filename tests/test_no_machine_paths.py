"""Every study reruns from a clone (#76): no tracked text file names a folder of the machine that wrote it, and
`pods study` records the paths under the folder it ran from relative to it.

The filed studies once named the developer's checkout, its code snapshots and its output folders in full (over
9,000 times); benchmarks/results/README.md says what their placeholders (`<repo>`, `<snapshot>`, `<work>/...`,
`<tmp>/...`, `<python>`) stand for. Compressed archives and binary files are not read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pods_rl.commands.study_paths import portable
from tests.test_tree_size import git_files, walked_files

ROOT = Path(__file__).resolve().parent.parent
RECORDS = "benchmarks/results/"  # what machines wrote: run logs, study.json, commands.jsonl, their READMEs
# A path starts here: not inside a word, a longer path (`.venv/work/`, `./work/`, `../tmp/`), a URL
# (`https://host/home/...`: a letter before) or a home-relative one (`~/work/`, the same on any machine).
START = r"(?<![\w./~-])"
# Folders that exist only on some machines, wherever a file names them.
ANYWHERE = re.compile(START + "(" + "|".join([
    r"/work/",                    # the project's sandboxes: checkouts, study outputs, snapshots, virtual environments
    r"/root/",                    # root's home (pyenv's Pythons in tracebacks)
    r"/home/[^/\s]+/",            # a user's home on Linux
    r"/Users/[^/\s]+/",           # ... on macOS
    r"/mnt/", r"/scratch/",       # mounted disks, cluster scratch
    r"/private/var/folders/", r"/var/folders/",  # macOS's per-user temporary folders
]) + r")|(?<![\w])[A-Za-z]:\\\\?Users\\")  # a Windows home, C:\Users\ (written \\ in source and JSON)
# In the filed records only: there a /tmp or /opt path is where one machine put a run or its Python. Elsewhere it is
# a folder the text chooses, the same on any Unix machine: `mktemp -d /tmp/x.XXXXXX` (.ci/), `--out /tmp/smoke`
# (docs/guides/study.md), the GPU preset's `/tmp/site` on the device machine (benchmarks/gpu/plan.py); and /usr,
# /etc, /dev, /proc (`#!/usr/bin/env`, `/etc/xdg/pip`, `/dev/null`) are the same on every machine, never flagged.
IN_RECORDS = re.compile(START + r"(/tmp/[\w.+-]|/opt/[\w.+-])")
# Not read: archives (kept as packed, see benchmarks/results/README.md) and binaries; this file names the patterns.
PACKED = (".tar.xz", ".tgz", ".tar.gz", ".zip", ".xz", ".gz", ".png", ".jpg", ".pdf", ".safetensors", ".bin", ".pt")
NOT_READ = {"tests/test_no_machine_paths.py"}


def machine_paths(name: str, text: str) -> list[str]:
    """``file:line: match`` for each machine's folder that ``text`` (the file ``name``, relative) names."""
    patterns = [ANYWHERE, IN_RECORDS] if name.startswith(RECORDS) else [ANYWHERE]
    return [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {text[m.start():m.start() + 60].split()[0]}"
            for pattern in patterns for m in pattern.finditer(text)]


def tracked_text() -> dict[str, str]:
    """{relative path: text} of the repository's tracked text files but archives and binaries."""
    names = git_files(ROOT)
    names = walked_files(ROOT) if names is None else names
    texts = {}
    for name in names:
        path = ROOT / name
        if name in NOT_READ or name.endswith(PACKED) or not path.is_file():
            continue
        raw = path.read_bytes()
        if b"\0" not in raw[:8192]:  # git's own test for a binary file
            texts[name] = raw.decode("utf-8", errors="replace")
    return texts


def test_no_tracked_text_file_names_a_machines_folder():
    texts = tracked_text()
    assert "benchmarks/results/cpu-2core-amd-epyc/evidence/strong/study.json" in texts  # the files it is about
    found = [hit for name, text in texts.items() for hit in machine_paths(name, text)]
    assert not found, (f"{len(found)} absolute path(s) of a machine: write them relative to the checkout or as a "
                       "placeholder of benchmarks/results/README.md:\n" + "\n".join(found[:30]))


@pytest.mark.parametrize("name, text", [
    ("benchmarks/results/x/commands.jsonl", '{"command": "pods study --out /work/dapo-study"}'),
    ("benchmarks/results/x/cost.log", '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py"'),
    ("docs/x.md", "cd /home/alice/pods-rl && make test"),
    ("docs/x.md", "open /Users/bob/pods-rl/README.md"),
    ("docs/x.md", r"C:\Users\carol\pods-rl"),
    ("benchmarks/x.json", r'{"model": "C:\\Users\\carol\\pods-rl"}'),
    ("benchmarks/x.sh", "export PYTHONPATH=src:/work/study-src/src"),
    ("benchmarks/results/x/study.json", '"run_dir": "/tmp/strong24/study/runs/grpo-n16-s0"'),
    ("benchmarks/results/x/answer.log", "+ /opt/torch/.venv/bin/python3 -m pytest"),
])
def test_a_machines_folder_is_found(name, text):
    assert len(machine_paths(name, text)) == 1


@pytest.mark.parametrize("name, text", [
    ("README.md", "see https://github.com/huggingface/trl/tree/main/work/home/tmp/x and https://x.org/Users/a/"),
    ("Makefile", "#!/usr/bin/env bash\n\tpip config list  # /etc/xdg/pip/pip.conf\n\tcmd > /dev/null"),
    ("docs/guides/study.md", "pods study --smoke --out /tmp/smoke"),  # a scratch folder the reader chooses
    (".ci/x.sh", "tree=$(mktemp -d /tmp/pods-gpu-image.XXXXXX)"),
    ("benchmarks/results/x/run.sh", 'w=${WORK:-${TMPDIR:-/tmp}/pods-extra}; cd "$ROOT/work/x"; ls ~/work/a ./work/b'),
    ("benchmarks/results/x/commands.jsonl", '"--out <work>/dapo-study --model_name_or_path benchmarks/m"'),
    ("benchmarks/results/x/study.json", '"run_dir": "study/runs/grpo-n16-s0", "python": "<python>/lib"'),
])
def test_portable_text_is_not_flagged(name, text):
    assert machine_paths(name, text) == []


def test_portable_writes_paths_under_the_base_relative_to_it():
    base = "/data/checkout"
    assert portable("/data/checkout/benchmarks/m", base) == "benchmarks/m"
    assert portable("/data/checkout", base) == "."
    assert portable("pods train --model_name_or_path /data/checkout/m --output_dir=/data/checkout/o/r", base) == (
        "pods train --model_name_or_path m --output_dir=o/r")
    # outside the base, a longer name starting with it, a relative path: as they are
    for kept in ("/data/checkout-2/m", "/data/other/m", "x/data/checkout/m", "rel/m", "/data/checkoutm"):
        assert portable(kept, base) == kept
    value = {"run_dir": Path("/data/checkout/s/runs/a"), "argv": ["--x", "/data/checkout/y"], "n": 3, "nan": None}
    assert portable(value, base) == {"run_dir": "s/runs/a", "argv": ["--x", "y"], "n": 3, "nan": None}
    assert portable(("/data/checkout/a",), base) == ("a",)


def test_a_study_records_the_paths_under_its_folder_relative(tmp_path, monkeypatch):
    """plan.json and commands.jsonl of a study run with absolute paths inside the current folder (a clone) name
    them relative to it, and a plan.json from before (absolute paths) still matches the same settings."""
    from pods_rl.commands.study import _log_invocation, build_parser, check_plan_file
    from pods_rl.commands.study_plan import make_plan

    monkeypatch.chdir(tmp_path)
    out, model = tmp_path / "results" / "study", tmp_path / "models" / "tiny"
    args, recipe_argv = build_parser().parse_known_args(
        ["--out", str(out), "--model_name_or_path", str(model), "--seeds", "1", "--updates", "2"])
    plan = make_plan(args, recipe_argv)
    plan.out.mkdir(parents=True)
    check_plan_file(plan)
    written = (out / "plan.json").read_text()
    assert json.loads(written)["settings"]["recipe_argv"] == ["--model_name_or_path", "models/tiny"]
    train = f"pods train --model_name_or_path {model} --output_dir {out}/study/runs/grpo-n8-s0"
    _log_invocation(plan, "runs", [{"name": "grpo-n8-s0", "status": "done", "command": train}],
                    f"pods study --out {out} --model_name_or_path {model}")
    logged = (out / "commands.jsonl").read_text()
    assert str(tmp_path) not in written + logged
    assert json.loads(logged)["runs"]["grpo-n8-s0"]["command"] == (
        "pods train --model_name_or_path models/tiny --output_dir results/study/study/runs/grpo-n8-s0")

    before = json.loads(written)
    before["settings"]["recipe_argv"][1] = str(model)  # as an older pods study wrote it
    (out / "plan.json").write_text(json.dumps(before))
    check_plan_file(plan)  # the same settings: no refusal
    changed = make_plan(build_parser().parse_known_args(
        ["--out", str(out), "--model_name_or_path", str(tmp_path / "models" / "other"), "--seeds", "1",
         "--updates", "2"])[0], ["--model_name_or_path", str(tmp_path / "models" / "other")])
    with pytest.raises(ValueError, match="holds a study with other settings"):
        check_plan_file(changed)
