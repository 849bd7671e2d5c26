"""Drop-in conformance: GRPOTrainer's features keep working when PODS down-samples (m < n).

Each test trains for one step (or evaluates) a tiny model built here, on CPU, in seconds, with n = 2m unless it says
otherwise. The table in docs/guides/trl-features.md names the test that shows each feature. CI runs this file on both
ends of TRL_RANGE (.ci/run), and .ci/trl-next.sh runs it against a newer TRL before users meet it.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import pytest
import torch
import trl
from datasets import Dataset, IterableDataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from trl.trainer.utils import nanstd

from pods_rl import downsample, register_rule
from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer

N, M = 4, 2  # rollouts sampled per prompt, kept per prompt


# ---- shared pieces -----------------------------------------------------------------------------------------------

def text_of(completion) -> str:
    """A completion's text, conversational or not (the last assistant message's content)."""
    if isinstance(completion, str):
        return completion
    contents = [message.get("content") for message in completion if message.get("role") == "assistant"]
    return " ".join(c if isinstance(c, str) else "" for c in contents if c)


def byte_reward(completions, **kwargs):
    """Varies within every group of a random model's completions: the byte sum of the text, mod 7."""
    return [float(sum(text_of(c).encode()) % 7) for c in completions]


def vowel_reward(completions, **kwargs):
    """A second objective on another scale: 100 x the fraction of vowels."""
    texts = [text_of(c) for c in completions]
    return [100.0 * sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]


def conversational(num=8):
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+{i * 3}="}] for i in range(num)]})


def standard(num=8):
    return Dataset.from_dict({"prompt": [f"{i}+{i * 3}=" for i in range(num)]})


def pods_config(tmp_path, **overrides) -> PODSConfig:
    """One optimizer step of 2 groups of M kept rollouts, sampled N per prompt."""
    args = dict(output_dir=str(tmp_path / "out"), use_cpu=True, seed=5, learning_rate=5e-2, max_steps=1,
                max_completion_length=6, num_generations=N, downsample_to=M, per_device_train_batch_size=2 * M,
                logging_steps=1, report_to="none", save_strategy="no", beta=0.0, bf16=False,
                dataloader_num_workers=0)
    args.update(overrides)
    return PODSConfig(**args)


def trained_params_moved(trainer) -> list[str]:
    """Train; return the names of the trainable parameters the step changed (asserting the loss is finite)."""
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    losses = [row["train_loss"] for row in trainer.state.log_history if "train_loss" in row]
    assert losses and all(math.isfinite(x) for x in losses), trainer.state.log_history
    return [n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(before[n], p)]


def capture_outputs(trainer) -> list[dict]:
    """Record what every ``_generate_and_score_completions`` call hands to the loss."""
    outputs, original = [], trainer._generate_and_score_completions

    def spy(inputs):
        output = original(inputs)
        outputs.append(output)
        return output

    trainer._generate_and_score_completions = spy
    return outputs


def make_trainer(tmp_path, model_dir, reward_funcs=(byte_reward,), dataset=None, **overrides) -> PODSTrainer:
    return PODSTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=list(reward_funcs),
                       args=pods_config(tmp_path, **overrides), train_dataset=dataset or conversational(),
                       processing_class=AutoTokenizer.from_pretrained(model_dir))


# ---- (6) the GRPOConfig features, one optimizer step each at m < n -----------------------------------------------

