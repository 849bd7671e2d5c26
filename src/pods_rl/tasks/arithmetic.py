"""`arithmetic`: procedurally generated integer arithmetic, the task of the embedded tiny model.

Problems such as ``47+8-23``. A problem is in the test split iff a hash of its text falls in the lowest
``test_fraction`` of the hash range, so no seed or size can leak a test problem into train. The gold solution (the tiny
model's SFT target) reduces one operation at a time: ``<think>47+8=55,55-23=32</think><answer>32</answer>``."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace

from pods_rl.tasks import rewards
from pods_rl.tasks.base import Task

# Short on purpose: the tiny model is character-level, so every prompt character costs compute.
ARITHMETIC_SYSTEM_PROMPT = "Use <think></think><answer></answer>."

_VALID_OPS = ("+", "-", "*")


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def solve_steps(numbers: list[int], ops: list[str]) -> tuple[list[str], int]:
    """Reduce ``numbers[0] ops[0] numbers[1] ...`` one binary operation at a time, with the usual precedence.
    Returns (steps like ``"3*4=12"``, value)."""
    numbers, ops = list(numbers), list(ops)
    steps = []
    while ops:
        i = ops.index("*") if "*" in ops else 0
        value = _apply(ops[i], numbers[i], numbers[i + 1])
        steps.append(f"{numbers[i]}{ops[i]}{numbers[i + 1]}={value}")
        numbers[i : i + 2] = [value]
        del ops[i]
    return steps, numbers[0]


def in_test_split(question: str, test_fraction: float) -> bool:
    """Whether ``question`` belongs to the test split: its sha256 falls in the lowest ``test_fraction``."""
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:8], "big") < test_fraction * 2**64


def is_correct_fast(text: str, answer: str) -> bool:
    """``rewards.answers_match`` decided by exact numeric comparison only: for integer gold answers it
    rejects only symbolic forms (``2+3`` for ``5``), which should not be rewarded here. Linear time, no sympy."""
    return any(rewards.fast_match(candidate, answer) for candidate in rewards.candidate_answers(text))


def correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """TRL reward: 1.0 per completion (B,) whose final answer equals its gold integer ``answer`` (B,)."""
    if len(answer) != len(completions):
        raise ValueError(f"correctness_reward got {len(completions)} completions but {len(answer)} answers")
    return [1.0 if is_correct_fast(rewards.completion_text(c), str(a)) else 0.0
            for c, a in zip(completions, answer)]


@dataclass
class ArithmeticTask(Task):
    """Integer arithmetic problems, e.g. ``47+8-23``; difficulty set by ``digits``, ``operands``, ``ops``.

    Operands are drawn from [0, 10**digits); ``ops`` is a subset of ``"+-*"``; ``train_size`` / ``test_size``: rows
    ``load`` returns when ``limit`` is None; ``test_fraction``: share of the problem space (by hash) held out."""

    name: str = "arithmetic"
    system_prompt: str = ARITHMETIC_SYSTEM_PROMPT
    digits: int = 2
    operands: int = 2
    ops: str = "+-"
    seed: int = 0
    train_size: int = 15000
    test_size: int = 500
    test_fraction: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        if self.digits < 1 or self.operands < 2:
            raise ValueError(f"arithmetic needs digits >= 1 and operands >= 2, got {self.digits}, {self.operands}")
        if isinstance(self.ops, (list, tuple)):
            self.ops = "".join(self.ops)
        if not self.ops or any(op not in _VALID_OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")

    # --- problems -------------------------------------------------------------------------------------------
    def problem_space_size(self) -> int:
        """Number of distinct expressions (an upper bound on unique problems over both splits)."""
        return (10**self.digits) ** self.operands * len(self.ops) ** (self.operands - 1)

    def generate(self, split: str, size: int) -> list[dict]:
        """The first ``size`` unique problems of ``split`` (a prefix of a seeded stream): dicts with
        ``question``, ``answer`` and ``solution`` (the gold completion, for SFT)."""
        if split not in self.splits:
            raise ValueError(f"task {self.name!r} has no split {split!r}; use one of {list(self.splits)}")
        share = self.test_fraction if split == "test" else 1.0 - self.test_fraction
        available = int(self.problem_space_size() * share * 0.9)  # hash shares are approximate
        if size > available:
            raise ValueError(
                f"cannot draw {size} unique {split} problems from ~{available} (digits={self.digits}, "
                f"operands={self.operands}, ops={self.ops!r}); ask for fewer or raise digits/operands"
            )
        rng = random.Random(f"arithmetic-{self.seed}-{split}")
        want_test = split == "test"
        seen, problems = set(), []
        while len(problems) < size:
            numbers = [rng.randrange(10**self.digits) for _ in range(self.operands)]
            ops = [rng.choice(self.ops) for _ in range(self.operands - 1)]
            question = "".join(f"{n}{op}" for n, op in zip(numbers, ops)) + str(numbers[-1])
            if question in seen or in_test_split(question, self.test_fraction) != want_test:
                continue
            seen.add(question)
            steps, value = solve_steps(numbers, ops)
            problems.append({
                "question": question,
                "answer": str(value),
                "solution": f"<think>{','.join(steps)}</think><answer>{value}</answer>",
            })
        return problems

    def load(self, split: str = "train", limit: int | None = None):
        """As ``Task.load``, but the split grows to ``limit`` rows (a longer prefix of the same stream)."""
        size_field = {"train": "train_size", "test": "test_size"}.get(split)
        if size_field and isinstance(limit, int) and limit > getattr(self, size_field):
            return replace(self, **{size_field: limit}).load(split, limit)
        return super().load(split, limit)

    def _load_raw(self, split: str):
        """``split`` as a Dataset with columns ``question``, ``answer``, ``solution``."""
        from datasets import Dataset

        size = self.train_size if split == "train" else self.test_size
        return Dataset.from_list(self.generate(split, size))

    # --- rewards --------------------------------------------------------------------------------------------
    def is_correct(self, completion: str, answer: str, **extra) -> bool:
        """Whether the final answer of ``completion`` equals the integer ``answer`` (see ``is_correct_fast``)."""
        return is_correct_fast(rewards.completion_text(completion), str(answer))

    def reward_funcs(self):
        """As ``Task``'s, with exact numeric grading and no time bound (all checks are linear)."""
        return [correctness_reward, rewards.format_reward, rewards.tag_count_reward]

    def score(self, completion, answer: str, **extra) -> dict:
        """``{"correct": bool, "format": bool}`` for one completion (str or chat messages)."""
        text = rewards.completion_text(completion)
        return {"correct": is_correct_fast(text, str(answer)), "format": rewards.format_score(text) == 1.0}
