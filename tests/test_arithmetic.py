"""The `arithmetic` task: disjoint splits, determinism, correct gold answers, rewards."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest

from pods_rl.tasks import get_task
from pods_rl.tasks.arithmetic import ArithmeticTask, correctness_reward, in_test_split, solve_steps


def test_registry_builds_arithmetic():
    task = get_task("arithmetic", digits=1, operands=3)
    assert isinstance(task, ArithmeticTask)
    assert (task.digits, task.operands) == (1, 3)


def test_splits_never_overlap_and_respect_the_hash_partition():
    task = ArithmeticTask(digits=2, operands=2, train_size=5000, test_size=500)
    train = set(task.load("train")["question"])
    test = set(task.load("test")["question"])
    assert len(train) == 5000 and len(test) == 500  # unique within each split
    assert not train & test
    assert all(in_test_split(q, task.test_fraction) for q in test)
    assert not any(in_test_split(q, task.test_fraction) for q in train)
    # The partition depends only on the problem, so no other seed can leak a test problem into train.
    other_seed_train = set(ArithmeticTask(seed=7, train_size=5000).load("train")["question"])
    assert not other_seed_train & test


def test_deterministic_given_seed_and_limit_is_a_prefix():
    a = ArithmeticTask(seed=3, train_size=300).load("train")
    b = ArithmeticTask(seed=3, train_size=300).load("train")
    c = ArithmeticTask(seed=4, train_size=300).load("train")
    assert a["question"] == b["question"] and a["answer"] == b["answer"]
    assert a["question"] != c["question"]
    assert ArithmeticTask(seed=3, train_size=300).load("train", limit=50)["question"] == a["question"][:50]


@pytest.mark.parametrize("ops,operands,digits", [("+-", 2, 2), ("+-*", 4, 2), ("*", 3, 1), ("-", 2, 3)])
def test_gold_answers_and_solutions_are_right(ops, operands, digits):
    task = ArithmeticTask(digits=digits, operands=operands, ops=ops, train_size=200, test_size=50)
    for split in ("train", "test"):
        for row in task.load(split):
            assert int(row["answer"]) == eval(row["question"])  # Python's precedence == ours
            assert row["solution"].endswith(f"<answer>{row['answer']}</answer>")
            assert task.score(row["solution"], row["answer"]) == {"correct": True, "format": True}
            assert len(row["question"].replace("+", " ").replace("-", " ").replace("*", " ").split()) == operands


def test_solve_steps_respects_precedence():
    steps, value = solve_steps([2, 3, 4, 5], ["+", "*", "-"])
    assert steps == ["3*4=12", "2+12=14", "14-5=9"] and value == 9


def test_prompts_are_chat_messages_or_text():
    row = ArithmeticTask(train_size=10).load("train", limit=1)[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"] == row["question"]
    assert "<answer>" in row["prompt"][0]["content"]
    base = ArithmeticTask(prompt_style="base", train_size=10).load("train", limit=1)[0]
    assert isinstance(base["prompt"], str) and row["question"] in base["prompt"]


def test_rewards_on_right_wrong_and_malformed_completions():
    task = ArithmeticTask()
    correctness, fmt, tags = task.reward_funcs()
    completions = [
        "<think>47+8=55</think><answer>55</answer>",  # right, well formed
        "<think>47+8=54</think><answer>54</answer>",  # wrong, well formed
        "<think>47+8=55</think>55",  # right number, no answer tags
        "<answer>55</answer><answer>7</answer>",  # last answer block counts: wrong, malformed
        "garbage",
        "",
    ]
    chat = [[{"role": "assistant", "content": c}] for c in completions]  # TRL's conversational form
    answers = ["55"] * len(completions)
    assert correctness(None, chat, answers) == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert fmt(None, chat, answer=answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert tags(None, chat, answer=answers) == [1.0, 1.0, 0.5, 0.0, 0.0, 0.0]
    assert correctness(None, ["<answer>-3</answer>"], ["-3"]) == [1.0]
    assert task.reward_weights == [1.0, 0.1, 0.1]
    with pytest.raises(ValueError, match="answers"):
        correctness_reward(None, completions, ["55"])


def test_fast_correctness_agrees_with_the_generic_math_verify_grader():
    from pods_rl.tasks import rewards

    for text, gold in [("<answer>55</answer>", "55"), ("<answer> -12 </answer>", "-12"), ("<answer>5</answer>", "55"),
                       ("<think>1</think><answer>1,234</answer>", "1234"), ("no tags 17", "17"), ("x", "3")]:
        assert ArithmeticTask().is_correct(text, gold) == rewards.answers_match(text, gold)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="ops"):
        ArithmeticTask(ops="/")
    with pytest.raises(ValueError, match="operands"):
        ArithmeticTask(operands=1)
    with pytest.raises(ValueError, match="unique"):
        ArithmeticTask(digits=1, operands=2, ops="+").load("train")  # only 100 problems exist
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask().load("validation")


def test_limit_beyond_the_split_size_grows_the_split_and_keeps_its_prefix():
    task = ArithmeticTask(seed=3, test_size=40)
    small, large = task.load("test"), task.load("test", limit=90)
    assert len(small) == 40 and len(large) == 90 and task.test_size == 40  # the task itself is unchanged
    assert large["question"][:40] == small["question"]
    assert len(set(large["question"])) == 90
    assert not set(large["question"]) & set(ArithmeticTask(seed=3, train_size=2000).load("train")["question"])
