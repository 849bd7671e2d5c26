"""GRESO's pre-rollout skip (Zheng et al. 2025, "Act Only When It Pays: Efficient Reinforcement Learning for LLM
Reasoning via Selective Rollouts"; code: github.com/Infini-AI-Lab/GRESO, ``DataProfiler`` and its trainer).

A prompt whose recent groups were all-equal is likely all-equal again (the paper's temporal consistency), and an
all-equal group teaches nothing; so before sampling, skip it with a probability that grows with how many of its
most recent groups were all-equal, and re-admit it otherwise (exploration). As in the released code, the two kinds
of all-equal are tracked apart, each with its own exploration probability:

* *easy*: the prompt's last z groups were all successes (z = ``all_success_streak`` in the ledger);
  P(skip) = 1 - max(p_easy ** z, min_readmit);
* *hard*: its last z groups had no success (``no_success_streak``); P(skip) = 1 - max(p_hard ** z, min_readmit).

After each training step the exploration probabilities move toward a target share of all-equal groups (the
code's adaptation): over the groups sampled since the last step, if the share of all-success groups reached
``target_zero_variance / 3``, p_easy falls by ``p_step`` (skip more), else rises; p_hard the same against
``2 * target_zero_variance / 3`` (hard prompts get more exploration: "they are more likely to change"); both stay
in [min_p, max_p], and only from epoch ``adapt_from_epoch`` on (the code's ``epoch > 0``).

Where this follows the code rather than the paper, and where it cannot match it exactly: see
docs/concepts/rollout-budgets.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pods_rl.budget.ledger import GroupSummary, PromptLedger, PromptStats
from pods_rl.budget.planners.base import Plan, as_ids, check_int, check_number, make_plan, register_planner

__all__ = ["GresoSettings", "GresoSkip", "greso_skip_probability"]

_OWNER = "GRESO"


@dataclass(frozen=True)
class GresoSettings:
    """GRESO's knobs, named as in the released code (defaults: its training scripts and trainer).

    ``p_easy`` / ``p_hard``: the starting exploration probabilities (scripts: 0.5); ``target_zero_variance``: the
    target share of all-equal groups (0.25); ``min_p`` / ``max_p``: the bounds of the probabilities (0.05, 0.95);
    ``p_step``: their change per step (0.01); ``min_readmit``: the least chance a prompt is re-admitted (0.01,
    ``max(p ** count, 0.01)`` in the code); ``adapt_from_epoch``: the first epoch that adapts (1: the code's
    ``epoch > 0``).
    """

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
    """(P,) float64 probability of skipping each prompt, and (P,) bool masks easy / hard (which rule applies).

    ``stats``: the ledger's columns for the P candidates. A prompt never seen, or whose last group was mixed, has
    probability 0. (A group cannot be all-success and no-success at once, so at most one rule applies.)
    """
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
    """The share of a batch's groups that ``flags`` (G,) bool marks, as GRESO's ``compute_reward_metrics`` computes
    it: an integer count divided by G in float32, read back as a Python float."""
    return float(flags.sum().to(torch.float32) / torch.tensor(len(flags), dtype=torch.float32))


@register_planner("greso")
class GresoSkip:
    """GRESO's pre-rollout skip as a ``which_prompts`` planner (see the module docstring).

    Each step: ``plan(candidate ids, ledger, n=...)`` before sampling (skipped prompts get 0 rollouts, the others
    n; the engine draws more candidates until its batch is full, as GRESO's trainer does), then, after the step's
    groups are scored and recorded, ``update(summaries, epoch=...)``. ``state_dict`` holds the adapted
    probabilities (save it with the ledger).
    """

    kind = "which_prompts"
    Settings = GresoSettings

    def __init__(self, settings: GresoSettings | None = None):
        self.settings = settings or GresoSettings()
        self.p_easy = float(self.settings.p_easy)
        self.p_hard = float(self.settings.p_hard)

    def plan(self, ids, ledger: PromptLedger, *, n: int, generator: torch.Generator | None = None) -> Plan:
        """Skip or keep each candidate. ids (P,) prompt ids; n: rollouts a kept prompt gets.

        One uniform draw per candidate from ``generator`` (float64, on CPU): skipped where it falls below the skip
        probability, so the same generator state gives the same decisions. Evicted prompts get 0 (``evicted``).
        Returns a ``Plan`` with ``extra``: ``skip_probability`` (P,), ``easy`` / ``hard`` (P,) bool.
        """
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
        """Adapt p_easy / p_hard after a training step from the groups sampled for it (every ``record`` call's
        summary since the last update; gathered, so every rank adapts alike). Returns the metrics it logged."""
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
