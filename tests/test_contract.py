"""The drop-in's contract, feature by feature: PODSTrainer sampling n = 4 and keeping m = 2 produces, on the rows it
keeps, what GRPOTrainer with m = 2 produces on those rollouts: the same batch for the loss, gradients, completions
table (``log_extra`` columns and images included), logged metrics (``log_metric`` values included), environment
states and tool masks (``tests/contract.py`` says how). One entry of ``FEATURES`` per TRL feature; CI runs this file
on both ends of TRL_RANGE, and ``tests/scripts/contract_ranks.py`` runs a few entries on 2 gloo ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from datasets import Dataset, IterableDataset
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from pods_rl import register_rule
from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer
from tests import contract
from tests.contract import KEPT_INDICES, TURNS, M, N, Script, turn_reward, vowel_share
from tests.test_dropin import Counter, call, multiply, tool_model, tool_tokenizer

TRL = Version(version("trl"))


def tool_use_reward(completions, **kwargs):
    """The tool calls a rollout's assistant turns made (each one's result rolled back or not)."""
    return [float(sum(len(m.get("tool_calls") or []) for m in c if m.get("role") == "assistant"))
            for c in completions]


@dataclass
class Feature:
    """One TRL feature, as both runs are built with it."""

    config: dict = field(default_factory=dict)  # GRPOConfig fields, for both runs
    pods: dict = field(default_factory=dict)  # PODSConfig's own fields (the PODS run only)
    kind: str = "text"  # text | tools | environment | environment_data | vision | rollout_func
    dataset: str = "conversational"  # conversational | standard | iterable
    reward_funcs: tuple = (turn_reward,)
    peft: bool = False
    evaluate: bool = False
    min_trl: str = "1.12"  # the first TRL with the feature
    turns: tuple | None = None  # the script's first turns (default: the kind's)
    offset: object = None  # where a prompt starts in them (Script's offset)


FEATURES = {
    "plain": Feature(),
    **{f"loss_type={loss}": Feature(config=dict(loss_type=loss))
       for loss in ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo")},
    "scale_rewards=batch": Feature(config=dict(scale_rewards="batch")),
    "scale_rewards=none": Feature(config=dict(scale_rewards="none")),
    "sum_then_normalize, weighted": Feature(reward_funcs=(turn_reward, vowel_share),
                                            config=dict(reward_weights=[1.0, 0.3])),
    "normalize_then_sum": Feature(reward_funcs=(turn_reward, vowel_share),
                                  config=dict(multi_objective_aggregation="normalize_then_sum",
                                              reward_weights=[1.0, 0.5])),
    "beta (reference model)": Feature(config=dict(beta=0.04)),
    "num_iterations": Feature(config=dict(num_iterations=2, max_steps=4)),
    "steps_per_generation": Feature(config=dict(steps_per_generation=2, per_device_train_batch_size=M, max_steps=4)),
    "gradient_accumulation_steps": Feature(config=dict(gradient_accumulation_steps=2, per_device_train_batch_size=M)),
    "log_completions": Feature(config=dict(log_completions=True, num_completions_to_print=1)),
    "LoRA (PEFT)": Feature(peft=True),
    "standard prompts": Feature(dataset="standard"),
    "iterable dataset": Feature(dataset="iterable"),
    "rollout_func, extra fields": Feature(kind="rollout_func"),
    "tools": Feature(kind="tools", reward_funcs=(), config=dict(max_completion_length=200)),
    "tools, results past the completion budget": Feature(kind="tools", reward_funcs=(tool_use_reward,)),
    "environment": Feature(kind="environment", reward_funcs=(), config=dict(max_completion_length=200)),
    "environment-owned data": Feature(kind="environment_data", reward_funcs=(), config=dict(max_completion_length=200)),
    "vision-language prompts": Feature(kind="vision"),
    "evaluation": Feature(evaluate=True, config=dict(eval_strategy="steps", eval_steps=1, eval_on_start=True,
                                                    per_device_eval_batch_size=2 * M)),
    "adaptive rounds": Feature(pods=dict(pilot_generations=2, downsample_rule="max_variance")),
    "adaptive rounds, tools": Feature(kind="tools", reward_funcs=(), config=dict(max_completion_length=200),
                                      pods=dict(pilot_generations=2, downsample_rule="max_variance")),
    "adaptive rounds, environment": Feature(kind="environment", reward_funcs=(), config=dict(max_completion_length=200),
                                            pods=dict(pilot_generations=2, downsample_rule="max_variance")),
    "prompt over-sampling": Feature(pods=dict(oversample_prompts=2.0, downsample_rule="max_variance")),
    "Reinforce-Ada's rounds and balanced keep": Feature(pods=dict(pilot_generations=2, adaptive_rule="reinforce_ada",
                                                                  downsample_rule="reinforce_ada")),
    "GRESO's skip (prompt_planner)": Feature(pods=dict(prompt_planner="greso", oversample_prompts=2.0,
                                                       downsample_rule="max_variance",
                                                       prompt_planner_args={"p_easy": 0.05, "min_p": 0.05}),
                                             config=dict(max_steps=4)),
    "Pilot-Commit's pilot and commit (prompt_planner)": Feature(pods=dict(
        prompt_planner="pilot_commit", oversample_prompts=2.0, downsample_rule="max_variance",
        prompt_planner_args={"n_explore": 2}), config=dict(max_steps=4)),
    "Knapsack-RL's allocation (rollout_planner)": Feature(pods=dict(
        rollout_planner="knapsack", adaptive_budget=3.0, downsample_rule="max_variance",
        rollout_planner_args={"min_buffer_length": 1, "reward_buffer_length": 4}), config=dict(max_steps=4)),
    # auto where sampling is all the cost (training free): no rollout beyond m pays (the signal per sampled rollout
    # never rises past m), so m per prompt, GRPO with m (no probes: the costs are given, not measured).
    "auto at GRPO's costs (rollout_planner)": Feature(pods=dict(
        rollout_planner="auto", downsample_rule="max_variance",
        rollout_planner_args={"sample_ms": 1.0, "train_ms": 0.0}), config=dict(max_steps=4)),
    # Prompts i = 0, 1 (mod 4) answer "no" twice in their pilot (all equal: another round), the others call the tool
    # twice (mixed: done). On 2 processes the first two prompts of each step are rank 0's: rank 1 pads its second
    # round with throw-away rows, and fresh environments for them.
    "adaptive rounds, environment, uneven": Feature(
        kind="environment", reward_funcs=(), config=dict(max_completion_length=200),
        pods=dict(pilot_generations=2, downsample_rule="max_variance"),
        turns=("no", "none", "nada", "nil", call("increment", step=1), call("increment", step=5),
               call("increment", step=3), call("increment", step=2)),
        offset=lambda text, ids: 0 if int(text.split("+")[0].split()[-1]) % 4 < 2 else 4),
}
SUPPORTED = {name: f for name, f in FEATURES.items() if TRL >= Version(f.min_trl)}


@pytest.fixture
def contract_rule(scratch_registry):
    register_rule("keep_indices", contract.keep_indices, overwrite=True)


# ---- the pieces each kind of feature is built from ---------------------------------------------------------------

def dataset_for(feature: Feature, rows: int = 8):
    if feature.kind == "vision":
        from PIL import Image

        colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255), (9, 9, 9),
                  (200, 100, 0)]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Color {i}?"}] for i in range(rows)],
                                  "image": [Image.new("RGB", (40, 40), colors[i % 8]) for i in range(rows)]})
    if feature.kind == "environment_data":
        return None
    if feature.dataset == "standard":
        return Dataset.from_dict({"prompt": [f"{i}+{i * 3}=" for i in range(rows)]})
    prompts = [[{"role": "user", "content": f"{i}+{i * 3}="}] for i in range(rows)]
    if feature.dataset == "iterable":
        return IterableDataset.from_generator(lambda: iter({"prompt": p} for p in prompts))
    return Dataset.from_dict({"prompt": prompts})


TOOL_TURNS = (call("multiply", a=3, b=4), call("multiply", a=3, c=4), "I know it: 12", call("multiply", a=2, b=6),
              call("divide", a=1, b=2), "no idea", call("multiply", a=1, b=1))
COUNTER_TURNS = (call("increment", step=1), call("increment", step=5), "no", call("increment", step=3),
                 call("increment", step=2), "none", call("increment", step=4))


def tool_reward(completions, log_extra=None, **kwargs):
    """1 when a tool answered 12 in the rollout; logs each rollout's tool messages."""
    tools = [" ".join(str(m.get("content")) for m in c if m.get("role") == "tool") for c in completions]
    if log_extra is not None:
        log_extra("tool_text", tools)
    return [float("12" in t) for t in tools]


