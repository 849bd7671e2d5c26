"""PODSTrainer on tiny random models: equivalence with GRPO at m == n, B*m rows in the update, hand-checked
advantages and loss, LoRA, accumulation, num_iterations, and bad configs."""

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from pods_rl import downsample, register_rule
from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer


def digit_reward(completions, **kwargs):
    """A cheap reward with variance inside groups: digits in the completion, mod 4."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(sum(ch.isdigit() for ch in t) % 4) for t in texts]


def length_reward(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [min(len(t), 8) / 8 for t in texts]


def make_dataset(num=16):
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+{i * 3}="}] for i in range(num)]})


def common_args(tmp_path, **overrides):
    args = dict(output_dir=str(tmp_path / "out"), use_cpu=True, seed=3, learning_rate=1e-2, max_steps=2,
                max_completion_length=8, num_generations=4, per_device_train_batch_size=4, logging_steps=1,
                report_to="none", save_strategy="no", beta=0.0, temperature=1.0, bf16=False,
                dataloader_num_workers=0)
    args.update(overrides)
    return args


def make_trainer(tmp_path, model_dir, reward_funcs=(digit_reward,), peft_config=None, **overrides):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = PODSConfig(**common_args(tmp_path, **overrides))
    return PODSTrainer(model=model, reward_funcs=list(reward_funcs), args=config, train_dataset=make_dataset(),
                       processing_class=tokenizer, peft_config=peft_config)


def test_m_equals_n_matches_grpo_trainer(tmp_path, tiny_model_dir):
    pods = make_trainer(tmp_path / "pods", tiny_model_dir)  # downsample_to defaults to n
    pods.train()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    grpo = GRPOTrainer(model=model, reward_funcs=[digit_reward], args=GRPOConfig(**common_args(tmp_path / "grpo")),
                       train_dataset=make_dataset(), processing_class=tokenizer)
    grpo.train()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    pods_state, grpo_state = pods.model.state_dict(), grpo.model.state_dict()
    moved = [k for k in initial if not torch.equal(initial[k], pods_state[k])]
    assert moved, "training did not change any weight"
    for key in initial:
        torch.testing.assert_close(pods_state[key], grpo_state[key], msg=f"{key} differs from GRPOTrainer's")



def _train_recording_grad_forward_rows(trainer) -> list[int]:
    """Train; return the row count of every model forward run with grad enabled (the loss forwards)."""
    rows = []
    hook = trainer.model.register_forward_hook(
        lambda mod, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0])
        if torch.is_grad_enabled() else None, with_kwargs=True)
    try:
        trainer.train()
    finally:
        hook.remove()
    return rows

def _count_logp_rows(trainer):
    """Record the number of rows of every log-prob forward (old/ref log-probs and the loss)."""
    rows = []
    original = trainer._get_per_token_logps_and_entropies

    def spy(model, input_ids, *args, **kwargs):
        rows.append(input_ids.shape[0])
        return original(model, input_ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = spy
    return rows


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_update_phase_sees_exactly_kept_rows(tmp_path, tiny_model_dir, num_iterations):
    n, m, prompts_per_step = 8, 2, 2
    trainer = make_trainer(tmp_path, tiny_model_dir, num_generations=n, downsample_to=m,
                           per_device_train_batch_size=m * prompts_per_step, num_iterations=num_iterations,
                           gradient_accumulation_steps=1, steps_per_generation=2, max_steps=4)
    reward_calls = []
    trainer.reward_funcs[0] = lambda completions, **kw: reward_calls.append(len(completions)) or digit_reward(
        completions)
    trainer.reward_func_names[0] = "digit_reward"
    rows = _count_logp_rows(trainer)
    forward_rows = _train_recording_grad_forward_rows(trainer)
    # Scoring sees all n rollouts of each prompt: 2 steps per generation round -> 2 * 2 prompts * 8 rollouts.
    assert reward_calls and all(c == 2 * prompts_per_step * n for c in reward_calls)
    # Log-prob forwards hold kept rows only: old log-probs (steps and generations are misaligned here) for
    # the round's 2 steps x B*m kept rows, once per generation round; then B*m rows per loss.
    rounds = 4 // (2 * num_iterations)
    assert sorted(rows) == sorted([2 * prompts_per_step * m] * rounds + [prompts_per_step * m] * 4)
    # Forwards with gradients (the update) hold exactly B*m rows, once per optimizer step.
    assert forward_rows == [prompts_per_step * m] * 4


def test_loader_yields_each_prompt_once_and_the_step_gets_whole_groups(tmp_path, tiny_model_dir):
    # PODS's loader hands over P rows, not P*n copies (auto samples up to n = 4m); _prepare_inputs repeats them.
    n, m = 8, 4
    trainer = make_trainer(tmp_path, tiny_model_dir, num_generations=n, downsample_to=m,
                           per_device_train_batch_size=2 * m, max_steps=1)
    batch = next(iter(trainer.get_train_dataloader()))
    assert len(batch) == 2 and batch[0]["prompt"] != batch[1]["prompt"]  # B = 2 kept groups, one row each
    seen = []
    step = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: seen.append([x["prompt"] for x in inputs]) or step(inputs)
    trainer.train()
    assert len(seen) == 1 and len(seen[0]) == 2 * n
    assert [seen[0][i * n:(i + 1) * n] for i in range(2)] == [[p] * n for p in (seen[0][0], seen[0][n])]


def test_kept_rows_advantages_and_loss_by_hand(tmp_path, tiny_model_dir):
    n, m = 8, 4
    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(digit_reward, length_reward),
                           reward_weights=[1.0, 0.5], num_generations=n, downsample_to=m,
                           per_device_train_batch_size=2 * m, max_steps=1)
    trainer.model.train()
    seen = {}
    original_reward = trainer.reward_funcs[0]

    def recording_reward(completions, **kw):
        seen["completions"] = [c[0]["content"] for c in completions]
        return original_reward(completions)

    trainer.reward_funcs[0] = recording_reward
    batch = [row for row in make_dataset(2) for _ in range(n)]  # 2 prompts x n rollouts
    out = trainer._generate_and_score_completions(batch)

    texts = seen["completions"]  # (2*n,)
    rewards = torch.tensor([d + 0.5 * le for d, le in zip(digit_reward(texts), length_reward(texts))]).view(2, n)
    kept = downsample(rewards, m, "max_variance")  # (2, m)
    kept_rewards = rewards.gather(1, kept)  # (2, m)
    # GRPO advantage by hand: unbiased std, eps 1e-4, as in TRL.
    mean = kept_rewards.mean(1, keepdim=True)
    std = kept_rewards.std(1, keepdim=True)
    expected_adv = ((kept_rewards - mean) / (std + 1e-4)).flatten()
    torch.testing.assert_close(out["advantages"], expected_adv)

    # The kept completions are the ones selected, in group order.
    kept_texts = [texts[g * n + i] for g in range(2) for i in kept[g].tolist()]
    decoded = trainer.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)
    assert [d.strip() for d in decoded] == [t.strip() for t in kept_texts]
    assert out["completion_ids"].shape[0] == 2 * m

    # DAPO loss at ratio 1 (on-policy, beta 0): -sum_i A_i * len_i / sum_i len_i.
    lengths = out["completion_mask"].sum(1).float()
    expected_loss = -(expected_adv * lengths).sum() / lengths.sum()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this test bypasses
    loss = trainer.compute_loss(trainer.model, out)
    torch.testing.assert_close(loss.detach(), expected_loss, atol=1e-5, rtol=1e-4)


def parity_reward(completions, **kwargs):
    """Binary reward (digit count is odd): most rollouts tie, so the tiebreak decides which are kept."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(sum(ch.isdigit() for ch in t) % 2) for t in texts]


