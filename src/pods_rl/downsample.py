"""PODS down-sampling rules and GRPO group-normalized advantages.

PODS (Xu et al., arXiv 2504.13818) generates ``n`` rollouts per prompt, scores them, keeps ``m < n`` of them
with a down-sampling rule and computes GRPO advantages on the kept subset only. This module holds the
rules and the advantage formula as plain tensor code (it imports nothing but torch), vectorized over a
batch of ``B`` groups:

    keep = downsample(rewards, m, rule="max_variance")   # rewards (B, n) -> keep (B, m) indices
    kept_rewards = rewards.gather(1, keep)                # (B, m)
    advantages = group_advantages(kept_rewards)           # (B, m), TRL's GRPO formula

Built-in rules (``available_rules()`` lists all, including user-registered ones):

* ``"max_variance"``: the size-``m`` subset whose reward variance is largest (exact, paper Lemma 3.1 /
  Algorithm 2). Some optimal subset always consists of the ``k`` lowest and the ``m - k`` highest rewards
  for some ``k``, so one sort per group plus prefix sums over the ``m + 1`` candidates suffices:
  O(n log n + m) per group, all groups at once.
* ``"max_reward"``: the ``m`` highest rewards.
* ``"random"``: ``m`` rollouts uniformly at random without replacement (reproducible with ``generator``).

Tie rule (deterministic; exact for integer and dyadic rewards such as 0/0.5/1, so identical on CPU and
CUDA for them): rollouts are ordered by reward descending with a stable sort, so equal rewards keep their
index order (lower index first). ``max_reward`` keeps the first ``m`` of that order, i.e. among equal
rewards the lowest indices. ``max_variance`` keeps the first ``m - k`` (highest) and the last ``k``
(lowest) of that order, and among values of ``k`` with equal (float64) variance the smallest ``k`` wins.
So an all-equal group, or ``m == 1``, keeps exactly what ``max_reward`` keeps.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

__all__ = ["available_rules", "downsample", "group_advantages", "register_rule"]

# A rule maps rewards (B, n) float, m, generator -> kept indices (B, m) int64.
Rule = Callable[[torch.Tensor, int, "torch.Generator | None"], torch.Tensor]

# ----------------------------------------------------------------------------------------------------------
# Built-in rules. Each gets a validated floating rewards tensor of shape (B, n) with 1 <= m < n. Sort-based
# rules check finiteness themselves on the sorted extremes (cheaper than a pass over all rewards).


def _sort_checked(rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable descending sort of rewards (B, n) -> (values, order), raising ValueError on NaN/inf.

    torch.sort puts NaN above +inf, so a group holds NaN or +-inf iff its first or last sorted value is
    not finite: a (B, 2) check instead of a pass over all B*n rewards.
    """
    sorted_rewards, order = torch.sort(rewards, dim=1, descending=True, stable=True)  # (B, n) each
    if rewards.device.type != "cpu":  # the full check is cheap there; don't rely on NaN placement
        _check_finite(rewards)
    elif not bool(torch.isfinite(sorted_rewards[:, [0, -1]]).all()):
        _check_finite(rewards)  # words the error, naming the groups
    return sorted_rewards, order


