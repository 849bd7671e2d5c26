"""verl's batch settings in kept terms, for ``pods verl-args`` (pure arithmetic; needs no verl). verl counts batches
in *generated* rollouts (an actor mini-batch is ``ppo_mini_batch_size x rollout.n`` rows) and pads each update to a
multiple of ``lcm(dp, actor rows, critic rows)``; under PODS only m of n rollouts reach the update, so settings chosen
the usual way train on padding. ``verl_batch_settings`` turns prompts B, n, m, dp and kept rows per mini-batch R into
verl's overrides, and refuses combinations that would pad::

    python3 -m verl.trainer.main_ppo ... $(pods verl-args --prompts 32 --n 64 --m 16 --dp 8 --mini-batch 512)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pods_rl.selection import SelectionSettings

# The verl versions whose v1 ReplayBuffer internals the replay buffer was tested against (it refuses any other at
# import; pyproject.toml's `verl` extra must lie inside, tests/test_extras.py): `_materialize_batch(partition_id,
# uids, snapshot)`, the six constructor arguments, the `{uid}_{session}_{index}` keys and `rm_scores` in
# TransferQueue. Here, in a module that needs no verl, so that the main suite can read it.
VERL_RANGE = ">=0.9.1,<0.10"

SAMPLER_PATH = "pkg://pods_rl.engines.verl.replay_buffer"
SAMPLER_NAME = "PODSReplayBuffer"
TRAINER_MODES = ("sync", "colocate_async")  # separate_async: see SEPARATE_ASYNC
SEPARATE_ASYNC = ("verl's separate_async trainer requires data.train_batch_size = parameter_sync_step x "
                  "actor.ppo_mini_batch_size, so every update is one mini-batch of ppo_mini_batch_size x n rows: with "
                  "m < n kept per prompt it would always be padded to n/m times its kept rows; use "
                  "trainer.v1.trainer_mode=sync or colocate_async")


def padding_rows(kept_rows: int, dp: int, actor_rows: int, critic_rows: int | None = None) -> int:
    """Rows verl's ``_balance_batch`` would add to ``kept_rows``: up to a multiple of lcm(dp, actor[, critic] rows)."""
    multiple = math.lcm(dp, actor_rows, *([critic_rows] if critic_rows else []))
    return -kept_rows % multiple


@dataclass(frozen=True)
class VerlBatch:
    """verl settings for PODS, in verl's units, plus the kept-row arithmetic they come from."""

    train_batch_size: int  # prompts sampled per training step (one update)
    sampled_per_update: int  # prompt groups one replay-buffer sample() returns before group selection
    kept_groups: int  # B: groups that reach each update
    kept_rows: int  # B x m rollouts trained per update
    actor_mini_batch: int  # verl's actor.ppo_mini_batch_size (x rollout.n = kept rows per mini-batch)
    critic_mini_batch: int | None
    overrides: tuple[str, ...]  # Hydra overrides for `python3 -m verl.trainer.main_ppo`

    def summary(self, n: int, m: int, dp: int) -> str:
        """One line: what one update generates, keeps and trains on."""
        rows = self.actor_mini_batch * n
        return (f"# per update: {self.sampled_per_update} prompts x n={n} = {self.sampled_per_update * n} rollouts "
                f"generated, {self.kept_groups} groups x m={m} = {self.kept_rows} kept rows = "
                f"{self.kept_rows // rows} actor mini-batch(es) of {rows} rows ({rows // dp} per rank), no padding")