def _score_one_batch(trainer, n):
    """Run one PODS generate-score-select on 2 prompts; return (output, rewards (2, n), lengths (2, n), texts)."""
    trainer.model.train()
    seen = {}

    def recording_reward(completions, completion_ids, **kw):
        seen["texts"] = [c[0]["content"] for c in completions]
        seen["lengths"] = [len(ids) for ids in completion_ids]
        return parity_reward(completions)

    trainer.reward_funcs[0] = recording_reward
    original_generate = trainer._generate

    def varied_lengths(prompts):  # a random tiny model rarely stops early: cut completions to varied lengths
        generated = original_generate(prompts)  # (TRL's step on the kept rows is answered past this wrapper)
        ids = [row[: 1 + (7 * i) % len(row)] for i, row in enumerate(generated[1])]
        texts = trainer.processing_class.batch_decode(ids, skip_special_tokens=True)
        return (generated[0], ids, generated[2], [[{"role": "assistant", "content": t}] for t in texts],
                *generated[4:])

    trainer._generate = varied_lengths
    batch = [row for row in make_dataset(2) for _ in range(n)]  # 2 prompts x n rollouts
    out = trainer._generate_and_score_completions(batch)
    rewards = torch.tensor(parity_reward(seen["texts"])).view(2, n)
    return out, rewards, torch.tensor(seen["lengths"]).view(2, n), seen["texts"]


