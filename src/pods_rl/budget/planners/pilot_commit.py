"""Pilot-Commit (Kim et al. 2025, "Spend Your Rollouts Where It Counts"; code: github.com/databricks/pilot-commit,
``recipe/pc``: ``RayPCTrainer``, ``ReplayBuffer``).

Each round pilots fresh prompts with ``n_explore`` rollouts and commits prompts that passed an earlier pilot to
``n_commit`` more; a committed prompt trains on ``n_explore_effective`` pilot rollouts plus its commit rollouts as
one group. A pilot with success rate r above 1 - ``diversity_threshold_upper`` is *skipped*, below
``diversity_threshold_lower`` *deferred* (back in a later epoch), otherwise it waits in the buffer to be committed;
r >= ``exclude_threshold_upper`` *evicts* it for good. ``commit(k)`` takes k by ``buffer_sampling_method``
(``least_recent`` really takes the oldest first: the code sorts it newest first too, a slip we do not copy);
``flush(step)`` drops pilots older than ``buffer_max_off_steps``. ``pilot_keep`` picks the pilot rollouts to train.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners.base import (
    CONFIG_NAMES,
    Layout,
    Plan,
    Planner,
    as_ids,
    check_choice,
    check_int,
    check_number,
    make_plan,
    register_planner,
)

__all__ = ["PLAIN_REASONS", "PilotCommit", "PilotCommitSettings", "check_pilot_commit", "pilot_keep"]

_OWNER = "Pilot-Commit"
SAMPLING = ("max_variance", "random", "most_recent", "least_recent")


# Why a Pilot-Commit setting is refused, by setting (None: allowed): the budget's own words; an engine passes its row.
PLAIN_REASONS = {"buffer_max_off_steps": "the rollout budget commits a prompt in the step that piloted it",
                 "n_explore_effective": "the rollout budget trains on every pilot rollout of a committed prompt",
                 "environment": None}


@dataclass(frozen=True)
class PilotCommitSettings:
    """Pilot-Commit's knobs, named as in the released code; defaults from its README and the scripts' 1:3
    pilot:commit split. ``exclude_threshold_upper`` None never evicts; ``n_explore_effective`` None trains all."""

    diversity_threshold_upper: float = 0.25
    diversity_threshold_lower: float = 0.125
    exclude_threshold_upper: float | None = 1.0
    buffer_max_off_steps: int = 4
    buffer_sampling_method: str = "max_variance"
    n_explore: int = 8
    n_commit: int = 24
    n_explore_effective: int | None = None

    def __post_init__(self):
        check_number(_OWNER, "diversity_threshold_upper", self.diversity_threshold_upper, 0.0, 1.0)
        check_number(_OWNER, "diversity_threshold_lower", self.diversity_threshold_lower, 0.0,
                     1.0 - self.diversity_threshold_upper, fix="lower <= 1 - upper, or no prompt can pass")
        if self.exclude_threshold_upper is not None:
            check_number(_OWNER, "exclude_threshold_upper", self.exclude_threshold_upper, 0.0, 1.0)
        check_int(_OWNER, "buffer_max_off_steps", self.buffer_max_off_steps, 0)
        check_choice(_OWNER, "buffer_sampling_method", self.buffer_sampling_method, SAMPLING)
        check_int(_OWNER, "n_explore", self.n_explore, 1)
        check_int(_OWNER, "n_commit", self.n_commit, 1)
        if self.n_explore_effective is not None:
            check_int(_OWNER, "n_explore_effective", self.n_explore_effective, 1, self.n_explore)

    @property
    def effective(self) -> int:
        """Pilot rollouts a committed prompt trains on."""
        return self.n_explore if self.n_explore_effective is None else self.n_explore_effective


@register_planner("pilot_commit")
class PilotCommit(Planner):
    """Pilot-Commit as a ``which_prompts`` planner; its state is the buffer of passed pilots, in the order added.

    Per round: ``plan`` and ``commit(k)``, sample and record both, ``after_pilot`` on the pilots; after the step,
    ``flush(step)``."""

    kind = "which_prompts"
    Settings = PilotCommitSettings
    needs = frozenset({"pilot"})  # an engine judges each pilot (after_pilot) before its commit round

    def first_round(self, n: int) -> int:
        """The pilot: ``n_explore``."""
        return self.settings.n_explore

    @classmethod
    def complete(cls, args, layout: Layout) -> dict:
        """``check_pilot_commit`` in the layout's spelling."""
        return check_pilot_commit(args, layout.n, names=layout.names, reasons=layout.reasons, other=layout.other,
                                  environment=layout.environment)

    def __init__(self, settings: PilotCommitSettings | None = None):
        self.settings = settings or PilotCommitSettings()
        self._buffer: dict[int, tuple[int, float, float, int]] = {}

    def __len__(self) -> int:
        return len(self._buffer)

    @property
    def buffered(self) -> torch.Tensor:
        """(K,) int64 ids waiting in the buffer, in the order added."""
        return torch.tensor(list(self._buffer), dtype=torch.long)

    def plan(self, ids, ledger: PromptLedger, *, n: int | None = None,
             generator: torch.Generator | None = None) -> Plan:
        """The pilot: ``n_explore`` rollouts for each candidate of ``ids`` (P,), 0 for an evicted one. ``n``, if
        given, must be n_explore_effective + n_commit (the group a committed prompt trains on)."""
        s = self.settings
        if n is not None and n != s.effective + s.n_commit:
            raise ValueError(f"{_OWNER} trains on n_explore_effective + n_commit = {s.effective + s.n_commit} "
                             f"rollouts per prompt, got n={n}; set num_generations to that")
        ids = as_ids(ids)
        evicted = ledger.stats(ids).evicted
        return make_plan(ids, torch.where(evicted, 0, s.n_explore), evicted=evicted)

    def after_pilot(self, ids, rewards, counts, ledger: PromptLedger, *, step: int, evict: bool = True) -> Plan:
        """The verdict on pilots ``ids`` (P,) from rewards (P, n) padded after ``counts``: passed (buffered),
        skipped, deferred or evicted (in ``ledger`` too unless ``evict`` is False, for engines that evict all ranks'
        verdicts in one order). ``rollouts`` 0; ``extra``: ``passed``, ``success_rate``, ``std``."""
        ids = as_ids(ids)
        rewards = torch.as_tensor(rewards).detach().cpu().double()
        counts = torch.full((len(ids),), rewards.shape[1]) if counts is None else torch.as_tensor(counts).long()
        if rewards.dim() != 2 or rewards.shape[0] != len(ids) or len(set(ids.tolist())) != len(ids):
            raise ValueError(f"after_pilot needs distinct ids (P,) and rewards (P, n), got {len(ids)} ids and shape "
                             f"{tuple(rewards.shape)}")
        s = self.settings
        scored = (torch.arange(rewards.shape[1]) < counts.unsqueeze(1)) & ~torch.isnan(rewards)
        success = ledger.settings.success(rewards) & scored
        rate = torch.zeros(len(ids), dtype=torch.float64)
        std = torch.zeros(len(ids), dtype=torch.float64)
        for p in range(len(ids)):  # numpy's mean and std, as the code computes them (ties in std then match)
            values = success[p][scored[p]].double().numpy()
            if len(values):
                rate[p], std[p] = float(np.mean(values)), float(np.std(values))
        has = scored.any(dim=1)
        too_easy = has & (rate > 1.0 - s.diversity_threshold_upper)
        too_hard = has & ~too_easy & (rate < s.diversity_threshold_lower)
        passed = has & ~too_easy & ~too_hard
        evicted = torch.zeros(len(ids), dtype=torch.bool)
        if s.exclude_threshold_upper is not None:
            evicted = has & (rate >= s.exclude_threshold_upper)
        for p in torch.nonzero(passed).flatten().tolist():
            # Re-adding a prompt keeps its place in the order (a dict's), as the code's buffer does.
            self._buffer[int(ids[p])] = (int(step), float(rate[p]), float(std[p]), int(scored[p].sum()))
        if evict and bool(evicted.any()):
            ledger.evict(ids[evicted])
        metrics = {"pods/pilot_passed": float(passed.sum()), "pods/pilot_too_easy": float(too_easy.sum()),
                   "pods/pilot_too_hard": float(too_hard.sum()), "pods/buffer_size": float(len(self._buffer))}
        return make_plan(ids, torch.zeros(len(ids), dtype=torch.long), skipped=too_easy, deferred=too_hard,
                         evicted=evicted, extra={"passed": passed, "success_rate": rate, "std": std}, metrics=metrics)

    def commit(self, k: int, *, generator: torch.Generator | None = None) -> Plan:
        """Take up to ``k`` prompts out of the buffer, ``n_commit`` rollouts each; ``extra``: ``pilot_step``."""
        check_int(_OWNER, "k (prompts to commit)", k, 0)
        order = list(self._buffer)
        if len(order) > k:
            order = self._choose(order, k, generator)
        entries = [self._buffer.pop(key) for key in order]
        ids = torch.tensor(order, dtype=torch.long)
        pilot_step = torch.tensor([e[0] for e in entries], dtype=torch.long)
        return make_plan(ids, torch.full((len(ids),), self.settings.n_commit, dtype=torch.long),
                         extra={"pilot_step": pilot_step},
                         metrics={"pods/prompts_committed": float(len(ids)), "pods/buffer_size": float(len(self))})

    def _choose(self, order: list[int], k: int, generator) -> list[int]:
        method = self.settings.buffer_sampling_method
        if method == "random":
            picks = torch.randperm(len(order), generator=generator)[:k].tolist()
            return [order[i] for i in picks]
        if method == "max_variance":  # std, then step, both descending; Python's sort is stable: ties keep order
            return sorted(order, key=lambda key: (self._buffer[key][2], self._buffer[key][0]), reverse=True)[:k]
        return sorted(order, key=lambda key: self._buffer[key][0], reverse=method == "most_recent")[:k]

    def flush(self, step: int) -> torch.Tensor:
        """Drop the pilots older than ``buffer_max_off_steps`` (step - their step > it); returns their ids (K,)."""
        stale = [key for key, entry in self._buffer.items() if step - entry[0] > self.settings.buffer_max_off_steps]
        for key in stale:
            del self._buffer[key]
        return torch.tensor(stale, dtype=torch.long)

    def state_dict(self) -> dict:
        """The buffer, in order: ids, steps, success rates, stds, rollouts (tensors). Its pilot rollouts live in the
        engine: resuming without them, ``flush`` everything (``load_state_dict(..., keep_buffer=False)``)."""
        entries = list(self._buffer.items())
        return {"ids": torch.tensor([k for k, _ in entries], dtype=torch.long),
                "step": torch.tensor([e[0] for _, e in entries], dtype=torch.long),
                "success_rate": torch.tensor([e[1] for _, e in entries], dtype=torch.float64),
                "std": torch.tensor([e[2] for _, e in entries], dtype=torch.float64),
                "rollouts": torch.tensor([e[3] for _, e in entries], dtype=torch.long)}

    def load_state_dict(self, state: dict, *, keep_buffer: bool = True) -> None:
        """Restore the buffer (or start it empty when the engine did not keep the pilot rollouts)."""
        self._buffer = {}
        if keep_buffer:
            for i, key in enumerate(state["ids"].tolist()):
                self._buffer[key] = (int(state["step"][i]), float(state["success_rate"][i]), float(state["std"][i]),
                                     int(state["rollouts"][i]))


def pilot_keep(successes, m: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """(P, m) int64 ascending indices of m of n pilot rollouts (``successes`` (P, n)): m // 2 of each outcome where
    possible, at random within a side (the code's ``_maxvar_downsample_binary``)."""
    successes = torch.as_tensor(successes).bool()
    P, n = successes.shape
    if not 1 <= m <= n:
        raise ValueError(f"pilot_keep needs 1 <= m <= n (n={n} pilot rollouts), got m={m}")
    kept = torch.empty((P, m), dtype=torch.long)
    for p in range(P):
        ones, zeros = torch.nonzero(successes[p]).flatten(), torch.nonzero(~successes[p]).flatten()
        need_ones = m // 2
        if len(ones) < need_ones:
            need_ones = len(ones)
        elif len(zeros) < m - need_ones:
            need_ones = m - len(zeros)
        pick_ones = ones[torch.randperm(len(ones), generator=generator)[:need_ones]]
        pick_zeros = zeros[torch.randperm(len(zeros), generator=generator)[: m - need_ones]]
        kept[p] = torch.cat([pick_ones, pick_zeros]).sort().values
    return kept


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
