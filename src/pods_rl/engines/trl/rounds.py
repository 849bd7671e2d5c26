"""Adaptive rollouts in ``PODSTrainer``: a pilot round of k rollouts per prompt, then rounds for the prompts the
adaptive rule (``pods_rl.adaptive.plan_round``) keeps open, until each has m..n. ``RoundBook`` holds which of the P*n
slots each round's rollouts fill and what they scored; ``Rounds`` runs the loop, every process as many rounds of as many
rows (TRL gathers per-row tensors), given what it needs of the step (``RoundsHost``): a round is one ``_generate`` and
one ``_calculate_rewards`` of GRPOTrainer's, which the step runs."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from pods_rl.adaptive import group_is_mixed, plan_round, ranks_within
from pods_rl.engines.trl.rows import (
    Generated,
    Sampled,
    Scored,
    arrange_rounds,
    place_extra_logs,
    write_extra_fields,
)


class RoundBook:
    """One step's rounds for a process's P prompts, n slots each (prompt p's in p*n .. p*n + n - 1). ``more`` (P,):
    rollouts in the next round; ``counts`` (P,): so far; ``rewards`` (P, n): deciding rewards, NaN past ``counts``;
    ``per_func`` (P*n, F)."""

    def __init__(self, num_prompts: int, n: int, first: int | torch.Tensor):
        self.P, self.n = num_prompts, n
        self.more = torch.full((num_prompts,), first, dtype=torch.long) if isinstance(first, int) \
            else first.clone().long()  # (P,)
        self.counts = torch.zeros(num_prompts, dtype=torch.long)
        self.rewards = torch.full((num_prompts, n), float("nan"), dtype=torch.float64)
        self.per_func: torch.Tensor | None = None
        self.outputs: list[tuple] = []
        self.slots: list[list[int]] = []
        self.extra_logs: list[dict[str, list]] = []
        self.rows_generated = 0  # every process's rows of every round, padding included
        self.pilot_all_equal: torch.Tensor | None = None  # (P,) after the pilot

    @property
    def open_rows(self) -> int:
        """Rollouts this process generates in the next round."""
        return int(self.more.sum())

    def next_slots(self) -> list[int]:
        """The next round's slots, prompt by prompt: p*n + counts[p] + j for each new rollout j."""
        owners = torch.repeat_interleave(torch.arange(self.P), self.more).tolist()
        return [p * self.n + int(self.counts[p]) + j for p, j in zip(owners, ranks_within(owners))]

    def record(self, generated: tuple, slots: list[int], per_func: torch.Tensor, deciding: torch.Tensor,
               extra_logs: dict[str, list], rows_generated: int) -> None:
        """Note a round: output, rewards ``per_func`` (len(slots), F), ``deciding`` (len(slots),), log_extra."""
        if self.per_func is None:
            self.per_func = torch.full((self.P * self.n, per_func.shape[1]), float("nan"), dtype=per_func.dtype)
        self.per_func[slots] = per_func
        self.rewards.view(-1)[slots] = deciding
        self.outputs.append(generated)
        self.slots.append(slots)
        self.extra_logs.append(extra_logs)
        self.counts += self.more
        self.rows_generated += rows_generated
        if self.pilot_all_equal is None:
            self.pilot_all_equal = (~group_is_mixed(self.rewards, self.counts)).double()

    def arranged(self) -> tuple[Generated, dict[str, list]]:
        """The rounds' rollouts as P*n rows (``arrange_rounds``) and their log_extra columns by row."""
        generated = arrange_rounds(self.outputs, self.slots, self.P, self.n)
        return generated, place_extra_logs(self.extra_logs, self.slots, self.P * self.n)


@dataclass(frozen=True)
class RoundsHost:
    """What the rounds need of the step that runs them, passed in: the rounds themselves touch no trainer."""

    sample_round: Callable[[list[int], int, int], Scored]  # (slots, padding rows, run length) -> the round scored
    gather: Callable[[torch.Tensor], torch.Tensor]  # concatenated over processes along dim 0 (a collective)
    deciding_rewards: Callable[[torch.Tensor], torch.Tensor]  # (rows, F) -> (rows,) the reward that decides "mixed"
    phase: Callable[[str], AbstractContextManager]  # the phase clock's block for a phase name
    # The planners' next round (RolloutBudget.next_round): (ids, rewards, counts, the round's rollouts (P,), its
    # completions, its slots, first=) -> ((P,) rollouts of the next round, which may train or None); None: no planner
    next_round: Callable | None = None


class Rounds:
    """One step's rounds on this process's P prompts; ``args``: the step's ``PODSConfig``, ``rank``: the process's."""

    def __init__(self, args, n: int, m: int, rank: int, host: RoundsHost):
        self.args, self.n, self.m, self.rank, self.host = args, n, m, rank, host

    def sample(self, inputs: list[dict], first: torch.Tensor | None = None,
               ids: torch.Tensor | None = None) -> tuple[Sampled, dict[str, float]]:
        """The first round (the planners' ``first`` (P,), else ``pilot_generations`` each), then rounds for the prompts
        ``adaptive_rule`` or the planners (of ``ids`` (P,)) keep open: this process's rows, and metrics."""
        # Short processes pad their rounds (_agreed_round_rows).
        args, n, host = self.args, self.n, self.host
        num_sampled = len(inputs) // n  # P
        book = RoundBook(num_sampled, n, args.pilot_generations if first is None else first)
        planned = book.more > 0  # (P,) the prompts sampled this step
        trainable = None  # (P,) bool, after Pilot-Commit's pilot
        user_metrics = False
        while (round_rows := self._agreed_round_rows(book.open_rows)) > 0:
            slots = book.next_slots()
            scored = host.sample_round(slots, round_rows - len(slots), self._agreed_run_length(book.more, round_rows))
            user_metrics |= scored.user_metrics
            with host.phase("selection"):
                local = scored.gathered_rewards[self.rank * round_rows: self.rank * round_rows + len(slots)].cpu()
                book.record(scored.generated, slots, local, host.deciding_rewards(local),  # local: (rows, F)
                            {c: v[:len(slots)] for c, v in scored.extra_logs.items()},
                            scored.gathered_rewards.shape[0])
                if args.is_adaptive:
                    book.more = plan_round(book.rewards, book.counts, self.m, n, self._round_size, args.adaptive_rule,
                                           budget=self._budget(num_sampled)) * planned
                elif host.next_round is not None:  # answer rounds, a pilot's commit, else none
                    book.more, judged = host.next_round(ids, book.rewards, book.counts, book.more,
                                                        scored.generated.completions[:len(slots)], slots,
                                                        first=len(book.outputs) == 1)
                    trainable = trainable if judged is None else judged
                else:
                    book.more = torch.zeros_like(book.more)
        with host.phase("selection"):
            generated, extra_logs = book.arranged()
            write_extra_fields(inputs, generated.extra_fields)
            equal = book.pilot_all_equal[planned]  # (sampled prompts,) all-equal after the first round
            total, count = host.gather(torch.tensor([[equal.sum().item(), float(len(equal))]])).sum(0).tolist()
        metrics = {"pods/rollouts_sampled": float(book.rows_generated), "pods/rounds": float(len(book.outputs)),
                   "pods/frac_zero_std_pilot": total / count if count else float("nan")}
        return Sampled(generated, book.per_func, book.counts, extra_logs, user_metrics, trainable), metrics

    @property
    def _round_size(self) -> int:
        return self.args.adaptive_round_size or self.args.pilot_generations

    def _budget(self, num_sampled: int) -> int | None:  # adaptive_budget per prompt on average, if any
        return None if self.args.adaptive_budget is None else int(self.args.adaptive_budget * num_sampled)

    def _agreed_round_rows(self, local_rows: int) -> int:
        """The next round's rows on every process: the most any has open (0: done). A collective."""
        return int(self.host.gather(torch.tensor([local_rows])).max())

    def _agreed_run_length(self, more: torch.Tensor, round_rows: int) -> int:
        """``num_generations`` for the round's ``_generate``: the processes' common run length of one prompt's rows,
        else 1 (TRL's vLLM server de-duplicates gathered prompts by it). A collective."""
        open_counts = more[more > 0]
        uniform = round_rows == int(more.sum()) and len(set(open_counts.tolist())) == 1
        run = int(more.max()) if uniform else 1
        runs = self.host.gather(torch.tensor([run]))  # (processes,)
        return run if bool((runs == run).all()) else 1