CONFIG_FEATURES = {
    **{f"loss_type={loss}": dict(loss_type=loss)
       for loss in ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")},
    "beta (reference model)": dict(beta=0.04),
    "sync_ref_model": dict(beta=0.04, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5),
    "use_bias_correction_kl": dict(beta=0.04, use_bias_correction_kl=True),
    "num_iterations": dict(num_iterations=2, max_steps=2),
    "steps_per_generation": dict(steps_per_generation=2, per_device_train_batch_size=M, max_steps=2),
    "gradient_accumulation_steps": dict(gradient_accumulation_steps=2, per_device_train_batch_size=M),
    "scale_rewards=batch": dict(scale_rewards="batch"),
    "scale_rewards=none": dict(scale_rewards="none"),
    "reward_weights": dict(reward_weights=[0.3]),
    "mask_truncated_completions": dict(mask_truncated_completions=True, max_completion_length=24),
    "top_entropy_quantile": dict(top_entropy_quantile=0.5),
    "entropy_coef": dict(entropy_coef=0.01),
    "importance_sampling_level=sequence": dict(importance_sampling_level="sequence"),
    "epsilon_high": dict(epsilon_high=0.28),
    "delta (two-sided clipping)": dict(delta=1.5),
    "off_policy_mask_threshold": dict(off_policy_mask_threshold=0.5),
    "sampling knobs": dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.01, repetition_penalty=1.1),
    "generation_kwargs": dict(generation_kwargs={"no_repeat_ngram_size": 2}),
    "chat_template_kwargs": dict(chat_template_kwargs={"unused_flag": True}),
    "pad_to_multiple_of": dict(pad_to_multiple_of=8),
    "cast_lm_head_to_fp32": dict(cast_lm_head_to_fp32=True),
    "disable_dropout": dict(disable_dropout=True),
    "log_completions": dict(log_completions=True, num_completions_to_print=1),
    "oversample_prompts": dict(oversample_prompts=2.0),
    "downsample_tiebreak=shorter": dict(downsample_tiebreak="shorter"),
    "downsample_rule=random": dict(downsample_rule="random"),
    "downsample_rule=max_reward": dict(downsample_rule="max_reward"),
}


@pytest.mark.parametrize("overrides", list(CONFIG_FEATURES.values()), ids=list(CONFIG_FEATURES))
def test_config_feature_trains_at_m_below_n(tmp_path, tiny_model_dir, overrides):
    trainer = make_trainer(tmp_path, tiny_model_dir, **overrides)
    assert trainer.args.is_pods
    if overrides.get("mask_truncated_completions"):  # a random model never stops: make every other rollout stop
        with patch.object(trainer.model, "generate", side_effect=stopping_early(trainer)):
            assert trained_params_moved(trainer), "the step changed no weight"
    else:
        assert trained_params_moved(trainer), "the step changed no weight"


def stopping_early(trainer):
    """``model.generate`` that ends every other rollout with EOS after 3 tokens (the rest run to the limit)."""
    original, eos = trainer.model.generate, trainer.processing_class.eos_token_id

    def generate(*args, **kwargs):
        output = original(*args, **kwargs)
        output[::2, kwargs["input_ids"].shape[1] + 2] = eos
        return output

    return generate


def test_normalize_then_sum_trains_two_objectives(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(byte_reward, vowel_reward),
                           multi_objective_aggregation="normalize_then_sum", reward_weights=[1.0, 0.5])
    assert trained_params_moved(trainer)


def test_lora_peft_config(tmp_path, tiny_model_dir):
    from peft import LoraConfig

    trainer = PODSTrainer(model=str(tiny_model_dir), reward_funcs=[byte_reward], args=pods_config(tmp_path),
                          train_dataset=conversational(),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    moved = trained_params_moved(trainer)
    assert moved and all("lora" in name for name in moved)


def test_standard_prompts_and_iterable_dataset(tmp_path, tiny_model_dir):
    iterable = IterableDataset.from_generator(lambda: iter({"prompt": f"{i}*{i}="} for i in range(64)))
    for i, dataset in enumerate((standard(), iterable)):
        trainer = make_trainer(tmp_path / str(i), tiny_model_dir, dataset=dataset)
        assert trained_params_moved(trainer)


def test_reward_model_and_async_reward_function(tmp_path, tiny_model_dir):
    from transformers import Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    reward_model = AutoModelForSequenceClassification.from_config(config)

    async def async_reward(completions, **kwargs):
        return byte_reward(completions)

    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          reward_funcs=[reward_model, async_reward], args=pods_config(tmp_path),
                          train_dataset=conversational(), processing_class=tokenizer,
                          reward_processing_classes=[tokenizer, None])
    assert trained_params_moved(trainer)


