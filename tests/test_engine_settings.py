"""One table of each engine's spelling of the shared settings, and of the planners each engine runs
(pods_rl.engines.settings): the engines' errors read it, and a planner an engine learns to run is one entry."""

from __future__ import annotations

import re

import pytest

from pods_rl import adaptive
from pods_rl.budget import rollout_budget
from pods_rl.budget.planners import available_planners
from pods_rl.budget.rollout_budget import check_pilot_commit
from pods_rl.engines import settings
from pods_rl.engines.settings import OFFERS, PILOT_COMMIT_REASONS, SPELLINGS, check_planners, spelled


def test_each_engine_reads_its_column():
    from pods_rl.engines.trl import config
    from pods_rl.engines.trl_async import settings as worker_settings

    assert config.CONFIG_NAMES == spelled("trl", "selection")
    assert config.CONFIG_NAMES["m"] == "downsample_to (m)" and config.CONFIG_NAMES["rule"] == "downsample_rule"
    assert worker_settings.ASYNC_NAMES == spelled("trl_async", "selection") and "oversample_prompts" not in \
        worker_settings.ASYNC_NAMES  # the worker has no over-sampling: no spelling, no entry
    assert worker_settings.ADAPTIVE_NAMES == {"pilot": "pods_pilot", "n": "num_generations", "m": "pods_m",
                                              "rule": "pods_adaptive_rule", "round_size": "pods_round_size",
                                              "budget": "pods_adaptive_budget", "reward": "pods_adaptive_reward"}
    assert spelled("verl", "selection")["tiebreak"] == "sampler_kwargs.tiebreak"
    # the core's default spelling (adaptive.CONFIG_NAMES, which cannot import an engine) is PODSConfig's column
    assert adaptive.CONFIG_NAMES == spelled("trl", "adaptive")
    assert rollout_budget.CONFIG_NAMES == spelled("trl", "budget")  # the same for the budget's checks


def test_every_row_names_each_setting_once_per_engine():
    for engine in settings.ENGINES:
        for group in {group for group, _ in SPELLINGS}:
            names = list(spelled(engine, group).values())
            assert len(names) == len(set(names)), (engine, group, names)
    assert all(any(row) for row in SPELLINGS.values())


def refusal(engine: str, **settings) -> str:
    """The one line ``engine``'s own entry point refuses ``settings`` (keys: the "budget" group's) with, n=4, m=2."""
    from pods_rl.engines.trl.config import PODSConfig
    from pods_rl.engines.trl_async.budget import check_budget_settings

    names = spelled(engine, "budget")
    with pytest.raises(ValueError) as error:
        if engine == "trl":
            PODSConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=4, downsample_to=2,
                       oversample_prompts=2.0, report_to=[], **{names[key]: v for key, v in settings.items()})
        else:
            pilot = settings.pop("pilot", None)
            check_budget_settings(4, 2, pilot=pilot, **{names[key]: v for key, v in settings.items()})
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize("engine, other", [("trl", "trl_async"), ("trl_async", "trl")])
@pytest.mark.parametrize("settings, expected", [
    (dict(prompt_planner="pilot_commit", rollout_planner="knapsack"), "{prompt_planner}='pilot_commit' decides how "
     "many rollouts a prompt gets itself (n_explore, then n_commit for the prompts it commits): drop "
     "{rollout_planner}"),
    (dict(prompt_planner="pilot_commit", pilot=2), "{prompt_planner}='pilot_commit' decides how many rollouts a "
                                                   "prompt gets itself (n_explore, then n_commit for the prompts it "
                                                   "commits): drop {pilot}"),
    (dict(prompt_planner="pilot_commit", prompt_planner_args={"n_explore": 3, "n_commit": 3}),
     "{prompt_planner_args} n_explore=3 + n_commit=3 must make {n} (n=4), each at least 1"),
    (dict(prompt_planner="pilot_commit", prompt_planner_args={"n_explore": 2, "n_explore_effective": 1}),
     "{prompt_planner_args} n_explore_effective=1: {n_explore_effective}; drop it, and keep m of the n with {m} "
     "instead"),
    (dict(prompt_planner="pilot_commit", prompt_planner_args={"buffer_max_off_steps": 2}),
     "{prompt_planner_args} buffer_max_off_steps=2: {buffer_max_off_steps}: set it to 0 or drop it"),
    (dict(rollout_planner="knapsack", rollout_planner_args={"min_n": 1}), "{rollout_planner_args} min_n=1: with PODS "
     "every prompt Knapsack-RL samples gets between {m} (m=2) and {n} (n=4) rollouts"),
    (dict(prompt_planner="greso", success_threshold=float("inf")), "{success_threshold} must be a finite number"),
], ids=["rollout_planner", "pilot", "split", "n_explore_effective", "buffer_max_off_steps", "knapsack", "ledger"])
def test_each_engines_refusal_is_in_its_own_spelling_and_words_only(engine, other, settings, expected):
    message = refusal(engine, **settings)
    assert message.startswith(expected.format(**spelled(engine, "budget"), **PILOT_COMMIT_REASONS[engine])), message
    # the other engine's spellings (whole words: pods_m holds no downsample_to) and reasons are nowhere in it
    ours = set(spelled(engine, "budget").values())
    for name in set(spelled(other, "budget").values()) - ours:
        assert not re.search(rf"(?<![\w.]){re.escape(name)}\b", message), (name, message)
    for reason in filter(None, PILOT_COMMIT_REASONS[other].values()):
        assert reason not in message, message


