"""PODS that picks its own n: a cost-aware ``how_many`` planner (``rollout_planner="auto"``).

Each step it gives prompt i between ``min_n`` (m) and ``max_n`` (n) rollouts, maximizing sum_i L_i(n_i) / T(n) with
T = c0 + c_s * sum_i n_i + c_t * m * S, exactly (Dinkelbach). L(n) = g(m) + efficiency * (g(n) - g(m)), g(n) =
E[V_{n,m}] the expected reward variance of the max-variance m-subset of n binary rewards under each prompt's
Beta-binomial (the ledger's recent outcomes, faded by their age into the batch's pass rate now); ``efficiency`` is
calibrated on the CPU studies, and the choice is made at its lower bound ``efficiency_low`` (more than m only on a
confident gain). c_s is the *marginal* second of a sampled rollout: sampling seconds fitted as a + b * N, the slope
from steps close in time at different totals N (slow steps set aside; bounded probes while the slope is unknown,
none where no slope could change the choice); c_t the median update seconds per trained rollout.
Where its models predict that sampling does not pay it chooses m everywhere: GRPO. Where giving every prompt n would
lengthen the step by at most ``free_share`` (3%), every prompt gets n: near-free rollouts insure the gain model's
error. The derivation, assumptions and limits: docs/concepts/auto-n.md. Shapes: P prompts, K candidate counts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners.base import (
    Layout,
    Plan,
    Planner,
    as_ids,
    between_m_and_n,
    check_int,
    check_number,
    make_plan,
    register_planner,
)

__all__ = ["AutoN", "AutoSettings", "CostEstimate", "RolloutCostModel", "allocate_for_signal", "beta_binomial_pmf",
           "binomial_pmf", "expected_selected_variance", "selected_variance_table", "signal_table",
           "ledger_now", "local_slope", "pairs_slope", "success_posterior", "theil_sen"]

_OWNER = "auto"
SLOW_STEP = 2.0  # step_cost's rule: a step over 2x the fitted time is an interruption, set aside


# ---------------------------------------------------------------------------------------------------------------
# The gain model: the expected reward variance that max-variance selection keeps.

def binomial_pmf(p, n: int) -> torch.Tensor:
    """(P,) success probabilities in [0, 1] -> (P, n+1) float64 P(K = k), K ~ Bin(n, p)."""
    p = torch.as_tensor(p, dtype=torch.float64).reshape(-1, 1)
    k = torch.arange(n + 1, dtype=torch.float64)
    log_choose = math.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
    return torch.exp(log_choose + torch.xlogy(k, p) + torch.xlogy(n - k, 1 - p))  # xlogy: 0 * log 0 = 0


def beta_binomial_pmf(a, b, n: int) -> torch.Tensor:
    """(P,) Beta(a, b) -> (P, n+1) float64 P(K = k), K ~ BetaBin(n, a, b), by Polya's urn (the readable reference)."""
    a = torch.as_tensor(a, dtype=torch.float64).reshape(-1, 1)
    b = torch.as_tensor(b, dtype=torch.float64).reshape(-1, 1)
    pmf = torch.ones(len(a), 1, dtype=torch.float64)  # (P, draws+1): no draw yet
    for draws in range(n):
        up = (a + torch.arange(draws + 1)) / (a + b + draws)  # (P, draws+1)
        pmf = torch.nn.functional.pad(pmf * (1 - up), (0, 1)) + torch.nn.functional.pad(pmf * up, (1, 0))
    return pmf