def environment_state(environments, log_extra=None, log_metric=None, **kwargs):
    """Each rollout's environment state in the completions table; their mean count as a metric."""
    counts = [float(e.count) for e in environments]
    if log_extra is not None:
        log_extra("count", counts)
    if log_metric is not None:
        log_metric("mean_count", sum(counts) / len(counts))
    return [c % 2 for c in counts]


class Problems(Counter):
    """An environment that owns the data: ``reset`` returns the problem, one problem per group of ``group``
    resets (n in the PODS run, m in GRPO's: each group's rollouts work on the same problem); with a ``schedule``
    (GRPO's run after PODS over-sampled its candidates), the g-th group's problem is ``schedule[g]``."""

    resets = 0
    group = N
    schedule: list[int] | None = None

    def reset(self, **kwargs) -> str:
        index = Problems.resets // Problems.group
        self.problem = index if Problems.schedule is None else Problems.schedule[index]
        Problems.resets += 1
        self.count = 0
        return f" Problem {self.problem}: raise the counter."


def build(feature: Feature, tmp_path, pods: bool, plan=None, model_dirs=None):
    """The PODS or the GRPO trainer of ``feature``, with its script (GRPO's answers from ``plan``)."""
    args = dict(output_dir=str(tmp_path / ("pods" if pods else "grpo")), use_cpu=True, seed=5, learning_rate=5e-2,
                max_steps=2, max_completion_length=64, per_device_train_batch_size=2 * M, logging_steps=1,
                report_to="none", save_strategy="no", beta=0.0, bf16=False, dataloader_num_workers=0,
                shuffle_dataset=False, disable_dropout=True)
    args.update(feature.config)
    if pods:
        config = PODSConfig(**args, **{"num_generations": N, "downsample_to": M, "downsample_rule": "keep_indices",
                                       **feature.pods})
    else:
        config = GRPOConfig(**args, num_generations=M)
    kwargs = dict(args=config, reward_funcs=list(feature.reward_funcs) or None, train_dataset=dataset_for(feature))
    if feature.evaluate:
        kwargs["eval_dataset"] = dataset_for(feature, rows=2)
    turns = TURNS
    if feature.kind in ("tools", "environment", "environment_data"):
        tokenizer = tool_tokenizer()
        kwargs.update(model=tool_model(tokenizer), processing_class=tokenizer)
        if feature.kind == "tools":
            kwargs.update(tools=[multiply], reward_funcs=list(feature.reward_funcs) or [tool_reward])
            turns = TOOL_TURNS
        else:
            factory = Problems if feature.kind == "environment_data" else Counter
            Problems.resets, Problems.group = 0, (feature.pods.get("num_generations", N) if pods else M)
            oversampled = feature.pods.get("oversample_prompts", 1) > 1 and feature.kind == "environment_data"
            Problems.schedule = kept_problems(plan, tokenizer) if oversampled and not pods else None
            kwargs.update(environment_factory=factory, reward_funcs=[environment_state])
            turns = COUNTER_TURNS
    elif feature.kind == "vision":
        kwargs.update(model=str(model_dirs["vision"]))
    else:
        torch.manual_seed(0)
        kwargs.update(model=AutoModelForCausalLM.from_pretrained(model_dirs["text"]),
                      processing_class=AutoTokenizer.from_pretrained(model_dirs["text"]))
    if feature.peft:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer_class = PODSTrainer if pods else GRPOTrainer
    turns = feature.turns or turns
    if feature.kind == "rollout_func":
        tokenizer = kwargs["processing_class"]
        script = Script(tokenizer, turns=turns, plan=plan, offset=feature.offset)
        trainer = trainer_class(**kwargs, rollout_func=script.rollout_func)
    else:
        trainer = trainer_class(**kwargs)
        tokenizer = trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a VLM's processor: its tokenizer
        script = Script(tokenizer, turns=turns, plan=plan, offset=feature.offset)
    return trainer, script


