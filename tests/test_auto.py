"""rollout_planner="auto" (pods_rl.budget.planners.auto): the expected selected variance against brute force, the
optimizer against exhaustive search, the cost model's marginal (not average) seconds, and the planner's choices at
the two ends: GRPO (n = m) where sampling does not pay, num_generations where it is free."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from pods_rl.budget.ledger import LedgerSettings, PromptLedger
from pods_rl.budget.planners import make_planner
from pods_rl.budget.planners.auto import (
    AutoN,
    AutoSettings,
    RolloutCostModel,
    allocate_for_signal,
    beta_binomial_pmf,
    binomial_pmf,
    expected_selected_variance,
    selected_variance_table,
    signal_table,
)

P_GRID = (0.0, 0.05, 0.3, 0.5, 0.77, 0.95, 1.0)


def brute_force_selected_variance(p: float, n: int, m: int) -> float:
    """E over the 2^n outcomes (grouped by their count of successes: rewards are exchangeable) of the largest
    population variance over every m-subset, found by trying them all."""
    total = 0.0
    for k in range(n + 1):
        rewards = [1.0] * k + [0.0] * (n - k)
        best = max(float(np.var([rewards[i] for i in subset])) for subset in itertools.combinations(range(n), m))
        total += math.comb(n, k) * p**k * (1 - p) ** (n - k) * best
    return total


def test_expected_selected_variance_equals_brute_force_for_every_n_up_to_10():
    p = torch.tensor(P_GRID, dtype=torch.float64)
    for n in range(1, 11):
        for m in range(1, n + 1):
            formula = expected_selected_variance(binomial_pmf(p, n), m)
            brute = torch.tensor([brute_force_selected_variance(float(q), n, m) for q in P_GRID], dtype=torch.float64)
            torch.testing.assert_close(formula, brute, rtol=1e-12, atol=1e-14)
    # At n = m it is the expected variance of m Bernoullis: p(1-p)(m-1)/m.
    torch.testing.assert_close(expected_selected_variance(binomial_pmf(p, 8), 8), p * (1 - p) * 7 / 8)


def test_the_batched_beta_binomial_table_equals_the_reference():
    a = np.array([0.3, 1.2, 5.0, 0.002, 17.0])
    b = np.array([2.0, 0.8, 5.0, 1.998, 1.0])
    for m in (1, 2, 3, 8, 16):
        ns = np.array([m, m + 1, 2 * m, 40])
        fast = selected_variance_table(a, b, m, ns)
        for j, n in enumerate(ns):
            reference = expected_selected_variance(beta_binomial_pmf(a, b, int(n)), m).numpy()
            np.testing.assert_allclose(fast[:, j], reference, rtol=1e-10, atol=1e-14)
    # The Beta-binomial pmf: Beta(a, b) integrated out, in closed form.
    def log_beta(x, y):
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    n = 7
    for a0, b0 in ((0.5, 2.0), (3.0, 3.0)):
        closed = [math.comb(n, k) * math.exp(log_beta(k + a0, n - k + b0) - log_beta(a0, b0)) for k in range(n + 1)]
        np.testing.assert_allclose(beta_binomial_pmf([a0], [b0], n)[0].numpy(), closed, rtol=1e-12)


def test_more_rollouts_never_lower_the_signal_and_help_most_near_0_or_1():
    a, b = np.array([0.5, 5.0, 9.5]), np.array([9.5, 5.0, 0.5])  # p ~ 0.05, 0.5, 0.95
    signal = signal_table(a, b, m=8, max_n=32).numpy()  # (3, 25)
    assert (np.diff(signal, axis=1) >= -1e-15).all()
    gain = signal[:, -1] / signal[:, 0]
    assert gain[0] > 2 and gain[2] > 2 and gain[1] < 1.5, gain


def test_no_rollout_past_m_raises_the_signal_per_sampled_rollout():
    """Why auto is GRPO where sampling is all the cost: g(n)/n <= g(m)/m for every p and n > m (so with training
    free, n = m is optimal; it is training's fixed cost per prompt that makes extra rollouts pay)."""
    p = torch.linspace(0.001, 0.999, 999, dtype=torch.float64)
    for m in (2, 3, 4, 8, 16):
        per_rollout = expected_selected_variance(binomial_pmf(p, m), m) / m
        for n in range(m + 1, 4 * m + 1):
            assert bool((expected_selected_variance(binomial_pmf(p, n), m) / n <= per_rollout * (1 + 1e-12)).all())


def test_the_optimizer_equals_exhaustive_search():
    rng = np.random.default_rng(0)
    for _ in range(40):
        P, K = rng.integers(1, 4), rng.integers(1, 5)
        signal = np.sort(rng.random((P, K)), axis=1)  # (P, K)
        counts = np.sort(rng.choice(np.arange(1, 20), K, replace=False))
        sample, fixed = float(rng.random() * rng.choice([0.01, 1, 100])), float(rng.random() * 10 + 0.1)
        chosen, ratio = allocate_for_signal(signal, counts, sample_seconds=sample, fixed_seconds=fixed)
        best = max(sum(signal[i, c] for i, c in enumerate(choice)) / (fixed + sample * sum(counts[c] for c in choice))
                   for choice in itertools.product(range(K), repeat=P))
        assert ratio == pytest.approx(best, rel=1e-12)
        index = [int(np.flatnonzero(counts == c)[0]) for c in chosen.tolist()]
        reached = sum(signal[i, c] for i, c in enumerate(index)) / (fixed + sample * counts[index].sum())
        assert reached == pytest.approx(best, rel=1e-12)


def ledger_with(rates, rollouts=16, seed=0):
    """A ledger holding one group of ``rollouts`` per prompt, ids 0..P-1, success rate ``rates`` (P,)."""
    ledger = PromptLedger(LedgerSettings(success_threshold=0.5))
    generator = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(len(rates), rollouts, generator=generator) < torch.tensor(rates)[:, None]).double()
    ledger.record(torch.arange(len(rates)), rewards, step=0)
    return ledger


