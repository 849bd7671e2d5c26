"""Adaptive rollouts: sample each prompt in rounds until its group can teach something, then down-sample to m::

    counts = torch.full((P,), k)                        # pilot: k rollouts per prompt
    while (more := plan_round(rewards, counts, m, n, round_size)).any():   # rewards (P, n) padded; more (P,)
        ...sample more[p] rollouts of prompt p into columns counts[p]..., counts += more
    keep = downsample_ragged(rewards, counts, m, "max_variance")          # (P, m), indices < counts

Padding and NaN (unscored) rewards are ignored. Rules: ``until_mixed`` (open while below m, or all equal and below n)
and ``budgeted`` (fixed budget: top up to m, then rounds for all-equal prompts, fewest rollouts first)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from pods_rl.downsample import downsample
from pods_rl.registry import Registry

__all__ = [
    "AdaptiveSettings",
    "available_adaptive_rules",
    "downsample_ragged",
    "expected_until_mixed",
    "group_is_mixed",
    "plan_round",
    "register_adaptive_rule",
]

# A rule maps (rewards (P, n), counts (P,), m, n, round_size, budget) -> more (P,) int64 rollouts to add.
AdaptiveRule = Callable[..., torch.Tensor]


def group_is_mixed(rewards: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(P,) bool: prompt p's first ``counts[p]`` rewards (P, n) hold two different non-NaN values, exactly."""
    n = rewards.shape[1]
    valid = torch.arange(n, device=rewards.device) < counts.to(rewards.device).unsqueeze(1)  # (P, n)
    valid &= ~torch.isnan(rewards)
    top = torch.where(valid, rewards, float("-inf")).amax(dim=1)  # (P,)
    bottom = torch.where(valid, rewards, float("inf")).amin(dim=1)  # (P,)
    return top > bottom


def _round_sizes(counts: torch.Tensor, m: int, n: int, round_size: int) -> torch.Tensor:
    """(P,) rollouts an open prompt gets next: round_size, at least enough to reach m, never past n."""
    return torch.minimum(n - counts, torch.clamp(m - counts, min=round_size))


def _until_mixed(rewards, counts, m, n, round_size, budget=None):
    """Open: fewer than m rollouts, or all equal and fewer than n. Each open prompt gets one round."""
    open_ = (counts < m) | (~group_is_mixed(rewards, counts) & (counts < n))  # (P,)
    return torch.where(open_, _round_sizes(counts, m, n, round_size), 0)


def _budgeted(rewards, counts, m, n, round_size, budget=None):
    """Top up prompts below m, then spend the rest of ``budget`` in rounds on all-equal prompts, fewest first."""
    if budget is None:
        raise ValueError("the 'budgeted' adaptive rule needs a budget (total rollouts per step); set adaptive_budget")
    sizes = _round_sizes(counts, m, n, round_size)  # (P,)
    more = torch.where(counts < m, sizes, 0)  # mandatory: the update needs m rollouts of every prompt
    left = int(budget) - int(counts.sum()) - int(more.sum())
    candidates = (counts >= m) & ~group_is_mixed(rewards, counts) & (counts < n)  # (P,)
    if left <= 0 or not bool(candidates.any()):
        return more
    # Fewest rollouts first, then lower index: a stable sort of the counts, candidates only.
    order = torch.sort(torch.where(candidates, counts, n + 1), stable=True).indices  # (P,)
    order = order[: int(candidates.sum())]
    cost = sizes[order].cumsum(0)  # (C,) rollouts spent if the first j candidates get their round
    chosen = order[cost <= left]  # whole rounds only
    more[chosen] = sizes[chosen]
    return more


_BUILTIN = (_until_mixed, _budgeted)


def _check_adaptive_rule(name: str, fn) -> None:
    """ValueError at registration unless fn(rewards, counts, m, n, round_size, budget) can be called."""
    if not callable(fn):
        raise ValueError(f"adaptive rule {name!r} must be callable, got {fn!r}")
    try:
        inspect.signature(fn).bind(None, None, None, None, None, None)
    except TypeError as err:
        raise ValueError(f"adaptive rule {name!r} must be callable as fn(rewards, counts, m, n, round_size, "
                         f"budget): {err}") from None
    except ValueError:  # no inspectable signature: trust it
        pass


