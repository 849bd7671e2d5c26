"""Statistics read on the piecewise-linear curve through a run's evaluations, so they do not move in grid steps.

Curves are (xs (E,) training seconds or optimizer steps, values (E,)); numpy only, no run directories."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pods_rl.bootstrap import percentile_interval, resample

TARGET_TOLERANCE = 1e-9  # mean curves are float averages; "reaches" forgives rounding below the target
BUDGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # budgets at which accuracies are compared, fractions of the span
RATIO_MARGIN = 0.1  # a ratio (speed-up) whose CI lies within [1 - 0.1, 1 + 0.1] is decided equal
ACCURACY_MARGIN = 0.01  # an accuracy difference (or of areas) whose CI lies within [-0.01, +0.01] is equal
VERDICT_RULE = ("verdicts read off the 95% CI: a speed-up (baseline / method, > 1 favours the method) is 'faster' "
                "when its CI lies above 1, 'slower' below 1, 'equal' within [0.9, 1.1], else 'undecided'; an "
                "accuracy or area difference (method - baseline) is 'higher' when its CI lies above 0, 'lower' "
                "below 0, 'equal' within [-0.01, +0.01], else 'undecided'")


def sorted_curve(xs, values) -> tuple[np.ndarray, np.ndarray]:
    """(xs, values) as float arrays sorted by x (stable), checked 1-D of equal length."""
    xs, values = np.asarray(xs, dtype=float), np.asarray(values, dtype=float)
    if xs.shape != values.shape or xs.ndim != 1:
        raise ValueError(f"xs and values must be 1-D of equal length, got {xs.shape} and {values.shape}")
    order = np.argsort(xs, kind="stable")
    return xs[order], values[order]


def interpolated_crossing(xs, values, target: float) -> float:
    """The x where the curve first reaches ``target``, linearly interpolated; ``inf`` when it never does."""
    xs, values = sorted_curve(xs, values)
    reached = np.nonzero(values >= target - TARGET_TOLERANCE)[0]
    if not len(reached):
        return math.inf
    hi = int(reached[0])
    if hi == 0:
        return float(xs[0])
    x_lo, x_hi, v_lo, v_hi = xs[hi - 1], xs[hi], values[hi - 1], values[hi]
    fraction = min(max((target - v_lo) / (v_hi - v_lo), 0.0), 1.0)  # v_hi > v_lo here; clipped for the tolerance
    return float(x_lo + fraction * (x_hi - x_lo))


def values_at(xs, values, at) -> np.ndarray:
    """(B,) the curve interpolated at the x values ``at`` (B,); nan outside [xs[0], xs[-1]]."""
    xs, values = sorted_curve(xs, values)
    at = np.atleast_1d(np.asarray(at, dtype=float))
    out = np.interp(at, xs, values)
    out[(at < xs[0]) | (at > xs[-1])] = np.nan
    return out


def normalized_area(xs, values, start: float, end: float) -> float:
    """The curve's mean over [start, end] (trapezoid area / length); nan when the curve does not cover it."""
    xs, values = sorted_curve(xs, values)
    if end < start:
        raise ValueError(f"the span must have start <= end, got [{start}, {end}]")
    if start < xs[0] or end > xs[-1]:
        return math.nan
    if end == start:
        return float(np.interp(start, xs, values))
    inside = (xs > start) & (xs < end)
    grid = np.concatenate([[start], xs[inside], [end]])  # (G,)
    curve = np.interp(grid, xs, values)  # (G,)
    area = float(np.sum((grid[1:] - grid[:-1]) * (curve[1:] + curve[:-1]) / 2))
    return area / (end - start)


def common_span(curves: Sequence[tuple]) -> tuple[float, float]:
    """(start, end) the x span every (xs, values) curve covers; ValueError when none or they do not overlap."""
    if not curves or any(len(xs) == 0 for xs, _ in curves):
        raise ValueError("common_span needs at least one curve, each with at least one evaluation")
    start = max(float(np.min(xs)) for xs, _ in curves)
    end = min(float(np.max(xs)) for xs, _ in curves)
    if start > end:
        raise ValueError(f"the curves cover no common span (latest start {start} > earliest end {end})")
    return start, end


def budgets(start: float, end: float, fractions: Sequence[float] = BUDGET_FRACTIONS) -> np.ndarray:
    """(B,) the x budgets start + f x (end - start) for each fraction f (B,) of the span."""
    return start + np.asarray(fractions, dtype=float) * (end - start)


