"""C-GRPO's run, once for every engine: its inputs checked (``check_calibration_inputs``, in the engine's spelling)
and ``CGRPORun`` (the calibration, the stop rule after a round), which ``RolloutBudget`` holds and speaks for to the
engines; the planner's math is ``planners/cgrpo.py``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from pods_rl.budget.ledger import prompt_key
from pods_rl.budget.planners.base import CONFIG_NAMES
from pods_rl.budget.planners.cgrpo import CGRPO, CGRPOSettings, encode_answers

__all__ = ["CGRPORun", "CalibrationSet", "check_calibration_inputs"]


@dataclass(frozen=True)
class CalibrationSet:
    """C-GRPO's calibration rows and answer extractor ``fn(text) -> answer or None``, checked (none again after)."""

    rows: list[dict]
    answer_extractor: Callable


def check_calibration_inputs(settings: CGRPOSettings | None, calibration_dataset, answer_extractor, train_dataset,
                             *, environment: bool = False,
                             names: Mapping[str, str] | None = None) -> CalibrationSet | None:
    """C-GRPO's inputs checked, one line each in the spelling ``names``: ``settings`` (None: no C-GRPO, no inputs),
    no environment, an answer extractor, calibration prompts (a map-style dataset or list of dicts: ``prompt``, the
    gold answer column; none of ``train_dataset``'s). Returns them checked (a ``CalibrationSet``: as it is)."""
    names = CONFIG_NAMES if names is None else names
    planner, data, extractor = (f"{names['rollout_planner']}='cgrpo'", names["calibration_dataset"],
                                names["answer_extractor"])
    if settings is None:
        if calibration_dataset is not None or answer_extractor is not None:
            raise ValueError(f"{data} and {extractor} are C-GRPO's: set {planner}, or drop them")
        return None
    if environment:
        raise ValueError(f"{planner} does not support environment_factory or tools: the stop rule reads one answer "
                         "per completion; drop them, or the planner")
    if settings.score != "aps":
        raise ValueError(f"{planner} with score={settings.score!r} needs a verifier per completion, which the engines "
                         f"do not take yet: use score='aps' with {extractor}")
    if isinstance(calibration_dataset, CalibrationSet):
        return calibration_dataset
    if answer_extractor is None:
        raise ValueError(f"{planner} (score='aps') compares the answers of a prompt's completions: pass {extractor}="
                         "fn(text) -> answer or None (pods train: a task with an answer extractor)")
    if calibration_dataset is None:
        raise ValueError(f"{planner} calibrates its thresholds on held-out prompts: pass {data}= (prompts with a "
                         "gold answer column, none of them in train_dataset)")
    if isinstance(calibration_dataset, list):
        rows = [dict(row) for row in calibration_dataset]
    elif hasattr(calibration_dataset, "column_names") and hasattr(calibration_dataset, "__len__"):
        rows = [calibration_dataset[i] for i in range(len(calibration_dataset))]
    else:
        raise ValueError(f"{data} must be a map-style datasets.Dataset or a list of dicts, got "
                         f"{type(calibration_dataset).__name__}")
    if not rows:
        raise ValueError(f"{data} is empty: C-GRPO needs held-out prompts to calibrate on")
    for column in ("prompt", settings.calibration_answer_column):
        if any(column not in row for row in rows):
            raise ValueError(f"{data} has no {column!r} column" + (
                f" (set calibration_answer_column in {names['rollout_planner_args']})" if column != "prompt" else ""))
    if train_dataset is not None and hasattr(train_dataset, "column_names") and "prompt" in train_dataset.column_names:
        training = {prompt_key(prompt) for prompt in train_dataset["prompt"]}
        overlap = [i for i, row in enumerate(rows) if prompt_key(row["prompt"]) in training]
        if overlap:
            raise ValueError(f"{data} shares {len(overlap)} of its {len(rows)} prompts with the training set (the "
                             f"first: row {overlap[0]}): the conformal thresholds need held-out prompts; drop those "
                             "rows from one of them")
    return CalibrationSet(rows, answer_extractor)


