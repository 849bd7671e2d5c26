"""Knapsack-RL's rollout allocation (Li et al. 2025, "Knapsack RL"; code: github.com/liziniu/KnapsackRL,
``verl/trainer/ppo/exploration_utils.py`` and the success estimate in ``verl/utils/dataset/rl_dataset.py``).

Each prompt is a knapsack item: N rollouts cost N and are worth (1 - p^N - (1 - p)^N) p (1 - p)^2, p its estimated
success rate; the budget (default P x n) is split to maximize the sum, each prompt in [``min_n``, ``max_n``]. As in
the released code: (1) estimate p from the ledger (prompts with < ``min_buffer_length`` rollouts get n); (2) floors:
``min_n`` for 0 < p < 1, ``negative_n`` for p = 0, ``positive_n`` for p = 1; (3) fallback: if the mixed prompts'
cost is below the budget left, the surplus goes evenly to the p = 0 prompts (else to all unmixed ones); (4) the rest
to the mixed prompts by dynamic programming over whole rollouts. Where the code could not be matched exactly:
docs/concepts/rollout-budgets.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pods_rl.budget.ledger import PromptLedger, PromptStats
from pods_rl.budget.planners.base import (
    Layout,
    Plan,
    Planner,
    as_ids,
    between_m_and_n,
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
    """Knapsack-RL's knobs, named as in the released code, defaults from its ``run_knapsack_grpo_7b.sh``.

    ``negative_n`` / ``positive_n`` (None: ``min_n``) are the rollouts of a prompt at p = 0 / 1; ``alpha`` and
    ``cost_estimation`` price a prompt in the fallback test; ``reward_buffer_length`` is the estimate's window."""

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
    """(P,) bool estimated (>= ``min_buffer_length`` rollouts), (P,) float64 p: the latest group's rate when long
    enough, else the window's (the code's ``get_sample_state``)."""
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
    """(extra + 1,) float64 value of k = 0..extra rollouts beyond ``min_n`` (0 at k = 0), in the code's float32."""
    one = np.float32(1)
    out = np.zeros(extra + 1, dtype=np.float64)
    for k in range(1, extra + 1):
        out[k] = (one - rate ** (k + min_n) - (one - rate) ** (k + min_n)) * rate * ((one - rate) ** 2)
    return out


def _knapsack(rates32: np.ndarray, effective: np.ndarray, min_n: int, extra: int, budget: int) -> np.ndarray:
    """The code's ``solve_by_dp``: (B,) extra rollouts for the ``effective`` prompts, summing to ``budget``.
    dp[w] = best value using exactly w rollouts so far (ties to the smallest k, as the code)."""
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
    """(P,) int64 rollouts summing to ``total_budget`` (default P x n), from ``success_rate`` (P,) where
    ``estimated`` (P,) (else n), and info ``fallback`` / ``effective`` (the code's ``sampling_budget_by_knapsack``)."""
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
class KnapsackAllocation(Planner):
    """Knapsack-RL's allocation as a ``how_many`` planner; stateless (the ledger holds the past), deterministic."""

    kind = "how_many"
    Settings = KnapsackSettings

    def __init__(self, settings: KnapsackSettings | None = None):
        self.settings = settings or KnapsackSettings()

    @classmethod
    def complete(cls, args, layout: Layout) -> dict:
        """``min_n``/``max_n`` default to m/n, all counts in [m, n]."""
        return between_m_and_n(dict(args or {}), layout, "Knapsack-RL")

    def plan(self, ids, ledger: PromptLedger, *, n: int, total_budget: int | None = None,
             generator: torch.Generator | None = None) -> Plan:
        """Rollouts for ``ids`` (P,) under ``total_budget`` (evicted get 0); ``extra``: ``success_rate``,
        ``estimated``; metrics ``pods/knapsack_fallback``, ``pods/knapsack_effective``."""
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

