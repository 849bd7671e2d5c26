"""Uncertainty over seeds: percentile-bootstrap confidence intervals, means with standard errors, the step-time
ratio, and the verdicts read off intervals (break-even, projection). numpy only; knows nothing of run directories
(``pods_rl.stats`` turns runs into the per-seed values these take).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


# ------------------------------------------------------------------------------------------------------------
# Bootstrap
# ------------------------------------------------------------------------------------------------------------
def resample(values: Sequence, rng: np.random.Generator) -> list:
    """``len(values)`` items drawn from ``values`` with replacement (one bootstrap resample of seeds)."""
    return [values[i] for i in rng.integers(0, len(values), len(values))]


def percentile_interval(replicates, level: float = 0.95) -> tuple[float, float] | None:
    """(low, high) percentile interval of bootstrap replicates (R,), nan/None dropped; None if none is left.

    The quantiles use the inverted CDF, so each bound is an observed replicate (no interpolation with inf).
    """
    values = np.array([v for v in replicates if v is not None], dtype=float)
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return float(low), float(high)


def bootstrap_ci(values_or_callable, statistic: Callable = np.mean, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval (default 95%) over seeds.

    Args:
        values_or_callable: either per-seed values, array-like (S,) or (S, ...): each replicate resamples the
            S rows with replacement and applies ``statistic`` (default: the mean); or a callable
            ``replicate(rng) -> float | None`` computing one replicate with the numpy Generator it is given
            (e.g. a ratio of two methods' means, each resampled with ``resample(values, rng)``); None / nan
            replicates are dropped.
        statistic: (S, ...) array -> float, for the array form.
        n_boot: number of replicates. seed: RNG seed (the interval is deterministic for a given seed).
        level: coverage of the interval.
    Returns (low, high), or None with fewer than 2 values or no valid replicate.

    Example: ``bootstrap_ci(final_accuracy_per_seed)``; ``bootstrap_ci(lambda rng:
    np.mean(resample(grpo_s, rng)) / np.mean(resample(pods_s, rng)))``.
    """
    rng = np.random.default_rng(seed)
    if callable(values_or_callable):
        replicates = [values_or_callable(rng) for _ in range(n_boot)]
    else:
        values = np.asarray(values_or_callable, dtype=float)
        if values.ndim == 0 or len(values) < 2:
            return None
        replicates = [statistic(values[rng.integers(0, len(values), len(values))]) for _ in range(n_boot)]
    return percentile_interval(replicates, level)


# ------------------------------------------------------------------------------------------------------------
# Study statistics: the step-time ratio, evaluation noise against seed spread, break-even and projection
# ------------------------------------------------------------------------------------------------------------
def mean_se(values) -> tuple[float | None, float | None]:
    """(mean, standard error over the values) of the non-None values; SE None with one value, both None
    with none."""
    values = np.asarray([v for v in values if v is not None], dtype=float)
    if not len(values):
        return None, None
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return float(values.mean()), se


def ratio_of_means(values: Sequence[float], base: Sequence[float], n_boot: int = 2000,
                   seed: int = 0) -> tuple[float, tuple[float, float] | None]:
    """mean(values) / mean(base) and its percentile-bootstrap 95% CI, both samples resampled independently.

    Used for the step-time ratio: ``values`` (S,) are a method's mean seconds per step, one per seed, and
    ``base`` (S',) the baseline's. The CI is None with fewer than 2 values on either side.
    """
    values, base = [float(v) for v in values], [float(b) for b in base]
    if not values or not base:
        raise ValueError("ratio_of_means needs at least one value on each side")
    ratio = float(np.mean(values) / np.mean(base))
    if len(values) < 2 or len(base) < 2:
        return ratio, None
    return ratio, bootstrap_ci(lambda rng: np.mean(resample(values, rng)) / np.mean(resample(base, rng)),
                               n_boot=n_boot, seed=seed)

def break_even(learning_gain: float | None, learning_ci, step_ratio: float, step_ci) -> dict:
    """Whether PODS pays in wall-clock time: it does iff its learning per update (GRPO's updates / PODS's
    updates to the same target) exceeds its step-time ratio (PODS's seconds per step / GRPO's).

    Args:
        learning_gain: the learning-per-update ratio E (None if undefined); learning_ci: its 95% CI or None.
        step_ratio: the step-time ratio r; step_ci: its 95% CI or None.
    Returns {break_even_step_ratio: E, margin: E / r (the implied wall-clock speed-up), verdict: "pays" (E's
    lower bound above r's upper bound), "does not pay" (E's upper bound below r's lower bound), "undecided"
    (the intervals overlap: more seeds or updates needed), or "unknown" (E undefined)}.
    """
    if learning_gain is None:
        return {"break_even_step_ratio": None, "margin": None, "verdict": "unknown"}
    e_low, e_high = learning_ci if learning_ci else (learning_gain, learning_gain)
    r_low, r_high = step_ci if step_ci else (step_ratio, step_ratio)
    e_high = math.inf if e_high is None else e_high  # a None bound of a speed-up CI is infinite
    if e_low is not None and e_low > r_high:
        verdict = "pays"
    elif e_high < r_low:
        verdict = "does not pay"
    else:
        verdict = "undecided"
    return {"break_even_step_ratio": learning_gain, "margin": learning_gain / step_ratio, "verdict": verdict}


def projection(step_ratios: dict, efficiency: dict) -> dict:
    """PROJECTED wall-clock speed-up = learning-per-update ratio E / step-time ratio r, at given ratios r.

    Args:
        step_ratios: {description: r}, e.g. {"paper 1xGPU GSM8K n=64 (10.1 s / 7.6 s)": 1.33}.
        efficiency: {method: (E, (E_low, E_high) or None)}: updates GRPO needs / updates the method needs.
    Returns {"rows": [{"source", "step_ratio", method: {"speedup", "ci95"}}...], "break_even": {method:
    {"step_ratio": E, "ci95"}}}: PODS stops paying where r exceeds E.
    """
    rows = []
    for source, r in sorted(step_ratios.items(), key=lambda kv: kv[1]):
        row = {"source": source, "step_ratio": r}
        for method, (e, e_ci) in efficiency.items():
            ci = [None if v is None else v / r for v in e_ci] if e_ci else None  # a None bound is infinite
            row[method] = {"speedup": None if e is None else e / r, "ci95": ci}
        rows.append(row)
    return {"rows": rows, "break_even": {method: {"step_ratio": e, "ci95": e_ci}
                                         for method, (e, e_ci) in efficiency.items()}}
