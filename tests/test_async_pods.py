"""PODS inside TRL's asynchronous GRPO trainer (pods_rl.engines.trl_async.worker, issue #40 item 1), on CPU.

No vLLM server: the tests run the loop's scoring step, ``_score_group``, on real ``RolloutGroup``s of n conversations
with real reward functions (plain Python), through TRL's own ``_score_group`` underneath, and compare with TRL's
output, with ``pods_rl.downsample`` and with advantages recomputed by hand. TRL's ``AsyncRolloutWorker`` refuses to be
built without vLLM, so the worker is tested as a class (its ``_loop_cls``, its checks) and through the keyword
arguments it would forward to the loop: those are compared with the ones ``AsyncGRPOTrainer.__init__`` gives its
default worker and run through the loop's real ``__init__`` (aiohttp, which only its network code uses, stubbed).
The last tests pin the TRL internals the module touches.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import itertools
import math
import queue
import re
import statistics
import threading
import time
import types

import numpy as np
import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trl_trainer  # noqa: E402
from trl.experimental.async_grpo import async_rollout_worker as trl_worker  # noqa: E402
from trl.experimental.async_grpo.async_rollout_worker import (  # noqa: E402
    AsyncRolloutWorker,
    RolloutGroup,
    RolloutSample,
    TrainingSequence,
    _AsyncRolloutLoop,
)
from trl.trainer.utils import get_callable_name  # noqa: E402

import pods_rl  # noqa: E402
from pods_rl.downsample import downsample  # noqa: E402
from pods_rl.engines.trl_async.worker import (  # noqa: E402
    PODSRolloutLoop,
    PODSRolloutWorker,
    pods_worker_kwargs,
)

POD_METRICS = {"pods/reward_all_mean", "pods/reward_all_std", "pods/reward_kept_mean", "pods/reward_kept_std",
               "pods/frac_zero_std_all", "pods/frac_zero_std_kept", "pods/prompts_sampled", "pods/groups_zero_std",
               "pods/groups_zero_std_kept", "pods/kept_groups_var_mean"}


@pytest.fixture(autouse=True, scope="module")
def accelerate_state():
    """TRL's ``_score_group`` logs through accelerate's logger, which wants the state the child makes first."""
    from accelerate.state import PartialState

    PartialState()


# ---- reward functions (module level: the worker pickles them into its child) ---------------------------------
def value(completions, **kwargs):
    """The completion's text read as a number; None ("not scored") for "?"."""
    return [None if c[0]["content"] == "?" else float(c[0]["content"]) for c in completions]


def brevity(completions, completion_ids, answer, **kwargs):
    """-0.01 per completion token, +0.5 where the text is the row's answer; None for "?"."""
    return [None if c[0]["content"] == "?" else -0.01 * len(ids) + 0.5 * (c[0]["content"] == a)
            for c, ids, a in zip(completions, completion_ids, answer, strict=True)]


async def async_value(completions, **kwargs):
    """``value``, as a coroutine (TRL awaits async reward functions)."""
    return value(completions, **kwargs)


# ---- building groups and loops ------------------------------------------------------------------------------
def make_group(texts, lengths=None, rows=None, group_id=7, model_version=3) -> RolloutGroup:
    """A scored-to-be group of one prompt: conversation i answers ``texts[i]`` in ``lengths[i]`` tokens and
    produced ``rows[i]`` training rows (TRL forks a multi-turn conversation into several)."""
    n = len(texts)
    lengths = lengths or [3 + i for i in range(n)]
    rows = [1] * n if rows is None else rows
    prompt = [{"role": "user", "content": "2 + 2?"}]
    sequences = []
    for i in range(n):
        ids = [10 + i] * lengths[i]
        sequences.append([TrainingSequence(input_ids=[1, 2, *ids], completion_mask=[0, 0] + [1] * len(ids),
                                           old_log_probs=[0.0, 0.0] + [-0.1 * (i + 1 + r)] * len(ids),
                                           rollout_id=f"conv{i}") for r in range(rows[i])])
    return RolloutGroup(
        prompts=[prompt] * n, reward_kwargs={"answer": ["4"] * n},
        completions=[[{"role": "assistant", "content": t}] for t in texts],
        completions_ids=[[10 + i] * lengths[i] for i in range(n)], completions_sequences=sequences,
        tool_call_counts=[0] * n, tool_failure_counts=[0] * n, model_version=model_version, group_id=group_id,
        env_rewards=[None] * n, rollout_rewards=[None] * n)


def make_loop(cls=PODSRolloutLoop, reward_funcs=(value, brevity), m=3, rule="max_variance", tiebreak="index",
              seed=None, n=8):
    """A loop with just what ``_score_group`` needs (its real ``__init__`` wants a tokenizer, queues, aiohttp),
    sampling n per prompt."""
    loop = object.__new__(cls)
    loop.num_generations = n
    loop.reward_funcs = list(reward_funcs)
    loop.reward_func_names = [get_callable_name(f) for f in reward_funcs]
    loop._env_reward_types = []
    loop.tokenizer = types.SimpleNamespace(eos_token_id=2, pad_token_id=0)
    loop.eos_token_ids = [2]
    if cls is PODSRolloutLoop:
        loop.init_pods(m, rule, tiebreak, seed=seed)
    return loop


