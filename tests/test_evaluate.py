"""`pods eval`: statistics against hand-computed values, evaluation of a tiny model, run dirs, the JSON file."""

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pytest
import yaml

from pods_rl import evaluation
from pods_rl.accuracy import accuracy_stats, pass_at_k
from pods_rl.commands import evaluate as ev

# ----------------------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 1, 0.0),
        (5, 5, 3, 1.0),
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 1, 4, 1.0),  # n - c < k
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (0, 0, 1)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_accuracy_stats_hand_values():
    correct = np.array([[1, 0, 1], [0, 0, 1]], dtype=bool)  # (P=2, k=3)
    stats = accuracy_stats(correct)
    assert stats["accuracy"] == pytest.approx(0.5)
    assert stats["per_repeat_accuracy"] == pytest.approx([0.5, 0.0, 1.0])
    # std([0.5, 0, 1], ddof=1) = 0.5 -> / sqrt(3)
    assert stats["accuracy_stderr"] == pytest.approx(0.5 / math.sqrt(3))
    assert stats["pass_at_k"] == pytest.approx(1.0)  # both problems have a correct sample
    assert (stats["num_problems"], stats["k"]) == (2, 3)

    stats = accuracy_stats([[0, 0], [1, 1], [1, 0]])  # per repeat [2/3, 1/3]
    assert stats["accuracy"] == pytest.approx(0.5)
    assert stats["accuracy_stderr"] == pytest.approx(math.sqrt(2 * (1 / 6) ** 2) / math.sqrt(2))
    assert stats["pass_at_k"] == pytest.approx(2 / 3)

    single = accuracy_stats([[1], [0], [0], [0]])  # k = 1: no spread over repeats
    assert single["accuracy"] == pytest.approx(0.25) and single["accuracy_stderr"] is None


@pytest.mark.parametrize("bad", [np.zeros(3), np.zeros((0, 2)), np.full((2, 2), 0.5)])
def test_accuracy_stats_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="correct must"):
        accuracy_stats(bad)


def test_parse_task_args():
    assert ev.parse_task_args(["digits=3", "ops=+-", "name=x=y", "flag=true"]) == {
        "digits": 3, "ops": "+-", "name": "x=y", "flag": True}
    with pytest.raises(ValueError, match="key=value"):
        ev.parse_task_args(["digits"])


# ----------------------------------------------------------------------------------------------------------
# A fake task and a tiny model
# ----------------------------------------------------------------------------------------------------------
class FakeTask:
    """Chat prompts "Q<i>" with gold answers; a completion is correct iff it equals the answer, formatted iff
    it starts with '<'. Follows the Task contract (load, score)."""

    name = "fake"

    def __init__(self, size=4):
        self.size = size

    def load(self, split="test", limit=None):
        from datasets import Dataset

        rows = [{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i}+1"}],
                 "answer": str(i + 1)} for i in range(self.size)]
        return Dataset.from_list(rows[:limit] if limit else rows)

    def score(self, completion, answer):
        return {"correct": completion == answer, "format": completion.startswith("<")}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from pods_rl.tiny import build_random_model

    return build_random_model(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2", seed=0)


def make_run_dir(root, model_src, steps=(2, 4), seconds=(10.0, 25.0), final=True):
    """A run directory with checkpoint-<step>/ (copies of a tiny model + pods_clock.json) and final/."""
    import shutil

    run_dir = root / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        {"model_name_or_path": str(model_src), "task": "fake", "num_generations": 4, "downsample_to": 2,
         "seed": 0}))
    for step, secs in zip(steps, seconds):
        ckpt = run_dir / f"checkpoint-{step}"
        shutil.copytree(model_src, ckpt)
        (ckpt / "pods_clock.json").write_text(json.dumps({"step": step, "train_seconds": secs}))
    if final:  # same step as the last checkpoint: must be deduplicated
        shutil.copytree(model_src, run_dir / "final")
        (run_dir / "final" / "pods_clock.json").write_text(
            json.dumps({"step": steps[-1], "train_seconds": seconds[-1]}))
    return run_dir


@pytest.fixture
def fake_task_by_name(monkeypatch):
    """Make the CLI's --task fake resolve to FakeTask (the registry is someone else's)."""
    real = ev.resolve_task

    def resolve(task, task_args=None):
        return FakeTask(**(task_args or {})) if task == "fake" else real(task, task_args)

    monkeypatch.setattr(ev, "resolve_task", resolve)