def interval_verdict(ci, reference: float = 1.0, margin: float = RATIO_MARGIN, above: str = "faster",
                     below: str = "slower") -> str:
    """The ``VERDICT_RULE`` verdict of a 95% CI (low, high) (None bound: infinite; None CI: "unknown")."""
    if not ci:
        return "unknown"
    low = -math.inf if ci[0] is None else ci[0]
    high = math.inf if ci[1] is None else ci[1]
    if low > reference:
        return above
    if high < reference:
        return below
    if reference - margin <= low and high <= reference + margin:
        return "equal"
    return "undecided"


def finite_or_none(x) -> float | None:
    """``x`` as a float, or None when it is None, NaN or infinite (what JSON cannot hold)."""
    return float(x) if x is not None and math.isfinite(x) else None


def compare_values(values: Sequence, baseline_values: Sequence, n_boot: int = 2000, seed: int = 0) -> dict:
    """Method (S,) vs baseline (S',) per-seed values (None/nan dropped): means, difference, ratio, 95% CIs.

    Returns {mean, baseline_mean, difference, difference_ci95, ratio, ratio_ci95, verdict}; CIs None below 2 seeds."""
    method = [float(v) for v in values if v is not None and not math.isnan(v)]
    base = [float(v) for v in baseline_values if v is not None and not math.isnan(v)]
    if not method or not base:
        return {"mean": finite_or_none(np.mean(method)) if method else None,
                "baseline_mean": finite_or_none(np.mean(base)) if base else None, "difference": None,
                "difference_ci95": None, "ratio": None, "ratio_ci95": None, "verdict": "unknown"}
    mean, base_mean = float(np.mean(method)), float(np.mean(base))
    difference_ci = ratio_ci = None
    if n_boot > 0 and len(method) >= 2 and len(base) >= 2:
        rng = np.random.default_rng(seed)
        pairs = np.array([(np.mean(resample(method, rng)), np.mean(resample(base, rng))) for _ in range(n_boot)])
        difference_ci = percentile_interval(pairs[:, 0] - pairs[:, 1])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(pairs[:, 1] != 0, pairs[:, 0] / pairs[:, 1], np.nan)
        ratio_ci = percentile_interval(ratios)
    return {"mean": mean, "baseline_mean": base_mean, "difference": mean - base_mean,
            "difference_ci95": list(difference_ci) if difference_ci else None,
            "ratio": mean / base_mean if base_mean else None, "ratio_ci95": list(ratio_ci) if ratio_ci else None,
            "verdict": interval_verdict(difference_ci, 0.0, ACCURACY_MARGIN, "higher", "lower")}


def curve_comparison(curves_by_label: dict[str, list[tuple]], baseline: str,
                     fractions: Sequence[float] = BUDGET_FRACTIONS, n_boot: int = 2000, seed: int = 0) -> dict:
    """Accuracy at budgets (B,) and normalized area over ``common_span``, each label against ``baseline``.

    Returns {span, fractions, budgets, labels: {label: {at_budget: [per-budget compare_values], area: {...}}}}."""
    if baseline not in curves_by_label:
        raise ValueError(f"baseline label {baseline!r} is not among {list(curves_by_label)}")
    start, end = common_span([c for curves in curves_by_label.values() for c in curves])
    xs_budget = budgets(start, end, fractions)  # (B,)
    at_budget = {label: np.array([values_at(xs, values, xs_budget) for xs, values in curves])  # (S, B)
                 for label, curves in curves_by_label.items()}
    areas = {label: [normalized_area(xs, values, start, end) for xs, values in curves]  # (S,)
             for label, curves in curves_by_label.items()}
    labels = {}
    for label in curves_by_label:
        rows = []
        for b, (fraction, x) in enumerate(zip(fractions, xs_budget)):
            per_seed = at_budget[label][:, b].tolist()
            rows.append({"fraction": float(fraction), "x": float(x), "per_seed": per_seed,
                         **compare_values(per_seed, at_budget[baseline][:, b].tolist(), n_boot, seed)})
        labels[label] = {"at_budget": rows,
                         "area": {"per_seed": areas[label], **compare_values(areas[label], areas[baseline],
                                                                              n_boot, seed)}}
    return {"span": [start, end], "fractions": [float(f) for f in fractions], "budgets": xs_budget.tolist(),
            "labels": labels}


