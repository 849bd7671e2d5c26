"""The prompt ledger: what a run has seen of each prompt, kept across epochs and saved in checkpoints.

    ledger = PromptLedger(LedgerSettings(success_threshold=0.5))
    summary = ledger.record(ids, rewards, counts, step=step, gather=accelerator.gather)  # after scoring
    stats = ledger.stats(candidate_ids)           # (P,) named tensors: rollouts, successes, streaks, ...

Prompt ids are int64 >= 0, stable across restarts: the dataset index, else ``prompt_key(prompt)`` (one kind per
ledger). Rewards NaN = not scored. Columns: ``PromptStats``. Design: docs/concepts/rollout-budgets.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pods_rl.adaptive import ranks_within

__all__ = ["LEDGER_FILE", "GroupSummary", "LedgerSettings", "PromptLedger", "PromptStats", "check_finite", "prompt_key"]

LEDGER_FILE = "pods_ledger.pt"  # the file name in a checkpoint directory
_VERSION = 1
_INT_COLUMNS = ("rollouts", "successes", "groups", "last_step", "all_success_streak", "no_success_streak",
                "last_group_rollouts", "last_group_successes")


def prompt_key(prompt) -> int:
    """A prompt id in [0, 2^63) stable across processes and runs: text, or chat messages as sorted-key JSON, hashed."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


@dataclass(frozen=True)
class LedgerSettings:
    """Success = reward > ``success_threshold``, or >= ``success_max`` (set exactly one); ``window``: outcomes kept."""

    success_threshold: float | None = 0.5
    success_max: float | None = None
    window: int = 16

    def __post_init__(self):
        if (self.success_threshold is None) == (self.success_max is None):
            raise ValueError("set exactly one of success_threshold (success: reward > it) and success_max (success: "
                             f"reward >= it), got {self.success_threshold!r} and {self.success_max!r}")
        for name in ("success_threshold", "success_max"):
            if getattr(self, name) is not None:
                check_finite(name, getattr(self, name))
        if isinstance(self.window, bool) or not isinstance(self.window, int) or not 1 <= self.window <= 4096:
            raise ValueError(f"window must be an integer in [1, 4096] (outcomes kept per prompt), got {self.window!r}")

    def success(self, rewards: torch.Tensor) -> torch.Tensor:
        """Bool tensor shaped like ``rewards``: which rewards count as a success (NaN never does)."""
        if self.success_threshold is not None:
            return rewards > self.success_threshold
        return rewards >= self.success_max


@dataclass(frozen=True)
class GroupSummary:
    """``record``'s groups in order (all ranks' when gathered): ``ids``, ``rollouts``, ``successes`` (G,) int64;
    ``all_success`` / ``no_success`` / ``zero_variance`` (G,) bool (False for an unscored group); ``pods/ledger_*``."""

    ids: torch.Tensor
    rollouts: torch.Tensor
    successes: torch.Tensor
    all_success: torch.Tensor
    no_success: torch.Tensor
    zero_variance: torch.Tensor
    metrics: dict[str, float]


@dataclass(frozen=True)
class PromptStats:
    """The ledger's columns for P prompts, each (P,) (``window`` (P, W) newest last, -1 empty): ``rollouts`` and
    ``successes`` counted, ``reward_sum``, ``groups``, streaks, the last group's counts, ``evicted``; zeros (-1 for
    ``last_step``, ``window``) where ``seen`` is False."""

    ids: torch.Tensor
    seen: torch.Tensor
    rollouts: torch.Tensor
    successes: torch.Tensor
    reward_sum: torch.Tensor
    groups: torch.Tensor
    last_step: torch.Tensor
    all_success_streak: torch.Tensor
    no_success_streak: torch.Tensor
    last_group_rollouts: torch.Tensor
    last_group_successes: torch.Tensor
    window: torch.Tensor
    evicted: torch.Tensor

    def recent_success_rate(self, length: int) -> torch.Tensor:
        """(P,) float64 success rate over each prompt's last ``length`` (<= W) outcomes; 0 for none."""
        if length > self.window.shape[1]:
            raise ValueError(f"length {length} is longer than the ledger's window {self.window.shape[1]}; raise the "
                             "ledger's window")
        recent = self.window[:, self.window.shape[1] - length:]  # (P, L) newest last, -1 = empty
        have = (recent >= 0).sum(dim=1)
        return torch.where(have > 0, (recent == 1).sum(dim=1).double() / have.clamp(min=1), 0.0)