def test_rollout_func_with_extra_fields(tmp_path, tiny_model_dir):
    """A custom rollout function (TRL's rollout_func): its extra fields reach the rewards of the rollouts they
    belong to, and the kept rows keep theirs."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def rollout_func(prompts, trainer):
        rows = []
        for j, prompt in enumerate(prompts):
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            rows.append((tokenizer.encode(text), tokenizer.encode(str(j % N) * (1 + j % N))))
        return {"prompt_ids": [p for p, _ in rows], "completion_ids": [c for _, c in rows],
                "logprobs": [[-1.0] * len(c) for _, c in rows], "rollout_index": [j % N for j in range(len(rows))]}

    def index_reward(completions, rollout_index, **kwargs):
        assert [text_of(c) for c in completions] == [str(j) * (1 + j) for j in rollout_index]
        return [float(j) for j in rollout_index]

    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[index_reward],
                          args=pods_config(tmp_path, downsample_rule="max_reward"), train_dataset=conversational(),
                          processing_class=tokenizer, rollout_func=rollout_func)
    outputs = capture_outputs(trainer)
    assert trained_params_moved(trainer)
    kept = tokenizer.batch_decode(outputs[0]["completion_ids"], skip_special_tokens=True)
    assert sorted(k.strip() for k in kept) == ["222", "222", "3333", "3333"]  # max_reward keeps rollouts 3 and 2


# ---- (3) evaluation: m completions per prompt unless num_generations_eval says otherwise --------------------------

def recording(rewards_seen: list):
    def reward(completions, prompts, **kwargs):
        rewards_seen.append([text_of(p) if not isinstance(p, str) else p for p in prompts])
        return byte_reward(completions)
    return reward


@pytest.mark.parametrize("num_generations_eval", [None, 2])
def test_eval_strategy_and_eval_on_start_sample_m_per_prompt(tmp_path, tiny_model_dir, num_generations_eval):
    """n = 6, m = 3, eval batch 3: GRPO with 6 would be refused; PODS evaluates 3 per prompt (or
    num_generations_eval), during training and before it."""
    seen = []
    k = num_generations_eval or 3
    trainer = PODSTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[recording(seen)],
        args=pods_config(tmp_path, num_generations=6, downsample_to=3, per_device_train_batch_size=3,
                         per_device_eval_batch_size=3 if k == 3 else 4, eval_strategy="steps", eval_steps=1,
                         eval_on_start=True, num_generations_eval=num_generations_eval),
        train_dataset=conversational(), eval_dataset=conversational(4),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.train()
    evals = [row for row in trainer.state.log_history if "eval_reward" in row]
    assert len(evals) == 2  # on start and after the step
    eval_batches = [prompts for prompts in seen if len(prompts) != 6]  # training scores 6 per prompt
    assert eval_batches and all(len(p) % k == 0 for p in eval_batches)
    for prompts in eval_batches:  # whole groups of k copies of one prompt
        assert all(len(set(prompts[i:i + k])) == 1 for i in range(0, len(prompts), k))


def test_evaluate_with_a_dict_of_eval_datasets(tmp_path, tiny_model_dir):
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[byte_reward],
                          args=pods_config(tmp_path, per_device_eval_batch_size=2),
                          train_dataset=conversational(),
                          eval_dataset={"a": conversational(2), "b": standard(2)},
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    metrics = trainer.evaluate()
    assert "eval_a_loss" in metrics and "eval_b_loss" in metrics
    rows = [row for row in trainer.state.log_history if "eval_reward" in row]
    assert len(rows) == 2 and all(math.isfinite(row["eval_reward"]) for row in rows)  # one per dataset
    assert trainer.num_generations_eval == M


def test_impossible_eval_batches_are_refused_in_one_line(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match=r"per_device_eval_batch_size \(3\).*make per_device_eval_batch_size a "
                                         r"multiple of 2") as err:
        pods_config(tmp_path, per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=1)
    assert "\n" not in str(err.value)
    # Without eval_strategy TRL checks nothing; trainer.evaluate() refuses before generating anything.
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[byte_reward],
                          args=pods_config(tmp_path, per_device_eval_batch_size=3, num_generations_eval=2),
                          train_dataset=conversational(), eval_dataset=conversational(2),
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    with patch.object(trainer.model, "generate") as generate, \
            pytest.raises(ValueError, match="num_generations_eval to a divisor"):
        trainer.evaluate()
    generate.assert_not_called()


# ---- (5) GRPOTrainer's defaults ----------------------------------------------------------------------------------

def test_args_none_builds_a_default_config(tmp_path, tiny_model_dir, monkeypatch):
    """As GRPOTrainer: args=None builds the default config, named after the model. GRPOConfig's defaults (bf16)
    need a bf16 GPU; without one both trainers refuse with transformers' same one line."""
    from trl import GRPOTrainer

    monkeypatch.chdir(tmp_path)

    def build(cls, positional=False):
        try:
            if positional:
                return cls(str(tiny_model_dir), byte_reward, None, conversational()), None
            return cls(model=str(tiny_model_dir), reward_funcs=byte_reward, args=None,
                       train_dataset=conversational()), None
        except ValueError as err:
            return None, str(err)

    assert build(PODSTrainer)[1] == build(GRPOTrainer)[1]  # the same outcome on this machine
    with patch("transformers.training_args.is_torch_bf16_gpu_available", return_value=True):  # as on a bf16 GPU
        for trainer, error in (build(PODSTrainer), build(PODSTrainer, positional=True)):
            assert error is None and isinstance(trainer.args, PODSConfig)
            assert trainer.args.output_dir.endswith(f"{Path(tiny_model_dir).name}-PODS")
            assert not trainer.args.is_pods  # m defaults to n: plain GRPO until downsample_to is set


