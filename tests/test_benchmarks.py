"""Smoke tests of the training benchmarks (bench_phases, the evidence study) in --quick mode on a tiny random model (subprocesses, ~1 minute).

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


@pytest.mark.slow
def test_study_quick_sweep_then_study_then_report(tmp_path):
    """The evidence study end to end on the shipped tiny model: sweep, study, report with the three numbers, the
    projection and the figures; then resumable."""
    out = tmp_path / "study"
    _run("study_pods_vs_grpo.py", "sweep", "--quick", "--out", str(out))
    _run("study_pods_vs_grpo.py", "study", "--quick", "--out", str(out))
    report = json.loads((out / "study.json").read_text())
    assert report["sweep"]["best_lr"] == 2e-4
    study = report["study"]
    assert set(study["methods"]) == {"grpo-n16", "pods-mv-n64m16"}
    pods, grpo = study["methods"]["pods-mv-n64m16"], study["methods"]["grpo-n16"]
    assert grpo["step_ratio"] == 1.0 and pods["seeds"] == 2
    assert pods["step_ratio"] > 1.0  # sampling 4x the rollouts costs something, even on a tiny model
    for key in ("steps/peak", "steps/gain80", "time/peak", "time/gain80"):
        assert study["comparisons"][key]["baseline"] == "grpo-n16"
        assert pods[key]["kind"] in ("estimate", "upper_bound", "lower_bound", "undefined")
    projection = study["projection"]
    assert projection["break_even"]["pods-mv-n64m16"]["step_ratio"] == pods["steps/peak"]["ratio"]
    paper64 = next(row for row in projection["rows"] if row["source"].startswith("paper 1xGPU GSM8K, n=64"))
    assert paper64["step_ratio"] == round(10.1 / 7.6, 3)
    if pods["steps/peak"]["ratio"] is not None:
        assert paper64["pods-mv-n64m16"]["speedup"] == pytest.approx(pods["steps/peak"]["ratio"] / (10.1 / 7.6),
                                                                     rel=1e-3)
    for name in study["figures"]:
        assert (out / name).stat().st_size > 1000, name
    rows = [json.loads(line) for line in (out / "commands.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and len(rows[1]["runs"]) == 4
    assert all("--max_steps 4" in c and "--eval_every_steps 2" in c for c in rows[1]["runs"].values())
    proc = _run("study_pods_vs_grpo.py", "study", "--quick", "--out", str(out))
    assert "4 runs, 4 done before; 0 to go" in proc.stdout

    # The options stage: its runs carry the option's flag; its report compares each option with PODS alone.
    proc = _run("study_pods_vs_grpo.py", "options", "--quick", "--dry-run", "--out", str(out))
    commands = proc.stdout.strip().splitlines()
    assert len(commands) == 6 and sum("--downsample_tiebreak shorter" in c for c in commands) == 2
    assert sum("--oversample_prompts 2" in c for c in commands) == 2
    runs = out / "study" / "runs"
    for seed in (0, 1):  # finished runs stand in for the options' runs (the report only reads run directories)
        shutil.copytree(runs / f"pods-mv-n64m16-s{seed}", out / "options" / "runs" / f"pods-mv-n32m16-s{seed}")
        shutil.copytree(runs / f"grpo-n16-s{seed}", out / "options" / "runs" / f"pods-mv-n32m16-shorter-s{seed}")
    _run("study_pods_vs_grpo.py", "report", "--out", str(out))
    options = json.loads((out / "study.json").read_text())["options"]
    assert options["baseline"] == "pods-mv-n32m16" and set(options["methods"]) == {
        "pods-mv-n32m16", "pods-mv-n32m16-shorter"}
    shorter = options["methods"]["pods-mv-n32m16-shorter"]
    assert shorter["step_ratio"] < 1.0  # the stand-in is GRPO n=16: cheaper than 64 -> 16
    assert shorter["length/train_kept"]["mean"][0] > 0 and shorter["length/held_out_second_half"]["mean"][0] > 0
    for name in options["figures"]:
        assert (out / name).stat().st_size > 1000, name


def test_study_counts_a_gracefully_stopped_run_as_unfinished(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from study_report import run_finished

    run = tmp_path / "grpo-n16-s0"
    run.mkdir()
    assert not run_finished(run)  # started, nothing written yet
    (run / "summary.json").write_text(json.dumps({"stopped_by": "SIGTERM", "steps": 59, "exit_code": 143}))
    assert not run_finished(run)  # stopped with a checkpoint: the study resumes it
    (run / "summary.json").write_text(json.dumps({"steps": 600, "accuracy_after": 0.3}))
    assert run_finished(run)
    (run / "summary.json").write_text('{"steps": 6')  # torn
    assert not run_finished(run)
