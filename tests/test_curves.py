"""pods_rl.curves: statistics read between evaluations (interpolated crossings, accuracy at equal budgets, the
normalized area under the curve), their bootstrap intervals over seeds and the verdict rule; and
``stats.compare_runs(..., interpolate=True)``, whose ratios leave the evaluation grid."""

import math
from pathlib import Path

import numpy as np
import pytest

from pods_rl import curves, stats


def run(label, steps, values, seconds_per_step=1.0, seed=0):
    """A RunData evaluated at ``steps`` (train_seconds = step x seconds_per_step); no files needed."""
    steps = np.asarray(steps)
    return stats.RunData(run_dir=Path(f"/nonexistent/{label}-s{seed}"), label=label, seed=seed,
                         steps=steps, times=steps * float(seconds_per_step), values=np.asarray(values, dtype=float),
                         stderrs=np.full(len(steps), np.nan))


# ------------------------------------------------------------------------------------------------------------
# The crossing, values at budgets, the area
# ------------------------------------------------------------------------------------------------------------
def test_interpolated_crossing_hand_computed():
    xs, values = [0, 10, 20, 30], [0.1, 0.3, 0.5, 0.6]
    # 0.4 lies between step 10 (0.3, the last evaluation below) and step 20 (0.5, the first at or above):
    # 10 + (0.4 - 0.3) / (0.5 - 0.3) x 10 = 15; the first evaluation reaching it (checkpoint resolution) is 20.
    assert curves.interpolated_crossing(xs, values, 0.4) == pytest.approx(15.0)
    assert stats.time_to_target(xs, values, 0.4) == 20.0
    assert curves.interpolated_crossing(xs, values, 0.5) == pytest.approx(20.0)  # exactly at an evaluation
    assert curves.interpolated_crossing(xs, values, 0.55) == pytest.approx(25.0)
    assert curves.interpolated_crossing(xs, values, 0.05) == 0.0  # the first evaluation already reaches it
    assert curves.interpolated_crossing(xs, values, 0.7) == math.inf  # never
    # The FIRST crossing: a curve that rises past the target, falls and rises again crosses at 7.5, not later.
    assert curves.interpolated_crossing([0, 10, 20, 30], [0.1, 0.5, 0.3, 0.6], 0.4) == pytest.approx(7.5)
    assert curves.interpolated_crossing([30, 0, 20, 10], [0.6, 0.1, 0.5, 0.3], 0.4) == pytest.approx(15.0)  # order
    # A mean curve a rounding error below the target reaches it, at that evaluation (not beyond it).
    assert curves.interpolated_crossing([0, 10], [0.2, 0.5 - 1e-12], 0.5) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="equal length"):
        curves.interpolated_crossing([0, 1], [0.5], 0.5)


def test_values_at_budgets_no_extrapolation():
    got = curves.values_at([0, 10, 20], [0.2, 0.4, 0.3], [0, 5, 15, 20, 25, -1])
    assert got[:4] == pytest.approx([0.2, 0.3, 0.35, 0.3])
    assert np.isnan(got[4]) and np.isnan(got[5])
    assert curves.budgets(10.0, 90.0).tolist() == [30.0, 50.0, 70.0, 90.0]  # 25/50/75/100% of the span
    assert curves.common_span([([0, 50, 100], [0] * 3), ([0, 80], [0] * 2), ([10, 120], [0] * 2)]) == (10.0, 80.0)
    with pytest.raises(ValueError, match="no common span"):
        curves.common_span([([0, 10], [0, 0]), ([20, 30], [0, 0])])


