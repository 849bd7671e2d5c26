"""C-GRPO: conformal per-prompt rollout budgets (Fayyazi et al.; code: ``trl-cgrpo`` 0.2.0). Each prompt is sampled
along ``budget_grid`` (2, 4, 8, 16, 32) until the split-conformal prediction set over its answers is a singleton (one
answer's share reaches ``qhat_k``); the thresholds are calibrated on held-out prompts before the first step and every
``recalibrate_every`` steps. Shapes: answers (P, n) int64 codes (-1: none), gold (P,). Random draws follow the
released code's order, so the same answers and seed give the same thresholds and stops
(benchmarks/budget_crosscheck.py; differences: docs/concepts/rollout-budgets.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners.base import (
    Layout,
    Plan,
    Planner,
    as_ids,
    check_choice,
    check_int,
    check_number,
    make_plan,
    register_planner,
)

__all__ = ["CGRPO", "CGRPOSettings", "aps_scores", "check_width", "conformal_quantile", "encode_answers",
           "execution_scores", "select_delta_auto"]

_OWNER = "C-GRPO"
SCORES = ("aps", "first_success", "pass_rate")


@dataclass(frozen=True)
class CGRPOSettings:
    """C-GRPO's knobs, named and defaulted as ``trl_cgrpo.CGRPOConfig`` names them; ``calibration_split`` is
    pods-rl's: where ``pods train`` reads the calibration prompts (None: the evaluation split, past the problems it
    evaluates on)."""

    budget_grid: tuple[int, ...] = (2, 4, 8, 16, 32)
    delta: float | None = None
    delta_margin: float = 0.05
    split_delta: bool = False
    score: str = "aps"
    recalibrate_every: int = 50
    num_calibration_samples: int | None = None
    calibration_batch_size: int | None = None
    calibration_answer_column: str = "answer"
    calibration_split: str | None = None

    def __post_init__(self):
        grid = self.budget_grid
        if (not isinstance(grid, (list, tuple)) or not grid or len(set(grid)) != len(grid)
                or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in grid)):
            raise ValueError(f"{_OWNER} budget_grid must be distinct positive integers (e.g. [2, 4, 8, 16, 32]), "
                             f"got {grid!r}")
        object.__setattr__(self, "budget_grid", tuple(sorted(grid)))  # the released config sorts it too
        if self.delta is not None:
            check_number(_OWNER, "delta", self.delta, 0.0, 1.0, low_open=True, high_open=True,
                         fix="or None to choose it from the policy's solve rate")
        check_number(_OWNER, "delta_margin", self.delta_margin, 0.0, 1.0)
        check_choice(_OWNER, "score", self.score, SCORES)
        check_int(_OWNER, "recalibrate_every", self.recalibrate_every, 0, fix="0 calibrates once")
        for name in ("num_calibration_samples", "calibration_batch_size"):
            if getattr(self, name) is not None:
                check_int(_OWNER, name, getattr(self, name), 1, fix="or None")
        if not isinstance(self.split_delta, bool):
            raise ValueError(f"{_OWNER} split_delta must be True or False, got {self.split_delta!r}")
        for name in ("calibration_answer_column", "calibration_split"):
            value = getattr(self, name)
            if (value is not None or name == "calibration_answer_column") and (not isinstance(value, str)
                                                                              or not value):
                raise ValueError(f"{_OWNER} {name} must be a column or split name, got {value!r}")

    @property
    def k_max(self) -> int:
        """The largest budget: the group width n, and the rollouts of each calibration prompt."""
        return self.budget_grid[-1]


def encode_answers(answers: Sequence[Sequence], width: int, gold: Sequence | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Answers as C-GRPO compares them (``str(a).strip()``, None and "" are no answer) -> (P, width) int64 codes,
    -1 for no answer or not drawn; and gold (P,) codes (-1 when the gold answer is empty or was never drawn)."""
    codes = torch.full((len(answers), width), -1, dtype=torch.long)
    gold_codes = None if gold is None else torch.full((len(answers),), -1, dtype=torch.long)
    for p, row in enumerate(answers):
        index: dict[str, int] = {}
        for j, answer in enumerate(row[:width]):
            text = _as_answer(answer)
            if text:
                codes[p, j] = index.setdefault(text, len(index))
        if gold is not None:
            gold_codes[p] = index.get(_as_answer(gold[p]), -1) if _as_answer(gold[p]) else -1
    return codes, gold_codes


def _as_answer(value) -> str:
    return "" if value is None else str(value).strip()