# ------------------------------------------------------------------------------------------------------------
# Time to every accuracy level on the way up, seeds paired
# ------------------------------------------------------------------------------------------------------------
# The levels a method's time to target is read at: fractions of the baseline's gain (its seed-mean peak over its
# first evaluation). Below 20% the crossing lies in the first segment, set by one evaluation; above 90% both
# curves are flat, where a crossing moves with one evaluation's noise (the censoring of "time to peak").
LEVEL_FRACTIONS = tuple(round(0.2 + 0.05 * i, 2) for i in range(15))  # 0.20, 0.25, ..., 0.90
# What a report's headline keeps of a level result (reports from before censoring was recorded lack the last six).
LEVEL_SUMMARY = ("ratio", "ci95", "verdict", "seeds", "fractions", "censored", "ci95_upper_bounds", "levels_reached",
                 "levels_reached_by_all_seeds", "seeds_not_reached", "replicates_censored")


def mean_of_curves(curves: Sequence[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """(grid (G,), mean (G,)): the exact seed-mean curve, knots at the union of xs inside ``common_span``."""
    start, end = common_span(curves)
    sorted_curves = [sorted_curve(xs, values) for xs, values in curves]
    grid = np.unique(np.concatenate([xs[(xs >= start) & (xs <= end)] for xs, _ in sorted_curves]))  # (G,)
    return grid, np.mean([np.interp(grid, xs, values) for xs, values in sorted_curves], axis=0)


def level_time_ratio(baseline_curves: Sequence[tuple], method_curves: Sequence[tuple],
                     fractions: Sequence[float] = LEVEL_FRACTIONS, count_seeds: bool = True) -> dict:
    """Geometric mean over levels (L,) of baseline x / method x to reach each, on seed-mean curves (> 1: sooner).

    Levels are start + f x (peak - start) of the baseline's mean curve, which reaches each. A level the method's mean
    never reaches is censored, not 0: its ratio is below baseline x / ``method_end`` (the mean's end), the bound
    ``per_level`` holds (``per_level_censored``); the geometric mean is then an upper bound (``censored``).
    ``seeds_not_reached`` (L,) counts the seeds whose own curve misses each level (not with ``count_seeds=False``)."""
    grid_b, mean_b = mean_of_curves(baseline_curves)
    grid_m, mean_m = mean_of_curves(method_curves)
    start, peak = float(mean_b[0]), float(mean_b.max())
    levels = start + np.asarray(fractions, dtype=float) * (peak - start)  # (L,)
    base_x = np.array([interpolated_crossing(grid_b, mean_b, a) for a in levels])  # (L,)
    method_x = np.array([interpolated_crossing(grid_m, mean_m, a) for a in levels])  # (L,)
    method_end = float(grid_m[-1])
    censored = ~np.isfinite(method_x)  # (L,)
    ratio = None
    if peak > start:
        with np.errstate(divide="ignore", invalid="ignore"):
            # a censored level counts as reached at the method's end (at the earliest); 0 (at once) gives inf
            reached_x = np.where(censored, method_end, method_x)
            per_level = np.where(reached_x > 0, base_x / reached_x, math.inf)
            log_mean = float(np.mean(np.log(per_level)))
        ratio = None if math.isnan(log_mean) else math.exp(log_mean)
    else:
        per_level = np.full(len(levels), np.nan)
    return {"ratio": ratio, "censored": bool(ratio is not None and censored.any()),
            "levels_reached": int((~censored).sum()), "levels": levels.tolist(), "baseline_x": base_x.tolist(),
            "method_x": method_x.tolist(), "method_end": method_end, "per_level": per_level.tolist(),
            "per_level_censored": censored.tolist(), "num_seeds": len(method_curves),
            **(_seeds_reaching(method_curves, levels) if count_seeds else {})}


def _seeds_reaching(curves: Sequence[tuple], levels: np.ndarray) -> dict:
    """{seeds_not_reached (L,), levels_reached_by_all_seeds}: each seed's own curve, over its whole run."""
    missed = np.array([[not math.isfinite(interpolated_crossing(xs, values, a)) for a in levels]
                       for xs, values in curves])  # (S, L)
    return {"seeds_not_reached": missed.sum(axis=0).astype(int).tolist(),
            "levels_reached_by_all_seeds": int((~missed.any(axis=0)).sum())}


def paired_level_time_ratio(baseline_by_seed: dict, method_by_seed: dict,
                            fractions: Sequence[float] = LEVEL_FRACTIONS, n_boot: int = 2000, seed: int = 0) -> dict:
    """``level_time_ratio`` on the seeds both sides ran (ValueError if none), with a seed-paired bootstrap 95% CI.

    A censored replicate's ratio lies in [0, its bound]; a percentile end (one replicate) rises with each, so the true
    end lies between the end with them at 0 and at their bounds (``ci95``); ``ci95_upper_bounds`` marks ends the two
    differ on. The verdict reads [low at 0, high at the bounds]: censoring never buys a verdict."""
    seeds = sorted(set(baseline_by_seed) & set(method_by_seed))
    if not seeds:
        raise ValueError("no seed was run by both the baseline and the method: a paired comparison needs shared seeds")
    point = level_time_ratio([baseline_by_seed[s] for s in seeds], [method_by_seed[s] for s in seeds], fractions)
    ci = widest = None
    censored_replicates = 0
    if n_boot > 0 and len(seeds) >= 2:
        rng = np.random.default_rng(seed)
        draws = [resample(seeds, rng) for _ in range(n_boot)]
        replicates = [level_time_ratio([baseline_by_seed[s] for s in drawn], [method_by_seed[s] for s in drawn],
                                       fractions, count_seeds=False) for drawn in draws]
        censored_replicates = sum(r["censored"] for r in replicates)
        ci = percentile_interval([r["ratio"] for r in replicates])
        at_zero = percentile_interval([0.0 if r["censored"] else r["ratio"] for r in replicates])
        widest = (at_zero[0], ci[1]) if ci and at_zero else None
    ci95 = [finite_or_none(ci[0]), finite_or_none(ci[1])] if ci else None
    upper_bounds = [bool(at_zero[i] != ci[i]) for i in (0, 1)] if ci else None
    unpaired = sorted(set(baseline_by_seed) ^ set(method_by_seed))
    return {**point, "ci95": ci95, "ci95_upper_bounds": upper_bounds,
            "replicates": n_boot if ci else 0, "replicates_censored": censored_replicates,
            "verdict": interval_verdict([finite_or_none(w) for w in widest] if widest else None), "seeds": seeds,
            "unpaired": unpaired, "fractions": [float(f) for f in fractions]}


def format_level_ratio(level: dict) -> str:
    """A ``paired_level_time_ratio`` result as pages print it: ``0.97x [0.91, 1.03]``, ``< 0.20x [≤0.15, ≤0.24]``."""
    mark = "< " if level.get("censored") else ""
    text = f"{mark}{level['ratio']:.2f}x"
    ci = level.get("ci95")
    if not ci:
        return text + " [—]"
    bounds = level.get("ci95_upper_bounds") or [False, False]
    ends = ["inf" if v is None else ("≤" if bound else "") + f"{v:.2f}" for v, bound in zip(ci, bounds)]
    return f"{text} [{ends[0]}, {ends[1]}]"


def level_reach_note(level: dict) -> str:
    """What a ``paired_level_time_ratio`` result left unmeasured, in words ("" if nothing)."""
    total, seeds = len(level["levels"]), level.get("num_seeds", len(level.get("seeds", ())))
    parts = []
    if level.get("censored"):
        parts.append(f"the seed-mean reaches {level['levels_reached']} of {total} levels, the rest bounded at its "
                     "end")
    missed = level.get("seeds_not_reached")
    if missed and any(missed):  # a seed reaching a level reached every level below it: the top one is missed most
        parts.append(f"{level['levels_reached_by_all_seeds']} of {total} levels reached by all {seeds} seeds, the "
                     f"top one not reached in {missed[-1]} of {seeds}")
    if level.get("replicates_censored"):
        parts.append(f"{level['replicates_censored']} of {level['replicates']} bootstrap replicates miss a level")
    return "; ".join(parts)


def format_level(level: dict | None) -> str:
    """A ``curves.paired_level_time_ratio`` result as ``0.97x [0.91, 1.03] equal (16 seeds)``, censoring noted."""
    if not level or level["ratio"] is None:
        return "—"
    note = "; " + level_reach_note(level) if level_reach_note(level) else ""
    return f"{format_level_ratio(level)} {level['verdict']} ({len(level['seeds'])} seeds{note})"


def format_difference(row: dict) -> str:
    """A ``curves.compare_values`` row as ``difference [CI] verdict`` in accuracy (three decimals, signed)."""
    if row["difference"] is None:
        return "—"
    ci = row["difference_ci95"]
    return f"{row['difference']:+.3f} " + (f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "[—]") + f" {row['verdict']}"


def format_area_ratio(row: dict) -> str:
    """A ``curves.compare_values`` row's ratio as ``0.998x [0.990, 1.004]``."""
    ci = row["ratio_ci95"]
    return "—" if row["ratio"] is None else f"{row['ratio']:.3f}x " + (
        f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "[—]")
