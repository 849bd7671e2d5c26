"""PODSTrainer with adaptive rollouts (pilot_generations): rounds over the open prompts only, the same kept rows
as plain PODS when the pilot is all of n, over-sampling drops what stayed all-equal, and config errors."""

import pytest

from pods_rl.engines.trl.trainer import PODSConfig

from .test_trainer import (
    _kept_texts,
    _score_one_batch,
    _train_recording_grad_forward_rows,
    common_args,
    half_informative_reward,
    make_trainer,
)


@pytest.mark.parametrize("rule", ["max_variance", "random"])
def test_pilot_of_n_keeps_the_rows_plain_pods_keeps(tmp_path, tiny_model_dir, rule):
    n, m = 8, 4
    kept = {}
    for pilot in (None, n):
        trainer = make_trainer(tmp_path / str(pilot), tiny_model_dir, num_generations=n, downsample_to=m,
                               per_device_train_batch_size=2 * m, max_steps=1, max_completion_length=12,
                               downsample_rule=rule, pilot_generations=pilot)
        out, rewards, lengths, texts = _score_one_batch(trainer, n)
        kept[pilot] = (_kept_texts(trainer, out), out["advantages"].tolist())
        log = trainer._metrics["train"]
        assert log["pods/rollouts_sampled"] == [2.0 * n] and log["pods/rounds"] == [1.0]
    assert kept[None] == kept[n]
    assert len(kept[n][0]) == 2 * m


def test_rounds_sample_less_and_update_on_b_times_m_rows(tmp_path, tiny_model_dir):
    # Even prompts: every rollout scores 1 (all-equal: open up to n); odd prompts: digit_reward, usually mixed
    # after the pilot. Over-sampling 2x: the groups still all-equal at n are the ones dropped.
    n, m, k, groups, steps = 16, 4, 4, 2, 3
    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(half_informative_reward,), num_generations=n,
                           downsample_to=m, per_device_train_batch_size=groups * m, max_steps=steps,
                           oversample_prompts=2, pilot_generations=k)
    scored = []  # rows scored per reward call (one call per round)

    def recording_reward(prompts, completions, **kw):
        scored.append(len(completions))
        return half_informative_reward(prompts, completions)

    trainer.reward_funcs[0] = recording_reward
    trainer.reward_func_names[0] = "half_informative_reward"
    forward_rows = _train_recording_grad_forward_rows(trainer)
    assert forward_rows == [groups * m] * steps  # the update batch is unchanged
    logs = [row for row in trainer.state.log_history if "pods/rollouts_sampled" in row]
    assert len(logs) == steps
    assert sum(row["pods/rollouts_sampled"] for row in logs) == sum(scored)  # every scored rollout is counted
    assert sum(row["pods/rounds"] for row in logs) == len(scored)
    sampled_prompts = 2 * groups
    for row in logs:
        # the even prompts (half of them) run to n; the odd ones stop early when mixed
        assert sampled_prompts * k < row["pods/rollouts_sampled"] <= sampled_prompts * n
        assert row["pods/rounds"] >= 1 + (n - k) // k  # the all-equal prompts need every round
        assert row["pods/frac_zero_std_pilot"] >= 0.5  # at least the even prompts were all-equal after the pilot
        assert row["pods/frac_zero_std_all"] <= row["pods/frac_zero_std_pilot"]
    assert any(row["pods/rollouts_sampled"] < sampled_prompts * n for row in logs)
    # dynamic sampling dropped the groups that stayed all-equal whenever enough mixed ones were sampled
    for row in logs:
        assert row["pods/groups_zero_std_kept"] == max(0, row["pods/groups_zero_std"] - groups)


def test_budgeted_rule_trains_within_its_budget(tmp_path, tiny_model_dir):
    n, m, k, groups = 8, 2, 2, 2
    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(half_informative_reward,), num_generations=n,
                           downsample_to=m, per_device_train_batch_size=groups * m, max_steps=2,
                           pilot_generations=k, adaptive_rule="budgeted", adaptive_budget=4.0)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "pods/rollouts_sampled" in row]
    assert len(logs) == 2 and all(row["pods/rollouts_sampled"] <= 4.0 * groups for row in logs)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(pilot_generations=-1), "pilot_generations \\(k\\) must be an integer in \\[1, num_generations=8\\]"),
        (dict(pilot_generations=9), "in \\[1, num_generations=8\\]"),
        (dict(pilot_generations=2, downsample_to=8), "needs downsample_to \\(m\\) < num_generations"),
        (dict(pilot_generations=2, adaptive_rule="nope"), "Unknown adaptive_rule"),
        (dict(pilot_generations=2, adaptive_round_size=0), "adaptive_round_size must be a positive integer"),
        (dict(pilot_generations=2, adaptive_rule="budgeted"), "needs adaptive_budget"),
        (dict(pilot_generations=2, adaptive_rule="budgeted", adaptive_budget=9), "needs adaptive_budget"),
        (dict(pilot_generations=2, adaptive_budget=5), "only read by adaptive_rule=budgeted"),
    ],
)
def test_bad_adaptive_configs_fail_fast(tmp_path, overrides, message):
    args = dict(num_generations=8, downsample_to=4, per_device_train_batch_size=8)
    args.update(overrides)
    with pytest.raises(ValueError, match=message):
        PODSConfig(**common_args(tmp_path, **args))