# ----------------------------------------------------------------------------------------------------------
# evaluate_model
# ----------------------------------------------------------------------------------------------------------
def test_evaluate_model_aggregates_known_completions(tiny_model, monkeypatch):
    """With the generator replaced by known completions, every statistic is hand-checkable."""
    # 3 problems (answers 1, 2, 3) x k=2 samples
    completions = [["1", "<x"], ["<y", "<z"], ["3", "3"]]
    lengths = np.array([[1, 2], [2, 2], [1, 5]])

    def fake_generate(model, tokenizer, prompt_ids, k, temperature, max_new_tokens, batch_size, seed, desc=""):
        assert len(prompt_ids) == 3 and k == 2
        return completions, lengths

    monkeypatch.setattr(evaluation, "generate_hf", fake_generate)
    record = ev.evaluate_model(str(tiny_model), FakeTask(size=3), k=2, backend="hf", num_examples=2)
    # correct: [[1,0],[0,0],[1,1]] -> per repeat [2/3, 1/3]
    assert record["accuracy"] == pytest.approx(0.5)
    assert record["per_repeat_accuracy"] == pytest.approx([2 / 3, 1 / 3])
    assert record["accuracy_stderr"] == pytest.approx(math.sqrt(2 * (1 / 6) ** 2) / math.sqrt(2))
    assert record["format_accuracy"] == pytest.approx(3 / 6)
    assert record["both_accuracy"] == pytest.approx(0.0)
    assert record["pass_at_k"] == pytest.approx(2 / 3)
    assert record["mean_completion_tokens"] == pytest.approx(13 / 6)
    assert (record["step"], record["train_seconds"]) == (0, 0.0)  # plain model: no clock
    assert [e["completion"] for e in record["examples"]] == ["1", "<y"]
    assert record["examples"][0]["correct"] is True
    assert "<|assistant|>" in record["examples"][0]["prompt"]  # chat template with generation prompt


def test_evaluate_model_generates_with_tiny_model(tiny_model):
    kwargs = dict(k=3, temperature=1.0, max_new_tokens=6, limit=3, batch_size=4, seed=123, backend="hf")
    record = ev.evaluate_model(tiny_model, FakeTask(size=5), **kwargs)
    assert record["backend"] == "hf" and record["num_problems"] == 3 and record["k"] == 3
    for key in ("accuracy", "format_accuracy", "both_accuracy", "pass_at_k"):
        assert 0.0 <= record[key] <= 1.0
    assert record["both_accuracy"] <= min(record["accuracy"], record["format_accuracy"])
    assert record["pass_at_k"] >= record["accuracy"]
    assert 1.0 <= record["mean_completion_tokens"] <= 6.0
    assert record["eval_seconds"] > 0
    assert len(record["examples"]) == 3 and all(isinstance(e["completion"], str) for e in record["examples"])
    # Same seed -> same samples; another seed -> (almost surely) different ones from a random model.
    again = ev.evaluate_model(tiny_model, FakeTask(size=5), **kwargs)
    assert [e["completion"] for e in again["examples"]] == [e["completion"] for e in record["examples"]]
    other = ev.evaluate_model(tiny_model, FakeTask(size=5), **{**kwargs, "seed": 7})
    assert [e["completion"] for e in other["examples"]] != [e["completion"] for e in record["examples"]]


def test_evaluate_model_greedy_repeats_one_decode(tiny_model):
    record = ev.evaluate_model(tiny_model, FakeTask(size=2), k=3, temperature=0.0, max_new_tokens=5,
                               backend="hf")
    assert record["accuracy_stderr"] == 0.0  # k identical repeats