def test_normalized_area_on_known_curves():
    # 0 -> 1 over [0, 10], then flat at 1 until 20: area 5 + 10 = 15 over 20 -> 0.75.
    assert curves.normalized_area([0, 10, 20], [0.0, 1.0, 1.0], 0, 20) == pytest.approx(0.75)
    # Over [5, 15]: the curve is 0.5 at 5: (0.5 + 1) / 2 x 5 + 1 x 5 = 8.75 over 10.
    assert curves.normalized_area([0, 10, 20], [0.0, 1.0, 1.0], 5, 15) == pytest.approx(0.875)
    # y = x on [0, 4] (evaluations at 0, 1, 4): mean 2; y = x^2 sampled at 0, 1, 2: trapezoid (0.5 + 2.5) / 2.
    assert curves.normalized_area([0, 1, 4], [0.0, 1.0, 4.0], 0, 4) == pytest.approx(2.0)
    assert curves.normalized_area([0, 1, 2], [0.0, 1.0, 4.0], 0, 2) == pytest.approx(1.5)
    assert curves.normalized_area([0, 10], [0.2, 0.4], 5, 5) == pytest.approx(0.3)  # an empty span: the value
    assert math.isnan(curves.normalized_area([0, 10], [0.2, 0.4], 0, 11))  # not covered: no extrapolation
    with pytest.raises(ValueError, match="start <= end"):
        curves.normalized_area([0, 10], [0.2, 0.4], 6, 5)


# ------------------------------------------------------------------------------------------------------------
# Intervals and the verdict rule
# ------------------------------------------------------------------------------------------------------------
def test_verdict_rule_on_constructed_intervals():
    verdict = curves.interval_verdict
    assert verdict((1.05, 1.30)) == "faster"  # above 1
    assert verdict((1.02, 1.08)) == "faster"  # above 1 though inside the equal band: a decided difference wins
    assert verdict((0.60, 0.95)) == "slower"
    assert verdict((0.92, 1.08)) == "equal"  # inside [0.9, 1.1] and holding 1
    assert verdict((0.90, 1.10)) == "equal"  # the band's edges belong to it
    assert verdict((0.85, 1.20)) == "undecided"  # holds 1, wider than the band
    assert verdict((0.95, 1.15)) == "undecided"
    assert verdict((1.2, None)) == "faster"  # a None bound is infinite
    assert verdict((0.9, None)) == "undecided"
    assert verdict(None) == verdict([]) == "unknown"
    # Accuracy differences: reference 0, margin 0.01.
    assert verdict((-0.005, 0.008), 0.0, curves.ACCURACY_MARGIN, "higher", "lower") == "equal"
    assert verdict((0.002, 0.03), 0.0, curves.ACCURACY_MARGIN, "higher", "lower") == "higher"
    assert verdict((-0.03, -0.001), 0.0, curves.ACCURACY_MARGIN, "higher", "lower") == "lower"
    assert verdict((-0.02, 0.005), 0.0, curves.ACCURACY_MARGIN, "higher", "lower") == "undecided"
    assert "[0.9, 1.1]" in curves.VERDICT_RULE and "[-0.01, +0.01]" in curves.VERDICT_RULE


def test_compare_values_intervals_hold_the_point_estimate():
    method, base = [0.50, 0.62, 0.71, 0.58], [0.40, 0.52, 0.47, 0.55]
    got = curves.compare_values(method, base, n_boot=500, seed=3)
    assert got["mean"] == pytest.approx(np.mean(method)) and got["baseline_mean"] == pytest.approx(np.mean(base))
    assert got["difference"] == pytest.approx(np.mean(method) - np.mean(base))
    assert got["ratio"] == pytest.approx(np.mean(method) / np.mean(base))
    low, high = got["difference_ci95"]
    assert low <= got["difference"] <= high and low > 0  # the interval lies above 0: decided
    assert got["ratio_ci95"][0] <= got["ratio"] <= got["ratio_ci95"][1]
    assert got["verdict"] == "higher"
    assert curves.compare_values(method, base, n_boot=500, seed=3) == got  # deterministic for a seed
    # Constant seeds: no spread, the interval is the point.
    same = curves.compare_values([0.5, 0.5], [0.45, 0.45], n_boot=50)
    assert same["difference_ci95"] == pytest.approx([0.05, 0.05]) and same["verdict"] == "higher"
    # One seed on a side, or no replicates: no interval, no verdict; nan seeds are dropped.
    one = curves.compare_values([0.5], [0.4, 0.45])
    assert one["difference"] == pytest.approx(0.075) and one["difference_ci95"] is None and one["verdict"] == "unknown"
    assert curves.compare_values([0.5, 0.6], [0.4, 0.4], n_boot=0)["difference_ci95"] is None
    assert curves.compare_values([0.5, math.nan, 0.7], [0.4, 0.4])["mean"] == pytest.approx(0.6)
    assert curves.compare_values([], [0.4])["difference"] is None


