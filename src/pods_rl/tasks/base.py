"""The Task interface: what a task knows (data, prompts, gold answers, rewards), and nothing of training."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The paper's instruct-style system prompt (R1-style reasoning then answer tags).
SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>."
)


@dataclass
class Task:
    """A verifiable-reward task.

    Subclasses implement ``_load_raw(split)`` returning a ``datasets.Dataset`` with at least the
    columns ``question`` (str) and ``answer`` (str, the gold final answer); ``load`` adds the
    ``prompt`` column that TRL's GRPOTrainer consumes.

    Attributes:
        name: registry name, e.g. ``"gsm8k"``.
        prompt_style: ``"instruct"`` (chat messages with ``system_prompt``) or ``"base"`` (plain text).
        system_prompt: the system message used in instruct style.
        reward_weights: weights of (correctness, format, tag_count) rewards.
    """

    name: str = "task"
    prompt_style: str = "instruct"
    system_prompt: str = SYSTEM_PROMPT
    reward_weights: tuple[float, ...] = (1.0, 0.1, 0.1)
    splits: tuple[str, ...] = field(default=("train", "test"))

    def _load_raw(self, split: str):  # pragma: no cover - abstract
        raise NotImplementedError

    def load(self, split: str = "train", limit: int | None = None):
        """Load ``split`` as a ``datasets.Dataset`` with columns ``prompt``, ``question``, ``answer``."""
        raise NotImplementedError

    def reward_funcs(self) -> list[Callable]:
        """Reward functions with TRL's signature ``f(prompts, completions, answer, **kw) -> list[float]``."""
        raise NotImplementedError

    def is_correct(self, completion: str, answer: str) -> bool:
        """Whether a completion's final answer matches the gold ``answer``."""
        raise NotImplementedError