def test_a_trainer_built_without_init_generates_as_grpo():
    """TRL's rollout-dispatch test builds its trainer with object.__new__: our overrides must not need __init__."""
    trainer = object.__new__(PODSTrainer)
    trainer.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True, gather=lambda t: t)
    trainer.args = SimpleNamespace(report_to=[])
    trainer.model = SimpleNamespace(training=True)
    trainer.state = SimpleNamespace(global_step=2, num_input_tokens_seen=0)
    trainer._last_loaded_step = 1
    trainer.use_vllm = False
    trainer.use_transformers_continuous_batching = False
    trainer.processing_class = SimpleNamespace(batch_decode=MagicMock(return_value=["decoded"]))
    trainer._tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    trainer.eos_token_ids = [2]
    trainer.tools = None
    trainer._metrics = {"train": __import__("collections").defaultdict(list)}
    trainer.rollout_func = MagicMock(return_value={"prompt_ids": [[1]], "completion_ids": [[2]],
                                                   "logprobs": [[-0.1]], "env_mask": [[1]]})
    result = trainer._generate(["prompt"])
    assert result[0] == [[1]] and result[1] == [[2]] and result[2] == [[1]]
    trainer.rollout_func.assert_called_once_with(["prompt"], trainer)


# ---- (4) normalize_then_sum: what selection ranks on, what the advantages are computed from -------------------

def test_normalize_then_sum_selects_on_standardized_rewards_and_keeps_trls_advantages(tmp_path, tiny_model_dir):
    scores, order = {}, []

    def small(completions, **kwargs):
        values = byte_reward(completions)
        for c, v in zip(completions, values, strict=True):
            scores.setdefault(text_of(c), {})["small"] = v
            order.append(text_of(c))
        return values

    def large(completions, **kwargs):
        values = vowel_reward(completions)
        for c, v in zip(completions, values, strict=True):
            scores.setdefault(text_of(c), {})["large"] = v
        return values

    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(small, large), num_generations=8, downsample_to=3,
                           per_device_train_batch_size=6, multi_objective_aggregation="normalize_then_sum",
                           reward_weights=[1.0, 1.0], max_completion_length=10)
    outputs = capture_outputs(trainer)
    trainer.train()
    assert len(set(order)) == len(order) == 16, "completions must be distinct to be looked up"
    per_func = torch.tensor([[scores[t]["small"], scores[t]["large"]] for t in order]).view(2, 8, 2)  # (P, n, F)
    z = (per_func - per_func.mean(1, keepdim=True)) / (nanstd(per_func, dim=1, keepdim=True) + 1e-4)
    expected_kept = downsample(z.sum(2), 3, "max_variance")  # (P, m): ranked on the standardized sum
    kept_texts = [t.strip() for t in trainer.processing_class.batch_decode(outputs[0]["completion_ids"],
                                                                           skip_special_tokens=True)]
    expected_texts = [order[g * 8 + i].strip() for g in range(2) for i in expected_kept[g].tolist()]
    assert kept_texts == expected_texts
    # TRL's own normalize_then_sum advantages, computed on the kept rows alone.
    kept = per_func.gather(1, expected_kept.unsqueeze(2).expand(-1, -1, 2))  # (P, m, F)
    kz = (kept - kept.mean(1, keepdim=True)) / (nanstd(kept, dim=1, keepdim=True) + 1e-4)
    summed = kz.sum(2).flatten()
    advantages = (summed - summed.mean()) / (nanstd(summed) + 1e-4)
    torch.testing.assert_close(outputs[0]["advantages"], advantages, atol=1e-4, rtol=1e-4)