def score(loop, group) -> list[RolloutSample]:
    return asyncio.run(loop._score_group(group))


def trl_output(group, reward_funcs=(value, brevity)) -> list[RolloutSample]:
    return score(make_loop(_AsyncRolloutLoop, reward_funcs), group)


def totals(group, reward_funcs=(value, brevity)) -> np.ndarray:
    """Each conversation's total reward, from TRL's own scoring of the whole group."""
    rows = _conv_rows(trl_output(group, reward_funcs), group)
    return np.array([rows[i][0].metrics["reward"] for i in range(len(group.completions))])


def _conv_rows(samples, group):
    out, start = [], 0
    for rows in group.completions_sequences:
        out.append(samples[start:start + len(rows)])
        start += len(rows)
    return out


def kept_conversations(samples) -> list[int]:
    return sorted({int(np.asarray(s.input_ids)[2]) - 10 for s in samples})


def by_hand(kept_rewards: list[float]) -> tuple[list[float], float]:
    """Advantages and std of the kept rewards, as TRL async defines them, in plain Python."""
    scored = [r for r in kept_rewards if not math.isnan(r)]
    mean, std = statistics.fmean(scored), statistics.pstdev(scored)
    return [0.0 if math.isnan(r) else (r - mean) / (std + 1e-8) for r in kept_rewards], std


def same_sample(a: RolloutSample, b: RolloutSample) -> bool:
    arrays = ("input_ids", "completion_mask", "old_log_probs")
    return all(np.array_equal(np.asarray(getattr(a, f.name)), np.asarray(getattr(b, f.name))) if f.name in arrays
               else getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(RolloutSample))


# ---- selection inside _score_group ---------------------------------------------------------------------------
TEXTS = ["0", "1", "0.5", "4", "0.25", "0", "1", "0.75"]


@pytest.mark.parametrize("rule", ["max_variance", "max_reward"])
def test_the_kept_m_are_the_rules_and_their_advantages_are_recomputed_on_them(rule):
    group = make_group(TEXTS)
    rewards = totals(group)
    samples = score(make_loop(m=3, rule=rule), group)
    kept = kept_conversations(samples)
    assert len(samples) == 3 and len(kept) == 3
    assert kept == downsample(torch.tensor(rewards), 3, rule).tolist()
    advantages, std = by_hand([rewards[i] for i in kept])
    assert [s.advantage for s in samples] == pytest.approx(advantages, rel=1e-12, abs=1e-12)
    assert all(s.metrics["reward_std"] == pytest.approx(std, rel=1e-12) for s in samples)
    assert all(s.metrics["reward"] == rewards[i] for s, i in zip(samples, kept, strict=True))


def test_kept_rows_are_trls_rows_but_for_advantage_and_metrics():
    group = make_group(TEXTS)
    trl_rows = _conv_rows(trl_output(group), group)
    samples = score(make_loop(m=4), group)
    for sample, i in zip(samples, kept_conversations(samples), strict=True):
        theirs = trl_rows[i][0]
        for name in ("prompt", "completion", "model_version", "group_id"):
            assert getattr(sample, name) == getattr(theirs, name)
        for name in ("input_ids", "completion_mask", "old_log_probs"):
            assert np.array_equal(getattr(sample, name), getattr(theirs, name))
        assert {k: v for k, v in sample.metrics.items() if not k.startswith("pods/") and k != "reward_std"} \
            == {k: v for k, v in theirs.metrics.items() if k != "reward_std"}
        assert sample.model_version == 3 and sample.group_id == 7


def test_the_pods_metrics_are_on_every_kept_row():
    group = make_group(TEXTS)
    rewards = totals(group)
    samples = score(make_loop(m=3), group)
    kept = [rewards[i] for i in kept_conversations(samples)]
    for sample in samples:
        assert POD_METRICS <= set(sample.metrics)
        assert sample.metrics["pods/reward_all_mean"] == pytest.approx(rewards.mean())
        assert sample.metrics["pods/reward_kept_mean"] == pytest.approx(np.mean(kept))
        assert sample.metrics["pods/reward_all_std"] == pytest.approx(rewards.std(ddof=1))
        assert sample.metrics["pods/frac_zero_std_all"] == 0.0


def test_m_equal_n_returns_trls_output_unchanged():
    group = make_group(TEXTS, rows=[1, 2, 1, 1, 1, 1, 1, 2])
    ours, theirs = score(make_loop(m=8), group), trl_output(group)
    assert len(ours) == len(theirs) == 10
    assert all(same_sample(a, b) for a, b in zip(ours, theirs, strict=True))