def _kept_texts(trainer, out):
    return [t.strip() for t in trainer.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)]


@pytest.mark.parametrize("tiebreak", ["shorter", "longer"])
def test_downsample_tiebreak_by_completion_length(tmp_path, tiny_model_dir, tiebreak):
    n, m = 8, 4
    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(parity_reward,), num_generations=n,
                           downsample_to=m, per_device_train_batch_size=2 * m, max_steps=1, max_completion_length=12,
                           downsample_tiebreak=tiebreak)
    out, rewards, lengths, texts = _score_one_batch(trainer, n)
    kept = downsample(rewards, m, "max_variance", tiebreak=lengths if tiebreak == "shorter" else -lengths)
    assert _kept_texts(trainer, out) == [texts[g * n + i].strip() for g in range(2) for i in kept[g].tolist()]
    # Same kept reward values as the index tiebreak; among equal rewards the shorter (longer) ones.
    plain = downsample(rewards, m, "max_variance")
    assert torch.equal(rewards.gather(1, kept).sort(1).values, rewards.gather(1, plain).sort(1).values)
    sign = 1 if tiebreak == "shorter" else -1
    for g in range(2):
        for value in (0.0, 1.0):
            kept_len = [sign * lengths[g, i].item() for i in kept[g].tolist() if rewards[g, i] == value]
            dropped = [sign * lengths[g, i].item() for i in range(n)
                       if rewards[g, i] == value and i not in kept[g].tolist()]
            assert not kept_len or not dropped or max(kept_len) <= min(dropped)


def test_feature_rule_sees_lengths_rewards_per_func_and_truncation(tmp_path, tiny_model_dir,
                                                                  monkeypatch, scratch_registry):
    import importlib

    ds_module = importlib.import_module("pods_rl.downsample")
    monkeypatch.setattr(ds_module, "_RULES", ds_module._RULES.copy())
    seen = {}

    @register_rule("reward_per_token")
    def reward_per_token(rewards, m, generator, *, features):
        seen.update(features)
        per_token = rewards / features["lengths"].to(rewards.dtype).clamp(min=1)  # (B, n)
        return per_token.topk(m, dim=1).indices

    n, m, max_len = 8, 4, 6
    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(parity_reward,), num_generations=n,
                           downsample_to=m, per_device_train_batch_size=2 * m, max_steps=1,
                           max_completion_length=max_len, downsample_rule="reward_per_token",
                           downsample_tiebreak="shorter")
    out, rewards, lengths, texts = _score_one_batch(trainer, n)
    assert torch.equal(seen["lengths"], lengths)
    assert torch.equal(seen["tiebreak"], lengths.double())
    assert seen["rewards_per_func"].shape == (2, n, 1)
    assert torch.equal(seen["rewards_per_func"][..., 0], rewards)
    assert seen["truncated"].dtype == torch.bool and seen["truncated"].shape == (2, n)
    assert bool(seen["truncated"].any()) and bool((~seen["truncated"]).any())
    kept = (rewards / lengths.clamp(min=1)).topk(m, dim=1).indices.sort(1).values
    assert _kept_texts(trainer, out) == [texts[g * n + i].strip() for g in range(2) for i in kept[g].tolist()]