@pytest.mark.slow
def test_pods_train_with_a_pilot_logs_fewer_rollouts(tmp_path):
    """The shipped tiny model and the issue's done-when command: `pods train --config cpu/smoke --num_generations 16
    --downsample_to 4
    --pilot_generations 4` trains and logs fewer than 16 rollouts per prompt on steps whose groups mixed early."""
    import json

    from pods_rl import tiny
    from pods_rl.commands.train import main as train_main

    run_dir = tmp_path / "run"
    assert train_main(["--config", "cpu/smoke", "--num_generations", "16", "--downsample_to", "4",
                       "--pilot_generations", "4", "--model_name_or_path", str(tiny.ASSETS_DIR), "--output_dir",
                       str(run_dir), "--eval_before_after", "false", "--max_steps", "3"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "pods/rollouts_sampled" in row]
    assert len(steps) == 3
    for row in steps:
        prompts = row["pods/prompts_sampled"]  # smoke: 8 kept rows / m = 2 prompts per step
        assert 4 * prompts <= row["pods/rollouts_sampled"] <= 16 * prompts
        # a step that closed a prompt after its pilot sampled fewer than 16 per prompt
        if row["pods/frac_zero_std_pilot"] < 1:
            assert row["pods/rollouts_sampled"] < 16 * prompts
    # the shipped model solves some problems, so some pilot groups are mixed (seed 0: every step has one)
    assert any(row["pods/frac_zero_std_pilot"] < 1 for row in steps)


def test_adaptive_reward_decides_mixed_on_one_reward_function(tmp_path, tiny_model_dir):
    # Total = half_informative + length: the length reward makes nearly every total mixed, so on the total every
    # prompt would stop after its pilot; on half_informative the even prompts (all 1) run to n.
    from .test_trainer import length_reward

    n, m, k, groups = 8, 2, 2, 2
    sampled = {}
    for decider in (None, "half_informative_reward"):
        trainer = make_trainer(tmp_path / str(decider), tiny_model_dir,
                               reward_funcs=(half_informative_reward, length_reward), num_generations=n,
                               downsample_to=m, per_device_train_batch_size=groups * m, max_steps=2,
                               pilot_generations=k, adaptive_reward=decider)
        trainer.train()
        logs = [row for row in trainer.state.log_history if "pods/rollouts_sampled" in row]
        sampled[decider] = [(row["pods/rollouts_sampled"], row["pods/frac_zero_std_pilot"]) for row in logs]
    # the even prompts' group is all-equal on half_informative: at least 1 of the 2 per step unless both odd
    assert any(s > groups * k for s, _ in sampled["half_informative_reward"])
    assert sum(s for s, _ in sampled["half_informative_reward"]) > sum(s for s, _ in sampled[None])
    with pytest.raises(ValueError, match="adaptive_reward 'nope' is not one of this run's reward functions"):
        make_trainer(tmp_path / "bad", tiny_model_dir, num_generations=n, downsample_to=m,
                     per_device_train_batch_size=groups * m, pilot_generations=k, adaptive_reward="nope")


def test_rounds_are_arranged_into_n_rows_per_prompt():
    from pods_rl.adaptive import ranks_within as _ranks_within
    from pods_rl.engines.trl.rows import arrange_rounds as _arrange_rounds

    assert _ranks_within([3, 3, 5, 3]) == [0, 1, 0, 2]
    n = 4
    # round 1: pilot of 2 for prompts 0 and 1; round 2: 2 more for prompt 1, plus one padding row (dropped)
    round1 = (["p0", "p0", "p1", "p1"], [[1], [2], [3], [4]], None, ["a", "b", "c", "d"], None,
              {"extra": [10, 11, 12, 13], "per_batch": 7}, None, [])
    round2 = (["p1", "p1", "pad"], [[5], [6], [0]], None, ["e", "f", "x"], None,
              {"extra": [14, 15, 99], "per_batch": 8}, None, [])
    slots = [[0, 1, 4, 5], [6, 7]]
    merged = _arrange_rounds([round1, round2], slots, num_prompts=2, n=n)
    assert merged[3] == ["a", "b", "a", "a", "c", "d", "e", "f"]  # prompt 0's empty slots copy its first rollout
    assert merged[1] == [[1], [2], [1], [1], [3], [4], [5], [6]]
    assert merged[5] == {"extra": [10, 11, 10, 10, 12, 13, 14, 15], "per_batch": 7}
    assert merged[2] is None and merged[7] == []  # absent / per-batch entries come from the first round


def test_default_run_dir_names_the_pilot_and_the_planner(tmp_path):
    from pods_rl.recipes import RunArguments
    from pods_rl.training_run import default_run_dir

    config = PODSConfig(**common_args(tmp_path, num_generations=8, downsample_to=4, per_device_train_batch_size=8,
                                      pilot_generations=4))
    assert "-pods-max_variance-n8m4-pilot4-seed3-" in default_run_dir(RunArguments(task="arithmetic"), config).name
    auto = PODSConfig(**common_args(tmp_path, num_generations=8, downsample_to=4, per_device_train_batch_size=8,
                                    rollout_planner="auto"))
    assert "-pods-max_variance-n8m4-auto-seed3-" in default_run_dir(RunArguments(task="arithmetic"), auto).name