def _distribution(codes: torch.Tensor, k: int, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """The empirical answer distribution of the first k of ``codes`` (n,), largest share first, equal shares in a
    random order: (D,) answer codes and (D,) float64 shares count / k. Draws one uniform per distinct answer, in the
    order the answers first appear (the released code's sort key draws them so)."""
    head = codes[:k]
    head = head[head >= 0]
    if len(head) == 0:
        return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.float64)
    distinct, inverse, counts = torch.unique(head, return_inverse=True, return_counts=True)
    first = torch.full((len(distinct),), len(head), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(head)), reduce="amin")
    order = torch.argsort(first)  # (D,) first-appearance order: the order the uniforms are drawn in
    distinct, counts = distinct[order], counts[order]
    uniforms = torch.tensor([rng.random() for _ in range(len(distinct))], dtype=torch.float64)
    # Ties broken uniformly at random (exchangeability): by the uniforms, then stably by count, largest first.
    ranked = torch.argsort(uniforms)
    ranked = ranked[torch.argsort(-counts[ranked], stable=True)]
    return distinct[ranked], counts[ranked].double() / k


def aps_scores(answers: torch.Tensor, gold: torch.Tensor, budget_grid: Sequence[int],
               rng: random.Random) -> torch.Tensor:
    """(N, G) randomized APS nonconformity scores of each calibration prompt's gold answer (N,) under the empirical
    distribution of its first k answers (N, n), for each budget k of the grid: the mass ranked ahead of the gold
    answer plus U * its share, U ~ Uniform(0, 1), at most 1; 1.0 if it was never drawn. Prompt by prompt, budget by
    budget, as the released ``calibrate`` draws."""
    scores = torch.ones((answers.shape[0], len(budget_grid)), dtype=torch.float64)
    for i in range(answers.shape[0]):
        for g, k in enumerate(budget_grid):
            distinct, shares = _distribution(answers[i], k, rng)
            found = torch.nonzero(distinct == gold[i]).flatten()
            if len(found):
                at = int(found[0])
                ahead = float(torch.cumsum(shares[:at], 0)[-1]) if at else 0.0  # sequential sums, as the loop's
                scores[i, g] = min(ahead + rng.random() * float(shares[at]), 1.0)
    return scores


def execution_scores(passes: torch.Tensor, budget_grid: Sequence[int], score: str) -> torch.Tensor:
    """(N, G) execution scores of (N, n) pass/fail outcomes at each budget k: ``first_success`` j*/k (j* the
    1-based position of the first pass), ``pass_rate`` 1 - passes/k; 1.0 without a pass in the first k."""
    passes = torch.as_tensor(passes).bool()
    out = torch.ones((passes.shape[0], len(budget_grid)), dtype=torch.float64)
    for g, k in enumerate(budget_grid):
        head = passes[:, :k]
        if score == "first_success":
            position = torch.argmax(head.long(), dim=1) + 1  # (N,) the first pass, 1-based
            out[:, g] = torch.where(head.any(1), position.double() / k, 1.0)
        else:
            out[:, g] = 1.0 - head.sum(1).double() / k
    return out


def conformal_quantile(scores: torch.Tensor, delta: float) -> float:
    """The split-conformal quantile of (N,) scores: the ceil((N + 1)(1 - delta))-th smallest (1-based, clamped to
    [1, N]); 1.0 for no scores. The N + 1 gives coverage >= 1 - delta at finite N."""
    s = torch.sort(torch.as_tensor(scores, dtype=torch.float64).flatten()).values
    if len(s) == 0:
        return 1.0
    index = math.ceil((len(s) + 1) * (1.0 - delta))
    return float(s[min(max(index, 1), len(s)) - 1])


def select_delta_auto(scores_at_k_max: torch.Tensor, margin: float = 0.05, low: float = 0.05,
                      high: float = 0.95) -> tuple[float, float]:
    """delta = (1 - solve rate) + margin clipped to [low, high], the solve rate being the share of (N,) scores at the
    largest budget below 1 (the policy drew the gold answer); returns (delta, solve rate)."""
    s = torch.as_tensor(scores_at_k_max, dtype=torch.float64).flatten()
    solve_rate = float((s < 1.0 - 1e-9).sum()) / len(s) if len(s) else 0.0
    return min(max(1.0 - solve_rate + margin, low), high), solve_rate