# ---- (2) images: a tiny Gemma 3 VLM --------------------------------------------------------------------------------

def test_images_reach_generation_and_the_kept_rollouts_keep_theirs(tmp_path, tiny_gemma3):
    from PIL import Image

    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": "What color?"}]] * 4,
        "image": [Image.new("RGB", (40, 40), c) for c in colors],
    })
    trainer = PODSTrainer(model=str(tiny_gemma3), reward_funcs=[byte_reward], train_dataset=dataset,
                          args=pods_config(tmp_path, max_completion_length=4))
    generated_with, original_generate = [], trainer.model.generate

    def generate(*args, **kwargs):
        generated_with.append(kwargs.get("pixel_values"))
        return original_generate(*args, **kwargs)

    outputs = capture_outputs(trainer)
    with patch.object(trainer.model, "generate", side_effect=generate):
        moved = trained_params_moved(trainer)
    assert moved
    # Generation saw every sampled rollout's image (N per prompt), the update every kept rollout's (M per prompt).
    assert generated_with[0] is not None and generated_with[0].shape[0] == 2 * N
    output = outputs[0]
    assert output["num_images"] == [1] * (2 * M) and output["pixel_values"].shape[0] == 2 * M
    # The kept rows of a prompt carry that prompt's image: M equal images per group, two groups differ.
    pixels = output["pixel_values"].flatten(1)
    assert torch.equal(pixels[0], pixels[1]) and torch.equal(pixels[2], pixels[3])
    assert not torch.equal(pixels[0], pixels[2])


# ---- (1) tools and environments: multi-turn rollouts ---------------------------------------------------------------

def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product.
    """
    return a * b


def tool_tokenizer():
    """The byte-level tokenizer with Qwen 3's chat template, which renders and parses tool calls."""
    from pods_rl.tiny import make_tokenizer

    tokenizer = make_tokenizer()
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    return tokenizer


def tool_model(tokenizer):
    from transformers import GenerationConfig

    from pods_rl.tiny import tiny_config

    torch.manual_seed(0)
    # Room for the tool schema Qwen 3's template writes into the prompt (one token per byte here).
    model = AutoModelForCausalLM.from_config(tiny_config(tokenizer, "qwen2", 32, 2, None,
                                                          max_position_embeddings=4096))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model


def scripted_generate(tokenizer, first_turns: list[str], later_turn: str = "Done!"):
    """A stand-in for ``model.generate``: the first call's rollout i answers ``first_turns[i % len]`` (tool calls
    among them), every later call (after TRL ran the tools) answers ``later_turn``. TRL's tool loop, the tools, the
    environments, the rewards and the update are all real."""

    def generate(input_ids, **kwargs):
        generate.calls += 1
        first = generate.calls == 1
        texts = [first_turns[i % len(first_turns)] for i in range(input_ids.shape[0])] if first \
            else [later_turn] * input_ids.shape[0]
        ids = [tokenizer.encode(t + "<|im_end|>", add_special_tokens=False) for t in texts]
        width = max(len(x) for x in ids)
        rows = [x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=1)

    generate.calls = 0
    return generate


