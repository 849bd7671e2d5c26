"""Adaptive rollouts (pods_rl.adaptive): the round rules, ragged down-sampling, and a brute-force simulation
of Bernoulli prompts against the closed form."""

import math

import pytest
import torch

from pods_rl import downsample
from pods_rl.adaptive import (
    available_adaptive_rules,
    downsample_ragged,
    expected_until_mixed,
    group_is_mixed,
    plan_round,
    register_adaptive_rule,
)


def padded(rows, n):
    """(P, n) float rewards padded with NaN after each row, and counts (P,)."""
    rewards = torch.full((len(rows), n), float("nan"))
    for i, row in enumerate(rows):
        rewards[i, : len(row)] = torch.tensor(row, dtype=torch.float)
    return rewards, torch.tensor([len(r) for r in rows])


def test_group_is_mixed_ignores_padding_and_unscored():
    rewards, counts = padded([[0, 0], [0, 1], [1, float("nan"), 1], [0.8] * 4], n=4)
    rewards[0, 2:] = 1.0  # padding holds a different value: must not count
    assert group_is_mixed(rewards, counts).tolist() == [False, True, False, False]


def test_until_mixed_opens_all_equal_and_short_prompts_only():
    rewards, counts = padded([[1, 1, 1, 1], [0, 1, 0, 0], [0, 1], [1] * 16, [0] * 12], n=16)
    more = plan_round(rewards, counts, m=4, n=16, round_size=4)
    # all-equal at 4 -> a round; mixed with >= m -> closed; mixed below m -> a round (reaching m); at n ->
    # closed; all-equal at 12 -> the last 4.
    assert more.tolist() == [4, 0, 4, 0, 4]
    # a round always reaches m
    assert plan_round(rewards, counts, m=4, n=16, round_size=1).tolist() == [1, 0, 2, 0, 1]


def test_round_never_passes_the_cap():
    rewards, counts = padded([[1] * 6], n=8)
    assert plan_round(rewards, counts, m=2, n=8, round_size=4).tolist() == [2]


def test_budgeted_tops_up_then_spends_on_fewest_rollouts_first():
    rewards, counts = padded([[1] * 8, [0, 1, 0, 0], [0] * 4, [1] * 4, [0, 1]], n=16)
    # used 22, mandatory: prompt 4's round -> 26; budget 34 leaves 8: two rounds of 4 for the all-equal
    # prompts with the fewest rollouts (2 and 3, at 4 each), none for prompt 0 (at 8).
    more = plan_round(rewards, counts, m=4, n=16, round_size=4, rule="budgeted", budget=34)
    assert more.tolist() == [0, 0, 4, 4, 4]
    # whole rounds only: 7 left buys one
    assert plan_round(rewards, counts, 4, 16, 4, rule="budgeted", budget=33).tolist() == [0, 0, 4, 0, 4]
    # a budget already spent still tops up what the update needs
    assert plan_round(rewards, counts, m=4, n=16, round_size=4, rule="budgeted", budget=0).tolist() == [0, 0, 0, 0, 4]
    with pytest.raises(ValueError, match="needs a budget"):
        plan_round(rewards, counts, m=4, n=16, round_size=4, rule="budgeted")


def test_registered_rule_is_checked():
    register_adaptive_rule("never_more", lambda rewards, counts, m, n, round_size, budget: torch.zeros_like(counts),
                           overwrite=True)
    assert "never_more" in available_adaptive_rules()
    rewards, counts = padded([[1, 1, 1, 1]], n=8)
    assert plan_round(rewards, counts, 4, 8, 4, rule="never_more").tolist() == [0]
    rewards, counts = padded([[1, 1]], n=8)
    with pytest.raises(ValueError, match="closed a prompt with fewer than m"):
        plan_round(rewards, counts, 4, 8, 4, rule="never_more")
    register_adaptive_rule("too_many", lambda rewards, counts, m, n, round_size, budget: counts * 0 + n,
                           overwrite=True)
    with pytest.raises(ValueError, match="counts \\+ more <= n"):
        plan_round(rewards, counts, 4, 8, 4, rule="too_many")
    with pytest.raises(ValueError, match="fn\\(rewards, counts"):
        register_adaptive_rule("bad", lambda rewards: rewards)
    with pytest.raises(ValueError, match="unknown adaptive rule"):
        plan_round(rewards, counts, 4, 8, 4, rule="nope")


@pytest.mark.parametrize("rule", ["max_variance", "max_reward", "random"])
def test_downsample_ragged_full_counts_equals_downsample(rule):
    rewards = torch.randint(0, 3, (6, 8), generator=torch.Generator().manual_seed(0)).float()
    counts = torch.full((6,), 8)
    a = downsample_ragged(rewards, counts, 3, rule, generator=torch.Generator().manual_seed(1))
    b = downsample(rewards, 3, rule, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_downsample_ragged_keeps_within_each_count():
    rewards, counts = padded([[0, 0, 1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]], n=8)
    kept = downsample_ragged(torch.nan_to_num(rewards, nan=5.0), counts, 4, "max_variance")  # padding would win
    assert bool((kept < counts.unsqueeze(1)).all())
    assert kept[0].tolist() == [0, 1, 2, 3] and kept[1].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="between m=4 and n=8"):
        downsample_ragged(rewards, torch.tensor([6, 2, 8]), 4)


