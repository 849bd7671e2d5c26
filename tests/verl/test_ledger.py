"""The prompt ledger in the PODS replay buffer (issue #54): every sampled group recorded, keyed by the dataset index
verl stores with each rollout, saved by verl's checkpoint hook and loaded where verl resumes. The planners that plan
from it on verl: test_planners.py."""

from __future__ import annotations

import pytest
import torch
from verl_lane import SAMPLER, keys_by_uid, make_trainer, pods_overrides, put_group

from pods_rl.budget.ledger import LEDGER_FILE, PromptLedger
from pods_rl.engines.verl import replay_buffer as pods_verl

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M = 8, 4
KW = "+trainer.v1.sampler.sampler_kwargs."
LEDGER = (KW + "ledger=true",
          "trainer.checkpoint_callback_class=pods_rl.engines.verl.replay_buffer.PODSCheckpointCallback")
GROUPS = {  # dataset index -> the group's rewards
    11: [0, 1, 1, 0, 0, 1, 0, 0],
    12: [1, 1, 1, 1, 1, 1, 1, 1],
    13: [0, 0, 0, 0, 0, 0, 0, 0],
    14: [0.9, 0.1, 0.2, 0.8, 0.7, 0.6],  # ragged: two sessions failed
}


def _put_all(step=0):
    return [put_group(rewards, dataset_index=index, global_steps=step, sessions=range(len(rewards)))
            for index, rewards in GROUPS.items()]


def _table(stats):
    return {name: getattr(stats, name).tolist() for name in ("rollouts", "successes", "groups", "last_step",
                                                             "all_success_streak", "no_success_streak")}


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_every_sampled_group_is_recorded_by_its_dataset_index(tq_store, mode):
    trainer = make_trainer(*pods_overrides(M, N, *LEDGER), mode=mode)
    buffer = trainer.replay_buffer
    _put_all()
    batch, metrics = buffer.sample(global_steps=5, partition_id="train", batch_size=len(GROUPS))
    assert sorted(len(s) for s in keys_by_uid(batch.keys).values()) == [M] * 4  # selection unchanged
    stats = buffer.ledger.stats(torch.tensor(list(GROUPS)))
    assert _table(stats) == {  # all sessions of every group, before selection; success: reward > 0.5
        "rollouts": [8, 8, 8, 6], "successes": [3, 8, 0, 4], "groups": [1, 1, 1, 1], "last_step": [5, 5, 5, 5],
        "all_success_streak": [0, 1, 0, 0], "no_success_streak": [0, 0, 1, 0]}
    assert stats.reward_sum.tolist() == pytest.approx([float(sum(r)) for r in GROUPS.values()])
    assert metrics["pods/ledger_groups_recorded"] == 4
    assert metrics["pods/ledger_frac_all_success"] == metrics["pods/ledger_frac_no_success"] == 0.25
    _put_all()  # the same prompts again (new uids, as verl gives every dispatch): their rows grow
    buffer.sample(global_steps=6, partition_id="train", batch_size=len(GROUPS))
    again = buffer.ledger.stats(torch.tensor(list(GROUPS)))
    assert again.groups.tolist() == [2] * 4 and again.all_success_streak.tolist() == [0, 2, 0, 0]
    assert len(buffer.ledger) == 4


def test_validation_and_a_buffer_without_the_ledger_record_nothing(tq_store):
    trainer = make_trainer(*pods_overrides(M, N, *LEDGER))
    put_group(GROUPS[11], dataset_index=11, partition="val")
    trainer.replay_buffer.sample(global_steps=1, partition_id="val", batch_size=1)
    assert len(trainer.replay_buffer.ledger) == 0
    plain = make_trainer(*pods_overrides(M, N))
    assert plain.replay_buffer.ledger is None
    put_group(GROUPS[11])  # no index stored: nothing is read for a ledger that does not exist
    _, metrics = plain.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert not any(key.startswith("pods/ledger_") for key in metrics)


def test_the_kept_old_paths_build_the_same_buffer_and_checkpoint_hook(tq_store):
    """What users typed before pods_rl.engines (``pkg://pods_rl.integrations.verl``, ``pods_rl.integrations.verl.
    PODSCheckpointCallback``; kept by pods_rl.kept_paths) still builds PODS's buffer and hook, through verl itself."""
    path_key = SAMPLER[0].split("=")[0]
    old = [f"{path_key}=pkg://pods_rl.integrations.verl" if override.startswith(path_key + "=") else override
           for override in pods_overrides(M, N, KW + "ledger=true")]
    old.append("trainer.checkpoint_callback_class=pods_rl.integrations.verl.PODSCheckpointCallback")
    assert f"{path_key}=pkg://pods_rl.integrations.verl" in old
    trainer = make_trainer(*old)
    assert type(trainer.replay_buffer) is pods_verl.PODSReplayBuffer and trainer.replay_buffer.ledger is not None
    assert type(trainer.checkpoint_callback) is pods_verl.PODSCheckpointCallback