class PromptLedger:
    """Per-prompt history of a run; with ``gather``, every rank records all ranks' groups and stays identical."""

    def __init__(self, settings: LedgerSettings | None = None):
        self.settings = settings or LedgerSettings()
        self._rows: dict[int, int] = {}  # prompt id -> row
        self._size = 0
        self._data = self._empty(16)

    def _empty(self, capacity: int) -> dict[str, torch.Tensor]:
        data = {name: torch.zeros(capacity, dtype=torch.long) for name in ("ids", *_INT_COLUMNS)}
        data["last_step"].fill_(-1)
        data["reward_sum"] = torch.zeros(capacity, dtype=torch.float64)
        data["evicted"] = torch.zeros(capacity, dtype=torch.bool)
        data["window"] = torch.full((capacity, self.settings.window), -1, dtype=torch.int8)
        return data

    def __len__(self) -> int:
        return self._size

    @property
    def ids(self) -> torch.Tensor:
        """(N,) int64: every prompt id recorded so far, in the order first seen."""
        return self._data["ids"][: self._size].clone()

    def rows(self, ids, *, create: bool = False) -> torch.Tensor:
        """(P,) int64 rows of ``ids`` (P,) in the ledger; -1 for an id never seen, or a new row with ``create``."""
        ids = _as_ids(ids)
        get = self._rows.get
        if not create:  # (a list, then one tensor: writing tensor items one by one is slow)
            return torch.tensor([get(key, -1) for key in ids.tolist()], dtype=torch.long)
        rows = []
        for key in ids.tolist():  # one at a time: an id listed twice gets one row
            row = get(key, -1)
            rows.append(row if row >= 0 else self._append(key))
        return torch.tensor(rows, dtype=torch.long)

    def _append(self, key: int) -> int:
        if self._size == len(self._data["ids"]):  # grow by doubling
            grown = self._empty(2 * self._size)
            for name, column in self._data.items():
                grown[name][: self._size] = column
            self._data = grown
        row = self._size
        self._data["ids"][row] = key
        self._rows[key] = row
        self._size += 1
        return row

    def record(self, ids, rewards, counts=None, *, step: int,
               gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
               gather_device: torch.device | str | None = None) -> GroupSummary:
        """Add groups (``ids[g]`` got ``rewards[g, :counts[g]]``, (G, n); counts default n, -1 pads); their summary.
        ``gather`` concatenates over ranks on ``gather_device`` (one collective: call it on every rank)."""
        ids, rewards, counts = _as_groups(ids, rewards, counts)
        if gather is not None:
            ids, rewards, counts = _gathered(ids, rewards, counts, gather, gather_device)
        real = counts >= 0
        ids, rewards, counts = ids[real], rewards[real], counts[real]
        n = rewards.shape[1]
        rewards = torch.where(torch.arange(n) < counts.unsqueeze(1), rewards, float("nan"))  # padding -> NaN
        scored = ~torch.isnan(rewards)  # (G, n)
        success = self.settings.success(rewards) & scored
        rows = self.rows(ids, create=True)
        # A prompt twice in one call: add its groups in passes (the first occurrences, then the second, ...).
        occurrence = _occurrence(rows)
        passes = int(occurrence.max()) + 1 if len(rows) else 0
        if passes == 1:  # every prompt once (the usual step): one pass, nothing to pick out
            self._update(rows, rewards, scored, success, step)
        else:
            for k in range(passes):
                chosen = occurrence == k
                self._update(rows[chosen], rewards[chosen], scored[chosen], success[chosen], step)
        return _summary(ids, rewards, scored, success)

    def _update(self, rows, rewards, scored, success, step: int) -> None:
        """Add one group to each of ``rows`` (distinct). rewards/scored/success (G, n)."""
        d = self._data
        n_scored = scored.sum(dim=1)  # (G,)
        n_success = success.sum(dim=1)
        has = n_scored > 0
        d["rollouts"][rows] += n_scored
        d["successes"][rows] += n_success
        d["reward_sum"][rows] += torch.where(scored, rewards.double(), 0.0).sum(dim=1)
        d["groups"][rows] += 1
        d["last_step"][rows] = int(step)
        # Streaks: a group with no scored rollout says nothing and leaves them as they were.
        for name, hit in (("all_success_streak", n_success == n_scored), ("no_success_streak", n_success == 0)):
            d[name][rows] = torch.where(has, torch.where(hit, d[name][rows] + 1, 0), d[name][rows])
        d["last_group_rollouts"][rows] = torch.where(has, n_scored, d["last_group_rollouts"][rows])
        d["last_group_successes"][rows] = torch.where(has, n_success, d["last_group_successes"][rows])
        # Window: the scored outcomes in rollout order appended after the old ones; keep the last W.
        W, n = self.settings.window, scored.shape[1]
        order = torch.sort((~scored).to(torch.int8), dim=1, stable=True).indices  # scored first, in order
        outcomes = torch.where(scored, success.to(torch.int8), -1).gather(1, order)  # (G, n)
        combined = torch.cat([d["window"][rows], outcomes], dim=1)  # (G, W + n)
        d["window"][rows] = combined.gather(1, torch.arange(W).unsqueeze(0) + n_scored.unsqueeze(1).clamp(max=n))

    def stats(self, ids) -> PromptStats:
        """The ledger's columns for ``ids`` (P,) as a ``PromptStats`` of (P,) tensors (``window`` (P, W))."""
        ids = _as_ids(ids)
        columns = self.columns(ids, *(name for name in self._data if name != "ids"))
        return PromptStats(ids=ids, **columns)

    def columns(self, ids, *names: str) -> dict[str, torch.Tensor]:
        """Only the named columns of ``PromptStats`` for ``ids`` (P,), and ``seen`` (P,) bool: a planner that reads
        two columns per step does not copy all twelve."""
        rows = self.rows(ids)
        seen = rows >= 0
        out = {name: self._data[name][rows.clamp(min=0)] for name in names}
        if not bool(seen.all()):  # never-seen prompts get an empty row's values
            empty = self._empty(1)
            for name, column in out.items():
                column[~seen] = empty[name][0]
        return {"seen": seen, **out}

    def every(self, *names: str) -> dict[str, torch.Tensor]:
        """The named columns of every prompt recorded so far, (N,) each in ``ids`` order: views of the ledger's own
        storage, to read only (``columns(ledger.ids, ...)`` without looking each id up)."""
        return {name: self._data[name][: self._size] for name in names}

    def evict(self, ids) -> None:
        """Mark ``ids`` (P,) evicted: planners never sample them again (Pilot-Commit's solved prompts)."""
        rows = self.rows(ids, create=True)
        self._data["evicted"][rows] = True

    def state_dict(self) -> dict:
        """Everything needed to restore this ledger exactly: the settings and every column, in row order."""
        state = {name: column[: self._size].clone() for name, column in self._data.items()}
        return {"version": _VERSION, "settings": asdict(self.settings), **state}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``. The settings must match this ledger's (a ValueError names the difference)."""
        if state.get("version") != _VERSION:
            raise ValueError(f"ledger state has version {state.get('version')!r}, this pods-rl reads {_VERSION}")
        saved = LedgerSettings(**state["settings"])
        if saved != self.settings:
            raise ValueError(f"the saved ledger was kept with {saved}, this run asks for {self.settings}; resume with "
                             "the saved settings")
        size = len(state["ids"])
        self._data = self._empty(max(16, size))
        for name in self._data:
            self._data[name][:size] = state[name]
        self._size = size
        self._rows = {key: row for row, key in enumerate(state["ids"].tolist())}

    def save(self, path) -> Path:
        """Write ``state_dict`` to ``path`` atomically."""
        return save_atomically(self.state_dict(), path)

    @classmethod
    def load(cls, path) -> PromptLedger:
        """A ledger restored from a file ``save`` wrote (with the settings it was kept with)."""
        state = torch.load(Path(path), weights_only=True)
        ledger = cls(LedgerSettings(**state["settings"]))
        ledger.load_state_dict(state)
        return ledger


