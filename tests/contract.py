"""The drop-in's contract as a harness: ``PODSTrainer`` sampling n rollouts per prompt and keeping m produces, on the
rows it keeps, exactly what ``GRPOTrainer`` with ``num_generations = m`` produces when those rollouts are its own.

How it is checked, for any feature (``run_pair``):

1. Generation is scripted (``Script``: a stand-in for ``model.generate`` or a ``rollout_func``): the k-th rollout of
   a prompt answers a turn chosen by (prompt, k), so every rollout a run samples is known, tools and environments
   still run for real, and nothing depends on sampling.
2. PODS runs first. What it kept is read back from what it handed the update: each kept row's prompt and first turn.
3. That becomes GRPO's script: rollout j of a prompt answers what PODS kept as that prompt's j-th row. GRPOTrainer
   then runs with m rollouts per prompt, from the same initial weights, on the same data order.
4. The two runs are compared step by step (``assert_same``): every tensor TRL hands the loss, the gradients before
   each optimizer step, the completions table (prompts, completions, reward columns, advantages, ``log_extra``
   columns, images), the logged metrics (PODS's own ``pods/*``, ``time/*`` and ``memory/*`` aside; ``log_metric``
   values among them), and what a feature records of its own (environment states, tool masks).

A new TRL feature needs one entry in ``tests/test_contract.py``'s table, not a new kind of test. The 2-process run
(``tests/scripts/contract_ranks.py``) uses this module on every rank.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback

N, M = 4, 2  # rollouts sampled per prompt, kept per prompt
KEPT_INDICES = (1, 3)  # what the contract's rule keeps of each group of N: known before any reward is seen

# First turns a prompt's rollouts answer, in turn (the k-th rollout of a prompt: TURNS[(k + offset) % len]).
TURNS = ("12", "7", "400", "33", "5", "6789", "21", "8", "90", "1", "64", "3")

# Metrics that PODS logs on its own (what it sampled, its phases): not part of GRPO's log.
PODS_ONLY_PREFIXES = ("pods/", "time/", "memory/", "eval_pods/", "eval_time/", "eval_memory/")
# Keys transformers logs about the run's own speed: different in any two runs.
TIMING_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "eval_runtime",
               "eval_samples_per_second", "eval_steps_per_second", "total_flos", "step_time", "eval_step_time")


def keep_indices(rewards, m, generator):
    """The contract's rule: keep rollouts ``KEPT_INDICES`` of every group, whatever the rewards (B, n) -> (B, m)."""
    assert m == len(KEPT_INDICES), m
    return torch.tensor(KEPT_INDICES).expand(rewards.shape[0], m).clone()


def digit_value(text: str) -> float:
    """A turn's reward: its digits read as a number, mod 3 (0 without digits)."""
    digits = "".join(ch for ch in text if ch.isdigit())
    return float(int(digits) % 3) if digits else 0.0


def text_of(completion) -> str:
    """A completion's text: a string, or the assistant messages' contents joined."""
    if isinstance(completion, str):
        return completion
    return " ".join(m["content"] for m in completion
                    if m.get("role") == "assistant" and isinstance(m.get("content"), str))


def turn_reward(completions, log_extra=None, log_metric=None, **kwargs):
    """The reward of the first turn's digits; logs each completion's own text (``log_extra``) and the batch's mean
    text length (``log_metric``), so that a row logged beside another completion, or a metric of other rows, shows."""
    texts = [text_of(c) for c in completions]
    if log_extra is not None:
        log_extra("own_text", texts)
    if log_metric is not None:
        log_metric("mean_text_chars", sum(len(t) for t in texts) / max(1, len(texts)))
    return [digit_value(t) for t in texts]


def vowel_share(completions, **kwargs):
    """A second objective on another scale (for the multi-objective features): 10 x the share of even digits."""
    texts = [text_of(c) for c in completions]
    return [10.0 * sum(ch in "02468" for ch in t) / max(1, len(t)) for t in texts]