def test_curve_comparison_reads_every_seed_at_the_same_budgets():
    # GRPO: 1 s per update, runs end at 40 s; PODS: 2 s per update, runs end at 80 s: the common span is 0-40 s.
    base = [(np.array([0.0, 20.0, 40.0]), np.array([0.2, 0.4, 0.5])),
            (np.array([0.0, 20.0, 40.0]), np.array([0.2, 0.3, 0.5]))]
    pods = [(np.array([0.0, 40.0, 80.0]), np.array([0.2, 0.6, 0.7])),
            (np.array([0.0, 40.0, 80.0]), np.array([0.2, 0.4, 0.7]))]
    got = curves.curve_comparison({"grpo": base, "pods": pods}, "grpo", n_boot=200)
    assert got["span"] == [0.0, 40.0] and got["budgets"] == [10.0, 20.0, 30.0, 40.0]
    at = got["labels"]["pods"]["at_budget"]
    assert at[0]["per_seed"] == pytest.approx([0.3, 0.25]) and at[3]["per_seed"] == pytest.approx([0.6, 0.4])
    assert at[0]["baseline_mean"] == pytest.approx((0.3 + 0.25) / 2)  # GRPO at 10 s: 0.3 and 0.25
    assert at[3]["difference"] == pytest.approx(0.5 - 0.5)
    for row in at:
        if row["difference_ci95"]:
            assert row["difference_ci95"][0] <= row["difference"] <= row["difference_ci95"][1]
    area = got["labels"]["pods"]["area"]
    # PODS seed 0 over 0-40 s: a line from 0.2 to 0.6, mean 0.4; seed 1: 0.2 to 0.4, mean 0.3.
    # GRPO seed 0: (0.3 x 20 + 0.45 x 20) / 40 = 0.375; seed 1: (0.25 + 0.4) / 2 = 0.325.
    assert area["per_seed"] == pytest.approx([0.4, 0.3])
    assert got["labels"]["grpo"]["area"]["per_seed"] == pytest.approx([0.375, 0.325])
    assert area["difference"] == pytest.approx(0.35 - 0.35) and area["ratio"] == pytest.approx(1.0)
    assert got["labels"]["grpo"]["area"]["difference"] == 0.0
    with pytest.raises(ValueError, match="baseline"):
        curves.curve_comparison({"pods": pods}, "grpo")


# ------------------------------------------------------------------------------------------------------------
# compare_runs with interpolation: off the evaluation grid
# ------------------------------------------------------------------------------------------------------------
GRPO_VALUES = ([0.10, 0.20, 0.30, 0.40], [0.10, 0.20, 0.30, 0.40])
PODS_VALUES = ([0.10, 0.30, 0.42, 0.50], [0.10, 0.28, 0.40, 0.50])


def _runs():
    steps = [0, 10, 20, 30]
    return ([run("GRPO", steps, v, 1.0, seed) for seed, v in enumerate(GRPO_VALUES)]
            + [run("PODS", steps, v, 1.0, seed) for seed, v in enumerate(PODS_VALUES)])