def test_unscored_rollouts_rank_as_average_and_get_advantage_zero():
    texts = ["?", "1", "0", "?", "0.5", "1", "0", "?"]
    group = make_group(texts)
    rewards = totals(group)
    assert np.isnan(rewards).sum() == 3
    ranked = np.where(np.isnan(rewards), np.nanmean(rewards), rewards)
    for m in (3, 6):
        samples = score(make_loop(m=m), group)
        kept = kept_conversations(samples)
        assert kept == downsample(torch.tensor(ranked), m, "max_variance").tolist()
        advantages, std = by_hand([rewards[i] for i in kept])
        assert [s.advantage for s in samples] == pytest.approx(advantages, rel=1e-12, abs=1e-12)
        assert any(np.isnan(rewards[i]) for i in kept) == (m == 6)  # at m=6 an unscored one is kept, advantage 0
    assert not any(math.isnan(s.advantage) for s in samples)


def test_a_group_with_nothing_scored_keeps_m_with_advantage_zero():
    group = make_group(["?"] * 6)
    samples = score(make_loop(m=2), group)
    assert kept_conversations(samples) == [0, 1]
    assert [s.advantage for s in samples] == [0.0, 0.0]
    assert math.isnan(samples[0].metrics["reward_std"])


def test_a_forked_conversation_keeps_all_its_rows():
    rows = [2, 1, 1, 2, 1, 1, 2, 1]
    group = make_group(TEXTS, rows=rows)
    rewards = totals(group)
    samples = score(make_loop(m=3), group)
    kept = kept_conversations(samples)
    assert kept == downsample(torch.tensor(rewards), 3, "max_variance").tolist()
    assert len(samples) == sum(rows[i] for i in kept) > 3
    advantages = dict(zip(kept, by_hand([rewards[i] for i in kept])[0], strict=True))
    ids = [int(np.asarray(s.input_ids)[2]) - 10 for s in samples]
    assert ids == sorted(ids)  # each conversation's rows together, in conversation order
    assert [s.advantage for s in samples] == pytest.approx([advantages[i] for i in ids], rel=1e-12)
    assert any(rows[i] == 2 for i in kept)
    for i in kept:  # all of a kept conversation's rows, each its own
        own = [s for s, conv in zip(samples, ids, strict=True) if conv == i]
        assert len(own) == rows[i] == len({float(np.asarray(s.old_log_probs)[-1]) for s in own})


def test_a_conversation_without_rows_counts_in_the_group_and_trains_nothing():
    group = make_group(TEXTS)
    group.completions_sequences[3] = []  # "4", the highest reward: max_variance keeps it
    samples = score(make_loop(m=3), group)
    full = make_group(TEXTS)
    rewards = totals(full)
    kept = downsample(torch.tensor(rewards), 3, "max_variance").tolist()
    assert 3 in kept and kept_conversations(samples) == [i for i in kept if i != 3]
    advantages = dict(zip(kept, by_hand([rewards[i] for i in kept])[0], strict=True))
    assert [s.advantage for s in samples] == pytest.approx([advantages[i] for i in kept if i != 3], rel=1e-12)
    assert len(trl_output(group)) == 7


@pytest.mark.parametrize("tiebreak", ["shorter", "longer"])
def test_the_length_tiebreak_reads_the_completion_tokens(tiebreak):
    texts = ["1", "0", "1", "0", "1", "0"]
    lengths = [9, 4, 2, 7, 5, 3]
    group = make_group(texts, lengths=lengths)
    samples = score(make_loop(reward_funcs=(value,), m=2, tiebreak=tiebreak), group)
    sign = 1 if tiebreak == "shorter" else -1
    expected = downsample(torch.tensor([1.0, 0, 1, 0, 1, 0]), 2, "max_variance",
                          tiebreak=torch.tensor(lengths, dtype=torch.float64) * sign).tolist()
    assert kept_conversations(samples) == expected == ([2, 5] if tiebreak == "shorter" else [0, 3])


def test_random_rule_is_reproducible_with_a_seed():
    group = make_group(TEXTS)
    draws = [kept_conversations(score(make_loop(m=3, rule="random", seed=5), group)) for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0]) == 3


def test_a_feature_rule_sees_lengths_and_each_functions_rewards(scratch_registry):
    seen = {}

    def longest(rewards, m, generator, *, features):
        seen.update(features)
        return features["lengths"].argsort(dim=1, descending=True, stable=True)[:, :m].sort(dim=1).values

    pods_rl.register_rule("test_async_longest", longest, overwrite=True)
    group = make_group(TEXTS, lengths=[5, 3, 9, 2, 8, 1, 4, 6])
    group.completions_ids[1][-1] = 2  # ends on eos: not truncated
    group.completions[4] = [{"role": "assistant", "content": "0.25"}, {"role": "tool", "content": "x"},
                            {"role": "assistant", "content": "0.25"}]
    group.tool_call_counts[4] = 1
    samples = score(make_loop(m=3, rule="test_async_longest"), group)
    assert kept_conversations(samples) == [2, 4, 7]
    assert seen["lengths"].tolist() == [[5, 3, 9, 2, 8, 1, 4, 6]]
    assert seen["rewards_per_func"].shape == (1, 8, 2)  # value and brevity, per conversation
    assert seen["rewards_per_func"][0, 3].tolist() == pytest.approx([4.0, -0.01 * 2 + 0.5])
    assert seen["truncated"].tolist() == [[True, False, True, True, True, True, True, True]]
    assert seen["tool_calls"].tolist() == [[0, 0, 0, 0, 1, 0, 0, 0]]
    assert seen["turns"].tolist() == [[1, 1, 1, 1, 2, 1, 1, 1]]