class Script:
    """Scripted generation for one trainer. Before ``plan`` is set (the PODS run), the k-th rollout of a prompt in a
    generation round answers ``turns[(k + offset(prompt text, ids)) % len(turns)]`` (offset: by default the sum of the
    prompt's ids); with a ``plan`` (the GRPO run), rollout j
    answers the j-th first turn PODS kept for that prompt in that round. Prompts are known by their token ids;
    rounds by (train or eval, global step). A later turn (after a tool answered) answers ``later``."""

    def __init__(self, tokenizer, turns=TURNS, later: str = "Done!", plan: dict | None = None, offset=None):
        self.tokenizer, self.turns, self.later, self.plan = tokenizer, turns, later, plan
        self.offset = offset or (lambda text, ids: sum(ids))  # where a prompt starts in ``turns``
        self.trainer = None  # set once the trainer is built: its step and mode name the round
        self.seen = defaultdict(int)  # (round, prompt ids) -> rollouts answered so far

    def round(self):
        training = self.trainer.model.training
        return ("train" if training else "eval", self.trainer.state.global_step)

    def first_turn(self, prompt_ids: tuple) -> tuple:
        """The first turn's token ids (no EOS) of the next rollout of ``prompt_ids``."""
        key = (self.round(), prompt_ids)
        k = self.seen[key]
        self.seen[key] += 1
        if self.plan is not None and key[0][0] == "train":
            return self.plan[key][k]
        start = self.offset(self.tokenizer.decode(list(prompt_ids)), prompt_ids)
        text = self.turns[(k + start) % len(self.turns)]
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def is_later_turn(self, prompt_ids) -> bool:
        return "tool_response" in self.tokenizer.decode(list(prompt_ids))

    def generate(self, input_ids, attention_mask=None, **kwargs):
        """``model.generate``'s stand-in: the prompt rows (left-padded) followed by their scripted turns + EOS."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        rows = []
        for i in range(input_ids.shape[0]):
            ids = input_ids[i] if attention_mask is None else input_ids[i][attention_mask[i].bool()]
            prompt = tuple(ids.tolist())
            turn = self.tokenizer.encode(self.later, add_special_tokens=False) if self.is_later_turn(prompt) \
                else list(self.first_turn(prompt))
            rows.append(turn + [eos])
        width = max(len(r) for r in rows)
        completions = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=input_ids.device)
        return torch.cat([input_ids, completions], dim=1)

    def rollout_func(self, prompts, trainer):
        """TRL's ``rollout_func``: the chat-templated prompt, a scripted turn, and an extra field per rollout."""
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            encoded = self.tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
            ids = tuple(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
            prompt_ids.append(list(ids))
            completion_ids.append(list(self.first_turn(ids)) + [self.tokenizer.eos_token_id])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": [[-0.5] * len(c) for c in completion_ids],
                "turn_tag": [self.tokenizer.decode(c[:-1]) for c in completion_ids]}


class Recorder(TrainerCallback):
    """What a run produced, per generation round and optimizer step: the batch TRL hands the loss (every tensor),
    the completions table after the round, and the gradients before each optimizer step."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.generation_steps: list[int] = []  # the global step of each training round
        self.batches: list[dict] = []  # training rounds only
        self.tables: list[dict] = []
        self.grads: list[dict] = []
        generate_and_score = trainer._generate_and_score_completions

        def spy(inputs):
            step = trainer.state.global_step
            output = generate_and_score(inputs)
            if trainer.model.training:
                self.generation_steps.append(step)
                self.batches.append({k: _detached(v) for k, v in output.items()})
                self.tables.append(_table(trainer))
            return output

        trainer._generate_and_score_completions = spy
        trainer.add_callback(self)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        model = self.trainer.model
        self.grads.append({name: p.grad.detach().clone() for name, p in model.named_parameters()
                           if p.requires_grad and p.grad is not None})


def _detached(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    return copy.deepcopy(value)


def _table(trainer) -> dict:
    """TRL's completions table as it stands (``trainer._logs``), copied."""
    logs = trainer._logs
    return {"prompt": list(logs["prompt"]), "completion": list(logs["completion"]),
            "rewards": {k: list(v) for k, v in logs["rewards"].items()}, "advantages": list(logs["advantages"]),
            "extra": {k: list(v) for k, v in logs["extra"].items()},
            "images": [_image_bytes(images) for images in logs["images"]]}


def _image_bytes(images):
    if not images:
        return images
    return [image.tobytes() if hasattr(image, "tobytes") else image for image in images]


