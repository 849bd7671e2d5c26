"""``pods_rl.rollouts.rollout_features``: what a rule or tiebreak sees besides the rewards, built from plain
per-rollout lists for both trainers (issue #51 item 5: one ``rollout_features`` for the synchronous and
asynchronous paths). The asynchronous worker's use of it is checked in tests/test_async_contract.py; the last test
checks that the synchronous step's ``_rollout_features`` gives the same tensors on the same rollouts."""

from __future__ import annotations

import types

import pytest
import torch

import pods_rl
from pods_rl.rollouts import rollout_features, tool_turns

IDS = [[5, 6, 2], [5, 6, 6, 6], [], [7, 0], [8], [9, 9, 7]]  # 2 prompts x 3 rollouts; 2, 7: eos; 0: pad
MASK = [[1, 1, 1], [1, 0, 0, 1], [], [1, 1], [1], [1, 0, 1]]  # 0: a token a tool inserted
REWARDS = torch.arange(12, dtype=torch.float64).view(6, 2)  # (N, F)


def test_lengths_alone_without_rewards_per_func():
    assert rollout_features(IDS, 2).keys() == {"lengths"}
    assert rollout_features(IDS, 2)["lengths"].tolist() == [[3, 4, 0], [2, 1, 3]]
    assert rollout_features(IDS, 2, tool_mask=MASK)["lengths"].tolist() == [[3, 2, 0], [2, 1, 2]]  # model's only
    assert rollout_features(IDS, 6)["lengths"].shape == (6, 1)
    assert rollout_features(IDS, 2)["lengths"].dtype == torch.long


def test_every_feature_with_rewards_per_func():
    features = rollout_features(IDS, 2, stop_ids={2, 7, 0}, tool_mask=MASK, rewards_per_func=REWARDS)
    assert features.keys() == {"lengths", "rewards_per_func", "truncated", "tool_calls", "turns"}
    assert torch.equal(features["rewards_per_func"], REWARDS.view(2, 3, 2))
    assert features["truncated"].tolist() == [[False, True, False], [False, True, False]]  # empty: not truncated
    calls, turns = tool_turns(MASK, 6)
    assert features["tool_calls"].tolist() == [calls[:3], calls[3:]] == [[0, 1, 0], [0, 0, 1]]
    assert features["turns"].tolist() == [turns[:3], turns[3:]] == [[1, 2, 1], [1, 1, 2]]
    assert {key: value.dtype for key, value in features.items()} == {
        "lengths": torch.long, "rewards_per_func": torch.float64, "truncated": torch.bool,
        "tool_calls": torch.long, "turns": torch.long}


def test_counts_given_by_the_caller_and_no_tools():
    features = rollout_features(IDS, 1, stop_ids=[2], tool_calls=[0, 3, 0, 1, 0, 0], turns=[1, 4, 1, 2, 1, 1],
                                rewards_per_func=REWARDS.view(1, 6, 2))
    assert (features["tool_calls"].tolist() == [[0, 3, 0, 1, 0, 0]]
        and features["turns"].tolist() == [[1, 4, 1, 2, 1, 1]])
    assert features["truncated"].tolist() == [[False, True, False, True, True, True]]  # 7 is no stop id here
    plain = rollout_features(IDS, 1, rewards_per_func=REWARDS)
    assert plain["tool_calls"].tolist() == [[0] * 6] and plain["turns"].tolist() == [[1] * 6]


def test_rollouts_that_do_not_split_into_prompts_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^6 rollouts do not split into 4 prompts of equal size\.$"):
        rollout_features(IDS, 4)
    with pytest.raises(ValueError, match="into 0 prompts"):
        rollout_features(IDS, 0)


def _longest(rewards, m, generator, *, features):
    return features["lengths"].argsort(dim=1, descending=True, stable=True)[:, :m]


@pytest.mark.parametrize("rule, tiebreak", [("test_rollouts_longest", "index"), ("max_variance", "shorter"),
                                            ("max_variance", "index")])
@pytest.mark.parametrize("tool_mask", [MASK, None])
def test_the_synchronous_steps_features_are_these(scratch_registry, rule, tiebreak, tool_mask):
    """``PODSStep._rollout_features`` (TRL's ``_generate`` tuple in; as stop ids the pad id and TRL >= 1.15's
    ``eos_token_ids``, earlier TRLs' tokenizer EOS) gives what ``rollout_features`` gives on the same lists: the two
    trainers' rules see the same."""
    from pods_rl.engines.trl.adapter import TRL_KEEPS_EOS_TOKEN_IDS
    from pods_rl.engines.trl.step import Generated, PODSStep
    from pods_rl.selection import SelectionSettings

    pods_rl.register_rule("test_rollouts_longest", _longest, overwrite=True)
    step = types.SimpleNamespace(
        args=types.SimpleNamespace(selection_settings=SelectionSettings.validated(2, rule, tiebreak)),
        eos_token_ids=[2, 7], _tokenizer=types.SimpleNamespace(eos_token_id=2, pad_token_id=0))
    generated = Generated(prompt_ids=[[1]] * 6, completion_ids=IDS, tool_mask=tool_mask, completions=[""] * 6,
                          logprobs=None, extra_fields=None, images=None, tool_images=None)
    theirs = PODSStep._rollout_features(step, tuple(generated), REWARDS, 2, 3)
    takes_features = rule != "max_variance"
    if tiebreak == "index" and not takes_features:
        assert theirs is None  # the step skips features nothing reads
        return
    stop_ids = {2, 7, 0} if TRL_KEEPS_EOS_TOKEN_IDS else {2, 0}
    ours = rollout_features(IDS, 2, stop_ids=stop_ids, tool_mask=tool_mask,
                            rewards_per_func=REWARDS if takes_features else None)
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[key], ours[key]) for key in ours)