def test_async_reward_functions_and_sources_sharing_a_name():
    group = make_group(TEXTS)
    samples = score(make_loop(reward_funcs=(async_value, brevity), m=3), group)
    assert kept_conversations(samples) == kept_conversations(score(make_loop(m=3), group))

    def twin(completions, **kwargs):
        return [1.0] * len(completions)

    twin.__name__ = "value"  # TRL logs both as rewards/value: the rule ranks by their total, which TRL keeps
    loop = make_loop(reward_funcs=(value, twin), m=3)
    rewards = np.array([float(t) + 1.0 for t in TEXTS])
    samples = score(loop, group)
    assert kept_conversations(samples) == downsample(torch.tensor(rewards), 3, "max_variance").tolist()


def test_bad_settings_fail_with_one_line_naming_the_worker_argument():
    loop = object.__new__(PODSRolloutLoop)
    with pytest.raises(ValueError, match=r"^pods_m must be .*2"):
        loop.init_pods(1)
    with pytest.raises(ValueError, match="pods_m must be at most num_generations"):
        loop.init_pods(9, n=8)
    with pytest.raises(ValueError, match=r"(?i)unknown.*pods_rule"):
        loop.init_pods(2, "nope")
    with pytest.raises(ValueError, match="pods_tiebreak"):
        loop.init_pods(2, tiebreak="short")
    with pytest.raises(ValueError, match="pods_rule_module='no.such.module' could not be imported"):
        loop.init_pods(2, rule_module="no.such.module")


# ---- the worker ----------------------------------------------------------------------------------------------
def test_the_worker_runs_the_pods_loop_and_checks_its_settings_before_spawning():
    assert issubclass(PODSRolloutWorker, AsyncRolloutWorker) and PODSRolloutWorker._loop_cls is PODSRolloutLoop
    with pytest.raises(ValueError, match="pods_m must be at most num_generations"):
        PODSRolloutWorker(pods_m=5, num_generations=4)
    if not trl_worker.is_vllm_available():  # TRL refuses to build its worker without vLLM (noted in the guide)
        with pytest.raises(ImportError, match="vLLM is required"):
            PODSRolloutWorker(pods_m=2, num_generations=4)


def _trl_default_worker_kwargs(monkeypatch, model_dir, args, dataset) -> dict:
    """What AsyncGRPOTrainer.__init__ gives its default AsyncRolloutWorker, recorded (no vLLM, no GPU: the
    worker class and the peak-FLOPs lookup, which asks CUDA for the device name, are replaced)."""
    recorded = {}

    class Recorder:
        def __init__(self, **kwargs):
            recorded.update(kwargs)
            self.rollout_buffer = self.metrics_queue = queue.Queue()

    class NoTransfer:
        def init_weight_transfer(self):
            pass

    monkeypatch.setattr(trl_trainer, "AsyncRolloutWorker", Recorder)
    monkeypatch.setattr(trl_trainer, "get_peak_flops_per_device", lambda *a, **k: None, raising=False)
    AsyncGRPOTrainer(model=str(model_dir), reward_funcs=[value, brevity], args=args, train_dataset=dataset,
                     weight_transfer=NoTransfer())
    return recorded


# TRL's AsyncGRPOConfig turns checkpointing on under the name transformers 5.2x deprecates (one FutureWarning per
# config): the same setting, under the new name where this transformers has it.
CHECKPOINTING = ("activation_checkpointing" if "activation_checkpointing" in AsyncGRPOConfig.__dataclass_fields__
                 else "gradient_checkpointing")


def _config(tmp_path, **kwargs) -> AsyncGRPOConfig:
    kwargs.setdefault(CHECKPOINTING, True)
    return AsyncGRPOConfig(output_dir=str(tmp_path / "out"), num_generations=8, per_device_train_batch_size=4,
                           report_to=[], use_cpu=True, max_completion_length=16, temperature=0.9, **kwargs)


def test_the_worker_gets_what_trls_default_worker_gets(tmp_path, monkeypatch, tiny_model_dir):
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "2 + 2?"}]] * 4, "answer": ["4"] * 4})
    ours = pods_worker_kwargs(str(tiny_model_dir), [value, brevity], _config(tmp_path), dataset, pods_m=2,
                              pods_rule="max_reward")
    theirs = _trl_default_worker_kwargs(monkeypatch, tiny_model_dir, _config(tmp_path), dataset)
    pods = {k: ours.pop(k) for k in list(ours) if k.startswith("pods_")}
    assert pods == {"pods_m": 2, "pods_rule": "max_reward"}  # the rest: the loop's defaults
    assert theirs["max_inflight_tasks"] == 4 * 4  # max_staleness x rows per step, in rollouts
    assert ours.pop("max_inflight_tasks") == 4 * 4 * 8 // 2  # the same in rows at m=2 of n=8
    theirs.pop("max_inflight_tasks")
    assert set(ours) == set(theirs)
    for key in ("dataset", "processing_class"):
        assert type(ours.pop(key)) is type(theirs.pop(key))
    assert ours == theirs and ours["num_generations"] == 8 and ours["eos_token_ids"]
    explicit = pods_worker_kwargs(str(tiny_model_dir), value, _config(tmp_path, max_inflight_tasks=5), dataset,
                                  pods_m=2)
    assert explicit["max_inflight_tasks"] == 5 and explicit["reward_funcs"] == [value]


