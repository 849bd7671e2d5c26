"""The asynchronous worker's contract (issue #51 item 3): at m < n, ``PODSRolloutLoop._score_group`` returns for a
group exactly what TRL's own ``_score_group`` returns for the m conversations it keeps, scored as a group of their
own, plus the ``pods/*`` metrics: every field of every ``RolloutSample`` (tokens, masks, old log-probs, advantage,
policy version, group id) and every TRL metric (``reward``, ``reward_std``, ``rewards/<source>``, ``tools/*``).

The kept conversations are known in advance (a test rule keeps listed indices; it takes features, so it also sees
what a feature rule sees). The reference is a plain ``_AsyncRolloutLoop`` scoring a group built from the kept
conversations alone; each reward function runs once per group in PODS, on all n. Groups that reach scoring with
fewer than n rollouts (a server that returned fewer; TRL's open #7176 scores the survivors of failed generations)
keep m of what came, or all of it when that is at most m.

No vLLM server. Runs on both ends of TRL's range: the CI's oldest-TRL step runs this file on TRL 1.12 (with aiohttp,
which TRL 1.12's asynchronous module imports).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import types

import numpy as np
import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo.async_rollout_worker import (  # noqa: E402
    RolloutGroup,
    RolloutSample,
    TrainingSequence,
    _AsyncRolloutLoop,
)
from trl.trainer.utils import get_callable_name  # noqa: E402

import pods_rl  # noqa: E402
from pods_rl.downsample import downsample  # noqa: E402
from pods_rl.engines.trl_async.scoring import conversations_at  # noqa: E402
from pods_rl.engines.trl_async.worker import PODSRolloutLoop  # noqa: E402
from tests.test_async_pods import POD_METRICS, accelerate_state  # noqa: E402, F401  (a module fixture)

EOS, PAD = 2, 0
CALLS: list[tuple[str, int]] = []  # (reward function, conversations it scored) of every call


# ---- reward sources (module level, as the worker needs them) -------------------------------------------------
def value(completions, **kwargs):
    """The first message's text read as a number; None ("not scored") for "?"."""
    CALLS.append(("value", len(completions)))
    return [None if c[0]["content"] == "?" else float(c[0]["content"]) for c in completions]


def brevity(completions, completion_ids, answer, **kwargs):
    """-0.01 per completion token, +0.5 where the text is the row's answer; None for "?"."""
    CALLS.append(("brevity", len(completions)))
    return [None if c[0]["content"] == "?" else -0.01 * len(ids) + 0.5 * (c[0]["content"] == a)
            for c, ids, a in zip(completions, completion_ids, answer, strict=True)]


async def async_value(completions, **kwargs):
    """``value`` as a coroutine (TRL awaits it)."""
    CALLS.append(("async_value", len(completions)))
    return [None if c[0]["content"] == "?" else float(c[0]["content"]) for c in completions]


def array_length(completion_ids, **kwargs):
    """A numpy array, not a list: 0.1 per completion token."""
    CALLS.append(("array_length", len(completion_ids)))
    return np.array([0.1 * len(ids) for ids in completion_ids])


def lazy_length(completion_ids, **kwargs):
    """A generator, spent by the first pass over it: 0.2 per completion token."""
    CALLS.append(("lazy_length", len(completion_ids)))
    return (0.2 * len(ids) for ids in completion_ids)


def twin(completions, **kwargs):
    """1 everywhere, logged under ``value``'s name (``__name__`` set below): TRL keeps one ``rewards/value``."""
    CALLS.append(("twin", len(completions)))
    return [1.0] * len(completions)


twin.__name__ = "value"


class EnvA:
    """An environment class that owns a reward (TRL stores it per rollout in ``RolloutGroup.env_rewards``)."""


# ---- conversations, groups, loops ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Conv:
    """Conversation ``i`` of a group: its tokens carry ``i``, so a group of some conversations builds the same rows
    for them as the whole group. ``rows``: training rows (TRL forks a multi-turn conversation; 0: none)."""

    i: int
    text: str
    rows: int = 1
    calls: int = 0
    failures: int = 0
    env: float | None = None
    rollout: float | None = None
    answer: str = "4"
    eos: bool = False

    def ids(self) -> list[int]:
        return [10 + self.i] * (3 + self.i) + ([EOS] if self.eos else [])

    def messages(self) -> list[dict]:
        messages = [{"role": "assistant", "content": self.text}]
        for _ in range(self.calls):
            messages += [{"role": "tool", "content": "result"}, {"role": "assistant", "content": self.text}]
        return messages