def test_evaluate_model_in_memory_needs_tokenizer(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with pytest.raises(ValueError, match="tokenizer"):
        ev.evaluate_model(model, FakeTask(), k=1, max_new_tokens=2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.padding_side = "right"  # e.g. a trainer's tokenizer: evaluation must not change it
    import torch

    torch.manual_seed(99)
    rng_before = torch.get_rng_state()
    record = ev.evaluate_model(model, FakeTask(size=2), k=2, max_new_tokens=3, tokenizer=tokenizer)
    assert record["checkpoint"] == "<in-memory>" and record["num_problems"] == 2
    assert tokenizer.padding_side == "right"
    assert torch.equal(torch.get_rng_state(), rng_before)  # a trainer's RNG stream is left alone


def test_evaluate_model_loads_peft_adapter(tiny_model, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    adapter_dir = tmp_path / "checkpoint-3"
    peft_model.save_pretrained(adapter_dir)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(adapter_dir)
    (adapter_dir / "pods_clock.json").write_text(json.dumps({"step": 3, "train_seconds": 7.5}))
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(tiny_model)
    assert not (adapter_dir / "config.json").exists()

    record = ev.evaluate_model(adapter_dir, FakeTask(size=2), k=2, max_new_tokens=3, backend="hf")
    assert (record["step"], record["train_seconds"]) == (3, 7.5)
    assert 0.0 <= record["accuracy"] <= 1.0


def test_evaluate_model_rejects_bad_settings(tiny_model):
    with pytest.raises(ValueError, match="temperature"):
        ev.evaluate_model(tiny_model, FakeTask(), temperature=-1.0)
    with pytest.raises(ValueError, match="k, max_new_tokens"):
        ev.evaluate_model(tiny_model, FakeTask(), k=0)
    with pytest.raises(ValueError, match="task must be"):
        ev.evaluate_model(tiny_model, object())


# ----------------------------------------------------------------------------------------------------------
# Run directories and the results file
# ----------------------------------------------------------------------------------------------------------
RECORD_FIELDS = {
    "checkpoint", "checkpoint_path", "task", "split", "k", "temperature", "max_new_tokens", "limit", "seed",
    "step", "train_seconds", "accuracy", "accuracy_stderr", "per_repeat_accuracy", "format_accuracy",
    "both_accuracy", "pass_at_k", "mean_completion_tokens", "num_problems", "eval_seconds", "backend",
    "examples", "evaluated_at",
}


def test_find_checkpoints_sorted_and_final_deduplicated(tiny_model, tmp_path):
    import shutil

    run_dir = make_run_dir(tmp_path, tiny_model, steps=(10, 2), seconds=(30.0, 5.0))
    shutil.copytree(tiny_model, run_dir / "checkpoint-12")  # no pods_clock.json yet: still being saved
    shutil.copytree(run_dir / "checkpoint-10", run_dir / "checkpoint-8.incomplete")  # set aside by a resume
    found = ev.find_checkpoints(run_dir)
    assert [c["name"] for c in found] == ["checkpoint-2", "checkpoint-10"]  # numeric, not lexical, order
    assert [c["train_seconds"] for c in found] == [5.0, 30.0]
    assert ev.is_run_dir(run_dir) and not ev.is_run_dir(run_dir / "checkpoint-2")
    with_base = ev.find_checkpoints(run_dir, include_base=True)
    assert with_base[0]["name"] == "base" and with_base[0]["step"] == 0


def test_evaluate_run_include_base(tiny_model, tmp_path):
    run_dir = make_run_dir(tmp_path, tiny_model, steps=(2,), seconds=(10.0,), final=False)
    results = ev.evaluate_run(run_dir, FakeTask(size=2), k=1, max_new_tokens=2, include_base=True,
                              verbose=False)
    assert [(r["checkpoint"], r["step"], r["train_seconds"]) for r in results] == [
        ("base", 0, 0.0), ("checkpoint-2", 2, 10.0)]


def test_cli_eval_run_dir_appends_skips_and_forces(tiny_model, tmp_path, fake_task_by_name, capsys):
    run_dir = make_run_dir(tmp_path, tiny_model)
    args = [str(run_dir), "--task", "fake", "--k", "2", "--max-new-tokens", "4", "--limit", "3",
            "--batch-size", "4", "--temperature", "1.0"]
    assert ev.main(args) == 0
    out = capsys.readouterr().out
    assert "checkpoint-2" in out and "checkpoint-4" in out and "accuracy" in out

    records = json.loads((run_dir / "eval.json").read_text())
    assert [r["checkpoint"] for r in records] == ["checkpoint-2", "checkpoint-4"]  # final deduplicated
    assert [(r["step"], r["train_seconds"]) for r in records] == [(2, 10.0), (4, 25.0)]
    for r in records:
        assert RECORD_FIELDS <= set(r)
        assert (r["task"], r["split"], r["k"], r["temperature"], r["num_problems"]) == ("fake", "test", 2, 1.0, 3)
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["pass_at_k"] <= 1 and 0 <= r["accuracy_stderr"] <= 1
        assert 1 <= r["mean_completion_tokens"] <= 4

    # Another k is another key: appended, the first results stay.
    assert ev.main([*args[:4], "3", *args[5:]]) == 0
    records2 = json.loads((run_dir / "eval.json").read_text())
    assert len(records2) == 4 and records2[:2] == records
    assert sorted(r["k"] for r in records2) == [2, 2, 3, 3]

    # Same settings again: skipped (records untouched); --force re-evaluates and replaces in place.
    assert ev.main(args) == 0
    assert json.loads((run_dir / "eval.json").read_text()) == records2
    assert ev.main([*args, "--force"]) == 0
    records3 = json.loads((run_dir / "eval.json").read_text())
    assert len(records3) == 4
    redone = [r for r in records3 if r["k"] == 2]
    assert all(new["evaluated_at"] > old["evaluated_at"] for new, old in zip(redone, records[:2]))
    assert not list(run_dir.glob(".eval.json.tmp*"))


def test_interrupted_run_keeps_earlier_results(tiny_model, tmp_path, monkeypatch):
    run_dir = make_run_dir(tmp_path, tiny_model)
    previous = {"checkpoint": "checkpoint-2", "task": "fake", "split": "test", "k": 9, "temperature": 0.5,
                "accuracy": 0.25}
    (run_dir / "eval.json").write_text(json.dumps([previous]))
    real_evaluate_model = ev.evaluate_model
    calls = []

    def crash_on_second(*args, **kwargs):
        calls.append(kwargs["name"])
        if len(calls) == 2:
            raise RuntimeError("simulated crash (e.g. out of memory)")
        return real_evaluate_model(*args, **kwargs)

    monkeypatch.setattr(ev, "evaluate_model", crash_on_second)
    settings = dict(k=2, max_new_tokens=3, limit=2, temperature=1.0, verbose=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        ev.evaluate_run(run_dir, FakeTask(), **settings)
    records = json.loads((run_dir / "eval.json").read_text())
    assert records[0] == previous  # never clobbered
    assert [(r["checkpoint"], r["k"]) for r in records] == [("checkpoint-2", 9), ("checkpoint-2", 2)]

    # Resuming evaluates only what is missing.
    monkeypatch.setattr(ev, "evaluate_model", real_evaluate_model)
    evaluated = []
    monkeypatch.setattr(ev, "evaluate_model", lambda *a, **kw: evaluated.append(kw["name"])
                        or real_evaluate_model(*a, **kw))
    results = ev.evaluate_run(run_dir, FakeTask(), **settings)
    assert evaluated == ["checkpoint-4"]
    assert [r["checkpoint"] for r in results] == ["checkpoint-2", "checkpoint-4"]
    assert len(json.loads((run_dir / "eval.json").read_text())) == 3


def test_cli_single_checkpoint_writes_to_its_run_dir(tiny_model, tmp_path, fake_task_by_name):
    run_dir = make_run_dir(tmp_path, tiny_model, final=False)
    assert ev.main([str(run_dir / "checkpoint-4"), "--task", "fake", "--k", "1", "--max-new-tokens", "2",
                    "--limit", "1"]) == 0
    records = json.loads((run_dir / "eval.json").read_text())
    assert [(r["checkpoint"], r["step"], r["accuracy_stderr"]) for r in records] == [("checkpoint-4", 4, None)]


def test_cli_refuses_corrupt_results_file(tiny_model, tmp_path, fake_task_by_name, capsys):
    run_dir = make_run_dir(tmp_path, tiny_model, final=False)
    (run_dir / "eval.json").write_text("{not json")
    assert ev.main([str(run_dir), "--task", "fake", "--k", "1", "--max-new-tokens", "2", "--limit", "1"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert (run_dir / "eval.json").read_text() == "{not json"


def test_cli_rejects_non_model_dir(tmp_path, fake_task_by_name, capsys):
    (tmp_path / "empty").mkdir()
    assert ev.main([str(tmp_path / "empty"), "--task", "fake"]) == 2
    assert "neither a run directory" in capsys.readouterr().err


def test_cli_with_registered_arithmetic_task(tiny_model, tmp_path, capsys):
    """The real task registry end to end: prompts from `arithmetic`, graded by its score()."""
    out = tmp_path / "results.json"
    assert ev.main([str(tiny_model), "--task", "arithmetic", "--task-arg", "digits=2", "--k", "2", "--limit", "2",
                    "--max-new-tokens", "4", "--out", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    assert (record["task"], record["task_args"], record["num_problems"]) == ("arithmetic", {"digits": 2}, 2)
    assert record["checkpoint"] == str(tiny_model.resolve())  # outside the results folder: absolute path
    assert 0.0 <= record["accuracy"] <= 1.0
    assert "<|user|>" in record["examples"][0]["prompt"]  # rendered with the chat template
    assert ev.main([str(tiny_model), "--task", "no-such-task", "--out", str(out)]) == 2
    assert "unknown task" in capsys.readouterr().err
