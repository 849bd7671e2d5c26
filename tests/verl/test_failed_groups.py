"""Failed rollout groups under the PODS buffer: `trainer.v1.sampler.sync_refill_failed_groups` is honoured as verl's
own buffer honours it, and a step whose every group failed either refills (setting on) or ends in verl's error
asking for that setting, which now does what it says (setting off).

A failed group is what verl's rollout leaves when every session of a prompt failed: the prompt's status
``failure`` in TransferQueue and no trajectory. The trainer's ``refill_fn`` (it submits fresh prompts to the rollout
workers, which need GPUs) is replaced by one that writes the groups those workers would have written."""

from __future__ import annotations

import pytest
import torch
from verl_lane import keys_by_uid, make_trainer, pods_overrides, put_group, stored_keys

import pods_rl

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M = 8, 4
REFILL = "trainer.v1.sampler.sync_refill_failed_groups=True"
FRESH = [[0, 1, 1, 0, 0, 1, 0, 0], [0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6], [1, 0, 0, 0, 0, 0, 0, 1]]


def put_failed_group(partition: str = "train") -> str:
    """A prompt whose every session failed: status ``failure``, no trajectory (as verl's rollout leaves it)."""
    import uuid

    from transfer_queue import kv_put

    uid = str(uuid.uuid4())
    kv_put(key=uid, partition_id=partition, tag={"is_prompt": True, "status": "failure", "global_steps": 0})
    return uid


def fake_rollout(trainer):
    """Stands in for the rollout workers behind ``refill_fn``: each requested prompt comes back as a finished
    group (rewards from FRESH, in turn). Returns the list of counts asked for and the uids written."""
    asked, written = [], []

    def refill(count):
        asked.append(count)
        for _ in range(count):
            written.append(put_group(FRESH[len(written) % len(FRESH)]))

    trainer.replay_buffer.refill_fn = refill
    return asked, written


def test_the_setting_reaches_the_pods_buffer_in_sync_mode():
    buffer = make_trainer(*pods_overrides(M, N, REFILL)).replay_buffer
    assert buffer.sync_refill_failed_groups is True and buffer.gen_batch_size == 1
    assert make_trainer(*pods_overrides(M, N)).replay_buffer.sync_refill_failed_groups is False


@pytest.mark.parametrize("failed", [1, 3])
def test_every_group_failed_with_refill_on_trains_on_fresh_groups(tq_store, failed):
    trainer = make_trainer(*pods_overrides(M, N, REFILL, "+trainer.v1.sampler.sampler_kwargs.rule=max_reward"))
    asked, written = fake_rollout(trainer)
    failed_uids = [put_failed_group() for _ in range(failed)]

    batch, metrics = trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=failed)

    assert asked == [failed]  # one fresh prompt per failed group, asked once
    assert metrics["training/rollout_failure/evicted_samples"] == failed
    kept = keys_by_uid(batch.keys)
    assert set(kept) == set(written)  # the step trains on the fresh groups, down-sampled by PODS
    for i, uid in enumerate(written):
        expected = pods_rl.downsample(torch.tensor([FRESH[i % len(FRESH)]], dtype=torch.float64), M, "max_reward")
        assert kept[uid] == sorted(expected[0].tolist())
    assert metrics["pods/rollouts_kept"] == failed * M
    assert not set(failed_uids) & stored_keys()  # the failed prompts were cleared from TransferQueue


def test_some_groups_failed_with_refill_on_replaces_only_those(tq_store):
    trainer = make_trainer(*pods_overrides(M, N, REFILL))
    asked, written = fake_rollout(trainer)
    good = put_group([0, 1, 0, 1, 0, 0, 0, 1])
    put_failed_group()

    batch, _ = trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=2)
    assert asked == [1]
    assert set(keys_by_uid(batch.keys)) == {good, *written}
    assert all(len(sessions) == M for sessions in keys_by_uid(batch.keys).values())


def test_every_group_failed_with_refill_off_names_the_setting_that_now_works(tq_store):
    trainer = make_trainer(*pods_overrides(M, N))
    asked, _ = fake_rollout(trainer)
    put_failed_group()
    put_failed_group()
    with pytest.raises(RuntimeError, match="sync_refill_failed_groups") as excinfo:
        trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=2)
    assert "\n" not in str(excinfo.value)
    assert asked == []  # nothing was refilled: the setting is off


def test_async_mode_replaces_failed_groups_anyway(tq_store):
    trainer = make_trainer(*pods_overrides(M, N), mode="colocate_async")
    asked, written = fake_rollout(trainer)
    put_failed_group()
    batch, _ = trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=1)
    assert asked == [1] and set(keys_by_uid(batch.keys)) == set(written)
