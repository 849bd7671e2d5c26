"""pods_rl.selection: the one selection step (TRL trainer and verl buffer), checked by hand on small groups."""

from __future__ import annotations

import pytest
import torch

import pods_rl
from pods_rl.downsample import downsample
from pods_rl.selection import (
    SelectionSettings,
    all_equal,
    kept_groups,
    reward_totals,
    sampled_prompts,
    select,
)

nan = float("nan")


def settings(m=2, **kwargs):
    return SelectionSettings.validated(m, **kwargs)


def test_keeps_m_per_prompt_with_the_rule_then_the_most_varied_groups():
    rewards = torch.tensor([[0., 0., 0., 0.], [0., 1., 1., 1.], [0., 0., 1., .5]])  # (P=3, n=4)
    selection = select(rewards.unsqueeze(2), torch.ones(1), 2, settings(m=2))
    assert selection.kept.tolist() == downsample(rewards, 2, "max_variance").tolist()
    # Kept variances: group 0 all equal (last), groups 1 and 2 keep {0, 1}: both 0.25; ties by prompt order.
    assert selection.groups.tolist() == [1, 2]
    assert selection.kept_rows == ([4 + j for j in selection.kept[1].tolist()]
                                   + [8 + j for j in selection.kept[2].tolist()])
    metrics = selection.metrics
    assert metrics["pods/prompts_sampled"] == 3 and metrics["pods/groups_zero_std"] == 1
    assert metrics["pods/groups_zero_std_kept"] == 0 and metrics["pods/kept_groups_var_mean"] == pytest.approx(0.25)
    assert metrics["pods/reward_all_mean"] == pytest.approx(rewards.mean().item())
    assert metrics["pods/reward_all_std"] == pytest.approx(rewards.std().item())
    assert metrics["pods/reward_kept_mean"] == pytest.approx(0.5)
    assert metrics["pods/reward_kept_std"] == pytest.approx(torch.tensor([0., 1., 0., 1.]).std().item())
    assert metrics["pods/frac_zero_std_all"] == pytest.approx(1 / 3) and metrics["pods/frac_zero_std_kept"] == 0


def test_weighted_total_and_unscored_rollouts():
    rewards_per_func = torch.tensor([[[1., 0.], [nan, nan], [0., 1.], [1., 1.]]])  # (1, 4, F=2)
    weights = torch.tensor([2., 1.])
    totals = reward_totals(rewards_per_func, weights)  # (1, 4)
    assert torch.equal(torch.isnan(totals), torch.tensor([[False, True, False, False]]))
    assert totals[0, [0, 2, 3]].tolist() == [2., 1., 3.]
    # max_reward keeps the two highest; the unscored one ranks as the group's average (2), below 3 and tied with 2.
    selection = select(rewards_per_func, weights, 1, settings(m=2, rule="max_reward"))
    assert selection.kept.tolist() == [[0, 3]]


def test_ragged_groups_keep_all_they_have_below_m():
    rewards = torch.tensor([[1., 0., 1., 0.], [1., 0., 5., 5.], [1., nan, nan, nan]])  # counts 4, 2, 1: 5 = padding
    selection = select(rewards.unsqueeze(2), torch.ones(1), 3, settings(m=3), counts=torch.tensor([4, 2, 1]))
    assert selection.kept[1].tolist() == [0, 1, -1] and selection.kept[2].tolist() == [0, -1, -1]
    assert sorted(selection.kept_rows) == sorted([*(selection.kept[0].tolist()), 4, 5, 8])
    assert selection.metrics["pods/reward_all_mean"] == pytest.approx(4 / 7)


def test_normalize_then_sum_ranks_each_function_by_its_weight_not_its_scale():
    # Function 0 in [0, 100], function 1 in [0, 1] with weight 2: after standardizing, function 1 decides.
    rewards_per_func = torch.tensor([[[100., 0.], [0., 1.], [50., 1.], [60., 0.]]])
    weights = torch.tensor([1., 2.])
    summed = select(rewards_per_func, weights, 1, settings(m=2, rule="max_reward"))
    normalized = select(rewards_per_func, weights, 1, settings(m=2, rule="max_reward"),
                        aggregation="normalize_then_sum")
    assert summed.kept.tolist() == [[0, 3]] and normalized.kept.tolist() == [[1, 2]]


