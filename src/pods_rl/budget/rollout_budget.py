"""The planning loop every engine drives: which candidate prompts get rollouts and how many, from the ledger.

Engine-neutral; an engine samples what it is told and says what it cost::

    budget = RolloutBudget.from_config(config)            # None when no planner is set
    first, metrics = budget.plan(ids, num_groups, ...)    # (P,) a step's first round (draw: a window, prompt by prompt)
    ... generate and score them; after each round ...
    more, trainable, metrics = budget.next_round(...)     # C-GRPO's budgets, Pilot-Commit's commit (judge_one: one)
    check_inputs(budget, calibration_dataset, ...)        # a planner's inputs beside the prompts; then calibrate(...)
    metrics = budget.record(ids, rewards, counts, ...)    # every rank's groups (note/flush: groups one by one)
    budget.costs.sampled / .phases / .close / .dispatched / .trained  # what it cost (costs.CostMeter), for auto
    budget.save(checkpoint_dir) / budget.load(checkpoint_dir)
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from pods_rl.budget.cgrpo_run import CalibrationSet, CGRPORun, check_calibration_inputs
from pods_rl.budget.costs import CostMeter
from pods_rl.budget.ledger import (
    LEDGER_FILE,
    LedgerSettings,
    PromptLedger,
    check_finite,
    prompt_key,
    save_atomically,
)
from pods_rl.budget.planners import make_planner
from pods_rl.budget.planners.base import (
    CONFIG_NAMES,
    Layout,
    Plan,
    check_plan,
    member,
    needs_of,
    planner_class,
    rollout_metrics,
)
from pods_rl.budget.planners.pilot_commit import PLAIN_REASONS, check_pilot_commit

__all__ = ["CONFIG_NAMES", "PLAIN_REASONS", "BudgetSettings", "CalibrationSet", "RolloutBudget", "candidate_ids",
           "check_calibration_inputs", "check_inputs", "check_pilot_commit", "check_planner_settings",
           "check_rollout_planner", "step_generator"]


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
    pilot_generations: int | None = None  # the adaptive pilot (another setting that decides counts)

    @classmethod
    def of(cls, config) -> BudgetSettings:
        """The budget settings of ``config`` (a ``PODSConfig``, or anything with these fields)."""
        return cls(**{field.name: getattr(config, field.name, field.default) for field in dataclasses.fields(cls)})


def candidate_ids(inputs: list[dict], n: int) -> torch.Tensor:
    """(P,) the ledger ids of the P prompts of ``inputs`` (each prompt's row repeated n times)."""
    return torch.tensor([prompt_key(inputs[p]["prompt"]) for p in range(0, len(inputs), n)], dtype=torch.long)


def check_planner_settings(config, *, names: Mapping[str, str] | None = None,
                           reasons: Mapping[str, str | None] | None = None) -> None:
    """Refuse, one line each before any model loads, planner settings PODS cannot carry out (``config``: a
    ``PODSConfig``; ``names``, ``reasons``: as ``check_pilot_commit`` takes them)."""
    names = CONFIG_NAMES if names is None else names
    if config.prompt_planner is not None and config.oversample_prompts <= 1:
        raise ValueError(f"{names['prompt_planner']}={config.prompt_planner!r} skips prompts before sampling and "
                         f"replaces them with other candidates: set {names['oversample_prompts']} above 1 (e.g. 2), "
                         "or nothing can replace them")
    check_rollout_planner(config.rollout_planner, pilot=config.is_adaptive, n=config.num_generations,
                          m=config.downsample_to, names=names)
    RolloutBudget.from_config(config, names=names, reasons=reasons)  # each planner's layout and knobs


def check_rollout_planner(planner: str | None, *, pilot: bool, n: int, m: int,
                          names: Mapping[str, str] | None = None) -> None:
    """Refuse a rollout planner beside the adaptive pilot (both decide how many rollouts); ``pilot``: whether the
    adaptive pilot is set. (Each planner checks n and m itself: ``Planner.complete``.)"""
    names = CONFIG_NAMES if names is None else names
    if planner is not None and pilot:
        raise ValueError(f"{names['rollout_planner']} and {names['pilot']} both decide how many rollouts a prompt "
                         "gets: set one")


def step_generator(seed: int, step: int, rank: int, *salt: int) -> torch.Generator:
    """A generator seeded by integers (seed, step, rank, salt): the same draws in every process and on a resume."""
    return torch.Generator().manual_seed(hash((seed, step, rank, *salt)) & (2**63 - 1))


class RolloutBudget:
    """The ledger and the step's planners (``prompt_planner``: which prompts, ``rollout_planner``: how many)."""

    def __init__(self, ledger: PromptLedger, which=None, how_many=None, *, n: int, m: int, seed: int,
                 budget_per_prompt: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.ledger, self.which, self.how_many = ledger, which, how_many
        self.n, self.m, self.seed = n, m, seed
        self.budget_per_prompt = budget_per_prompt
        self.needs = needs_of(which) | needs_of(how_many)  # what the engine must offer (engines.settings.OFFERS)
        self.costs = CostMeter(self, clock)  # what sampling and training cost, as each engine measures it
        self.answers = None  # completions' answers read for "calibration" and "answer_rounds" (set by check_inputs)
        self.pending: list[tuple[int, list[float], int, int]] = []  # noted groups: (prompt id, rewards, step, epoch)

    @classmethod
    def from_config(cls, config, *, names: Mapping[str, str] | None = None,
                    reasons: Mapping[str, str | None] | None = None,
                    environment: bool = False) -> RolloutBudget | None:
        """The budget ``config`` (``PODSConfig``, ``BudgetSettings``) asks for (None: no planners); errors spell as
        ``names`` (default ``CONFIG_NAMES``), Pilot-Commit's give ``reasons``; ``environment``: environments set."""
        config, names = BudgetSettings.of(config), CONFIG_NAMES if names is None else names
        if config.prompt_planner is None and config.rollout_planner is None:
            return None
        n, m = config.num_generations, config.downsample_to
        planners = []
        for name, args, other in ((config.prompt_planner, config.prompt_planner_args, "rollout_planner"
                                   if config.rollout_planner is not None else "pilot"
                                   if config.pilot_generations is not None else None),
                                  (config.rollout_planner, config.rollout_planner_args, None)):
            if name is None:
                planners.append(None)
                continue
            layout = Layout(n=n, m=m, names=names, reasons=reasons, adaptive_budget=config.adaptive_budget,
                            other=other, environment=environment)
            planner = make_planner(name, **member(planner_class(name), "complete")(args, layout))
            member(planner, "use_seed")(config.seed)  # a random stream of its own (C-GRPO's): the run's seed
            planners.append(planner)
        which, how_many = planners
        check_finite(names["success_threshold"], config.ledger_success_threshold)
        ledger = PromptLedger(LedgerSettings(success_threshold=config.ledger_success_threshold))
        return cls(ledger, which, how_many, n=n, m=m, seed=config.seed,
                   budget_per_prompt=config.adaptive_budget)

    def plan(self, ids: torch.Tensor, num_groups: int, *, step: int, rank: int,
             pilot: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(P,) first-round rollouts per candidate (0: not sampled) and metrics: ``which``'s first B survivors,
        counted by ``how_many``, else n or the pilot k."""
        P, metrics = len(ids), {}
        chosen = torch.zeros(P, dtype=torch.bool)
        if self.which is not None:
            plan = self.screen(ids, step_generator(self.seed, step, rank))
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
        if self.answers is not None:
            self.answers.start_step(P, self.n)
        first = torch.zeros(P, dtype=torch.long)
        counts, allocated = self.first_counts(ids[chosen], pilot=pilot)
        metrics.update({k: v for k, v in allocated.items() if k not in metrics})
        first[chosen] = counts
        # The plan's rollouts are what is sampled: the chosen candidates' (a which-planner's own counts cover every
        # candidate it did not skip).
        metrics.update(rollout_metrics(first))
        return first, metrics

    def screen(self, ids: torch.Tensor, generator: torch.Generator | None) -> Plan:
        """The prompt planner's ``Plan`` for the candidates ``ids`` (P,) (0 rollouts: skipped now), checked."""
        plan = self.which.plan(ids, self.ledger, n=self.n, generator=generator)
        check_plan(type(self.which).__name__, plan, len(ids), 0, self.n)
        return plan

    def first_counts(self, ids: torch.Tensor, *, pilot: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(S,) first-round rollouts of the sampled ``ids`` (S,) (how_many's, which's first round, pilot or n)."""
        if self.how_many is not None:
            return self.allocate(ids)
        count = pilot or self.n
        if self.which is not None:
            count = member(self.which, "first_round")(count)
        return torch.full((len(ids),), count, dtype=torch.long), {}

    # Long because skipping, GRESO's counters and Knapsack-RL's counts share the window's locals.
    def draw(self, candidates: Callable[[int], torch.Tensor], want: int, generator: torch.Generator | None, *,
             patience: int) -> tuple[list[int], torch.Tensor, dict]:
        """A window planned prompt by prompt (an engine sampling while it trains): ``candidates(k)`` the next k ids,
        screened, a skipped one replaced by the next (after ``patience`` skips in a row, admitted: never stalls), until
        ``want`` are chosen -> their indices among all drawn, (want,) first rollouts (Pilot-Commit's pilot), metrics."""
        which, own = self.which, {}  # own: the prompt planner's metrics beyond the counters (GRESO's p's)
        chosen: list[int] = []  # their indices among the drawn
        ids_chosen: list[int] = []
        drawn = skipped = easy = hard = readmitted = run = 0
        while len(chosen) < want:
            ids = candidates(want - len(chosen))
            no = [False] * len(ids)
            keep, is_easy, is_hard = [True] * len(ids), no, no
            if which is not None:
                plan = self.screen(ids, generator)
                own = {k: v for k, v in plan.metrics.items()
                       if not k.startswith(("pods/plan_", "pods/rollouts_per_prompt", "pods/prompts_"))}
                keep = plan.sampled.tolist()
                none = torch.zeros(len(ids), dtype=torch.bool)  # (Pilot-Commit skips the evicted: neither)
                is_easy, is_hard = plan.extra.get("easy", none).tolist(), plan.extra.get("hard", none).tolist()
            for prompt, kept, was_easy, was_hard in zip(ids.tolist(), keep, is_easy, is_hard, strict=True):
                drawn += 1
                if not kept and run < patience:
                    run, skipped, easy, hard = run + 1, skipped + 1, easy + was_easy, hard + was_hard
                    continue
                run, readmitted = 0, readmitted + (not kept)
                chosen.append(drawn - 1)
                ids_chosen.append(prompt)
        metrics: dict = {}
        if which is not None:
            metrics = {"pods/prompts_drawn_total": float(drawn), "pods/prompts_skipped_total": float(skipped),
                       "pods/prompts_readmitted_total": float(readmitted),
                       "pods/prompts_skipped_frac": (float(skipped), float(drawn))}
            if self.commits:  # what Pilot-Commit skips at the draw: the prompts it evicted
                metrics["pods/prompts_skipped_evicted_total"] = float(skipped)
            else:
                metrics.update({"pods/prompts_skipped_easy_total": float(easy),
                                "pods/prompts_skipped_hard_total": float(hard), **own})
        counts, planned = self.first_counts(torch.tensor(ids_chosen, dtype=torch.long))
        if self.how_many is not None:
            metrics.update({"pods/rollouts_planned_per_prompt": (float(counts.sum()), float(len(counts))),
                            "pods/rollouts_planned_min": float(counts.min()),
                            "pods/rollouts_planned_max": float(counts.max()),
                            **{k: float(v) for k, v in planned.items()
                               if k.startswith(("pods/knapsack_", "pods/auto_"))}})
        return chosen, counts, metrics

    def judge_one(self, prompt: int, rewards, *, step: int) -> tuple[bool, dict[str, float]]:
        """Pilot-Commit's verdict on one prompt's pilot (``rewards`` (k,), NaN: unscored), in the ledger: whether it
        passed (then committed at once, alone: an engine judging each prompt as it is scored) and its counters."""
        verdict = self.which.after_pilot(torch.tensor([prompt]), torch.tensor([rewards], dtype=torch.float64), None,
                                         self.ledger, step=step)
        passed = bool(verdict.extra["passed"][0])
        if passed:
            taken = self.which.commit(len(self.which)).ids.tolist()
            if taken != [prompt]:  # every earlier pass was committed when judged: nothing else can wait there
                raise RuntimeError(f"Pilot-Commit's buffer held {taken} where prompt {prompt} was committed")
        return passed, {"pods/pilot_judged_total": 1.0, "pods/pilot_passed_total": float(passed),
                        "pods/pilot_too_easy_total": float(verdict.skipped[0]),
                        "pods/pilot_too_hard_total": float(verdict.deferred[0]),
                        "pods/prompts_evicted_total": float(verdict.evicted[0]),
                        "pods/pilot_success_rate": float(verdict.extra["success_rate"][0])}

    @property
    def commits(self) -> bool:
        """True when the prompt planner samples in two rounds, a pilot and then a commit (Pilot-Commit)."""
        return "pilot" in needs_of(self.which)

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
        chosen = self.which.commit(num_groups, generator=step_generator(self.seed, step, rank, 1))
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

    def next_round(self, ids: torch.Tensor, rewards: torch.Tensor, counts: torch.Tensor, last: torch.Tensor,
                   completions: list, slots: list[int], num_groups: int, *, first: bool, step: int, rank: int = 0,
                   gather=None, device=None) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """After a round (``last`` (P,) its rollouts, ``completions`` in ``slots``; ``first``: the step's first): (P,)
        next rollouts (answer rounds', Pilot-Commit's commit, else 0), (P,) may train (None: all sampled), metrics."""
        if self.answers is not None:
            return self.answers.next_round(completions, slots, counts, last), None, {}
        if first and self.commits:
            return self.commit(ids, rewards, counts, num_groups, step=step, rank=rank, gather=gather, device=device)
        return torch.zeros_like(last), None, {}

    def calibrate(self, sample: Callable[[list[dict], int], list], *, step: int, rank: int = 0, processes: int = 1,
                  per_device_rows: int | None = None, gather: Callable | None = None) -> dict[str, float]:
        """A planner's calibration when due (else {}): rows sampled by the engine's ``sample(rows, k)`` (collective)."""
        if self.calibration_rows(step) is None:
            return {}
        return self.answers.calibrate(sample, step=step, rank=rank, processes=processes,
                                      per_device_rows=per_device_rows, gather=gather)

    def calibration_rows(self, step: int) -> tuple[list[dict], int] | None:
        """(held-out rows, k) to sample before ``step`` (None: none due), by an engine that then ``fit_calibration``."""
        return None if self.answers is None else self.answers.due(step)

    def fit_calibration(self, rows: list[dict], completions: list, *, step: int) -> dict[str, float]:
        """The planner calibrated on ``rows``' completions (each row's k in turn); its metrics."""
        return self.answers.fit(rows, completions, len(rows), step=step)

    def group_more(self, completions: list) -> int:
        """Rollouts one group of ``completions`` gets next, judged alone by its answers (0: it stops)."""
        return self.answers.group_more(completions)

    def round_metrics(self, counts: torch.Tensor, padding_rows: float) -> dict[str, float]:
        """A step's answer-round metrics from every process's rollouts per prompt (P*processes,), padding's share."""
        return self.answers.step_metrics(counts, padding_rows)

    def observe(self, *, sampled: int, sample_seconds: float, trained: int, update_seconds: float) -> None:
        """One optimizer step's rollouts sampled (0: none this step) and trained, and its sampling (generation +
        scoring) and update seconds, for a planner that decides from costs (nothing otherwise)."""
        if "costs" in self.needs:
            self.how_many.observe(sampled=sampled, sample_seconds=sample_seconds, trained=trained,
                                  update_seconds=update_seconds)

    def allocate(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(S,) rollouts in [m, n] per prompt of ``ids`` (S,) within ``adaptive_budget`` (n) each; and metrics."""
        needs, low, knobs = needs_of(self.how_many), self.m, {"n": self.n}
        if "costs" in needs:  # auto: no fixed budget, the counts with the most signal per measured second
            knobs["m"] = self.m
        elif needs & {"answer_rounds", "reward_rounds"}:  # its first round; the engine runs the others
            low = 1
        else:
            # A prompt the ledger cannot estimate yet gets the average (Knapsack-RL's code gives it its n: here the
            # budget per prompt, so that the budget holds from the first step); max_n caps the others at n.
            knobs = {"n": min(self.n, max(self.m, round(self.budget_per_prompt or self.n))),
                     "total_budget": round((self.budget_per_prompt or self.n) * len(ids))}
        plan = self.how_many.plan(ids, self.ledger, **knobs)
        check_plan(type(self.how_many).__name__, plan, len(ids), low, self.n)
        return plan.rollouts, plan.metrics

    def record(self, ids: torch.Tensor, rewards: torch.Tensor, counts: torch.Tensor, *, step: int, epoch: int,
               gather=None, device=None) -> dict[str, float]:
        """Record every rank's groups (``rewards`` (P, n), ``counts`` (P,); one collective), then adapt the planners."""
        counts = torch.where(counts > 0, counts, -1)
        summary = self.ledger.record(ids, rewards, counts, step=step, gather=gather, gather_device=device)
        metrics = dict(summary.metrics)
        if self.which is not None:
            metrics.update(member(self.which, "update")(summary, epoch=epoch))
        return metrics

    def note(self, prompt: int, rewards: list[float], *, step: int, epoch: int, every: int = 1) -> dict[str, float]:
        """Note a scored group's deciding rewards (NaN: unscored); ``flush``'s metrics once ``every`` wait, else {}."""
        self.pending.append((int(prompt), [float(r) for r in rewards], int(step), int(epoch)))
        return self.flush() if len(self.pending) >= every else {}

    def flush(self) -> dict[str, float]:
        """Record the noted groups in the ledger now, in one call (GRESO adapts once); their metrics."""
        if not self.pending:
            return {}
        pending, self.pending = self.pending, []
        rewards = torch.nn.utils.rnn.pad_sequence(  # (G, the most rollouts of one, at least 1), NaN past each's
            [torch.tensor(values or [float("nan")], dtype=torch.float64) for _, values, _, _ in pending],
            batch_first=True, padding_value=float("nan"))
        ids = torch.tensor([prompt for prompt, *_ in pending], dtype=torch.long)
        counts = torch.tensor([len(values) for _, values, _, _ in pending], dtype=torch.long)
        return self.record(ids, rewards, counts, step=max(p[2] for p in pending), epoch=max(p[3] for p in pending))

    def state_dict(self) -> dict:
        """The ledger's and the planners' state, and the groups noted and not yet recorded."""
        pending = self.pending
        return {"ledger": self.ledger.state_dict(),
                "which": member(self.which, "state_dict")() if self.which is not None else None,
                "how_many": member(self.how_many, "state_dict")() if self.how_many is not None else None,
                "pending": {"ids": torch.tensor([p[0] for p in pending], dtype=torch.long),
                            "rewards": [torch.tensor(p[1], dtype=torch.float64) for p in pending],
                            "steps": torch.tensor([p[2] for p in pending], dtype=torch.long),
                            "epochs": torch.tensor([p[3] for p in pending], dtype=torch.long)}}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` (one saved before groups were noted: none pending)."""
        self.ledger.load_state_dict(state["ledger"])
        pending = state.get("pending") or {"ids": [], "rewards": [], "steps": [], "epochs": []}
        self.pending = [(int(p), r.tolist(), int(s), int(e)) for p, r, s, e in zip(
            pending["ids"], pending["rewards"], pending["steps"], pending["epochs"], strict=True)]
        for name in ("which", "how_many"):
            planner = getattr(self, name)
            if planner is not None and state.get(name) is not None:
                member(planner, "load_state_dict")(state[name])

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


def check_inputs(budget: RolloutBudget | None, calibration_dataset, answer_extractor, train_dataset, *,
                 text: Callable[[object], str], environment: bool = False,
                 names: Mapping[str, str] | None = None) -> None:
    """A planner's held-out prompts and answer extractor checked once, before any model loads (neither without a
    "calibration" planner), handed to ``budget`` with ``text(completion) -> str``: what the rewards read."""
    calibrates = budget is not None and "calibration" in budget.needs
    checked = check_calibration_inputs(budget.how_many.settings if calibrates else None, calibration_dataset,
                                       answer_extractor, train_dataset, environment=environment, names=names)
    if checked is not None:
        budget.answers = CGRPORun(budget.how_many, checked, text)
