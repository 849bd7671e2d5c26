"""pods_rl.stats: curves and time/steps to target on synthetic run dirs, target choices, bootstrap intervals."""

import json
import math

import numpy as np
import pytest
import yaml

from pods_rl import stats

GRPO = {"num_generations": 16, "downsample_to": 16}
PODS = {"num_generations": 64, "downsample_to": 16, "downsample_rule": "max_variance"}


def make_run(root, name, steps, accs, seconds_per_step, config):
    """A run dir whose metrics.jsonl holds training rows and eval/accuracy rows at ``steps``."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for step, acc in zip(steps, accs):
        seconds = step * seconds_per_step
        if step:
            rows.append({"step": step, "train_seconds": seconds, "time/step": seconds_per_step})
        rows.append({"step": step, "train_seconds": seconds, "eval/accuracy": acc})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def make_study(root):
    """GRPO: 0.5 s/step, two identical seeds reaching 0.7 at step 300 (150 s).
    PODS: 2 s/step (4x more rollouts sampled), seed 0 reaches 0.7 at step 100 (200 s), seed 1 at step 150."""
    grpo_steps, pods_steps = [0, 100, 200, 300], [0, 50, 100, 150]
    return [
        make_run(root, "grpo_s0", grpo_steps, [0.1, 0.3, 0.5, 0.7], 0.5, {**GRPO, "seed": 0}),
        make_run(root, "grpo_s1", grpo_steps, [0.1, 0.3, 0.5, 0.7], 0.5, {**GRPO, "seed": 1}),
        make_run(root, "pods_s0", pods_steps, [0.1, 0.5, 0.7, 0.8], 2.0, {**PODS, "seed": 0}),
        make_run(root, "pods_s1", pods_steps, [0.1, 0.5, 0.6, 0.8], 2.0, {**PODS, "seed": 1}),
    ]


METHOD = "PODS max_variance (n=64→m=16)"


def test_run_curve_and_mean_curve_on_steps(tmp_path):
    runs = stats.load_runs(make_study(tmp_path))
    xs, values, _ = stats.run_curve(runs[2], x="steps")
    assert xs.tolist() == [0, 50, 100, 150] and values.tolist() == [0.1, 0.5, 0.7, 0.8]
    assert stats.run_curve(runs[2], x="time")[0].tolist() == [0.0, 100.0, 200.0, 300.0]
    grid, mean, half = stats.mean_curve(runs[2:], x="steps")
    assert grid.tolist() == [0, 50, 100, 150] and mean == pytest.approx([0.1, 0.5, 0.65, 0.8])
    assert half[2] == pytest.approx(1.96 * np.std([0.7, 0.6], ddof=1) / math.sqrt(2))
    with pytest.raises(ValueError, match="x must be"):
        stats.run_curve(runs[0], x="epochs")


def test_compare_steps_vs_time_known_crossings_and_ci(tmp_path):
    runs = make_study(tmp_path)
    by_steps = stats.compare_runs(runs, x="steps", n_boot=300, seed=0)
    assert by_steps["x"] == "steps" and by_steps["x_unit"] == "steps"
    assert by_steps["target"] == pytest.approx(0.7)  # GRPO's peak mean accuracy
    grpo, pods = by_steps["labels"]["GRPO (n=16)"], by_steps["labels"][METHOD]
    # Mean curves: GRPO reaches 0.7 at step 300; PODS' mean is 0.65 at step 100, 0.8 at step 150.
    assert grpo["steps_to_target"] == 300.0 and pods["steps_to_target"] == 150.0
    assert pods["speedup"] == pytest.approx(2.0) and pods["speedup_kind"] == "estimate"
    assert [s["steps_to_target"] for s in pods["seeds"]] == [100.0, 150.0]
    assert pods["last_step"] == 150.0
    # Bootstrap over PODS seeds (GRPO's are identical): {s0,s0} -> 300/100 = 3, {s0,s1} and {s1,s1} -> 2.
    # P({s0,s0}) = 1/4 > 2.5%, so the interval is exactly [2, 3], and it holds the true per-step ratio 2.
    assert pods["speedup_ci95"] == pytest.approx([2.0, 3.0])

    # The same runs in training time: PODS learns more per step but a step costs 4x: 150 s vs 300 s.
    by_time = stats.compare_runs(runs, x="time", n_boot=300, seed=0)
    pods_t = by_time["labels"][METHOD]
    assert by_time["labels"]["GRPO (n=16)"]["time_to_target"] == 150.0 and pods_t["time_to_target"] == 300.0
    assert pods_t["speedup"] == pytest.approx(0.5) and pods_t["last_time"] == 300.0
    assert pods_t["speedup_ci95"] == pytest.approx([0.5, 0.75])
    json.dumps(by_steps, allow_nan=False)
    table = stats.format_compare_table(by_steps)
    assert "steps_to_target" in table and "2.00x" in table and "[2.00, 3.00]" in table and "100,150" in table


def test_target_gain_fraction(tmp_path):
    runs = make_study(tmp_path)
    result = stats.compare_runs(runs, x="steps", target_gain_fraction=0.5, n_boot=0)
    # GRPO mean: start 0.1, peak 0.7 -> target 0.1 + 0.5 * 0.6 = 0.4: GRPO at step 200, PODS (0.5) at step 50.
    assert result["target"] == pytest.approx(0.4) and "0.5" in result["target_source"]
    assert result["labels"]["GRPO (n=16)"]["steps_to_target"] == 200.0
    assert result["labels"][METHOD]["steps_to_target"] == 50.0
    assert result["labels"][METHOD]["speedup"] == pytest.approx(4.0)
    assert stats.baseline_target([0.2, 0.6, 0.4], 0.8) == pytest.approx(0.52)
    assert stats.baseline_target([0.2, 0.6, 0.4]) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="not both"):
        stats.compare_runs(runs, target=0.5, target_gain_fraction=0.5)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        stats.compare_runs(runs, target_gain_fraction=1.5)


def test_steps_axis_needs_steps(tmp_path):
    run_dir = tmp_path / "nostep"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"train_seconds": 1.0, "eval/accuracy": 0.3}) + "\n")
    run = stats.load_run(run_dir)
    assert stats.run_curve(run, "time")[0].tolist() == [1.0]
    with pytest.raises(ValueError, match="no optimizer step"):
        stats.run_curve(run, "steps")


def test_time_to_target_alias():
    assert stats.steps_to_target([0, 10, 20], [0.1, 0.5, 0.4], 0.45) == 10.0
    assert stats.time_to_target([0, 10, 20], [0.1, 0.5, 0.4], 0.6) == math.inf


def test_bootstrap_ci_array_and_callable():
    assert stats.bootstrap_ci([0.3, 0.3, 0.3]) == pytest.approx((0.3, 0.3))
    assert stats.bootstrap_ci([0.5]) is None  # one seed: no spread to resample
    # Two seeds {0, 1}: the resampled mean is 0 or 1 with probability 1/4 each: the 95% interval is [0, 1].
    assert stats.bootstrap_ci([0.0, 1.0], n_boot=1000) == (0.0, 1.0)
    low, high = stats.bootstrap_ci([1.0, 2.0, 3.0, 4.0], statistic=np.median, n_boot=500, seed=1)
    assert 1.0 <= low <= 2.5 <= high <= 4.0
    assert stats.bootstrap_ci([1.0, 2.0, 3.0], seed=5) == stats.bootstrap_ci([1.0, 2.0, 3.0], seed=5)

    # Callable form: a ratio of two methods' means, each resampled independently.
    a, b = [2.0, 2.0, 2.0], [1.0, 1.0, 1.0]
    ci = stats.bootstrap_ci(lambda rng: np.mean(stats.resample(a, rng)) / np.mean(stats.resample(b, rng)))
    assert ci == pytest.approx((2.0, 2.0))
    assert stats.bootstrap_ci(lambda rng: None, n_boot=10) is None  # no valid replicate


def test_bootstrap_ci_covers_the_true_mean():
    """Coverage of the 95% percentile interval of a mean, over 200 synthetic 10-seed experiments."""
    rng = np.random.default_rng(0)
    hits = sum(low <= 0.5 <= high for low, high in
               (stats.bootstrap_ci(rng.normal(0.5, 0.1, 10), n_boot=400, seed=i) for i in range(200)))
    assert 0.85 <= hits / 200 <= 0.99  # percentile intervals under-cover a little at 10 seeds
