"""Task registry and loaders, on small data the tests write (no hub access)."""

import json
import subprocess
import sys

import pytest

from pods_rl.tasks import SYSTEM_PROMPT, Task, available_tasks, get_task, register_task
from pods_rl.tasks.gsm8k import gsm8k_gold

GSM8K_ROWS = [
    {
        "question": "Janet has 16 eggs and eats 3. How many are left?",
        "answer": "16 - 3 = <<16-3=13>>13\n#### 13",
    },
    {"question": "A shop sells 1,000 pens twice.", "answer": "1,000 * 2 = <<1000*2=2000>>2,000\n#### 2,000"},
    {"question": "Half of 48?", "answer": "48/2=<<48/2=24>>24\n#### 24"},
]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def gsm8k_dir(tmp_path):
    write_jsonl(tmp_path / "gsm8k" / "train.jsonl", GSM8K_ROWS)
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", GSM8K_ROWS[:1])
    return tmp_path / "gsm8k"


def answer(text):
    return f"<think>working</think> <answer>{text}</answer>"


# ---------------------------------------------------------------------------------------------------
# registry


def test_available_tasks_lists_the_contract_names():
    names = available_tasks()
    for name in (
        "gsm8k",
        "math",
        "math500",
        "amc23",
        "arithmetic",
        "jsonl:<path>",
        "reasoning_gym:<dataset_name>",
    ):
        assert name in names


def test_unknown_task_and_bad_arguments_raise_value_errors(gsm8k_dir):
    with pytest.raises(ValueError, match=r"unknown task 'gsm9k'.*gsm8k"):
        get_task("gsm9k")
    with pytest.raises(ValueError, match="needs an argument"):
        get_task("jsonl:")
    with pytest.raises(ValueError, match=r"unknown argument.*data_dir"):
        get_task("gsm8k", data_dri=str(gsm8k_dir))
    with pytest.raises(ValueError, match="prompt_style"):
        get_task("gsm8k", data_dir=str(gsm8k_dir), prompt_style="chatty")
    with pytest.raises(ValueError, match="reward_weights has 2 entries"):
        get_task("gsm8k", data_dir=str(gsm8k_dir), reward_weights=[1.0, 0.1])
    with pytest.raises(ValueError, match="register_task|name"):
        register_task("bad:name", Task)


def test_register_task_adds_a_factory(gsm8k_dir):
    register_task("my_gsm8k", lambda **kw: get_task("gsm8k", data_dir=str(gsm8k_dir), **kw))
    assert "my_gsm8k" in available_tasks()
    task = get_task("my_gsm8k", prompt_style="base")
    assert task.prompt_style == "base" and len(task.load("train")) == 3


