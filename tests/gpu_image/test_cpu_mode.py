"""The GPU preset's CPU mode end to end (the gpu_image lane, .ci/lane-gpu-image.sh: run with the GPU image's torch,
transformers and accelerate): `h100.py answer --cpu`, `h100.py study --cpu`, `keep`, and `study --cpu` again on a
fresh machine, which resumes. About 3-5 minutes on 2 cores: outside the main suite, which runs the preset's dry run
(tests/test_gpu_preset.py). Run it with `python -m pytest -q --lane gpu_image tests/gpu_image`."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
pytestmark = pytest.mark.gpu_image


def _names(archive):
    with tarfile.open(archive) as tar:
        return sorted(tar.getnames())


def test_cpu_mode_runs_every_stage_and_a_fresh_machine_resumes_the_study(tmp_path):
    """`answer --cpu` then `study --cpu` at toy sizes (the commands of the device calls, with --cpu), `keep` of what
    came back, then `study --cpu` on a fresh machine (an empty work folder): the model is rebuilt with the same
    sha256 as the recorded one, the study starts from its kept archive, measures nothing again and finishes with
    every run still there."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    results, work = tmp_path / "results", tmp_path / "work"

    def call(step, out):
        done = subprocess.run([sys.executable, "benchmarks/gpu/h100.py", step, "--cpu", "--out", str(tmp_path / out),
                               "--work", str(work), "--results", str(results / "here")], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return json.loads((tmp_path / out / ("answer.json" if step == "answer" else "study-call.json")).read_text())

    answer = call("answer", "out1")
    status = {s["name"]: s["status"] for s in answer["stages"]}
    assert status == {"machine": "done", "selection_test": "done", "model": "done", "cost": "done",
                      "train_grpo-n4": "done", "train_pods-mv-n8m4": "done", "train_pods-mv-n8m4-pilot4": "done",
                      "nccl": "skipped", "fsdp": "skipped"}, status
    assert answer["selection_test"]["status"] == "skipped"  # no CUDA here
    assert answer["headline"].startswith("a PODS 8 -> 4 step takes") and "adaptive 8 -> 4 k4" in answer["headline"]
    assert all(answer[f"train_{m}"]["updates"] == 2 for m in ("grpo-n4", "pods-mv-n8m4", "pods-mv-n8m4-pilot4"))
    assert set(json.loads((tmp_path / "out1" / "gpu_paths.json").read_text())) == set(answer["gpu_paths"])
    assert "cost.json" in _names(tmp_path / "out1" / "answer-files.tgz")

    first = call("study", "out2")
    assert [s["status"] for s in first["stages"]] == ["done"] * 6 and first["model"]["recorded_sha256"] is None
    runs = ["grpo-n4-s0", "pods-mv-n8m4-pilot4-s0", "pods-mv-n8m4-s0"]
    assert first["study"]["finished_after"] == runs
    key = first["model"]["key"]
    assert {"cost.json", "report.txt", "study.json"} <= set(_names(tmp_path / "out2" / f"study-{key}.tgz"))
    (results / "here").mkdir(parents=True)
    (tmp_path / "out2" / "study.log").write_text("the call's output")
    sys.path.insert(0, str(GPU))
    from outbox import keep

    keep(tmp_path / "out2", results)
    shutil.rmtree(work)  # a fresh machine
    second = call("study", "out3")
    assert second["model"]["sha256"] == first["model"]["sha256"] == second["model"]["recorded_sha256"]
    assert second["study"]["finished_before"] == second["study"]["finished_after"] == runs
    assert second["runs"]["new_runs"] == 0 and second["cost"]["exit_code"] == 0
    log = (work / f"study-{key}" / "cost-call.log").read_text()
    assert "exists, not measured again" in log
