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
    came back, then `study --cpu` on a fresh machine (an empty work folder): the study, on the committed model
    `--model auto` picks, starts from its kept archive, measures nothing again and finishes with every run there."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    results, work = tmp_path / "results", tmp_path / "work"

    def call(step, out, *extra):
        done = subprocess.run([sys.executable, "benchmarks/gpu/h100.py", step, "--cpu", "--out", str(tmp_path / out),
                               "--work", str(work), "--results", str(results / "here"), *extra], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return json.loads((tmp_path / out / ("answer.json" if step == "answer" else "study-call.json")).read_text())

    answer = call("answer", "out1")
    status = {s["name"]: s["status"] for s in answer["stages"]}
    assert status == {name: "done" for name in ("machine", "cuda_tests", "model", "cost", "big_model", "cost_big_long",
                                                "cost_big_short", "selection_bench")}, status
    assert answer["cuda_tests"]["status"] == "skipped"  # no CUDA here
    assert answer["headline"].startswith("a PODS 8 -> 4 step takes") and "adaptive 8 -> 4 k4" in answer["headline"]
    assert [r["setting"] for r in answer["cost_big_long"]["rows"]] == ["4 -> 4", "8 -> 4"]
    assert all(r["step_ratio_range"] for r in answer["cost"]["rows"])
    assert answer["selection_bench"]["cases"] and all(c["max_variance_deferred_s"] > 0
                                                      for c in answer["selection_bench"]["cases"])
    names = _names(tmp_path / "out1" / "answer-files.tgz")
    assert {"cost.json", "cost_big_long.json", "cost_big_short.json"} <= set(names)
    kept = json.loads(tarfile.open(tmp_path / "out1" / "answer-files.tgz").extractfile("cost.json").read())
    assert all(r["per_step"] for r in kept["rows"])  # every step's phase times, for any other estimator

    first = call("study", "out2")
    # the phases in turn: PODS 8 -> 4, then auto (up to 8 -> 4), adaptive PODS (pilot 4) and Knapsack-RL, paired
    # with GRPO's seed 0
    assert [s["name"] for s in first["stages"]] == ["machine", "model", "cost", "gate", "runs pods", "runs auto",
                                                    "runs adaptive", "runs knapsack", "report"]
    assert [s["status"] for s in first["stages"]] == ["done"] * 9 and first["model"]["kind"] == "shipped"
    runs = ["grpo-n4-s0", "pods-mv-n8m4-auto-s0", "pods-mv-n8m4-knapsack6-s0", "pods-mv-n8m4-pilot4-s0",
            "pods-mv-n8m4-s0"]
    assert first["study"]["finished_after"] == runs
    assert first["runs auto"]["new_runs"] == first["runs adaptive"]["new_runs"] == 1  # GRPO's seed was there
    assert first["lease"] == {"results_dir": "here", "step_costs_filed": False, "calls": ["answer", "study"],
                              "filed_stages": None}  # the CPU mode's call 1 is no GPU's step costs
    key = first["model"]["key"]
    assert {"cost.json", "report.txt", "study.json"} <= set(_names(tmp_path / "out2" / f"study-{key}.tgz"))
    (results / "here").mkdir(parents=True)
    (tmp_path / "out2" / "study.log").write_text("the call's output")
    sys.path.insert(0, str(GPU))
    from outbox import keep

    keep(tmp_path / "out2", results)
    shutil.rmtree(work)  # a fresh machine, on another day
    # `--model auto` would now pick the strong model (its study has no runs yet); the shipped one's resumes:
    second = call("study", "out3", "--model", "shipped")
    assert second["model"]["key"] == key
    assert second["study"]["finished_before"] == second["study"]["finished_after"] == runs
    assert not any(s["name"].startswith("runs") for s in second["stages"])  # every phase done: no runs
    assert second["cost"]["exit_code"] == 0
    log = (work / f"study-{key}" / "cost-call.log").read_text()
    assert "exists, not measured again" in log
