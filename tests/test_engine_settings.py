"""One table of each engine's spelling of the shared settings, and of the planners each engine runs
(pods_rl.engines.settings): the engines' errors read it, and a planner an engine learns to run is one entry."""

from __future__ import annotations

import pytest

from pods_rl import adaptive
from pods_rl.budget.planners import available_planners
from pods_rl.engines import settings
from pods_rl.engines.settings import PLANNERS, SPELLINGS, check_planners, renamed, spelled


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


def test_every_row_names_each_setting_once_per_engine():
    for engine in settings.ENGINES:
        for group in {group for group, _ in SPELLINGS}:
            names = list(spelled(engine, group).values())
            assert len(names) == len(set(names)), (engine, group, names)
    assert all(any(row) for row in SPELLINGS.values())


def test_core_errors_are_renamed_into_the_workers_spelling_by_whole_words():
    message = "rollout_planner_args min_n=9: downsample_to (m=2); success_threshold; ledger_success_threshold"
    assert renamed(message, "budget", "trl", "trl_async") == (
        "pods_rollout_planner_args min_n=9: pods_m (m=2); pods_ledger_success_threshold; ledger_success_threshold")


@pytest.mark.parametrize("engine, field", [("trl", "prompt_planner"), ("trl_async", "pods_prompt_planner")])
def test_an_engine_refuses_a_planner_it_does_not_run_in_its_own_words(engine, field, monkeypatch):
    check_planners(engine, {"which_prompts": "greso", "how_many": None}, available_planners)
    with pytest.raises(ValueError) as excinfo:
        check_planners(engine, {"which_prompts": "knapsack", "how_many": None}, available_planners)
    assert str(excinfo.value).startswith(f"{field}='knapsack': ") and "\n" not in str(excinfo.value)
    assert "['greso', 'pilot_commit']" in str(excinfo.value)
    # a planner an engine learns to run is one entry of the table
    monkeypatch.setitem(PLANNERS, engine, {**PLANNERS[engine], "which_prompts": ("greso", "pilot_commit", "knapsack")})
    check_planners(engine, {"which_prompts": "knapsack", "how_many": None}, available_planners)


def test_both_trl_engines_refuse_through_the_table():
    from pods_rl.engines.trl.config import PODSConfig
    from pods_rl.engines.trl_async.budget import check_budget_settings

    with pytest.raises(ValueError, match=r"^rollout_planner='greso': PODSTrainer runs \['knapsack'\]"):
        PODSConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=4, downsample_to=2,
                   rollout_planner="greso", report_to=[])
    with pytest.raises(ValueError, match=r"^pods_rollout_planner='greso': the asynchronous worker runs \['knapsack'\]"):
        check_budget_settings(4, 2, pods_rollout_planner="greso")
