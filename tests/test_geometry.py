"""The drop-in's contract across batch geometries: how many prompts a generation round holds, how a round is cut into
optimizer steps and micro-steps, and how it is spread over processes. Each geometry either trains ``max_steps`` on
the rows GRPOTrainer with m trains on when those are its rollouts (``tests/contract.py``), or is refused in one line
before any model is built, naming the setting to change.

Where pods-rl multiplies or divides a batch (each place listed once, and the geometries below that exercise it):

- ``PODSConfig.__post_init__``: TRL's checks run with num_generations = m, so generation_batch_size =
  per_device_train_batch_size x processes x steps_per_generation counts kept rows and must hold whole groups of m;
  each process must too (per_device_train_batch_size x steps_per_generation a multiple of m); m >= 2.
- ``PODSConfig.sampled_prompts_per_process``: B = per_device_train_batch_size x steps_per_generation / m kept groups
  per process and round, times oversample_prompts (rounded up); the trainer's ``_kept_groups_per_process`` is B.
- ``PODSTrainer._prompts_per_generation_round``: B x oversample x processes prompts per round, the RepeatSampler's
  (or ``repeat_iterable_dataset``'s) batch, each repeated n times, num_iterations x steps_per_generation times; the
  dataloader's batch per process is that x n / processes.
- The placeholder dataset of environment-owned data: one round of PODS's prompts (TRL's holds
  generation_batch_size // n rows of GRPO's: none when a round keeps fewer rows than n).
- ``PODSStep._generate_and_score_completions``: P*n rows per process in, B*m out, which TRL splits into
  steps_per_generation x gradient_accumulation micro-batches of per_device_train_batch_size.
- The colocated vLLM engine's max_num_seqs (rollouts per process and round x tensor parallel): GPU only.
- ``PODSTrainer.evaluate``: per_device_eval_batch_size x processes a multiple of num_generations_eval (m unless
  set), refused in one line before generating (``tests/test_dropin.py``).

Outside the trainer, each with its own tests: ``pods train``'s ``recipes.check_enough_prompts`` (a round's prompts
x processes must be in the split), ``pods cost`` (kept rows per step: per_device_train_batch_size x accumulation x
processes) and the asynchronous worker (its placeholder for environment-owned data: per_device_train_batch_size x
accumulation rows, never empty).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pods_rl.engines.trl.trainer import PODSConfig
from tests import contract
from tests.contract import M, N
from tests.test_contract import Feature, run_pair

ONE_PROMPT = dict(per_device_train_batch_size=M)  # a round keeps one group of m = 2 rows: fewer than n = 4
ENVIRONMENT = dict(kind="environment_data", reward_funcs=())
ENV_CONFIG = dict(max_completion_length=200)

# Each trains max_steps (2 unless set) and its kept rows are GRPO(m)'s (the contract). The contract's own table runs
# steps_per_generation and gradient_accumulation_steps at one prompt per step from a dataset; here, with the
# environment's own data and with generation_batch_size.
GEOMETRIES = {
    "one prompt per round": Feature(config=ONE_PROMPT),
    "one prompt per round, environment-owned data": Feature(**ENVIRONMENT, config={**ONE_PROMPT, **ENV_CONFIG}),
    "one prompt per round, environment-owned data, adaptive rounds": Feature(
        **ENVIRONMENT, config={**ONE_PROMPT, **ENV_CONFIG}, pods=dict(pilot_generations=2,
                                                                      downsample_rule="max_variance")),
    "one prompt per round, environment-owned data, over-sampling": Feature(
        **ENVIRONMENT, config={**ONE_PROMPT, **ENV_CONFIG}, pods=dict(oversample_prompts=2.0,
                                                                      downsample_rule="max_variance")),
    # n = 8: two prompts per round keep 4 rows, fewer than n (TRL's placeholder: 4 // 8 = 0 rows)
    "kept batch smaller than n, environment-owned data": Feature(
        **ENVIRONMENT, config={**ENV_CONFIG, "per_device_train_batch_size": 2 * M}, pods=dict(num_generations=8)),
    "one prompt per micro-step, accumulation 2, environment-owned data": Feature(
        **ENVIRONMENT, config={**ONE_PROMPT, **ENV_CONFIG, "gradient_accumulation_steps": 2, "max_steps": 1}),
    "a group split across steps (per_device_train_batch_size 1, steps_per_generation 2)": Feature(
        config=dict(per_device_train_batch_size=1, steps_per_generation=2, max_steps=2)),
    "one prompt per round, iterable dataset": Feature(dataset="iterable", config=ONE_PROMPT),
    "generation_batch_size of two steps, one prompt per step": Feature(
        config=dict(per_device_train_batch_size=M, generation_batch_size=2 * M, max_steps=2)),
    "one prompt per round, GRESO's skip": Feature(
        config=ONE_PROMPT, pods=dict(prompt_planner="greso", oversample_prompts=2.0, downsample_rule="max_variance",
                                     prompt_planner_args={"p_easy": 0.05, "min_p": 0.05})),
    "one prompt per round, Knapsack-RL": Feature(
        config=ONE_PROMPT, pods=dict(rollout_planner="knapsack", adaptive_budget=3.0, downsample_rule="max_variance",
                                     rollout_planner_args={"min_buffer_length": 1, "reward_buffer_length": 4})),
    "one prompt per round, Pilot-Commit": Feature(
        config=ONE_PROMPT, pods=dict(prompt_planner="pilot_commit", oversample_prompts=2.0,
                                     downsample_rule="max_variance", prompt_planner_args={"n_explore": 2})),
    "one prompt per round, Reinforce-Ada": Feature(
        config=ONE_PROMPT, pods=dict(pilot_generations=2, adaptive_rule="reinforce_ada",
                                     downsample_rule="reinforce_ada")),
}

# Run on 2 gloo ranks, one prompt per rank and round (tests/scripts/contract_ranks.py).
RANK_GEOMETRIES = ["one prompt per round", "one prompt per round, environment-owned data"]


@pytest.fixture
def contract_rule(scratch_registry):
    from pods_rl import register_rule

    register_rule("keep_indices", contract.keep_indices, overwrite=True)


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_each_geometry_trains_the_rows_grpo_with_m_trains(name, tmp_path, tiny_model_dir, contract_rule):
    feature = GEOMETRIES[name]
    pods, grpo = run_pair(feature, tmp_path, {"text": tiny_model_dir})
    oversampled = feature.pods.get("oversample_prompts", 1) > 1
    contract.assert_same(pods, grpo, ignore=("epoch",) if oversampled else ())
    args = pods.trainer.args
    assert pods.trainer.state.global_step == grpo.trainer.state.global_step == args.max_steps
    kept_rows = args.per_device_train_batch_size * args.steps_per_generation
    assert [len(batch["advantages"]) for batch in pods.recorder.batches] == [kept_rows] * len(pods.recorder.batches)
    if feature.kind == "environment_data":  # the placeholder holds one round of PODS's prompts
        assert len(pods.trainer.train_dataset) == args.sampled_prompts_per_process()


REFUSED = {
    "m = 1": (dict(downsample_to=1), "downsample_to (m) must be an integer >= 2 (rollouts kept per prompt), got 1"),
    "a round holding half a group": (
        dict(per_device_train_batch_size=1),
        "generation_batch_size (1, counted in kept rollouts) is not a multiple of downsample_to (m=2): the update "
        "batch must hold whole groups of m kept rollouts. Make per_device_train_batch_size * num_processes * "
        "steps_per_generation a multiple of 2."),
    "more kept than sampled": (dict(downsample_to=8),
                               "downsample_to (m=8) is larger than num_generations (n=4)"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_impossible_geometry_is_refused_in_one_line_by_the_config(name, tmp_path):
    settings, message = REFUSED[name]
    base = dict(output_dir=str(tmp_path), use_cpu=True, num_generations=N, downsample_to=M,
                per_device_train_batch_size=2 * M, report_to="none")
    with pytest.raises(ValueError) as err:
        PODSConfig(**{**base, **settings})
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_environment_owned_data_with_a_planner_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """The planners tell prompts apart by their text, which environment-owned data does not have: refused before
    GRPOTrainer builds anything (the model here is a hub id that cannot be loaded offline: nothing tries)."""
    from pods_rl.engines.trl.trainer import PODSTrainer
    from tests.test_contract import Problems

    config = PODSConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=N, downsample_to=M, max_steps=2,
                        per_device_train_batch_size=M, report_to="none", rollout_planner="knapsack")
    with pytest.raises(ValueError) as err:
        PODSTrainer(model="no-such-org/no-such-model", reward_funcs=None, args=config, environment_factory=Problems)
    assert str(err.value).startswith("prompt_planner / rollout_planner tell prompts apart by their text, but the "
                                     "environment owns the data here") and "\n" not in str(err.value)


@pytest.mark.slow
def test_one_prompt_per_rank_on_two_processes(tmp_path, tiny_model_dir):
    """2 gloo ranks, one prompt each per round (``accelerate launch``, the contract's 2-rank script): each rank's kept
    rows are GRPO(m)'s, and one kept row per process is refused in one line on every rank."""
    from tests import multiproc

    script = multiproc.SCRIPT.parent / "contract_ranks.py"
    command = [arg if arg != str(multiproc.SCRIPT) else str(script) for arg in multiproc.launch_command()]
    command += [str(tiny_model_dir), str(tmp_path), *RANK_GEOMETRIES]
    env = multiproc.launch_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env["PYTHONPATH"]
    proc = multiproc.start(command, env)
    _, err = multiproc.end(proc, timeout=600)
    assert proc.returncode == 0, err[-4000:]
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in RANK_GEOMETRIES:
            assert found[name]["same"], f"rank {rank}, {name}: {found[name].get('where')}"
            assert found[name]["steps"] == 2 and found[name]["rows_per_round"] == [M, M], found[name]
        assert found["refused"].startswith("per_device_train_batch_size * steps_per_generation = 1 * 1 = 1 kept "
                                           "rollouts per process"), found["refused"]
