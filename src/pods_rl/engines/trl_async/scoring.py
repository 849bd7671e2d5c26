"""TRL's asynchronous scoring, run on a whole group and then on the conversations PODS keeps, each reward function
called once.

``PODSRolloutLoop`` (``pods_rl.engines.trl_async.worker``) scores a group of n conversations with TRL's own
``_AsyncRolloutLoop._score_group`` to learn their rewards, selects m, and scores the m again with the same
``_score_group`` as a group of their own, so that their advantages, ``reward_std`` and tool metrics are TRL's
formula on the kept group (the group GRPO at m would have made), not a copy of it. The second scoring must not
call the reward functions again (a judge model is expensive, and may not answer twice alike): the first records
what each function returned, the second replays it.

    conversations_at(group, [2, 5, 6])          -> those conversations as a RolloutGroup of their own
    outputs, funcs = recording(loop.reward_funcs) -> funcs run as TRL runs them; outputs[k]: function k's output
    replaying(scored, kept, F)                   -> F functions returning the kept conversations' recorded rewards
    with reward_funcs_as(loop, funcs): ...       -> ``loop.reward_funcs`` replaced for one ``_score_group``
    sampled_advantages(scored, kept)             -> the kept conversations' advantages against all of them
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect

import numpy as np
from trl.experimental.async_grpo.async_rollout_worker import RolloutGroup

__all__ = ["ScoredConversation", "conversations_at", "recording", "replaying", "reward_funcs_as", "sampled_advantages"]


def conversations_at(group: RolloutGroup, indices) -> RolloutGroup:
    """The group's conversations ``indices`` (in that order) as a group of their own: every per-conversation list
    (each list field of ``RolloutGroup`` and each ``reward_kwargs`` column) taken at them; the rest (policy version,
    group id, queue time) kept. An empty list stays empty (TRL fills ``env_rewards`` only when an environment owns
    a reward); a list of another length than the group's conversations is refused (one line): this TRL's
    ``RolloutGroup`` holds something this module does not know how to split."""
    indices, count = list(indices), len(group.completions)

    def taken(name: str, values: list) -> list:
        if not values:
            return []
        if len(values) != count:
            raise RuntimeError(f"RolloutGroup.{name} has {len(values)} entries for {count} conversations: "
                               "pods_rl.engines.trl_async.scoring does not know this TRL's RolloutGroup layout.")
        return [values[i] for i in indices]

    lists = {field.name: taken(field.name, getattr(group, field.name)) for field in dataclasses.fields(group)
             if isinstance(getattr(group, field.name), list)}
    kwargs = {key: taken(f"reward_kwargs[{key!r}]", values) for key, values in group.reward_kwargs.items()}
    return dataclasses.replace(group, **lists, reward_kwargs=kwargs)


@dataclasses.dataclass(frozen=True)
class ScoredConversation:
    """One conversation as TRL's ``_score_group`` scored it in its group: its row's ``metrics`` (``reward``, the
    total; ``rewards/<name>`` per reward source) and each reward function's own output for it (``rewards``, one
    entry per function, as the function returned it), which ``replaying`` gives back."""

    metrics: dict[str, float]
    rewards: tuple


def _awaited_by_trl(func) -> bool:
    """Whether TRL's ``_score_group`` awaits ``func`` rather than running it in a thread: TRL 1.16's
    ``is_async_callable`` (the async ``__call__`` of a callable instance too), else ``inspect.iscoroutinefunction``
    (TRL 1.12's test)."""
    from trl.trainer import utils as trl_utils

    return getattr(trl_utils, "is_async_callable", inspect.iscoroutinefunction)(func)


def recording(reward_funcs: list) -> tuple[list, list]:
    """``(outputs, funcs)``: coroutine functions that run each of ``reward_funcs`` as TRL's ``_score_group`` does
    (awaited, or in a thread) and keep its output, as a list, in ``outputs[k]`` (None until it ran)."""
    outputs: list = [None] * len(reward_funcs)

    def recorded(func, k: int):
        awaited = _awaited_by_trl(func)

        async def call(**kwargs):
            out = await func(**kwargs) if awaited else await asyncio.to_thread(func, **kwargs)
            outputs[k] = out = list(out)  # (a generator would be spent by TRL's first pass over it)
            return out

        return call

    return outputs, [recorded(func, k) for k, func in enumerate(reward_funcs)]


def replaying(scored: list[ScoredConversation], kept: list[int], num_funcs: int) -> list:
    """``num_funcs`` coroutine functions, the k-th returning function k's recorded output for each kept
    conversation (in ``kept``'s order) and running nothing."""

    def replayed(values: list):
        async def call(completions, **kwargs):
            if len(completions) != len(values):  # a bug of ours, not the user's: fail loudly
                raise RuntimeError(f"replaying {len(values)} rewards for a group of {len(completions)} conversations")
            return list(values)

        return call

    return [replayed([scored[i].rewards[k] for i in kept]) for k in range(num_funcs)]


@contextlib.contextmanager
def reward_funcs_as(loop, reward_funcs: list):
    """``loop.reward_funcs`` (what TRL's ``_score_group`` calls) replaced for one scoring. The score loop awaits one
    ``_score_group`` at a time and nothing else reads them, so no other scoring sees the replacement."""
    originals, loop.reward_funcs = loop.reward_funcs, reward_funcs
    try:
        yield
    finally:
        loop.reward_funcs = originals


def sampled_advantages(scored: list[ScoredConversation], kept: list[int]) -> np.ndarray:
    """(len(kept),) the kept conversations' advantages against a baseline from every scored conversation of the
    group (``pods_advantage_baseline="sampled"``, Reinforce-Ada's ``global_stat_est``): TRL's asynchronous formula,
    op for op, on the whole group, (reward - mean) / (std + 1e-8) with the population std over the scored totals
    (``metrics["reward"]``); 0 where a total is NaN (not scored), as TRL sets it. On a group scored in one call
    this is exactly the advantage TRL's ``_score_group`` gave that conversation in the whole group."""
    rewards = np.array([conversation.metrics["reward"] for conversation in scored], dtype=float)  # (c,)
    scored_mask = ~np.isnan(rewards)
    advantages = np.zeros_like(rewards)
    if scored_mask.any():
        total = rewards[scored_mask]
        advantages[scored_mask] = (total - total.mean()) / (total.std() + 1e-8)
    return advantages[list(kept)]
