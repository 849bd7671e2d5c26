"""`reasoning_gym:<name>`: any reasoning-gym procedural dataset, generated offline, graded by its own scorer.
Test uses ``seed + TEST_SEED_OFFSET``: an independent draw, so small problem spaces may overlap train."""

from __future__ import annotations

from dataclasses import dataclass, field

from pods_rl.tasks import rewards
from pods_rl.tasks.base import Task

TEST_SEED_OFFSET = 1_000_003


def _import_reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as err:
        raise ValueError(
            'reasoning_gym tasks need the reasoning-gym package: pip install -e ".[gym]" in a clone of pods-rl'
        ) from err
    return reasoning_gym


@dataclass
class ReasoningGymTask(Task):
    """A reasoning-gym dataset (``dataset_name``, e.g. ``"chain_sum"``) as a Task.

    ``size`` / ``test_size`` problems; ``config``: the dataset's config options. Columns: ``question``, ``answer``,
    and ``rg_split`` / ``rg_index`` (the generated entry, for the dataset's scorer)."""

    dataset_name: str = ""
    size: int = 1000
    test_size: int | None = None
    seed: int = 0
    config: dict = field(default_factory=dict)
    name: str = "reasoning_gym"
    extra_reward_columns: tuple[str, ...] = ("rg_split", "rg_index")
    _datasets: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        rg = _import_reasoning_gym()
        from reasoning_gym.factory import DATASETS

        if self.dataset_name not in DATASETS:
            raise ValueError(
                f"unknown reasoning-gym dataset {self.dataset_name!r}; available: {sorted(DATASETS)}"
            )
        for key, value in (("size", self.size), ("test_size", self.test_size or self.size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive int, got {value!r}")
        self.name = f"reasoning_gym:{self.dataset_name}"
        self._rg = rg
        super().__post_init__()

    def dataset(self, split: str):
        """The (cached) reasoning-gym ProceduralDataset behind ``split``."""
        if split not in self.splits:
            raise ValueError(f"task {self.name!r} has no split {split!r}; use one of {list(self.splits)}")
        if split not in self._datasets:
            size = self.size if split == "train" else (self.test_size or self.size)
            seed = self.seed if split == "train" else self.seed + TEST_SEED_OFFSET
            try:
                self._datasets[split] = self._rg.create_dataset(
                    self.dataset_name, size=size, seed=seed, **self.config
                )
            except (TypeError, ValueError, AssertionError) as err:
                raise ValueError(
                    f"could not create reasoning-gym dataset {self.dataset_name!r} "
                    f"with config {self.config}: {err}"
                ) from err
        return self._datasets[split]

    def _load_raw(self, split: str):
        import datasets

        data = self.dataset(split)
        rows = [
            {
                "question": str(entry["question"]),
                "answer": str(entry["answer"]),
                "rg_split": split,
                "rg_index": i,
            }
            for i, entry in enumerate(data)
        ]
        return datasets.Dataset.from_list(rows)

    def answer_extractor(self):
        """None: reasoning-gym's scorers judge answers that equal strings cannot (orderings, sets, formats)."""
        return None

    def is_correct(
        self, completion: str, answer: str, rg_split: str | None = None, rg_index: int | None = None, **extra
    ) -> bool:
        """The dataset's ``score_answer`` on the ``<answer>`` block (else the text) == 1; rows not
        from ``load`` fall back to ``answers_match``."""
        if rg_split is None or rg_index is None:
            return rewards.answers_match(completion, answer)  # time-bounded on any thread (model text)
        data = self.dataset(rg_split)
        entry = data[int(rg_index)]
        block = rewards.extract_answer_block(completion)
        candidate = block if block is not None else completion.strip()
        return float(data.score_answer(candidate, entry)) >= 1.0