class CGRPORun:
    """C-GRPO's part of a run: the planner, the calibration set, the engine's ``text(completion) -> str``; answers."""

    def __init__(self, planner: CGRPO, calibration: CalibrationSet, text: Callable[[object], str]):
        self.planner, self.rows, self.text = planner, calibration.rows, text
        self.extract = calibration.answer_extractor
        self.answers: list[list] = []  # (P, n) this step's answers so far, None where not drawn

    def _answer(self, completion):  # the answer a completion states, or None
        return self.extract(self.text(completion))

    # ---- the calibration ----------------------------------------------------------------------------------------

    def share(self, rank: int = 0, processes: int = 1) -> tuple[list[dict], int]:
        """This process's rows of the first ``calibration_size`` (row 0 pads to equal shares), how many are its own."""
        N = self.planner.calibration_size(len(self.rows))
        size = math.ceil(N / processes)
        mine = list(range(rank * size, min((rank + 1) * size, N)))
        return [self.rows[i] for i in mine + [0] * (size - len(mine))], len(mine)

    def calibrate(self, sample: Callable[[list[dict], int], list], *, step: int, rank: int = 0, processes: int = 1,
                  per_device_rows: int | None = None, gather: Callable | None = None) -> dict[str, float]:
        """This process's share sampled by ``sample(rows, k)`` -> each row's k completions in turn (a collective),
        ``calibration_batch_size`` prompts a call (default per_device_rows // k_max, else all); ``fit``'s metrics."""
        s = self.planner.settings
        rows, valid = self.share(rank, processes)
        per_call = s.calibration_batch_size or max(1, (per_device_rows or len(rows) * s.k_max) // s.k_max)
        completions = [c for start in range(0, len(rows), per_call)
                       for c in sample(rows[start:start + per_call], s.k_max)]
        return self.fit(rows, completions, valid, step=step, processes=processes, gather=gather)

    def fit(self, rows: list[dict], completions: list, valid: int, *, step: int, processes: int = 1,
            gather: Callable | None = None) -> dict[str, float]:
        """The thresholds from ``rows``' k_max completions each (the first ``valid`` rows this process's own; with
        ``gather``, a collective: every process's, and all take the first process's thresholds); metrics to log."""
        s, k = self.planner.settings, self.planner.settings.k_max
        answers = [[self._answer(c) for c in completions[i * k:(i + 1) * k]] for i in range(len(rows))]
        codes, gold = encode_answers(answers, k, [row[s.calibration_answer_column] for row in rows])  # (R, k), (R,)
        mask = (torch.arange(len(rows)) < valid).long().unsqueeze(1)
        table = torch.cat([codes, gold.unsqueeze(1), mask], dim=1)
        table = table if gather is None else gather(table).cpu()  # (R * processes, k + 2)
        table = table[table[:, -1] > 0]
        metrics = self.planner.calibrate(table[:, :k], table[:, k], step=step)
        if processes > 1:  # each process draws from its own stream: all take the first process's thresholds
            shared = gather(torch.cat([self.planner.qhats, torch.tensor([self.planner.delta],
                                                                        dtype=torch.float64)]).unsqueeze(0)).cpu()
            self.planner.qhats, self.planner.delta = shared[0, :-1].clone(), float(shared[0, -1])
            metrics.update({"pods/cgrpo_delta": self.planner.delta,
                            **{f"pods/cgrpo_qhat_{budget}": float(q)
                               for budget, q in zip(s.budget_grid, self.planner.qhats.tolist())}})
        return metrics

    def due(self, step: int) -> tuple[list[dict], int] | None:
        """(this process's calibration rows, k_max) when the thresholds are due before ``step``; None otherwise."""
        if not self.planner.calibration_due(step):
            return None
        return self.share()[0], self.planner.settings.k_max

    # ---- the rounds ---------------------------------------------------------------------------------------------

    def start_step(self, num_prompts: int, n: int) -> None:
        """A new step of ``num_prompts`` prompts, n slots each."""
        self.answers = [[None] * n for _ in range(num_prompts)]

    def next_round(self, completions: list, slots: list[int], counts: torch.Tensor,
                   last: torch.Tensor) -> torch.Tensor:
        """(P,) rollouts of the next round, to the next budget where unresolved, after the round just drawn
        (``completions`` in ``slots``; ``last`` (P,) its rollouts per prompt)."""
        n = len(self.answers[0]) if self.answers else 1
        for slot, completion in zip(slots, completions):
            self.answers[slot // n][slot % n] = self._answer(completion)
        codes, _ = encode_answers(self.answers, n)
        return self.planner.next_round(codes, counts, last > 0)

    def group_more(self, completions: list) -> int:
        """Rollouts one group of ``completions`` gets next (0: it stops), judged alone (the asynchronous worker's)."""
        grid, k_max = list(self.planner.settings.budget_grid), self.planner.settings.k_max
        count = len(completions)
        if count not in grid:  # a rollout the engine failed to return: on to the next budget before judging
            return next((k - count for k in grid if k > count), 0)
        codes, _ = encode_answers([[self._answer(c) for c in completions]], k_max)
        return int(self.planner.next_round(codes, torch.tensor([count]), torch.tensor([True]))[0])

    def step_metrics(self, counts: torch.Tensor, padding_rows: float) -> dict[str, float]:
        """A step's metrics from every process's rollouts per prompt (P*processes,) and the padding rows' share."""
        return {**self.planner.round_metrics(counts), "pods/cgrpo_padding_rows": padding_rows,
                "pods/cgrpo_calibration_rollouts_total": float(self.planner.calibration_rollouts)}
