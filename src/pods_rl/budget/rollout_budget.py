"""The rollout budget an engine runs: which of a step's candidate prompts get rollouts and how many, from the ledger.

Engine-neutral; ``PODSTrainer``'s step calls it around sampling::

    budget = RolloutBudget.from_config(config)            # None when no planner is set
    first, metrics = budget.plan(ids, num_groups, ...)    # (P,) rollouts of each candidate's first round
    ... generate and score them ...
    metrics = budget.record(ids, rewards, counts, ...)    # every rank records every rank's groups
    budget.save(checkpoint_dir) / budget.load(checkpoint_dir)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pods_rl.budget.ledger import (
    LEDGER_FILE,
    LedgerSettings,
    PromptLedger,
    check_finite,
    prompt_key,
    save_atomically,
)
from pods_rl.budget.planners import make_planner
from pods_rl.budget.planners.base import Adapting, Committing, rollout_metrics

__all__ = ["BudgetSettings", "RolloutBudget", "candidate_ids", "check_pilot_commit", "check_planner_settings",
           "check_rollout_planner"]


@dataclasses.dataclass(frozen=True)
class BudgetSettings:
    """The settings ``RolloutBudget.from_config`` reads, under ``PODSConfig``'s names (any engine can fill it)."""

    num_generations: int
    downsample_to: int
    prompt_planner: str | None = None
    prompt_planner_args: dict[str, Any] | None = None
    rollout_planner: str | None = None
    rollout_planner_args: dict[str, Any] | None = None
    ledger_success_threshold: float = 0.5
    adaptive_budget: float | None = None
    seed: int = 0

    @classmethod
    def of(cls, config) -> BudgetSettings:
        """The budget settings of ``config`` (a ``PODSConfig``, or anything with these fields)."""
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})


def candidate_ids(inputs: list[dict], n: int) -> torch.Tensor:
    """(P,) the ledger ids of the P prompts of ``inputs`` (each prompt's row repeated n times)."""
    return torch.tensor([prompt_key(inputs[p]["prompt"]) for p in range(0, len(inputs), n)], dtype=torch.long)


# How the budget's errors spell the settings without an engine's ``names=``: PODSConfig's way. (This package sits
# below the engines' table, pods_rl.engines.settings: an engine passes spelled(engine, "budget").)
CONFIG_NAMES = {"prompt_planner": "prompt_planner", "prompt_planner_args": "prompt_planner_args",
                "rollout_planner": "rollout_planner", "rollout_planner_args": "rollout_planner_args",
                "m": "downsample_to", "n": "num_generations", "pilot": "pilot_generations",
                "oversample_prompts": "oversample_prompts", "success_threshold": "ledger_success_threshold",
                "adaptive_budget": "adaptive_budget", "calibration_dataset": "calibration_dataset",
                "answer_extractor": "answer_extractor"}
# Why a Pilot-Commit setting is refused, by setting (None: allowed): the budget's own words; an engine passes its row.
PLAIN_REASONS = {"buffer_max_off_steps": "the rollout budget commits a prompt in the step that piloted it",
                 "n_explore_effective": "the rollout budget trains on every pilot rollout of a committed prompt",
                 "environment": None}


def _knobs(name: str | None, args: dict | None, n: int, m: int, names: Mapping[str, str],
           reasons: Mapping[str, str | None] | None) -> dict:
    """The user's planner settings plus what PODS's layout fixes (Knapsack-RL's ``min_n`` = m, ``max_n`` = n)."""
    if name == "pilot_commit":
        return check_pilot_commit(args, n, names=names, reasons=reasons)
    knobs, where = dict(args or {}), names["rollout_planner_args"]
    if name == "cgrpo":  # n is the group width: the largest budget of the grid
        from pods_rl.budget.planners.cgrpo import check_width

        check_width(knobs, n, names)
    if name in ("knapsack", "auto"):
        for key, default in (("min_n", m), ("max_n", n)):
            value = knobs.setdefault(key, default)
            if not (isinstance(value, int) and m <= value <= n):
                raise ValueError(f"{where} {key}={value!r}: with PODS every prompt {_TITLES[name]} samples gets "
                                 f"between {names['m']} (m={m}) and {names['n']} (n={n}) rollouts; set it in "
                                 f"[{m}, {n}] or drop it")
        for key in ("negative_n", "positive_n"):
            if knobs.get(key) is not None and not m <= knobs[key] <= n:
                raise ValueError(f"{where} {key}={knobs[key]!r} must be in [{m}, {n}] (m..n) with PODS")
    return knobs


