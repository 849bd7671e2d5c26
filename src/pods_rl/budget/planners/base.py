"""What every rollout-budget planner shares: ``Plan``, its ``pods/*`` metrics, the registry, the settings checks.

A step asks three questions, one registry kind each: **which prompts** (``"which_prompts"`` planners: GRESO,
Pilot-Commit), **how many rollouts** (``"how_many"`` planners: Knapsack-RL, Reinforce-Ada; or an adaptive round
rule) and **which rollouts** to train on (a down-sampling rule). A planner is a class with ``kind``, a frozen
``Settings`` dataclass of the paper's knobs under their own names (one ``ValueError`` line per bad knob), and
``plan(ids, ledger, *, n, generator=None) -> Plan``; ``budget_registry`` lists all three kinds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from pods_rl.registry import Registry

__all__ = ["KINDS", "Adapting", "Committing", "HowMany", "Plan", "WhichPrompts", "available_planners",
           "budget_registry", "check_choice", "check_int", "check_number", "make_plan", "make_planner",
           "register_planner", "rollout_metrics"]

KINDS = ("which_prompts", "how_many")


# The three questions an engine asks of its planners, as types (an engine tests them with isinstance).
@runtime_checkable
class WhichPrompts(Protocol):
    """A planner of kind ``which_prompts``: which of the candidates get rollouts this step."""

    kind: str

    def plan(self, ids, ledger, *, n: int, generator=None) -> Plan:
        """The candidates ``ids`` (P,) -> a ``Plan`` (0 rollouts: not sampled now)."""
        ...


@runtime_checkable
class HowMany(Protocol):
    """A planner of kind ``how_many``: how many rollouts each sampled prompt gets."""

    kind: str

    def plan(self, ids, ledger, *, n: int, **budget) -> Plan:
        """The prompts ``ids`` (P,) -> a ``Plan`` of their rollouts."""
        ...


@runtime_checkable
class Committing(Protocol):
    """A ``which_prompts`` planner that samples in two rounds: a pilot, then a commit for the pilots that pass."""

    def after_pilot(self, ids, rewards, counts, ledger, *, step: int, evict: bool = True) -> Plan:
        """Judge the pilots (rewards (P, n), NaN past counts) -> the ``Plan`` of the commit round."""
        ...


@runtime_checkable
class Adapting(Protocol):
    """A planner that adapts to each step's recorded groups (GRESO's skip probabilities)."""

    def update(self, summaries, *, epoch: int) -> dict[str, float]:
        """Adapt to the recorded groups; return its ``pods/*`` metrics."""
        ...


@dataclass(frozen=True)
class Plan:
    """A planner's decision for P candidates: ``ids`` and ``rollouts`` (P,) int64 (0: not sampled now); (P,) bool
    ``skipped`` (nothing to learn), ``deferred`` (may come back), ``evicted`` (never again); ``extra`` (P,) tensors."""

    ids: torch.Tensor
    rollouts: torch.Tensor
    skipped: torch.Tensor
    deferred: torch.Tensor
    evicted: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def sampled(self) -> torch.Tensor:
        """(P,) bool: the prompts that get at least one rollout this step."""
        return self.rollouts > 0


def rollout_metrics(rollouts: torch.Tensor) -> dict[str, float]:
    """``pods/plan_prompts``, ``pods/plan_rollouts`` and ``pods/rollouts_per_prompt_{mean,min,max}`` (over the
    sampled; NaN if none) of (P,) rollouts per prompt."""
    sampled = rollouts[rollouts > 0].double()
    nan = float("nan")
    return {"pods/plan_prompts": float(len(rollouts)), "pods/plan_rollouts": float(rollouts.sum()),
            "pods/rollouts_per_prompt_mean": sampled.mean().item() if len(sampled) else nan,
            "pods/rollouts_per_prompt_min": sampled.min().item() if len(sampled) else nan,
            "pods/rollouts_per_prompt_max": sampled.max().item() if len(sampled) else nan}


def make_plan(ids: torch.Tensor, rollouts: torch.Tensor, *, skipped=None, deferred=None, evicted=None,
              extra: Mapping[str, torch.Tensor] | None = None, metrics: Mapping[str, float] | None = None) -> Plan:
    """A ``Plan`` with ``rollout_metrics``, ``pods/prompts_{skipped,deferred,evicted}`` and the planner's ``metrics``
    (masks left None are all False)."""
    P = len(ids)
    none = torch.zeros(P, dtype=torch.bool)
    skipped, deferred, evicted = (none.clone() if mask is None else mask.bool()
                                  for mask in (skipped, deferred, evicted))
    rollouts = rollouts.long()
    standard = {
        **rollout_metrics(rollouts),
        "pods/prompts_skipped": float(skipped.sum()),
        "pods/prompts_deferred": float(deferred.sum()),
        "pods/prompts_evicted": float(evicted.sum()),
    }
    return Plan(ids=ids, rollouts=rollouts, skipped=skipped, deferred=deferred, evicted=evicted,
                extra=dict(extra or {}), metrics={**standard, **dict(metrics or {})})


# ----------------------------------------------------------------------------------------------------------------
# The registry of planners (the rules have theirs in pods_rl.downsample, the round rules in pods_rl.adaptive).

def _check_planner(name: str, planner_cls: type) -> None:
    """A planner class needs ``kind`` (one of ``KINDS``), a ``Settings`` dataclass and ``plan``."""
    if getattr(planner_cls, "kind", None) not in KINDS:
        raise ValueError(f"planner {name!r} must have a class attribute kind in {list(KINDS)}, got "
                         f"{getattr(planner_cls, 'kind', None)!r}")
    if not dataclasses.is_dataclass(getattr(planner_cls, "Settings", None)) or not callable(
            getattr(planner_cls, "plan", None)):
        raise ValueError(f"planner {name!r} must have a Settings dataclass and a plan(ids, ledger, *, n, "
                         "generator) method")


_PLANNERS = Registry("planner", check=_check_planner)


def register_planner(name: str, cls: type | None = None, *, overwrite: bool = False):
    """Register a planner class (``kind``, ``Settings``, ``__init__(settings)``, ``plan``) under ``name``; usable as
    a decorator. Re-registering a name needs ``overwrite=True``."""
    return _PLANNERS.register(name, cls, overwrite=overwrite)


def available_planners(kind: str | None = None) -> list[str]:
    """Names of the registered planners (of ``kind``, when given), sorted."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    return sorted(name for name, cls in _PLANNERS.items() if kind is None or cls.kind == kind)


def make_planner(name: str, **knobs):
    """The planner registered as ``name``, built with its ``Settings(**knobs)``; an unknown name or knob is one
    ``ValueError`` line listing what exists."""
    if name not in _PLANNERS:
        raise ValueError(f"unknown planner {name!r}; available planners: {available_planners()}")
    cls = _PLANNERS[name]
    known = [f.name for f in dataclasses.fields(cls.Settings)]
    unknown = sorted(set(knobs) - set(known))
    if unknown:
        raise ValueError(f"planner {name!r} has no setting {unknown[0]!r}; its settings are {known}")
    return cls(cls.Settings(**knobs))


def budget_registry() -> dict[str, list[str]]:
    """Every registered entry, by the question it answers: ``which_prompts`` and ``how_many`` (planners),
    ``how_many_rounds`` (adaptive round rules) and ``which_rollouts`` (down-sampling rules)."""
    from pods_rl.adaptive import available_adaptive_rules
    from pods_rl.downsample import available_rules

    return {"which_prompts": available_planners("which_prompts"), "how_many": available_planners("how_many"),
            "how_many_rounds": available_adaptive_rules(), "which_rollouts": available_rules()}


# ----------------------------------------------------------------------------------------------------------------
# Settings checks: one line naming the knob, what it must be, and what it was.


def check_number(owner: str, name: str, value, low: float, high: float, *, low_open: bool = False,
                 high_open: bool = False, fix: str = "") -> None:
    """``value`` must be a real number in [low, high] (open where said); else ValueError naming ``owner.name``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{owner} {name} must be a number in {interval}, got {value!r}{'; ' + fix if fix else ''}")


def check_int(owner: str, name: str, value, low: int, high: int | None = None, *, fix: str = "") -> None:
    """``value`` must be an integer in [low, high] (no upper bound if None); else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{owner} {name} must be an integer {bound}, got {value!r}{'; ' + fix if fix else ''}")


def check_choice(owner: str, name: str, value, choices) -> None:
    """``value`` must be one of ``choices``; else ValueError listing them."""
    if value not in choices:
        raise ValueError(f"{owner} {name} must be one of {list(choices)}, got {value!r}")


def as_ids(ids) -> torch.Tensor:
    """Prompt ids as a 1-d int64 CPU tensor (ValueError otherwise)."""
    ids = torch.as_tensor(ids).detach().cpu()
    if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be a 1-d integer tensor of prompt ids, got {ids.dtype} of shape {tuple(ids.shape)}")
    return ids.long()
