"""verl's own `PPOTrainer._compute_advantage` on the batch the PODS buffer returns: the advantages are computed over
the kept rows only (PODS), equal `pods_rl.group_advantages` of the kept rewards (GRPO; RLOO up to its m/(m-1)
factor), and GAE sees exactly the kept rows as its batch. Each test also shows the numbers would differ had
advantages been computed over all n rollouts (the "zero the dropped weights afterwards" approach)."""

from __future__ import annotations

import pytest
import torch
from verl_lane import keys_by_uid, make_trainer, pods_overrides, put_group

import pods_rl

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M = 8, 4
REWARDS = [[0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6], [0, 1, 1, 0, 0, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0],
           [2.0, -1.0, 0.5, 0.5, 3.0, 0.0, 1.5, -0.5]]


def _advantages(trainer, batch) -> dict[str, float]:
    """Run verl's `_compute_advantage` on the sampled batch and read each key's advantage back from TransferQueue
    (the value on its last response token; outcome advantages are constant over the response)."""
    import transfer_queue as tq

    trainer.global_steps = 0
    trainer._compute_advantage(batch, metrics={})
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages"])
    return {key: row[-1].item() for key, row in zip(batch.keys, data["advantages"].unbind(0))}


def _write_groups(outputs=1):
    uids = [put_group(rewards, outputs=outputs if i == 0 else 1) for i, rewards in enumerate(REWARDS)]
    return dict(zip(uids, REWARDS))


def _per_session(advantages: dict[str, float], uid: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in advantages.items():
        key_uid, session, _ = key.rsplit("_", 2)
        if key_uid == uid:
            assert out.setdefault(int(session), value) == pytest.approx(value)  # one value per session
    return out


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_advantages_on_the_kept_rows(tq_store, estimator):
    trainer = make_trainer(*pods_overrides(M, N, estimator=estimator))
    groups = _write_groups(outputs=2 if estimator == "grpo" else 1)  # GRPO: a multi-output session group too
    batch, _ = trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=len(groups))
    advantages = _advantages(trainer, batch)
    kept = keys_by_uid(batch.keys)
    assert len(kept) == len(groups)
    for uid, rewards in groups.items():
        expected_kept = pods_rl.downsample(torch.tensor(rewards, dtype=torch.float64), M).tolist()
        assert kept[uid] == expected_kept
        kept_rewards = torch.tensor([rewards[i] for i in expected_kept])
        if estimator == "grpo":  # verl: (r - mean) / (unbiased std + 1e-6)
            expected = pods_rl.group_advantages(kept_rewards, eps=1e-6)
        else:  # RLOO: r - mean of the others = m / (m - 1) * (r - mean)
            expected = pods_rl.group_advantages(kept_rewards, scale="none") * M / (M - 1)
        got = _per_session(advantages, uid)
        assert list(got) == expected_kept
        torch.testing.assert_close(torch.tensor(list(got.values())), expected, rtol=1e-5, atol=1e-5)
        # Advantages over all n, restricted to the kept rows afterwards, are different numbers.
        all_n = pods_rl.group_advantages(torch.tensor(rewards), eps=1e-6, scale="group" if estimator == "grpo"
                                         else "none")[expected_kept]
        if estimator == "rloo":
            all_n = all_n * N / (N - 1)
        assert not torch.allclose(all_n, expected, atol=1e-3), (uid, all_n, expected)


def test_gae_sees_exactly_the_kept_rows(tq_store):
    """PPO (GAE, with a critic): the batch GAE whitens over is the kept rows; the critic's values are written for
    those rows only, as `_compute_values` would after sampling."""
    import transfer_queue as tq
    from verl.trainer.ppo import core_algos
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    trainer = make_trainer(*pods_overrides(M, N, estimator="gae"))
    assert trainer.use_critic
    groups = _write_groups()
    batch, _ = trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=len(groups))
    kept = keys_by_uid(batch.keys)
    for uid, rewards in groups.items():
        assert kept[uid] == pods_rl.downsample(torch.tensor(rewards, dtype=torch.float64), M).tolist()

    def values_for(length, salt):
        return 0.05 * torch.arange(length, dtype=torch.float32) + 0.01 * salt

    lengths = {key: tag["response_len"] for key, tag in zip(batch.keys, batch.tags)}
    tq.kv_batch_put(keys=batch.keys, partition_id="train",
                    fields=list_of_dict_to_tensordict([{"values": values_for(lengths[k], i)}
                                                       for i, k in enumerate(batch.keys)]))
    got = _advantages(trainer, batch)

    def gae(rows):  # rows: (key, reward, response length, salt)
        width = max(length for _, _, length, _ in rows)
        rewards = torch.zeros(len(rows), width)
        values = torch.zeros(len(rows), width)
        mask = torch.zeros(len(rows), width)
        for i, (_, reward, length, salt) in enumerate(rows):
            rewards[i, length - 1] = reward
            values[i, :length] = values_for(length, salt)
            mask[i, :length] = 1
        advantages, _ = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
        return {key: advantages[i, length - 1].item() for i, (key, _, length, _) in enumerate(rows)}

    reward_of = {f"{uid}_{s}_0": r for uid, rewards in groups.items() for s, r in enumerate(rewards)}
    kept_rows = [(key, reward_of[key], lengths[key], i) for i, key in enumerate(batch.keys)]
    expected = gae(kept_rows)
    assert set(got) == set(expected)
    torch.testing.assert_close(torch.tensor([got[k] for k in expected]), torch.tensor(list(expected.values())),
                               rtol=1e-5, atol=1e-5)
    # Whitening over all n rollouts would give the kept rows other advantages.
    all_rows = kept_rows + [(key, reward, 4 + int(key.rsplit("_", 2)[1]), 99) for key, reward in reward_of.items()
                            if key not in lengths]
    over_all = gae(all_rows)
    assert not torch.allclose(torch.tensor([over_all[k] for k in expected]), torch.tensor(list(expected.values())),
                              atol=1e-3)
