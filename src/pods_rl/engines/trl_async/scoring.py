"""TRL's asynchronous scoring, run on a whole group and then on the conversations PODS keeps, each reward function
called once.

The kept m are scored again by TRL's ``_score_group`` so that their advantages and metrics are TRL's formula on the
kept group, not a copy; that second scoring replays what the first recorded (a judge may not answer twice alike).

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
    """The conversations ``indices`` as a group of their own: every per-conversation list and ``reward_kwargs``
    column taken at them, the rest kept; empty lists stay empty, a list of another length is refused."""
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
    """One conversation as scored in its group: its row's ``metrics`` and each reward function's raw output."""

    metrics: dict[str, float]
    rewards: tuple


def _awaited_by_trl(func) -> bool:
    """Whether TRL awaits ``func`` (its ``is_async_callable``; ``iscoroutinefunction`` before TRL 1.16)."""
    from trl.trainer import utils as trl_utils

    return getattr(trl_utils, "is_async_callable", inspect.iscoroutinefunction)(func)


def recording(reward_funcs: list) -> tuple[list, list]:
    """``(outputs, funcs)``: each reward function run as TRL runs it, its output kept as a list in ``outputs[k]``."""
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
    """``num_funcs`` coroutine functions returning the kept conversations' recorded outputs, running nothing."""

    def replayed(values: list):
        async def call(completions, **kwargs):
            if len(completions) != len(values):  # a bug of ours, not the user's: fail loudly
                raise RuntimeError(f"replaying {len(values)} rewards for a group of {len(completions)} conversations")
            return list(values)

        return call

    return [replayed([scored[i].rewards[k] for i in kept]) for k in range(num_funcs)]


@contextlib.contextmanager
def reward_funcs_as(loop, reward_funcs: list):
    """``loop.reward_funcs`` replaced for one scoring (the score loop awaits one ``_score_group`` at a time)."""
    originals, loop.reward_funcs = loop.reward_funcs, reward_funcs
    try:
        yield
    finally:
        loop.reward_funcs = originals


def sampled_advantages(scored: list[ScoredConversation], kept: list[int]) -> np.ndarray:
    """(len(kept),) advantages against every scored conversation (Reinforce-Ada's ``global_stat_est``): TRL's
    formula (reward - mean) / (population std + 1e-8) over the scored totals; 0 where a total is NaN."""
    rewards = np.array([conversation.metrics["reward"] for conversation in scored], dtype=float)  # (c,)
    scored_mask = ~np.isnan(rewards)
    advantages = np.zeros_like(rewards)
    if scored_mask.any():
        total = rewards[scored_mask]
        advantages[scored_mask] = (total - total.mean()) / (total.std() + 1e-8)
    return advantages[list(kept)]
