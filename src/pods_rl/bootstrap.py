"""Uncertainty over seeds: percentile-bootstrap CIs, means with SEs, ratios, break-even. numpy only."""

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
    """(low, high) of replicates (R,), nan/None dropped (None if none left); bounds are observed replicates."""
    values = np.array([v for v in replicates if v is not None], dtype=float)
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return float(low), float(high)


def bootstrap_ci(values_or_callable, statistic: Callable = np.mean, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI over seeds: (low, high), or None with under 2 values or no valid replicate.

    ``values_or_callable`` is per-seed values (S, ...) whose rows are resampled into ``statistic``, or a callable
    ``replicate(rng) -> float | None``, e.g. ``lambda rng: np.mean(resample(a, rng)) / np.mean(resample(b, rng))``."""
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
    """(mean, standard error) of the non-None values; SE None with one value, both None with none."""
    values = np.asarray([v for v in values if v is not None], dtype=float)
    if not len(values):
        return None, None
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return float(values.mean()), se


def ratio_of_means(values: Sequence[float], base: Sequence[float], n_boot: int = 2000,
                   seed: int = 0) -> tuple[float, tuple[float, float] | None]:
    """mean(values (S,)) / mean(base (S',)) and its bootstrap 95% CI (None below 2 values a side)."""
    values, base = [float(v) for v in values], [float(b) for b in base]
    if not values or not base:
        raise ValueError("ratio_of_means needs at least one value on each side")
    ratio = float(np.mean(values) / np.mean(base))
    if len(values) < 2 or len(base) < 2:
        return ratio, None
    return ratio, bootstrap_ci(lambda rng: np.mean(resample(values, rng)) / np.mean(resample(base, rng)),
                               n_boot=n_boot, seed=seed)

def break_even(learning_gain: float | None, learning_ci, step_ratio: float, step_ci) -> dict:
    """Whether PODS pays in wall-clock time: iff its learning per update E exceeds its step-time ratio r.

    Returns {break_even_step_ratio: E, margin: E / r, verdict: "pays" | "does not pay" | "undecided" (the CIs overlap) |
    "unknown"}."""
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
    """Projected speed-up E / r for each step ratio r in ``step_ratios`` and (E, CI) in ``efficiency``.

    Returns {"rows": [{"source", "step_ratio", method: {"speedup", "ci95"}}], "break_even": {method: ...}}."""
    rows = []
    for source, r in sorted(step_ratios.items(), key=lambda kv: kv[1]):
        row = {"source": source, "step_ratio": r}
        for method, (e, e_ci) in efficiency.items():
            ci = [None if v is None else v / r for v in e_ci] if e_ci else None  # a None bound is infinite
            row[method] = {"speedup": None if e is None else e / r, "ci95": ci}
        rows.append(row)
    return {"rows": rows, "break_even": {method: {"step_ratio": e, "ci95": e_ci}
                                         for method, (e, e_ci) in efficiency.items()}}