def half_informative_reward(prompts, completions, **kwargs):
    """Even prompts: reward 1.0 for every rollout (a zero-variance group); odd prompts: digit_reward (varies)."""
    varied = digit_reward(completions)
    return [1.0 if int(p[0]["content"].split("+")[0]) % 2 == 0 else v for p, v in zip(prompts, varied)]


def test_oversample_prompts_keeps_informative_groups_and_b_times_m_rows(tmp_path, tiny_model_dir):
    n, m, groups, steps = 8, 4, 2, 4
    trainer = make_trainer(tmp_path, tiny_model_dir, reward_funcs=(half_informative_reward,), num_generations=n,
                           downsample_to=m, per_device_train_batch_size=groups * m, max_steps=steps,
                           oversample_prompts=2)
    informative = []  # per round: sampled groups whose n rewards are not all equal

    def recording_reward(prompts, completions, **kw):
        rewards = torch.tensor(half_informative_reward(prompts, completions)).view(-1, n)
        informative.append(int((rewards != rewards[:, :1]).any(1).sum()))
        return rewards.flatten().tolist()

    trainer.reward_funcs[0] = recording_reward
    trainer.reward_func_names[0] = "half_informative_reward"
    forward_rows = _train_recording_grad_forward_rows(trainer)
    # The update holds B*m rows per step, as without over-sampling; 2 * B prompts were sampled per step.
    assert forward_rows == [groups * m] * steps
    logs = [row for row in trainer.state.log_history if "pods/prompts_sampled" in row]
    assert len(logs) == steps == len(informative)
    assert [row["pods/prompts_sampled"] for row in logs] == [2 * groups] * steps
    for row, good in zip(logs, informative):
        assert row["pods/groups_zero_std"] == 2 * groups - good
        # max_variance keeps a varied subset of a varied group: zero-variance groups reach the update only
        # when fewer than B informative groups were sampled.
        assert row["pods/frac_zero_std_kept"] == max(0, groups - good) / groups
        assert row["pods/groups_zero_std_kept"] == max(0, groups - good)
        assert row["pods/kept_groups_var_mean"] > 0
    # The case the test is about happened: zero-variance groups were sampled and none reached the update.
    assert any(row["pods/groups_zero_std"] > 0 and row["pods/frac_zero_std_kept"] == 0 for row in logs)


def test_oversample_prompts_config(tmp_path):
    config = PODSConfig(**common_args(tmp_path, num_generations=8, downsample_to=4, per_device_train_batch_size=8,
                                      oversample_prompts=1.5))
    assert config.sampled_prompts_per_process() == 3 and config.selects  # ceil(1.5 * 2 groups)
    config = PODSConfig(**common_args(tmp_path, num_generations=4, oversample_prompts=2))  # GRPO + over-sampling
    assert config.sampled_prompts_per_process() == 2 and config.selects and not config.is_pods