def call(name: str, **arguments) -> str:
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def tool_result_reward(completions, **kwargs):
    """1 when a tool answered 12 (3 x 4) in the rollout, else 0."""
    return [float(any(m.get("role") == "tool" and "12" in str(m.get("content")) for m in c)) for c in completions]


@pytest.mark.parametrize("rule", ["max_variance", "tool_calls_first"])
def test_tools_multi_turn_rollouts_are_selected_whole(tmp_path, rule, scratch_registry):
    """Rollout i of each group: 0 and 3 call multiply(3, 4), 1 calls it with a wrong argument (the tool fails), 2
    answers without a tool. Kept rows keep their tool turns, tool mask and rewards aligned; a rule that takes
    features sees each rollout's tool calls and turns."""
    seen_features = []

    def tool_calls_first(rewards, m, generator, *, features):
        seen_features.append({k: v.clone() for k, v in features.items()})
        return torch.sort(features["tool_calls"] * 10 - torch.arange(rewards.shape[1]), dim=1,
                          descending=True, stable=True).indices[:, :m]

    register_rule("tool_calls_first", tool_calls_first, overwrite=True)
    tokenizer = tool_tokenizer()
    trainer = PODSTrainer(model=tool_model(tokenizer), reward_funcs=[tool_result_reward], tools=[multiply],
                          args=pods_config(tmp_path, downsample_rule=rule, max_completion_length=200),
                          train_dataset=conversational(), processing_class=tokenizer)
    first_turns = [call("multiply", a=3, b=4), call("multiply", a=3, c=4), "I know it: 12", call("multiply", a=3, b=4)]
    outputs = capture_outputs(trainer)
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(tokenizer, first_turns)):
        assert trained_params_moved(trainer)
    output = outputs[0]
    history = trainer.state.log_history[0]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # (1, n): the tool answered 12 in rollouts 0 and 3
    if rule == "tool_calls_first":
        calls = seen_features[0]["tool_calls"]
        assert calls.tolist() == [[1, 1, 0, 1]] * 2 and seen_features[0]["turns"].tolist() == [[2, 2, 1, 2]] * 2
        kept_rollouts = [0, 1]
    else:
        kept_rollouts = downsample(rewards, M, "max_variance")[0].tolist()
    for row in range(2 * M):
        ids, mask = output["completion_ids"][row], output["completion_mask"][row].bool()
        tool_mask = output["tool_mask"][row].bool()
        model_text = tokenizer.decode(ids[mask & tool_mask])
        tool_text = tokenizer.decode(ids[mask & ~tool_mask])
        rollout = kept_rollouts[row % M]
        assert model_text.startswith(first_turns[rollout]) and "Done!" in model_text
        assert ("12" in tool_text) == (rollout in (0, 3)) and tool_text  # the tool's answer, or its error
    calls = [1, 1, 0, 1]  # rollout 2 answers without a tool; 1's call fails
    assert history["tools/call_frequency"] == pytest.approx(sum(calls[r] for r in kept_rollouts) / M)  # the kept
    assert history["tools/failure_frequency"] == pytest.approx(
        (1 in kept_rollouts) / max(1, sum(calls[r] for r in kept_rollouts)))
    kept_rewards = rewards[0, kept_rollouts].repeat(2)  # (B*m,)
    assert torch.equal(output["advantages"] > 0, kept_rewards > 0)