@register_planner("cgrpo")
class CGRPO(Planner):
    """C-GRPO. Per step: ``calibration_due`` -> ``calibrate``; ``plan`` (budget_grid[0] each), then ``next_round``
    after each round until all zeros. State: the thresholds, delta, the last calibration's step, the random stream."""

    kind = "how_many"
    Settings = CGRPOSettings
    needs = frozenset({"answer_rounds", "calibration"})  # an engine runs its rounds (next_round) and calibration

    def __init__(self, settings: CGRPOSettings | None = None, seed: int = 0):
        self.settings = settings or CGRPOSettings()
        self.rng = random.Random(seed)  # the released trainer's random.Random(args.seed)
        self.qhats: torch.Tensor | None = None  # (G,) float64, one threshold per budget
        self.delta: float | None = None
        self.last_calibration_step: int | None = None
        self.calibration_rollouts = 0  # every calibration's rollouts so far

    @classmethod
    def complete(cls, args, layout: Layout) -> dict:
        """n is the group width: the largest budget of the grid."""
        knobs = dict(args or {})
        check_width(knobs, layout.n, layout.names)
        return knobs

    def first_round(self, n: int) -> int:
        """The first budget of the grid."""
        return self.settings.budget_grid[0]

    def use_seed(self, seed: int) -> None:
        """Restart the random stream from ``seed`` (the run's), as the released trainer seeds it."""
        self.rng = random.Random(seed)

    # ---- calibration --------------------------------------------------------------------------------------------

    def calibration_due(self, step: int) -> bool:
        """Whether to calibrate before the step ``step``: never calibrated, or ``recalibrate_every`` steps since."""
        if self.qhats is None:
            return True
        every = self.settings.recalibrate_every
        return every > 0 and step - self.last_calibration_step >= every

    def calibration_size(self, available: int) -> int:
        """How many of ``available`` calibration prompts a calibration uses (``num_calibration_samples``, else all)."""
        wanted = self.settings.num_calibration_samples
        return available if wanted is None else min(available, wanted)

    def calibrate(self, outcomes: torch.Tensor, gold: torch.Tensor | None = None, *, step: int = 0
                  ) -> dict[str, float]:
        """Fit one threshold per budget from N calibration prompts' k_max outcomes each: answers (N, k_max) codes
        and ``gold`` (N,) codes for ``aps``, else passes (N, k_max). Returns its ``pods/cgrpo_*`` metrics."""
        s = self.settings
        outcomes = torch.as_tensor(outcomes)
        if outcomes.dim() != 2 or outcomes.shape[1] < s.k_max:
            raise ValueError(f"{_OWNER} calibrates on (N, {s.k_max}) outcomes (max(budget_grid) per prompt), got "
                             f"{tuple(outcomes.shape)}")
        if s.score == "aps":
            if gold is None or torch.as_tensor(gold).shape != (outcomes.shape[0],):
                raise ValueError(f"{_OWNER} score='aps' calibrates on gold answers (N,) beside the answers (N, n)")
            scores = aps_scores(outcomes.long(), torch.as_tensor(gold).long(), s.budget_grid, self.rng)
        else:
            scores = execution_scores(outcomes, s.budget_grid, s.score)
        N = scores.shape[0]
        delta_rows = quantile_rows = torch.arange(N)
        if s.delta is None and s.split_delta:
            delta_rows, quantile_rows = delta_rows[: N // 2], quantile_rows[N // 2:]
        metrics = {}
        if s.delta is None:
            self.delta, solve_rate = select_delta_auto(scores[delta_rows, -1], margin=s.delta_margin)
            metrics["pods/cgrpo_calibration_solve_rate"] = solve_rate
        else:
            self.delta = s.delta
        self.qhats = torch.tensor([conformal_quantile(scores[quantile_rows, g], self.delta)
                                   for g in range(len(s.budget_grid))], dtype=torch.float64)
        self.last_calibration_step = step
        self.calibration_rollouts += N * s.k_max
        metrics.update({"pods/cgrpo_delta": self.delta, "pods/cgrpo_calibration_rollouts": float(N * s.k_max),
                        "pods/cgrpo_calibration_rollouts_total": float(self.calibration_rollouts),
                        **{f"pods/cgrpo_qhat_{k}": float(q) for k, q in zip(s.budget_grid, self.qhats.tolist())}})
        return metrics

    # ---- the rounds of a step -----------------------------------------------------------------------------------

    def plan(self, ids, ledger: PromptLedger, *, n: int | None = None,
             generator: torch.Generator | None = None, **budget) -> Plan:
        """The first round: budget_grid[0] rollouts per candidate (0 if evicted); ``n``, if given, must be k_max."""
        if n is not None and n != self.settings.k_max:
            raise ValueError(f"{_OWNER} samples up to max(budget_grid) = {self.settings.k_max} rollouts per prompt, "
                             f"got n={n}; set num_generations to {self.settings.k_max}")
        ids = as_ids(ids)
        evicted = ledger.stats(ids).evicted
        return make_plan(ids, torch.where(evicted, 0, self.settings.budget_grid[0]), evicted=evicted)

    def resolved(self, outcomes, counts, active) -> torch.Tensor:
        """(P,) bool: the ``active`` (P,) prompts whose prediction set over their first counts[p] outcomes (P, n)
        is a complete singleton (counts: budgets of the grid). Checked in prompt order, drawing as the released
        ``_resolved`` does."""
        if self.qhats is None:
            raise ValueError(f"{_OWNER} has no thresholds yet: calibrate before the first step")
        outcomes = torch.as_tensor(outcomes)
        counts = torch.as_tensor(counts).long().cpu()
        active = torch.as_tensor(active).bool().cpu()
        grid = list(self.settings.budget_grid)
        done = torch.zeros(len(counts), dtype=torch.bool)
        for p in torch.nonzero(active).flatten().tolist():
            k = int(counts[p])
            if k not in grid:
                raise ValueError(f"{_OWNER} checks a prompt at a budget of the grid {grid}, got {k} rollouts")
            qhat = float(self.qhats[grid.index(k)])
            if self.settings.score == "aps":
                # A complete singleton: the top answer's share reaches qhat (failed extractions carry no mass).
                # The draws of the distribution's tie-break are made though they cannot change the verdict.
                _, shares = _distribution(outcomes[p].long(), k, self.rng)
                done[p] = len(shares) > 0 and float(shares[0]) >= qhat
            else:
                passes = outcomes[p, :k].bool()
                if bool(passes.any()):
                    score = execution_scores(outcomes[p:p + 1], [k], self.settings.score)[0, 0]
                    done[p] = float(score) <= qhat
        return done

    def next_round(self, outcomes, counts, active) -> torch.Tensor:
        """(P,) int64 rollouts each prompt gets next: the step to the next budget for each ``active`` (P,) prompt
        (sampled in the round just drawn) not yet resolved and below k_max; 0 for the others."""
        counts = torch.as_tensor(counts).long().cpu()
        open_ = torch.as_tensor(active).bool().cpu() & ~self.resolved(outcomes, counts, active)
        grid = torch.tensor(self.settings.budget_grid)
        following = torch.searchsorted(grid, counts, right=True)  # (P,) index of the next budget
        more = torch.where(following < len(grid), grid[following.clamp(max=len(grid) - 1)] - counts, 0)
        return torch.where(open_, more, 0)

    def round_metrics(self, counts) -> dict[str, float]:
        """``pods/cgrpo_mean_k`` and ``pods/cgrpo_rollout_savings`` (1 - rollouts / (P k_max)) of the sampled
        prompts' counts (P,) (0: not sampled)."""
        counts = torch.as_tensor(counts).long()
        counts = counts[counts > 0]
        if len(counts) == 0:
            return {}
        return {"pods/cgrpo_mean_k": counts.double().mean().item(),
                "pods/cgrpo_rollout_savings": 1.0 - counts.sum().item() / (len(counts) * self.settings.k_max)}

    def state_dict(self) -> dict:
        """Thresholds, delta, the last calibration's step, rollouts spent on calibration, the random stream."""
        version, internal, gauss = self.rng.getstate()
        return {"qhats": self.qhats, "delta": self.delta, "last_calibration_step": self.last_calibration_step,
                "calibration_rollouts": self.calibration_rollouts,
                "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``."""
        self.qhats, self.delta = state["qhats"], state["delta"]
        self.last_calibration_step = state["last_calibration_step"]
        self.calibration_rollouts = state["calibration_rollouts"]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def check_width(knobs: dict, n: int, names: dict) -> None:
    """The run's n must be max(budget_grid) of C-GRPO's knobs ``knobs`` (its group width); else one line."""
    k_max = CGRPOSettings(budget_grid=knobs.get("budget_grid", CGRPOSettings.budget_grid)).k_max
    if n != k_max:
        raise ValueError(f"{names['rollout_planner']}='cgrpo' samples each prompt up to max(budget_grid) = {k_max} "
                         f"rollouts: set {names['n']} to {k_max} (n={n}), or budget_grid in "
                         f"{names['rollout_planner_args']} to end at {n}")