def planner_after(costs: dict, *, m=8, n=32, steps=3, rates=(0.5,) * 16, **knobs):
    planner = make_planner("auto", min_n=m, max_n=n, warmup_steps=0, **knobs)
    ledger = ledger_with(list(rates))
    for _ in range(steps):
        plan = planner.plan(torch.arange(len(rates)), ledger, n=n, m=m)
        N = int(plan.rollouts.sum())
        planner.observe(sampled=N, sample_seconds=costs["a"] + costs["b"] * N, trained=m * len(rates),
                        update_seconds=costs["t"] * m * len(rates))
    return planner, ledger


def test_it_is_grpo_where_sampling_is_dear_and_num_generations_where_it_is_free():
    rates = [0.02, 0.98, 0.03, 0.97, 0.5, 0.5]
    dear = make_planner("auto", sample_ms=1000.0, train_ms=1.0)
    free = make_planner("auto", sample_ms=1e-9, train_ms=1.0)
    ledger = ledger_with(rates)
    assert dear.plan(torch.arange(6), ledger, n=32, m=8).rollouts.tolist() == [8] * 6
    chosen = free.plan(torch.arange(6), ledger, n=32, m=8).rollouts.tolist()
    assert chosen[:4] == [32] * 4, chosen  # near 0 or 1: every rollout raises the chance of a mixed group


