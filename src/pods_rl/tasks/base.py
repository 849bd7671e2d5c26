"""The Task interface: what a task knows (data, prompts, gold answers, rewards), and nothing of training."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from pods_rl.tasks import rewards
from pods_rl.tasks.extraction import final_answer

# The paper's instruct-style system prompt (R1-style reasoning then answer tags).
SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>."
)

PROMPT_STYLES = ("instruct", "base")
# The longest data row (a JSONL line, a question or an answer) a task loads, in bytes: 512 KiB is about 128k tokens
# of text, beyond any context these models train with. A longer row is a data fault (a file pasted into a field, a
# runaway generator) that would otherwise surface as an allocation failure deep in the tokenizer.
DEFAULT_MAX_ROW_BYTES = 512 * 1024


def row_too_long(where: str, max_row_bytes: int, size: str = "") -> str:
    """The message for a row over the bound: ``where`` (file:line, or task/split/row) and the ways on."""
    return (f"{where} is a row of more than {max_row_bytes} bytes{size} (the limit, max_row_bytes): fix or remove "
            "that row, or raise the limit (pods train --max_row_bytes N, or the task option max_row_bytes=N)")


def with_weights(funcs: list[Callable], weights) -> list[Callable]:
    """``funcs``, each wrapped to carry its weight as ``reward_weight`` (same ``__name__``): whoever gets
    the functions gets the objective too (``PODSTrainer`` uses it when ``reward_weights`` is not set)."""
    weights = list(weights)
    if len(weights) != len(funcs):  # Task.__post_init__ reports the mismatch
        return funcs

    def weighted(func, weight):
        @functools.wraps(func)
        def reward(*args, **kwargs):
            return func(*args, **kwargs)

        reward.reward_weight = float(weight)
        return reward

    return [weighted(f, w) for f, w in zip(funcs, weights)]


@dataclass
class Task:
    """A verifiable-reward task.

    Subclasses implement ``_load_raw(split)`` -> a ``datasets.Dataset`` with ``question`` and ``answer`` (the gold
    final answer); ``load`` checks it and adds the ``prompt`` column TRL consumes. To change how correctness is
    judged, override ``is_correct`` (listing the columns it needs in ``extra_reward_columns``).

    ``prompt_style``: ``"instruct"`` (chat messages) or ``"base"`` (plain text). ``reward_weights``: of
    ``reward_funcs()``, same order. ``grading_timeout_s`` / ``grading_batch_timeout_s``: bounds per completion / per
    batch (``rewards``). ``max_row_bytes``: the longest row ``load`` accepts (None: no bound)."""

    name: str = "task"
    prompt_style: str = "instruct"
    system_prompt: str = SYSTEM_PROMPT
    reward_weights: list[float] | tuple[float, ...] = (1.0, 0.1, 0.1)
    grading_timeout_s: float = rewards.DEFAULT_TIMEOUT_S
    grading_batch_timeout_s: float = rewards.DEFAULT_BATCH_TIMEOUT_S
    splits: tuple[str, ...] = ("train", "test")
    extra_reward_columns: tuple[str, ...] = ()
    max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES

    def __init_subclass__(cls, **kwargs):
        # A task that defines its own reward_funcs gets its weights attached too (see with_weights).
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("reward_funcs")
        if own is not None and not getattr(own, "attaches_weights", False):
            @functools.wraps(own)
            def reward_funcs(self):
                return with_weights(own(self), self.reward_weights)

            reward_funcs.attaches_weights = True
            cls.reward_funcs = reward_funcs

    def __post_init__(self) -> None:
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {self.prompt_style!r}")
        try:
            self.reward_weights = [float(w) for w in self.reward_weights]
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"reward_weights must be a sequence of numbers, got {self.reward_weights!r}"
            ) from err
        bound = self.max_row_bytes
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
            raise ValueError(f"max_row_bytes must be a positive number of bytes (or None: no bound), got {bound!r}")
        for key in ("grading_timeout_s", "grading_batch_timeout_s"):
            if not getattr(self, key) or getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0 seconds, got {getattr(self, key)!r}")
        n_funcs = len(self.reward_funcs())
        if len(self.reward_weights) != n_funcs:
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} entries but task {self.name!r} has "
                f"{n_funcs} reward functions ({[f.__name__ for f in self.reward_funcs()]}); pass one weight each"
            )

    # ------------------------------------------------------------------------------------------------
    # data

    def _load_raw(self, split: str):  # pragma: no cover - abstract
        """Return split ``split`` as a ``datasets.Dataset`` with ``question`` and ``answer`` columns."""
        raise NotImplementedError

    def format_prompt(self, question: str):
        """The model input for one question: chat messages (instruct) or a plain string (base)."""
        if self.prompt_style == "instruct":
            return [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": question},
            ]
        # Base models: a plain-text dialogue whose last line cues the assistant to answer.
        return f"{self.system_prompt}\nUser: {question}\nAssistant:"

    def load(self, split: str = "train", limit: int | None = None):
        """``split`` (its first ``limit`` rows) as a ``datasets.Dataset`` with ``prompt``, ``question``, ``answer``."""
        if split not in self.splits:
            raise ValueError(f"task {self.name!r} has no split {split!r}; use one of {list(self.splits)}")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit must be a positive int or None, got {limit!r}")
        dataset = self._load_raw(split)
        for column in ("question", "answer"):
            if column not in dataset.column_names:
                raise ValueError(
                    f"task {self.name!r} split {split!r} has no {column!r} column (columns: "
                    f"{dataset.column_names}); rename your field to {column!r}"
                )
        if len(dataset) == 0:
            raise ValueError(f"task {self.name!r} split {split!r} is empty; check the data source")
        if limit is not None and limit < len(dataset):
            dataset = dataset.select(range(limit))
        self._check_row_sizes(dataset, split)
        for row, gold in enumerate(dataset["answer"], start=1):
            # Loaders that read files name the file and line already; this catches every other source.
            if not isinstance(gold, str) or not gold.strip():
                what = "empty" if isinstance(gold, str) else f"a {type(gold).__name__} ({gold!r:.60}), not a string"
                raise ValueError(f"task {self.name!r} split {split!r} row {row}: the gold answer is {what}, so no "
                                 "completion could match it (every correctness reward 0): fix the task's data")
        if "prompt" in dataset.column_names:
            dataset = dataset.remove_columns("prompt")
        prompts = [self.format_prompt(q) for q in dataset["question"]]
        return dataset.add_column("prompt", prompts)

    def _check_row_sizes(self, dataset, split: str) -> None:
        """Every text field of every row within ``max_row_bytes``, whatever loaded it."""
        bound = self.max_row_bytes
        if not bound:
            return
        for column in dataset.column_names:
            for row, value in enumerate(dataset[column], start=1):
                # len(str) <= bytes <= 4 len(str): the exact size is measured only near the bound
                if isinstance(value, str) and len(value) * 4 > bound and len(value.encode("utf-8", "replace")) > bound:
                    raise ValueError(row_too_long(f"task {self.name!r} split {split!r} row {row}", bound,
                                                  f" (its {column} is {len(value.encode('utf-8', 'replace'))} bytes)"))

    # ------------------------------------------------------------------------------------------------
    # rewards

    def is_correct(self, completion: str, answer: str, **extra) -> bool:
        """Whether a completion's final answer matches the gold ``answer`` (unbounded; callers bound it)."""
        return rewards.answers_match_unbounded(completion, answer)

    def reward_funcs(self) -> list[Callable]:
        """TRL reward functions (correctness, format, tag_count; unweighted scores in [0, 1]), each carrying its
        ``reward_weight``: ``PODSTrainer(reward_funcs=task.reward_funcs(), ...)`` optimizes what `pods train` does."""
        # The default grader goes through ``answers_match``, which also bounds time off the main thread.
        is_correct = None if type(self).is_correct is Task.is_correct else self.is_correct
        correctness = rewards.make_correctness_reward(
            is_correct, timeout_s=self.grading_timeout_s, extra_columns=self.extra_reward_columns,
            batch_timeout_s=self.grading_batch_timeout_s,
        )
        return with_weights([correctness, rewards.format_reward, rewards.tag_count_reward], self.reward_weights)

    reward_funcs.attaches_weights = True

    def answer_extractor(self) -> Callable[[str], str | None] | None:
        """``fn(completion text) -> its final answer or None``, compared as strings to other completions' and to the
        gold ``answer`` (C-GRPO's prediction sets); None for a task whose answers strings cannot compare."""
        return final_answer

    def score(self, completion, answer: str, **extra) -> dict:
        """Evaluation scores of one completion (str or chat messages): ``{"correct": bool, "format": bool}``."""
        text = rewards.completion_text(completion)
        if type(self).is_correct is Task.is_correct:
            correct = rewards.answers_match(text, answer, timeout_s=self.grading_timeout_s)
        else:
            correct = rewards.call_with_time_limit(
                self.is_correct, text, answer, timeout_s=self.grading_timeout_s, default=False, **extra
            )
        return {"correct": bool(correct), "format": rewards.format_score(text) == 1.0}
