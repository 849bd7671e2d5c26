"""The selection step of PODS for every engine (TRL's step, verl's replay buffer): score, keep m, keep groups.

    settings = SelectionSettings.validated(m=8, rule="max_variance")     # checked once, one-line errors
    selection = select(rewards_per_func, weights, num_groups, settings)   # (P, n, F), (F,) -> Selection
    selection.kept          # (P, m) indices into each prompt's n rollouts (-1 pads a group smaller than m)
    selection.groups        # (B,) the prompts whose kept rollouts reach the update, ascending
    selection.kept_rows     # [p * n + j ...] the B*m rows to train on, group by group
    selection.metrics       # pods/* floats

NaN means "not scored"; such a rollout ranks as its group's average.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from pods_rl.adaptive import downsample_ragged, group_is_mixed
from pods_rl.advantages import nanstd
from pods_rl.downsample import available_rules, rule_sees_rollouts, rule_takes_features

__all__ = ["AGGREGATIONS", "TIEBREAKS", "Selection", "SelectionSettings", "all_equal", "kept_groups",
           "reward_totals", "sampled_prompts", "select", "selection_metrics"]

TIEBREAKS = ("index", "shorter", "longer")  # which of equal rewards a rule keeps: lower index, fewer/more tokens
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")  # TRL's multi_objective_aggregation

# What each setting is called where users set it; errors name the user's own spelling (see ``validated``).
PLAIN_NAMES = {"m": "m", "rule": "rule", "tiebreak": "tiebreak", "oversample_prompts": "oversample_prompts",
               "register": "pods_rl.register_rule"}


@dataclass(frozen=True)
class SelectionSettings:
    """How PODS selects: m kept per prompt, rule, tiebreak, prompt over-sampling. Build it with ``validated``."""

    m: int
    rule: str = "max_variance"
    tiebreak: str = "index"
    oversample_prompts: float = 1.0
    names: Mapping[str, str] = field(default_factory=lambda: PLAIN_NAMES, compare=False, repr=False)

    @classmethod
    def validated(cls, m, rule="max_variance", tiebreak="index", oversample_prompts=1.0, *,
                  names: Mapping[str, str] | None = None, rule_registered_here: bool = True) -> SelectionSettings:
        """The checked settings (one ValueError line each, named as ``names`` spells it); m >= 2.

        ``rule_registered_here=False`` checks only the rule name's form."""
        names = {**PLAIN_NAMES, **(names or {})}
        if isinstance(m, bool) or not isinstance(m, int) or m < 2:
            raise ValueError(f"{names['m']} must be an integer >= 2 (rollouts kept per prompt), got {m!r}: at least 2, "
                             "since the group-normalized advantage of a single kept rollout is always 0.")
        if not isinstance(rule, str) or not rule:
            raise ValueError(f"{names['rule']} must be the name of a down-sampling rule, got {rule!r}.")
        if rule_registered_here and rule not in available_rules():
            raise ValueError(f"unknown down-sampling rule {rule!r} ({names['rule']}); available rules: "
                             f"{available_rules()} (add your own with {names['register']}).")
        if tiebreak not in TIEBREAKS:
            raise ValueError(f"{names['tiebreak']} must be one of {list(TIEBREAKS)}, got {tiebreak!r}.")
        if tiebreak != "index" and rule_registered_here and not rule_sees_rollouts(rule):
            raise ValueError(f"{names['tiebreak']}={tiebreak!r} needs a rule that sees the rollouts, but rule {rule!r} "
                             f"takes no features keyword (see pods_rl.register_rule); use {names['tiebreak']}=index "
                             "or add `*, features` to the rule.")
        o = oversample_prompts
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not 1 <= o < float("inf"):
            raise ValueError(f"{names['oversample_prompts']} must be a number >= 1 (1: no over-sampling), got {o!r}.")
        return cls(m=m, rule=rule, tiebreak=tiebreak, oversample_prompts=float(o), names=names)

    def sampled_prompts(self, kept: int) -> int:
        """Prompts to sample so that ``kept`` groups reach the update (``sampled_prompts``)."""
        return sampled_prompts(kept, self.oversample_prompts)


def sampled_prompts(kept_groups: int, oversample_prompts: float = 1.0) -> int:
    """Prompts to sample so ``kept_groups`` reach the update: kept x oversample, rounded up."""
    return max(kept_groups, math.ceil(kept_groups * oversample_prompts - 1e-9))