def test_it_learns_a_launch_bound_slope_and_samples_more_but_not_on_a_linear_machine():
    """Generation a + b*N with a >> b*N (the H200's shape, benchmarks/results/gpu-nvidia-h200: 0.17 s for 8 x 16
    rollouts, 4x the rollouts ~1.1x the step; 0.53 ms of update per trained rollout): the probes show the small slope,
    so n rises. The same average seconds per rollout at N = P*m, but linear in N (the CPU's shape): it stays at m."""
    P, m, n = 8, 16, 64
    rates = [0.1, 0.9, 0.8, 0.2] * 2
    launch = {"a": 0.17, "b": 0.00006, "t": 0.00053}
    average = (launch["a"] + launch["b"] * P * m) / (P * m)
    linear = {"a": 0.0, "b": average, "t": launch["t"]}
    fast, ledger = planner_after(launch, m=m, n=n, steps=8, rates=rates)
    estimate = fast.estimate()
    assert estimate.slope_known and estimate.per_sampled == pytest.approx(launch["b"], rel=1e-6)
    assert fast.probes >= 1 and fast.plan(torch.arange(P), ledger, n=n, m=m).rollouts.float().mean() > 2 * m
    slow, ledger = planner_after(linear, m=m, n=n, steps=8, rates=rates)
    assert slow.estimate().per_sampled == pytest.approx(average, rel=1e-6)
    plan = slow.plan(torch.arange(P), ledger, n=n, m=m)
    assert plan.rollouts.tolist() == [m] * P and plan.metrics["pods/auto_probe"] == 0.0


def test_probes_are_bounded_and_logged():
    # one probe and its neighbours on both sides tell the slope: no second probe (max_probes is an upper bound)
    planner, ledger = planner_after({"a": 0.0, "b": 1.0, "t": 1e-3}, steps=40, max_probes=2, probe_gap=3)
    assert planner.probes == 1 and planner.estimate().slope_known
    plans = [planner.plan(torch.arange(16), ledger, n=32, m=8) for _ in range(5)]
    assert all(p.metrics["pods/auto_probe"] == 0.0 and p.metrics["pods/auto_probes"] == 1.0 for p in plans)
    never, _ = planner_after({"a": 0.0, "b": 1.0, "t": 1e-3}, steps=40, max_probes=0)
    assert never.probes == 0 and not never.estimate().slope_known


def test_a_probe_doubles_the_total_not_every_prompt_at_max_n():
    planner, ledger = planner_after({"a": 0.0, "b": 1e-3, "t": 1e-3}, steps=0)
    planner.observe(sampled=128, sample_seconds=0.128, trained=128, update_seconds=0.128)
    plan = planner.plan(torch.arange(16), ledger, n=32, m=8)
    assert plan.metrics["pods/auto_probe"] == 1.0 and plan.rollouts.tolist() == [16] * 16


def test_no_probe_where_no_slope_could_change_the_choice():
    """Every prompt certain (p = 1/2 over thousands of outcomes) and efficiency 0: more rollouts add nothing even
    when free, so the probe is not paid."""
    ledger = PromptLedger(LedgerSettings(success_threshold=0.5, window=4096))
    ledger.record(torch.arange(16), (torch.arange(4096) % 2).double().expand(16, -1), step=0)
    planner = make_planner("auto", min_n=8, max_n=32, warmup_steps=0, efficiency=0.0)
    planner.observe(sampled=128, sample_seconds=0.128, trained=128, update_seconds=0.128)
    plan = planner.plan(torch.arange(16), ledger, n=32, m=8)
    assert plan.metrics["pods/auto_probe"] == 0.0 and planner.probes == 0 and plan.rollouts.tolist() == [8] * 16


