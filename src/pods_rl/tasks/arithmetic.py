"""`arithmetic`: procedurally generated integer arithmetic, the task of the embedded tiny model.

Problems are expressions such as ``47+8-23`` over ``operands`` non-negative integers of at most ``digits``
digits joined by ``ops``. Train and test never overlap: a problem belongs to the test split iff a hash of its
text falls in the lowest ``test_fraction`` of the hash range, independently of the seed, so no seed or size
can leak a test problem into train. Each split is deterministic given ``seed``.

The gold worked solution (used to SFT the tiny model) reduces the expression one binary operation at a time,
multiplications first, then left to right: ``<think>47+8=55,55-23=32</think><answer>32</answer>``.
"""

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
    """Reduce ``numbers[0] ops[0] numbers[1] ...`` one binary operation at a time.

    Multiplications first (leftmost first), then additions/subtractions left to right, i.e. the usual
    precedence. Returns (steps like ``"3*4=12"``, value).
    """
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
    """The project's correctness rule (``rewards.answers_match``: the ``<answer>`` block, last ``\\boxed``,
    whole text, then last number) decided by exact numeric comparison only. For integer gold answers
    math_verify cannot accept anything this rejects except symbolic forms (``2+3`` for ``5``), which a
    model should not be rewarded for here anyway. Linear time, no sympy: cheap enough for a CPU loop."""
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

    Attributes:
        digits: each operand is drawn uniformly from [0, 10**digits).
        operands: how many numbers per expression (>= 2).
        ops: operators to draw from, a subset of ``"+-*"``.
        seed: makes each split deterministic (train and test use different streams).
        train_size, test_size: rows returned by ``load`` when ``limit`` is None.
        test_fraction: share of the problem space (by hash) reserved for the test split.
    """

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
        """The first ``size`` unique problems of ``split`` (a prefix of a fixed, seeded stream).

        Each problem is a dict with ``question`` (``"47+8-23"``), ``answer`` (``"32"``) and ``solution``
        (the gold worked completion, for SFT).
        """
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
        """As ``Task.load``, but a procedural split grows to ``limit`` rows when more are asked than
        ``train_size`` / ``test_size``; the first rows stay the same (a longer prefix of the same stream)."""
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
        """(correctness, format, tag_count), as in ``Task`` but with exact numeric grading and no time bound
        (every check here is linear in the completion length)."""
        return [correctness_reward, rewards.format_reward, rewards.tag_count_reward]

    def score(self, completion, answer: str, **extra) -> dict:
        """``{"correct": bool, "format": bool}`` for one completion (str or chat messages)."""
        text = rewards.completion_text(completion)
        return {"correct": is_correct_fast(text, str(answer)), "format": rewards.format_score(text) == 1.0}