# The adaptive rules by name (pods_rl.registry: one registry for every kind of rule).
_RULES = Registry("adaptive rule", {"until_mixed": _until_mixed, "budgeted": _budgeted}, check=_check_adaptive_rule)


def register_adaptive_rule(name: str, fn: AdaptiveRule | None = None, *, overwrite: bool = False):
    """Register ``fn(rewards (P, n), counts (P,), m, n, round_size, budget) -> (P,)`` rollouts to add (0: closed);
    also a decorator. ``plan_round`` refuses results past n or closing a prompt below m."""
    return _RULES.register(name, fn, overwrite=overwrite)


def available_adaptive_rules() -> list[str]:
    """Names of all registered adaptive rules (built-in and user-registered), sorted."""
    return _RULES.names()


def plan_round(rewards, counts, m: int, n: int, round_size: int, rule: str = "until_mixed", *,
               budget: int | None = None) -> torch.Tensor:
    """(P,) int64 CPU rollouts each prompt gets next (0: closed); ``counts + more <= n``, none below m closed.

    rewards (P, n): columns < counts[p] are real; m: kept group size; n: cap; budget: total rollouts (``budgeted``)."""
    if rule not in _RULES:
        raise ValueError(f"unknown adaptive rule {rule!r}; available: {available_adaptive_rules()}")
    rewards = torch.as_tensor(rewards).detach().cpu()
    counts = torch.as_tensor(counts, dtype=torch.long).cpu()
    if rewards.dim() != 2 or counts.shape != (rewards.shape[0],) or rewards.shape[1] != n:
        raise ValueError(f"rewards must be (P, n={n}) and counts (P,), got {tuple(rewards.shape)} and "
                         f"{tuple(counts.shape)}")
    if not 1 <= m <= n or round_size < 1:
        raise ValueError(f"need 1 <= m <= n and round_size >= 1, got m={m}, n={n}, round_size={round_size}")
    if bool(((counts < 0) | (counts > n)).any()):
        raise ValueError(f"counts must lie in [0, n={n}], got {counts.tolist()}")
    if not rewards.is_floating_point():
        rewards = rewards.double()
    fn = _RULES[rule]
    more = torch.as_tensor(fn(rewards, counts, m, n, round_size, budget)).to(torch.long).cpu()
    if fn not in _BUILTIN:
        if more.shape != counts.shape or bool((more < 0).any()) or bool((counts + more > n).any()):
            raise ValueError(f"adaptive rule {rule!r} must return (P,) non-negative counts with counts + more <= n "
                             f"(n={n}), got {more.tolist()}")
        if bool(((counts < m) & (more == 0)).any()):
            raise ValueError(f"adaptive rule {rule!r} closed a prompt with fewer than m={m} rollouts")
    return more


def ranks_within(owners: list[int]) -> list[int]:
    """For each entry, how many earlier entries equal it: [3, 3, 5, 3] -> [0, 1, 0, 2]."""
    seen: dict[int, int] = {}
    ranks = []
    for owner in owners:
        ranks.append(seen.get(owner, 0))
        seen[owner] = ranks[-1] + 1
    return ranks


# How PODSConfig spells the adaptive settings (the one-line errors name these; other callers pass their own).
CONFIG_NAMES = {"pilot": "pilot_generations", "n": "num_generations", "m": "downsample_to", "rule": "adaptive_rule",
                "round_size": "adaptive_round_size", "budget": "adaptive_budget", "reward": "adaptive_reward"}