def kept_prompts_dataset(pods, dataset, tokenizer):
    """The rows of ``dataset`` whose prompts PODS kept, in the order it trained on them (with prompt over-sampling,
    GRPO's data is what PODS kept of its larger sample). On several processes, each step's rows are every
    process's kept prompts in rank order: GRPO's sampler then hands each process the prompts it kept."""
    row_of = {}
    for i, row in enumerate(dataset):
        ids = tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True)
        row_of[tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)] = i
    kept = [[row_of[tuple(prompt[mask.bool()].tolist())]
             for prompt, mask in zip(batch["prompt_ids"][::M], batch["prompt_mask"][::M], strict=True)]
            for batch in pods.recorder.batches]  # per step
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    every = [kept]
    if world > 1:
        every = [None] * world
        torch.distributed.all_gather_object(every, kept)
    return dataset.select([row for step in zip(*every, strict=True) for rows in step for row in rows])


def kept_problems(plan: dict, tokenizer) -> list[int]:
    """The problems (``Problems``) of the groups PODS kept, in training order: GRPO's environment resets to them."""
    import re

    kept = []
    for (_, prompt_ids), turns in sorted(plan.items(), key=lambda item: item[0][0][1]):
        problem = int(re.search(r"Problem (\d+):", tokenizer.decode(list(prompt_ids))).group(1))
        kept += [problem] * (len(turns) // M)
    return kept


def run_pods(feature: Feature, tmp_path, model_dirs) -> contract.Run:
    """The PODS run of ``feature`` (n -> m), scripted."""
    trainer, script = build(feature, tmp_path, pods=True, model_dirs=model_dirs)
    return contract.train(trainer, script, patch_generate=feature.kind != "rollout_func")


def run_grpo(feature: Feature, tmp_path, model_dirs, pods: contract.Run) -> contract.Run:
    """GRPOTrainer with m on the rollouts ``pods`` kept (and, with prompt over-sampling, on the prompts it kept)."""
    plan = contract.plan_from(pods.recorder, pods.script.tokenizer)
    trainer, script = build(feature, tmp_path, pods=False, plan=plan, model_dirs=model_dirs)
    if feature.pods.get("oversample_prompts", 1) > 1 and feature.kind != "environment_data":
        # (GRPO's data: the prompts PODS kept of its candidates; an environment's own: Problems.schedule)
        trainer.train_dataset = kept_prompts_dataset(pods, pods.trainer.train_dataset, script.tokenizer)
    return contract.train(trainer, script, patch_generate=feature.kind != "rollout_func")


def run_pair(feature: Feature, tmp_path, model_dirs):
    """PODS first, then GRPO with m on what PODS kept; both runs."""
    pods = run_pods(feature, tmp_path, model_dirs)
    return pods, run_grpo(feature, tmp_path, model_dirs, pods)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tiny_model_dir, tiny_gemma3):
    return {"text": tiny_model_dir, "vision": tiny_gemma3}


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_pods_on_its_kept_rows_is_grpo_with_m(name, tmp_path, model_dirs, contract_rule):
    feature = SUPPORTED[name]
    pods, grpo = run_pair(feature, tmp_path, model_dirs)
    # With candidates over-sampled, GRPO's data is the prompts PODS kept: another dataset size, another `epoch`.
    contract.assert_same(pods, grpo, ignore=("epoch",) if feature.pods.get("oversample_prompts", 1) > 1 else ())
    if feature.pods.get("downsample_rule", "keep_indices") == "keep_indices" and feature.kind == "text":
        # The harness saw what the rule kept: rollouts 1 and 3 of each prompt's group.
        kept = [contract.text_of(c) for c in pods.recorder.tables[0]["completion"][-2 * M:]]
        assert all(t in TURNS for t in kept) and len(set(kept)) > 1, kept
    assert pods.trainer.state.global_step == grpo.trainer.state.global_step == pods.trainer.args.max_steps
    if feature.pods.get("prompt_planner") == "pilot_commit":  # a pilot round, then a commit round, every step
        rows = [row for row in pods.trainer.state.log_history if "pods/rounds" in row]
        assert [row["pods/rounds"] for row in rows] == [2.0] * 4, rows
        assert all(row["pods/prompts_committed"] == row["pods/prompts_sampled"] > 0 for row in rows), rows
        assert sum(row["pods/pilot_passed"] for row in rows) > 0, rows
    if feature.pods.get("rollout_planner") == "auto":  # it chose m for every prompt, every step
        rows = [row for row in pods.trainer.state.log_history if "pods/auto_n_max" in row]
        chosen = [(row["pods/auto_n_max"], row["pods/rollouts_per_prompt_max"]) for row in rows]
        assert chosen == [(M, M)] * 4, chosen
    if name == "tools, results past the completion budget":  # TRL ran the tools and rolled their results back
        assert all(bool(batch["tool_mask"].bool().all()) for batch in pods.recorder.batches)  # no tool tokens kept
        assert any(row.get("tools/call_frequency", 0) > 0 for row in pods.trainer.state.log_history)


