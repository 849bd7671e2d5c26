"""Knapsack-RL's rollout allocation (Li et al. 2025, "Knapsack RL: Unlocking Exploration of LLMs via Optimizing
Budget Allocation"; code: github.com/liziniu/KnapsackRL, ``verl/trainer/ppo/exploration_utils.py`` and the success
estimate in ``verl/utils/dataset/rl_dataset.py``).

Each prompt is an item of a knapsack: giving it N rollouts costs N and is worth the chance that its group is mixed,
1 - p^N - (1 - p)^N, times the information of a mixed group, p (1 - p)^2, where p is its estimated success rate.
The total budget (default P x n) is split to maximize the summed value, each prompt between ``min_n`` and
``max_n``. As in the released code:

1. **Estimate p** from the ledger: the latest group's success rate when it has at least ``reward_buffer_length``
   rollouts, else the rate over the prompt's last ``reward_buffer_length`` outcomes (``robust_epoch_estimation``);
   a prompt with fewer than ``min_buffer_length`` rollouts so far is not estimated and gets n.
2. **Floors**: an estimated prompt with 0 < p < 1 gets ``min_n``, p = 0 gets ``negative_n``, p = 1 ``positive_n``.
3. **Fallback** (``allow_fallback``): if the mixed prompts' summed cost (rollouts to see both outcomes with
   probability ``alpha``: log(1 - alpha) / log(max(p, 1 - p)), capped at ``max_n``) is below the budget left, the
   surplus goes evenly to the prompts with p = 0 (or, if none, to all prompts that are not mixed).
4. **Knapsack**: the rest goes to the mixed prompts by dynamic programming over whole rollouts (at most
   ``max_n - min_n`` more each); what cannot be placed is spread evenly over them.

``knapsack_allocation`` is steps 2-4 on given success rates; ``KnapsackAllocation.plan`` adds step 1 from the
ledger. Where the code could not be matched exactly: docs/concepts/rollout-budgets.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pods_rl.budget.ledger import PromptLedger, PromptStats
from pods_rl.budget.planners.base import (
    Plan,
    as_ids,
    check_choice,
    check_int,
    check_number,
    make_plan,
    register_planner,
)

__all__ = ["KnapsackAllocation", "KnapsackSettings", "estimate_success_rate", "knapsack_allocation"]

_OWNER = "Knapsack-RL"


@dataclass(frozen=True)
class KnapsackSettings:
    """Knapsack-RL's knobs, named as in the released code (defaults: its ``run_knapsack_grpo_7b.sh``).

    ``min_n`` (2) / ``max_n`` (128): the fewest / most rollouts of a mixed prompt; ``negative_n`` / ``positive_n``
    (None: ``min_n``): rollouts of a prompt estimated at p = 0 / p = 1; ``alpha`` (0.9) and ``cost_estimation``
    ("probability" or "expectation"): the cost of a prompt in the fallback test; ``allow_fallback`` (True);
    ``reward_buffer_length`` (16) / ``min_buffer_length`` (8): the success estimate's window and the rollouts a
    prompt needs before it is estimated; ``epoch_estimation`` / ``robust_epoch_estimation`` (True, True): use the
    latest group alone when it is long enough (else the window).
    """

    min_n: int = 2
    max_n: int = 128
    negative_n: int | None = None
    positive_n: int | None = None
    alpha: float = 0.9
    cost_estimation: str = "probability"
    allow_fallback: bool = True
    reward_buffer_length: int = 16
    min_buffer_length: int = 8
    epoch_estimation: bool = True
    robust_epoch_estimation: bool = True

    def __post_init__(self):
        check_int(_OWNER, "min_n", self.min_n, 0)
        check_int(_OWNER, "max_n", self.max_n, max(self.min_n, 1), fix="max_n >= min_n")
        for name in ("negative_n", "positive_n"):
            if getattr(self, name) is not None:
                check_int(_OWNER, name, getattr(self, name), 0)
        check_number(_OWNER, "alpha", self.alpha, 0.0, 1.0, low_open=True, high_open=True)
        check_choice(_OWNER, "cost_estimation", self.cost_estimation, ("probability", "expectation"))
        check_int(_OWNER, "reward_buffer_length", self.reward_buffer_length, 1)
        check_int(_OWNER, "min_buffer_length", self.min_buffer_length, 0)
        for name in ("allow_fallback", "epoch_estimation", "robust_epoch_estimation"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{_OWNER} {name} must be True or False, got {getattr(self, name)!r}")


def estimate_success_rate(stats: PromptStats, settings: KnapsackSettings | None = None):
    """(P,) bool estimated, (P,) float64 success rate p from the ledger's columns (the code's ``get_sample_state``).

    Estimated: at least ``min_buffer_length`` rollouts recorded. p: the latest group's rate when
    ``epoch_estimation`` and (it has >= ``reward_buffer_length`` rollouts or not ``robust_epoch_estimation``), else
    the rate of the last ``reward_buffer_length`` outcomes; 0 for a prompt never seen.
    """
    s = settings or KnapsackSettings()
    recent = stats.recent_success_rate(s.reward_buffer_length)
    latest = stats.last_group_successes.double() / stats.last_group_rollouts.clamp(min=1).double()
    use_latest = stats.last_group_rollouts >= s.reward_buffer_length
    if not s.robust_epoch_estimation:
        use_latest = stats.last_group_rollouts > 0
    rate = torch.where(use_latest, latest, recent) if s.epoch_estimation else recent
    rate = torch.where(stats.seen, rate, 0.0)
    return stats.rollouts >= s.min_buffer_length, rate


def _spread(budget: np.ndarray, indices, amount: int) -> None:
    """Add ``amount`` evenly over ``indices`` (in order; the first ``amount % len`` get one more), in place."""
    base, remainder = divmod(amount, len(indices))
    for position, i in enumerate(indices):
        budget[i] += base + (1 if position < remainder else 0)


def _cost(p: float, s: KnapsackSettings) -> float:
    """Rollouts a mixed prompt needs (the code's cost), float64."""
    if s.cost_estimation == "probability":
        return float(np.log(1 - s.alpha) / np.log(max(p, 1 - p)))
    return 1 / (p * (1 - p)) - 1


def _gains(rate: np.float32, min_n: int, extra: int) -> np.ndarray:
    """(extra + 1,) float64: value of giving a mixed prompt k = 0..extra rollouts beyond ``min_n`` (0 for k = 0,
    as in the code's DP). Computed in float32 scalars exactly as the code's numpy path does, then widened."""
    one = np.float32(1)
    out = np.zeros(extra + 1, dtype=np.float64)
    for k in range(1, extra + 1):
        out[k] = (one - rate ** (k + min_n) - (one - rate) ** (k + min_n)) * rate * ((one - rate) ** 2)
    return out


def _knapsack(rates32: np.ndarray, effective: np.ndarray, min_n: int, extra: int, budget: int) -> np.ndarray:
    """The code's ``solve_by_dp``: (B,) extra rollouts for the ``effective`` prompts, summing to ``budget``.

    dp[w] = best value using exactly w rollouts over the items so far; each item takes k in 0..extra (first maximum
    wins: k = 0, then the smallest k, as the code's strict comparisons do). The largest reachable w <= budget is
    backtracked; the rest is spread evenly over the effective prompts.
    """
    out = np.zeros(len(rates32), dtype=np.int64)
    if budget <= 0 or len(effective) == 0:
        return out
    gains = {}
    dp = np.full(budget + 1, -np.inf)
    dp[0] = 0.0
    choice = np.zeros((len(effective), budget + 1), dtype=np.int64)
    for item, i in enumerate(effective):
        rate = rates32[i]
        gain = gains.setdefault(float(rate), _gains(rate, min_n, extra))
        padded = np.concatenate([np.full(extra, -np.inf), dp])
        candidates = np.lib.stride_tricks.sliding_window_view(padded, extra + 1)[:, ::-1] + gain  # [w, k] = dp[w-k]+g
        choice[item] = candidates.argmax(axis=1)
        dp = candidates[np.arange(budget + 1), choice[item]]
    usable = int(np.flatnonzero(dp > -np.inf).max())
    w = usable
    for item in range(len(effective) - 1, -1, -1):
        out[effective[item]] += choice[item, w]
        w -= choice[item, w]
    if budget - usable > 0:
        _spread(out, effective, budget - usable)
    return out


def knapsack_allocation(success_rate, estimated, n: int, total_budget: int | None = None,
                        settings: KnapsackSettings | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Rollouts per prompt under a total budget (the code's ``sampling_budget_by_knapsack``).

    Args:
        success_rate: (P,) estimated success rates in [0, 1].
        estimated: (P,) bool, which prompts have an estimate (the others get n).
        n: the default rollouts per prompt.
        total_budget: rollouts for the P prompts (default P x n); must cover the floors.
        settings: ``KnapsackSettings``.

    Returns: (P,) int64 rollouts summing to ``total_budget``, and info: ``fallback`` (0/1), ``effective`` (prompts
    with 0 < p < 1 that entered the knapsack).
    """
    s = settings or KnapsackSettings()
    p64 = torch.as_tensor(success_rate, dtype=torch.float64).numpy()
    valid = torch.as_tensor(estimated, dtype=torch.bool).numpy()
    if p64.ndim != 1 or valid.shape != p64.shape or not bool(((p64 >= 0) & (p64 <= 1)).all()):
        raise ValueError(f"success_rate must be (P,) in [0, 1] and estimated (P,) bool, got shapes {p64.shape} and "
                         f"{valid.shape}")
    check_int(_OWNER, "n", n, 1)
    size = len(p64)
    total = size * n if total_budget is None else total_budget
    check_int(_OWNER, "total_budget", total, 0)
    negative_n = s.min_n if s.negative_n is None else s.negative_n
    positive_n = s.min_n if s.positive_n is None else s.positive_n
    effective_mask = valid & (p64 > 0) & (p64 < 1)
    budget = np.where(~valid, n, np.where(effective_mask, s.min_n, np.where(p64 == 0, negative_n, positive_n)))
    budget = budget.astype(np.int64)
    # The code keeps rates in float32, 0 for prompts not estimated (so those count as "p = 0" below).
    rates32 = np.where(valid, p64, 0.0).astype(np.float32)
    effective = np.flatnonzero(effective_mask)
    left = total - int(budget.sum())
    if left < 0:
        raise ValueError(f"{_OWNER} total_budget={total} is below the rollouts the prompts get anyway "
                         f"({int(budget.sum())}: n={n} per prompt not yet estimated, min_n/negative_n/positive_n per "
                         "estimated one); raise the budget or lower those floors")
    fallback = False
    if left > 0 and len(effective) == 0:
        zero = np.flatnonzero(rates32 == 0)
        if len(zero):
            _spread(budget, zero, left)
        else:  # every prompt estimated at p = 1 (the code sets n for all, which fits only the default budget)
            budget[:] = 0
            _spread(budget, np.arange(size), total)
        return torch.from_numpy(budget), {"fallback": 0.0, "effective": 0.0}
    costs32 = np.array([_cost(float(p64[i]), s) for i in effective], dtype=np.float32)
    estimated_cost = sum(int(min(s.max_n, c)) for c in costs32)
    if estimated_cost < left and s.allow_fallback:
        candidates = np.flatnonzero(rates32 == 0)
        if len(candidates) == 0:
            candidates = np.flatnonzero(~effective_mask)
        if len(candidates):  # (the code divides by zero when every prompt is mixed: then no fallback here)
            _spread(budget, candidates, left - estimated_cost)
            left, fallback = estimated_cost, True
    budget += _knapsack(rates32, effective, s.min_n, s.max_n - s.min_n, left)
    return torch.from_numpy(budget), {"fallback": float(fallback), "effective": float(len(effective))}


@register_planner("knapsack")
class KnapsackAllocation:
    """Knapsack-RL's allocation as a ``how_many`` planner (see the module docstring). Stateless: what it needs of the
    past is in the ledger. Deterministic (no draws); the ``generator`` argument is accepted for the common shape."""

    kind = "how_many"
    Settings = KnapsackSettings

    def __init__(self, settings: KnapsackSettings | None = None):
        self.settings = settings or KnapsackSettings()

    def plan(self, ids, ledger: PromptLedger, *, n: int, total_budget: int | None = None,
             generator: torch.Generator | None = None) -> Plan:
        """Rollouts for each of the P candidates ``ids`` (P,) under ``total_budget`` (default P x n).

        Evicted prompts get 0 and the budget goes to the others (their share: ``total_budget`` is still the total).
        Returns a ``Plan`` with ``extra``: ``success_rate`` (P,) float64 and ``estimated`` (P,) bool; metrics
        ``pods/knapsack_fallback`` (0/1), ``pods/knapsack_effective`` (mixed prompts in the knapsack).
        """
        check_int(_OWNER, "n", n, 1)
        ids = as_ids(ids)
        stats = ledger.stats(ids)
        estimated, rate = estimate_success_rate(stats, self.settings)
        live = ~stats.evicted
        total = len(ids) * n if total_budget is None else total_budget
        rollouts = torch.zeros(len(ids), dtype=torch.long)
        info = {"fallback": 0.0, "effective": 0.0}
        if bool(live.any()):
            rollouts[live], info = knapsack_allocation(rate[live], estimated[live], n, total, self.settings)
        metrics = {"pods/knapsack_fallback": info["fallback"], "pods/knapsack_effective": info["effective"]}
        return make_plan(ids, rollouts, skipped=live & (rollouts == 0), evicted=stats.evicted,
                         extra={"success_rate": rate, "estimated": estimated}, metrics=metrics)

    def state_dict(self) -> dict:
        """Nothing: the planner keeps no state of its own."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""

