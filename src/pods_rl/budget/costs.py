"""A cost-aware planner's seconds (``needs`` "costs") in one place: ``CostMeter`` feeds ``RolloutBudget.observe``."""

# An engine reports what it sees: rollouts sampled (``sampled``) and a step's phase seconds (``phases``: TRL's phase
# clock), or a step's dispatches and the batch handed to the trainer (``dispatched``, ``trained``: verl, which has no
# phase clock), or groups sampled in windows while training overlaps (``open``, ``close``, ``wait``: the asynchronous
# worker). Windows are delivered in draw order: a window's sampling seconds run from the delivery of the one before
# (or its own draw, if later) to its last group's close, less the seconds waited on the trainer meanwhile.

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["CostMeter"]


@dataclass
class _Window:
    # open groups, rollouts sampled and trained by the closed ones, (clock, seconds waited) at its draw and close

    open: int
    drawn: tuple[float, float]
    sampled: int = 0
    trained: int = 0
    closed: tuple[float, float] | None = None


class CostMeter:
    """The cost observations of ``budget`` (a ``RolloutBudget``; nothing kept unless it needs "costs")."""

    def __init__(self, budget, clock: Callable[[], float] = time.monotonic):
        self.budget, self.clock, self.active = budget, clock, "costs" in budget.needs
        self.waited = 0.0  # seconds waited on the trainer so far
        self.windows: dict[int, _Window] = {}  # by draw index, until delivered in order
        self.window_of: dict[int, int] = {}  # group id -> its window, groups not yet closed
        self.drawn_windows = self.delivered_windows = 0
        self.delivered: tuple[float, float] | None = None  # (clock, waited) when the last window was delivered
        self.rollouts = 0  # rollouts sampled since the last ``phases`` (or the last step's first dispatch)
        self.first_dispatch: tuple[int, float] | None = None  # (step, clock) of the current step's first dispatch
        self.handed: tuple[int, float, int] | None = None  # (step, clock, rows) of the last batch handed to training

    def sampled(self, rollouts: int) -> None:
        """``rollouts`` more sampled in the current optimizer step."""
        self.rollouts += rollouts

    def phases(self, seconds: dict[str, float], *, trained: int) -> None:
        """An optimizer step's phase seconds (TRL's phase clock): the rollouts sampled since the last against
        generation + scoring, ``trained`` kept rollouts against the update."""
        sampled, self.rollouts = self.rollouts, 0
        self.step(sampled=sampled, sample_seconds=seconds["generation"] + seconds["scoring"], trained=trained,
                  update_seconds=seconds["update"])

    def dispatched(self, step: int) -> None:
        """A dispatch of optimizer ``step``'s rollouts now (then ``sampled``); a step's first observes the step before:
        sampling from that one's first dispatch to its batch (``trained``), update from there to now (a save: slow)."""
        now = self.clock()
        if not self.active or (self.first_dispatch is not None and self.first_dispatch[0] == step):
            return
        sampled, self.rollouts, done, last = self.rollouts, 0, self.handed, self.first_dispatch
        if last is not None and done is not None and done[0] == last[0]:
            self.step(sampled=sampled, sample_seconds=done[1] - last[1], trained=done[2], update_seconds=now - done[1])
        self.first_dispatch = (step, now)

    def trained(self, step: int, rows: int) -> None:
        """Optimizer ``step``'s batch of ``rows`` kept rollouts is handed to the trainer now: its sampling ends."""
        self.handed = (step, self.clock(), rows)

    def step(self, *, sampled: int, sample_seconds: float, trained: int, update_seconds: float) -> None:
        """A step's rollouts sampled and trained and its sampling and update seconds."""
        self.budget.observe(sampled=sampled, sample_seconds=sample_seconds, trained=trained,
                            update_seconds=update_seconds)

    def wait(self, seconds: float) -> None:
        """The sampler waited ``seconds`` on the trainer: not sampling time."""
        self.waited += seconds

    def open(self, group_ids: Iterable[int]) -> None:
        """A window of groups drawn now."""
        group_ids = list(group_ids)
        if self.active and group_ids:
            self.windows[self.drawn_windows] = _Window(open=len(group_ids), drawn=(self.clock(), self.waited))
            self.window_of.update((group_id, self.drawn_windows) for group_id in group_ids)
            self.drawn_windows += 1

    def close(self, group_id: int, *, sampled: int, trained: int) -> dict[str, float]:
        """A group is done (``sampled`` scored, ``trained`` kept): observe each window it delivers; their metrics."""
        window = self.windows.get(self.window_of.pop(group_id, -1))
        if window is None:
            return {}
        window.open -= 1
        window.sampled, window.trained = window.sampled + sampled, window.trained + trained
        if window.open == 0:
            window.closed = (self.clock(), self.waited)
        metrics = {}
        while self.delivered_windows in self.windows and self.windows[self.delivered_windows].closed is not None:
            done = self.windows.pop(self.delivered_windows)
            # In draw order: a window closed before the one ahead of it is delivered with it, in no extra time.
            start = done.drawn if self.delivered is None or done.drawn[0] > self.delivered[0] else self.delivered
            end = done.closed if done.closed[0] > start[0] else start
            seconds = max(end[0] - start[0] - (end[1] - start[1]), 0.0)
            self.step(sampled=done.sampled, sample_seconds=seconds, trained=0, update_seconds=0.0)
            self.delivered, self.delivered_windows = end, self.delivered_windows + 1
            metrics = {"pods/auto_window_sample_s": seconds, "pods/auto_window_sampled": float(done.sampled)}
        return metrics