def verl_batch_settings(prompts: int, n: int, m: int, dp: int, mini_batch: int, *, critic_mini_batch: int | None = None,
                        oversample_prompts: float = 1.0, rule: str = "max_variance", tiebreak: str = "index",
                        trainer_mode: str = "sync", planners: Mapping[str, Any] | None = None) -> VerlBatch:
    """verl overrides that train PODS without padding rows; ValueError (one line) for a combination verl would pad.
    ``prompts``: B groups per update; ``mini_batch`` / ``critic_mini_batch``: kept rows per actor / critic mini-batch
    (multiples of n and dp; no critic: None); ``trainer_mode``: ``sync`` or ``colocate_async``; ``planners``: the
    rollout-budget keys (``PLANNER_KEYS``), checked as the buffer checks them, printed with PODS's manager."""
    for name, value in (("prompts", prompts), ("n", n), ("m", m), ("dp", dp), ("mini_batch", mini_batch),
                        ("critic_mini_batch", 1 if critic_mini_batch is None else critic_mini_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not 2 <= m <= n:
        raise ValueError(f"need 2 <= m <= n, got n={n}, m={m}: PODS keeps m of the n rollouts of each prompt, and one "
                         "kept rollout has no group to compare with")
    # The rule is registered in verl's process (sampler_kwargs.rule_module), not necessarily in this one.
    selection = SelectionSettings.validated(m, rule, tiebreak, oversample_prompts, rule_registered_here=False)
    if trainer_mode == "separate_async":
        raise ValueError(SEPARATE_ASYNC)
    if trainer_mode not in TRAINER_MODES:
        raise ValueError(f"trainer_mode must be one of {list(TRAINER_MODES)}, got {trainer_mode!r}")

    _check_no_padding(prompts, n, m, dp, mini_batch, critic_mini_batch)
    sampled = selection.sampled_prompts(prompts)
    overrides = [
        f"trainer.v1.trainer_mode={trainer_mode}",
        f"data.train_batch_size={sampled}",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch // n}",
    ]
    if critic_mini_batch is not None:
        overrides.append(f"critic.ppo_mini_batch_size={critic_mini_batch // n}")
    overrides += [
        f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
        f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}",
        # sampler_kwargs is an empty mapping in verl's config: Hydra needs `+` to add keys to it.
        f"+trainer.v1.sampler.sampler_kwargs.m={m}",
        f"+trainer.v1.sampler.sampler_kwargs.rule={rule}",
        f"+trainer.v1.sampler.sampler_kwargs.tiebreak={tiebreak}",
    ]
    if oversample_prompts != 1:
        overrides.append(f"+trainer.v1.sampler.sampler_kwargs.oversample_prompts={oversample_prompts}")
    overrides += _planner_overrides(planners, n=n, m=m, trainer_mode=trainer_mode)
    return VerlBatch(train_batch_size=sampled, sampled_per_update=sampled, kept_groups=prompts,
                     kept_rows=prompts * m, actor_mini_batch=mini_batch // n,
                     critic_mini_batch=None if critic_mini_batch is None else critic_mini_batch // n,
                     overrides=tuple(overrides))


def _check_no_padding(prompts: int, n: int, m: int, dp: int, mini_batch: int, critic_mini_batch: int | None) -> None:
    """Refuse, with one line, mini-batches verl cannot express or would pad (B x m kept rows per update)."""
    kept_rows = prompts * m
    mini_batches = {"mini-batch": mini_batch}
    if critic_mini_batch is not None:
        mini_batches["critic mini-batch"] = critic_mini_batch
    for name, rows in mini_batches.items():
        if rows % n:
            lower, upper = rows // n * n, rows // n * n + n
            raise ValueError(f"a {name} of {rows} kept rows is not a multiple of n={n}: verl counts a mini-batch as "
                             f"ppo_mini_batch_size x rollout.n rows; use {lower or upper}"
                             + (f" or {upper}" if lower else ""))
        if rows % dp:
            raise ValueError(f"a {name} of {rows} kept rows does not split over dp={dp} ranks; make it a multiple of "
                             f"lcm(n, dp) = {math.lcm(n, dp)}")
        if kept_rows % rows:
            raise ValueError(f"prompts x m = {prompts} x {m} = {kept_rows} kept rows per update is not a whole number "
                             f"of {rows}-row {name}es: verl would pad it with {-kept_rows % rows} no-op rows; choose "
                             f"prompts as a multiple of {rows // math.gcd(rows, m)} or another {name}")
    pad = padding_rows(kept_rows, dp, mini_batch, critic_mini_batch)
    assert pad == 0, pad  # implied by the checks above; verl's own rule, kept as a guard


def _planner_overrides(planners: Mapping[str, Any] | None, *, n: int, m: int, trainer_mode: str) -> list[str]:
    """The overrides that run the rollout-budget ``planners`` (none without): the buffer's keys, PODS's agent loop
    manager, the checkpoint hook that saves the ledger, and a one-row dataloader fetch for refills in sync mode."""
    from pods_rl.engines.verl.budget_settings import MANAGER_CLASS, MANAGER_KEY, PLANNER_KEYS, verl_budget

    planners = {key: value for key, value in (planners or {}).items() if value is not None}
    unknown = sorted(set(planners) - set(PLANNER_KEYS))
    if unknown:
        raise ValueError(f"unknown planner settings {unknown}; known: {list(PLANNER_KEYS)}")
    if not verl_budget(planners, n=n, m=m, trainer_mode=trainer_mode, gen_batch_size=1).planned:
        return []
    out = [f"+trainer.v1.sampler.sampler_kwargs.{key}={_hydra(planners[key])}" for key in PLANNER_KEYS
           if key in planners]
    out += [f"+{MANAGER_KEY}={MANAGER_CLASS}",
            "trainer.checkpoint_callback_class=pods_rl.engines.verl.replay_buffer.PODSCheckpointCallback"]
    if planners.get("prompt_planner") is not None and trainer_mode == "sync":
        out.append("data.gen_batch_size=1")
    return out


def _hydra(value) -> str:
    """``value`` in Hydra's override grammar (a mapping as ``{key:value,...}``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{_hydra(item)}" for key, item in value.items()) + "}"
    return str(value)