def kept_groups(sampled: int, oversample_prompts: float = 1.0) -> int:
    """The inverse of ``sampled_prompts``: ``kept_groups(sampled_prompts(B, o), o) == B``; at least 1."""
    kept = max(1, math.floor(sampled / oversample_prompts + 1e-9))
    while kept > 1 and sampled_prompts(kept, oversample_prompts) > sampled:
        kept -= 1
    while sampled_prompts(kept + 1, oversample_prompts) <= sampled:
        kept += 1
    return kept


def reward_totals(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(..., F) rewards, (F,) weights -> (...) GRPOTrainer's weighted nansum, but NaN where no function scored."""
    weights = weights.to(device=rewards_per_func.device, dtype=rewards_per_func.dtype)
    totals = (rewards_per_func * weights).nansum(dim=-1)
    return totals.masked_fill(torch.isnan(rewards_per_func).all(dim=-1), float("nan"))


def all_equal(rewards: torch.Tensor) -> torch.Tensor:
    """(G, k) -> (G,) bool: the group's non-NaN rewards are exactly equal (float32 std of 16 x 0.8 is not 0)."""
    counts = torch.full((rewards.shape[0],), rewards.shape[1], dtype=torch.long)
    return ~group_is_mixed(rewards, counts)


@dataclass(frozen=True)
class Selection:
    """``select``'s decision: ``kept`` (P, m) ascending indices (-1 pads), ``groups`` (B,) prompts to train on."""

    kept: torch.Tensor
    groups: torch.Tensor
    n: int
    metrics: dict[str, float]

    @property
    def kept_rows(self) -> list[int]:
        """The rows to train on, flat indices ``p * n + j`` into the (P*n) rollouts."""
        rows = self.kept[self.groups] + self.n * self.groups.unsqueeze(1)  # (B, m)
        return rows[self.kept[self.groups] >= 0].tolist()


def select(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_groups: int, settings: SelectionSettings, *,
           counts: torch.Tensor | None = None, aggregation: str = "sum_then_normalize",
           features: dict[str, torch.Tensor] | None = None, generator: torch.Generator | None = None,
           gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Selection:
    """Keep ``settings.m`` of each prompt's rollouts (P, n, F), then the ``num_groups`` (B) whose kept rewards vary
    most; all-equal groups rank last, prompts below m after them. counts: (P,) real rollouts (default n);
    features: (P, n, ...), ``lengths`` for shorter/longer tiebreaks; gather: cat over processes, for metrics."""
    P, n, _ = rewards_per_func.shape
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}")
    counts = torch.full((P,), n, dtype=torch.long) if counts is None else counts.cpu().long()
    padding = torch.arange(n) >= counts.unsqueeze(1)  # (P, n)
    totals = reward_totals(rewards_per_func, weights).masked_fill(padding, float("nan"))  # (P, n) NaN: unscored, pad
    if aggregation == "sum_then_normalize":
        ranked = totals
    else:
        ranked = _normalized_sum(rewards_per_func.masked_fill(padding.unsqueeze(2), float("nan")), weights)
    # An unscored rollout ranks as an average one of its group (TRL then gives it advantage 0).
    group_mean = torch.nan_to_num(torch.nanmean(ranked, dim=1, keepdim=True), nan=0.0)
    ranked = torch.where(torch.isnan(ranked), group_mean, ranked)  # (P, n)
    kept = _kept_rollouts(ranked, counts, settings, features, generator)  # (P, m)
    kept_ranked = torch.where(kept >= 0, ranked.gather(1, kept.clamp(min=0)), float("nan"))  # (P, m)
    variance = torch.nan_to_num(_nanvar(kept_ranked.double()), nan=0.0)  # (P,)
    zero = all_equal(kept_ranked)  # (P,)
    score = torch.where(zero, torch.full_like(variance, -1.0), variance)
    # A prompt with fewer than m rollouts (a planner did not sample it) cannot fill an update group: last of all.
    score = torch.where(counts < settings.m, torch.full_like(variance, -2.0), score)
    groups = torch.sort(score, descending=True, stable=True).indices[:num_groups].sort().values  # (B,)
    selected = torch.zeros(P, dtype=torch.bool)
    selected[groups] = True
    kept_mask = torch.zeros((P, n + 1), dtype=torch.bool)  # column n takes the padding's -1
    kept_mask.scatter_(1, torch.where(kept >= 0, kept, n), True)
    kept_mask = kept_mask[:, :n]  # (P, n)
    per_group = {"totals": totals, "kept_mask": kept_mask, "variance": variance, "zero": zero, "selected": selected,
                 "sampled": counts > 0}
    if gather is not None:
        per_group = gather_per_group(per_group, gather)  # every process's groups: global metrics
    return Selection(kept=kept, groups=groups, n=n, metrics=selection_metrics(**per_group))


def gather_per_group(tensors: dict[str, torch.Tensor], gather: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    """Per-group tensors (G,) or (G, k) concatenated over processes in one collective (as one float64 table)."""
    names = list(tensors)
    columns = [tensors[name].reshape(tensors[name].shape[0], -1).double() for name in names]
    widths = [column.shape[1] for column in columns]
    table = gather(torch.cat(columns, dim=1)).cpu()  # (G * processes, total width)
    gathered = dict(zip(names, torch.split(table, widths, dim=1)))
    return {name: gathered[name].reshape(-1, *tensors[name].shape[1:]).to(tensors[name].dtype) for name in names}


def selection_metrics(totals: torch.Tensor, kept_mask: torch.Tensor, variance: torch.Tensor, zero: torch.Tensor,
                      selected: torch.Tensor, sampled: torch.Tensor | None = None) -> dict[str, float]:
    """The ``pods/*`` metrics of G groups (those ``sampled`` marks); totals, kept_mask (G, n); the rest (G,)."""
    if sampled is not None:
        totals, kept_mask, variance, zero, selected = (t[sampled] for t in (totals, kept_mask, variance, zero,
                                                                             selected))
    trained = torch.where(kept_mask & selected.unsqueeze(1), totals, float("nan"))  # (G, n)
    kept_totals = trained[selected]  # (B, n) NaN outside the kept rollouts
    return {
        "pods/reward_all_mean": torch.nanmean(totals).item(),
        "pods/reward_all_std": nanstd(totals).item(),
        "pods/reward_kept_mean": torch.nanmean(kept_totals).item(),
        "pods/reward_kept_std": nanstd(kept_totals).item(),
        "pods/frac_zero_std_all": all_equal(totals).double().mean().item(),
        "pods/frac_zero_std_kept": all_equal(kept_totals).double().mean().item(),
        "pods/prompts_sampled": float(totals.shape[0]),
        "pods/groups_zero_std": float(zero.sum()),
        "pods/groups_zero_std_kept": float((zero & selected).sum()),
        "pods/kept_groups_var_mean": variance[selected].double().mean().item(),
    }


def _kept_rollouts(ranked, counts, settings, features, generator) -> torch.Tensor:
    """(P, m) kept indices: the rule on each prompt with more than m rollouts, all of them (padded -1) otherwise."""
    P, n = ranked.shape
    m = settings.m
    kept = torch.arange(m).expand(P, m).clone()
    kept[kept >= counts.unsqueeze(1)] = -1  # a prompt with fewer than m keeps what it has
    ruled = torch.nonzero(counts > m).flatten()  # (R,)
    if len(ruled) == 0:
        return kept
    lengths = None if features is None else features.get("lengths")
    if settings.tiebreak != "index" and lengths is None:
        raise ValueError(f"tiebreak={settings.tiebreak!r} ranks rollouts by length: pass features['lengths'] (P, n)")
    tiebreak = {"index": None, "shorter": lengths, "longer": None if lengths is None else -lengths}[settings.tiebreak]
    rule_features = None
    if rule_takes_features(settings.rule):
        rule_features = {k: torch.as_tensor(v)[ruled] for k, v in (features or {}).items()}
    kept[ruled] = downsample_ragged(ranked[ruled], counts[ruled], m, settings.rule,
                                    tiebreak=None if tiebreak is None else torch.as_tensor(tiebreak)[ruled],
                                    generator=generator, features=rule_features)
    return kept


def _normalized_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(P, n, F) -> (P, n) ``normalize_then_sum``: TRL's per-function standardization, then the weighted sum."""
    mean = torch.nanmean(rewards_per_func, dim=1, keepdim=True)  # (P, 1, F)
    std = nanstd(rewards_per_func, dim=1, keepdim=True)  # (P, 1, F)
    return reward_totals((rewards_per_func - mean) / (std + 1e-4), weights)


def _nanvar(values: torch.Tensor) -> torch.Tensor:
    """(G, k) -> (G,) population variance of each row's non-NaN values."""
    mean = torch.nanmean(values, dim=1, keepdim=True)
    return torch.nanmean((values - mean) ** 2, dim=1)