def real_loop(tmp_path, monkeypatch, model_dir, reward_funcs=(value, brevity), dataset=None, cls=PODSRolloutLoop,
              args=None, **pods) -> PODSRolloutLoop:
    """The loop as the worker's child builds it: the worker's kwargs (``pods_worker_kwargs``) plus its queues;
    aiohttp (only the network code uses it, and it is not installed here) is stubbed for the annotation
    ``__init__`` evaluates. Close it with ``close_loop``."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    monkeypatch.setattr(trl_worker, "aiohttp", types.SimpleNamespace(ClientSession=object), raising=False)
    # The project's char tokenizer has a chat template TRL cannot parse replies of (add_response_schema refuses it);
    # generation would need a parser, scoring does not: a placeholder one.
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.response_template = {"placeholder": True}
    if dataset is None:
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "2 + 2?"}]] * 4, "answer": ["4"] * 4})
    kwargs = pods_worker_kwargs(str(model_dir), list(reward_funcs), args or _config(tmp_path), dataset, tokenizer,
                                **pods)
    kwargs["queue_maxsize"] = 0  # AsyncRolloutWorker.__init__ adds these two before forwarding
    kwargs["dataset_start_index"] = 0
    return cls(**kwargs, rollout_buffer=queue.Queue(), model_version_value=types.SimpleNamespace(value=0),
               heartbeat_value=types.SimpleNamespace(value=0.0), failed_event=threading.Event(),
               exception_info_queue=queue.Queue(), metrics_queue=queue.Queue())


def close_loop(loop) -> None:
    if hasattr(loop, "_tool_pool"):  # the thread pool newer TRL runs tools in (TRL 1.12 has none)
        loop._tool_pool.shutdown()
    loop._loop.close()


def test_the_loops_real_init_takes_those_arguments_and_scores(tmp_path, monkeypatch, tiny_model_dir):
    loop = real_loop(tmp_path, monkeypatch, tiny_model_dir, pods_m=3, pods_tiebreak="shorter")
    try:
        assert loop.num_generations == 8 and loop.pods.m == 3 and loop.pods.tiebreak == "shorter"
        assert loop.adaptive is None
        group = make_group(TEXTS)
        samples = asyncio.run(loop._score_group(group))
        rewards = totals(group)
        lengths = torch.tensor([len(ids) for ids in group.completions_ids], dtype=torch.float64)
        assert kept_conversations(samples) == downsample(torch.tensor(rewards), 3, tiebreak=lengths).tolist()
    finally:
        close_loop(loop)


# ---- adaptive rollouts: the worker tops up all-equal groups ----------------------------------------------------
SCORED = []  # (group id, conversation) of every rollout a reward function scored (it runs in this process)


def scored_value(completions, prompts, **kwargs):
    """``value``, recording what it scored."""
    SCORED.extend((c[0]["group"], c[0]["conversation"]) for c in completions)
    return value(completions)


# Conversation j of each prompt answers SCRIPT[prompt][j]: "mixed" is mixed in its pilot, "late" all-equal in its
# pilot of 4 and mixed after one round of 2, "flat" all equal up to n = 8, "fails" raises in its first top-up.
SCRIPT = {"mixed": "01011111", "late": "11110111", "flat": "00000000", "fails": "1111"}


class ScriptedLoop(PODSRolloutLoop):
    """The PODS loop with TRL's generation loop and scoring, whose one call to the vLLM server per conversation
    (``_generate_one``) answers from ``SCRIPT`` instead (the vLLM lane runs the real server)."""

    async def _generate_one(self, prompt, tool_dict, tools, group_id=0):
        text = prompt[-1]["content"]
        j = self.sampled.setdefault(group_id, 0)
        self.sampled[group_id] = j + 1
        await asyncio.sleep(0.001 * (j % 3))  # rollouts finish out of order, as the server's do
        if j >= len(SCRIPT[text]):
            raise RuntimeError(f"the server failed on {text!r}")
        ids = [10 + j] * (2 + j)
        rows = [TrainingSequence([1, 2, *ids], [0, 0] + [1] * len(ids), [0.0, 0.0] + [-0.5] * len(ids), f"{text}{j}")]
        reply = {"role": "assistant", "content": SCRIPT[text][j], "group": group_id, "conversation": j}
        return [reply], ids, rows, 0, 0, None


def drew_after(events: list[tuple], first: tuple) -> bool:
    """Whether ``events`` hold a ("draw", ...) after the first event that starts with ``first``."""
    at = next((i for i, event in enumerate(events) if event[:len(first)] == first), None)
    return at is not None and any(event[0] == "draw" for event in events[at:])


def run_loops(loop, groups: int, timeout: float = 30.0, until=lambda: True) -> dict[int, list[RolloutSample]]:
    """TRL's generate and score loops (PODS's scoring) until the groups with ids below ``groups`` reached the
    rollout buffer (later ones may have too: the dataset cycles) and ``until()`` holds; each group's rows.

    Rewards are computed in threads, so how far generation runs ahead of scoring depends on the machine's load:
    a test that needs an event after another (a draw after a verdict) says so in ``until``, not by timing."""
    rows = {}

    async def drive():
        stop = asyncio.Event()
        loops = asyncio.gather(loop._generate_loop(stop), loop._score_loop(stop))
        deadline = time.monotonic() + timeout
        while not (set(range(groups)) <= set(rows) and until()):
            if loops.done():
                loops.result()  # a loop that ended raises its error here
            while not loop.rollout_buffer.empty():
                sample = loop.rollout_buffer.get_nowait()
                rows.setdefault(sample.group_id, []).append(sample)
            assert time.monotonic() < deadline, f"only {sorted(rows)} of {groups} groups in {timeout} s"
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(loops, timeout)

    asyncio.run(drive())
    return rows


def adaptive_loop(tmp_path, monkeypatch, model_dir, prompts, **pods):
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    loop = real_loop(tmp_path, monkeypatch, model_dir, (scored_value,), dataset, ScriptedLoop,
                     _config(tmp_path, max_inflight_tasks=6), **pods)
    loop.sampled = {}
    return loop


def test_adaptive_tops_up_all_equal_groups_in_the_background_and_keeps_m_of_them(tmp_path, monkeypatch,
                                                                                  tiny_model_dir):
    """n = 8, m = 3, pilot 4, rounds of 2: "mixed" stops at 4, "late" at 6, "flat" at n = 8; every rollout is scored
    once; each group's m kept rows are max_variance's choice from all its rollouts, with advantages by hand."""
    SCORED.clear()
    loop = adaptive_loop(tmp_path, monkeypatch, tiny_model_dir, ["flat", "late", "mixed"], pods_m=3, pods_pilot=4,
                         pods_round_size=2)
    try:
        assert loop.num_generations == 4 and loop.pods_n == 8  # TRL's generate loop emits the pilot
        rows = run_loops(loop, groups=3)
    finally:
        close_loop(loop)
    expected_counts = {"mixed": 4, "late": 6, "flat": 8}
    for group_id, text in enumerate(["flat", "late", "mixed"]):
        count = expected_counts[text]
        assert loop.sampled[group_id] == count
        order = [j for g, j in SCORED if g == group_id]  # the group's conversations, in the group's order
        assert sorted(order) == list(range(count))  # each rollout scored once
        rewards = [float(SCRIPT[text][j]) for j in order]
        kept = [order[i] for i in downsample(torch.tensor([rewards]), 3)[0].tolist()]
        by_conversation = {int(np.asarray(s.input_ids)[2]) - 10: s for s in rows[group_id]}
        assert sorted(by_conversation) == sorted(kept) and len(rows[group_id]) == 3
        advantages, std = by_hand([float(SCRIPT[text][j]) for j in kept])
        assert [by_conversation[j].advantage for j in kept] == pytest.approx(advantages, abs=1e-9)
        metrics = rows[group_id][0].metrics
        assert metrics["pods/rollouts_sampled"] == count and metrics["pods/rounds"] == 1 + (count - 4) // 2
        assert metrics["pods/frac_zero_std_pilot"] == float(text != "mixed")
        assert metrics["pods/reward_all_mean"] == pytest.approx(statistics.fmean(rewards))
        assert metrics["reward_std"] == pytest.approx(std)
        assert {s.model_version for s in rows[group_id]} == {0}
    assert not loop._top_ups and all(g >= 3 for g in loop._scored)  # later groups' top-ups: cancelled


def test_reinforce_ada_runs_in_the_worker_rounds_balanced_keep_and_baseline_from_all(tmp_path, monkeypatch,
                                                                                     tiny_model_dir):
    """Reinforce-Ada in the asynchronous worker: its rounds (4 rollouts each, at most n = 8), its balanced keep of
    m = 4 and its baseline from every rollout sampled. "mixed" (0101) leaves after its pilot with 2 positives and 2
    negatives; "late" (1111 then 0111) never finds a second negative and stops at n; "flat" stops at n. Each kept
    rollout's advantage is against all of its group's rollouts, TRL's formula, by hand."""
    SCORED.clear()
    loop = adaptive_loop(tmp_path, monkeypatch, tiny_model_dir, ["flat", "late", "mixed"], pods_m=4, pods_pilot=4,
                         pods_adaptive_rule="reinforce_ada", pods_rule="reinforce_ada",
                         pods_advantage_baseline="sampled")
    try:
        rows = run_loops(loop, groups=3)
    finally:
        close_loop(loop)
    for group_id, (text, count) in enumerate([("flat", 8), ("late", 8), ("mixed", 4)]):
        assert loop.sampled[group_id] == count
        order = [j for g, j in SCORED if g == group_id]
        assert sorted(order) == list(range(count))
        rewards = [float(SCRIPT[text][j]) for j in order]
        kept = sorted(order[i] for i in downsample(torch.tensor([rewards]), 4, "reinforce_ada")[0].tolist())
        by_conversation = {int(np.asarray(s.input_ids)[2]) - 10: s for s in rows[group_id]}
        assert sorted(by_conversation) == kept
        every, _ = by_hand([float(SCRIPT[text][j]) for j in range(count)])
        assert [by_conversation[j].advantage for j in kept] == pytest.approx([every[j] for j in kept], abs=1e-9)
        assert rows[group_id][0].metrics["pods/rounds"] == count // 4
    assert sorted(by_conversation) == [0, 1, 2, 3]  # "mixed": all of its pilot
    late = {int(np.asarray(s.input_ids)[2]) - 10: s.advantage for s in rows[1]}
    assert len(late) == 4 and late[4] == pytest.approx(-7 / 8 / (7 ** 0.5 / 8 + 1e-8))  # its one failure: kept