def _max_reward(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Keep the m highest rewards per group; among equal rewards the lowest indices. (B, n) -> (B, m)."""
    order = _sort_checked(rewards)[1]  # (B, n)
    return _ascending(order[:, :m], rewards.shape[1])


def _random(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Keep m rollouts per group uniformly at random without replacement. (B, n) -> (B, m).

    Draws B*n uniform keys from ``generator`` (on the generator's device) and keeps the m smallest keys
    of each row, which is a uniformly random m-subset; reproducible for a seeded generator.
    """
    _check_finite(rewards)  # the rewards are not used, but bad ones still mean a bug upstream
    B, n = rewards.shape
    key_device = generator.device if generator is not None else rewards.device
    keys = torch.rand((B, n), generator=generator, device=key_device)  # (B, n)
    kept = keys.argsort(dim=1)[:, :m].to(rewards.device)  # (B, m)
    return _ascending(kept, n)


def _max_variance(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Keep the size-m subset with the largest reward variance per group (exact). (B, n) -> (B, m).

    With rewards sorted descending, candidate j in 0..m keeps the j highest and the m - j lowest; by the
    paper's Lemma 3.1 one of them is optimal. Its sum and sum of squares come from prefix sums over the
    m highest and the m lowest values, and m^2 * variance = m * sum(x^2) - sum(x)^2.
    (Few ops on purpose: at PODS sizes each op's fixed cost is comparable to the sort's per-row work.)
    """
    B, n = rewards.shape
    sorted_rewards, order = torch.sort(rewards, dim=1, descending=True, stable=True)  # (B, n) each

    # Only the m highest and m lowest values can be kept: ends = the m highest then the m lowest, in
    # float64, shifted by the group's mid-range before squaring so that large reward offsets do not
    # cancel catastrophically; for integer and dyadic rewards every step below is then exact.
    # prefix[0] / prefix[1] hold the running sums of ends / ends^2 with a leading 0 (t = 0..2m), built in
    # place to keep the working set small.
    prefix = torch.zeros((2, B, 2 * m + 1), dtype=torch.float64, device=rewards.device)
    ends = prefix[0, :, 1:]  # (B, 2m) view
    ends[:, :m] = sorted_rewards[:, :m]
    ends[:, m:] = sorted_rewards[:, n - m :]
    half_range = (ends[:, :1] - ends[:, -1:]) * 0.5  # (B, 1): (max - min) / 2
    # NaN sorts first and +-inf sort to the ends, so this is False for NaN/inf groups (see _sort_checked),
    # and for spreads whose squares would overflow float64.
    if rewards.device.type != "cpu" or not bool((half_range < 1e150).all()):
        _check_finite(rewards)
        if not bool((half_range < 1e150).all()):
            raise ValueError(
                "rewards spread too wide (max - min > ~1e150) for a float64 variance; rescale them"
            )
    mid = ends[:, -1:] + half_range  # (B, 1): (max + min) / 2, without overflow
    ends -= mid
    torch.mul(ends, ends, out=prefix[1, :, 1:])
    prefix.cumsum_(-1)  # (2, B, 2m+1)

    # Candidate j keeps ends[:j] (the j highest) and ends[m + j : 2m] (the m - j lowest).
    sums = prefix[..., : m + 1] + prefix[..., 2 * m :]  # (2, B, m+1)
    sums -= prefix[..., m:]
    score = sums[1] * m  # (B, m+1): m * sum(x^2) - sum(x)^2 = m^2 * variance of candidate j
    score.addcmul_(sums[0], sums[0], value=-1)

    # Flipped, column k is the candidate with k lowest; argmax returns the first maximum: the smallest k.
    n_top = m - score.flip(1).argmax(dim=1, keepdim=True)  # (B, 1): j = number of highest kept

    # Sorted positions kept: [0, n_top) and [n - m + n_top, n).
    slot = torch.arange(m, device=rewards.device)  # (m,)
    kept_sorted = torch.where(slot < n_top, slot, slot + (n - m))  # (B, m)
    return _ascending(order.gather(1, kept_sorted), n)


def _ascending(kept: torch.Tensor, n: int) -> torch.Tensor:
    """Sort each row of distinct indices kept (B, m) in [0, n) ascending.

    Small groups: a sort of the (B, m) indices. Large groups: mark them in a (B, n) mask and read it back
    with masked_select, which walks row-major and so yields each row ascending in O(n) (measured faster
    from n ~ 1024 on CPU; see benchmarks/bench_downsample.py).
    """
    B, m = kept.shape
    if n < _MASK_FROM_N:
        return kept.sort(dim=1).values
    keep = torch.zeros((B, n), dtype=torch.bool, device=kept.device).scatter_(1, kept, True)  # (B, n)
    positions = torch.arange(n, device=kept.device).expand(B, n)
    # (Not positions[keep]: that index kernel stalls for milliseconds when its OpenMP threads compete
    # with other processes for the cores; masked_select does not.)
    return torch.masked_select(positions, keep).view(B, m)


_MASK_FROM_N = 1024

_RULES: dict[str, Rule] = {
    "max_variance": _max_variance,
    "max_reward": _max_reward,
    "random": _random,
}
_BUILTIN_FNS = (_max_variance, _max_reward, _random)  # trusted output; user rules' output is checked


def register_rule(name: str, fn: Rule | None = None, *, overwrite: bool = False):
    """Register a down-sampling rule under ``name`` so ``downsample(..., rule=name)`` can use it.

    ``fn(rewards, m, generator) -> indices``: ``rewards`` is a finite floating tensor of shape (B, n),
    ``1 <= m < n`` an int, ``generator`` a ``torch.Generator`` or None; it returns (B, m) integer indices
    into each group, distinct within a group (``downsample`` checks this and sorts them). Usable as a
    decorator: ``@register_rule("my_rule")``. Re-registering an existing name needs ``overwrite=True``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"rule name must be a non-empty string, got {name!r}")

    def _register(rule_fn: Rule) -> Rule:
        if not callable(rule_fn):
            raise ValueError(f"rule {name!r} must be callable as fn(rewards, m, generator), got {rule_fn!r}")
        if name in _RULES and not overwrite:
            raise ValueError(f"rule {name!r} is already registered; pass overwrite=True to replace it")
        _RULES[name] = rule_fn
        return rule_fn

    return _register if fn is None else _register(fn)


def available_rules() -> list[str]:
    """Names of all registered down-sampling rules (built-in and user-registered), sorted."""
    return sorted(_RULES)


# ----------------------------------------------------------------------------------------------------------
# Input validation shared by downsample and group_advantages.


def _as_reward_tensor(rewards, what: str = "rewards") -> torch.Tensor:
    """torch.as_tensor with a clear error; rejects complex and non-numeric input."""
    try:
        tensor = torch.as_tensor(rewards)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"{what} must be a tensor (or nested list/array) of numbers of shape (n,) or (B, n): {err}"
        ) from None
    if tensor.is_complex():
        raise ValueError(f"{what} must be real numbers, got dtype {tensor.dtype}")
    return tensor


