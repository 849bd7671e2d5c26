"""benchmarks/auto_calibration.py's core: the variance ratio V under a Beta over prompts, the Beta fitted to
(accuracy, pass@k), and the time-to-level prediction, against brute force on small synthetic cases."""

import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("auto_calibration", ROOT / "benchmarks" / "auto_calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


calib = _load()


def _max_subset_variance(rewards, m):
    """Brute force: the largest population variance over every m-subset of the rewards."""
    return max(np.var(subset) for subset in itertools.combinations(rewards, m))


def _log_beta(a, b):
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _expected_selected_variance_brute(alpha, beta, n, m):
    """E_p[E[V_{n,m}]], p ~ Beta(alpha, beta), by enumeration: each of the C(n, k) outcomes with k successes has
    probability E[p^k (1-p)^(n-k)] = B(alpha + k, beta + n - k) / B(alpha, beta), and every m-subset of it is tried
    (the order of the rewards does not change the subsets' variances)."""
    total = 0.0
    for k in range(n + 1):
        weight = math.comb(n, k) * math.exp(_log_beta(alpha + k, beta + n - k) - _log_beta(alpha, beta))
        total += weight * _max_subset_variance([1] * k + [0] * (n - k), m)
    return total


CASES = [(0.7, 1.3, 4, 6), (2.0, 0.5, 2, 5), (1.0, 1.0, 3, 7), (0.3, 4.0, 4, 10), (5.0, 0.2, 6, 12)]


@pytest.mark.parametrize("alpha, beta, m, n", CASES)
def test_variance_ratio_equals_brute_force_over_a_beta(alpha, beta, m, n):
    """V = E_p[g(n)] / E_p[g(m)], p ~ Beta: the script's (the planner's Beta-binomial table) equals enumeration of
    every outcome and every m-subset."""
    want = _expected_selected_variance_brute(alpha, beta, n, m) / _expected_selected_variance_brute(alpha, beta, m, m)
    got = calib.variance_ratio([alpha], [beta], m, n)[0]
    assert got == pytest.approx(want, rel=1e-9)
    assert got >= 1.0


def test_variance_ratio_is_one_at_n_equal_m_and_grows_with_n():
    ratios = [calib.variance_ratio([0.4], [0.6], 4, n)[0] for n in (4, 8, 16, 32)]
    assert ratios[0] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(ratios, ratios[1:]))


def test_fit_beta_recovers_the_beta_from_accuracy_and_pass_at_k():
    alpha, beta, k = np.array([0.3, 2.0, 5.0]), np.array([0.9, 0.4, 1.0]), 4
    mean = alpha / (alpha + beta)
    pass_at_k = 1 - calib.beta_none_of_k(alpha, beta, k)
    got_alpha, got_beta = calib.fit_beta(mean, pass_at_k, k)
    np.testing.assert_allclose(got_alpha, alpha, rtol=1e-6)
    np.testing.assert_allclose(got_beta, beta, rtol=1e-6)


def test_predicted_level_ratio_of_a_constant_v_is_one_plus_kappa_v_minus_one():
    steps = np.arange(5, 105, 5.0)
    ratio = calib.predicted_level_ratio(steps, np.full(len(steps), 1.5), [10.0, 60.0, 150.0], kappa=0.4)
    np.testing.assert_allclose(ratio, 1.2)
    # A V that rises along the path: the ratio to a level is the harmonic-type mean of the rates on the way.
    v = np.where(steps <= 50, 1.0, 2.0)
    ratio = calib.predicted_level_ratio(steps, v, [100.0], kappa=1.0)[0]
    assert 1.0 < ratio < 2.0
    assert ratio == pytest.approx(100 / (50 + 2.5 + 47.5 / 2), rel=1e-9)  # the V step lies between 50 and 55
    assert math.isnan(calib.predicted_level_ratio(steps, v, [math.inf], kappa=1.0)[0])
