"""verl's manager plans what TRL's step plans (issue #75; tests/test_planner_conformance.py holds TRL's step and the
asynchronous worker to the same): at every dispatch of a few verl steps, TRL's ``RolloutBudget.plan``, from the
ledger as the manager saw it and the same settings, gives the same counts and skips the same prompts, and the
buffer keeps the rows of each group that TRL's ``select`` keeps from the same rewards. The one
difference by design: verl holds a step's rollouts at rows x ``rollout.n`` (its mini-batches count rows;
docs/guides/verl.md, "Rollout budgets"), moving rollouts between prompts within [m, ``max_n``] (``hold_total``)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from planner_lane import KW, planned_run, reward, run_steps, sessions_by_uid
from verl_lane import pods_overrides

from pods_rl.budget.planners import base
from pods_rl.budget.rollout_budget import BudgetSettings, RolloutBudget
from pods_rl.engines.verl.agent_loop import hold_total
from pods_rl.selection import SelectionSettings, select

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M, B, MAX_N, SEED = 4, 2, 4, 8, 0
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "near_half_planner.py"
ALWAYS_SKIP = {"p_easy": 0.0, "p_hard": 0.0, "min_p": 0.0, "min_readmit": 0.0, "adapt_from_epoch": 99}
# name -> (the planner's setting, name, args); verl's rollout.n is N, and a how_many planner's counts lie in [m, MAX_N]
CASES = {"knapsack": ("rollout_planner", "knapsack", {"max_n": MAX_N, "min_buffer_length": 4}),
         "near_half": ("rollout_planner", "near_half", {"min_n": 2, "max_n": MAX_N, "window": 8}),
         "greso": ("prompt_planner", "greso", ALWAYS_SKIP)}


def overrides(key, name, args) -> list[str]:
    spelled = "{" + ",".join(f"{k}:{v}" for k, v in args.items()) + "}"
    extra = [KW + f"rule_module={EXAMPLE}"] if name == "near_half" else []
    return [*extra, KW + f"{key}={name}", KW + f"{key}_args={spelled}"]


def trl_budget(key, name, args) -> RolloutBudget:
    """What ``PODSTrainer`` builds for the same planner: n = MAX_N (the most a prompt gets), Knapsack-RL's budget
    rollout.n per prompt on average (verl's budget_settings maps its settings so)."""
    how_many = key == "rollout_planner"
    return RolloutBudget.from_config(BudgetSettings(
        num_generations=MAX_N if how_many else N, downsample_to=M, seed=SEED,
        adaptive_budget=float(N) if name == "knapsack" else None, **{key: name, f"{key}_args": dict(args)}))


def kept_by_buffer(steps) -> dict[str, list[int]]:
    """{uid: the sessions the PODS buffer kept} over the steps' trained keys ({uid}_{session}_{index})."""
    kept: dict[str, list[int]] = {}
    for step in steps:
        for key in step["keys"]:
            uid, session, _ = key.rsplit("_", 2)
            kept.setdefault(uid, []).append(int(session))
    return {uid: sorted(sessions) for uid, sessions in kept.items()}


def kept_by_step(steps, generated: dict[str, list[int]]) -> dict[str, list[int]]:
    """The same groups' kept sessions as TRL's step keeps them: ``select`` (as ``PODSStep._select_kept`` calls it) on
    each group's lane rewards, as many as verl generated for it."""
    out = {}
    for uid, index in {key.rsplit("_", 2)[0]: int(key.rsplit("_", 2)[2]) for s in steps for key in s["keys"]}.items():
        sessions = generated[uid]
        rewards = torch.tensor([[reward(index, session) for session in sessions]], dtype=torch.float64)
        selection = select(rewards.unsqueeze(2), torch.ones(1, dtype=torch.float64), 1, SelectionSettings(m=M))
        out[uid] = sorted(sessions[i] for i in selection.kept[0].tolist() if i >= 0)
    return out


@pytest.mark.parametrize("name", ["knapsack", "greso", "near_half"])
def test_the_manager_plans_and_the_buffer_keeps_what_trls_step_does(tq_store, monkeypatch, name):
    monkeypatch.setattr(base, "_PLANNERS", base._PLANNERS.copy())  # a planner the example registers goes with it
    key, planner, args = CASES[name]
    trainer, manager, worker = planned_run(*pods_overrides(M, N, *overrides(key, planner, args), train_batch_size=B))
    budget, seen = trainer.replay_buffer.budget, []
    dispatch = manager.generate_sequences

    def recorded(prompts):  # the ledger as the manager plans from it
        seen.append(copy.deepcopy(budget.ledger.state_dict()))
        return dispatch(prompts)

    monkeypatch.setattr(manager, "generate_sequences", recorded)
    steps = run_steps(trainer, 4)
    assert kept_by_buffer(steps) == kept_by_step(steps, sessions_by_uid(worker))
    planned = [d for d in manager.decisions if not d["admitted"]]
    assert len(seen) >= len(manager.decisions) and planned
    differs = False
    for ledger, decision in zip(seen, manager.decisions, strict=False):
        if decision["admitted"]:  # refills ran out: admitted whole, without the planner
            continue
        ids, kept, counts = decision["ids"], decision["kept"], decision["counts"]
        trl = trl_budget(key, planner, args)
        trl.ledger.load_state_dict(ledger)
        first, _ = trl.plan(ids, int(kept.sum()), step=decision["step"], rank=0)
        assert (first > 0).tolist() == kept.tolist()  # the same prompts skipped
        if key == "rollout_planner":
            assert counts.tolist() == hold_total(first, len(ids) * N, M, MAX_N).tolist()
            differs |= first.tolist() != [N] * len(ids)
        else:
            assert counts[kept].tolist() == [N] * int(kept.sum())
            differs |= not bool(kept.all())
    assert differs  # the planner decided something beyond the default at some dispatch
