"""pods-rl: Policy Optimization with Down-Sampling (PODS) for RL with verifiable rewards.

The down-sampling rules (``downsample``, ``group_advantages``, ``register_rule``, ``available_rules``)
and the adaptive-rollout rounds (``plan_round``, ``downsample_ragged``, ``register_adaptive_rule``,
``available_adaptive_rules``) are plain tensor code and import nothing heavy; the TRL-based trainer (``PODSConfig``,
``PODSTrainer``) is imported lazily so that other frameworks can use the rules alone.
"""

from pods_rl import kept_paths
from pods_rl.adaptive import (
    available_adaptive_rules,
    downsample_ragged,
    plan_round,
    register_adaptive_rule,
)
from pods_rl.budget.planners import reinforce_ada as _reinforce_ada  # noqa: F401  (registers Reinforce-Ada's two rules)
from pods_rl.downsample import available_rules, downsample, group_advantages, register_rule
from pods_rl.machine import pods_rl_version

kept_paths.install()  # old import paths (pods_rl.trainer, pods_rl.integrations.verl, ...) name the moved modules

# One source of truth: pyproject.toml's version, as installed ("0+unknown" for a source tree never installed).
__version__ = pods_rl_version()

__all__ = [
    "PODSConfig",
    "PODSTrainer",
    "available_adaptive_rules",
    "available_rules",
    "downsample",
    "downsample_ragged",
    "group_advantages",
    "plan_round",
    "register_adaptive_rule",
    "register_rule",
]


def __getattr__(name):
    # Lazy: importing TRL takes seconds and is not needed to call the rules.
    if name in ("PODSConfig", "PODSTrainer"):
        from pods_rl.engines.trl import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'pods_rl' has no attribute {name!r}")