def length_penalty(completion_ids, **kwargs):
    """-0.01 per completion token: varies within every group (conversation j has 2 + j tokens)."""
    return [-0.01 * len(ids) for ids in completion_ids]


@pytest.mark.parametrize("adaptive_reward", [None, "scored_value"])
def test_the_adaptive_reward_alone_decides_whether_a_group_is_mixed(tmp_path, monkeypatch, tiny_model_dir,
                                                                     adaptive_reward):
    """By the total (value + length penalty) every pilot is mixed, so "late" stops at its pilot; judged on
    ``scored_value`` alone its pilot is all equal and it gets a round."""
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "late"}]]})
    loop = real_loop(tmp_path, monkeypatch, tiny_model_dir, (scored_value, length_penalty), dataset, ScriptedLoop,
                     _config(tmp_path, max_inflight_tasks=6), pods_m=3, pods_pilot=4, pods_round_size=2,
                     pods_adaptive_reward=adaptive_reward)
    loop.sampled = {}
    try:
        rows = run_loops(loop, groups=1)
    finally:
        close_loop(loop)
    assert rows[0][0].metrics["pods/rollouts_sampled"] == (4 if adaptive_reward is None else 6)


def test_a_failing_top_up_fails_the_loop(tmp_path, monkeypatch, tiny_model_dir):
    """A top-up whose generation fails makes the worker's loop fail with that error, as TRL's generate loop does."""
    loop = adaptive_loop(tmp_path, monkeypatch, tiny_model_dir, ["fails"], pods_m=2, pods_pilot=4)
    try:
        with pytest.raises(RuntimeError, match="the server failed on 'fails'"):
            run_loops(loop, groups=1)
    finally:
        close_loop(loop)


