"""The planners agree across engines (issue #75): from the same ledger, settings, seed and rewards, TRL's synchronous
step (``RolloutBudget.plan``, then ``select`` as ``PODSStep`` calls it) and TRL's asynchronous worker
(``WorkerBudget.draw``, then the worker's ``select_conversations``) give every prompt the same count, skip the same
prompts and keep the same rows. No model: the engines' budget-level objects, driven with synthetic rewards. verl's
manager is held to the same in the verl lane (tests/verl/test_planner_conformance.py).

Where the engines differ by design (docs/concepts/rollout-budgets.md, "In the engines"), what must still agree is
tested and the difference named: auto's costs are measured differently per engine (here both get the same
observations), GRESO's replacements for skipped prompts differ (here none are needed), and Pilot-Commit commits each
passing pilot alone in the worker but fills a batch in the synchronous step.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners import base
from pods_rl.budget.rollout_budget import BudgetSettings, RolloutBudget
from pods_rl.selection import SelectionSettings, select

pytest.importorskip("trl.experimental.async_grpo")

from pods_rl.engines.trl_async.budget import WorkerBudget, check_budget_settings  # noqa: E402
from pods_rl.engines.trl_async.worker import PODSRolloutLoop  # noqa: E402

N, M, P, SEED, STEP = 8, 3, 8, 5, 3
# The ledger both engines start from: always solved, never, half, 3 of 4, 1 of 4, 5 of 8, and two prompts unseen.
OUTCOMES = {0: [1.0] * 8, 1: [0.0] * 8, 2: [1.0, 0.0] * 4, 3: [1.0, 1.0, 1.0, 0.0] * 2, 4: [0.0, 0.0, 0.0, 1.0] * 2,
            5: [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]}
# GRESO made deterministic (a prompt whose last group was all-equal is skipped): the engines draw from different
# random streams (the step's generator, the worker's own), which is not part of what a planner decides.
ALWAYS_SKIP = {"p_easy": 0.0, "p_hard": 0.0, "min_p": 0.0, "min_readmit": 0.0, "adapt_from_epoch": 99}
# name -> (the planner's setting, its name, its args, adaptive_budget); the same settings in both engines.
CASES = {
    "knapsack": ("rollout_planner", "knapsack", {"min_buffer_length": 4, "reward_buffer_length": 8}, 5.0),
    "auto": ("rollout_planner", "auto", {"train_ms": 2.5, "warmup_steps": 0, "probe_gap": 2}, None),
    "greso": ("prompt_planner", "greso", ALWAYS_SKIP, None),
    "near_half": ("rollout_planner", "near_half", {"min_n": 3, "max_n": 8, "window": 8}, None),
}
# The same cost observations for auto in both engines (how each measures them differs: docs/guides/async.md,
# "Rollout budgets in the worker"; the worker sees no update seconds and takes train_ms from its args).
COSTS = [(24, 0.024, 0, 0.0), (48, 0.040, 0, 0.0), (24, 0.025, 0, 0.0)]


@pytest.fixture
def near_half(monkeypatch):
    """The guide's example planner registered in a copy of the registry (gone after the test)."""
    monkeypatch.setattr(base, "_PLANNERS", base._PLANNERS.copy())
    importlib.reload(importlib.import_module("examples.near_half_planner"))


def shared_ledger() -> dict:
    ledger = PromptLedger()
    ledger.record(torch.tensor(list(OUTCOMES)), torch.tensor(list(OUTCOMES.values())), step=0)
    return ledger.state_dict()


def trl_budget(key, name, args, adaptive_budget) -> RolloutBudget:
    """The budget ``PODSTrainer`` builds (``RolloutBudget.from_config`` of its config's fields)."""
    return RolloutBudget.from_config(BudgetSettings(num_generations=N, downsample_to=M, seed=SEED,
                                                    adaptive_budget=adaptive_budget,
                                                    **{key: name, f"{key}_args": dict(args)}))


def worker_budget(key, name, args, adaptive_budget, window) -> WorkerBudget:
    """The budget TRL's asynchronous worker builds from its ``pods_*`` keywords."""
    budget = check_budget_settings(N, M, pods_seed=SEED, pods_adaptive_budget=adaptive_budget,
                                   **{f"pods_{key}": name, f"pods_{key}_args": dict(args)})
    return WorkerBudget(budget, groups_per_step=window, dataset_size=P, seed=SEED)


def rows():
    """The worker's ``next_row``: prompt i at position i (its ledger id is i)."""
    state = {"i": 0}

    def next_row():
        state["i"] += 1
        return {"prompt": [{"role": "user", "content": f"p{state['i'] - 1}"}]}

    return next_row


