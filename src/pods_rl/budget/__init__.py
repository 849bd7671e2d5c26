"""The rollout budget: which prompts get rollouts and how many, from what the run has seen of each prompt.

Plain torch, no framework; any engine calls it:

    ledger.py          what the run has seen of each prompt (rollouts, rewards, successes), saved in checkpoints.
    planners/          the planners, one per method (GRESO, Knapsack-RL, Reinforce-Ada, Pilot-Commit, presets).
    rollout_budget.py  ``RolloutBudget``: the ledger and a step's planners, as an engine runs them.

``RolloutBudget``, ``candidate_ids`` and ``check_planner_settings`` are re-exported here (``pods_rl.budget`` was
their module before it became this package).
"""

from pods_rl.budget.rollout_budget import RolloutBudget, candidate_ids, check_planner_settings

__all__ = ["RolloutBudget", "candidate_ids", "check_planner_settings"]
