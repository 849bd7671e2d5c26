"""The shipped tiny model (``pods_rl/assets/tiny``, the embedded default's) under vLLM's CPU build: it is served,
it generates what transformers generates, and the default recipe trains with ``--use_vllm true``.

Issue #24 rebuilt it with 2 heads of dim 32 because vLLM's CPU attention refuses the head dim 16 it had before;
these tests fail if a rebuild brings back a head size vLLM cannot serve, or if vLLM's generations drift from
transformers' on it.
"""

import json

import pytest

from pods_rl import runlog
from pods_rl.commands.cli import main as pods
from pods_rl.tiny import model_path

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

LOGP_DIFF = "sampling/sampling_logp_difference/mean"
ALIGNED = 0.02  # see test_trainer_vllm.py


def test_shipped_model_greedy_completions_match_hf():
    """Greedy on 40 held-out problems: vLLM's completions are transformers' (float32 both), so are the accuracies,
    and `--backend auto` picks vLLM for it."""
    from pods_rl.commands.evaluate import evaluate_model
    from pods_rl.generation import choose_backend

    shipped = model_path()
    assert choose_backend("auto", shipped) == "vllm"
    greedy = dict(k=1, temperature=0.0, max_new_tokens=32, limit=40, num_examples=40)
    hf = evaluate_model(str(shipped), "arithmetic", backend="hf", **greedy)
    vllm = evaluate_model(str(shipped), "arithmetic", backend="vllm", **greedy)
    assert (hf["backend"], vllm["backend"]) == ("hf", "vllm")
    hf_text = [e["completion"] for e in hf["examples"]]
    assert len(hf_text) == 40
    assert [e["completion"] for e in vllm["examples"]] == hf_text
    assert vllm["accuracy"] == hf["accuracy"]
    print(f"shipped model, greedy on 40 problems: accuracy {hf['accuracy']:.3f} under both backends")
    assert 0.1 < hf["accuracy"] < 1.0, "the shipped model should be partly right"


def test_default_recipe_trains_through_vllm(tmp_path):
    """`pods train --use_vllm true` on the embedded default (the shipped model, arithmetic, auto 8..32): steps run,
    the kept rows' vLLM log-probs match the trainer's, and held-out evaluation runs before and after."""
    run_dir = tmp_path / "run"
    argv = ["train", "--output_dir", str(run_dir), "--use_vllm", "true", "--vllm_mode", "colocate",
            "--max_steps", "3", "--logging_steps", "1", "--per_device_train_batch_size", "32",
            "--eval_num_problems", "20", "--eval_k", "2", "--eval_every_seconds", "1e9"]
    assert pods(argv) == 0
    rows = [r for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    diffs = [r[LOGP_DIFF] for r in rows]
    print("shipped model through vLLM, sampling_logp_difference/mean per step:", [round(d, 5) for d in diffs])
    assert max(diffs) < ALIGNED, diffs
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3
    assert 0.0 < summary["accuracy_before"] < 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0, summary
    assert runlog.read_clock(run_dir / "final")["step"] == 3
