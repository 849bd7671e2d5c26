"""Rollout-budget planners: which prompts to sample and how many rollouts each gets, from the follow-ups to PODS.

Plain tensor code on top of the prompt ledger (``pods_rl.budget.ledger``); no framework. One module per method, each a
registry entry with the paper's knobs under their own names, checked against the authors' released code
(benchmarks/budget_crosscheck.py; docs/concepts/rollout-budgets.md says where a detail could not be matched):

* ``greso``: GRESO's pre-rollout skip (``GresoSkip``), kind ``which_prompts``;
* ``knapsack``: Knapsack-RL's allocation (``KnapsackAllocation``, ``knapsack_allocation``), kind ``how_many``;
* ``reinforce_ada``: Reinforce-Ada's rounds, exit rules, balanced keep and all-samples baseline, kind ``how_many``;
* ``pilot_commit``: Pilot-Commit's pilot, commit, defer and evict, kind ``which_prompts``;
* presets: DAPO's dynamic sampling as settings of what exists (``preset("dapo", num_generations=n)``).

Every planner returns a ``Plan`` (named tensors ``rollouts``, ``skipped``, ``deferred``, ``evicted`` and
``pods/*`` metrics). See ``pods_rl.budget.planners.base`` for the registry and the planner shape.
"""

from pods_rl.budget.planners.base import (
    KINDS,
    Plan,
    available_planners,
    budget_registry,
    make_plan,
    make_planner,
    register_planner,
)
from pods_rl.budget.planners.greso import GresoSettings, GresoSkip, greso_skip_probability
from pods_rl.budget.planners.knapsack import (
    KnapsackAllocation,
    KnapsackSettings,
    estimate_success_rate,
    knapsack_allocation,
)
from pods_rl.budget.planners.pilot_commit import PilotCommit, PilotCommitSettings, pilot_keep
from pods_rl.budget.planners.presets import PRESETS, available_presets, dapo_keep_groups, preset
from pods_rl.budget.planners.reinforce_ada import ReinforceAda, ReinforceAdaSettings

__all__ = [
    "KINDS",
    "PRESETS",
    "GresoSettings",
    "GresoSkip",
    "KnapsackAllocation",
    "KnapsackSettings",
    "PilotCommit",
    "PilotCommitSettings",
    "Plan",
    "ReinforceAda",
    "ReinforceAdaSettings",
    "available_planners",
    "available_presets",
    "budget_registry",
    "dapo_keep_groups",
    "estimate_success_rate",
    "greso_skip_probability",
    "knapsack_allocation",
    "make_plan",
    "make_planner",
    "pilot_keep",
    "preset",
    "register_planner",
]
