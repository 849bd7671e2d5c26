"""What the PODS buffer refuses, each with one line naming the problem and the fix, before any GPU work: verl's
trainer builds the buffer in its constructor, before workers, rollout servers or the dataloader exist."""

from __future__ import annotations

import pytest
from verl_lane import make_trainer, pods_overrides, put_group

from pods_rl.engines.verl import replay_buffer as pods_verl

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M = 8, 4
KW = "+trainer.v1.sampler.sampler_kwargs."


def _one_line_error(excinfo, *phrases):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize("overrides, phrases", [
    (["reward.reward_model.enable=True", "reward.reward_model.enable_resource_pool=False"],
     ["colocated reward model", "reward.reward_model.enable_resource_pool=True"]),
    (["algorithm.filter_groups.enable=True"], ["filter_groups", "oversample_prompts"]),
    (["actor_rollout_ref.rollout.n=3"], ["m=4 is larger than actor_rollout_ref.rollout.n=3"]),
    ([KW + "rule=max_varianse"], ["unknown down-sampling rule 'max_varianse'", "max_variance"]),
    ([KW + "tiebreak=shortest"], ["tiebreak must be one of"]),
    ([KW + "rule_module=/nonexistent/rules.py"], ["rule_module", "could not be imported"]),
    ([KW + "oversample=2"], ["unknown PODS sampler_kwargs ['oversample']", "oversample_prompts"]),
    ([KW + "oversample_prompts=0.5"], ["oversample_prompts must be a number >= 1"]),
    # verl's usual settings, in prompts: 4 prompts x 8 rollouts per mini-batch, but only 4 x 4 rows are kept.
    (["actor_rollout_ref.actor.ppo_mini_batch_size=4"], ["16 kept rows", "32 (actor)", "`pods verl-args`"]),
    (["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=4"], ["32 (critic)", "padding rows"]),
])
def test_refused_at_construction_with_one_line(overrides, phrases):
    with pytest.raises(ValueError) as excinfo:
        make_trainer(*pods_overrides(M, N), *overrides)
    _one_line_error(excinfo, *phrases)


def test_missing_and_bad_m():
    base = [o for o in pods_overrides(M, N) if not o.startswith(KW + "m=")]
    with pytest.raises(ValueError) as excinfo:
        make_trainer(*base)
    _one_line_error(excinfo, "sampler_kwargs.m=M", "pods verl-args")
    with pytest.raises(ValueError) as excinfo:
        make_trainer(*base, KW + "m=1")
    _one_line_error(excinfo, "m must be an integer >= 2")


def test_separate_async_refused():
    overrides = [o.replace("ppo_mini_batch_size=1", "ppo_mini_batch_size=4") for o in pods_overrides(M, N)]
    with pytest.raises(ValueError) as excinfo:  # settings verl's separate_async accepts (4 = 1 x 4)
        make_trainer(*overrides, "trainer.v1.separate_async.parameter_sync_step=1",
                     "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "actor_rollout_ref.rollout.nnodes=1",
                     "actor_rollout_ref.rollout.n_gpus_per_node=1", mode="separate_async")
    _one_line_error(excinfo, "separate_async", "sync or colocate_async")


def test_feature_rule_needs_a_response_length():
    """Without the trainer's config (a buffer built by hand), a rule that reads truncation needs the length."""
    import pods_rl

    pods_rl.register_rule("needs_features", lambda rewards, m, generator, *, features: rewards.argsort(1)[:, :m],
                          overwrite=True)
    with pytest.raises(ValueError) as excinfo:
        pods_verl.PODSSettings.from_sampler_kwargs({"m": 2, "rule": "needs_features"})
    _one_line_error(excinfo, "response_length")
    assert pods_verl.PODSSettings.from_sampler_kwargs({"m": 2, "rule": "needs_features",
                                                       "response_length": 64}).response_length == 64


@pytest.mark.parametrize("installed", [None, "0.8.5", "0.9.0", "0.10.0", "1.0.0"])
def test_version_guard(installed):
    with pytest.raises(ImportError) as excinfo:
        pods_verl._require_supported_verl(installed)
    _one_line_error(excinfo, 'pip install -e ".[verl]" in a clone of pods-rl')


@pytest.mark.parametrize("installed", ["0.9.1", "0.9.7", "0.9.2rc1"])
def test_version_guard_accepts_the_supported_range(installed):
    pods_verl._require_supported_verl(installed)


def test_rewards_missing_when_sampling(tq_store):
    """A colocated reward model scores after sampling: the rollouts carry no rm_scores yet. Refused, one line."""
    trainer = make_trainer(*pods_overrides(M, N))
    put_group([0, 1, 0, 1, 0, 1, 0, 1], with_rewards=False)
    with pytest.raises(ValueError) as excinfo:
        trainer.replay_buffer.sample(global_steps=0, partition_id="train", batch_size=1)
    _one_line_error(excinfo, "no rewards (rm_scores)", "enable_resource_pool=True")


def test_extra_pins_the_supported_range():
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'verl = ["verl[verl-core]{pods_verl.VERL_RANGE}"' in pyproject
