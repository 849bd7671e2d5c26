"""`pods verl-args` against verl itself: its overrides compose in verl's Hydra config, pass verl's
`validate_config`, and the kept batch the PODS buffer returns goes through the trainer's real `_balance_batch`
without a single padding row (while a data-parallel size the settings were not made for does get padding)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from verl_lane import make_trainer, put_group, verl_config

from pods_rl.engines.verl.batch_settings import verl_batch_settings
from pods_rl.tiny import make_tokenizer

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

# The micro-batch settings verl's validate_config asks for (they do not change batch composition).
MICRO = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
         "critic.ppo_micro_batch_size_per_gpu=2")


def _balance(trainer, batch, dp):
    """The trainer's own `_balance_batch` with a `dp`-rank actor: the rank mapping is all it asks of the (GPU)
    worker group; the tokenizer gives the padding rows' EOS."""
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(dp))})
    trainer.tokenizer = make_tokenizer()
    trainer.global_steps = 0
    return trainer._balance_batch(batch, metrics={})


@pytest.mark.parametrize("case", [
    dict(prompts=4, n=8, m=4, dp=2, mini_batch=8, critic_mini_batch=16, estimator="gae"),
    dict(prompts=2, n=8, m=4, dp=2, mini_batch=8, oversample_prompts=2, trainer_mode="colocate_async",
         estimator="grpo"),
    dict(prompts=6, n=6, m=2, dp=3, mini_batch=12, rule="max_reward", tiebreak="shorter", estimator="rloo"),
])
def test_verl_args_train_without_padding(tq_store, tiny_model_dir, case):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    case = dict(case)
    estimator, dp = case.pop("estimator"), case["dp"]
    settings = verl_batch_settings(**case)
    # validate_config builds verl's model configs: point them at a tiny Qwen2 built in the session.
    overrides = [*settings.overrides, f"algorithm.adv_estimator={estimator}", f"trainer.n_gpus_per_node={dp}", *MICRO,
                 f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}"]
    config = verl_config(*overrides)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    trainer = make_trainer(*overrides)
    assert trainer.config.data.train_batch_size == settings.train_batch_size
    assert trainer.replay_buffer.pods.m == case["m"]

    n, m = case["n"], case["m"]
    rewards = [[(i * 7 + j * 3) % 5 / 4 for j in range(n)] for i in range(settings.sampled_per_update)]
    for row in rewards:
        put_group(row)
    batch, _ = trainer.replay_buffer.sample(global_steps=0, partition_id="train",
                                            batch_size=settings.sampled_per_update)
    assert len(batch) == settings.kept_rows == case["prompts"] * m
    balanced = _balance(trainer, batch, dp)
    assert len(balanced) == len(batch)
    assert not any(tag.get("is_padding", False) for tag in balanced.tags)
    assert sorted(balanced.keys) == sorted(batch.keys)


def test_balance_batch_pads_when_the_settings_do_not_fit(tq_store):
    """The check above can fail: the same kept batch on 3 ranks (settings made for 2) gets verl's padding rows."""
    settings = verl_batch_settings(prompts=4, n=8, m=4, dp=2, mini_batch=8)
    trainer = make_trainer(*settings.overrides, "algorithm.adv_estimator=grpo")
    for i in range(4):
        put_group([(i + j) % 3 for j in range(8)])
    batch, _ = trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=4)
    balanced = _balance(trainer, batch, dp=3)
    padding = [tag for tag in balanced.tags if tag.get("is_padding", False)]
    assert len(batch) == 16 and len(balanced) == 24 and len(padding) == 8  # lcm(3, 8) = 24
