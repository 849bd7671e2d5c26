"""PODS down-sampling: keep m < n of each group's rollouts; rewards (B, n) -> kept indices (B, m).

Rules: ``"max_variance"`` (exact, Lemma 3.1: for sorted rewards some best subset is the k lowest plus the m - k
highest, so one sort and prefix sums over the m + 1 candidates suffice), ``"max_reward"`` (the m highest),
``"random"`` (uniform, via ``generator``). Ties (same on CPU and CUDA for integer and dyadic rewards): the rule fixes
the kept values (max_variance: among k of equal float64 variance, the smallest k); among equal rewards the smaller
``tiebreak`` is kept first, then the lower index.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from fractions import Fraction

import torch

try:  # optional, only for its fast CPU sort (see _sort_rows); torch alone gives the same results
    import numpy as _numpy
except ImportError:  # pragma: no cover - numpy comes with every install of pods-rl's dependencies
    _numpy = None

from pods_rl.advantages import group_advantages, nanstd  # noqa: F401  (re-exported: they lived here)
from pods_rl.registry import Registry
from pods_rl.reward_checks import (
    as_reward_tensor,
    check_finite,
    check_finite_or_defer,
    group_list,
    raise_unless_ok,
)

__all__ = ["available_rules", "downsample", "downsample_deferred", "group_advantages", "max_variance_reference",
           "raise_unless_ok", "register_rule", "rule_sees_rollouts", "rule_takes_features"]

# A rule maps rewards (B, n) float, m, generator -> kept indices (B, m) int64.
Rule = Callable[[torch.Tensor, int, "torch.Generator | None"], torch.Tensor]

# ----------------------------------------------------------------------------------------------------------
# Built-in rules get validated floating rewards (B, n), 1 <= m < n, and check finiteness themselves.
# The tie-broken order (reward, tiebreak, index) is one plain sort of distinct int64 keys (order-preserving
# float32 bits above the index or tiebreak rank), so every sort algorithm and device agrees. A rule picks k
# lowest and m - k highest positions; within a reward value the first rollouts of its run are kept.


def _order_keys(values: torch.Tensor, low: torch.Tensor | None = None) -> torch.Tensor | None:
    """Distinct int64 keys (B, n) ordered by values, then ``low`` (rank < 2**32, default the index).

    None when the float64 values are not exact in float32."""
    B, n = values.shape
    values32 = values.float()  # (B, n); no copy for float32
    if values.dtype == torch.float64 and not torch.equal(values32.double(), values):
        return None  # (NaN lands here too: NaN != NaN; the float64 path reports it)
    bits = (values32 + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0, so the two tie as floats do
    # IEEE 754 is sign-magnitude: flipping the magnitude bits of negatives makes int32 order = float order
    # (with -NaN below -inf and +NaN above +inf).
    ordered = bits >> 31  # (B, n) int32 (in-place ops below: fewer allocations at PODS sizes)
    ordered &= 0x7FFFFFFF
    ordered ^= bits
    keys = ordered.to(torch.int64)
    keys <<= 32
    keys |= torch.arange(n, device=values.device) if low is None else low  # equal values: by `low`
    return keys


def _sort_rows(values: torch.Tensor) -> torch.Tensor:
    """Each row of a (B, n) int64 tensor of distinct values sorted ascending (on CPU numpy's sort is faster)."""
    long_rows = values.shape[1] > 512 and torch.get_num_threads() > 2
    if values.device.type == "cpu" and _numpy is not None and not long_rows:
        return torch.from_numpy(_numpy.sort(values.numpy(), axis=1))
    return torch.sort(values, dim=1).values


_LOW32 = 0xFFFFFFFF


class _TieOrder:
    """Each group's rollouts in the tie-broken order (reward, tiebreak, index), lowest first.

    Held as sorted int64 ``keys`` (B, n) (index or rank in the low 32 bits), or float64 ``values`` + ``order``."""

    def __init__(self, rewards: torch.Tensor, tiebreak: torch.Tensor | None):
        B, n = rewards.shape
        self.by_rank = None  # (B, n): by_rank[b, r] = index of group b's r-th rollout by (tiebreak, index)
        low = None
        if tiebreak is not None:
            tb_keys = _order_keys(tiebreak)
            if tb_keys is None:
                self.by_rank = torch.sort(tiebreak, dim=1, stable=True).indices
            else:
                self.by_rank = _sort_rows(tb_keys) & _LOW32
            low = torch.empty_like(self.by_rank)
            low.scatter_(1, self.by_rank, torch.arange(n, device=rewards.device).expand(B, n))  # the ranks
        self.keys = _order_keys(rewards, low)
        if self.keys is not None:
            self.keys = _sort_rows(self.keys)
            return
        check_finite(rewards)  # float64 path: don't rely on where a sort puts NaN
        if self.by_rank is None:
            self.values, self.order = torch.sort(rewards, dim=1, stable=True)
        else:  # a stable sort by reward of the rollouts in (tiebreak, index) order
            self.values, order = torch.sort(rewards.gather(1, self.by_rank), dim=1, stable=True)
            self.order = self.by_rank.gather(1, order)

    def indices(self, positions: torch.Tensor) -> torch.Tensor:
        """Rollout indices (B, k) at ``positions`` (B, k) of the order."""
        if self.keys is None:
            return self.order.gather(1, positions)
        low = self.keys.gather(1, positions) & _LOW32
        return low if self.by_rank is None else self.by_rank.gather(1, low)

    def ends(self, m: int) -> torch.Tensor:
        """Indices (B, 2m): the m lowest (lowest first), then the m highest (highest first)."""
        n = self.n
        if self.keys is None:
            return torch.cat([self.order[:, :m], self.order[:, n - m :].flip(1)], dim=1)
        low = torch.cat([self.keys[:, :m], self.keys[:, n - m :].flip(1)], dim=1) & _LOW32
        return low if self.by_rank is None else self.by_rank.gather(1, low)

    @property
    def n(self) -> int:
        return (self.keys if self.keys is not None else self.values).shape[1]

    def high_run(self, m: int, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the equal-reward run at ``position`` (B, 1) starts (B, 1); which of the last m hold it (B, m)."""
        n = self.n
        if self.keys is None:
            value = self.values.gather(1, position)
            return torch.searchsorted(self.values, value), self.values[:, n - m :] == value
        run = self.keys.gather(1, position) & ~_LOW32  # the smallest key of the run
        start = torch.searchsorted(self.keys, run)
        return start, self.keys[:, n - m :] < run + (1 << 32)  # (keys at or above position are >= run)


def _kept_positions(order: _TieOrder, m: int, n_low: torch.Tensor) -> torch.Tensor:
    """Kept indices (B, m), ascending, for the ``n_low`` (B, 1) lowest and m - n_low highest rewards.

    Only the high end's lowest run may be cut; it moves to the start of its run (or to position k)."""
    n = order.n
    column = torch.arange(m, device=n_low.device)  # (m,): column c keeps position c (low) or n - m + c (high)
    high = column >= n_low  # (B, m)
    # The high end's lowest position n - m + k (n when it keeps none: then nothing moves).
    start, same_run = order.high_run(m, (n - m + n_low).clamp(max=n - 1))  # (B, 1), (B, m)
    moved = high & same_run  # (B, m): high positions in that run; they move to max(start, k) onwards
    positions = torch.where(moved, column + (torch.maximum(start, n_low) - n_low), column + high * (n - m))
    return _sort_rows(order.indices(positions))


def _max_reward(
    rewards: torch.Tensor, m: int, generator: torch.Generator | None = None, *, tiebreak: torch.Tensor | None = None,
    checks: list | None = None
) -> torch.Tensor:
    """Keep the m highest rewards per group; among equal rewards the smallest tiebreak, then lowest index."""
    check_finite_or_defer(checks, rewards)
    order = _TieOrder(rewards, tiebreak)
    return _kept_positions(order, m, torch.zeros((rewards.shape[0], 1), dtype=torch.long, device=rewards.device))


def _random(
    rewards: torch.Tensor, m: int, generator: torch.Generator | None = None, *, tiebreak: torch.Tensor | None = None,
    checks: list | None = None
) -> torch.Tensor:
    """Keep m of n per group uniformly without replacement (the m smallest random keys). (B, n) -> (B, m)."""
    check_finite_or_defer(checks, rewards)  # the rewards are not used, but bad ones still mean a bug upstream
    B, n = rewards.shape
    key_device = generator.device if generator is not None else rewards.device
    keys = torch.rand((B, n), generator=generator, device=key_device)  # (B, n)
    kept = keys.argsort(dim=1)[:, :m].to(rewards.device)  # (B, m)
    return _sort_rows(kept)  # (B, m) ascending


def max_variance_reference(rewards: list[float], m: int) -> list[int]:
    """The ``max_variance`` rule for one group, readable: rewards (n,) -> the m kept indices, ascending."""
    values = sorted(Fraction(r) for r in rewards)  # exact: equal variances tie exactly, as in the batched rule
    n = len(values)

    def variance(kept):  # m^2 x the population variance of the kept values
        return m * sum(x * x for x in kept) - sum(kept) ** 2

    # Lemma 3.1: some best subset is the k lowest plus the m - k highest values. Ties: the smallest k.
    k = max(range(m + 1), key=lambda k: (variance(values[:k] + values[n - m + k:]), -k))
    kept_values = values[:k] + values[n - m + k:]
    # Among rollouts with equal reward, the lowest indices are kept (the rule's tie rule, without a tiebreak).
    kept = [i for v in sorted(set(kept_values)) for i in [j for j, r in enumerate(rewards) if Fraction(r) == v][
        :kept_values.count(v)]]
    return sorted(kept)


def _max_variance(
    rewards: torch.Tensor, m: int, generator: torch.Generator | None = None, *, tiebreak: torch.Tensor | None = None,
    checks: list | None = None
) -> torch.Tensor:
    """The size-m subset of largest reward variance per group, exact: (B, n) -> (B, m).

    Candidate k keeps the k lowest and m - k highest (Lemma 3.1); m^2 var = m sum(x^2) - sum(x)^2 by prefix sums."""
    B, n = rewards.shape
    order = _TieOrder(rewards, tiebreak)
    ends_idx = order.ends(m)  # (B, 2m): the m lowest, lowest first, then the m highest, highest first

    # prefix[0, b, 0, k]: sum of the k lowest values; prefix[0, b, 1, j]: sum of the j highest; prefix[1]:
    # the same for squares. Leading zeros make k = 0 and j = 0 the empty sums. Sums are built by adding,
    # never as differences of prefix sums, so an m = 1 or all-equal group scores exactly 0 for every
    # candidate and the tie rule below decides, not rounding noise.
    prefix = torch.empty((2, B, 2, m + 1), dtype=torch.float64, device=rewards.device)
    prefix[0, :, :, 0] = 0.0  # (prefix[1] is all written by the mul below)
    values = prefix[0, :, :, 1:]  # (B, 2, m) view
    values.copy_(rewards.gather(1, ends_idx).view(B, 2, m))
    # Shift by the group's mid-range before squaring so that a large common offset does not cancel
    # catastrophically; for integer and dyadic rewards every step below is then exact.
    low, high = values[:, 0, :1], values[:, 1, :1]  # (B, 1) each: min and max
    half_range = (high - low) * 0.5  # (B, 1)
    ok = (half_range < 1e150).all()  # 0-d; False for NaN/inf (they sit at the ends) and for too wide a spread
    if checks is None:
        raise_unless_ok(ok, rewards)
    else:
        checks.append(ok)  # on the device: the caller reads it when it syncs anyway
    values -= (low + half_range).unsqueeze(1)  # minus (max + min) / 2, computed without overflow
    torch.mul(prefix[0], prefix[0], out=prefix[1])
    prefix.cumsum_(-1)
    sums = prefix[:, :, 0] + prefix[:, :, 1].flip(-1)  # (2, B, m+1): candidate k = 0..m
    score = sums[1] * m - sums[0] * sums[0]  # (B, m+1): m^2 * variance (separate ops: no fused rounding)
    n_low = score.argmax(dim=1, keepdim=True)  # (B, 1); argmax returns the first maximum: the smallest k
    return _kept_positions(order, m, n_low)


_BUILTIN_FNS = (_max_variance, _max_reward, _random)  # trusted output; user rules' output is checked


def _takes_features(name: str, fn) -> bool:
    """True if ``fn`` also takes ``features=``; ValueError at registration if fn(rewards, m, generator) fails."""
    if not callable(fn):
        raise ValueError(f"rule {name!r} must be callable as fn(rewards, m, generator), got {fn!r}")
    if fn in _BUILTIN_FNS:
        return False
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no inspectable signature: trust them
        return False
    params = signature.parameters.values()
    takes_features = any(
        p.kind is p.VAR_KEYWORD or (p.name == "features" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in params
    )
    try:
        if takes_features:
            signature.bind(None, None, None, features=None)
        else:
            signature.bind(None, None, None)
    except TypeError as err:
        raise ValueError(
            f"rule {name!r} must be callable as fn(rewards, m, generator) (optionally with a features= keyword), "
            f"but its signature is {signature}: {err}"
        ) from None
    return takes_features


def register_rule(name: str, fn: Rule | None = None, *, overwrite: bool = False):
    """Register a down-sampling rule under ``name``; usable as a decorator ``@register_rule("my_rule")``.

    Args:
        fn: ``fn(rewards (B, n) finite float, m, generator) -> (B, m)`` distinct indices per group. With a
            ``features`` keyword it also gets a dict of (B, n, ...) tensors: the trainer passes ``"lengths"``,
            ``"rewards_per_func"`` (B, n, F), ``"truncated"``, and ``"tiebreak"`` when given one.
        overwrite: needed to re-register an existing name.
    Raises ValueError now when ``fn`` cannot be called that way."""
    return _RULES.register(name, fn, overwrite=overwrite)


# The down-sampling rules by name (pods_rl.registry: one registry for every kind of rule).
_RULES = Registry("rule", {"max_variance": _max_variance, "max_reward": _max_reward, "random": _random},
                  check=_takes_features)


def rule_takes_features(rule: str) -> bool:
    """True if the registered rule ``rule`` takes the ``features`` keyword (see ``register_rule``)."""
    if rule not in _RULES:
        raise ValueError(f"unknown down-sampling rule {rule!r}; available rules: {available_rules()}")
    return bool(_RULES.info[rule])


def rule_sees_rollouts(rule: str) -> bool:
    """True if ``rule`` can use a tiebreak: a built-in rule's function or a rule that takes ``features``."""
    if rule not in _RULES:
        raise ValueError(f"unknown down-sampling rule {rule!r}; available rules: {available_rules()}")
    return _RULES[rule] in _BUILTIN_FNS or bool(_RULES.info[rule])


def available_rules() -> list[str]:
    """Names of all registered down-sampling rules (built-in and user-registered), sorted."""
    return _RULES.names()


# ----------------------------------------------------------------------------------------------------------
# Input validation (the checks shared with group_advantages are in reward_checks.py).


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
    rewards,
    m: int,
    rule: str = "max_variance",
    *,
    tiebreak=None,
    generator: torch.Generator | None = None,
    features: dict | None = None,
) -> torch.Tensor:
    """Choose which m of each group's n rollouts to keep.

    Args:
        rewards: (n,) or (B, n) finite rewards, any real dtype and device (NaN/inf raise ValueError).
        m: rollouts to keep per group, 1 <= m <= n.
        rule: a name from ``available_rules()``, default "max_variance".
        tiebreak: optional values shaped like ``rewards`` (e.g. lengths); among equal rewards the smaller is kept.
        generator: for random rules.
        features: per-rollout tensors (B, n, ...) passed to registered rules that take ``features``.
    Returns:
        int64 indices (m,) or (B, m), distinct and ascending per group, on the rewards' device."""
    kept, ok = downsample_deferred(rewards, m, rule, tiebreak=tiebreak, generator=generator, features=features)
    raise_unless_ok(ok, rewards)
    return kept


# Long because validation, dispatch to built-in or registered rules and the edge cases share the same locals.
def downsample_deferred(rewards, m: int, rule: str = "max_variance", *, tiebreak=None,
                        generator: torch.Generator | None = None, features: dict | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``downsample`` without a device read: (kept, ok), ok a 0-d bool, False (``kept`` meaningless) if non-finite.

    Check it with ``raise_unless_ok(ok, rewards)`` where the host waits anyway."""
    rewards = as_reward_tensor(rewards)
    if rewards.dim() not in (1, 2):
        raise ValueError(
            f"rewards must have shape (n,) or (B, n) (B groups of n rollouts), got a {rewards.dim()}-d "
            f"tensor of shape {tuple(rewards.shape)}"
        )
    single_group = rewards.dim() == 1
    # .detach(): choosing indices is not differentiable, and rules may use out= ops.
    grouped = (rewards.unsqueeze(0) if single_group else rewards).detach()  # (B, n)
    B, n = grouped.shape
    if n == 0:
        raise ValueError(f"rewards has an empty group (shape {tuple(rewards.shape)}); need n >= 1 rollouts")
    m = _check_m(m, n)
    if not isinstance(rule, str) or rule not in _RULES:
        raise ValueError(f"unknown down-sampling rule {rule!r}; available rules: {available_rules()}")
    rule_fn = _RULES[rule]
    builtin = rule_fn in _BUILTIN_FNS
    if tiebreak is not None:
        tiebreak = _as_tiebreak(tiebreak, rewards.shape, single_group, grouped.device)
        if not builtin and not _RULES.info[rule]:
            raise ValueError(
                f"rule {rule!r} does not take features, so it cannot use a tiebreak; register it as "
                "fn(rewards, m, generator, *, features) and read features['tiebreak'], or drop the tiebreak"
            )
    if features is not None:
        features = _as_features(features, rewards.shape, single_group)
    checks = []  # 0-d bool tensors on the device: built-in rules fold their checks in (cheaper than a pass)
    if not builtin:
        check_finite(grouped)  # a registered rule gets checked input
    elif m == n or B == 0:
        checks.append(torch.isfinite(grouped).all())

    if m == n:
        kept = torch.arange(n, device=grouped.device).expand(B, n).clone()
    elif B == 0:
        kept = torch.empty((0, m), dtype=torch.long, device=grouped.device)
    else:
        if not grouped.is_floating_point():
            grouped = grouped.double()  # exact for integers up to 2**53; rules see floats
        if builtin:
            kept = rule_fn(grouped, m, generator, tiebreak=tiebreak, checks=checks)
        elif _RULES.info[rule]:
            features = dict(features or {})
            if tiebreak is not None:
                features["tiebreak"] = tiebreak
            kept = rule_fn(grouped, m, generator, features=features)
        else:
            kept = rule_fn(grouped, m, generator)
        if not builtin:
            kept = _check_rule_output(kept, rule, B, n, m, grouped.device)
    ok = (checks[0] if len(checks) == 1 else torch.stack(checks).all() if checks  # (one launch less: the usual)
          else torch.ones((), dtype=torch.bool, device=grouped.device))
    return (kept[0] if single_group else kept), ok


def _as_tiebreak(tiebreak, shape: torch.Size, single_group: bool, device: torch.device) -> torch.Tensor:
    """The tiebreak as a (B, n) float64 tensor on ``device``; ValueError for a bad shape, dtype or NaN."""
    tiebreak = as_reward_tensor(tiebreak, "tiebreak")
    if tiebreak.shape != shape:
        raise ValueError(
            f"tiebreak must have the shape of rewards {tuple(shape)} (one value per rollout), got shape "
            f"{tuple(tiebreak.shape)}"
        )
    tiebreak = tiebreak.detach().to(device=device, dtype=torch.float64)  # exact for integers up to 2**53
    if single_group:
        tiebreak = tiebreak.unsqueeze(0)
    nan_rows = torch.isnan(tiebreak).any(dim=1)
    if bool(nan_rows.any()):
        raise ValueError(f"tiebreak contains NaN in group(s) {group_list(nan_rows)}; NaN has no order")
    return tiebreak + 0.0  # -0.0 ties with +0.0


def _as_features(features, shape: torch.Size, single_group: bool) -> dict:
    """features as a dict of tensors each (B, n, ...); ValueError naming a feature of the wrong shape."""
    if not isinstance(features, dict):
        raise ValueError(f"features must be a dict of per-rollout tensors, got {type(features).__name__}")
    checked = {}
    for key, value in features.items():
        value = torch.as_tensor(value)
        if tuple(value.shape[: len(shape)]) != tuple(shape):
            raise ValueError(
                f"feature {key!r} must start with the shape of rewards {tuple(shape)} (one entry per rollout), "
                f"got shape {tuple(value.shape)}"
            )
        checked[key] = value.unsqueeze(0) if single_group else value
    return checked


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