def test_the_harness_fails_when_pods_keeps_other_rows(tmp_path, model_dirs, contract_rule):
    """The contract is not vacuous: GRPO scripted with other rollouts than PODS kept differs from PODS."""
    feature = FEATURES["plain"]
    trainer, script = build(feature, tmp_path, pods=True, model_dirs=model_dirs)
    pods = contract.train(trainer, script)
    plan = contract.plan_from(pods.recorder, script.tokenizer)
    swapped = {key: turns[::-1] if key[0][1] == 0 else turns for key, turns in plan.items()}
    trainer, script = build(feature, tmp_path, pods=False, plan=swapped, model_dirs=model_dirs)
    grpo = contract.train(trainer, script)
    with pytest.raises(AssertionError):
        contract.assert_same(pods, grpo)
    assert KEPT_INDICES == (1, 3)


RANK_FEATURES = ["plain", "adaptive rounds, environment, uneven", "environment-owned data",
                 "Knapsack-RL's allocation (rollout_planner)",  # (its ledger gathers both ranks' groups)
                 "GRESO's skip (prompt_planner)",  # (with over-sampling: each rank keeps its own candidates)
                 "Reinforce-Ada's rounds and balanced keep",
                 "Pilot-Commit's pilot and commit (prompt_planner)"]  # (and both ranks' evictions, in one order)