_TITLES = {"knapsack": "Knapsack-RL", "auto": "auto"}


def check_pilot_commit(args: dict | None, n: int, *, names: Mapping[str, str] | None = None,
                       reasons: Mapping[str, str | None] | None = None, other: str | None = None,
                       environment: bool = False) -> dict:
    """Pilot-Commit's knobs ``args`` completed for a budget that commits a prompt in the step that piloted it, as one
    group of n (n_explore + n_commit = n, default 1:3; buffer_max_off_steps 0); else one ValueError line.

    ``names``: the engine's spellings; ``reasons``: why it refuses each (default ``PLAIN_REASONS``); ``other``: the
    ``names`` key of a setting that also decides how many rollouts a prompt gets; ``environment``: environments set."""
    names, reasons = CONFIG_NAMES if names is None else names, {**PLAIN_REASONS, **(reasons or {})}
    planner, where = f"{names['prompt_planner']}='pilot_commit'", names["prompt_planner_args"]
    if other is not None:
        raise ValueError(f"{planner} decides how many rollouts a prompt gets itself (n_explore, then n_commit for the "
                         f"prompts it commits): drop {names[other]}")
    if environment and reasons["environment"] is not None:
        raise ValueError(f"{planner} does not support environment_factory: {reasons['environment']}")
    knobs = dict(args or {})
    explore, commit = knobs.get("n_explore"), knobs.get("n_commit")
    if explore is None and commit is None:
        explore = max(1, n // 4)
    if explore is None and isinstance(commit, int):
        explore = n - commit
    if commit is None and isinstance(explore, int):
        commit = n - explore
    if isinstance(explore, int) and isinstance(commit, int) and (explore + commit != n or min(explore, commit) < 1):
        raise ValueError(f"{where} n_explore={explore} + n_commit={commit} must make {names['n']} (n={n}), each at "
                         "least 1: a committed prompt trains on its pilot and commit rollouts as one group of n; set "
                         "one of them, or neither (n_explore = n // 4, the paper's 1:3 split)")
    knobs.update(n_explore=explore, n_commit=commit)
    if knobs.get("n_explore_effective") not in (None, explore):
        raise ValueError(f"{where} n_explore_effective={knobs['n_explore_effective']!r}: "
                         f"{reasons['n_explore_effective']}; drop it, and keep m of the n with {names['m']} instead")
    if knobs.setdefault("buffer_max_off_steps", 0) != 0:
        raise ValueError(f"{where} buffer_max_off_steps={knobs['buffer_max_off_steps']!r}: "
                         f"{reasons['buffer_max_off_steps']}: set it to 0 or drop it")
    return knobs


def check_planner_settings(config, *, names: Mapping[str, str] | None = None,
                           reasons: Mapping[str, str | None] | None = None) -> None:
    """Refuse, one line each before any model loads, planner settings PODS cannot carry out (``config``: a
    ``PODSConfig``; ``names``, ``reasons``: as ``check_pilot_commit`` takes them)."""
    names = CONFIG_NAMES if names is None else names
    if config.prompt_planner is not None and config.oversample_prompts <= 1:
        raise ValueError(f"{names['prompt_planner']}={config.prompt_planner!r} skips prompts before sampling and "
                         f"replaces them with other candidates: set {names['oversample_prompts']} above 1 (e.g. 2), "
                         "or nothing can replace them")
    if config.prompt_planner == "pilot_commit":
        other = "rollout_planner" if config.rollout_planner is not None else "pilot" if config.is_adaptive else None
        check_pilot_commit(config.prompt_planner_args, config.num_generations, names=names, reasons=reasons,
                           other=other)
    check_rollout_planner(config.rollout_planner, pilot=config.is_adaptive, n=config.num_generations,
                          m=config.downsample_to, names=names)
    RolloutBudget.from_config(config, names=names, reasons=reasons)  # the planners' own knobs, by their Settings


def check_rollout_planner(planner: str | None, *, pilot: bool, n: int, m: int,
                          names: Mapping[str, str] | None = None) -> None:
    """Refuse a rollout planner beside the adaptive pilot (both decide how many rollouts), or at m = n (nothing to
    spend); ``pilot``: whether the adaptive pilot is set."""
    names = CONFIG_NAMES if names is None else names
    if planner is not None and pilot:
        raise ValueError(f"{names['rollout_planner']} and {names['pilot']} both decide how many rollouts a prompt "
                         "gets: set one")
    # (C-GRPO stops each prompt at its own budget: with m = n it is C-GRPO itself, groups of n with padding)
    if planner is not None and m >= n and planner != "cgrpo":
        raise ValueError(f"{names['rollout_planner']} spends between {names['m']} (m={m}) and {names['n']} (n={n}) "
                         f"rollouts per prompt: with m = n every prompt gets n; raise {names['n']} above {names['m']}")


def _generator(seed: int, step: int, rank: int, *salt: int) -> torch.Generator:
    """A generator seeded by integers (seed, step, rank, salt): the same draws in every process and on a resume."""
    return torch.Generator().manual_seed(hash((seed, step, rank, *salt)) & (2**63 - 1))


class RolloutBudget:
    """The ledger and the step's planners (``prompt_planner``: which prompts, ``rollout_planner``: how many)."""

    def __init__(self, ledger: PromptLedger, which=None, how_many=None, *, n: int, m: int, seed: int,
                 budget_per_prompt: float | None = None):
        self.ledger, self.which, self.how_many = ledger, which, how_many
        self.n, self.m, self.seed = n, m, seed
        self.budget_per_prompt = budget_per_prompt

    @classmethod
    def from_config(cls, config, *, names: Mapping[str, str] | None = None,
                    reasons: Mapping[str, str | None] | None = None) -> RolloutBudget | None:
        """The budget ``config`` (a ``PODSConfig`` or ``BudgetSettings``) asks for, or None without planners; errors
        spell settings as ``names`` does (default ``CONFIG_NAMES``), Pilot-Commit's give ``reasons``."""
        config, names = BudgetSettings.of(config), CONFIG_NAMES if names is None else names
        if config.prompt_planner is None and config.rollout_planner is None:
            return None
        n, m = config.num_generations, config.downsample_to
        # (`is not None`, not truth: a planner with a buffer, Pilot-Commit's, is falsy while the buffer is empty)
        which = None if config.prompt_planner is None else make_planner(
            config.prompt_planner, **_knobs(config.prompt_planner, config.prompt_planner_args, n, m, names, reasons))
        how_many = None if config.rollout_planner is None else make_planner(
            config.rollout_planner, **_knobs(config.rollout_planner, config.rollout_planner_args, n, m, names,
                                             reasons))
        if config.rollout_planner == "auto" and config.adaptive_budget is not None:
            raise ValueError(f"{names['rollout_planner']}='auto' chooses how many rollouts to spend from the measured "
                             f"costs: drop {names['adaptive_budget']} (Knapsack-RL's fixed budget)")
        if hasattr(how_many, "seed_with"):  # a planner with a random stream of its own (C-GRPO's): the run's seed
            how_many.seed_with(config.seed)
        check_finite(names["success_threshold"], config.ledger_success_threshold)
        ledger = PromptLedger(LedgerSettings(success_threshold=config.ledger_success_threshold))
        return cls(ledger, which, how_many, n=n, m=m, seed=config.seed,
                   budget_per_prompt=config.adaptive_budget)

    def plan(self, ids: torch.Tensor, num_groups: int, *, step: int, rank: int,
             pilot: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(P,) first-round rollouts per candidate (0: not sampled) and metrics: ``which``'s first B survivors,
        counted by ``how_many``, else n or the pilot k."""
        generator = _generator(self.seed, step, rank)
        P, metrics = len(ids), {}
        chosen = torch.zeros(P, dtype=torch.bool)
        if self.which is not None:
            plan = self.which.plan(ids, self.ledger, n=self.n, generator=generator)
            metrics.update(plan.metrics)
            # Pilot-Commit pilots every candidate it has not evicted; GRESO samples the first B it keeps.
            survivors = torch.nonzero(plan.rollouts > 0).flatten()[:None if self.commits else num_groups]
            chosen[survivors] = True
            missing = num_groups - len(survivors)
            if missing > 0:  # fill the batch: the skipped candidates least likely to be all-equal
                order = torch.argsort(plan.extra.get("skip_probability", torch.zeros(P)), stable=True)
                fill = order[~chosen[order]][:missing]
                chosen[fill] = True
            metrics["pods/prompts_readmitted"] = float(max(missing, 0))
        else:
            chosen[:] = True
        first = torch.zeros(P, dtype=torch.long)
        if self.how_many is not None:
            counts, allocated = self.allocate(ids[chosen])
            metrics.update({k: v for k, v in allocated.items() if k not in metrics})
            first[chosen] = counts
        elif self.commits:
            first[chosen] = self.which.settings.n_explore
        else:
            first[chosen] = pilot or self.n
        # The plan's rollouts are what is sampled: the chosen candidates' (a which-planner's own counts cover every
        # candidate it did not skip).
        metrics.update(rollout_metrics(first))
        return first, metrics

    @property
    def commits(self) -> bool:
        """True when the prompt planner samples in two rounds, a pilot and then a commit (Pilot-Commit)."""
        return isinstance(self.which, Committing)

    def commit(self, ids: torch.Tensor, rewards: torch.Tensor, counts: torch.Tensor, num_groups: int, *, step: int,
               rank: int = 0, gather=None, device=None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Pilot-Commit's second round from the pilots' rewards (P, n), ``counts`` (P,) (with ``gather``, a collective):
        ``more`` (P,) commit rollouts, ``committed`` (P,) bool, metrics."""
        piloted = counts > 0
        first = torch.zeros(len(ids), dtype=torch.bool)  # a prompt listed twice is judged (and committed) once
        seen = set()
        for p in torch.nonzero(piloted).flatten().tolist():
            if int(ids[p]) not in seen:
                seen.add(int(ids[p]))
                first[p] = True
        verdict = self.which.after_pilot(ids[first], rewards[first], counts[first], self.ledger, step=step,
                                         evict=False)
        solved = verdict.ids[verdict.evicted]
        if gather is not None:  # every process's solved prompts, in one order: the ledgers stay identical
            padded = torch.full((len(ids),), -1, dtype=torch.long)
            padded[:len(solved)] = solved
            solved = gather(padded.to(device)).cpu()
            solved = solved[solved >= 0]
        if len(solved):
            self.ledger.evict(solved)
        chosen = self.which.commit(num_groups, generator=_generator(self.seed, step, rank, 1))
        self.which.flush(step + 1)  # buffer_max_off_steps = 0: what is not committed now is not kept
        committed = first & torch.isin(ids, chosen.ids)
        std = torch.full((len(ids),), -1.0, dtype=torch.float64)
        std[first] = verdict.extra["std"]
        missing = num_groups - int(committed.sum())
        if missing > 0:
            order = torch.argsort(std, descending=True, stable=True)
            committed[order[(piloted & ~committed)[order]][:missing]] = True
        metrics = {name: verdict.metrics[name] for name in ("pods/pilot_passed", "pods/pilot_too_easy",
                                                             "pods/pilot_too_hard")}
        metrics.update({"pods/pilot_solved": float(verdict.evicted.sum()),
                        "pods/prompts_committed": float(committed.sum()),
                        "pods/prompts_filled": float(max(missing, 0))})
        more = torch.where(committed, self.which.settings.n_commit, 0)
        return more, committed, metrics

    @property
    def needs_costs(self) -> bool:
        """True when the rollout planner decides from measured step costs (``auto``): the engine calls ``observe``."""
        return bool(getattr(self.how_many, "needs_costs", False))

    def observe(self, *, sampled: int, sample_seconds: float, trained: int, update_seconds: float) -> None:
        """One optimizer step's rollouts sampled (0: none this step) and trained, and its sampling (generation +
        scoring) and update seconds, for a planner that decides from costs (nothing otherwise)."""
        if self.needs_costs:
            self.how_many.observe(sampled=sampled, sample_seconds=sample_seconds, trained=trained,
                                  update_seconds=update_seconds)

    def allocate(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(S,) rollouts in [m, n] per prompt of ``ids`` (S,) within ``adaptive_budget`` (n) each; and metrics."""
        if self.needs_costs:  # auto: no fixed budget, the counts with the most signal per measured second
            plan = self.how_many.plan(ids, self.ledger, n=self.n, m=self.m)
            return plan.rollouts.clamp(self.m, self.n), plan.metrics
        if getattr(self.how_many, "samples_in_rounds", False):  # its first round; the engine runs the others
            plan = self.how_many.plan(ids, self.ledger, n=self.n)
            return plan.rollouts, plan.metrics
        # A prompt the ledger cannot estimate yet gets the average (Knapsack-RL's code gives it its n: here the
        # budget per prompt, so that the budget holds from the first step); max_n caps the others at n.
        per_prompt = min(self.n, max(self.m, round(self.budget_per_prompt or self.n)))
        budget = round((self.budget_per_prompt or self.n) * len(ids))
        plan = self.how_many.plan(ids, self.ledger, n=per_prompt, total_budget=budget)
        return plan.rollouts.clamp(self.m, self.n), plan.metrics

    def record(self, ids: torch.Tensor, rewards: torch.Tensor, counts: torch.Tensor, *, step: int, epoch: int,
               gather=None, device=None) -> dict[str, float]:
        """Record every rank's groups (``rewards`` (P, n), ``counts`` (P,); one collective), then adapt the planners."""
        counts = torch.where(counts > 0, counts, -1)
        summary = self.ledger.record(ids, rewards, counts, step=step, gather=gather, gather_device=device)
        metrics = dict(summary.metrics)
        if isinstance(self.which, Adapting):
            metrics.update(self.which.update(summary, epoch=epoch))
        return metrics

    def state_dict(self) -> dict:
        """The ledger's and the planners' state."""
        return {"ledger": self.ledger.state_dict(),
                "which": self.which.state_dict() if self.which is not None else None,
                "how_many": self.how_many.state_dict() if self.how_many is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``."""
        self.ledger.load_state_dict(state["ledger"])
        for name in ("which", "how_many"):
            planner = getattr(self, name)
            if planner is not None and state.get(name) is not None:
                planner.load_state_dict(state[name])

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the state into ``directory`` (a checkpoint) as ``LEDGER_FILE``, by rename: never half written."""
        return save_atomically(self.state_dict(), Path(directory) / LEDGER_FILE)

    def load(self, directory: str | os.PathLike) -> bool:
        """Restore the state saved in ``directory``; False (nothing changed) when it holds none."""
        path = Path(directory) / LEDGER_FILE
        if not path.is_file():
            return False
        self.load_state_dict(torch.load(path, weights_only=True))
        return True

    def describe(self) -> dict:
        """The planners and their settings, for a run's records."""
        return {name: {"planner": type(p).__name__, **dataclasses.asdict(p.settings)}
                for name, p in (("prompt_planner", self.which), ("rollout_planner", self.how_many)) if p is not None}