@dataclass(frozen=True)
class AdaptiveSettings:
    """Pilot, rounds while ``rule`` keeps a prompt open, ``reward`` judging mixed (None: total). Use ``validated``."""

    pilot: int
    round_size: int
    rule: str = "until_mixed"
    budget: float | None = None
    reward: str | None = None

    @classmethod
    def validated(cls, pilot, n: int | None, m: int, rule: str = "until_mixed", round_size=None, budget=None,
                  reward: str | None = None, *, reward_names: list[str] | None = None,
                  names: Mapping[str, str] | None = None) -> AdaptiveSettings:
        """The checked settings (one ValueError line each, named as ``names`` spells them); round_size None: pilot."""
        names = {**CONFIG_NAMES, **(names or {})}
        k = pilot
        if isinstance(k, bool) or not isinstance(k, int) or n is None or not 1 <= k <= n:
            raise ValueError(f"{names['pilot']} (k) must be an integer in [1, {names['n']}={n}], got {k!r}.")
        if m >= n:
            raise ValueError(f"{names['pilot']} needs {names['m']} (m) < {names['n']} (n={n}): every prompt must "
                             f"reach m rollouts anyway, so rounds would change nothing. Lower {names['m']} or drop "
                             f"{names['pilot']}.")
        if rule not in available_adaptive_rules():
            raise ValueError(f"Unknown {names['rule']} {rule!r}; available: {available_adaptive_rules()} "
                             "(add your own with pods_rl.register_adaptive_rule).")
        r = round_size
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise ValueError(f"{names['round_size']} must be a positive integer (default: {names['pilot']}), "
                             f"got {r!r}.")
        if rule == "budgeted":
            low = max(k, m)
            if (budget is None or isinstance(budget, bool) or not isinstance(budget, (int, float))
                    or not low <= budget <= n):
                raise ValueError(f"{names['rule']}=budgeted needs {names['budget']}, the mean rollouts per prompt per "
                                 f"step, in [max({names['pilot']}, {names['m']})={low}, {names['n']}={n}]; got "
                                 f"{budget!r}.")
        elif budget is not None:
            raise ValueError(f"{names['budget']} is only read by {names['rule']}=budgeted (got {names['rule']}="
                             f"{rule!r}); drop it or set {names['rule']}=budgeted.")
        settings = cls(pilot=k, round_size=k if r is None else r, rule=rule, budget=budget, reward=reward)
        if reward_names is not None:
            settings.check_reward(reward_names, names)
        return settings

    def check_reward(self, reward_names: list[str], names: Mapping[str, str] | None = None) -> None:
        """``reward`` must be one of the run's reward functions (``reward_names``): one ``ValueError`` line."""
        if self.reward is not None and self.reward not in reward_names:
            name = {**CONFIG_NAMES, **(names or {})}["reward"]
            raise ValueError(f"{name} {self.reward!r} is not one of this run's reward functions {list(reward_names)}; "
                             "name one of them, or leave it unset to judge the reward total.")


def downsample_ragged(rewards, counts, m: int, rule: str = "max_variance", *, tiebreak=None,
                      generator: torch.Generator | None = None, features: dict | None = None) -> torch.Tensor:
    """(P, m) int64 ascending indices: prompt p keeps m of its first ``counts[p]`` (in [m, n]) rollouts (P, n).

    tiebreak, features: padded like rewards. With all counts n, exactly ``downsample``'s result."""
    rewards = torch.as_tensor(rewards)
    counts = torch.as_tensor(counts, dtype=torch.long).cpu()
    P, n = rewards.shape
    if bool(((counts < m) | (counts > n)).any()):
        raise ValueError(f"every prompt needs between m={m} and n={n} rollouts to down-sample, got {counts.tolist()}")
    kept = torch.empty((P, m), dtype=torch.long, device=rewards.device)
    for count in torch.unique(counts).tolist():
        rows = torch.nonzero(counts == count).flatten().to(rewards.device)  # (R,)
        part_tiebreak = None if tiebreak is None else torch.as_tensor(tiebreak)[rows, :count]
        part_features = None if features is None else {k: torch.as_tensor(v)[rows, :count] for k, v in features.items()}
        kept[rows] = downsample(rewards[rows, :count], m, rule, tiebreak=part_tiebreak, generator=generator,
                                features=part_features)
    return kept


def expected_until_mixed(pass_rate: float, m: int, n: int, pilot: int, round_size: int) -> tuple[float, float]:
    """(expected rollouts, P(mixed)) of ``until_mixed`` on a binary prompt of pass rate p, in closed form."""
    def all_equal(c):
        return pass_rate**c + (1 - pass_rate) ** c

    count, expected = pilot, float(pilot)
    while count < n:
        # (all-equal at c implies all-equal at every earlier count, so no product over earlier rounds)
        open_prob = 1.0 if count < m else all_equal(count)
        step = min(n - count, max(round_size, m - count))
        expected += step * open_prob
        count += step
    mixed = 1 - all_equal(count)
    return expected, mixed