class VersionBumpingLoop(ScriptedLoop):
    """The trainer publishes policy version 3 while a group is being topped up (its first round's rollouts)."""

    async def _generate_one(self, prompt, tool_dict, tools, group_id=0):
        if self.sampled.get(group_id, 0) >= 4:
            self._model_version_value.value = 3
        return await super()._generate_one(prompt, tool_dict, tools, group_id=group_id)


@pytest.mark.parametrize("max_staleness", [2, 3])
def test_trls_staleness_filter_counts_a_topped_up_group_from_its_pilot(tmp_path, monkeypatch, tiny_model_dir,
                                                                       max_staleness):
    """The policy moves on (version 0 -> 3) while "late" is topped up: its m kept rows (two of the pilot, the 0 its
    round brought) keep the pilot's version 0, and TRL's own consumer (``RolloutQueueDataset``, the trainer at version
    3) drops all of them together at max_staleness 2 and trains all of them at 3; a group sampled at version 3
    passes either way."""
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "late"}]]})
    loop = real_loop(tmp_path, monkeypatch, tiny_model_dir, (scored_value,), dataset, VersionBumpingLoop,
                     _config(tmp_path, max_inflight_tasks=6), pods_m=3, pods_pilot=4, pods_round_size=2)
    loop.sampled = {}
    try:
        rows = run_loops(loop, groups=1)
    finally:
        close_loop(loop)
    assert loop.sampled[0] == 6 and loop.model_version == 3  # the version moved during the top-up
    topped_up = rows[0]
    conversations = {int(np.asarray(s.input_ids)[2]) - 10 for s in topped_up}
    assert len(topped_up) == 3 and 4 in conversations  # a row of the top-up (scored at version 3) is kept
    assert {s.model_version for s in topped_up} == {0}
    fresh = [dataclasses.replace(s, group_id=9, model_version=3) for s in topped_up]  # as if sampled at version 3
    rollouts = queue.Queue()
    for sample in [*topped_up, *fresh]:
        rollouts.put(sample)
    metrics = collections.defaultdict(list)
    consumer = trl_trainer.RolloutQueueDataset(rollouts, model_version_fn=lambda: 3, check_health_fn=lambda s: None,
                                               stale_after_s=60.0, metrics=metrics, max_staleness=max_staleness,
                                               poll_interval_s=0.1)
    wanted = len(fresh) + (3 if max_staleness >= 3 else 0)
    trained_groups = [row["group_id"] for row in itertools.islice(iter(consumer), wanted)]
    dropped = len(metrics["sample/dropped_stale_total"])
    if max_staleness == 2:
        assert dropped == 3 and trained_groups == [9] * len(fresh)
    else:
        assert dropped == 0 and trained_groups == [0] * 3 + [9] * len(fresh)
        assert metrics["sample/staleness_max"][:3] == [3.0] * 3