def test_old_outcomes_fade_into_the_batch_pass_rate_now():
    """Prompt 0 failed 16 of 16 at step 0; at step 64 the batch passes 90%. With a half-life of 16 updates its
    outcomes count 0.5 ** 4 = 1/16: the posterior mean is (2 * 0.9 + 0) / (2 + 1), not 0.9 / 18 as unaged."""
    from pods_rl.budget.planners.auto import ledger_now, success_posterior

    ledger = PromptLedger(LedgerSettings(success_threshold=0.5))
    ledger.record(torch.tensor([0]), torch.zeros(1, 16), step=0)
    ledger.record(torch.arange(1, 11), (torch.arange(10)[:, None] < 9).double().expand(-1, 16), step=64)
    now, rate = ledger_now(ledger)
    assert (now, rate) == (64, pytest.approx(0.9))
    stats = ledger.columns(torch.tensor([0]), "window", "last_step")
    a, b = success_posterior(stats["window"], 2.0, age=now - stats["last_step"], half_life=16.0, pass_rate_now=rate)
    assert a[0] / (a[0] + b[0]) == pytest.approx(2 * 0.9 / 3) and a[0] + b[0] == pytest.approx(3.0)
    a, b = success_posterior(stats["window"], 2.0)  # unaged: its own outcomes only, as they were
    assert a[0] / (a[0] + b[0]) == pytest.approx(2 * 0.001 / 18)
    # the planner reads the same: the aged prompt's success rate
    plan = make_planner("auto", min_n=8, max_n=32, sample_ms=1.0, train_ms=1.0).plan(torch.tensor([0]), ledger, n=32)
    assert plan.extra["success_rate"][0].item() == pytest.approx(0.6)


def test_a_prompt_near_one_half_at_a_high_cost_ratio_gets_m_unless_the_gain_is_sure():
    """p near 1/2 gains little from n > m. At c_s/c_t = 0.3 the expected efficiency (0.435) buys it more rollouts
    with an intercept of 50 ms; at the interval's lower end (0.20, the default decision) it gets m."""
    ledger = PromptLedger(LedgerSettings(success_threshold=0.5))
    ledger.record(torch.arange(8), (torch.arange(16) % 2).double().expand(8, -1), step=0)  # 8 of 16 each
    costs = dict(sample_ms=0.3, train_ms=1.0, fixed_ms=50.0)
    sure = make_planner("auto", min_n=8, max_n=32, **costs).plan(torch.arange(8), ledger, n=32, m=8).rollouts
    expected = make_planner("auto", min_n=8, max_n=32, efficiency_low=None, **costs).plan(
        torch.arange(8), ledger, n=32, m=8).rollouts
    assert sure.tolist() == [8] * 8 and int(expected.max()) > 8, (sure, expected)


def test_where_n_for_every_prompt_is_nearly_free_every_prompt_gets_n():
    """At one H200's costs (c0 202 ms, c_s 0.056, c_t 0.526 ms; m = 16 of up to 64, 8 prompts) the gain model gives
    some prompts fewer than 64, and 64 for every prompt costs under 3% more step: every prompt gets 64. At
    c_s / c_t = 0.3 the same top-up would cost more than 3%: the plan stands."""
    ledger = ledger_with([0.9, 0.85, 0.8, 0.95, 0.75, 0.9, 0.85, 0.7])  # the strong tiny model's range
    h200 = dict(sample_ms=0.056, train_ms=0.526, fixed_ms=202.0)
    exact = make_planner("auto", min_n=16, max_n=64, free_share=None, **h200).plan(torch.arange(8), ledger, n=64, m=16)
    assert int(exact.rollouts.min()) < 64, exact.rollouts
    extra_ms = 0.056 * float((64 - exact.rollouts).sum())
    step_ms = 202.0 + 0.526 * 16 * 8 + 0.056 * float(exact.rollouts.sum())
    assert extra_ms <= 0.03 * step_ms  # the case the rule is for
    topped = make_planner("auto", min_n=16, max_n=64, **h200).plan(torch.arange(8), ledger, n=64, m=16)
    assert topped.rollouts.tolist() == [64] * 8 and topped.metrics["pods/auto_topped_up"] == 1.0
    dear = dict(h200, sample_ms=0.158)
    exact = make_planner("auto", min_n=16, max_n=64, free_share=None, **dear).plan(torch.arange(8), ledger, n=64, m=16)
    plan = make_planner("auto", min_n=16, max_n=64, **dear).plan(torch.arange(8), ledger, n=64, m=16)
    assert plan.rollouts.tolist() == exact.rollouts.tolist() and plan.metrics["pods/auto_topped_up"] == 0.0
    assert 0.158 * float((64 - plan.rollouts).sum()) > 0.03 * (202.0 + 0.526 * 128 + 0.158 * float(plan.rollouts.sum()))