def test_interpolation_moves_a_grid_ratio_of_1_5_between_grid_values():
    # Target 0.35 (fixed). At checkpoint resolution GRPO reaches it at step 30 and PODS at step 20: 1.5x, and the
    # next ratio the grid allows is 30 / 10 = 3x. Interpolated: GRPO at 20 + 0.05 / 0.1 x 10 = 25; PODS' mean
    # curve (0.1, 0.29, 0.41, 0.5) at 10 + (0.35 - 0.29) / (0.41 - 0.29) x 10 = 15: 25 / 15 = 1.667x.
    grid = stats.compare_runs(_runs(), baseline="GRPO", target=0.35, x="steps", n_boot=0)
    assert (grid["labels"]["PODS"]["speedup"] == pytest.approx(1.5)
        and grid["crossing"] == "first evaluation reaching it")
    inter = stats.compare_runs(_runs(), baseline="GRPO", target=0.35, x="steps", n_boot=400, interpolate=True)
    pods = inter["labels"]["PODS"]
    assert inter["crossing"] == "interpolated between evaluations"
    assert inter["labels"]["GRPO"]["steps_to_target"] == pytest.approx(25.0)
    assert pods["steps_to_target"] == pytest.approx(15.0) and pods["speedup"] == pytest.approx(25 / 15)
    assert 1.5 < pods["speedup"] < 3.0
    # Per seed: PODS s0 at 10 + 0.05 / 0.12 x 10, s1 at 10 + 0.07 / 0.12 x 10.
    assert [s["steps_to_target"] for s in pods["seeds"]] == pytest.approx([10 + 5 / 1.2, 10 + 7 / 1.2])
    # The bootstrap interval holds the point estimate: resamples {s0,s0}, {s0,s1}, {s1,s1} of PODS' seeds give
    # 25 / 14.17, 25 / 15 and 25 / 15.83 (GRPO's seeds are identical).
    low, high = pods["speedup_ci95"]
    assert low == pytest.approx(25 / (10 + 7 / 1.2)) and high == pytest.approx(25 / (10 + 5 / 1.2))
    assert low <= pods["speedup"] <= high
    assert "interpolated between evaluations" in stats.format_compare_table(inter)


def test_interpolation_keeps_the_baseline_peak_and_bounds():
    # The default target is GRPO's peak mean (0.4, at its last evaluation): the crossing lands on that evaluation
    # in both readings; PODS' mean reaches 0.4 between step 10 (0.29) and 20 (0.41): 10 + 0.11 / 0.12 x 10.
    inter = stats.compare_runs(_runs(), baseline="GRPO", x="steps", n_boot=0, interpolate=True)
    assert inter["labels"]["GRPO"]["steps_to_target"] == 30.0
    assert inter["labels"]["PODS"]["steps_to_target"] == pytest.approx(10 + 11 / 1.2)
    # A target PODS never reaches: the speed-up is still an upper bound, GRPO's crossing / PODS' last step.
    never = stats.compare_runs(_runs(), baseline="GRPO", target=0.45, x="steps", n_boot=0, interpolate=True)
    assert (never["labels"]["GRPO"]["steps_to_target"] is None
        and never["labels"]["PODS"]["speedup_kind"] == "lower_bound")
    assert never["labels"]["PODS"]["speedup"] == pytest.approx(30 / (20 + 0.04 / 0.09 * 10))


# ------------------------------------------------------------------------------------------------------------
# Time to every accuracy level, seeds paired
# ------------------------------------------------------------------------------------------------------------
def test_mean_of_curves_is_exact_on_the_union_grid():
    """The seed-mean of two curves evaluated at different x is read at the union of their x (inside the span both
    cover) and equals the mean of each curve interpolated there: no point of either curve is lost."""
    a = (np.array([0.0, 10.0, 20.0, 30.0]), np.array([0.0, 0.4, 0.6, 0.7]))
    b = (np.array([0.0, 15.0, 25.0]), np.array([0.2, 0.5, 0.9]))
    grid, mean = curves.mean_of_curves([a, b])
    assert grid.tolist() == [0.0, 10.0, 15.0, 20.0, 25.0]  # b ends at 25: 30 lies outside the common span
    assert mean.tolist() == pytest.approx([(0.0 + 0.2) / 2, (0.4 + 0.4) / 2, (0.5 + 0.5) / 2, (0.6 + 0.7) / 2,
                                           (0.65 + 0.9) / 2])


