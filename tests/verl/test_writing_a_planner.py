"""The guide's planner (docs/guides/writing-a-planner.md) on verl: examples/near_half_planner.py named by
``sampler_kwargs.rule_module`` (a .py file, imported in the process that builds the buffer), run by
``sampler_kwargs.rollout_planner=near_half`` through PODS's agent loop manager, with no edit to pods-rl
(tests/verl/planner_lane.py says what is real)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from planner_lane import KW, planned_run, run_steps, sessions_by_uid
from verl_lane import pods_overrides

from pods_rl.budget.planners import base

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M, B = 4, 2, 4
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "near_half_planner.py"


def test_verl_runs_the_users_planner_from_its_file(tq_store, monkeypatch):
    """Each dispatch gives every row the planner's count (held at rows x rollout.n within [m, max_n]) and verl
    generates exactly that many; once the ledger knows the lane's prompts, the half-solved ones (index % 4 = 2) get
    more than the always (0) and never (1) solved ones."""
    monkeypatch.setattr(base, "_PLANNERS", base._PLANNERS.copy())  # what the module registers goes with the test
    trainer, manager, worker = planned_run(*pods_overrides(
        M, N, KW + f"rule_module={EXAMPLE}", KW + "rollout_planner=near_half",
        KW + "rollout_planner_args={min_n:2,max_n:8,window:8}", train_batch_size=B))
    planner = trainer.replay_buffer.budget.how_many
    assert type(planner).__name__ == "NearHalf" and planner.settings.max_n == 8
    run_steps(trainer, 4)
    generated = sessions_by_uid(worker)
    later = []
    for decision in manager.decisions:
        counts = decision["counts"]
        assert int(counts.sum()) == len(counts) * N and bool(((counts >= M) & (counts <= 8)).all())
        for uid, count in zip(decision["uids"], counts.tolist(), strict=True):
            assert generated[uid] == list(range(count))  # verl sampled what the manager planned
        if decision["step"] >= 3:  # the dataset (8 prompts, 4 a step) comes round again: the ledger knows them
            later += zip((decision["ids"] % 4).tolist(), counts.tolist(), strict=True)
    half = [count for kind, count in later if kind == 2]
    settled = [count for kind, count in later if kind in (0, 1)]
    assert half and settled and min(half) > max(settled)


def test_verl_needs_no_max_n_setting_of_a_users_planner(monkeypatch):
    """verl's ``max_n`` is the Layout's n (the most one prompt gets, default 2 x rollout.n): a planner without such a
    setting runs, its counts checked in [m, max_n]; one with it gets the value (the example above)."""
    from dataclasses import dataclass

    from pods_rl.budget.planners import Planner, make_plan, register_planner
    from pods_rl.engines.verl.budget_settings import verl_budget

    monkeypatch.setattr(base, "_PLANNERS", base._PLANNERS.copy())

    @dataclass(frozen=True)
    class EveryoneSettings:
        extra: int = 1

    @register_planner("everyone")
    class Everyone(Planner):
        kind, Settings = "how_many", EveryoneSettings

        def __init__(self, settings=None):
            self.settings = settings or EveryoneSettings()

        def plan(self, ids, ledger, *, n, generator=None, **budget):
            return make_plan(ids, torch.full((len(ids),), n + self.settings.extra))

    for args, cap in (({}, 2 * N), ({"max_n": 8, "extra": 2}, 8)):
        budget = verl_budget({"rollout_planner": "everyone", "rollout_planner_args": args}, n=N, m=M).budget
        assert budget.n == cap and not hasattr(budget.how_many.settings, "max_n")
        counts, _ = budget.first_counts(torch.arange(3))
        assert counts.tolist() == [N + budget.how_many.settings.extra] * 3
    with pytest.raises(ValueError, match=r"max_n=4: everyone .* set max_n above 4"):
        verl_budget({"rollout_planner": "everyone", "rollout_planner_args": {"max_n": 4}}, n=N, m=M)