def test_adaptive_settings_fail_with_one_line_naming_the_worker_argument(tmp_path, tiny_model_dir):
    args = _config(tmp_path)
    cases = {"pods_pilot (k) must be an integer in [1, num_generations=8]": dict(pods_pilot=9),
             "pods_pilot needs pods_m (m) < num_generations": dict(pods_m=8, pods_pilot=4),
             "Unknown pods_adaptive_rule 'often'": dict(pods_pilot=4, pods_adaptive_rule="often"),
             "pods_round_size must be a positive integer": dict(pods_pilot=4, pods_round_size=0),
             "pods_adaptive_rule=budgeted needs pods_adaptive_budget":
                 dict(pods_pilot=4, pods_adaptive_rule="budgeted"),
             "pods_adaptive_reward 'correct' is not one of this run's reward functions ['value']": dict(
                 pods_pilot=4, pods_adaptive_reward="correct"),
             "pods_pilot (adaptive rollouts) does not support environment_factory": dict(
                 pods_pilot=4, environment_factory=object)}
    for message, settings in cases.items():
        settings = {"pods_m": 2, **settings}
        with pytest.raises(ValueError, match=re.escape(message)) as error:
            pods_worker_kwargs(str(tiny_model_dir), [value], args, None, **settings)
        assert "\n" not in str(error.value)


# ---- the TRL internals the module touches --------------------------------------------------------------------
def test_trl_async_internals_are_where_pods_expects_them():
    assert inspect.iscoroutinefunction(_AsyncRolloutLoop._score_group)
    assert list(inspect.signature(_AsyncRolloutLoop._score_group).parameters) == ["self", "group"]
    # scoring twice, the reward functions called once: _score_group calls what self.reward_funcs holds (replaced by
    # recording, then replaying, coroutine functions), each with keyword arguments
    score_source = inspect.getsource(_AsyncRolloutLoop._score_group)
    assert "for reward_func in self.reward_funcs" in score_source and "reward_func(**kwargs)" in score_source
    assert AsyncRolloutWorker._loop_cls is _AsyncRolloutLoop
    assert [p.kind for p in inspect.signature(AsyncRolloutWorker.__init__).parameters.values()][-1] \
        is inspect.Parameter.VAR_KEYWORD
    fields = {f.name for f in dataclasses.fields(RolloutGroup)}
    assert {"prompts", "reward_kwargs", "completions", "completions_ids", "completions_sequences",
            "tool_call_counts", "tool_failure_counts", "model_version", "group_id", "env_rewards",
            "rollout_rewards"} <= fields
    assert [f.name for f in dataclasses.fields(TrainingSequence)] == ["input_ids", "completion_mask",
                                                                      "old_log_probs", "rollout_id"]
    assert {"prompt", "completion", "input_ids", "completion_mask", "old_log_probs", "advantage", "model_version",
            "group_id", "metrics"} <= {f.name for f in dataclasses.fields(RolloutSample)}
    loop_params = inspect.signature(_AsyncRolloutLoop.__init__).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in loop_params.items() if name != "self")
    assert "rollout_worker" in inspect.signature(AsyncGRPOTrainer.__init__).parameters
    # adaptive top-ups: one conversation sampled, the score queue, the counters the generate loop keeps
    assert list(inspect.signature(_AsyncRolloutLoop._generate_one).parameters) == ["self", "prompt", "tool_dict",
                                                                                  "tools", "group_id"]
    assert list(inspect.signature(_AsyncRolloutLoop._score_loop).parameters) == ["self", "stop_event"]
    init_source = inspect.getsource(_AsyncRolloutLoop.__init__)
    for attribute in ("self._groups_to_score", "self._standalone_tools", "self._total_completion_tokens",
                      "self.max_inflight_tasks", "self.num_generations"):
        assert attribute in init_source, attribute
    assert "range(self.num_generations)" in inspect.getsource(_AsyncRolloutLoop._repeat_iterator)
    # the trainer keeps resume state only for an AsyncRolloutWorker (ours is one), and logs sample metrics
    assert "isinstance(self.rollout_worker, AsyncRolloutWorker)" in inspect.getsource(AsyncGRPOTrainer)
    assert 'example["metrics"]' in inspect.getsource(trl_trainer.DataCollatorForRollout._log_metrics)


def test_the_trainer_averages_every_pods_metric():
    """Sample metrics are averaged per micro-batch, then reduced over the logging window by their name: a
    ``total``/``max``/``min`` word would sum or take extremes of per-group values."""
    for key in POD_METRICS:
        assert trl_trainer._reduce_metric(key, [1.0, 3.0]) == 2.0, key
