"""The asynchronous worker's ``pods_*`` settings, checked before a child is spawned, one error line naming each."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from trl.trainer.utils import get_callable_name

from pods_rl.adaptive import AdaptiveSettings
from pods_rl.advantages import ADVANTAGE_BASELINES
from pods_rl.engines.settings import spelled
from pods_rl.engines.trl_async.budget import check_budget_settings
from pods_rl.selection import SelectionSettings

__all__ = ["adaptive_settings", "check_advantage_baseline", "check_worker_settings",
           "pods_settings"]

# How the async worker's users spell the settings (the one-line errors name these).
ADAPTIVE_NAMES = spelled("trl_async", "adaptive")
ASYNC_NAMES = spelled("trl_async", "selection")


def pods_settings(m: int, rule: str = "max_variance", tiebreak: str = "index", n: int | None = None,
                  rule_module: str | None = None) -> SelectionSettings:
    """The checked ``pods_m``, ``pods_rule``, ``pods_tiebreak`` (n: when known). ``rule_module`` is imported
    first: the spawned child knows only the rules its imports register."""
    if rule_module:
        try:
            importlib.import_module(rule_module)
        except ImportError as err:
            raise ValueError(f"pods_rule_module={rule_module!r} could not be imported: {err}") from None
    settings = SelectionSettings.validated(m, rule, tiebreak, names=ASYNC_NAMES)
    if n is not None and m > n:
        raise ValueError(f"pods_m must be at most num_generations (the rollouts sampled per prompt, n={n}), got {m}.")
    return settings


def check_advantage_baseline(baseline: str) -> str:
    """The checked ``pods_advantage_baseline``: ``kept`` or ``sampled``."""
    if baseline not in ADVANTAGE_BASELINES:
        raise ValueError(f"pods_advantage_baseline must be one of {list(ADVANTAGE_BASELINES)}, got {baseline!r}.")
    return baseline


def adaptive_settings(pilot: int | None, n: int, m: int, rule: str = "until_mixed", round_size: int | None = None,
                      budget: float | None = None, reward: str | None = None, *, reward_names=None,
                      environment_factory=None) -> AdaptiveSettings | None:
    """The checked adaptive settings, None without a pilot; environments are refused (a top-up would have to draw
    and reset one outside TRL's generate loop)."""
    if pilot is None:
        return None
    if environment_factory is not None:
        raise ValueError("pods_pilot (adaptive rollouts) does not support environment_factory: drop pods_pilot to "
                         "sample n rollouts per prompt in one go (PODS still keeps m of them).")
    return AdaptiveSettings.validated(pilot, n, m, rule, round_size, budget, reward, reward_names=reward_names,
                                      names=ADAPTIVE_NAMES)


def check_worker_settings(pods_m: int, n: int, reward_funcs, environment_factory=None, *, dataset=None,
                          pods_rule: str = "max_variance", pods_tiebreak: str = "index", pods_seed: int | None = None,
                          pods_rule_module: str | None = None, pods_pilot: int | None = None,
                          pods_round_size: int | None = None, pods_adaptive_rule: str = "until_mixed",
                          pods_adaptive_reward: str | None = None, pods_adaptive_budget: float | None = None,
                          pods_advantage_baseline: str = "kept", **planners: Any):
    """Check every ``pods_*`` setting of the worker; return their ``RolloutBudget`` (None without planners)."""
    pods_settings(pods_m, pods_rule, pods_tiebreak, n=n, rule_module=pods_rule_module)
    check_advantage_baseline(pods_advantage_baseline)
    reward_names = [get_callable_name(f) for f in reward_funcs]
    adaptive_settings(pods_pilot, n, pods_m, pods_adaptive_rule, pods_round_size, pods_adaptive_budget,
                      pods_adaptive_reward, reward_names=reward_names, environment_factory=environment_factory)
    return check_budget_settings(n, pods_m, pilot=pods_pilot, environment_factory=environment_factory, dataset=dataset,
                          reward_names=reward_names, pods_adaptive_budget=pods_adaptive_budget,
                          pods_adaptive_reward=pods_adaptive_reward, pods_seed=pods_seed, **planners)


def async_only_settings() -> set[str]:
    """The fields of TRL's ``AsyncGRPOConfig`` that ``PODSConfig`` (a ``GRPOConfig``) lacks, and the words a user
    may try for the asynchronous mode: ``pods train`` names the asynchronous path for them."""
    from pods_rl.engines.trl.trainer import PODSConfig

    try:
        from trl.experimental.async_grpo import AsyncGRPOConfig
    except ImportError:  # a TRL without the asynchronous trainer
        return {"async", "asynchronous"}
    ours = {f.name for f in dataclasses.fields(PODSConfig)}
    return {f.name for f in dataclasses.fields(AsyncGRPOConfig)} - ours | {"async", "asynchronous"}