def test_level_time_ratio_recovers_a_known_time_scale():
    """A method whose every seed's curve is the baseline's run twice as fast (x halved, on its own grid) gets
    there in half the time at every level: the ratio is 2 exactly. A method that never reaches the upper levels is
    censored there, not 0: each missed level counts as reached at its curve's end, and the geometric mean is an
    upper bound; a baseline that does not rise has no levels (None)."""
    xs = np.array([0.0, 25.0, 50.0, 75.0, 100.0])
    base = [(xs, np.array([0.5, 0.6, 0.66, 0.69, 0.7]) + shift) for shift in (0.0, 0.01, -0.01)]
    fast = [(x / 2, v) for x, v in base]
    result = curves.level_time_ratio(base, fast)
    assert result["ratio"] == pytest.approx(2.0)
    assert result["per_level"] == pytest.approx([2.0] * 15) and len(result["levels"]) == 15
    assert (result["levels"][0] == pytest.approx(0.5 + 0.2 * 0.2)
        and result["levels"][-1] == pytest.approx(0.5 + 0.9 * 0.2))
    assert not result["censored"] and result["levels_reached"] == 15 and result["seeds_not_reached"] == [0] * 15
    stuck = [(x, np.minimum(v, 0.6)) for x, v in base]  # never above 0.6: misses the upper levels
    bounded = curves.level_time_ratio(base, stuck)
    missed = np.array(bounded["per_level_censored"])
    assert bounded["censored"] and 0 < bounded["levels_reached"] == (~missed).sum() < 15
    assert np.array(bounded["levels"])[missed].min() > 0.6 and math.inf in bounded["method_x"]
    # a missed level: the baseline's x over the method's end (100), a positive bound, never 0
    assert np.array(bounded["per_level"])[missed] == pytest.approx(np.array(bounded["baseline_x"])[missed] / 100.0)
    assert bounded["ratio"] == pytest.approx(math.exp(np.mean(np.log(bounded["per_level"])))) and bounded["ratio"] > 0
    assert bounded["seeds_not_reached"] == [0] * bounded["levels_reached_by_all_seeds"] + [3] * (
        15 - bounded["levels_reached_by_all_seeds"])
    flat = [(xs, np.full(5, 0.5))]
    assert curves.level_time_ratio(flat, fast)["ratio"] is None


def test_paired_bootstrap_cancels_what_a_seed_shares():
    """Seeds differ a lot in speed (seed s runs at time scale 1 + s / 4), but a seed's speed is shared by both
    methods and the method is 1.5x faster on every seed: resampling seeds in pairs gives every replicate 1.5, an
    interval of zero width. With the method's seeds in another order (the pairing broken) the ratio's interval
    widens. Seeds only one side ran are listed and left out; no shared seed is one line of error."""
    xs = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    values = np.array([0.3, 0.5, 0.6, 0.65, 0.67])
    base = {s: (xs * (1 + s / 4), values) for s in range(8)}
    method = {s: (xs * (1 + s / 4) / 1.5, values) for s in range(8)}
    paired = curves.paired_level_time_ratio(base, {**method, 99: method[0]}, n_boot=300)
    assert paired["ratio"] == pytest.approx(1.5) and paired["ci95"] == pytest.approx([1.5, 1.5])
    assert paired["verdict"] == "faster" and paired["seeds"] == list(range(8)) and paired["unpaired"] == [99]
    shuffled = {s: method[(s + 3) % 8] for s in range(8)}  # same curves, the pairing broken
    broken = curves.paired_level_time_ratio(base, shuffled, n_boot=300)
    assert broken["ratio"] == pytest.approx(1.5) and broken["ci95"][1] - broken["ci95"][0] > 0.1
    with pytest.raises(ValueError, match="no seed was run by both"):
        curves.paired_level_time_ratio({0: base[0]}, {1: method[1]})


