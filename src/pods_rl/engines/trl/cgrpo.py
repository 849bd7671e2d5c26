"""C-GRPO in ``PODSTrainer`` (``rollout_planner="cgrpo"``): the one-line refusals (``check_cgrpo_config``,
``check_calibration``); ``CGRPORun``, the calibration through GRPOTrainer's own ``_generate`` and the stop rule after
each round. A prompt that stops at k < m trains with m - k padding rows masked out of the loss (``mask_padding``), as
trl-cgrpo pads; one that stops above m is down-sampled to m by PODS's rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from pods_rl.budget.planners.cgrpo import CGRPO, calibration_rows, encode_answers
from pods_rl.tasks.extraction import completion_text

# The loss types whose normalizer counts tokens through the completion mask: padding rows drop out exactly. The
# per-sequence ones would be diluted by them (trl-cgrpo refuses the same).
SUPPORTED_LOSS_TYPES = ("dapo", "bnpo", "cispo", "vespo")


def uses_cgrpo(config) -> bool:
    """Whether ``config`` (a ``PODSConfig``) runs C-GRPO."""
    return getattr(config, "rollout_planner", None) == "cgrpo"


def check_cgrpo_config(config) -> None:
    """Refuse, in one line, what C-GRPO cannot run with in ``PODSTrainer`` (``config``: a ``PODSConfig``)."""
    if not uses_cgrpo(config):
        return
    if config.loss_type not in SUPPORTED_LOSS_TYPES:
        raise ValueError(f"rollout_planner='cgrpo' pads prompts that stop early with masked rows, which only the "
                         "token-normalized losses exclude exactly: set loss_type to one of "
                         f"{list(SUPPORTED_LOSS_TYPES)} (got {config.loss_type!r})")


def check_calibration(planner: CGRPO, calibration_dataset, answer_extractor: Callable | None, train_dataset,
                      *, environment: bool = False) -> list[dict]:
    """The calibration prompts as rows, once checked: a map-style dataset with ``prompt`` (and the gold answer
    column for ``score="aps"``), an answer extractor for ``aps``, and no prompt of the training set; one line each."""
    s = planner.settings
    if environment:
        raise ValueError("rollout_planner='cgrpo' does not support environment_factory or tools: the stop rule reads "
                         "one answer per completion; drop them, or the planner")
    if s.score != "aps":
        raise ValueError(f"rollout_planner='cgrpo' with score={s.score!r} needs a verifier per completion, which "
                         "PODSTrainer does not take yet: use score='aps' with an answer_extractor")
    return calibration_rows(s, calibration_dataset, answer_extractor, train_dataset)


class CGRPORun:
    """C-GRPO's part of a ``PODSTrainer``: the calibration rows, the answer extractor, this step's answers."""

    def __init__(self, planner: CGRPO, rows: list[dict], answer_extractor: Callable):
        self.planner, self.rows, self.extract = planner, rows, answer_extractor
        self.answers: list[list] = []  # (P, n) this step's answers so far, None where not drawn

    # ---- the calibration ----------------------------------------------------------------------------------------

    def calibrate(self, generate: Callable[[list[dict], int], list], *, step: int, rank: int, processes: int,
                  per_device_rows: int, gather: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        """Sample each calibration prompt k_max times (``generate(rows, k_max)`` -> one completion per row, rows
        repeated k_max times; a collective, so every process calls it equally often), then fit the thresholds on
        every process's answers, in the calibration set's order. Returns the metrics to log."""
        s = self.planner.settings
        k_max = s.k_max
        N = self.planner.calibration_size(len(self.rows))
        share = math.ceil(N / processes)  # prompts per process; the last processes pad with the first prompt
        mine = list(range(rank * share, min((rank + 1) * share, N)))
        valid = len(mine)
        mine += [0] * (share - valid)
        per_call = s.calibration_batch_size or max(1, per_device_rows // k_max)
        answers, gold = [], []
        for start in range(0, share, per_call):
            chunk = [self.rows[i] for i in mine[start:start + per_call]]
            completions = generate([dict(row) for row in chunk for _ in range(k_max)], k_max)
            for i, row in enumerate(chunk):
                answers.append([self.extract(completion_text(c)) for c in completions[i * k_max:(i + 1) * k_max]])
                gold.append(row[s.calibration_answer_column])
        codes, gold_codes = encode_answers(answers, k_max, gold)  # (share, k_max), (share,)
        mask = (torch.arange(share) < valid).long().unsqueeze(1)
        table = gather(torch.cat([codes, gold_codes.unsqueeze(1), mask], dim=1)).cpu()  # (share * processes, ...)
        table = table[table[:, -1] > 0]
        metrics = self.planner.calibrate(table[:, :k_max], table[:, k_max], step=step)
        if processes > 1:  # each process draws from its own stream: all take the first process's thresholds
            shared = gather(torch.cat([self.planner.qhats, torch.tensor([self.planner.delta],
                                                                        dtype=torch.float64)]).unsqueeze(0)).cpu()
            self.planner.qhats, self.planner.delta = shared[0, :-1].clone(), float(shared[0, -1])
            metrics.update({"pods/cgrpo_delta": self.planner.delta,
                            **{f"pods/cgrpo_qhat_{k}": float(q)
                               for k, q in zip(s.budget_grid, self.planner.qhats.tolist())}})
        return metrics

    # ---- the rounds of a step -----------------------------------------------------------------------------------

    def start_step(self, num_prompts: int, n: int) -> None:
        """A new step of ``num_prompts`` prompts, n slots each."""
        self.answers = [[None] * n for _ in range(num_prompts)]

    def next_round(self, completions: list, slots: list[int], counts: torch.Tensor,
                   last: torch.Tensor) -> torch.Tensor:
        """The round just drawn (its completions in ``slots``, ``last`` (P,) rollouts it gave each prompt) ->
        (P,) rollouts of the next round: to the next budget for the prompts not resolved."""
        n = len(self.answers[0]) if self.answers else 1
        for slot, completion in zip(slots, completions):
            self.answers[slot // n][slot % n] = self.extract(completion_text(completion))
        codes, _ = encode_answers(self.answers, n)
        return self.planner.next_round(codes, counts, last > 0)


def padded_kept_rows(kept: torch.Tensor, groups: torch.Tensor, n: int) -> tuple[list[int], list[bool]]:
    """Selection's kept rollouts (P, m) (-1: a prompt with fewer than m) of the kept ``groups`` (B,) -> B*m rows
    p*n + j, a short group filled with its unused slots (copies with NaN rewards), and which rows are padding."""
    kept = kept[groups]  # (B, m)
    m = kept.shape[1]
    columns = torch.where(kept >= 0, kept, torch.arange(m).expand_as(kept))
    rows = groups.unsqueeze(1) * n + columns  # (B, m)
    return rows.flatten().tolist(), (kept < 0).flatten().tolist()


def mask_padding(output: dict, padded: list[bool], gather: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Take the padding rows (B*m,) out of TRL's batch ``output``: their completion tokens out of the loss mask and of
    ``num_items_in_batch`` (every process's). A collective. Returns the padding rows' share of the kept rows."""
    mask = output["completion_mask"]
    padding = torch.tensor(padded, dtype=torch.bool, device=mask.device)
    loss_mask = mask if output.get("tool_mask") is None else mask * output["tool_mask"]
    tokens = loss_mask[padding].sum().reshape(1).to(output["num_items_in_batch"].dtype) if len(padded) else \
        torch.zeros(1, dtype=output["num_items_in_batch"].dtype, device=mask.device)
    mask[padding] = 0
    output["num_items_in_batch"] = output["num_items_in_batch"] - gather(tokens).sum().to(
        output["num_items_in_batch"].device)
    return float(padding.double().mean()) if len(padded) else 0.0