def test_rollouts_without_a_dataset_index_are_refused_in_one_line(tq_store):
    trainer = make_trainer(*pods_overrides(M, N, *LEDGER))
    for rewards in list(GROUPS.values())[:2]:
        put_group(rewards, dataset_index=0)
    with pytest.raises(ValueError) as excinfo:
        trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    message = str(excinfo.value)
    assert "\n" not in message and "extra_info.index" in message and "index 0" in message
    put_group(GROUPS[11])  # a rollout stored without any index (a dataset of another kind)
    with pytest.raises(ValueError) as excinfo:
        trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert "\n" not in str(excinfo.value) and "the `index` field" in str(excinfo.value)


def test_verls_checkpoint_hook_saves_the_ledger_and_a_resumed_buffer_loads_it(tq_store, tmp_path):
    run_dir = tmp_path / "ckpt"
    trainer = make_trainer(*pods_overrides(M, N, *LEDGER), f"trainer.default_local_dir={run_dir}")
    assert isinstance(trainer.checkpoint_callback, pods_verl.PODSCheckpointCallback)  # built by verl from the config
    _put_all()
    trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=len(GROUPS))
    folder = run_dir / "global_step_2"
    folder.mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("2")  # verl writes it before calling the hook
    trainer.checkpoint_callback.on_save(trainer=trainer, global_step=2, checkpoint_dir=str(folder), async_save=False)
    saved = PromptLedger.load(folder / LEDGER_FILE)
    expected = _table(trainer.replay_buffer.ledger.stats(torch.tensor(list(GROUPS))))
    assert _table(saved.stats(torch.tensor(list(GROUPS)))) == expected

    for resume in ([], ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}"]):
        resumed = make_trainer(*pods_overrides(M, N, *LEDGER), f"trainer.default_local_dir={run_dir}", *resume)
        put_group(GROUPS[12], dataset_index=12)
        # verl's fit() resumes at global_step_2 and samples step 3 first; the ledger of step 2 comes back, then grows
        resumed.replay_buffer.sample(global_steps=3, partition_id="train", batch_size=1)
        stats = resumed.replay_buffer.ledger.stats(torch.tensor(list(GROUPS)))
        assert stats.groups.tolist() == [1, 2, 1, 1] and stats.all_success_streak.tolist() == [0, 2, 0, 0]

    fresh = make_trainer(*pods_overrides(M, N, *LEDGER), f"trainer.default_local_dir={run_dir}")
    put_group(GROUPS[12], dataset_index=12)
    fresh.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=1)  # step 1: a fresh run
    assert len(fresh.replay_buffer.ledger) == 1


@pytest.mark.parametrize("key, phrases", [
    ("ledger=3", ["sampler_kwargs.ledger must be true or false"]),
    ("ledger_success_threshold=nan", ["sampler_kwargs.ledger_success_threshold must be a finite number"]),
])
def test_bad_ledger_settings_are_refused_by_name(key, phrases):
    with pytest.raises(ValueError) as excinfo:
        make_trainer(*pods_overrides(M, N, KW + key))
    message = str(excinfo.value)
    assert "\n" not in message and all(phrase in message for phrase in phrases), message


def test_verls_prompt_dispatch_and_rollout_counts_are_where_the_guide_says():
    """What the planners on verl rest on, in the installed verl: the trainer draws prompts, registers them and hands
    them to the agent loop manager (PODS's plans there), the buffer's refill_fn fetches more; the agent loop reads a
    per-prompt n from the row; the trainer's arithmetic uses rollout.n; the TaskRunner loads the manager by name."""
    import inspect

    from verl.trainer.ppo.v1 import agent_loop_tq, trainer_base

    trainer = inspect.getsource(trainer_base.PPOTrainer)
    assert ("batch = self._next_train_batch()" in trainer
        and "self.agent_loop_manager.generate_sequences(batch)" in trainer)
    assert "refill_fn=self._add_prompts_to_generate" in trainer
    assert 'prompt.pop("__rollout_n__"' in inspect.getsource(agent_loop_tq.AgentLoopWorkerTQ._run_prompt)
    assert "num_repeat=self.config.actor_rollout_ref.rollout.n" in inspect.getsource(
        trainer_base.PPOTrainer._compute_advantage)
    assert "field.update(kwargs)" in inspect.getsource(agent_loop_tq.AgentLoopWorkerTQ._agent_loop_postprocess)
    assert "self.checkpoint_callback.on_save(" in inspect.getsource(trainer_base.PPOTrainer._save_checkpoint)
    from verl.trainer import main_ppo

    runner = inspect.getsource(main_ppo)
    assert 'get("agent_loop_manager_class")' in runner
    assert runner.index("self.trainer = trainer_cls(config=config)") < runner.index("self.init_agent_loop_manager()")
