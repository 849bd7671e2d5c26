"""What every rollout-budget planner shares: ``Plan``, its ``pods/*`` metrics, the registry, the settings checks.

A step asks three questions, one registry kind each: **which prompts** (``"which_prompts"`` planners: GRESO,
Pilot-Commit), **how many rollouts** (``"how_many"`` planners: Knapsack-RL, Reinforce-Ada; or an adaptive round
rule) and **which rollouts** to train on (a down-sampling rule). A planner is a class with ``kind``, a frozen
``Settings`` dataclass of the paper's knobs under their own names (one ``ValueError`` line per bad knob), and
``plan(ids, ledger, *, n, generator=None) -> Plan``, best a ``Planner`` subclass declaring its ``needs``;
``budget_registry`` lists all three kinds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from pods_rl.registry import Registry

__all__ = ["CONFIG_NAMES", "KINDS", "NEEDS", "Layout", "Plan", "Planner", "available_planners", "between_m_and_n",
           "budget_registry", "check_choice", "check_int", "check_number", "check_plan", "make_plan", "make_planner",
           "member", "needs_of", "planner_class", "register_planner", "rollout_metrics"]

KINDS = ("which_prompts", "how_many")


# What a planner may need of an engine (``Planner.needs``); engines list theirs in pods_rl.engines.settings.OFFERS.
NEEDS = {"costs": "each step's measured sampling and update seconds (observe)",
         "pilot": "a pilot round judged before a commit round (after_pilot, commit)",
         "answer_rounds": "rounds of a prompt until its completions' answers settle (next_round)",
         "calibration": "held-out prompts with gold answers, sampled before it plans (calibrate)",
         "reward_rounds": "rounds of a prompt until its rewards meet a stop rule (plan_round)"}
# How the budget's errors spell the settings without an engine's ``names=``: PODSConfig's way.
CONFIG_NAMES = {"prompt_planner": "prompt_planner", "prompt_planner_args": "prompt_planner_args",
                "rollout_planner": "rollout_planner", "rollout_planner_args": "rollout_planner_args",
                "m": "downsample_to", "n": "num_generations", "pilot": "pilot_generations",
                "oversample_prompts": "oversample_prompts", "success_threshold": "ledger_success_threshold",
                "adaptive_budget": "adaptive_budget", "calibration_dataset": "calibration_dataset",
                "answer_extractor": "answer_extractor"}


@dataclass(frozen=True)
class Layout:
    """What a run fixes around a planner (``Planner.complete``'s input), in the engine's spelling ``names``."""

    n: int
    m: int
    names: Mapping[str, str] = field(default_factory=lambda: CONFIG_NAMES)
    reasons: Mapping[str, str | None] | None = None  # why an engine refuses a Pilot-Commit setting
    adaptive_budget: float | None = None
    other: str | None = None  # the ``names`` key of another setting that decides counts
    environment: bool = False  # environments are set


class Planner:
    """A planner's base: its own ``kind``, ``Settings`` and ``plan``; ``needs`` (of ``NEEDS``); hooks with defaults."""

    kind: str = ""
    needs: frozenset[str] = frozenset()

    @classmethod
    def complete(cls, args: Mapping | None, layout: Layout) -> dict:
        """The user's knobs ``args`` completed with what ``layout`` fixes (one ValueError line per conflict)."""
        return dict(args or {})

    def first_round(self, n: int) -> int:
        """Rollouts of a sampled prompt's first round where no rollout planner counts them (n: the run's)."""
        return n

    def use_seed(self, seed: int) -> None:
        """Take the run's seed (for a random stream of its own)."""

    def update(self, summary, *, epoch: int) -> dict[str, float]:
        """Adapt to the step's recorded groups (a ``GroupSummary``); its ``pods/*`` metrics."""
        return {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps of it."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``."""


_DEFAULTS = Planner()


def member(planner, name: str):
    """``planner``'s (a class or instance) attribute ``name``, or ``Planner``'s default where a plain class lacks it."""
    return getattr(planner, name) if hasattr(planner, name) else getattr(_DEFAULTS, name)


def needs_of(planner) -> frozenset[str]:
    """What ``planner`` (a class, an instance, a registered name or None) needs of an engine."""
    if isinstance(planner, str):
        planner = _PLANNERS[planner] if planner in _PLANNERS else None
    return frozenset() if planner is None else frozenset(member(planner, "needs"))


def between_m_and_n(knobs: dict, layout: Layout, title: str) -> dict:
    """``knobs`` with ``min_n``/``max_n`` (default m/n), ``negative_n``/``positive_n`` checked in [m, n], m < n."""
    m, n, names, where = layout.m, layout.n, layout.names, layout.names["rollout_planner_args"]
    if m >= n:
        raise ValueError(f"{names['rollout_planner']} spends between {names['m']} (m={m}) and {names['n']} (n={n}) "
                         f"rollouts per prompt: with m = n every prompt gets n; raise {names['n']} above {names['m']}, "
                         f"or turn the planner off ({names['rollout_planner']} unset; `pods train`: --rollout_planner "
                         "none)")
    for key, default in (("min_n", m), ("max_n", n)):
        value = knobs.setdefault(key, default)
        if not (isinstance(value, int) and m <= value <= n):
            raise ValueError(f"{where} {key}={value!r}: with PODS every prompt {title} samples gets between "
                             f"{names['m']} (m={m}) and {names['n']} (n={n}) rollouts; set it in [{m}, {n}] or drop it")
    for key in ("negative_n", "positive_n"):
        if knobs.get(key) is not None and not m <= knobs[key] <= n:
            raise ValueError(f"{where} {key}={knobs[key]!r} must be in [{m}, {n}] (m..n) with PODS")
    return knobs


def check_plan(name: str, plan, count: int, low: int, high: int) -> None:
    """``plan`` must hold (count,) tensors, rollouts in [low, high]; else one line naming the planner ``name``."""
    if not isinstance(plan, Plan):
        raise ValueError(f"planner {name!r} must return a Plan (make_plan builds one), got {type(plan).__name__}")
    for key in ("ids", "rollouts", "skipped", "deferred", "evicted"):
        value = getattr(plan, key)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (count,):
            raise ValueError(f"planner {name!r}: Plan.{key} must be a ({count},) tensor, one per prompt, got "
                             f"{tuple(getattr(value, 'shape', ())) if isinstance(value, torch.Tensor) else value!r}")
    bad = (plan.rollouts < low) | (plan.rollouts > high)
    if plan.rollouts.is_floating_point() or bool(bad.any()):
        raise ValueError(f"planner {name!r}: Plan.rollouts must be integers in [{low}, {high}] here, got "
                         f"{plan.rollouts.tolist()}")


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
    unknown = sorted(set(member(planner_cls, "needs")) - set(NEEDS))
    if unknown:
        raise ValueError(f"planner {name!r} needs {unknown[0]!r}, which no engine offers: needs are {list(NEEDS)}")


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


def planner_class(name: str) -> type:
    """The class registered as ``name``; an unknown name is one ``ValueError`` line listing what exists."""
    if name not in _PLANNERS:
        raise ValueError(f"unknown planner {name!r}; available planners: {available_planners()}")
    return _PLANNERS[name]


def make_planner(name: str, **knobs):
    """The planner registered as ``name``, built with its ``Settings(**knobs)``; an unknown name or knob is one
    ``ValueError`` line listing what exists."""
    cls = planner_class(name)
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