def test_importing_tasks_is_lazy_and_does_not_shadow_stdlib_math():
    code = (
        "import sys, math; import pods_rl.tasks as t; "
        "assert 'pods_rl.tasks.arithmetic' not in sys.modules and 'reasoning_gym' not in sys.modules; "
        "assert math.sqrt(4) == 2; t.get_task('arithmetic'); assert 'pods_rl.tasks.arithmetic' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_arithmetic_is_registered_and_subclasses_task():
    task = get_task("arithmetic")
    assert isinstance(task, Task)
    assert len(task.reward_weights) == len(task.reward_funcs())


# ---------------------------------------------------------------------------------------------------
# gsm8k


def test_gsm8k_gold_extraction():
    assert gsm8k_gold("a <<48/2=24>>24\n#### 72") == "72"
    assert gsm8k_gold("x\n#### 1,018") == "1018"
    with pytest.raises(ValueError, match="####"):
        gsm8k_gold("no final line")


def test_gsm8k_loader_instruct_and_base(gsm8k_dir):
    task = get_task("gsm8k", data_dir=str(gsm8k_dir))
    ds = task.load("train")
    assert ds["answer"] == ["13", "2000", "24"]
    assert {"prompt", "question", "answer", "solution"} <= set(ds.column_names)
    prompt = ds[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert prompt[0]["content"] == SYSTEM_PROMPT and prompt[1]["content"] == GSM8K_ROWS[0]["question"]
    assert len(task.load("train", limit=2)) == 2 and len(task.load("test")) == 1

    base = get_task("gsm8k", data_dir=str(gsm8k_dir), prompt_style="base").load("train")
    assert isinstance(base[0]["prompt"], str)
    assert GSM8K_ROWS[0]["question"] in base[0]["prompt"] and base[0]["prompt"].endswith("Assistant:")


def test_gsm8k_rewards_and_score(gsm8k_dir):
    task = get_task("gsm8k", data_dir=str(gsm8k_dir), reward_weights=(1.0, 0.5, 0.0))
    funcs = task.reward_funcs()
    assert [f.__name__ for f in funcs] == ["correctness_reward", "format_reward", "tag_count_reward"]
    assert task.reward_weights == [1.0, 0.5, 0.0]
    ds = task.load("train")
    completions = [
        [{"role": "assistant", "content": answer("13")}],
        [{"role": "assistant", "content": "2000"}],
    ]
    results = [f(ds["prompt"][:2], completions, answer=ds["answer"][:2]) for f in funcs]
    assert results == [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    assert task.score(answer("24"), "24") == {"correct": True, "format": True}
    assert task.score("24", "24") == {"correct": True, "format": False}
    assert task.score(answer("25"), "24") == {"correct": False, "format": True}


def test_gsm8k_errors(tmp_path, gsm8k_dir):
    task = get_task("gsm8k", data_dir=str(gsm8k_dir))
    with pytest.raises(ValueError, match=r"no split 'validation'.*train"):
        task.load("validation")
    with pytest.raises(ValueError, match="limit"):
        task.load("train", limit=0)
    write_jsonl(tmp_path / "empty" / "train.jsonl", [])
    with pytest.raises(ValueError, match="empty"):
        get_task("gsm8k", data_dir=str(tmp_path / "empty")).load("train")
    with pytest.raises(ValueError, match="test.jsonl"):
        get_task("gsm8k", data_dir=str(tmp_path / "empty")).load("test")
    write_jsonl(tmp_path / "bad" / "train.jsonl", [{"prompt": "q", "answer": "#### 1"}])
    with pytest.raises(ValueError, match="'question'"):
        get_task("gsm8k", data_dir=str(tmp_path / "bad")).load("train")
    (tmp_path / "bad" / "test.jsonl").write_text('{"question": "q"\n')
    with pytest.raises(ValueError, match="test.jsonl:1 is not valid JSON"):
        get_task("gsm8k", data_dir=str(tmp_path / "bad")).load("test")


def test_gsm8k_hub_offline_gives_actionable_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match="data_dir="):
        get_task("gsm8k").load("test")


# ---------------------------------------------------------------------------------------------------
# MATH, MATH-500, AMC23

MATH_ROWS = [
    {
        "problem": "Compute $1/2 + 1/4$.",
        "solution": "It is $\\boxed{\\frac{3}{4}}$.",
        "level": "Level 1",
        "type": "Algebra",
    },
    {
        "problem": "Find x.",
        "solution": "First \\boxed{2}, then finally \\fbox{\\sqrt{\\frac{1}{2}}}",
        "level": "Level 5",
        "type": "Algebra",
    },
]


def test_math_loader_jsonl_and_original_layout(tmp_path):
    write_jsonl(tmp_path / "math" / "train.jsonl", MATH_ROWS)
    task = get_task("math", data_dir=str(tmp_path / "math"))
    ds = task.load("train")
    assert ds["answer"] == ["\\frac{3}{4}", "\\sqrt{\\frac{1}{2}}"]
    assert ds["subject"] == ["Algebra", "Algebra"] and ds["level"] == ["Level 1", "Level 5"]
    assert task.score(answer("0.75"), ds["answer"][0])["correct"]
    assert not task.score(answer("0.5"), ds["answer"][0])["correct"]

    for i, row in enumerate(MATH_ROWS):  # the original release: {split}/{subject}/{id}.json
        path = tmp_path / "MATH" / "test" / "algebra" / f"{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row))
    assert get_task("math", data_dir=str(tmp_path / "MATH")).load("test")["answer"] == ds["answer"]

    write_jsonl(tmp_path / "nobox" / "train.jsonl", [{"problem": "p", "solution": "no box here"}])
    with pytest.raises(ValueError, match="boxed"):
        get_task("math", data_dir=str(tmp_path / "nobox")).load("train")


def test_math500_and_amc23_loaders(tmp_path):
    write_jsonl(
        tmp_path / "m500" / "test.jsonl", [{"problem": "p", "solution": "\\boxed{9}", "answer": "(3, 4)"}]
    )
    m500 = get_task("math500", data_dir=str(tmp_path / "m500"))
    assert m500.load("test")["answer"] == ["(3, 4)"]  # an explicit answer wins over the solution's box
    with pytest.raises(ValueError, match="no split 'train'"):
        m500.load("train")

    write_jsonl(
        tmp_path / "amc" / "test.jsonl",
        [{"id": 0, "question": "q", "answer": 27.0}, {"question": "r", "answer": 0.5}],
    )
    amc = get_task("amc23", data_dir=str(tmp_path / "amc"))
    ds = amc.load("test")
    assert ds["answer"] == ["27", "0.5"] and ds["question"] == ["q", "r"]
    assert amc.score(answer("27"), "27")["correct"] and amc.score(answer("\\frac12"), "0.5")["correct"]


# ---------------------------------------------------------------------------------------------------
# jsonl:<path>


def test_jsonl_file_and_directory(tmp_path):
    path = write_jsonl(
        tmp_path / "mine.jsonl", [{"question": "2+2?", "answer": 4}, {"prompt": "3+3?", "answer": "6"}]
    )
    task = get_task(f"jsonl:{path}")
    ds = task.load("train")
    assert ds["question"] == ["2+2?", "3+3?"] and ds["answer"] == ["4", "6"]
    assert task.name == f"jsonl:{path}"
    with pytest.raises(ValueError, match="single file"):
        task.load("test")

    write_jsonl(tmp_path / "dir" / "train.jsonl", [{"question": "a", "answer": "1"}])
    write_jsonl(tmp_path / "dir" / "test.jsonl", [{"question": "b", "answer": "2"}])
    task = get_task(f"jsonl:{tmp_path / 'dir'}", prompt_style="base")
    assert set(task.splits) == {"train", "test"}
    assert task.load("test")["question"] == ["b"] and isinstance(task.load("test")["prompt"][0], str)
    with pytest.raises(ValueError, match=r"no split 'dev'"):
        task.load("dev")


def test_jsonl_errors(tmp_path):
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        get_task(f"jsonl:{tmp_path / 'missing.jsonl'}")
    path = write_jsonl(tmp_path / "noanswer.jsonl", [{"question": "q", "gold": "1"}])
    with pytest.raises(ValueError, match=r"'answer'.*rename"):
        get_task(f"jsonl:{path}").load("train")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(ValueError, match="no \\*.jsonl"):
        get_task(f"jsonl:{tmp_path / 'emptydir'}")


# ---------------------------------------------------------------------------------------------------
# reasoning_gym:<name>


def test_reasoning_gym_task_uses_its_own_scorer():
    task = get_task("reasoning_gym:basic_arithmetic", size=6, test_size=4, seed=1)
    train, test = task.load("train"), task.load("test")
    assert len(train) == 6 and len(test) == 4
    assert train["question"][:4] != test["question"]  # train and test come from different seeds
    assert task.load("train")["question"] == train["question"]  # deterministic

    correctness = task.reward_funcs()[0]
    completions = [answer(a) for a in test["answer"]]
    completions[1] = answer("not a number")
    scores = correctness(
        test["prompt"],
        completions,
        answer=test["answer"],
        rg_split=test["rg_split"],
        rg_index=test["rg_index"],
    )
    assert scores == [1.0, 0.0, 1.0, 1.0]
    assert task.score(completions[0], test["answer"][0], rg_split="test", rg_index=0)["correct"]


def test_reasoning_gym_errors():
    with pytest.raises(ValueError, match=r"unknown reasoning-gym dataset 'nope'.*basic_arithmetic"):
        get_task("reasoning_gym:nope")
    with pytest.raises(ValueError, match="size"):
        get_task("reasoning_gym:basic_arithmetic", size=0)
    with pytest.raises(ValueError, match="could not create"):
        get_task("reasoning_gym:basic_arithmetic", size=2, config={"bogus": 1}).load("train")