def test_the_cost_fit_reads_the_slope_under_a_rising_load():
    """Sampling seconds a + b * N + drift * step: the load rises 8 ms per step (about 2% of a step at m); the
    probes (4x the total) are early, as the planner's are, the later steps at m. The slope from close steps is
    within 20% of b; fitted across the window it reads the drift as a smaller slope (the CPU study's bias)."""
    from pods_rl.budget.planners.auto import theil_sen

    a, b, drift = 0.2, 0.0016, 0.008
    model = RolloutCostModel(window=64)
    totals, seconds = [], []
    for step in range(64):
        N = 512 if step in (3, 6) else 128
        totals.append(N)
        seconds.append(a + b * N + drift * step)
        model.observe(sampled=N, sample_seconds=seconds[-1], trained=128, update_seconds=0.4)
    estimate = model.estimate()
    assert estimate.slope_known and estimate.per_sampled == pytest.approx(b, rel=0.2)
    across, _ = theil_sen(np.array(totals, dtype=float), np.array(seconds))
    assert abs(across - b) > 0.2 * b, across  # the old fit: drift read as slope


def test_the_cost_model_sets_slow_steps_aside():
    model = RolloutCostModel()
    for step in range(20):
        N = 128 if step % 2 else 512
        seconds = 0.5 + 0.001 * N + (5.0 if step == 7 else 0.0)  # one interruption
        model.observe(sampled=N, sample_seconds=seconds, trained=64, update_seconds=0.64 if step != 3 else 9.0)
    estimate = model.estimate()
    assert estimate.slope_known
    assert estimate.per_sampled == pytest.approx(0.001, rel=1e-6) and estimate.fixed == pytest.approx(0.5, rel=1e-6)
    assert estimate.per_trained == pytest.approx(0.01, rel=1e-6)


def test_its_state_round_trips():
    planner, ledger = planner_after({"a": 1.0, "b": 0.0002, "t": 0.002}, steps=6)
    again = AutoN(AutoSettings(min_n=8, max_n=32, warmup_steps=0))
    again.load_state_dict(planner.state_dict())
    assert again.state_dict() == planner.state_dict()
    ids = torch.arange(16)
    assert torch.equal(again.plan(ids, ledger, n=32, m=8).rollouts, planner.plan(ids, ledger, n=32, m=8).rollouts)


@pytest.mark.parametrize(("knobs", "message"), [
    ({"efficiency": -1.0}, r"^auto efficiency must be a number in \[0.0, 100.0\], got -1.0$"),
    ({"sample_ms": -2.0}, r"^auto sample_ms must be a number in"),
    ({"probe_gap": 0}, r"^auto probe_gap must be an integer >= 1, got 0$"),
    ({"max_n": 4, "min_n": 8}, r"^auto max_n=4 must be >= min_n=8$"),
    ({"fixed_ms": 3.0}, r"^auto fixed_ms is the intercept of a fixed sampling cost: set sample_ms with it$"),
    ({"budget": 3}, r"^planner 'auto' has no setting 'budget'"),
    ({"efficiency_low": "low"}, r"^auto efficiency_low must be a number in \[0.0, 100.0\], got 'low'$"),
    ({"age_half_life": 0.0}, r"^auto age_half_life must be a number in \(0.0, 1000000000.0\], got 0.0$"),
    ({"cost_pair_gap": 0}, r"^auto cost_pair_gap must be an integer >= 1, got 0$"),
])
def test_bad_knobs_are_one_line(knobs, message):
    with pytest.raises(ValueError, match=message):
        make_planner("auto", **knobs)
