"""Rollout-budget planners from the follow-ups to PODS: ``greso`` and ``pilot_commit`` (which prompts),
``knapsack``, ``reinforce_ada`` and ``cgrpo`` (how many rollouts), presets (DAPO); and pods-rl's own ``auto`` (how
many, from the measured costs). Plain tensors on the prompt ledger, the
papers' knobs under their own names, checked against the authors' code (benchmarks/budget_crosscheck.py;
differences: docs/concepts/rollout-budgets.md). The planner shape and registry: ``base``.
"""

from pods_rl.budget.planners.auto import AutoN, AutoSettings
from pods_rl.budget.planners.base import (
    KINDS,
    NEEDS,
    Plan,
    Planner,
    available_planners,
    budget_registry,
    make_plan,
    make_planner,
    needs_of,
    planner_class,
    register_planner,
)
from pods_rl.budget.planners.cgrpo import CGRPO, CGRPOSettings, encode_answers
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
    "CGRPO",
    "KINDS",
    "NEEDS",
    "PRESETS",
    "AutoN",
    "AutoSettings",
    "GresoSettings",
    "GresoSkip",
    "KnapsackAllocation",
    "KnapsackSettings",
    "PilotCommit",
    "PilotCommitSettings",
    "Plan",
    "Planner",
    "ReinforceAda",
    "ReinforceAdaSettings",
    "CGRPOSettings",
    "available_planners",
    "available_presets",
    "budget_registry",
    "dapo_keep_groups",
    "encode_answers",
    "estimate_success_rate",
    "greso_skip_probability",
    "knapsack_allocation",
    "make_plan",
    "make_planner",
    "needs_of",
    "pilot_keep",
    "planner_class",
    "preset",
    "register_planner",
]
