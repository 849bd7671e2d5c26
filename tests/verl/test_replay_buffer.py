"""The PODS replay buffer inside verl: loaded by verl's own `_build_replay_buffer` from a config, sampling real
rollout records from a real TransferQueue on a real local Ray cluster.

Every expected kept set is computed independently with `pods_rl.downsample` on the rewards the test wrote, so a
buffer that kept other rows, left dropped rows in TransferQueue or touched `val` fails here.
"""

from __future__ import annotations

import pytest
import torch
from verl_lane import keys_by_uid, make_trainer, pods_overrides, put_group, stored_keys

import pods_rl
from pods_rl.downsample import rule_takes_features
from pods_rl.engines.verl.replay_buffer import PODSReplayBuffer, PODSReplayBufferAsync

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M = 8, 4
REWARDS = [  # (B, n): binary, few-valued, all-equal and continuous groups
    [0, 1, 1, 0, 0, 1, 0, 0],
    [1, 1, 1, 1, 1, 1, 1, 0],
    [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
    [0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6],
]


def _sample(trainer, batch_size, partition="train"):
    return trainer.replay_buffer.sample(global_steps=0, partition_id=partition, batch_size=batch_size)


def _expected(rewards, m=M, **kwargs):
    kept = pods_rl.downsample(torch.tensor(rewards, dtype=torch.float64), m, **kwargs)
    return [row.tolist() for row in kept]


@pytest.mark.parametrize("mode, cls", [("sync", PODSReplayBuffer), ("colocate_async", PODSReplayBufferAsync)])
def test_verl_builds_the_pods_buffer_from_its_config(mode, cls):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    trainer = make_trainer(*pods_overrides(M, N, "+trainer.v1.sampler.sampler_kwargs.rule=max_reward",
                                           "+trainer.v1.sampler.sampler_kwargs.tiebreak=shorter"), mode=mode)
    buffer = trainer.replay_buffer
    assert type(buffer) is cls
    assert isinstance(buffer, ReplayBufferAsync) == (mode != "sync")
    assert (buffer.pods.m, buffer.pods.rule, buffer.pods.tiebreak, buffer.pods.n) == (M, "max_reward", "shorter", N)
    assert buffer.pods.response_length == trainer.config.actor_rollout_ref.rollout.response_length


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
@pytest.mark.parametrize("rule", ["max_variance", "max_reward", "random"])
def test_keeps_exactly_what_the_rule_keeps_and_clears_the_rest(tq_store, mode, rule):
    trainer = make_trainer(*pods_overrides(M, N, f"+trainer.v1.sampler.sampler_kwargs.rule={rule}",
                                           "+trainer.v1.sampler.sampler_kwargs.seed=7"), mode=mode)
    uids = [put_group(rewards) for rewards in REWARDS]
    before = stored_keys()
    batch, metrics = _sample(trainer, batch_size=len(uids))

    kept = keys_by_uid(batch.keys)
    order = list(kept)  # groups in the order the buffer saw them (the random rule draws in that order)
    assert sorted(order) == sorted(uids)
    rewards = [REWARDS[uids.index(uid)] for uid in order]
    expected = _expected(rewards, rule=rule, generator=torch.Generator().manual_seed(7))
    assert [kept[uid] for uid in order] == expected
    assert all(len(sessions) == M for sessions in kept.values())

    # Dropped rollouts are gone from TransferQueue, kept ones are still there, prompt statuses cleared as verl does.
    after = stored_keys()
    assert after == set(batch.keys)
    dropped = {key for key in before if key not in batch.keys and key not in uids}
    assert len(dropped) == len(uids) * (N - M)
    assert not dropped & after

    all_rewards = torch.tensor(REWARDS, dtype=torch.float64)
    trained = torch.tensor([[row[i] for i in keep] for row, keep in zip(rewards, expected)], dtype=torch.float64)
    assert metrics["pods/reward_all_mean"] == pytest.approx(all_rewards.mean().item())
    assert metrics["pods/reward_all_std"] == pytest.approx(all_rewards.std().item())
    assert metrics["pods/reward_kept_mean"] == pytest.approx(trained.mean().item())
    assert metrics["pods/reward_kept_std"] == pytest.approx(trained.std().item())
    assert metrics["pods/frac_zero_std_all"] == pytest.approx(1 / 4)  # the all-0.5 group
    zero_kept = sum(len(set(row)) == 1 for row in trained.tolist())
    assert metrics["pods/frac_zero_std_kept"] == pytest.approx(zero_kept / 4)
    assert (metrics["pods/prompts_sampled"], metrics["pods/rollouts_sampled"], metrics["pods/rollouts_kept"]) == \
        (4, 4 * N, 4 * M)


@pytest.mark.parametrize("tiebreak", ["shorter", "longer"])
def test_tiebreak_by_response_length(tq_store, tiebreak):
    trainer = make_trainer(*pods_overrides(M, N, f"+trainer.v1.sampler.sampler_kwargs.tiebreak={tiebreak}"))
    rewards = [0, 1, 0, 1, 0, 1, 0, 1]
    lengths = [9, 30, 3, 12, 17, 5, 40, 21]
    uid = put_group(rewards, lengths=lengths)
    batch, _ = _sample(trainer, batch_size=1)
    signed = torch.tensor(lengths) * (1 if tiebreak == "shorter" else -1)
    expected = _expected([rewards], tiebreak=signed.unsqueeze(0))[0]
    assert keys_by_uid(batch.keys)[uid] == expected
    # Against the index order: shorter keeps sessions 2, 0 (0-reward) and 5, 3 (1-reward), not 0, 2, 1, 3.
    assert expected != _expected([rewards])[0]


RULE_FILE = '''
import torch
import pods_rl

@pods_rl.register_rule("complete_then_short", overwrite=True)
def complete_then_short(rewards, m, generator, *, features):
    """Prefer rollouts that finished (not truncated), then the shortest; rewards ignored on purpose."""
    assert set(features) == {"lengths", "truncated"}, set(features)
    assert features["lengths"].shape == rewards.shape and features["truncated"].shape == rewards.shape
    assert features["truncated"].dtype == torch.bool
    score = features["truncated"].long() * 10**6 + features["lengths"]
    return score.argsort(dim=1, stable=True)[:, :m]
'''


def test_registered_rule_sees_lengths_and_truncation(tq_store, tmp_path):
    rule_file = tmp_path / "my_rules.py"
    rule_file.write_text(RULE_FILE)
    trainer = make_trainer(*pods_overrides(M, N, "+trainer.v1.sampler.sampler_kwargs.rule=complete_then_short",
                                           f"+trainer.v1.sampler.sampler_kwargs.rule_module={rule_file}",
                                           "actor_rollout_ref.rollout.response_length=16"))
    lengths = [16, 2, 16, 7, 3, 16, 5, 11]  # 16 = response_length: truncated (sessions 0, 2, 5)
    uids = [put_group([1, 0, 1, 0, 1, 0, 1, 0], lengths=lengths), put_group([0] * 8, lengths=lengths[::-1])]
    batch, _ = _sample(trainer, batch_size=2)
    kept = keys_by_uid(batch.keys)
    assert kept[uids[0]] == [1, 3, 4, 6]  # lengths 2, 7, 3, 5: the four shortest untruncated
    assert kept[uids[1]] == [1, 3, 4, 6]  # reversed lengths 11, 5, 16, 7, 3, 16, 2, 16 -> 5, 7, 3, 2
    assert rule_takes_features("complete_then_short")


def test_ragged_groups_keep_min_m_and_size(tq_store):
    """Failed sessions make groups smaller than n: a group keeps min(m, its size), each size selected on its own."""
    trainer = make_trainer(*pods_overrides(M, N))
    full = put_group(REWARDS[0])
    six = put_group([1, 0, 0, 0, 1, 1], sessions=[0, 1, 3, 4, 6, 7], status="failure")
    three = put_group([1, 0, 1], sessions=[2, 5, 6], status="failure")
    batch, metrics = _sample(trainer, batch_size=3)
    kept = keys_by_uid(batch.keys)
    assert kept[full] == _expected([REWARDS[0]])[0]
    six_kept = _expected([[1, 0, 0, 0, 1, 1]])[0]  # indices into the six sessions present
    assert kept[six] == [[0, 1, 3, 4, 6, 7][i] for i in six_kept]
    assert kept[three] == [2, 5, 6]  # fewer than m: all kept
    assert len(batch.keys) == M + M + 3
    assert stored_keys() == set(batch.keys)
    assert metrics["pods/groups_ragged"] == 2


def test_multi_output_sessions_are_kept_or_dropped_whole(tq_store):
    trainer = make_trainer(*pods_overrides(M, N))
    uid = put_group(REWARDS[3], outputs=3)
    batch, _ = _sample(trainer, batch_size=1)
    kept = keys_by_uid(batch.keys)[uid]
    assert kept == _expected([REWARDS[3]])[0]
    assert sorted(batch.keys) == sorted(f"{uid}_{s}_{i}" for s in kept for i in range(3))
    assert stored_keys() == set(batch.keys)


def test_oversampling_keeps_the_most_informative_groups(tq_store):
    """oversample_prompts=2: 4 groups sampled, 2 reach the update: those whose kept rewards vary most."""
    trainer = make_trainer(*pods_overrides(M, N, "+trainer.v1.sampler.sampler_kwargs.oversample_prompts=2",
                                           train_batch_size=4))
    rewards = [[0.5] * 8, [0, 0, 0, 0, 0, 0, 0, 1], [0, 1, 0, 1, 0, 1, 0, 1], [0.2, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.6]]
    uids = [put_group(r) for r in rewards]
    batch, metrics = _sample(trainer, batch_size=4)
    kept = keys_by_uid(batch.keys)
    # kept-reward variances: 0 (all 0.5), 3/16 (0,0,0,1), 1/4 (0,0,1,1), 0.02 -> groups 2 and 1
    assert sorted(kept) == sorted([uids[2], uids[1]])
    assert kept[uids[2]] == _expected([rewards[2]])[0] and kept[uids[1]] == _expected([rewards[1]])[0]
    assert stored_keys() == set(batch.keys)  # the two unselected groups are cleared whole
    assert metrics["pods/prompts_sampled"] == 4
    assert metrics["pods/groups_zero_std"] == 1 and metrics["pods/groups_zero_std_kept"] == 0
    assert metrics["pods/kept_groups_var_mean"] == pytest.approx((1 / 4 + 3 / 16) / 2)
    assert metrics["pods/rollouts_kept"] == 2 * M


def test_validation_partition_is_untouched(tq_store):
    import transfer_queue as tq

    trainer = make_trainer(*pods_overrides(M, N))
    uids = [put_group(r, partition="val") for r in REWARDS[:2]]
    trajectories = {k for k in stored_keys("val") if k not in uids}
    before = tq.kv_batch_get(keys=sorted(trajectories), partition_id="val", select_fields=["rm_scores", "responses"])
    batch, metrics = _sample(trainer, batch_size=2, partition="val")
    assert set(batch.keys) == trajectories  # all n of every group
    assert not any(key.startswith("pods/") for key in metrics)
    after = tq.kv_batch_get(keys=sorted(trajectories), partition_id="val", select_fields=["rm_scores", "responses"])
    for name in ("rm_scores", "responses"):
        for a, b in zip(before[name].unbind(0), after[name].unbind(0)):
            assert torch.equal(a, b)
    assert stored_keys("val") == trajectories  # only the prompt statuses cleared, as verl's own buffer does