def test_tiebreak_reads_lengths_and_gather_makes_metrics_global():
    rewards = torch.tensor([[1., 1., 0., 0.]])
    lengths = torch.tensor([[9, 3, 7, 5]])
    shorter = select(rewards.unsqueeze(2), torch.ones(1), 1, settings(m=2, tiebreak="shorter"),
                     features={"lengths": lengths})
    assert shorter.kept.tolist() == [[1, 3]]
    with pytest.raises(ValueError, match="lengths"):
        select(rewards.unsqueeze(2), torch.ones(1), 1, settings(m=2, tiebreak="shorter"))
    two_processes = select(rewards.unsqueeze(2), torch.ones(1), 1, settings(m=2), gather=lambda t: torch.cat([t, t]))
    assert two_processes.metrics["pods/prompts_sampled"] == 2


def test_settings_are_checked_once_with_the_callers_names():
    with pytest.raises(ValueError, match=r"^downsample_to \(m\) must be an integer >= 2"):
        SelectionSettings.validated(1, names={"m": "downsample_to (m)"})
    with pytest.raises(ValueError, match="sampler_kwargs.tiebreak must be one of"):
        SelectionSettings.validated(2, tiebreak="short", names={"tiebreak": "sampler_kwargs.tiebreak"})
    with pytest.raises(ValueError, match="oversample_prompts must be a number >= 1"):
        SelectionSettings.validated(2, oversample_prompts=0.5)
    with pytest.raises(ValueError, match="unknown down-sampling rule 'nope'"):
        SelectionSettings.validated(2, rule="nope")
    assert SelectionSettings.validated(2, rule="registered_elsewhere", rule_registered_here=False).rule


def test_a_rule_is_recognised_by_its_function_not_its_name(scratch_registry):
    """A user's own function registered as `max_variance` takes no features, so it cannot use a tiebreak: refused
    when the settings are checked (it used to pass the config by its name and fail at the first step)."""
    from pods_rl.downsample import _RULES

    builtin = _RULES["max_variance"]
    pods_rl.register_rule("max_variance", lambda rewards, m, generator: rewards.argsort(1)[:, :m], overwrite=True)
    with pytest.raises(ValueError, match="needs a rule that sees the rollouts"):
        SelectionSettings.validated(2, rule="max_variance", tiebreak="shorter")
    pods_rl.register_rule("my_variance", builtin)  # the built-in function under another name
    assert SelectionSettings.validated(2, rule="my_variance", tiebreak="shorter").rule == "my_variance"


def test_all_equal_is_exact_and_ignores_unscored():
    rewards = torch.tensor([[0.8] * 16, [0.8] * 15 + [0.8000001], [1.3, nan, 1.3, 1.3] * 4, [nan] * 16])
    assert all_equal(rewards).tolist() == [True, False, True, True]


@pytest.mark.parametrize("oversample", [1.0, 1.5, 2.0, 3.3])
def test_sampled_and_kept_groups_invert(oversample):
    for kept in range(1, 40):
        assert kept_groups(sampled_prompts(kept, oversample), oversample) == kept


def test_per_group_tensors_travel_in_one_collective_and_come_back_by_name():
    """gather_per_group: one gather call; names, dtypes and shapes as they went; the other process's rows after
    this one's (a fake 2-process gather that appends a second process's copy, shifted)."""
    from pods_rl.selection import gather_per_group

    calls = []

    def two_processes(table):
        calls.append(table.shape)
        return torch.cat([table, table + 1])

    tensors = {"totals": torch.tensor([[0.5, float("nan")], [1.0, 2.0]]), "kept": torch.tensor([[True, False]] * 2),
               "variance": torch.tensor([0.25, 0.0], dtype=torch.float64), "count": torch.tensor([3, 4])}
    got = gather_per_group(tensors, two_processes)
    assert calls == [(2, 6)]
    assert {k: (v.dtype, tuple(v.shape)) for k, v in got.items()} == {
        "totals": (torch.float32, (4, 2)), "kept": (torch.bool, (4, 2)), "variance": (torch.float64, (4,)),
        "count": (torch.int64, (4,))}
    assert torch.equal(got["count"], torch.tensor([3, 4, 4, 5]))
    assert torch.equal(got["kept"], torch.tensor([[True, False], [True, False], [True, True], [True, True]]))
    torch.testing.assert_close(got["totals"][2:], tensors["totals"] + 1, equal_nan=True)