class Counter:
    """An environment: a counter the model raises with its `increment` tool; it owns the reward (the count)."""

    resets = 0

    def reset(self, **kwargs) -> str:
        Counter.resets += 1
        self.count = 0
        return " The counter starts at 0."

    def increment(self, step: int) -> int:
        """Raise the counter.

        Args:
            step: How much to add.

        Returns:
            The new count.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


def test_environment_rollouts_rewards_and_instances(tmp_path):
    """Environment-owned rewards decide selection; each kept rollout is updated with its own environment's prompt
    (the observation), and no environment is reset again after selection."""
    tokenizer = tool_tokenizer()
    trainer = PODSTrainer(model=tool_model(tokenizer), reward_funcs=None, environment_factory=Counter,
                          args=pods_config(tmp_path, downsample_rule="max_reward", max_completion_length=200),
                          train_dataset=conversational(), processing_class=tokenizer)
    Counter.resets = 0
    first_turns = [call("increment", step=1), call("increment", step=5), "no", call("increment", step=3)]
    outputs = capture_outputs(trainer)
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(tokenizer, first_turns)):
        assert trained_params_moved(trainer)
    assert Counter.resets == 2 * N  # once per sampled rollout, never again for the kept
    assert [e.count for e in trainer.environments] == [1, 5, 0, 3] * 2  # the batch's instances, as GRPO leaves them
    output = outputs[0]
    kept_texts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in
                  zip(output["completion_ids"], output["completion_mask"] * output["tool_mask"], strict=True)]
    for group in (kept_texts[:M], kept_texts[M:]):  # max_reward keeps the counts 5 and 3 of each prompt
        assert sorted(t[:len(call("increment", step=5))] for t in group) == sorted(
            [call("increment", step=3), call("increment", step=5)])
    prompts = tokenizer.batch_decode(output["prompt_ids"])
    assert all("The counter starts at 0." in p for p in prompts)


class Echo:
    """A second environment, with a tool of its own; it rewards a shout."""

    def reset(self, **kwargs) -> None:
        self.shouted = ""

    def shout(self, text: str) -> str:
        """Shout a text back.

        Args:
            text: What to shout.

        Returns:
            The text in capitals.
        """
        self.shouted = text.upper()
        return self.shouted

    def get_reward(self) -> float:
        return float(bool(self.shouted))


def test_several_environments_route_and_keep_their_instances(tmp_path):
    """A dict environment_factory: each kept rollout keeps the environment (and tools) of its own example."""
    tokenizer = tool_tokenizer()
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "go"}]] * 4,
                                 "environment": ["counter", "echo"] * 2})
    trainer = PODSTrainer(model=tool_model(tokenizer), reward_funcs=None,
                          environment_factory={"counter": Counter, "echo": Echo}, train_dataset=dataset,
                          args=pods_config(tmp_path, downsample_rule="max_reward", max_completion_length=200,
                                           shuffle_dataset=False),
                          processing_class=tokenizer)
    turns = [call("increment", step=1), call("increment", step=5), "no", call("increment", step=3),  # counter
             call("shout", text="hi"), "no", call("shout", text="yo"), "no"]  # echo
    outputs = capture_outputs(trainer)
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(tokenizer, turns)):
        assert trained_params_moved(trainer)
    assert [type(e).__name__ for e in trainer.environments] == ["Counter"] * N + ["Echo"] * N
    assert [len(trainer._environment_pool[name]) for name in ("counter", "echo")] == [N, N]  # the pool is TRL's
    output = outputs[0]
    model_texts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in
                   zip(output["completion_ids"], output["completion_mask"] * output["tool_mask"], strict=True)]
    tool_texts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in
                  zip(output["completion_ids"], output["completion_mask"] * (1 - output["tool_mask"]), strict=True)]
    counter_kept, echo_kept = model_texts[:M], model_texts[M:]
    assert sorted(t[:len(call("increment", step=5))] for t in counter_kept) == sorted(
        [call("increment", step=3), call("increment", step=5)])
    assert sorted(t[:len(call("shout", text="hi"))] for t in echo_kept) == sorted(
        [call("shout", text="hi"), call("shout", text="yo")])
    assert sorted(("HI" in t) or ("YO" in t) for t in tool_texts[M:]) == [True, True]  # Echo's own tool answered


def test_tool_turns_and_images_in_messages():
    from pods_rl.rollouts import images_in_messages, tool_turns

    # model, tool result, model, tool result, model | one turn, no tool | nothing generated
    assert tool_turns([[1, 1, 0, 0, 1, 0, 1], [1, 1], []], 3) == ([2, 0, 0], [3, 1, 1])
    assert tool_turns(None, 2) == ([0, 0], [1, 1])
    image = object()
    prompt = [{"role": "system", "content": "s"},
              {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "q"}]}]
    assert images_in_messages(prompt) == [image]
    assert images_in_messages([{"role": "user", "content": "q"}]) is None and images_in_messages("q") is None
