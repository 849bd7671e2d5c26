"""The rollout-budget planners on verl, as settings: which ``sampler_kwargs`` name them, what they mean in verl's units
(mini-batches count ``ppo_mini_batch_size x rollout.n`` rows, so a planner keeps a step's rollouts at prompts x
``rollout.n`` where it can) and what verl cannot meet: pure checks, no verl, so that ``pods verl-args`` refuses before
anything runs. How each planner is carried: ``agent_loop`` and docs/guides/verl.md, "Rollout budgets"."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pods_rl.budget.planners.base import Layout, available_planners, make_planner, member, needs_of, planner_class
from pods_rl.budget.rollout_budget import BudgetSettings, RolloutBudget
from pods_rl.engines.settings import PILOT_COMMIT_REASONS, check_planners, spelled

__all__ = ["MANAGER_CLASS", "PLANNER_KEYS", "VerlBudget", "verl_budget"]

# verl loads the manager by this name (actor_rollout_ref.rollout.agent.agent_loop_manager_class).
MANAGER_CLASS = "pods_rl.engines.verl.agent_loop.PODSAgentLoopManager"
MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
PLANNER_KEYS = ("prompt_planner", "prompt_planner_args", "rollout_planner", "rollout_planner_args", "refill_rounds")
# How verl's users spell the budget's settings (the budget's checks name them so).
NAMES = spelled("verl", "budget")
_NO_SAMPLING_REWARDS = ("{what}, which needs each rollout's reward when it is sampled, but a colocated reward model "
                        "scores only after sampling: set reward.reward_model.enable_resource_pool=True or use a "
                        "rule-based reward (the same requirement verl makes of DAPO's filter_groups)")


@dataclass(frozen=True)
class VerlBudget:
    """The planners a verl run asked for: ``budget`` (which prompts, how many: the manager's) and ``rounds``
    (Reinforce-Ada, rounds stopped by the worker), None without; ``n``: rollout.n; ``refill_rounds``: refill waves."""

    budget: RolloutBudget | None
    rounds: Any | None
    n: int
    refill_rounds: int = 4

    @property
    def planned(self) -> bool:
        """True when any planner is set (then the manager, and the ledger, are needed)."""
        return self.budget is not None or self.rounds is not None


def _args(kwargs: Mapping, key: str) -> dict:
    value = kwargs.get(key) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"sampler_kwargs.{key} must be a mapping of the planner's settings, e.g. "
                         f"'+trainer.v1.sampler.sampler_kwargs.{key}={{max_n:16}}', got {value!r}")
    return dict(value)


def verl_budget(kwargs: Mapping, *, n: int, m: int, seed: int = 0, success_threshold: float = 0.5,
                trainer_mode: str = "sync", gen_batch_size: int | None = 1, colocated_reward_model: bool = False,
                manager_class: str | None = MANAGER_CLASS) -> VerlBudget:
    """The planners of ``kwargs`` (the PODS buffer's ``sampler_kwargs``) for rollout.n = ``n``, m kept; a ValueError
    (one line) for one verl cannot meet. ``gen_batch_size``: verl's data.gen_batch_size (None: train_batch_size);
    ``manager_class``: actor_rollout_ref.rollout.agent.agent_loop_manager_class as set (None: verl's own)."""
    which, how_many = kwargs.get("prompt_planner"), kwargs.get("rollout_planner")
    which_args, how_args = _args(kwargs, "prompt_planner_args"), _args(kwargs, "rollout_planner_args")
    refill_rounds = kwargs.get("refill_rounds", 4)
    if isinstance(refill_rounds, bool) or not isinstance(refill_rounds, int) or refill_rounds < 0:
        raise ValueError(f"sampler_kwargs.refill_rounds must be an integer >= 0 (refills per dispatch before the rest "
                         f"is admitted), got {refill_rounds!r}")
    if which is None and how_many is None:
        return VerlBudget(budget=None, rounds=None, n=n, refill_rounds=refill_rounds)
    check_planners("verl", {"which_prompts": which, "how_many": how_many}, available_planners)
    if manager_class != MANAGER_CLASS:
        raise ValueError(f"sampler_kwargs.prompt_planner/rollout_planner run in PODS's agent loop manager: set "
                         f"{MANAGER_KEY}={MANAGER_CLASS} (`pods verl-args` prints it)")
    if which is not None and trainer_mode == "sync" and gen_batch_size != 1:
        raise ValueError(f"sampler_kwargs.prompt_planner={which!r} replaces each skipped prompt with one more from "
                         "verl's dataloader, which fetches data.gen_batch_size rows at a time: set "
                         "data.gen_batch_size=1")
    which_needs, how_needs, reasons = needs_of(which), needs_of(how_many), PILOT_COMMIT_REASONS["verl"]
    if colocated_reward_model and (which_needs | how_needs) & {"pilot", "reward_rounds"}:
        what = (f"sampler_kwargs.prompt_planner={which!r} judges each pilot before its commit" if "pilot" in which_needs
                else f"sampler_kwargs.rollout_planner={how_many!r} samples rounds until its stop rule holds")
        raise ValueError(_NO_SAMPLING_REWARDS.format(what=what))
    rounds = None
    if "reward_rounds" in how_needs:  # its rounds run in the worker; the manager gives each row rollout.n first
        if which is not None:  # the prompt planner's layout has a rollout planner, though the manager holds none
            member(planner_class(which), "complete")(which_args, Layout(n=n, m=m, names=NAMES, reasons=reasons,
                                                                        other="rollout_planner"))
        if how_args.get("round_repeat", n) != n or how_args.get("final_keep_per_prompt", m) != m:
            raise ValueError(f"sampler_kwargs.rollout_planner_args: on verl Reinforce-Ada's round_repeat is "
                             f"actor_rollout_ref.rollout.n ({n}) and final_keep_per_prompt is sampler_kwargs.m ({m}); "
                             "drop them")
        # Rounds of rollout.n, m kept (Reinforce-Ada's names: budget/'s Layout has no round size for complete() yet);
        # default 4 rounds. Its knobs are checked before Ray starts.
        rounds = make_planner(how_many, **{"max_rounds": 4, **how_args, "round_repeat": n, "final_keep_per_prompt": m})
        how_many, how_args = None, {}
    cap = n
    if how_many is not None:  # counts in [m, max_n] around rollout.n: max_n is the Layout's n, the most one prompt gets
        knobs = {field.name for field in dataclasses.fields(planner_class(how_many).Settings)}
        cap = how_args.get("max_n", 2 * n) if "max_n" in knobs else how_args.pop("max_n", 2 * n)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= n:
            raise ValueError(f"sampler_kwargs.rollout_planner_args.max_n={cap!r}: {how_many} gives prompts between m "
                             f"and max_n rollouts around actor_rollout_ref.rollout.n={n} per prompt; set max_n above "
                             f"{n}, or drop it ({2 * n})")
    # A fixed budget (rows x rollout.n) for every counting planner but one that spends what pays per measured second.
    settings = BudgetSettings(num_generations=cap, downsample_to=m, prompt_planner=which,
                              prompt_planner_args=which_args or None, rollout_planner=how_many,
                              rollout_planner_args=how_args or None, ledger_success_threshold=success_threshold,
                              adaptive_budget=float(n) if how_many is not None and "costs" not in how_needs else None,
                              seed=seed)
    budget = RolloutBudget.from_config(settings, names=NAMES, reasons=reasons)
    return VerlBudget(budget=budget, rounds=rounds, n=n, refill_rounds=refill_rounds)
