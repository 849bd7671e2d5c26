"""The rollout budget, plain torch: the prompt ledger (ledger.py), the planners (planners/) and ``RolloutBudget``
(rollout_budget.py), which an engine runs around sampling.
"""

from pods_rl.budget.rollout_budget import RolloutBudget, candidate_ids, check_planner_settings

__all__ = ["RolloutBudget", "candidate_ids", "check_planner_settings"]