def test_lora_with_accumulation(tmp_path, tiny_model_dir):
    from peft import LoraConfig

    trainer = make_trainer(tmp_path, tiny_model_dir, num_generations=8, downsample_to=4,
                           per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=2,
                           peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    base = {k: v.clone() for k, v in trainer.model.named_parameters() if "lora" not in k}
    lora = {k: v.clone() for k, v in trainer.model.named_parameters() if "lora_B" in k}
    assert lora, "no LoRA parameters were created"
    trainer.train()
    params = dict(trainer.model.named_parameters())
    assert all(torch.equal(params[k], v) for k, v in base.items()), "base weights must stay frozen"
    assert any(not torch.equal(params[k], v) for k, v in lora.items()), "LoRA weights did not move"
    history = [h for h in trainer.state.log_history if "time/generation" in h]
    assert len(history) == 2
    for h in history:
        assert h["time/generation"] > 0 and h["time/update"] > 0 and h["time/selection"] >= 0
        assert h["time/step"] >= h["time/generation"] + h["time/scoring"] + h["time/selection"]
        assert 0 <= h["pods/frac_zero_std_kept"] <= 1 and "pods/reward_all_mean" in h


def test_llama_pods_step_runs(tmp_path, tiny_llama_dir):
    trainer = make_trainer(tmp_path, tiny_llama_dir, num_generations=6, downsample_to=3,
                           per_device_train_batch_size=3, max_steps=1, downsample_rule="random")
    trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_generations=4, downsample_to=8), "larger than num_generations"),
        (dict(num_generations=4, downsample_to=1), "at least 2"),
        (dict(num_generations=4, downsample_to=2, downsample_rule="best"),
         "unknown down-sampling rule 'best' \\(downsample_rule\\)"),
        (dict(num_generations=8, downsample_to=4, per_device_train_batch_size=6), "multiple of 4"),
        (dict(num_generations=8, downsample_to=4, max_train_seconds=-1), "max_train_seconds"),
        (dict(num_generations=8, downsample_to=2.5), "integer"),
        (dict(num_generations=8, downsample_to=4, downsample_tiebreak="short"), "downsample_tiebreak must be one of"),
        (dict(num_generations=8, downsample_to=4, oversample_prompts=0.5), "oversample_prompts must be a number >= 1"),
    ],
)
def test_bad_configs_fail_fast(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        PODSConfig(**common_args(tmp_path, **overrides))


def test_phase_times_exclude_work_done_by_step_end_callbacks(tmp_path, tiny_model_dir):
    """A callback that evaluates at step end (pods train's TrainingClock) must not be charged to the step."""
    import time

    from transformers import TrainerCallback

    # The bound is relative to the step as the callback saw it (from on_step_begin until its own work starts), so
    # it tests where the callback's time is charged, not how fast the machine is (a fixed bound failed under load).
    callback_seconds = 3.0

    class SlowEval(TrainerCallback):
        step_seen = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_seen = time.perf_counter() - self.began
            time.sleep(callback_seconds)

    slow = SlowEval()
    config = PODSConfig(**common_args(tmp_path, num_generations=4, downsample_to=2, per_device_train_batch_size=4,
                                      max_steps=2))
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[digit_reward],
                          args=config, train_dataset=make_dataset(),
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                          callbacks=[slow])  # given first, as pods train gives its TrainingClock
    trainer.train()
    # charged to the step, the sleep would make the step at least step_seen + callback_seconds
    assert 0 < trainer.phase_clock.last_step_seconds <= slow.step_seen + 0.1 * callback_seconds


def test_zero_variance_groups_are_counted_exactly():
    """pods/frac_zero_std_*: a group of equal non-dyadic rewards counts (its float32 std is 6e-8, not 0); NaNs
    (unscorable rollouts) are ignored; any difference makes a group informative."""
    from pods_rl.selection import all_equal

    nan = float("nan")
    rewards = torch.tensor([[0.8] * 16, [0.8] * 15 + [0.8000001], [1.3, nan, 1.3, 1.3] * 4, [nan] * 16])
    assert all_equal(rewards).tolist() == [True, False, True, True]


def test_grading_cut_short_is_a_logged_metric(tmp_path, tiny_model_dir):
    """correctness_reward reports the completions it could not grade in time through TRL's log_metric."""
    import time

    from pods_rl.tasks.rewards import GRADING_METRIC, make_correctness_reward

    def slow_is_correct(text, gold):
        time.sleep(0.05)
        return True

    reward = make_correctness_reward(slow_is_correct, timeout_s=1.0, batch_timeout_s=0.01)
    dataset = make_dataset().add_column("answer", ["42"] * 16)
    config = PODSConfig(**common_args(tmp_path, num_generations=8, downsample_to=4, per_device_train_batch_size=4,
                                      max_steps=1))
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[reward],
                          args=config, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.train()
    history = [h for h in trainer.state.log_history if GRADING_METRIC in h]
    # 1 prompt x 8 rollouts scored in the step: the first times out on the 0.01 s budget, 7 are not graded.
    assert [h[GRADING_METRIC] for h in history] == [8.0]