def expected_selected_variance(pmf, m: int) -> torch.Tensor:
    """(P, n+1) pmf of the successes K among n binary rewards -> (P,) E[V_{n,m}], the expected (population) variance
    of the max-variance m-subset: (1/m^2) sum_{t=1}^{m/2} (m-2t+1) P(t <= K <= n-t) (docs/concepts/auto-n.md)."""
    pmf = torch.as_tensor(pmf, dtype=torch.float64)
    n = pmf.shape[1] - 1
    if not 1 <= m <= n:
        raise ValueError(f"m must be in [1, n] = [1, {n}], got {m}")
    cdf = pmf.cumsum(dim=1)  # (P, n+1) P(K <= k)
    t = torch.arange(1, m // 2 + 1)  # (T,)
    inside = cdf[:, n - t] - cdf[:, t - 1]  # (P, T) P(t <= K <= n - t)
    return (inside * (m - 2 * t + 1).double()).sum(dim=1) / m**2


def _weighted_lower_tail(a: np.ndarray, b: np.ndarray, ns: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(U,) Beta(a, b), (K,) counts, (J,) weights -> (U, K) sum_j weights[j] * P(K_n <= j), K_n ~ BetaBin(n, a, b):
    only the small tail (j < m/2), from P(K_n = 0) = prod_{d<n} (b+d)/(a+b+d) by the pmf's ratio in k."""
    a, b = a[:, None], b[:, None]  # (U, 1)
    d = np.arange(int(ns.max()))
    zero = np.concatenate([np.ones((len(a), 1)), np.cumprod((b + d) / (a + b + d), axis=1)], axis=1)  # (U, N+1)
    pmf = zero[:, ns]  # (U, K) P(K_n = 0)
    cdf = pmf.copy()
    total = weights[0] * cdf
    for k in range(len(weights) - 1):
        pmf = pmf * ((ns - k) * (a + k) / ((k + 1) * (b + ns - k - 1)))
        cdf += pmf
        total += weights[k + 1] * cdf
    return total


def selected_variance_table(a, b, m: int, ns) -> np.ndarray:
    """(U,) Beta(a, b), (K,) counts n >= m -> (U, K) E[V_{n,m}]: ``expected_selected_variance``, batched."""
    a, b, ns = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), np.asarray(ns, dtype=np.int64)
    if m // 2 == 0:
        return np.zeros((len(a), len(ns)))
    weights = (m - 2 * np.arange(1, m // 2 + 1) + 1).astype(np.float64)  # (m/2,) weight of t = 1..m/2
    return (weights.sum() - _weighted_lower_tail(a, b, ns, weights) - _weighted_lower_tail(b, a, ns, weights)) / m**2


def signal_table(a, b, m: int, max_n: int, efficiency: float = 1.0, min_n: int | None = None) -> torch.Tensor:
    """(P,) Beta posteriors -> (P, K) float64 learning signal L(n) for n = min_n..max_n (K = max_n - min_n + 1):
    g(min_n) + efficiency * (g(n) - g(min_n)), g(n) = E[V_{n,m}] under the Beta-binomial. Prompts with equal (a, b)
    are computed once."""
    min_n = m if min_n is None else min_n
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    unique, inverse = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
    gains = selected_variance_table(unique[:, 0], unique[:, 1], m, np.arange(min_n, max_n + 1))  # (U, K)
    signal = gains[:, :1] + efficiency * (gains - gains[:, :1])
    return torch.from_numpy(signal[inverse.reshape(-1)])


def success_posterior(window: torch.Tensor, prior_strength: float, age=None, half_life: float | None = None,
                      pass_rate_now: float | None = None):
    """(P, W) recent outcomes (1, 0, -1 empty) -> (P,) Beta posterior (a, b): a prior of ``prior_strength`` at
    ``pass_rate_now`` (None: these outcomes' rate; 1/2 without any); each outcome weighs 0.5 ** (``age`` (P,) /
    ``half_life``), so an old pass rate fades into the batch's current one."""
    recent = np.asarray(window)  # (P, W)
    weight = np.ones(len(recent))
    if age is not None and half_life is not None:
        weight = 0.5 ** (np.maximum(np.asarray(age, dtype=np.float64), 0.0) / half_life)
    successes = (recent == 1).sum(axis=1) * weight  # (P,) float64
    failures = (recent == 0).sum(axis=1) * weight
    outcomes = float((successes + failures).sum())
    pass_rate = pass_rate_now if pass_rate_now is not None else (
        float(successes.sum()) / outcomes if outcomes > 0 else 0.5)
    pass_rate = min(max(pass_rate, 1e-3), 1 - 1e-3)  # keep the prior proper
    return prior_strength * pass_rate + successes, prior_strength * (1 - pass_rate) + failures


def ledger_now(ledger: PromptLedger) -> tuple[int, float | None]:
    """The ledger's latest step and the pass rate of the groups recorded at it (None before any): "now" for aging."""
    stats = {name: column.numpy() for name, column in
             ledger.every("last_step", "last_group_rollouts", "last_group_successes").items()}  # (N,) each
    if len(stats["last_step"]) == 0:
        return -1, None
    now = int(stats["last_step"].max())
    latest = (stats["last_step"] == now) & (stats["last_group_rollouts"] > 0)
    rollouts = int(stats["last_group_rollouts"][latest].sum())
    return now, (int(stats["last_group_successes"][latest].sum()) / rollouts if rollouts else None)


# ---------------------------------------------------------------------------------------------------------------
# The optimizer: the most signal per second, exactly.

def allocate_for_signal(signal: torch.Tensor, counts: torch.Tensor, *, sample_seconds: float,
                        fixed_seconds: float) -> tuple[torch.Tensor, float]:
    """signal (P, K), counts (K,) ascending -> (P,) int64 counts maximizing sum_i signal[i, k_i] / (fixed_seconds +
    sample_seconds * sum_i counts[k_i]), and that ratio. Dinkelbach: for a ratio lam each prompt alone maximizes
    signal - lam * sample_seconds * count (ties: the smaller); that choice's ratio is the next lam, to the maximum."""
    signal = np.asarray(signal, dtype=np.float64)  # (P, K)
    counts = np.asarray(counts, dtype=np.float64)  # (K,)
    if sample_seconds < 0 or fixed_seconds < 0 or not math.isfinite(sample_seconds + fixed_seconds):
        raise ValueError(f"costs must be finite and >= 0, got sample {sample_seconds!r}, fixed {fixed_seconds!r}")
    rows = np.arange(signal.shape[0])

    def ratio(choice):
        total = fixed_seconds + sample_seconds * counts[choice].sum()
        value = signal[rows, choice].sum()
        return value / total if total > 0 else (math.inf if value > 0 else 0.0)

    choice = np.zeros(signal.shape[0], dtype=np.int64)
    lam = ratio(choice)
    for _ in range(100):  # converges in a handful (superlinear); the bound only guards against float ties
        if not math.isfinite(lam):  # nothing costs anything: the most signal
            choice = signal.argmax(axis=1)
            break
        new = (signal - lam * sample_seconds * counts).argmax(axis=1)  # the first (smallest) count among ties
        new_lam = ratio(new)
        if new_lam <= lam * (1 + 1e-12):
            break
        choice, lam = new, new_lam
    return torch.from_numpy(counts[choice].astype(np.int64)), float(lam)


# ---------------------------------------------------------------------------------------------------------------
# The cost model: marginal seconds of a sampled rollout, seconds per trained one, from the phase clock.

@dataclass(frozen=True)
class CostEstimate:
    """Seconds: ``fixed`` c0, ``per_sampled`` c_s (marginal; the average, an upper bound, unless ``slope_known``),
    ``per_trained`` c_t."""

    fixed: float
    per_sampled: float
    per_trained: float
    slope_known: bool
    observations: int


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of y ~ a + b x: the median of pairwise slopes over distinct x, the median residual."""
    i, j = np.triu_indices(len(x), k=1)
    apart = x[i] != x[j]
    slope = float(np.median((y[j] - y[i])[apart] / (x[j] - x[i])[apart]))
    return slope, float(np.median(y - slope * x))


def local_pairs(x: np.ndarray, t: np.ndarray, gap: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    """(N,) totals x, step indices t -> pairs (i, j), i < j, <= ``gap`` steps apart, totals >= ``spread`` apart."""
    i, j = np.triu_indices(len(x), k=1)
    close = (np.abs(t[j] - t[i]) <= gap) & (np.maximum(x[i], x[j]) >= spread * np.minimum(x[i], x[j]))
    return i[close], j[close]


def local_slope(x: np.ndarray, y: np.ndarray, t: np.ndarray, gap: int, spread: float) -> float | None:
    """(N,) totals, seconds, step indices -> the upper quartile of the slopes over ``local_pairs`` (None: none)."""
    # Close pairs: a load that drifts between distant steps cancels between close ones. The upper quartile: where
    # they disagree (timing noise), the dearer reading, so that noise does not buy rollouts.
    return pairs_slope(x, y, *local_pairs(x, t, gap, spread))


def pairs_slope(x: np.ndarray, y: np.ndarray, i: np.ndarray, j: np.ndarray) -> float | None:
    """(N,) totals, seconds and pairs (i, j) of them -> the upper quartile of the pairs' slopes (None: no pair)."""
    return float(np.quantile((y[j] - y[i]) / (x[j] - x[i]), 0.75)) if len(i) else None


class RolloutCostModel:
    """A running fit of a step's seconds from the phase clock: sampling (generation + scoring) as a + b * N over the
    rollouts N it sampled, and update seconds per trained rollout; the last ``window`` steps. The slope b comes only
    from steps at most ``pair_gap`` sampling steps apart; the intercept a from the latest ``recent`` steps."""

    def __init__(self, window: int = 64, spread: float = 1.25, pair_gap: int = 4, recent: int = 16):
        self.sampled: deque[tuple[float, float, int]] = deque(maxlen=window)  # (N, seconds, index) per sampling step
        self.trained: deque[float] = deque(maxlen=window)  # update seconds per trained rollout, per optimizer step
        self.spread = spread  # totals at least this far apart (max/min) tell the slope
        self.pair_gap, self.recent = pair_gap, recent
        self.count = 0  # sampling steps observed (the index of the next)

    def observe(self, *, sampled: int, sample_seconds: float, trained: int, update_seconds: float) -> None:
        """One optimizer step's counts and phase seconds (``sampled`` 0: the step reused an earlier generation)."""
        if sampled > 0 and math.isfinite(sample_seconds) and sample_seconds >= 0:
            self.sampled.append((float(sampled), float(sample_seconds), self.count))
            self.count += 1
        if trained > 0 and math.isfinite(update_seconds) and update_seconds >= 0:
            self.trained.append(float(update_seconds) / trained)

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, y, t = (np.array(column, dtype=np.float64) for column in zip(*self.sampled))
        return x, y, t

    def slope_known(self) -> bool:
        """Whether the window holds >= 4 sampling steps and >= 2 pairs of them close in time (``pair_gap``) whose
        totals differ by ``spread`` or more."""
        if len(self.sampled) < 4:
            return False
        x, _, t = self._columns()
        return len(local_pairs(x, t, self.pair_gap, self.spread)[0]) >= 2

    def estimate(self) -> CostEstimate | None:
        """The current ``CostEstimate``; None before a sampling step (``per_trained`` NaN before an update step)."""
        if not self.sampled:
            return None
        per_trained = np.asarray(self.trained) if self.trained else np.array([np.nan])
        per_trained = float(np.median(per_trained[~(per_trained > SLOW_STEP * np.median(per_trained))]))
        x, y, t = self._columns()
        usual = y / x <= SLOW_STEP * np.median(y / x)
        unknown = CostEstimate(0.0, float(np.median((y / x)[usual])), per_trained, False, len(x))
        i, j = local_pairs(x, t, self.pair_gap, self.spread) if len(x) >= 4 else (np.zeros(0, dtype=int),) * 2
        if len(i) < 2:  # the slope is not known (``slope_known``)
            return unknown
        slope = pairs_slope(x, y, i, j)  # ``local_slope``, on the pairs found once
        latest = t >= t.max() - self.recent + 1
        intercept = float(np.median((y - slope * x)[latest]))
        usual = y <= SLOW_STEP * np.maximum(intercept + slope * x, 1e-12)  # interruptions set aside, then refit
        if not usual.all():  # else the refit is the fit
            refit = local_slope(x[usual], y[usual], t[usual], self.pair_gap, self.spread)
            slope = refit if refit is not None else slope
        if slope <= 0:  # a rollout costs something: a slope <= 0 is noise, not a free rollout; the average bounds it
            return unknown
        keep = usual & latest if (usual & latest).any() else usual
        return CostEstimate(max(float(np.median(y[keep] - slope * x[keep])), 0.0), slope, per_trained, True,
                            len(x))

    def state_dict(self) -> dict:
        """The window of observations."""
        return {"sampled": [list(row) for row in self.sampled], "trained": list(self.trained), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` (a window saved before step indices were kept: one step apart, in order)."""
        rows = state.get("sampled", [])
        self.count = int(state.get("count", len(rows)))
        self.sampled.clear()
        start = self.count - len(rows)
        self.sampled.extend((float(row[0]), float(row[1]), int(row[2]) if len(row) > 2 else start + k)
                            for k, row in enumerate(rows))
        self.trained.clear()
        self.trained.extend(state.get("trained", []))


# ---------------------------------------------------------------------------------------------------------------
# The planner.

@dataclass(frozen=True)
class AutoSettings:
    """The planner's knobs (docs/concepts/auto-n.md, "Settings"); ``*_ms`` fix c_s, c_t, c0 instead of measuring
    them."""

    min_n: int | None = None
    max_n: int | None = None
    efficiency: float = 0.435  # fitted to the CPU studies: benchmarks/results/cpu-2core-amd-epyc/auto_calibration
    efficiency_low: float | None = 0.20  # the calibration's lower 95% bound: more than m only on a confident gain
    age_half_life: float | None = 16.0  # updates after which a ledger outcome counts half (None: never fades)
    free_share: float | None = 0.03  # max_n for every prompt where that lengthens the step by at most this share
    prior_strength: float = 2.0
    warmup_steps: int = 2
    probe_gap: int = 3
    max_probes: int = 6
    cost_window: int = 64
    cost_pair_gap: int = 4
    sample_ms: float | None = None
    train_ms: float | None = None
    fixed_ms: float | None = None

    def __post_init__(self):
        for name in ("min_n", "max_n"):
            if getattr(self, name) is not None:
                check_int(_OWNER, name, getattr(self, name), 1)
        if self.min_n is not None and self.max_n is not None and self.max_n < self.min_n:
            raise ValueError(f"{_OWNER} max_n={self.max_n} must be >= min_n={self.min_n}")
        check_number(_OWNER, "efficiency", self.efficiency, 0.0, 100.0)
        if self.efficiency_low is not None:
            check_number(_OWNER, "efficiency_low", self.efficiency_low, 0.0, 100.0)
        if self.age_half_life is not None:
            check_number(_OWNER, "age_half_life", self.age_half_life, 0.0, 1e9, low_open=True)
        check_number(_OWNER, "prior_strength", self.prior_strength, 0.0, 1e6, low_open=True)
        if self.free_share is not None:
            check_number(_OWNER, "free_share", self.free_share, 0.0, 1.0)
        check_int(_OWNER, "warmup_steps", self.warmup_steps, 0)
        check_int(_OWNER, "probe_gap", self.probe_gap, 1)
        check_int(_OWNER, "max_probes", self.max_probes, 0)
        check_int(_OWNER, "cost_window", self.cost_window, 4)
        check_int(_OWNER, "cost_pair_gap", self.cost_pair_gap, 1)
        for name in ("sample_ms", "train_ms", "fixed_ms"):
            if getattr(self, name) is not None:
                check_number(_OWNER, name, getattr(self, name), 0.0, 1e9)
        if self.fixed_ms is not None and self.sample_ms is None:
            raise ValueError(f"{_OWNER} fixed_ms is the intercept of a fixed sampling cost: set sample_ms with it")

    @property
    def decision_efficiency(self) -> float:
        """The efficiency the allocation decides with: the interval's lower end where set (``efficiency_low``)."""
        return self.efficiency if self.efficiency_low is None else min(self.efficiency, self.efficiency_low)

    @property
    def fixed_costs(self) -> bool:
        """True when both per-rollout costs are given (nothing measured)."""
        return self.sample_ms is not None and self.train_ms is not None


@register_planner("auto")
class AutoN(Planner):
    """PODS that picks its own n (module docstring); ``observe`` feeds it each optimizer step's costs."""

    kind = "how_many"
    Settings = AutoSettings
    needs = frozenset({"costs"})  # the engine feeds ``observe`` each step's costs

    def __init__(self, settings: AutoSettings | None = None):
        self.settings = settings or AutoSettings()
        self.costs = RolloutCostModel(window=self.settings.cost_window, pair_gap=self.settings.cost_pair_gap)
        self.plans = 0  # plans made (steps that sampled)
        self.probes = 0
        self.last_probe = -10**9  # the plan index of the last probe

    @classmethod
    def complete(cls, args, layout: Layout) -> dict:
        """``min_n``/``max_n`` default to m/n, in [m, n]; no fixed budget (it spends what pays per second)."""
        knobs = between_m_and_n(dict(args or {}), layout, "auto")
        if layout.adaptive_budget is not None:
            raise ValueError(f"{layout.names['rollout_planner']}='auto' chooses how many rollouts to spend from the "
                             f"measured costs: drop {layout.names['adaptive_budget']} (Knapsack-RL's fixed budget)")
        return knobs

    def observe(self, *, sampled: int, sample_seconds: float, trained: int, update_seconds: float) -> None:
        """One optimizer step's rollouts sampled and trained and its phase seconds (``RolloutCostModel.observe``)."""
        self.costs.observe(sampled=sampled, sample_seconds=sample_seconds, trained=trained,
                           update_seconds=update_seconds)

    def estimate(self) -> CostEstimate | None:
        """The costs the next plan uses: the fixed ``*_ms`` knobs where set, else the measured fit."""
        s = self.settings
        if s.fixed_costs:  # nothing measured is read: no fit
            return CostEstimate((s.fixed_ms or 0.0) / 1e3, s.sample_ms / 1e3, s.train_ms / 1e3, True, 0)
        measured = self.costs.estimate()
        if measured is None:
            return None
        if s.sample_ms is not None:
            measured = CostEstimate((s.fixed_ms or 0.0) / 1e3, s.sample_ms / 1e3, measured.per_trained, True,
                                    measured.observations)
        elif s.train_ms is not None:
            measured = CostEstimate(measured.fixed, measured.per_sampled, s.train_ms / 1e3, measured.slope_known,
                                    measured.observations)
        return None if math.isnan(measured.per_trained) else measured

    def plan(self, ids, ledger: PromptLedger, *, n: int, m: int | None = None,
             generator: torch.Generator | None = None) -> Plan:
        """Rollouts in [min_n, max_n] for ``ids`` (P,) (evicted: 0). ``n``: max_n's default, ``m``: min_n's (and the
        rollouts each prompt trains on). ``extra``: ``success_rate`` (P,) posterior means; metrics ``pods/auto_*``."""
        s = self.settings
        check_int(_OWNER, "n", n, 1)
        min_n, max_n = (s.min_n or m or n), (s.max_n or n)
        m = min_n if m is None else m  # the rollouts each prompt trains on
        if not 1 <= m <= min_n <= max_n:
            raise ValueError(f"{_OWNER} needs 1 <= m <= min_n <= max_n, got m={m}, min_n={min_n}, max_n={max_n}")
        ids = as_ids(ids)
        stats = ledger.columns(ids, "window", "evicted", "last_step")
        live = ~stats["evicted"].numpy()  # (P,); the plan is a few dozen operations on (P, K): NumPy's, not torch's
        now, pass_rate_now = ledger_now(ledger) if s.age_half_life is not None else (0, None)
        a, b = success_posterior(stats["window"], s.prior_strength, age=now - stats["last_step"],
                                 half_life=s.age_half_life, pass_rate_now=pass_rate_now)
        estimate = self.estimate()
        self.plans += 1
        rollouts = np.full(len(ids), min_n, dtype=np.int64)  # (P,)
        metrics = {"pods/auto_probe": 0.0}
        gains = signal_table(a[live], b[live], m, max_n, 1.0, min_n).numpy() if live.any() else np.zeros(
            (0, max_n - min_n + 1))  # (L, K) g(n) itself
        signal = gains[:, :1] + s.decision_efficiency * (gains - gains[:, :1])  # what it decides on
        expected = gains[:, :1] + s.efficiency * (gains - gains[:, :1])  # what it reports
        counts = np.arange(min_n, max_n + 1)
        warming = self.plans <= s.warmup_steps and not s.fixed_costs
        if estimate is not None and not warming:
            trained_seconds = estimate.per_trained * m * int(live.sum())
            fixed = estimate.fixed + trained_seconds
            chosen, ratio = allocate_for_signal(signal, counts, sample_seconds=estimate.per_sampled,
                                                fixed_seconds=fixed)
            chosen, topped_up = self._top_up(chosen.numpy(), estimate, fixed, max_n)
            rollouts[live] = chosen
            ratio = float(expected[np.arange(len(chosen)), chosen - min_n].sum()) / (
                fixed + estimate.per_sampled * float(chosen.sum())) if len(chosen) else 0.0
            base = float(expected[:, 0].sum()) / (fixed + estimate.per_sampled * min_n * int(live.sum()))
            metrics.update({"pods/auto_sample_ms": 1e3 * estimate.per_sampled,
                            "pods/auto_train_ms": 1e3 * estimate.per_trained,
                            "pods/auto_fixed_ms": 1e3 * estimate.fixed,
                            "pods/auto_slope_known": float(estimate.slope_known),
                            "pods/auto_topped_up": float(topped_up),
                            "pods/auto_signal_per_second_vs_m": ratio / base if base > 0 else 1.0})
            if (not estimate.slope_known and not s.fixed_costs and s.sample_ms is None and self.probes < s.max_probes
                    and self.plans - self.last_probe >= s.probe_gap and max_n > min_n
                    and self._probe_could_matter(signal, counts, fixed)):
                planned = estimate.per_sampled * float(rollouts[live].sum())
                # a probe: the slope needs a step at another total, twice this one's (the cost model's spread is
                # 1.25x); every prompt at max_n would pay for rollouts the slope does not need
                rollouts[live] = np.minimum(2 * rollouts[live], max_n)
                self.probes, self.last_probe = self.probes + 1, self.plans
                metrics.update({"pods/auto_probe": 1.0, "pods/auto_probe_extra_s":
                                estimate.per_sampled * float(rollouts[live].sum()) - planned})
        rollouts[~live] = 0
        chosen_live = rollouts[live].astype(np.float64)
        metrics.update({"pods/auto_n_mean": float(chosen_live.mean()) if len(chosen_live) else float("nan"),
                        "pods/auto_n_max": float(chosen_live.max()) if len(chosen_live) else float("nan"),
                        "pods/auto_probes": float(self.probes),
                        "pods/auto_warmup": float(warming or estimate is None)})
        return make_plan(ids, torch.from_numpy(rollouts), evicted=stats["evicted"],  # skipped: none
                         extra={"success_rate": torch.from_numpy(a / (a + b))}, metrics=metrics)

    def _top_up(self, chosen: np.ndarray, estimate: CostEstimate, fixed_seconds: float,
                max_n: int) -> tuple[np.ndarray, bool]:
        """chosen (L,) -> every prompt at max_n where that lengthens the predicted step by at most ``free_share``
        (the marginal rollout known), else chosen as it is; and whether it topped up. Where sampling is nearly free
        the gain model's error is cheap to insure: it reads the variance a prompt's posterior predicts, not the
        learning that more rollouts bring where that posterior is wrong (docs/concepts/auto-n.md)."""
        share = self.settings.free_share
        if share is None or not estimate.slope_known or len(chosen) == 0 or bool((chosen == max_n).all()):
            return chosen, False
        step_seconds = fixed_seconds + estimate.per_sampled * float(chosen.sum())
        top_up_seconds = estimate.per_sampled * float((max_n - chosen).sum())
        if top_up_seconds > share * step_seconds:
            return chosen, False
        return np.full_like(chosen, max_n), True

    @staticmethod
    def _probe_could_matter(signal: np.ndarray, counts: np.ndarray, fixed_seconds: float) -> bool:
        """Whether any slope could change the choice: with the marginal rollout free (the slope's lowest value) some
        prompt gets more than min_n. Where even then every prompt gets min_n, a probe would teach nothing."""
        chosen, _ = allocate_for_signal(signal, counts, sample_seconds=0.0, fixed_seconds=max(fixed_seconds, 1e-12))
        return bool((chosen > counts[0]).any())

    def state_dict(self) -> dict:
        """The cost window and the probe counters (a resume plans as the run would have)."""
        return {"costs": self.costs.state_dict(), "plans": self.plans, "probes": self.probes,
                "last_probe": self.last_probe}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``."""
        self.costs.load_state_dict(state.get("costs", {}))
        self.plans, self.probes = int(state.get("plans", 0)), int(state.get("probes", 0))
        self.last_probe = int(state.get("last_probe", -10**9))