def test_a_level_one_seed_of_four_never_reaches_is_said_so_not_printed_as_zero():
    """Four paired seeds, the method twice as fast on each, but seed 3 stops at 0.65, below the top three levels
    (0.66 to 0.68). The seed-mean still reaches every level, so the point is measured (2x on the lower levels);
    the report says the top level was not reached in 1 of 4 seeds. Bootstrap replicates that draw seed 3 often
    miss a level: their ratios are upper bounds, so the interval's lower end is marked as one (≤) and the verdict
    is read with it at 0. Nothing prints 0.00x."""
    from pods_rl.curves import format_level

    xs = np.array([0.0, 25.0, 50.0, 75.0, 100.0])
    values = np.array([0.5, 0.6, 0.66, 0.69, 0.7])
    base = {s: (xs, values) for s in range(4)}
    method = {s: (xs / 2, np.minimum(values, 0.65) if s == 3 else values) for s in range(4)}
    level = curves.paired_level_time_ratio(base, method, n_boot=400)
    assert not level["censored"] and level["levels_reached"] == 15
    assert level["seeds_not_reached"] == [0] * 12 + [1] * 3 and level["levels_reached_by_all_seeds"] == 12
    assert 0 < level["replicates_censored"] < 400 and level["ci95_upper_bounds"][0]
    assert level["ci95"][0] > 0  # the bound, not the 0 a missed level used to count as
    text = format_level(level)
    assert "12 of 15 levels reached by all 4 seeds, the top one not reached in 1 of 4" in text, text
    assert f"{level['replicates_censored']} of 400 bootstrap replicates miss a level" in text
    assert "[≤" in text and "0.00x" not in text and "[0.00," not in text
    # a method that misses the upper levels in every seed: a bound (<), slower, both ends bounds
    stuck = {s: (xs / 2, np.minimum(values, 0.6)) for s in range(4)}
    bounded = curves.paired_level_time_ratio(base, stuck, n_boot=200)
    assert bounded["censored"] and bounded["ci95_upper_bounds"] == [True, True]
    assert curves.format_level_ratio(bounded).startswith(f"< {bounded['ratio']:.2f}x [≤")
    assert f"the seed-mean reaches {bounded['levels_reached']} of 15 levels" in format_level(bounded)


def test_censoring_never_buys_a_verdict():
    """The verdict reads the widest interval censoring allows: a censored replicate anywhere in [0, its bound].
    The method runs each seed twice as fast, but seed 1 stops at 0.66, below the top two levels (0.67, 0.68):
    replicates drawing seed 1 twice (a quarter) miss them, bounded at GRPO's x / the method's end (1.17 and 1.33),
    so the bounds alone put the whole interval above 1 ('faster'); with those replicates possibly at 0 the
    interval reaches 0, and the verdict is 'undecided'."""
    xs = np.array([0.0, 25.0, 50.0, 75.0, 100.0])
    values = np.array([0.5, 0.6, 0.66, 0.69, 0.7])
    base = {s: (xs, values) for s in range(2)}
    method = {0: (xs / 2, values), 1: (xs / 2, np.minimum(values, 0.66))}
    level = curves.paired_level_time_ratio(base, method, n_boot=400)
    assert not level["censored"] and level["ratio"] > 1  # the seed-mean of both reaches every level
    assert 50 < level["replicates_censored"] < 150 and level["ci95_upper_bounds"][0]
    assert level["ci95"][0] > 1 and curves.interval_verdict(level["ci95"]) == "faster"
    assert level["verdict"] == "undecided"


def test_compare_says_how_many_seeds_never_reached_the_target():
    """`pods compare`: a target one side's seeds never reach is counted per label and said under the table."""
    never = stats.compare_runs(_runs(), baseline="GRPO", target=0.45, x="steps", n_boot=0, interpolate=True)
    assert never["labels"]["GRPO"]["seeds_not_reached"] == 2 and never["labels"]["PODS"]["seeds_not_reached"] == 0
    table = stats.format_compare_table(never)
    assert "GRPO: target not reached in 2 of 2 seeds" in table and "PODS: target not reached" not in table