def _group_list(bad_rows: torch.Tensor) -> list[int]:
    """Row indices where ``bad_rows`` (B,) is True, as a short Python list for error messages."""
    rows = torch.nonzero(bad_rows).flatten().tolist()
    return rows if len(rows) <= 20 else rows[:20] + ["..."]


def _check_finite(rewards: torch.Tensor, allow_nan: bool = False) -> None:
    """Raise ValueError naming the groups (rows of a (B, n) tensor) that hold NaN or +-inf."""
    if not rewards.is_floating_point():
        return
    # Fast path: one whole-tensor reduction; the per-group ones below only run to word an error.
    if bool(torch.isfinite(rewards).all()) or (allow_nan and not bool(torch.isinf(rewards).any())):
        return
    if not allow_nan:
        nan_rows = torch.isnan(rewards).any(dim=1)
        if bool(nan_rows.any()):
            raise ValueError(
                f"rewards contain NaN in group(s) {_group_list(nan_rows)}; score every rollout with a finite "
                "reward (e.g. 0 for unscorable completions) or drop those groups before down-sampling"
            )
    inf_rows = torch.isinf(rewards).any(dim=1)
    if bool(inf_rows.any()):
        raise ValueError(
            f"rewards contain infinite values in group(s) {_group_list(inf_rows)}; clip or replace them "
            "with finite rewards"
        )


def _check_m(m, n: int) -> int:
    if isinstance(m, bool):
        raise ValueError(f"m must be an integer number of rollouts to keep, got bool {m!r}")
    try:
        m = operator.index(m)
    except TypeError:
        raise ValueError(
            f"m must be an integer number of rollouts to keep, got {type(m).__name__} {m!r}"
        ) from None
    if not 1 <= m <= n:
        raise ValueError(f"m must satisfy 1 <= m <= n (group size n={n}), got m={m}")
    return m


# ----------------------------------------------------------------------------------------------------------
# Public API.