def _as_ids(ids) -> torch.Tensor:
    ids = torch.as_tensor(ids).detach().cpu()
    if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be a 1-d integer tensor of prompt ids, got {ids.dtype} of shape {tuple(ids.shape)}")
    ids = ids.long()
    if bool((ids < 0).any()):
        raise ValueError("prompt ids must be >= 0 (dataset indices, or pods_rl.budget.ledger.prompt_key of the prompt)")
    return ids


def _as_groups(ids, rewards, counts):
    ids = _as_ids(ids)
    rewards = torch.as_tensor(rewards).detach().cpu()
    if rewards.dim() != 2 or rewards.shape[0] != len(ids):
        raise ValueError(f"rewards must be (G, n) with one row per id (G={len(ids)}), got shape "
                         f"{tuple(rewards.shape)}")
    rewards = rewards.double()
    n = rewards.shape[1]
    counts = torch.full((len(ids),), n, dtype=torch.long) if counts is None else torch.as_tensor(counts).cpu().long()
    if counts.shape != ids.shape or bool(((counts < -1) | (counts > n)).any()):
        raise ValueError(f"counts must be (G,) integers in [0, n={n}] (or -1 for a padding row), got {counts.tolist()}")
    return ids, rewards, counts


def _gathered(ids, rewards, counts, gather, device):
    """All ranks' groups in rank order, as one float64 (G, 3 + n) table (ids as two 32-bit halves: exact in float64)."""
    table = torch.cat([(ids >> 32).double().unsqueeze(1), (ids & 0xFFFFFFFF).double().unsqueeze(1),
                       counts.double().unsqueeze(1), rewards], dim=1)
    table = gather(table if device is None else table.to(device)).cpu().double()
    ids = (table[:, 0].long() << 32) | table[:, 1].long()
    return ids, table[:, 3:], table[:, 2].long()


