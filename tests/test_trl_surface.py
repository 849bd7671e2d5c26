"""What pods_rl.engines.trl.trainer relies on of TRL (the list at the top of
src/pods_rl/engines/trl/trainer.py), pinned without a model run.

Run on both ends of the supported TRL range (.ci/run repeats this file under trl==1.12). A TRL release that renames
a parameter, reshapes `_generate`'s tuple or stops calling a method we answer fails here, with a message naming
the TRL method and what changed, instead of in the middle of a user's training step.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest
import torch
from transformers import Trainer
from trl import GRPOConfig, GRPOTrainer
from trl.trainer import utils as trl_utils

from pods_rl.engines.trl import trainer as pods_trainer


def parameters(func) -> list[str]:
    """Parameter names of ``func``, ``self`` included, in order."""
    return list(inspect.signature(func).parameters)


def source_tree(func) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(func)))


def calls_on_self(func) -> dict[str, list[ast.Call]]:
    """{method name: [its calls]} for every ``self.<method>(...)`` call in ``func``'s body."""
    calls: dict[str, list[ast.Call]] = {}
    for node in ast.walk(source_tree(func)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
            calls.setdefault(node.func.attr, []).append(node)
    return calls


def assigned_on_self(func) -> set[str]:
    """Attribute names ``func`` assigns on ``self`` (``self.x = ...``, ``self.x: T = ...``)."""
    names = set()
    for node in ast.walk(source_tree(func)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


# ---- the overridden methods: the names and order of their parameters ----------------------------------------
OVERRIDDEN = {
    "_generate": ["self", "prompts"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "get_train_dataloader": ["self"],
    "_get_train_sampler": ["self", "dataset"],
    "_prepare_inputs": ["self", "generation_batch"],
    "create_model_card": ["self", "model_name", "dataset_name", "tags"],
    "evaluate": ["self", "eval_dataset", "ignore_keys", "metric_key_prefix"],
}


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_overridden_grpo_trainer_methods_keep_their_parameters(name):
    assert hasattr(GRPOTrainer, name), (f"GRPOTrainer.{name} is gone: PODSTrainer overrides it "
                                        "(see pods_rl.engines.trl.trainer)")
    got = parameters(getattr(GRPOTrainer, name))
    assert got == OVERRIDDEN[name], (f"GRPOTrainer.{name} now takes {got}, PODSTrainer overrides it as "
                                     f"{OVERRIDDEN[name]}: update the override in pods_rl.engines.trl.trainer")
    ours = parameters(getattr(pods_trainer.PODSTrainer, name))
    assert ours == OVERRIDDEN[name], f"PODSTrainer.{name} takes {ours}, TRL's takes {OVERRIDDEN[name]}"


def test_get_train_sampler_dataset_defaults_to_none():
    default = inspect.signature(GRPOTrainer._get_train_sampler).parameters["dataset"].default
    assert default is None, f"GRPOTrainer._get_train_sampler's dataset now defaults to {default!r}, not None"


def test_save_model_takes_output_dir_and_internal_call():
    got = parameters(Trainer.save_model)
    assert got[:3] == ["self", "output_dir", "_internal_call"], (
        f"transformers Trainer.save_model now takes {got}; PODSTrainer.save_model passes (output_dir, _internal_call)")


def test_trainer_get_dataloader_takes_what_get_train_dataloader_passes():
    got = parameters(Trainer._get_dataloader)
    for name in ("dataset", "description", "batch_size", "sampler_fn", "is_training"):
        assert name in got, (f"transformers Trainer._get_dataloader has no parameter {name!r} any more ({got}); "
                             "PODSTrainer.get_train_dataloader passes it")


# ---- `_generate`: the 8-tuple --------------------------------------------------------------------------------
def test_generate_returns_the_8_tuple_we_name():
    """trainer_step.Generated names GRPOTrainer._generate's values; each of TRL's `return` tuples must hold the same
    names in the same order (the step reads them by name)."""
    from pods_rl.engines.trl.step import Generated

    returns = [node.value for node in ast.walk(source_tree(GRPOTrainer._generate))
               if isinstance(node, ast.Return) and node.value is not None]
    assert returns, "GRPOTrainer._generate has no return statement with a value any more"
    for value in returns:
        assert isinstance(value, ast.Tuple), (
            f"GRPOTrainer._generate now returns {ast.unparse(value)}, not a tuple; PODSTrainer names its 8 values")
        names = [ast.unparse(element) for element in value.elts]
        assert names == list(Generated._fields), (f"GRPOTrainer._generate now returns {names}; "
                                                  f"pods_rl.engines.trl.step.Generated names {list(Generated._fields)}")


def test_generate_and_score_completions_unpacks_the_8_tuple():
    unpackings = [node.targets[0] for node in ast.walk(source_tree(GRPOTrainer._generate_and_score_completions))
                  if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                  and ast.unparse(node.value.func) == "self._generate"]
    assert unpackings, ("GRPOTrainer._generate_and_score_completions no longer assigns self._generate(...)'s "
                        "result; PODSTrainer answers that call with the kept rollouts")
    target = unpackings[0]
    assert isinstance(target, ast.Tuple) and len(target.elts) == 8, (
        f"GRPOTrainer._generate_and_score_completions now unpacks _generate into {ast.unparse(target)}, not 8 names")


# ---- `_generate_and_score_completions`: what our override relies on it to do ------------------------------
def test_generate_and_score_completions_calls_what_we_answer():
    calls = calls_on_self(GRPOTrainer._generate_and_score_completions)
    for name in ("_generate", "_calculate_rewards"):
        assert name in calls, (f"GRPOTrainer._generate_and_score_completions no longer calls self.{name}(...): "
                               "PODSTrainer answers that call from the stash, and would now compute on every row")
    call = calls["_calculate_rewards"][0]
    passed = [ast.unparse(a) for a in call.args] + [k.arg for k in call.keywords]
    assert len(passed) == 4, (f"GRPOTrainer._generate_and_score_completions now calls self._calculate_rewards with "
                              f"{passed}; PODSTrainer._calculate_rewards takes (inputs, prompts, completions, "
                              "completion_ids_list)")


def test_generate_and_score_completions_groups_by_num_generations_and_returns_advantages():
    text = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self.num_generations" in text, (
        "GRPOTrainer._generate_and_score_completions no longer groups rewards by self.num_generations; PODSTrainer "
        "sets it to m around the call so that TRL groups the kept rows")
    assert '"advantages"' in text, (
        "GRPOTrainer._generate_and_score_completions' output has no 'advantages' key any more; PODSTrainer "
        "replaces it with the advantages of the kept rows")


def test_generate_and_score_completions_prepares_prompts_before_generate():
    """PODSTrainer._rollout_prompts lets TRL's own code prepare the prompts and stops it at `_generate`: everything
    that shapes a rollout (environments drawn from the pool and reset, tool dicts, images) must come before it."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    generate_at = source.index("self._generate(prompts)")
    for step in ("self._environment_pool[", ".reset(", "prepare_multimodal_messages(", "self._sync_tool_dicts"):
        assert step in source and source.index(step) < generate_at, (
            f"GRPOTrainer._generate_and_score_completions no longer does {step!r} before self._generate(prompts); "
            "PODSTrainer._rollout_prompts and adapter.kept_environments rely on that order")
    assert "self._batch_environments = " in source and "pool_cursor" in source, (
        "GRPOTrainer no longer draws each row's environment from self._environment_pool with a cursor per name; "
        "pods_rl.engines.trl.adapter.kept_environments hands the kept rows their own instances through that pool")
    assert "x.get(\"prompt\"" in source.replace("'", '"'), (
        "GRPOTrainer no longer reads each row's prompt from its 'prompt' field; the kept rows carry their prepared "
        "prompt there")


# ---- where TRL has no hook: the adapter's two ways into TRL's step (docs/guides/trl.md, "What TRL would need") ----
def grpo_methods_with(text: str) -> dict[str, int]:
    """{GRPOTrainer method: how often its source holds ``text``} for GRPOTrainer's own methods that hold it."""
    sources = {name: inspect.getsource(value) for name, value in vars(GRPOTrainer).items() if inspect.isfunction(value)}
    return {name: source.count(text) for name, source in sources.items() if text in source}


def test_trl_prepares_the_prompts_only_inline_in_its_step():
    """adapter.trl_prepared_prompts stops TRL's step at `_generate` because no GRPOTrainer method prepares the prompts
    alone. A TRL that moves the preparation into a method of its own fails here: call that method there instead."""
    for text in ("pool_cursor", "self._sync_tool_dicts = []", ".reset("):
        assert set(grpo_methods_with(text)) == {"_generate_and_score_completions"}, (
            f"GRPOTrainer now does {text!r} in {sorted(grpo_methods_with(text))}: if a method prepares the prompts "
            "alone, pods_rl.engines.trl.adapter.trl_prepared_prompts should call it instead of stopping TRL's step")


def test_trl_builds_its_batch_only_on_rollouts_it_generates_once():
    """adapter.trl_step_on answers `_generate` and `_calculate_rewards` (each called once) because TRL builds its batch
    (padding, log-probs, advantages) only in the method that generates. A TRL that builds it from given rollouts in a
    method of its own fails here: call that method instead of answering the two calls."""
    assert grpo_methods_with("self._generate(prompts)") == {"_generate_and_score_completions": 1}
    assert grpo_methods_with("self._calculate_rewards(") == {"_generate_and_score_completions": 1}
    assert set(grpo_methods_with('"advantages": advantages')) == {"_generate_and_score_completions"}, (
        "GRPOTrainer now builds its batch's advantages in another method: pods_rl.engines.trl.adapter.trl_step_on "
        "should call it on the kept rows instead of answering _generate / _calculate_rewards")


def test_eval_batch_check_message_we_reword():
    with pytest.raises(ValueError, match="used for evaluation"):
        GRPOConfig(output_dir="unused", per_device_train_batch_size=2, num_generations=2, report_to="none",
                   use_cpu=True, bf16=False, per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=1)


# ---- attributes GRPOTrainer sets that PODSTrainer reads -----------------------------------------------------
TRAINER_ATTRIBUTES = ["num_generations", "num_iterations", "shuffle_dataset", "reward_weights", "scale_rewards",
                      "_metrics", "_tokenizer", "environment_factories", "tools", "vllm_generation",
                      "num_generations_eval", "multi_objective_aggregation", "_environment_pool", "environments",
                      "reward_func_names", "max_tool_calling_iterations", "_pending_extra_logs", "_pending_metrics"]


@pytest.mark.parametrize("name", TRAINER_ATTRIBUTES)
def test_grpo_trainer_sets_the_attributes_we_read(name):
    assert name in assigned_on_self(GRPOTrainer.__init__), (
        f"GRPOTrainer.__init__ no longer sets self.{name}; pods_rl.engines.trl.trainer reads it")


# ---- the adapter: every private name of TRL's the step uses is read or set there, and pinned here ----------------
ADAPTER_PRIVATE_NAMES = {  # name -> the GRPOTrainer method that sets it (pinned below)
    "_metrics": "__init__", "_logs": "__init__", "_pending_extra_logs": "__init__", "_pending_metrics": "__init__",
    "_tokenizer": "__init__", "_environment_pool": "__init__", "_batch_environments": "_generate_and_score_completions",
    "_sync_tool_dicts": "_generate_and_score_completions", "_async_tool_dicts": "_generate_and_score_completions",
    "_llm_weights_sleeping": None,  # VLLMGeneration's (test_vllm_sleep_mode_is_what_the_rounds_defer)
}


def private_names_used(path) -> set[str]:
    """Underscore attributes ``path`` reads or sets on ``self``, ``trainer`` or ``generation``, or names as strings
    (for getattr / setattr)."""
    nodes = list(ast.walk(ast.parse(path.read_text())))
    return {node.attr for node in nodes
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name) and node.value.id in ("self", "trainer", "generation")} | {
        node.value for node in nodes if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.value.isidentifier() and node.value.startswith("_") and not node.value.startswith("__")}


def defined_names(path) -> set[str]:
    """The methods and class attributes ``path``'s classes define (pods-rl's own names)."""
    names = set()
    for cls in (node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def test_the_step_reaches_trls_private_state_only_through_the_adapter():
    """engines/trl/adapter.py is the one module of the step that reads or sets GRPOTrainer's private attributes; each
    one it uses is in ADAPTER_PRIVATE_NAMES, and TRL still sets it where that says."""
    from pathlib import Path

    engine = Path(pods_trainer.__file__).parent
    own = set().union(*(defined_names(path) for path in engine.glob("*.py")))
    own |= assigned_on_self(pods_trainer.PODSTrainer.__init__) | assigned_on_self(pods_trainer.PODSTrainer._set_up_pods)
    used = {module: private_names_used(engine / f"{module}.py") - own for module in ("step", "rounds", "rows")}
    assert not any(used.values()), f"GRPOTrainer's private names used outside engines/trl/adapter.py: {used}"
    assert private_names_used(engine / "adapter.py") - own == set(ADAPTER_PRIVATE_NAMES)
    for name, method in ADAPTER_PRIVATE_NAMES.items():
        if method is not None:
            assert name in assigned_on_self(getattr(GRPOTrainer, method)), (
                f"GRPOTrainer.{method} no longer sets self.{name}; pods_rl.engines.trl.adapter uses it")


def test_eos_token_ids_are_what_this_trl_counts_as_a_finish():
    """pods_rl.engines.trl.adapter.eos_token_ids: TRL >= 1.15 keeps GRPOTrainer.eos_token_ids and its `_generate`
    counts a completion ending in any of them (or padding) as finished; earlier TRLs count only the tokenizer's EOS."""
    from pods_rl.engines.trl.adapter import TRL_KEEPS_EOS_TOKEN_IDS

    generate = inspect.getsource(GRPOTrainer._generate)
    if TRL_KEEPS_EOS_TOKEN_IDS:
        assert "eos_token_ids" in assigned_on_self(GRPOTrainer.__init__)
        assert "eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]" in generate
    else:
        assert "eos_token_ids" not in assigned_on_self(GRPOTrainer.__init__)
        assert "eos_and_pad = [self._tokenizer.eos_token_id, self._tokenizer.pad_token_id]" in generate


def test_reward_functions_log_through_the_buffers_the_step_cuts_to_the_kept_rows():
    """log_extra / log_metric reach reward functions as the trainer's methods, which fill the buffers that
    TRL's `_generate_and_score_completions` flushes (pods_rl.engines.trl.adapter.take_extra_logs / metrics_logged)."""
    rewards = inspect.getsource(GRPOTrainer._calculate_rewards)
    assert 'reward_kwargs["log_extra"] = self._log_completion_extra' in rewards
    assert 'reward_kwargs["log_metric"] = self._log_metric' in rewards
    assert "self._pending_extra_logs[column].extend(values)" in inspect.getsource(GRPOTrainer._log_completion_extra)
    assert "self._pending_metrics[name].append(value)" in inspect.getsource(GRPOTrainer._log_metric)
    flush = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self._pending_extra_logs.clear()" in flush and "self._pending_metrics.clear()" in flush


def test_the_tool_loop_reads_each_rollouts_tool_dicts_by_position():
    """The adaptive rounds set the round's rows' tool dicts (pods_rl.engines.trl.adapter.round_rollout_state) and count
    a failed call per rollout (pods_rl.engines.trl.adapter.count_tool_exceptions): TRL's loop looks each rollout's tools
    up by its position in the batch it generates, at most max_tool_calling_iterations times, and counts a raised call
    as a failure."""
    loop = inspect.getsource(GRPOTrainer._tool_call_loop)
    assert "self._sync_tool_dicts[idx_with_tool]" in loop and "self._async_tool_dicts[idx_with_tool]" in loop
    assert "iteration_num < self.max_tool_calling_iterations" in loop
    assert "except Exception as e:" in loop and "tool_failure_count += 1" in loop
    assert 'raise ValueError(f"Tool {name} not found.")' in loop
    prepare = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self._sync_tool_dicts = []" in prepare and "self._async_tool_dicts = []" in prepare


def test_environment_owned_data_gets_a_placeholder_dataset_of_one_round():
    """PODSTrainer replaces TRL's placeholder (a round of GRPO's prompts, none when a round keeps fewer rows than n)
    with one of PODS's prompts per round, each row TRL's own empty prompt (PLACEHOLDER_PROMPT), which
    _generate_and_score_completions also uses for a row without a prompt."""
    from pods_rl.engines.trl.trainer import PLACEHOLDER_PROMPT

    init = inspect.getsource(GRPOTrainer.__init__)
    assert "if train_dataset is None:" in init
    assert "num_placeholder_rows = args.generation_batch_size // args.num_generations" in init
    assert PLACEHOLDER_PROMPT == [{"role": "user", "content": ""}]
    assert 'Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * num_placeholder_rows})' in init
    prepare = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert 'x.get("prompt", [{"role": "user", "content": ""}])' in prepare


def test_vllm_sleep_mode_is_what_the_rounds_defer():
    """pods_rl.engines.trl.adapter.one_sleep_per_step: TRL's VLLMGeneration (colocate, sleep mode) sleeps its engine
    (`self.llm.sleep`) after `generate` and notes `_llm_weights_sleeping`, which `generate` reads to push the
    weights again; the rounds defer the sleep and clear the flag."""
    from trl.generation.vllm_generation import VLLMGeneration

    generate = inspect.getsource(VLLMGeneration.generate)
    assert "self.llm.sleep(level=2)" in generate and "self._llm_weights_sleeping = True" in generate
    assert "self.enable_sleep_mode and self._llm_weights_sleeping" in generate
    assert "enable_sleep_mode" in assigned_on_self(VLLMGeneration.__init__)


def test_vllm_generation_holds_its_engine_in_llm():
    from trl.generation.vllm_generation import VLLMGeneration

    assert "llm" in assigned_on_self(VLLMGeneration._init_vllm), (
        "TRL's VLLMGeneration no longer keeps its colocated engine in self.llm; PODSTrainer.release_vllm_engine "
        "drops it there")
    assert "LLM(" in inspect.getsource(GRPOTrainer.__init__) or "VLLMGeneration(" in inspect.getsource(
        GRPOTrainer.__init__), "GRPOTrainer.__init__ no longer builds the vLLM engine; PODSTrainer wraps it in the " \
        "CPU workaround (pods_rl.engines.vllm.cpu.reloadable_cpu_weights)"


def test_the_colocated_engine_is_built_through_the_module_name_with_max_num_seqs():
    """PODSTrainer sizes the colocated engine by replacing ``trl.trainer.grpo_trainer.VLLMGeneration`` while
    GRPOTrainer.__init__ runs and raising its ``max_num_seqs`` keyword (pods_rl.engines.trl.trainer)."""
    import trl.trainer.grpo_trainer as grpo_trainer
    from trl.generation.vllm_generation import VLLMGeneration

    assert grpo_trainer.VLLMGeneration is VLLMGeneration
    source = inspect.getsource(GRPOTrainer.__init__)
    call = source[source.index("VLLMGeneration("):][:1500]  # the call's keyword arguments
    assert "max_num_seqs=" in call, (
        "GRPOTrainer.__init__ no longer passes max_num_seqs to VLLMGeneration; PODSTrainer sizes the engine there")
    assert "max_num_seqs" in inspect.signature(VLLMGeneration.__init__).parameters
    assert "max_num_seqs=self.max_num_seqs" in inspect.getsource(VLLMGeneration._init_vllm)


def test_metrics_are_a_dict_of_lists_per_mode():
    assert '{"train": defaultdict(list)' in inspect.getsource(GRPOTrainer.__init__).replace("'", '"'), (
        "GRPOTrainer._metrics is no longer {'train': defaultdict(list), ...}; PODSTrainer appends to "
        "self._metrics['train'][name]")


def test_model_card_class_attributes():
    assert {"title", "id", "citation"} <= set(GRPOTrainer._paper), (
        f"GRPOTrainer._paper now holds {sorted(GRPOTrainer._paper)}; "
        "the PODS model card cites it by title, id, citation")
    assert isinstance(GRPOTrainer._tag_names, list), "GRPOTrainer._tag_names is no longer a list of tags"
    for name in ("get_config_model_id", "get_comet_experiment_url", "get_trackio_space_url"):
        assert hasattr(trl_utils, name), f"trl.trainer.utils.{name} is gone; PODSTrainer's model card calls it"


# ---- helpers of trl.trainer.utils ----------------------------------------------------------------------------
def test_repeat_sampler_takes_our_arguments_and_repeats_groups():
    got = parameters(trl_utils.RepeatSampler.__init__)
    want = ["self", "data_source", "mini_repeat_count", "batch_size", "repeat_count", "shuffle", "seed"]
    assert got == want, f"trl RepeatSampler.__init__ now takes {got}, PODSTrainer._get_train_sampler passes {want}"
    sampler = trl_utils.RepeatSampler(data_source=list(range(4)), mini_repeat_count=3, batch_size=2,
                                      repeat_count=1, shuffle=False, seed=0)
    assert list(sampler) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], (
        "trl RepeatSampler no longer yields each prompt mini_repeat_count times in a row (GRPO's whole groups)")
    # PODS's: one row per prompt (its _prepare_inputs repeats each n times), each round's prompts once per micro-step
    sampler = trl_utils.RepeatSampler(data_source=list(range(4)), mini_repeat_count=1, batch_size=2,
                                      repeat_count=2, shuffle=False, seed=0)
    assert list(sampler) == [0, 1, 0, 1, 2, 3, 2, 3], (
        "trl RepeatSampler no longer repeats each batch of prompts repeat_count times; PODSTrainer's loader needs it")


def test_repeat_iterable_dataset_takes_our_arguments():
    got = parameters(trl_utils.repeat_iterable_dataset)
    want = ["dataset", "mini_repeat_count", "batch_size", "repeat_count"]
    assert got == want, f"trl repeat_iterable_dataset now takes {got}, PODSTrainer.get_train_dataloader passes {want}"


def test_nanstd_is_the_std_that_ignores_nan():
    assert parameters(trl_utils.nanstd)[0] == "tensor", "trl nanstd's first parameter is no longer the tensor"
    value = trl_utils.nanstd(torch.tensor([1.0, float("nan"), 3.0]))
    assert torch.isclose(value, torch.tensor(2.0) ** 0.5), (
        f"trl nanstd([1, nan, 3]) is {value}, not the unbiased std of [1, 3]; PODS logs pods/reward_*_std with it")


# ---- GRPOConfig ----------------------------------------------------------------------------------------------
CONFIG_FIELDS = ["num_generations", "num_generations_eval", "per_device_eval_batch_size", "generation_batch_size",
                 "steps_per_generation", "per_device_train_batch_size",
                 "num_iterations", "multi_objective_aggregation", "scale_rewards", "reward_weights", "seed", "beta",
                 "loss_type", "learning_rate", "hub_model_id", "output_dir", "shuffle_dataset",
                 "max_completion_length", "use_vllm", "vllm_mode", "use_cpu"]


@pytest.mark.parametrize("name", CONFIG_FIELDS)
def test_grpo_config_has_the_fields_we_read(name):
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert name in fields, f"trl.GRPOConfig has no field {name!r} any more; pods_rl reads it"


def test_grpo_config_rejects_a_batch_of_partial_groups_with_the_message_we_reword():
    with pytest.raises(ValueError, match="divisible by num_generations"):
        GRPOConfig(output_dir="unused", per_device_train_batch_size=3, num_generations=2, report_to="none",
                   use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match=r"not a multiple of downsample_to \(m=2\)"):
        pods_trainer.PODSConfig(output_dir="unused", per_device_train_batch_size=3, num_generations=4,
                                downsample_to=2, report_to="none", use_cpu=True, bf16=False)


@pytest.mark.parametrize("name, params", [("_load_from_checkpoint", ["resume_from_checkpoint", "model"]),
                                          ("_load_optimizer_and_scheduler", ["checkpoint"]),
                                          ("_load_scaler", ["checkpoint"]), ("_load_rng_state", ["checkpoint"])])
def test_transformers_reads_checkpoints_through_the_loaders_we_wrap(name, params):
    """PODSTrainer gives these loaders' errors a type of their own (runlog.CheckpointUnreadable): they must still
    be the methods the Trainer calls when it resumes, with these parameters."""
    import transformers.trainer
    from transformers import Trainer

    assert list(inspect.signature(getattr(Trainer, name)).parameters)[1:] == params
    assert f"self.{name}(resume_from_checkpoint" in inspect.getsource(transformers.trainer)


def test_checkpoints_are_written_where_the_ledger_goes():
    """PODSTrainer._save_checkpoint writes the prompt ledger (pods_ledger.pt) into the checkpoint just saved:
    transformers names it <output dir of the trial>/checkpoint-<global step>, and GRPOTrainer's override keeps the
    parameters."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    assert parameters(Trainer._save_checkpoint) == ["self", "model", "trial"]
    assert parameters(GRPOTrainer._save_checkpoint) == ["self", "model", "trial"]
    source = inspect.getsource(Trainer._save_checkpoint)
    assert 'checkpoint_folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"' in source
    assert "run_dir = self._get_output_dir(trial=trial)" in source
    assert PREFIX_CHECKPOINT_DIR == "checkpoint"