def test_pilot_commit_differs_by_engine_only_in_its_row():
    """The worker alone refuses environments; each engine gives its own reasons, one function checks for both."""
    knobs = check_pilot_commit(None, 8, names=spelled("trl", "budget"), reasons=PILOT_COMMIT_REASONS["trl"],
                               environment=True)
    assert (knobs["n_explore"], knobs["n_commit"], knobs["buffer_max_off_steps"]) == (2, 6, 0)
    with pytest.raises(ValueError, match=r"^pods_prompt_planner='pilot_commit' does not support environment_factory: "
                                         r"the worker pilots a prompt in TRL's generate loop"):
        check_pilot_commit(None, 8, names=spelled("trl_async", "budget"), reasons=PILOT_COMMIT_REASONS["trl_async"],
                           environment=True)


@pytest.mark.parametrize("engine, field", [("trl", "prompt_planner"), ("trl_async", "pods_prompt_planner")])
def test_an_engine_refuses_a_planner_it_does_not_run_in_its_own_words(engine, field, monkeypatch):
    check_planners(engine, {"which_prompts": "greso", "how_many": None}, available_planners)
    with pytest.raises(ValueError) as excinfo:
        check_planners(engine, {"which_prompts": "knapsack", "how_many": None}, available_planners)
    assert str(excinfo.value).startswith(f"{field}='knapsack': ") and "\n" not in str(excinfo.value)
    assert "['greso', 'pilot_commit']" in str(excinfo.value)
    # a planner needing what an engine does not offer is refused naming the need and who offers it; an engine that
    # learns to offer it is one entry of the table
    with pytest.raises(ValueError) as excinfo:
        check_planners(engine, {"which_prompts": None, "how_many": "reinforce_ada"}, available_planners)
    message = str(excinfo.value)
    assert message.startswith(f"{field.replace('prompt', 'rollout')}='reinforce_ada': ") and "\n" not in message
    assert "reward_rounds" in message and "PODS's agent loop manager on verl" in message, message
    monkeypatch.setitem(OFFERS, engine, OFFERS[engine] | {"reward_rounds"})
    check_planners(engine, {"which_prompts": None, "how_many": "reinforce_ada"}, available_planners)


def test_both_trl_engines_refuse_through_the_table():
    from pods_rl.engines.trl.config import PODSConfig
    from pods_rl.engines.trl_async.budget import check_budget_settings

    with pytest.raises(ValueError,
                       match=r"^rollout_planner='greso': PODSTrainer runs \['auto', 'cgrpo', 'knapsack'\]"):
        PODSConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=4, downsample_to=2,
                   rollout_planner="greso", report_to=[])
    with pytest.raises(ValueError, match=r"^pods_rollout_planner='greso': the asynchronous worker runs "
                                         r"\['auto', 'cgrpo', 'knapsack'\]"):
        check_budget_settings(4, 2, pods_rollout_planner="greso")


def test_a_missing_need_names_the_planner_the_need_the_engines_offering_it_and_the_engines_own_way():
    from pods_rl.engines.trl.config import PODSConfig

    with pytest.raises(ValueError) as excinfo:
        PODSConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=4, downsample_to=2,
                   rollout_planner="reinforce_ada", report_to=[])
    message = str(excinfo.value)
    assert message.startswith("rollout_planner='reinforce_ada': PODSTrainer runs Reinforce-Ada as its round rule")
    assert "adaptive_rule='reinforce_ada'" in message and "needs reward_rounds" in message and "\n" not in message
    assert "offered by PODS's agent loop manager on verl" in message
    with pytest.raises(ValueError, match=r"^sampler_kwargs.rollout_planner='cgrpo': .*it needs answer_rounds.*"
                                         r"offered by PODSTrainer, the asynchronous worker\)$"):
        check_planners("verl", {"which_prompts": None, "how_many": "cgrpo"}, available_planners)