def planned(case):
    """(ids, counts) of the synchronous step and of the worker, from the same ledger."""
    ids = torch.arange(P)
    trl = trl_budget(*case)
    trl.ledger.load_state_dict(shared_ledger())
    window = P
    if case[0] == "prompt_planner":  # a batch of the prompts it keeps: the step then needs no replacement
        window = int(trl.which.plan(ids, trl.ledger, n=N).sampled.sum())
    worker = worker_budget(*case, window=window)
    worker.budget.ledger.load_state_dict(shared_ledger())
    for budget in (trl, worker.budget):
        for sampled, seconds, trained, update in COSTS:
            budget.observe(sampled=sampled, sample_seconds=seconds, trained=trained, update_seconds=update)
    first, _ = trl.plan(ids, window, step=STEP, rank=0)
    groups, _ = worker.draw(rows())
    drawn = torch.tensor([worker.prompt_id(worker.positions[group_id]) for group_id, _, _ in groups])
    return (ids[first > 0], first[first > 0]), (drawn, torch.tensor([count for _, _, count in groups]))


def rewards_for(counts: torch.Tensor) -> torch.Tensor:
    """(P, N) rewards, ties included, NaN past each prompt's count."""
    values = torch.randint(0, 3, (len(counts), N), generator=torch.Generator().manual_seed(0)).double() / 2
    return values.masked_fill(torch.arange(N) >= counts.unsqueeze(1), float("nan"))


def kept_in_step(rewards: torch.Tensor, counts: torch.Tensor) -> list[list[int]]:
    """The kept rollouts of each group, as ``PODSStep._select_kept`` calls ``select`` (all groups at once)."""
    selection = select(rewards.unsqueeze(2), torch.ones(1, dtype=torch.float64), len(counts), SelectionSettings(m=M),
                       counts=counts)
    return [sorted(i for i in row.tolist() if i >= 0) for row in selection.kept]


def kept_in_worker(rewards: torch.Tensor, counts: torch.Tensor) -> list[list[int]]:
    """The kept rollouts of each group, by the worker's own ``select_conversations`` (one group at a time)."""
    loop = types.SimpleNamespace(reward_func_names=["r"], pods=SelectionSettings(m=M), pods_generator=None)
    loop.rollout_features = lambda group, rewards_per_func: {"lengths": torch.ones(1, len(group.completions_ids))}
    out = []
    for row, count in zip(rewards, counts.tolist(), strict=True):
        group = types.SimpleNamespace(completions_ids=[[1]] * count)
        kept, _ = PODSRolloutLoop.select_conversations(loop, group, [{"rewards/r": float(r)} for r in row[:count]])
        out.append(sorted(kept))
    return out


@pytest.mark.parametrize("name", ["knapsack", "auto", "greso",
                                  "near_half"])
def test_the_step_and_the_worker_plan_the_same_counts_and_keep_the_same_rows(name, near_half):
    (step_ids, step_counts), (worker_ids, worker_counts) = planned(CASES[name])
    assert step_ids.tolist() == worker_ids.tolist()  # the same prompts sampled (GRESO: the same skipped)
    assert step_counts.tolist() == worker_counts.tolist()
    assert all(M <= c <= N for c in step_counts.tolist())
    rewards = rewards_for(step_counts)
    assert kept_in_step(rewards, step_counts) == kept_in_worker(rewards, worker_counts)


def test_pilot_commit_passes_the_same_pilots_in_the_step_and_the_worker():
    """The same pilots' rewards pass the same prompts. The step then fills its batch of B by pilot std when fewer
    pass; the worker commits each passing pilot alone, at once (docs/concepts/rollout-budgets.md, "In the engines")."""
    args = {"n_explore": 2}
    pilots = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    ids = torch.arange(len(pilots))
    trl = trl_budget("prompt_planner", "pilot_commit", args, None)
    first, _ = trl.plan(ids, len(ids), step=STEP, rank=0)
    more, committed, _ = trl.commit(ids, pilots, first, num_groups=len(ids), step=STEP)
    worker = worker_budget("prompt_planner", "pilot_commit", args, None, window=len(ids))
    groups, _ = worker.draw(rows())
    assert first.tolist() == [count for _, _, count in groups] == [2] * len(ids)  # n_explore each
    passed = [worker.judge_pilot(group_id, pilots[group_id].tolist(), step=STEP)[0] is not None
              for group_id, _, _ in groups]
    verdict = trl.which.after_pilot(ids, pilots, first, PromptLedger(), step=STEP, evict=False).extra["passed"]
    assert passed == verdict.tolist() and any(passed) and not all(passed)
    assert all(bool(committed[p]) and int(more[p]) == N - 2 for p in range(len(ids)) if passed[p])