def group_of(convs, *, env=False, group_id=7, model_version=3) -> RolloutGroup:
    """The group TRL's generate loop would queue for these conversations of one prompt."""
    prompt = [{"role": "user", "content": "2 + 2?"}]
    sequences = [[TrainingSequence(input_ids=[1, 5, *c.ids()], completion_mask=[0, 0] + [1] * len(c.ids()),
                                   old_log_probs=[0.0, 0.0] + [-0.1 * (c.i + 1 + r)] * len(c.ids()),
                                   rollout_id=f"conv{c.i}") for r in range(c.rows)] for c in convs]
    return RolloutGroup(
        prompts=[prompt] * len(convs), reward_kwargs={"answer": [c.answer for c in convs]},
        completions=[c.messages() for c in convs], completions_ids=[c.ids() for c in convs],
        completions_sequences=sequences, tool_call_counts=[c.calls for c in convs],
        tool_failure_counts=[c.failures for c in convs], model_version=model_version, group_id=group_id,
        env_rewards=[None if c.env is None else (EnvA, c.env) for c in convs] if env else [],
        rollout_rewards=[c.rollout for c in convs])


def loop_of(cls, reward_funcs, *, env=False, rollout=False, n=8, m=None, rule="test_keep_listed", baseline="kept"):
    """A loop with what ``_score_group`` reads (its real ``__init__`` wants a tokenizer, queues, aiohttp), set as
    TRL's ``__init__`` sets it: reward sources named after the functions, then the environment classes that own a
    reward, then a rollout reward (as TRL's OpenEnv harness loop)."""
    loop = object.__new__(cls)
    loop.num_generations = n
    loop.reward_funcs = list(reward_funcs)
    loop.reward_func_names = [get_callable_name(f) for f in reward_funcs] + ["EnvA"] * env + ["rollout"] * rollout
    loop._env_reward_types = [EnvA] if env else []
    loop._provides_rollout_reward = rollout
    loop.tokenizer = types.SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    loop.eos_token_ids = [EOS]
    if cls is PODSRolloutLoop:
        loop.init_pods(m, rule, advantage_baseline=baseline)
    return loop


KEEP: list[int] = []
SEEN: dict[str, torch.Tensor] = {}


def keep_listed(rewards, m, generator, *, features):
    """The test rule: keeps the indices in ``KEEP``, whatever the rewards; notes the features it was given."""
    SEEN.clear()
    SEEN.update(features)
    return torch.tensor([KEEP[:m]] * rewards.shape[0])


@pytest.fixture
def keep(scratch_registry):
    pods_rl.register_rule("test_keep_listed", keep_listed, overwrite=True)
    yield KEEP
    KEEP.clear()


def score(loop, group) -> list[RolloutSample]:
    return asyncio.run(loop._score_group(group))