def plan_from(recorder: Recorder, tokenizer, m: int = M) -> dict:
    """GRPO's script from what PODS kept: {(round, prompt ids): [first-turn ids of each kept row, in order]}.

    A round is (train, global step at generation); a kept row's prompt is its unpadded prompt ids, its first turn its
    completion ids up to the first EOS."""
    plan = defaultdict(list)
    eos = tokenizer.eos_token_id
    for step, batch in zip(recorder.generation_steps, recorder.batches, strict=True):
        for prompt, prompt_mask, completion in zip(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                                   strict=True):
            ids = completion.tolist()
            turn = tuple(ids[:ids.index(eos)] if eos in ids else ids)
            plan[(("train", step), tuple(prompt[prompt_mask.bool()].tolist()))].append(turn)
    assert all(len(turns) % m == 0 for turns in plan.values()), {k: len(v) for k, v in plan.items()}
    return dict(plan)


@dataclass
class Run:
    """One trainer's run and what it produced."""

    trainer: object
    recorder: Recorder
    script: Script
    extra: dict = field(default_factory=dict)


def train(trainer, script: Script, patch_generate: bool = True) -> Run:
    """Train ``trainer`` with ``script`` answering generation; record what it produced."""
    from unittest.mock import patch

    script.trainer = trainer
    recorder = Recorder(trainer)
    if patch_generate:
        with patch.object(trainer.model, "generate", side_effect=script.generate):
            trainer.train()
    else:
        trainer.train()
    return Run(trainer, recorder, script)


def logged(trainer, ignore: tuple = ()) -> list[dict]:
    """The run's log rows without PODS's own metrics, transformers' timing keys and ``ignore``."""
    rows = []
    for row in trainer.state.log_history:
        rows.append({k: v for k, v in row.items()
                     if not k.startswith(PODS_ONLY_PREFIXES) and k not in TIMING_KEYS and k not in ignore})
    return rows


def assert_close_values(a, b, where: str, rtol=1e-5, atol=1e-6):
    """Equal structures of numbers, tensors, strings and lists (floats and tensors to a tolerance)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.shape == b.shape, f"{where}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=where)
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, float) or isinstance(b, float):
        both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
        assert both_nan or math.isclose(a, b, rel_tol=rtol, abs_tol=atol), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_close_values(a[k], b[k], f"{where}.{k}", rtol, atol)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close_values(x, y, f"{where}[{i}]", rtol, atol)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same(pods: Run, grpo: Run, ignore: tuple = ()) -> None:
    """PODS's run on its kept rows == GRPO's on the same rollouts: batches, completions tables, gradients, logs
    (``ignore``: log keys that differ by construction, e.g. ``epoch`` when GRPO's data is the prompts PODS kept)."""
    assert pods.recorder.batches, "PODS generated nothing in training"
    assert_close_values(pods.recorder.generation_steps, grpo.recorder.generation_steps, "generation steps")
    for r, (a, b) in enumerate(zip(pods.recorder.batches, grpo.recorder.batches, strict=True)):
        assert_close_values(a, b, f"round {r}: the batch TRL hands the loss")
    for r, (a, b) in enumerate(zip(pods.recorder.tables, grpo.recorder.tables, strict=True)):
        assert_close_values(a, b, f"round {r}: the completions table")
    assert len(pods.recorder.grads) == len(grpo.recorder.grads) > 0
    assert any(bool(g.abs().sum() > 0) for step in pods.recorder.grads for g in step.values()), "no gradient at all"
    for s, (a, b) in enumerate(zip(pods.recorder.grads, grpo.recorder.grads, strict=True)):
        # The first steps' gradients agree exactly; after a few updates at lr 5e-2 the two runs' float rounding
        # drifts apart in the 6th digit (also for features that change nothing but the data, e.g. GRESO's skip), so
        # an element near 0 is compared against its tensor's scale, not alone.
        for name in a:
            scale = float(b[name].abs().max()) if name in b else 0.0
            assert_close_values(a[name], b.get(name), f"step {s}: gradients.{name}", rtol=1e-4,
                                atol=1e-6 + 1e-5 * scale)
        assert sorted(a) == sorted(b), f"step {s}: gradients of {sorted(set(a) ^ set(b))}"
    assert_close_values(logged(pods.trainer, ignore), logged(grpo.trainer, ignore), "logged metrics", rtol=1e-4,
                        atol=1e-6)
