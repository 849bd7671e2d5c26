"""The GPU preset (benchmarks/gpu/h100.py): the commands its steps run, and what `pack` brings back from the machine.
The steps themselves ran end to end on CPU at toy sizes (`h100.py all --device cpu --tiny`, benchmarks/gpu/README.md);
a GPU runs them at full size."""

import argparse
import sys
import tarfile
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


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
    assert flags["--cost-n"] == "16,32,64,128" and flags["--updates"] == "200" and "--use_cpu" not in command
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
