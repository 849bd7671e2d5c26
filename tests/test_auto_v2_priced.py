"""benchmarks/auto_v2_priced.py's regret: the best fixed method's speed over auto's, its CI one joint bootstrap of
the seeds, on synthetic accuracy curves whose times are known."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _load():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its neighbour auto_choices
    spec = importlib.util.spec_from_file_location("auto_v2_priced", ROOT / "benchmarks" / "auto_v2_priced.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


priced = _load()


def _curves(time_scale: float, seeds=range(8), noise: float = 0.0) -> dict:
    """{seed: (times (T,), accuracy (T,))}: the same rising curve, its time axis stretched by ``time_scale``."""
    rng = np.random.default_rng(0)
    steps = np.arange(0, 301, 25, dtype=float)
    out = {}
    for seed in seeds:
        accuracy = 0.5 + 0.35 * (1 - np.exp(-steps / 80)) + noise * rng.standard_normal(len(steps))
        accuracy[0] = 0.5
        out[seed] = (steps * time_scale * (1 + 0.01 * seed), accuracy)
    return out


def test_the_regret_is_the_best_fixed_speed_over_autos_with_an_interval_around_it():
    base, best = _curves(1.0), _curves(1 / 1.5)  # the fixed n 1.5x GRPO's speed
    same = priced.paired_regret(base, best, _curves(1 / 1.5))
    assert abs(same["ratio"] - 1) < 1e-9 and same["ci95"] == [1.0, 1.0] and same["seeds"] == list(range(8))
    slower = priced.paired_regret(base, best, _curves(1 / 1.2))  # auto 1.2x: regret 1.5 / 1.2
    assert abs(slower["ratio"] - 1.25) < 1e-6
    noisy = priced.paired_regret(base, best, _curves(1 / 1.2, noise=0.02))
    low, high = noisy["ci95"]
    assert low < noisy["ratio"] < high and high - low > 0.01


def test_only_the_seeds_all_three_ran_are_paired():
    result = priced.paired_regret(_curves(1.0), _curves(0.5, seeds=range(1, 8)), _curves(0.5, seeds=range(6)))
    assert result["seeds"] == [1, 2, 3, 4, 5]