def downsample(
    rewards, m: int, rule: str = "max_variance", *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Choose which m of each group's n rollouts to keep.

    Args:
        rewards: rewards of shape (n,) for one group or (B, n) for B groups of n rollouts; a tensor or
            anything ``torch.as_tensor`` accepts; any real dtype (float16/bfloat16/float32/float64, integer,
            bool), any device. Must be finite (NaN/inf raise ValueError naming the groups).
        m: number of rollouts to keep per group, 1 <= m <= n.
        rule: a name from ``available_rules()``: "max_variance" (default), "max_reward", "random", or a
            rule added with ``register_rule``.
        generator: torch.Generator for random rules (reproducible draws); ignored by deterministic rules.

    Returns:
        int64 indices into each group, shape (m,) or (B, m) matching the input's rank, distinct and sorted
        ascending within each group, on the same device as ``rewards``. ``m == n`` keeps every index.
        See the module docstring for the (deterministic) tie rule.
    """
    rewards = _as_reward_tensor(rewards)
    if rewards.dim() not in (1, 2):
        raise ValueError(
            f"rewards must have shape (n,) or (B, n) (B groups of n rollouts), got a {rewards.dim()}-d "
            f"tensor of shape {tuple(rewards.shape)}"
        )
    single_group = rewards.dim() == 1
    grouped = rewards.unsqueeze(0) if single_group else rewards  # (B, n)
    B, n = grouped.shape
    if n == 0:
        raise ValueError(f"rewards has an empty group (shape {tuple(rewards.shape)}); need n >= 1 rollouts")
    m = _check_m(m, n)
    if not isinstance(rule, str) or rule not in _RULES:
        raise ValueError(f"unknown down-sampling rule {rule!r}; available rules: {available_rules()}")
    rule_fn = _RULES[rule]
    if m == n or B == 0 or rule_fn not in _BUILTIN_FNS:
        _check_finite(grouped)  # built-in rules check on their own, more cheaply

    if m == n:
        kept = torch.arange(n, device=grouped.device).expand(B, n).clone()
    elif B == 0:
        kept = torch.empty((0, m), dtype=torch.long, device=grouped.device)
    else:
        if not grouped.is_floating_point():
            grouped = grouped.double()  # exact for integers up to 2**53; rules see floats
        kept = rule_fn(grouped, m, generator)
        if rule_fn not in _BUILTIN_FNS:
            kept = _check_rule_output(kept, rule, B, n, m, grouped.device)
    return kept[0] if single_group else kept


def _check_rule_output(kept, rule: str, B: int, n: int, m: int, device: torch.device) -> torch.Tensor:
    """Validate a user rule's (B, m) indices and return them as sorted int64 on ``device``."""
    kept = torch.as_tensor(kept)
    if kept.shape != (B, m) or kept.is_floating_point() or kept.is_complex() or kept.dtype == torch.bool:
        raise ValueError(
            f"rule {rule!r} must return integer indices of shape (B, m) = ({B}, {m}), got "
            f"{kept.dtype} of shape {tuple(kept.shape)}"
        )
    kept = kept.to(device=device, dtype=torch.long).sort(dim=1).values
    if bool(((kept < 0) | (kept >= n)).any()):
        raise ValueError(f"rule {rule!r} returned indices outside [0, {n})")
    if m > 1 and bool((kept[:, 1:] == kept[:, :-1]).any()):
        raise ValueError(f"rule {rule!r} returned repeated indices within a group")
    return kept


def _nanstd(tensor: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """NaN-ignoring unbiased (Bessel-corrected) std, op for op as ``trl.trainer.utils.nanstd``.

    Fewer than two non-NaN values give NaN (TRL's convention). Replicated rather than imported so this
    module stays free of TRL; the tests compare it against TRL's own function.
    """
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    if keepdim:
        return std
    return std.squeeze(dim) if dim is not None else std.squeeze()


_SCALES = ("group", "batch", "none")


def group_advantages(rewards, eps: float = 1e-4, scale: str | bool = "group") -> torch.Tensor:
    """GRPO group-normalized advantages of the kept rewards, numerically identical to TRL 1.16.

    Reproduces ``GRPOTrainer._generate_and_score_completions`` (``multi_objective_aggregation=
    "sum_then_normalize"``), with ``eps`` in place of TRL's fixed 1e-4::

        A[b, i] = (r[b, i] - mean_b) / (std + eps)

    * mean_b: mean of group b's non-NaN rewards (``torch.nanmean``).
    * std (``scale``): "group" -> group b's std; "batch" -> std of all non-NaN rewards in the batch (the
      mean stays per group); "none" -> no division, A = r - mean_b. ``True`` means "group", ``False``
      means "none" (TRL's old boolean ``scale_rewards``).
    * std is the *unbiased* (Bessel-corrected, divide by count - 1) std of the non-NaN values, as TRL's
      ``nanstd``; with one rollout per group (m == 1) std is taken as 0, as TRL does.
    * NaN rewards (unscorable rollouts) are left out of mean and std and get advantage 0; so does every
      rollout of a group whose std is undefined (one non-NaN reward).

    Args:
        rewards: kept rewards, shape (B, m) or (m,), any real dtype, NaN allowed, +-inf not.
        eps: added to the std before dividing (>= 0).
        scale: "group", "batch", "none", True or False.

    Returns:
        Advantages with the shape of ``rewards``; dtype of ``rewards`` if floating, else float32.
    """
    rewards = _as_reward_tensor(rewards)
    if rewards.dim() not in (1, 2):
        raise ValueError(
            f"rewards must have shape (m,) or (B, m), got a {rewards.dim()}-d tensor of shape "
            f"{tuple(rewards.shape)}"
        )
    if scale is True:
        scale = "group"
    elif scale is False:
        scale = "none"
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {list(_SCALES)} (or True/False), got {scale!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")

    single_group = rewards.dim() == 1
    grouped = rewards.unsqueeze(0) if single_group else rewards  # (B, m)
    if grouped.shape[1] == 0:
        raise ValueError(f"rewards has an empty group (shape {tuple(rewards.shape)}); need m >= 1")
    if not grouped.is_floating_point():
        grouped = grouped.float()  # TRL's rewards are float32
    _check_finite(grouped, allow_nan=True)
    B, m = grouped.shape

    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # (B, 1)
    if scale in ("group", "none"):  # TRL computes the group std for "none" too (logging only)
        std = _nanstd(grouped, dim=1, keepdim=True) if m > 1 else torch.zeros_like(grouped)
    else:
        # TRL takes nanstd of the flat (B*m,) vector; flatten so the reduction is the same op.
        flat = grouped.reshape(-1)
        std = _nanstd(flat) if flat.numel() > 1 else torch.zeros_like(flat[:1])
    advantages = grouped - mean
    if scale != "none":
        advantages = advantages / (std + eps)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    return advantages[0] if single_group else advantages
