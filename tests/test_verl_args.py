"""`pods verl-args` arithmetic (needs no verl: it runs in the main suite) and the verl integration's import
boundary: `import pods_rl` and the batch helper load no verl, Ray or TransferQueue, and the verl module refuses a
missing verl with one line. The same settings are checked against verl's own `_balance_batch` in tests/verl/."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pods_rl.commands import cli
from pods_rl.engines.verl.batch_settings import padding_rows, verl_batch_settings
from pods_rl.selection import kept_groups, sampled_prompts


@settings(max_examples=300, deadline=None)
@given(kept=st.integers(1, 2000), oversample=st.floats(1.0, 8.0))
def test_kept_groups_inverts_sampled_prompts(kept, oversample):
    sampled = sampled_prompts(kept, oversample)
    assert sampled >= kept and sampled >= kept * oversample - 1e-6
    assert kept_groups(sampled, oversample) == kept


def test_padding_rows_is_verls_rule():
    # verl pads to a multiple of lcm(dp, actor rows, critic rows); measured on verl 0.9.1: 4 kept rows -> 12.
    assert padding_rows(4, 1, 12) == 8
    assert padding_rows(512, 8, 512) == 0
    assert padding_rows(48, 2, 16, 24) == 0 and padding_rows(40, 2, 16, 24) == 8


def test_the_papers_setting():
    batch = verl_batch_settings(prompts=32, n=64, m=16, dp=8, mini_batch=512)
    assert (batch.train_batch_size, batch.kept_rows, batch.actor_mini_batch) == (32, 512, 8)
    assert batch.overrides == (
        "trainer.v1.trainer_mode=sync",
        "data.train_batch_size=32",
        "actor_rollout_ref.rollout.n=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "trainer.v1.sampler.custom_sampler.path=pkg://pods_rl.engines.verl.replay_buffer",
        "trainer.v1.sampler.custom_sampler.name=PODSReplayBuffer",
        "+trainer.v1.sampler.sampler_kwargs.m=16",
        "+trainer.v1.sampler.sampler_kwargs.rule=max_variance",
        "+trainer.v1.sampler.sampler_kwargs.tiebreak=index",
    )
    assert padding_rows(batch.kept_rows, 8, batch.actor_mini_batch * 64) == 0


@settings(max_examples=300, deadline=None)
@given(prompts=st.integers(1, 64), n=st.integers(2, 64), m_frac=st.floats(0, 1), dp=st.sampled_from([1, 2, 3, 4, 8]),
       groups_per_mini_batch=st.integers(1, 8), critic=st.booleans(), oversample=st.sampled_from([1, 1.5, 2, 3.3]))
def test_every_accepted_setting_trains_without_padding(prompts, n, m_frac, dp, groups_per_mini_batch, critic,
                                                       oversample):
    m = 2 + round(m_frac * (n - 2))
    mini_batch = groups_per_mini_batch * n
    try:
        batch = verl_batch_settings(prompts, n, m, dp, mini_batch, critic_mini_batch=2 * mini_batch if critic else None,
                                    oversample_prompts=oversample)
    except ValueError as err:
        assert "\n" not in str(err)
        # Refused only when verl would pad or cannot express the mini-batch.
        rows = [mini_batch] + ([2 * mini_batch] if critic else [])
        assert any(prompts * m % r or r % dp for r in rows)
        return
    actor_rows = batch.actor_mini_batch * n
    critic_rows = batch.critic_mini_batch * n if critic else None
    assert batch.kept_rows == prompts * m
    assert padding_rows(batch.kept_rows, dp, actor_rows, critic_rows) == 0
    assert kept_groups(batch.train_batch_size, oversample) == prompts
    assert batch.train_batch_size >= batch.actor_mini_batch  # verl's own ActorConfig.validate
    assert actor_rows % dp == 0  # the engine worker splits every mini-batch over the ranks


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(prompts=30, n=64, m=16, dp=8, mini_batch=512), "would pad it with 32 no-op rows"),
    (dict(prompts=32, n=64, m=16, dp=8, mini_batch=500), "not a multiple of n=64"),
    (dict(prompts=32, n=64, m=16, dp=3, mini_batch=512), "does not split over dp=3"),
    (dict(prompts=32, n=64, m=16, dp=8, mini_batch=512, critic_mini_batch=1024), "critic mini-batches"),
    (dict(prompts=32, n=64, m=65, dp=8, mini_batch=512), "2 <= m <= n"),
    (dict(prompts=32, n=64, m=1, dp=8, mini_batch=512), "2 <= m <= n"),
    (dict(prompts=0, n=64, m=16, dp=8, mini_batch=512), "prompts must be a positive integer"),
    (dict(prompts=32, n=64, m=16, dp=8, mini_batch=512, oversample_prompts=0.5), "oversample_prompts"),
    (dict(prompts=32, n=64, m=16, dp=8, mini_batch=512, tiebreak="short"), "tiebreak must be one of"),
    (dict(prompts=32, n=64, m=16, dp=8, mini_batch=512, trainer_mode="separate_async"), "always be padded"),
    (dict(prompts=32, n=64, m=16, dp=8, mini_batch=512, trainer_mode="async"), "trainer_mode must be one of"),
])
def test_impossible_combinations_refused_with_one_line(kwargs, phrase):
    with pytest.raises(ValueError) as excinfo:
        verl_batch_settings(**kwargs)
    assert phrase in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_cli(capsys):
    argv = ["verl-args", "--prompts", "16", "--n", "64", "--m", "16", "--dp", "8", "--mini-batch", "256",
            "--critic-mini-batch", "256", "--oversample", "2", "--tiebreak", "shorter"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    lines = out.split()
    assert "data.train_batch_size=32" in lines and "actor_rollout_ref.actor.ppo_mini_batch_size=4" in lines
    assert ("critic.ppo_mini_batch_size=4" in lines
        and "+trainer.v1.sampler.sampler_kwargs.oversample_prompts=2" in lines)
    assert "+trainer.v1.sampler.sampler_kwargs.tiebreak=shorter" in lines
    assert err.count("\n") == 1 and "256 kept rows = 1 actor mini-batch(es)" in err and "no padding" in err

    assert cli.main(["verl-args", "--prompts", "30", "--n", "64", "--m", "16", "--dp", "8", "--mini-batch", "512"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("pods verl-args: error: prompts x m = 30 x 16")
    assert cli.main(["verl-args", "--prompts", "30"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


MANAGER = ("+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
           "pods_rl.engines.verl.agent_loop.PODSAgentLoopManager")
HOOK = "trainer.checkpoint_callback_class=pods_rl.engines.verl.replay_buffer.PODSCheckpointCallback"


@pytest.mark.parametrize("planners, expected", [
    ({"rollout_planner": "knapsack", "rollout_planner_args": {"max_n": 16, "allow_fallback": False}},
     ["+trainer.v1.sampler.sampler_kwargs.rollout_planner=knapsack",
      "+trainer.v1.sampler.sampler_kwargs.rollout_planner_args={max_n:16,allow_fallback:false}", MANAGER, HOOK]),
    ({"prompt_planner": "greso", "refill_rounds": 2},
     ["+trainer.v1.sampler.sampler_kwargs.prompt_planner=greso", "+trainer.v1.sampler.sampler_kwargs.refill_rounds=2",
      MANAGER, HOOK, "data.gen_batch_size=1"]),
    ({"rollout_planner": "reinforce_ada", "rollout_planner_args": {"reinforce_ada_choice": "positive_focused"}},
     ["+trainer.v1.sampler.sampler_kwargs.rollout_planner=reinforce_ada",
      "+trainer.v1.sampler.sampler_kwargs.rollout_planner_args={reinforce_ada_choice:positive_focused}", MANAGER,
      HOOK]),
    ({"rollout_planner": "auto"},
     ["+trainer.v1.sampler.sampler_kwargs.rollout_planner=auto", MANAGER, HOOK]),
    ({}, []),
])
def test_planner_overrides(planners, expected):
    batch = verl_batch_settings(prompts=4, n=8, m=4, dp=1, mini_batch=8, planners=planners)
    assert list(batch.overrides[9:]) == expected
    if planners.get("prompt_planner"):  # colocate_async fetches one row at a time already
        batch = verl_batch_settings(prompts=4, n=8, m=4, dp=1, mini_batch=8, planners=planners,
                                    trainer_mode="colocate_async")
        assert "data.gen_batch_size=1" not in batch.overrides


@pytest.mark.parametrize("planners, phrases", [
    ({"prompt_planner": "pilot_commit", "prompt_planner_args": {"buffer_max_off_steps": 4}},
     ["buffer_max_off_steps=4", "as soon as it is scored", "set it to 0"]),
    ({"prompt_planner": "pilot_commit", "prompt_planner_args": {"n_explore_effective": 1, "n_explore": 2}},
     ["n_explore_effective=1", "trains on every pilot rollout"]),
    ({"rollout_planner": "knapsack", "rollout_planner_args": {"max_n": 8}}, ["max_n=8", "above 8"]),
    ({"rollout_planner": "knapsack", "rollout_planner_args": {"min_n": 1}}, ["min_n=1", "[4, 16]"]),
    ({"rollout_planner": "reinforce_ada", "rollout_planner_args": {"final_keep_per_prompt": 2}}, ["drop them"]),
    ({"rollout_planner": "dapo"}, ["sampler_kwargs.rollout_planner='dapo'", "'auto', 'knapsack', 'reinforce_ada'"]),
    ({"rollout_planner": "auto", "rollout_planner_args": {"max_n": 6}}, ["max_n=6", "above 8"]),
    ({"prompt_planner": "greso", "prompt_planner_args": {"p_easy": 2}}, ["GRESO p_easy"]),
    ({"prompt_planner": "greso", "refill": 2}, ["unknown planner settings ['refill']"]),
])
def test_planners_verl_cannot_meet_are_refused_before_anything_runs(planners, phrases):
    with pytest.raises(ValueError) as excinfo:
        verl_batch_settings(prompts=4, n=8, m=4, dp=1, mini_batch=8, planners=planners)
    message = str(excinfo.value)
    assert "\n" not in message and all(phrase in message for phrase in phrases), message


def test_cli_planners(capsys):
    base = ["verl-args", "--prompts", "4", "--n", "8", "--m", "4", "--dp", "1", "--mini-batch", "8"]
    assert cli.main([*base, "--rollout_planner", "knapsack", "--rollout_planner_args", '{"max_n": 16}']) == 0
    lines = capsys.readouterr().out.split()
    assert "+trainer.v1.sampler.sampler_kwargs.rollout_planner_args={max_n:16}" in lines and MANAGER in lines
    assert cli.main([*base, "--rollout_planner_args", "{max_n: 16}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not JSON" in err


def test_import_boundary():
    """`import pods_rl` and the batch helper load no verl, Ray or TransferQueue; the buffer module, when verl is
    missing, says so in one line (simulated: verl's distribution reported absent)."""
    code = """
import importlib.metadata as metadata, sys
import pods_rl, pods_rl.engines.verl.batch_settings, pods_rl.engines.verl.budget_settings
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("verl", "ray", "transfer_queue"))
assert not heavy, heavy
real_version = metadata.version
def version(name):
    if name == "verl":
        raise metadata.PackageNotFoundError(name)
    return real_version(name)
metadata.version = version
try:
    import pods_rl.engines.verl.replay_buffer
except ImportError as err:
    print(err)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    assert result.stdout.startswith("pods-rl's verl engine needs verl, which is not installed")
    assert 'pip install -e ".[verl]" in a clone of pods-rl' in result.stdout


VERL_RECIPES = ("gsm8k_grpo_pods.sh", "gsm8k_ppo_pods.sh")


def test_verl_recipes_are_launch_scripts_not_pods_train_recipes():
    from pods_rl.recipes import RECIPES_DIR, resolve_recipe

    assert sorted(p.name for p in (RECIPES_DIR / "verl").iterdir()) == list(VERL_RECIPES)
    with pytest.raises(ValueError, match="packaged recipes") as excinfo:
        resolve_recipe("verl/gsm8k_grpo_pods")
    assert "verl" not in str(excinfo.value).split("packaged recipes:")[1]  # `pods train`'s list is unchanged


@pytest.mark.parametrize("script, critic", list(zip(VERL_RECIPES, (None, 512))))
@pytest.mark.parametrize("nodes", [1, 2])
def test_verl_recipes_print_the_settings_of_pods_verl_args(script, critic, nodes):
    import os
    from pathlib import Path

    from pods_rl.recipes import RECIPES_DIR

    env = {**os.environ, "DRY_RUN": "1", "NNODES": str(nodes),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", str(RECIPES_DIR / "verl" / script), "trainer.total_epochs=1"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    expected = verl_batch_settings(prompts=32, n=64, m=16, dp=8 * nodes, mini_batch=512, critic_mini_batch=critic)
    assert set(expected.overrides) <= set(lines)
    assert f"trainer.nnodes={nodes}" in lines and lines[-1] == "trainer.total_epochs=1"  # extra args passed on
    assert ("algorithm.adv_estimator=gae" in lines) == (critic is not None)
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct" in lines