@pytest.mark.slow
def test_the_contract_holds_on_two_processes(tmp_path, tiny_model_dir):
    """The same pairs on 2 gloo ranks (``accelerate launch``): each rank's kept rows, the gathered completions table
    and metrics, the all-reduced gradients. The adaptive rounds differ between the ranks (their prompts do), so a
    rank pads its rounds with rows of fresh environments, which must touch no kept rollout's."""
    import json

    from tests import multiproc

    script = multiproc.SCRIPT.parent / "contract_ranks.py"
    command = [arg if arg != str(multiproc.SCRIPT) else str(script) for arg in multiproc.launch_command()]
    command += [str(tiny_model_dir), str(tmp_path), *RANK_FEATURES]
    env = multiproc.launch_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env["PYTHONPATH"]
    proc = multiproc.start(command, env)
    _, err = multiproc.end(proc, timeout=600)
    assert proc.returncode == 0, err[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, found in enumerate(ranks):
        for name in RANK_FEATURES:
            assert found[name]["same"], f"rank {rank}, {name}: {found[name].get('where')}"
            assert found[name]["steps"] == FEATURES[name].config.get("max_steps", 2)
    knapsack = [found["Knapsack-RL's allocation (rollout_planner)"]["ledger"] for found in ranks]
    assert knapsack[0] == knapsack[1] and knapsack[0]["groups"] == 2 * 2 * 4, knapsack  # 2 ranks x 2 groups x 4 steps
    pilot_commit = [found["Pilot-Commit's pilot and commit (prompt_planner)"]["ledger"] for found in ranks]
    assert pilot_commit[0] == pilot_commit[1] and pilot_commit[0]["groups"] >= 2 * 2 * 4, pilot_commit
    # 2 prompts x N rollouts x 2 steps per rank reset once each; more: a padded round's fresh environments
    resets = [found["adaptive rounds, environment, uneven"]["counter_resets"] for found in ranks]
    assert min(resets) >= 2 * N * 2 and max(resets) > 2 * N * 2, resets


def test_a_log_extra_column_of_another_length_is_refused_in_one_line(tmp_path, model_dirs, contract_rule):
    """A reward function that logs one value for a whole batch cannot be lined up with its rollouts: refused, naming
    the column and the rule (GRPOTrainer would write it beside other completions)."""

    def one_value(completions, log_extra=None, **kwargs):
        log_extra("batch_note", ["one for all"])
        return [contract.digit_value(contract.text_of(c)) for c in completions]

    trainer, script = build(Feature(reward_funcs=(one_value,)), tmp_path, pods=True, model_dirs=model_dirs)
    with pytest.raises(ValueError) as err:
        contract.train(trainer, script)
    assert str(err.value) == ("a reward function logged 1 values in the log_extra column 'batch_note' for 8 "
                              "completions: log_extra takes one value per completion it was given, in their order.")


@pytest.mark.parametrize("scale", ["none", "group"])
def test_the_sampled_baseline_centres_the_kept_rows_on_every_sampled_rollout(scale, tmp_path, model_dirs,
                                                                             contract_rule):
    """``advantage_baseline="sampled"`` (Reinforce-Ada's all-samples baseline) leaves the contract on purpose: each
    kept rollout's advantage is its reward minus the mean of all N rewards sampled for its prompt (divided by their
    std + 1e-4 with scale_rewards=group), in the batch TRL hands the loss and in the completions table."""
    scored = []

    def recorded_reward(completions, **kwargs):
        rewards = turn_reward(completions, **kwargs)
        scored.append(rewards)
        return rewards

    feature = Feature(reward_funcs=(recorded_reward,), pods=dict(advantage_baseline="sampled"),
                      config=dict(scale_rewards=scale))
    trainer, script = build(feature, tmp_path, pods=True, model_dirs=model_dirs)
    run = contract.train(trainer, script)
    sampled = [torch.tensor(r).view(-1, N) for r in scored if len(r) == 2 * N]  # each step's (B, N), as sampled
    assert len(sampled) == len(run.recorder.batches) == 2
    differs = False
    for rewards, batch, table in zip(sampled, run.recorder.batches, run.recorder.tables, strict=True):
        kept = rewards[:, list(KEPT_INDICES)]  # (B, M): the contract's rule keeps rollouts 1 and 3
        expected = kept - rewards.mean(dim=1, keepdim=True)
        local = kept - kept.mean(dim=1, keepdim=True)  # TRL's (kept) baseline
        if scale == "group":
            expected = expected / (rewards.std(dim=1, keepdim=True) + 1e-4)
            local = local / (kept.std(dim=1, keepdim=True) + 1e-4)
        torch.testing.assert_close(batch["advantages"].view(-1, M).cpu(), expected.float())
        torch.testing.assert_close(torch.tensor(table["advantages"][-2 * M:]).view(-1, M), expected.float())
        differs |= not torch.allclose(expected.float(), local.float())
    assert differs  # the test data tells the two baselines apart


def test_the_sampled_baseline_is_refused_where_it_is_undefined(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, num_generations=N, downsample_to=M,
                per_device_train_batch_size=2 * M, report_to="none", advantage_baseline="sampled")
    for extra, message in ((dict(scale_rewards="batch"), "got scale_rewards=.batch"),
                           (dict(multi_objective_aggregation="normalize_then_sum"), "sum_then_normalize"),
                           (dict(advantage_baseline="all"), "must be one of")):
        with pytest.raises(ValueError, match=message) as err:
            PODSConfig(**{**base, **extra})
        assert "\n" not in str(err.value)
