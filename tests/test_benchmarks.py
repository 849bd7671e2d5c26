"""Smoke tests of the training benchmarks: bench_phases in --quick mode on a tiny random model (a subprocess), and the
evidence study as calls of `pods study`.

They check the scripts end to end (trainer built like `pods train`, JSON schema, figures), not the speed of this
machine: the only timing claim asserted is that sampling 32x more rollouts takes longer.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def _run(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_bench_phases_quick(tmp_path, tiny_model_dir):
    proc = _run("bench_phases.py", "--quick", "--model", str(tiny_model_dir), "--out", str(tmp_path),
                "--threads", "1")
    data = json.loads((tmp_path / "bench_phases_quick.json").read_text())
    assert (tmp_path / "bench_phases_quick.png").stat().st_size > 1000
    for key in ("command", "model", "device", "machine", "generation", "update", "asymmetry", "repeats"):
        assert key in data, key
    assert data["machine"]["cpu_model"] and data["device"] == "cpu"

    generation = sorted(data["generation"], key=lambda r: r["n"])
    assert [r["n"] for r in generation] == [2, 64]
    for r in generation:
        assert r["seconds"] > 0 and r["rollouts"] == data["prompts"] * r["n"]
        assert r["peak_mib"] >= 0 and r["total_peak_mib"] > 0
        assert 0 < r["mean_completion_tokens"] <= r["max_new_tokens"]
    # 32x more rollouts of the same prompts cost more, even on a tiny model dominated by per-token overhead.
    assert generation[-1]["seconds"] > generation[0]["seconds"]

    update = {r["m"]: r for r in data["update"] if not r["control"]}
    assert sorted(update) == [2, 8]
    for m, r in update.items():
        assert r["seconds"] > 0 and r["rollouts"] == data["prompts"] * m  # the step trained on P*m kept rows
        assert r["n_source"] == 8
    assert update[2]["rule"] == "max_variance" and update[8]["rule"] == "none (GRPO)"
    assert "generation" in proc.stdout and "update" in proc.stdout


def test_study_script_is_a_call_of_pods_study(tmp_path, capsys, monkeypatch):
    """Each stage of the evidence study is one `pods study` command with the study's protocol; `report` runs it
    on finished runs (two methods x two seeds of the committed strong-model study)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from study_pods_vs_grpo import main

    out = tmp_path / "study"
    commands = {}
    for stage, extra in (("sweep", ["--lrs", "1e-4,2e-4"]), ("study", ["--lr", "1e-4"]), ("options", ["--lr", "1e-4"])):
        assert main([stage, "--out", str(out), "--dry-run", *extra]) == 0
        commands[stage] = capsys.readouterr().out.strip()
    for command in commands.values():
        assert command.startswith("pods study --config tiny --m 16 --prompts-per-step 8 --updates 300 ")
        assert "--eval-every 25 --eval-problems 500 --eval-k 4 --jobs 2 --threads 1" in command
    assert "--stage sweep,report --methods grpo-n16 --lrs 1e-4,2e-4" in commands["sweep"]
    assert ("--methods grpo-n16,pods-mv-n32m16,pods-mv-n64m16,pods-random-n64m16 --seeds 8 --learning_rate 0.0001"
            in commands["study"])
    assert f"--out {out / 'options'}" in commands["options"] and "--baseline pods-mv-n32m16" in commands["options"]
    assert "'shorter=--downsample_tiebreak shorter'" in commands["options"]

    from pods_rl.runlog.packed import unpack_runs

    strong = unpack_runs(ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc" / "study_strong", tmp_path / "strong")
    for name in ("grpo-n16-s0", "grpo-n16-s1", "pods-mv-n64m16-s0", "pods-mv-n64m16-s1"):
        shutil.copytree(strong / "study" / "runs" / name, out / "study" / "runs" / name)
    assert main(["report", "--out", str(out), "--methods", "grpo-n16,pods-mv-n64m16"]) == 0
    report = json.loads((out / "study.json").read_text())
    numbers = report["headline"]["pods-mv-n64m16"]
    assert numbers["step_time_ratio"]["value"] > 1 and len(numbers["step_time_ratio"]["ci95"]) == 2
    assert report["plan"]["lr"] == 1e-4  # read from the runs' config.yaml
    assert not (out / "plan.json").exists()  # a report alone writes no plan


def test_study_counts_a_gracefully_stopped_run_as_unfinished(tmp_path):
    from pods_rl.runlog import run_finished

    run = tmp_path / "grpo-n16-s0"
    run.mkdir()
    assert not run_finished(run)  # started, nothing written yet
    (run / "summary.json").write_text(json.dumps({"stopped_by": "SIGTERM", "steps": 59, "exit_code": 143}))
    assert not run_finished(run)  # stopped with a checkpoint: the study resumes it
    (run / "summary.json").write_text(json.dumps({"steps": 600, "accuracy_after": 0.3}))
    assert run_finished(run)
    (run / "summary.json").write_text('{"steps": 6')  # torn
    assert not run_finished(run)