def simulate_until_mixed(pass_rates, m, n, pilot, round_size, seed=0):
    """Brute force: Bernoulli prompts sampled in rounds by plan_round. -> rollouts (P,), mixed at the end (P,)."""
    g = torch.Generator().manual_seed(seed)
    P = len(pass_rates)
    rewards = torch.full((P, n), float("nan"))
    counts = torch.zeros(P, dtype=torch.long)
    more = torch.full((P,), pilot)
    while bool(more.any()):
        draws = (torch.rand((P, n), generator=g) < pass_rates.unsqueeze(1)).float()  # (P, n), used where new
        column = torch.arange(n)
        new = (column >= counts.unsqueeze(1)) & (column < (counts + more).unsqueeze(1))
        rewards = torch.where(new, draws, rewards)
        counts = counts + more
        more = plan_round(rewards, counts, m, n, round_size)
    return counts.double(), group_is_mixed(rewards, counts).double()


@pytest.mark.parametrize("m,n,pilot,round_size", [(4, 16, 4, 4), (16, 64, 16, 16), (4, 16, 2, 7)])
def test_simulation_matches_closed_form(m, n, pilot, round_size):
    # Known pass rates spanning easy, hard and mixed prompts, 4000 copies each.
    rates = torch.tensor([0.02, 0.2, 0.5, 0.8, 0.97]).repeat_interleave(4000)
    rollouts, mixed = simulate_until_mixed(rates, m, n, pilot, round_size)
    for p in rates.unique().tolist():
        rows = rates == p
        expected_rollouts, expected_mixed = expected_until_mixed(p, m, n, pilot, round_size)
        k = int(rows.sum())
        # 5 standard errors of a mean of k draws: a false failure about once in 1.7 million per check. The
        # rollouts past the pilot lie in [0, n - pilot] and are 0 unless the pilot left the prompt open
        # (probability q), so their variance is at most (n - pilot)^2 q: a bound that holds for rare events too.
        q = 1.0 if pilot < m else p**pilot + (1 - p) ** pilot
        se_rollouts = (n - pilot) * math.sqrt(q / k)
        se_mixed = math.sqrt(max(expected_mixed * (1 - expected_mixed), 1e-12) / k)
        assert abs(rollouts[rows].mean().item() - expected_rollouts) <= 5 * se_rollouts + 1e-9, p
        assert abs(mixed[rows].mean().item() - expected_mixed) <= 5 * se_mixed + 1e-9, p
        # never more than n, always at least m
        assert rollouts[rows].max().item() <= n and rollouts[rows].min().item() >= m


def test_closed_form_matches_the_issue_example():
    # Beta(4.4, 0.7) pass rates, rounds of 16 up to 64: the issue's back-of-envelope says ~27.7 rollouts per
    # prompt and PODS 64's informative share (0.86). Average the closed form over 20000 Beta draws (the
    # Monte Carlo error of both means is below 0.2 and 0.003).
    torch.manual_seed(0)
    rates = torch.distributions.Beta(4.4, 0.7).sample((20_000,)).tolist()
    results = [expected_until_mixed(p, 16, 64, 16, 16) for p in rates]
    assert 26.5 < sum(r for r, _ in results) / len(rates) < 29.0
    assert abs(sum(x for _, x in results) / len(rates) - 0.86) < 0.02


def test_budgeted_respects_the_budget_in_simulation():
    g = torch.Generator().manual_seed(3)
    rates = torch.tensor([0.0, 1.0, 0.5, 0.05] * 50)
    P, m, n, r = len(rates), 4, 16, 4
    budget = 8 * P
    rewards = torch.full((P, n), float("nan"))
    counts = torch.zeros(P, dtype=torch.long)
    more = torch.full((P,), 4)
    while bool(more.any()):
        draws = (torch.rand((P, n), generator=g) < rates.unsqueeze(1)).float()
        column = torch.arange(n)
        new = (column >= counts.unsqueeze(1)) & (column < (counts + more).unsqueeze(1))
        rewards = torch.where(new, draws, rewards)
        counts = counts + more
        more = plan_round(rewards, counts, m, n, r, rule="budgeted", budget=budget)
    assert int(counts.sum()) <= budget
    assert int(counts.sum()) > budget - r  # spent all but less than one round
    assert bool((counts >= m).all()) and bool((counts <= n).all())
    # the budget went to prompts that were all-equal: mixed prompts at 4 got nothing more
    assert bool((counts[group_is_mixed(rewards[:, :4], torch.full((P,), 4))] == 4).all())
