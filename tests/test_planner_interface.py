"""The one planner interface (#75): ``Planner`` and its defaults, ``needs`` against the engines' ``OFFERS``, a
plain registered class, and a planner that breaks the interface refused in one line at its first plan."""

from dataclasses import dataclass

import pytest
import torch

from pods_rl.budget.planners import NEEDS, Planner, make_plan, needs_of, register_planner
from pods_rl.budget.planners import base as planners_base
from pods_rl.budget.rollout_budget import BudgetSettings, RolloutBudget
from pods_rl.engines.settings import ENGINES, OFFERS, check_planners


@pytest.fixture
def scratch_planners(monkeypatch):
    """A copy of the planner registry: the planners a test registers vanish after it."""
    monkeypatch.setattr(planners_base, "_PLANNERS", planners_base._PLANNERS.copy())


@dataclass(frozen=True)
class EveryOther:
    """A user's settings: the rollouts of each prompt it samples."""

    rollouts: int = 4


class PlainHalf:
    """A user's planner that subclasses nothing: every other prompt gets ``rollouts``."""

    kind = "how_many"
    Settings = EveryOther

    def __init__(self, settings):
        self.settings = settings

    def plan(self, ids, ledger, *, n, **budget):
        rollouts = torch.full((len(ids),), self.settings.rollouts, dtype=torch.long)
        return make_plan(torch.as_tensor(ids), rollouts)


def budget_with(name, n=8, m=2, **args):
    return RolloutBudget.from_config(BudgetSettings(num_generations=n, downsample_to=m, rollout_planner=name,
                                                    rollout_planner_args=args or None))


def test_every_planner_declares_needs_that_some_engine_offers():
    from pods_rl.budget.planners import available_planners

    for name in available_planners():
        assert needs_of(name) <= set(NEEDS), name
        assert any(needs_of(name) <= OFFERS[engine] for engine in ENGINES), name
    assert needs_of("auto") == {"costs"} and needs_of("pilot_commit") == {"pilot"}
    assert needs_of("greso") == needs_of("knapsack") == frozenset() and needs_of(None) == frozenset()


def test_a_plain_registered_class_runs_with_the_bases_defaults(scratch_planners):
    register_planner("plain_half", PlainHalf)
    budget = budget_with("plain_half", rollouts=3)
    assert budget.needs == frozenset() and not budget.commits
    first, _ = budget.plan(torch.arange(4), 4, step=0, rank=0)
    assert first.tolist() == [3, 3, 3, 3]
    budget.record(torch.arange(4), torch.ones(4, 8), torch.full((4,), 3), step=0, epoch=0)
    state = budget.state_dict()
    assert state["how_many"] == {}
    budget.load_state_dict(state)
    for engine in ENGINES:  # no needs: every engine runs it, no edit to pods-rl
        check_planners(engine, {"which_prompts": None, "how_many": "plain_half"},
                       planners_base.available_planners)


@pytest.mark.parametrize("rollouts, rule", [(9, r"Plan.rollouts must be integers in \[2, 8\]"),
                                            (1, r"Plan.rollouts must be integers in \[2, 8\]")])
def test_a_planner_breaking_the_interface_is_one_line_at_its_first_plan(scratch_planners, rollouts, rule):
    register_planner("plain_half", PlainHalf)
    budget = budget_with("plain_half", rollouts=rollouts)
    with pytest.raises(ValueError, match=rf"^planner 'PlainHalf': {rule}") as excinfo:
        budget.plan(torch.arange(4), 4, step=0, rank=0)
    assert "\n" not in str(excinfo.value)


def test_a_plan_of_the_wrong_shape_is_refused_naming_the_planner(scratch_planners):
    class Short(PlainHalf):
        def plan(self, ids, ledger, *, n, **budget):
            return make_plan(torch.as_tensor(ids)[:1], torch.full((1,), 4))

    register_planner("short", Short)
    with pytest.raises(ValueError, match=r"^planner 'Short': Plan.ids must be a \(4,\) tensor, one per prompt"):
        budget_with("short").plan(torch.arange(4), 4, step=0, rank=0)


def test_a_need_no_engine_knows_is_refused_at_registration(scratch_planners):
    class Telepathic(PlainHalf, Planner):
        needs = frozenset({"telepathy"})

    with pytest.raises(ValueError, match=r"^planner 'telepathic' needs 'telepathy', which no engine offers"):
        register_planner("telepathic", Telepathic)


def test_a_subclass_completes_its_knobs_from_the_run(scratch_planners):
    class Fills(PlainHalf, Planner):
        @classmethod
        def complete(cls, args, layout):
            return {"rollouts": layout.n, **dict(args or {})}

    register_planner("fills", Fills)
    assert budget_with("fills", n=6).how_many.settings.rollouts == 6