def same_number(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def assert_same_rows(ours: list[RolloutSample], theirs: list[RolloutSample]) -> None:
    """Field for field, exactly: arrays by value and dtype, metrics but ``pods/*`` key for key (NaN equals NaN)."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        for field in dataclasses.fields(RolloutSample):
            x, y = getattr(a, field.name), getattr(b, field.name)
            if field.name == "metrics":
                x = {key: v for key, v in x.items() if not key.startswith("pods/")}
                assert x.keys() == y.keys() and all(same_number(x[key], y[key]) for key in x), (x, y)
            elif isinstance(y, np.ndarray | list):
                assert type(x) is type(y) and np.asarray(x).dtype == np.asarray(y).dtype
                assert np.array_equal(x, y), field.name
            else:
                assert same_number(x, y), (field.name, x, y)
        assert POD_METRICS <= set(a.metrics)


def conv_of(sample: RolloutSample) -> int:
    return int(np.asarray(sample.input_ids)[2]) - 10


TEXTS = ["0", "1", "0.5", "4", "0.25", "0", "1", "0.75"]
PLAIN = [Conv(i, t) for i, t in enumerate(TEXTS)]
CASES = {  # name: (conversations, kept, reward functions, env rewards?, rollout rewards?)
    "two functions": (PLAIN, [0, 2, 5, 6], (value, brevity), False, False),
    "unscored ones kept": ([Conv(i, t) for i, t in enumerate(["?", "1", "?", "0", "0.5", "?", "1", "0"])],
                           [0, 3, 4], (value, brevity), False, False),
    "nothing kept is scored": ([Conv(i, t) for i, t in enumerate(["?", "1", "?", "0", "0.5", "?"])], [0, 2],
                               (value, brevity), False, False),
    "tool calls only among the dropped": ([Conv(i, t, calls=2 * (i in (1, 5)), failures=i == 5)
                                           for i, t in enumerate(TEXTS)], [0, 2, 3], (value,), False, False),
    "tool calls among the kept": ([Conv(i, t, calls=i % 3, failures=i == 4) for i, t in enumerate(TEXTS)],
                                  [1, 2, 4, 5], (value, brevity), False, False),
    "forks and a conversation without rows": ([Conv(i, t, rows=[1, 2, 1, 1, 0, 1, 3, 1][i])
                                               for i, t in enumerate(TEXTS)], [1, 4, 6], (value,), False, False),
    "environment and rollout rewards": ([Conv(i, t, env=None if i % 2 else 0.25 * i, rollout=[None, 1.0][i % 2])
                                         for i, t in enumerate(["?", "1", "0", "?", "1", "0", "1", "0"])],
                                        [0, 1, 3, 6], (value,), True, True),
    "async, array, generator and twin-named functions": (PLAIN, [1, 3, 7], (value, async_value, array_length,
                                                                          lazy_length, twin), False, False),
    "answers and eos per conversation": ([Conv(i, t, answer=t if i % 2 else "4", eos=i % 3 == 0)
                                          for i, t in enumerate(TEXTS)], [2, 3, 5, 6, 7], (brevity,), False, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_kept_rows_are_trls_own_scoring_of_the_kept_conversations(keep, case):
    convs, kept, funcs, env, rollout = CASES[case]
    keep[:] = kept
    n = len(convs)
    CALLS.clear()
    ours = score(loop_of(PODSRolloutLoop, funcs, env=env, rollout=rollout, n=8, m=len(kept)), group_of(convs, env=env))
    assert sorted(CALLS) == sorted((get_callable_name(f) if f is not twin else "twin", n) for f in funcs)
    CALLS.clear()
    theirs = score(loop_of(_AsyncRolloutLoop, funcs, env=env, rollout=rollout, n=len(kept)),
                   group_of([convs[i] for i in kept], env=env))
    assert_same_rows(ours, theirs)
    assert sorted({conv_of(s) for s in ours}) == [i for i in kept if convs[i].rows]
    # what the rule saw, per conversation (the asynchronous path of pods_rl.rollouts.rollout_features)
    assert SEEN["lengths"].tolist() == [[len(c.ids()) for c in convs]]
    assert SEEN["tool_calls"].tolist() == [[c.calls for c in convs]]
    assert SEEN["turns"].tolist() == [[c.calls + 1 for c in convs]]
    assert SEEN["truncated"].tolist() == [[not c.eos for c in convs]]
    names = loop_of(_AsyncRolloutLoop, funcs, env=env, rollout=rollout).reward_func_names
    columns = len(names) if len(set(names)) == len(names) else 1  # names shared: the rule ranks TRL's total
    assert SEEN["rewards_per_func"].shape == (1, n, columns)


def test_the_contract_tells_the_kept_groups_scoring_from_the_whole_groups(keep):
    """Not vacuous: TRL's scoring of the whole group gives the kept conversations other advantages, reward_std and
    tool metrics than their own group's, and the test above would see it."""
    convs = CASES["tool calls only among the dropped"][0]
    keep[:] = [0, 2, 3]
    whole = {conv_of(s): s for s in score(loop_of(_AsyncRolloutLoop, (value,)), group_of(convs))}
    ours = score(loop_of(PODSRolloutLoop, (value,), m=3), group_of(convs))
    for sample in ours:
        theirs = whole[conv_of(sample)]
        assert sample.advantage != theirs.advantage and sample.metrics["reward_std"] != theirs.metrics["reward_std"]
        assert "tools/call_frequency" in theirs.metrics and "tools/call_frequency" not in sample.metrics
    with pytest.raises(AssertionError):
        assert_same_rows(ours, [whole[conv_of(s)] for s in ours])


@pytest.mark.parametrize("case", list(CASES))
def test_the_sampled_baseline_gives_each_kept_row_its_advantage_in_the_whole_group(keep, case):
    """``pods_advantage_baseline="sampled"`` (Reinforce-Ada's baseline from all n): every field of every row is TRL's
    scoring of the kept group, but the advantage, which is TRL's own for that conversation scored in the whole
    group; each reward function still runs once."""
    convs, kept, funcs, env, rollout = CASES[case]
    keep[:] = kept
    CALLS.clear()
    ours = score(loop_of(PODSRolloutLoop, funcs, env=env, rollout=rollout, m=len(kept), baseline="sampled"),
                 group_of(convs, env=env))
    assert sorted(CALLS) == sorted((get_callable_name(f) if f is not twin else "twin", len(convs)) for f in funcs)
    theirs = score(loop_of(_AsyncRolloutLoop, funcs, env=env, rollout=rollout, n=len(kept)),
                   group_of([convs[i] for i in kept], env=env))
    whole = {conv_of(s): s.advantage for s in score(loop_of(_AsyncRolloutLoop, funcs, env=env, rollout=rollout,
                                                            n=len(convs)), group_of(convs, env=env))}
    assert_same_rows(ours, [dataclasses.replace(row, advantage=whole[conv_of(row)]) for row in theirs])
    if case == "two functions":  # not vacuous: the kept group's own advantages differ
        assert [row.advantage for row in ours] != [row.advantage for row in theirs]


def test_an_unknown_advantage_baseline_is_one_line_naming_the_worker_argument():
    from pods_rl.engines.trl_async.worker import check_worker_settings

    with pytest.raises(ValueError, match=r"^pods_advantage_baseline must be one of \['kept', 'sampled'\], "
                                         r"got 'global'\.$"):
        check_worker_settings(4, 8, [value], pods_advantage_baseline="global")
    with pytest.raises(ValueError, match="pods_advantage_baseline"):
        loop_of(PODSRolloutLoop, (value,), m=4, rule="max_variance", baseline="all")


def test_a_reward_function_runs_once_per_group_even_when_it_is_not_deterministic(keep):
    """A judge that answers differently on every call: the kept rows carry the rewards of the one call on all n."""
    calls = collections.Counter()

    def judge(completions, **kwargs):
        calls["judge"] += 1
        return [float(10 * calls["judge"] + i) for i in range(len(completions))]

    keep[:] = [1, 4, 6]
    ours = score(loop_of(PODSRolloutLoop, (judge,), m=3), group_of(PLAIN))
    assert calls["judge"] == 1
    assert [s.metrics["rewards/judge"] for s in ours] == [11.0, 14.0, 16.0]


# ---- groups that reach scoring with fewer than n rollouts ---------------------------------------------------
@pytest.mark.parametrize("came", [7, 5, 4])
def test_a_group_with_fewer_than_n_keeps_m_of_what_came(came):
    """n = 8, m = 3: the rule ranks the conversations that came (max_variance on their rewards), and the kept ones'
    rows are TRL's scoring of those three."""
    convs = PLAIN[:came]
    ours = score(loop_of(PODSRolloutLoop, (value, brevity), m=3, rule="max_variance"), group_of(convs))
    totals = torch.tensor([float(c.text) - 0.01 * len(c.ids()) + 0.5 * (c.text == "4") for c in convs])
    kept = downsample(totals, 3, "max_variance").tolist()
    assert sorted({conv_of(s) for s in ours}) == kept
    theirs = score(loop_of(_AsyncRolloutLoop, (value, brevity)), group_of([convs[i] for i in kept]))
    assert_same_rows(ours, theirs)
    assert ours[0].metrics["pods/reward_all_mean"] == pytest.approx(totals.double().mean().item())


@pytest.mark.parametrize("came", [3, 2, 1])
def test_a_group_with_at_most_m_keeps_all_of_them_as_trl_scores_them(came):
    """c <= m (n = 8, m = 3): every conversation is kept, as TRL at num_generations = m trains a short group; the
    rows are TRL's own for the group, with the ``pods/*`` metrics (nothing dropped: kept = all)."""
    convs = PLAIN[2:2 + came]
    ours = score(loop_of(PODSRolloutLoop, (value, brevity), m=3, rule="max_variance"), group_of(convs))
    theirs = score(loop_of(_AsyncRolloutLoop, (value, brevity)), group_of(convs))
    assert_same_rows(ours, theirs)
    assert {conv_of(s) for s in ours} == {c.i for c in convs}
    metrics = ours[0].metrics
    assert metrics["pods/reward_kept_mean"] == metrics["pods/reward_all_mean"]
    if came == 1:
        assert ours[0].advantage == 0.0


def test_a_group_with_no_rollouts_scores_nothing():
    CALLS.clear()
    assert score(loop_of(PODSRolloutLoop, (value,), m=3, rule="max_variance"), group_of([])) == []
    assert CALLS == []


def test_conversations_at_takes_every_per_conversation_list_and_refuses_what_it_cannot_split():
    group = group_of(CASES["environment and rollout rewards"][0], env=True)
    part = conversations_at(group, [6, 1])
    for field in dataclasses.fields(RolloutGroup):
        whole = getattr(group, field.name)
        if isinstance(whole, list):
            assert getattr(part, field.name) == [whole[6], whole[1]], field.name
        elif field.name != "reward_kwargs":
            assert getattr(part, field.name) == whole
    assert part.reward_kwargs == {"answer": ["4", "4"]}
    assert conversations_at(group_of(PLAIN), [3]).env_rewards == []  # not collected: stays empty
    broken = dataclasses.replace(group, tool_call_counts=group.tool_call_counts[:3])
    with pytest.raises(RuntimeError, match=r"^RolloutGroup.tool_call_counts has 3 entries for 8 "
                       r"conversations: pods_rl"):
        conversations_at(broken, [0])


@pytest.mark.parametrize("baseline", ["kept", "sampled"])
def test_an_adaptive_pilot_that_came_back_short_is_topped_up_from_what_came(tmp_path, monkeypatch, tiny_model_dir,
                                                                            baseline):
    """Pilot k = 4, m = 3, n = 8, rounds of 2, but only 2 of the pilot came back (both 1): the group is topped up
    (below m, all equal) to 4, mixed then (1 1 0 1); its pilot is the 2 that came, all equal (the first 4 are not);
    the kept rows are TRL's scoring of the kept conversations. With the sampled baseline, their advantages are
    against all 4 rollouts of both rounds (TRL's scoring of the whole group)."""
    from tests.test_async_pods import SCRIPT, adaptive_loop, close_loop, scored_value

    monkeypatch.setitem(SCRIPT, "short", "1101")
    loop = adaptive_loop(tmp_path, monkeypatch, tiny_model_dir, ["short"], pods_m=3, pods_pilot=4, pods_round_size=2,
                         pods_advantage_baseline=baseline)
    prompt = [{"role": "user", "content": "short"}]

    async def drive():
        group = RolloutGroup(prompts=[], reward_kwargs={}, completions=[], completions_ids=[],
                             completions_sequences=[], tool_call_counts=[], tool_failure_counts=[], model_version=0,
                             group_id=0, env_rewards=[], rollout_rewards=[])
        for _ in range(2):
            completion, ids, sequences, calls, failures, reward = await loop._generate_one(prompt, {}, None, 0)
            for name, item in [("prompts", prompt), ("completions", completion), ("completions_ids", ids),
                               ("completions_sequences", sequences), ("tool_call_counts", calls),
                               ("tool_failure_counts", failures), ("rollout_rewards", reward)]:
                getattr(group, name).append(item)
        rows = await loop._score_group(group)
        assert rows == []  # all equal and below m: topped up in the background
        while not rows:
            rows = await loop._score_group(await asyncio.wait_for(loop._groups_to_score.get(), 10))
        return group, rows

    try:
        group, rows = asyncio.run(drive())
    finally:
        close_loop(loop)
    assert loop.sampled[0] == len(group.completions) == 4
    rewards = torch.tensor([float(SCRIPT["short"][j]) for j in range(4)])
    kept = downsample(rewards, 3, "max_variance").tolist()
    assert sorted(conv_of(s) for s in rows) == kept
    by_hand = dataclasses.replace(group, **{name: [getattr(group, name)[i] for i in kept] for name in (
        "prompts", "completions", "completions_ids", "completions_sequences", "tool_call_counts",
        "tool_failure_counts", "rollout_rewards")})
    reference = score(loop_of(_AsyncRolloutLoop, (scored_value,)), by_hand)
    if baseline == "sampled":
        whole = {conv_of(row): row.advantage for row in score(loop_of(_AsyncRolloutLoop, (scored_value,)), group)}
        reference = [dataclasses.replace(row, advantage=whole[conv_of(row)]) for row in reference]
        assert sorted({round(row.advantage, 6) for row in reference}) == [-1.732051, 0.57735]  # 1 1 0 1 around 0.75
    assert_same_rows(rows, reference)
    metrics = rows[0].metrics
    assert (metrics["pods/rollouts_sampled"], metrics["pods/rounds"], metrics["pods/frac_zero_std_pilot"]) == (4, 2, 1)
