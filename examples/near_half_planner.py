"""A rollout planner of your own, in your own module: more rollouts for the prompts solved about half the time.

A prompt's recent pass rate p (the ledger's last ``window`` outcomes) gives it min_n + (max_n - min_n) x 4p(1 - p)
rollouts, rounded: max_n at p = 1/2, min_n at p = 0 or 1; a prompt the ledger has not seen gets the engine's n.
Importing this module registers it as ``near_half``; every engine then runs it by that name
(docs/guides/writing-a-planner.md; tests/test_writing_a_planner.py runs it).
"""

from dataclasses import dataclass

import torch

from pods_rl.budget.planners import Planner, make_plan, register_planner


@dataclass(frozen=True)
class NearHalfSettings:
    """The planner's knobs (``rollout_planner_args``); a bad one is a one-line ValueError when the run is configured."""

    min_n: int = 2  # rollouts of a prompt always or never solved
    max_n: int = 16  # rollouts of a prompt solved half the time (on verl: the most one prompt gets)
    window: int = 8  # the ledger's outcomes the pass rate reads (at most the ledger's window, 16)

    def __post_init__(self):
        if not (isinstance(self.min_n, int) and isinstance(self.max_n, int) and 1 <= self.min_n <= self.max_n):
            raise ValueError(f"near_half min_n={self.min_n!r}, max_n={self.max_n!r}: need integers 1 <= min_n <= max_n")
        if not (isinstance(self.window, int) and 1 <= self.window <= 16):
            raise ValueError(f"near_half window={self.window!r}: need an integer in [1, 16]")


# overwrite=True: the module may be imported twice in one process (by its name and by its file path), which is fine.
@register_planner("near_half", overwrite=True)
class NearHalf(Planner):
    """A ``how_many`` planner: rollouts per prompt from its recent pass rate; stateless (the ledger holds the past)."""

    kind = "how_many"  # the question it answers: how many rollouts each prompt gets
    Settings = NearHalfSettings

    @classmethod
    def complete(cls, args, layout):
        """min_n and max_n default to the run's m and n (``layout``): an engine refuses counts outside [m, n]."""
        return {"min_n": layout.m, "max_n": layout.n, **(args or {})}

    def __init__(self, settings: NearHalfSettings | None = None):
        self.settings = settings or NearHalfSettings()

    def plan(self, ids: torch.Tensor, ledger, *, n: int, generator=None, **budget):
        """``ids`` (P,) prompt ids -> a ``Plan`` whose ``rollouts`` (P,) are each prompt's count. ``n``: what an
        unseen prompt gets; ``budget``: what else an engine passes (e.g. ``total_budget``), unused here. Counts
        outside [m, n] (the kept and the most sampled rollouts per prompt) are refused in one line."""
        s = self.settings
        stats = ledger.stats(ids)
        rate = stats.recent_success_rate(s.window)  # (P,) float64, 0 where nothing is recorded
        spread = 4 * rate * (1 - rate)  # (P,) 1 at p = 1/2, 0 at p = 0 or 1
        counts = s.min_n + torch.round(spread * (s.max_n - s.min_n)).long()  # (P,)
        counts = torch.where(stats.seen, counts, n)
        return make_plan(ids, counts, metrics={"pods/near_half_rate_mean": float(rate.mean()) if len(ids) else 0.0})
