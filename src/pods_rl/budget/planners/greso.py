"""GRESO's pre-rollout skip (Zheng et al. 2025, "Act Only When It Pays"; code: github.com/Infini-AI-Lab/GRESO,
``DataProfiler`` and its trainer).

A prompt whose recent groups were all-equal is likely all-equal again, so before sampling it is skipped with
probability 1 - max(p ** z, min_readmit), z its streak of all-success (*easy*, p_easy) or no-success (*hard*,
p_hard) groups. After each step, p_easy / p_hard move by ``p_step`` toward a share of all-equal groups of
``target_zero_variance / 3`` (easy) and ``2 * target_zero_variance / 3`` (hard), within [min_p, max_p], from epoch
``adapt_from_epoch``. Follows the released code; where it cannot match it exactly: docs/concepts/rollout-budgets.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pods_rl.budget.ledger import GroupSummary, PromptLedger, PromptStats
from pods_rl.budget.planners.base import Plan, Planner, as_ids, check_int, check_number, make_plan, register_planner

__all__ = ["GresoSettings", "GresoSkip", "greso_skip_probability"]

_OWNER = "GRESO"


@dataclass(frozen=True)
class GresoSettings:
    """GRESO's knobs, named and defaulted as in the released code and scripts (see the module docstring)."""

    p_easy: float = 0.5
    p_hard: float = 0.5
    target_zero_variance: float = 0.25
    min_p: float = 0.05
    max_p: float = 0.95
    p_step: float = 0.01
    min_readmit: float = 0.01
    adapt_from_epoch: int = 1

    def __post_init__(self):
        check_number(_OWNER, "min_p", self.min_p, 0.0, 1.0)
        check_number(_OWNER, "max_p", self.max_p, self.min_p, 1.0, fix="max_p >= min_p")
        for name in ("p_easy", "p_hard"):
            check_number(_OWNER, name, getattr(self, name), self.min_p, self.max_p, fix="keep it in [min_p, max_p]")
        check_number(_OWNER, "target_zero_variance", self.target_zero_variance, 0.0, 1.0, low_open=True)
        check_number(_OWNER, "p_step", self.p_step, 0.0, 1.0, low_open=True)
        check_number(_OWNER, "min_readmit", self.min_readmit, 0.0, 1.0)
        check_int(_OWNER, "adapt_from_epoch", self.adapt_from_epoch, 0)


def greso_skip_probability(stats: PromptStats, p_easy: float, p_hard: float, min_readmit: float = 0.01):
    """(P,) float64 skip probability per prompt (0 if unseen or last group mixed), and (P,) bool easy / hard masks."""
    easy = stats.all_success_streak > 0
    hard = stats.no_success_streak > 0
    readmit = torch.zeros(len(stats.ids), dtype=torch.float64)
    readmit = torch.where(easy, torch.pow(torch.tensor(float(p_easy), dtype=torch.float64),
                                          stats.all_success_streak.double()), readmit)
    readmit = torch.where(hard, torch.pow(torch.tensor(float(p_hard), dtype=torch.float64),
                                          stats.no_success_streak.double()), readmit)
    skip = torch.where(easy | hard, 1.0 - readmit.clamp(min=min_readmit), 0.0)
    return skip, easy, hard


def _batch_share(flags: torch.Tensor) -> float:
    """The share of groups ``flags`` (G,) marks, in float32 as GRESO's ``compute_reward_metrics``."""
    return float(flags.sum().to(torch.float32) / torch.tensor(len(flags), dtype=torch.float32))


@register_planner("greso")
class GresoSkip(Planner):
    """GRESO's skip as a ``which_prompts`` planner: ``plan`` before sampling (the engine draws more candidates until
    its batch is full), ``update`` after the step's groups are recorded; ``state_dict`` holds the probabilities."""

    kind = "which_prompts"
    Settings = GresoSettings

    def __init__(self, settings: GresoSettings | None = None):
        self.settings = settings or GresoSettings()
        self.p_easy = float(self.settings.p_easy)
        self.p_hard = float(self.settings.p_hard)

    def plan(self, ids, ledger: PromptLedger, *, n: int, generator: torch.Generator | None = None) -> Plan:
        """Skip (one uniform float64 draw per candidate) or give n rollouts to each of ``ids`` (P,); evicted get 0.
        ``extra``: ``skip_probability`` (P,), ``easy`` / ``hard`` (P,) bool."""
        check_int(_OWNER, "n", n, 1)
        ids = as_ids(ids)
        stats = ledger.stats(ids)
        probability, easy, hard = greso_skip_probability(stats, self.p_easy, self.p_hard, self.settings.min_readmit)
        draws = torch.rand(len(ids), generator=generator, dtype=torch.float64)
        skipped = (draws < probability) & ~stats.evicted
        rollouts = torch.where(skipped | stats.evicted, 0, n)
        metrics = {"pods/prompts_skipped_easy": float((skipped & easy).sum()),
                   "pods/prompts_skipped_hard": float((skipped & hard).sum()),
                   "pods/greso_p_easy": self.p_easy, "pods/greso_p_hard": self.p_hard}
        return make_plan(ids, rollouts, skipped=skipped, evicted=stats.evicted,
                         extra={"skip_probability": probability, "easy": easy, "hard": hard}, metrics=metrics)

    def update(self, summaries: GroupSummary | Sequence[GroupSummary], *, epoch: int) -> dict[str, float]:
        """Adapt p_easy / p_hard from the summaries recorded since the last update; the metrics."""
        if isinstance(summaries, GroupSummary):
            summaries = [summaries]
        batches = [s for s in summaries if len(s.ids)]
        if not batches:
            return {}
        # As the code: each batch's share a float32 (count / groups), weighted by the batch's rollouts (its
        # len(batch)), the sums in float64; a share that sits on the target then falls on the code's side of it.
        rows = [float(s.rollouts.sum()) or float(len(s.ids)) for s in batches]
        easy_ratio = sum(_batch_share(s.all_success) * r for s, r in zip(batches, rows)) / sum(rows)
        hard_ratio = sum(_batch_share(s.no_success) * r for s, r in zip(batches, rows)) / sum(rows)
        s = self.settings
        if epoch >= s.adapt_from_epoch:
            # The code: at or above the target, explore less (skip more); below it, explore more.
            target_easy, target_hard = s.target_zero_variance / 3, s.target_zero_variance * 2 / 3
            self.p_hard = max(self.p_hard - s.p_step, s.min_p) if hard_ratio >= target_hard else min(
                self.p_hard + s.p_step, s.max_p)
            self.p_easy = max(self.p_easy - s.p_step, s.min_p) if easy_ratio >= target_easy else min(
                self.p_easy + s.p_step, s.max_p)
        return {"pods/greso_too_easy_ratio": easy_ratio, "pods/greso_too_hard_ratio": hard_ratio,
                "pods/greso_p_easy": self.p_easy, "pods/greso_p_hard": self.p_hard}

    def state_dict(self) -> dict:
        """The adapted exploration probabilities."""
        return {"p_easy": self.p_easy, "p_hard": self.p_hard}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s probabilities."""
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])