def check_finite(name: str, value) -> None:
    """``value`` must be a finite number; else one ValueError line naming it as ``name`` (the caller's spelling)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def save_atomically(state, path) -> Path:
    """``torch.save`` ``state`` to ``path`` through a temporary file renamed into place: no reader sees half of it."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)
    return path


def _occurrence(rows: torch.Tensor) -> torch.Tensor:
    """(G,) how many earlier entries of ``rows`` equal each entry (0 for a first occurrence)."""
    return torch.tensor(ranks_within(rows.tolist()), dtype=torch.long)


def _summary(ids, rewards, scored, success) -> GroupSummary:
    n_scored = scored.sum(dim=1)
    n_success = success.sum(dim=1)
    has = n_scored > 0
    top = torch.where(scored, rewards, float("-inf")).amax(dim=1) if rewards.shape[1] else n_scored.double()
    bottom = torch.where(scored, rewards, float("inf")).amin(dim=1) if rewards.shape[1] else n_scored.double()
    groups = max(len(ids), 1)
    metrics = {"pods/ledger_groups_recorded": float(len(ids)),
               "pods/ledger_frac_all_success": float((has & (n_success == n_scored)).sum()) / groups,
               "pods/ledger_frac_no_success": float((has & (n_success == 0)).sum()) / groups}
    return GroupSummary(ids=ids, rollouts=n_scored, successes=n_success, all_success=has & (n_success == n_scored),
                        no_success=has & (n_success == 0), zero_variance=has & (top == bottom), metrics=metrics)
