"""Pilot-Commit in TRL's asynchronous worker (pods_rl.engines.trl_async.budget): the pilot from TRL's generate loop,
the verdict (PilotCommit.after_pilot's), the commit as a top-up, committed ids for the trainer, the resume point.

``WorkerBudget`` is tested alone (no TRL); the loop runs TRL's own generate and score loops with generation answered
from a script (``tests.test_async_pods.ScriptedLoop``, no server). n = 8 splits 2 + 6 (the paper's 1:3), so a pilot
is the first two characters of the prompt's script: "mixed" 01 passes, "flat" 00 is too hard, "late" 11 is solved.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from pods_rl.budget.ledger import PromptLedger  # noqa: E402
from pods_rl.budget.planners import PilotCommit, PilotCommitSettings  # noqa: E402
from pods_rl.engines.trl_async.worker import pods_worker_kwargs  # noqa: E402
from tests.test_async_budget import budget_loop, pushed, rows, source, worker_budget  # noqa: E402
from tests.test_async_pods import (  # noqa: E402
    SCORED,
    SCRIPT,
    _config,
    accelerate_state,  # noqa: F401  (a module fixture)
    close_loop,
    drew_after,
    run_loops,
    value,
)

N, M = 8, 3
PC = {"pods_prompt_planner": "pilot_commit"}


def test_the_draw_skips_evicted_prompts_and_pilots_the_others_with_n_explore():
    wb = worker_budget(window=3, size=6, **PC)
    assert wb.commits and wb.budget.which.settings.n_explore == 2 and wb.budget.which.settings.n_commit == 6
    wb.budget.ledger.evict(torch.tensor([1, 3]))
    groups, metrics = wb.draw(source(rows(6)))
    assert [(g, row["prompt"][0]["content"], count) for g, row, count in groups] == [
        (0, "p0", 2), (1, "p2", 2), (2, "p4", 2)]
    assert wb.unjudged == {0: 0, 1: 2, 2: 4}
    assert metrics["pods/prompts_skipped_evicted_total"] == 2 and metrics["pods/prompts_drawn_total"] == 5
    assert not any(key.startswith(("pods/greso", "pods/prompts_skipped_easy")) for key in metrics)


def test_the_verdict_is_pilot_commits_and_only_a_pass_gets_a_committed_id():
    wb = worker_budget(window=4, size=4, **PC)
    wb.draw(source(rows(4)))
    pilots = {0: [0.0, 1.0], 1: [1.0, 1.0], 2: [0.0, 0.0], 3: [1.0, float("nan")]}  # pass, solved, too hard, solved
    reference = PilotCommit(PilotCommitSettings(n_explore=2, n_commit=6, buffer_max_off_steps=0))
    expected = reference.after_pilot(torch.arange(4), torch.tensor(list(pilots.values())), None,
                                     PromptLedger(wb.budget.ledger.settings), step=5)
    verdicts = [wb.judge_pilot(g, rewards, step=5) for g, rewards in pilots.items()]
    assert [committed for committed, _ in verdicts] == [0, None, None, None]
    assert wb.committed == [0] and wb.unjudged == {} and len(wb.budget.which) == 0  # committed at once
    for p, (_, metrics) in enumerate(verdicts):
        assert metrics["pods/pilot_passed_total"] == float(expected.extra["passed"][p])
        assert metrics["pods/pilot_too_easy_total"] == float(expected.skipped[p])
        assert metrics["pods/pilot_too_hard_total"] == float(expected.deferred[p])
        assert metrics["pods/prompts_evicted_total"] == float(expected.evicted[p])
        assert metrics["pods/pilot_success_rate"] == float(expected.extra["success_rate"][p])
    assert wb.budget.ledger.stats(torch.arange(4)).evicted.tolist() == [False, True, False, True]
    second, _ = wb.draw(source(rows(4)))  # the next pass: the solved prompts are not drawn again
    assert [row["prompt"][0]["content"] for _, row, _ in second] == ["p0", "p2", "p0", "p2"]


def test_a_resume_starts_at_the_first_untrained_committed_group_or_an_earlier_unjudged_pilot(tmp_path):
    wb = worker_budget(window=4, size=8, **PC)
    wb.draw(source(rows(8)))  # groups 0..3 at positions 0..3
    wb.judge_pilot(0, [0.0, 1.0], step=1)  # committed 0 <- position 0
    wb.judge_pilot(1, [0.0, 0.0], step=1)  # too hard: trains nothing
    wb.judge_pilot(3, [1.0, 0.0], step=1)  # committed 1 <- position 3; group 2 (position 2) not judged yet
    path = wb.save(tmp_path / "state.pt")
    for resume_at, position in ((0, 0), (1, 2), (2, 2)):  # TRL: start + the first untrained committed id
        again = worker_budget(window=4, size=8, **PC)
        assert again.resume(path, resume_at) == (position, True)
        assert again.committed == [] and again.unjudged == {} and again.next_position == position
    wb.judge_pilot(2, [1.0, 0.0], step=2)  # committed 2 <- position 2: nothing unjudged is left
    path = wb.save(tmp_path / "state.pt")
    again = worker_budget(window=4, size=8, **PC)
    assert again.resume(path, 1) == (3, True) and again.resume(path, 3) == (4, True)


def test_the_loop_commits_passing_pilots_by_top_ups_and_trains_nothing_of_the_others(tmp_path, monkeypatch,
                                                                                     tiny_model_dir):
    SCORED.clear()
    loop = budget_loop(tmp_path, monkeypatch, tiny_model_dir, ["mixed", "flat", "late"], pods_m=M,
                       pods_groups_per_step=3, **PC)
    try:
        assert loop.num_generations == 2 and loop.pods_n == N  # TRL's generate loop samples the pilot
        events, draw, judge = [], loop.budget.draw, loop.budget.judge_pilot

        def logged_draw(next_row):
            groups, metrics = draw(next_row)
            events.append(("draw", [row["prompt"][-1]["content"] for _, row, _ in groups]))
            return groups, metrics

        def logged_judge(group_id, rewards, *, step):
            committed, metrics = judge(group_id, rewards, step=step)
            events.append(("judged", ["mixed", "flat", "late"][loop.budget.positions[group_id] % 3], committed))
            return committed, metrics

        loop.budget.draw, loop.budget.judge_pilot = logged_draw, logged_judge
        rows_by_group = run_loops(loop, groups=3, until=lambda: drew_after(events, ("judged", "late")))
    finally:
        close_loop(loop)
    budget = loop.budget
    assert budget.committed[:3] == [0, 3, 6]  # each pass commits "mixed" (position 0 mod 3) alone
    for committed_id in range(3):
        samples = rows_by_group[committed_id]
        assert len(samples) == M and all(s.prompt[-1]["content"] == "mixed" for s in samples)
        metrics = samples[0].metrics
        assert metrics["pods/rollouts_sampled"] == N and metrics["pods/rounds"] == 2
        assert metrics["pods/pilot_rollouts"] == 2
        kept = sorted(s.completion[0]["conversation"] for s in samples)
        assert len(set(kept)) == M and {SCRIPT["mixed"][j] for j in kept} == {"0", "1"}  # max_variance: mixed
    generated = {group: budget.positions[group] % 3 for group in loop.sampled}
    judged = [group for group in generated if group not in budget.unjudged]  # (the stop cuts the last pilots)
    assert all(loop.sampled[group] == 2 for group in judged if generated[group] != 0)  # no commit rollouts
    verdicts = [event[1:] for event in events if event[0] == "judged"]
    assert all((committed is not None) == (prompt == "mixed") for prompt, committed in verdicts)
    solved = next(i for i, event in enumerate(events) if event[:2] == ("judged", "late"))
    later_draws = [event[1] for event in events[solved:] if event[0] == "draw"]
    assert later_draws and not any("late" in drawn for drawn in later_draws)  # evicted: never drawn again
    assert sorted(j for g, j in SCORED if g == 0) == list(range(N))  # each rollout scored once
    counters = {}
    for metrics in pushed(loop):
        for key, amount in metrics.items():
            if key.startswith("pods/") and key.endswith("_total"):
                counters[key] = counters.get(key, 0.0) + amount
    assert counters["pods/pilot_passed_total"] >= 3 and counters["pods/pilot_too_hard_total"] >= 2
    assert counters["pods/prompts_evicted_total"] >= 1 and counters["pods/prompts_skipped_evicted_total"] >= 1
    stats = budget.budget.ledger.stats(torch.tensor([0, 1, 2]))
    assert stats.evicted.tolist() == [False, False, True] and stats.rollouts[1] >= 4  # "flat" recorded, not trained


def test_the_worker_kwargs_start_a_group_with_its_pilot(tmp_path, tiny_model_dir):
    args = _config(tmp_path)  # 4 rows per step, n = 8
    plain = pods_worker_kwargs(str(tiny_model_dir), [value], args, None, pods_m=2)
    pilot_commit = pods_worker_kwargs(str(tiny_model_dir), [value], args, None, pods_m=2, **PC)
    assert plain["max_inflight_tasks"] == 4 * 4 * 8 // 2
    assert pilot_commit["max_inflight_tasks"] == 4 * 4 * 2 // 2  # a group starts with its pilot of n_explore = 2
    assert pilot_commit["pods_groups_per_step"] == 2


@pytest.mark.parametrize("settings, message", [
    (dict(pods_pilot=2), "pods_prompt_planner='pilot_commit' decides how many rollouts a prompt gets itself "
                         "(n_explore, then n_commit for the prompts it commits): drop pods_pilot"),
    (dict(pods_rollout_planner="knapsack"), "decides how many rollouts a prompt gets itself (n_explore, then "
                                            "n_commit for the prompts it commits): drop pods_rollout_planner"),
    (dict(environment_factory=object), "pods_prompt_planner='pilot_commit' does not support environment_factory"),
    (dict(pods_prompt_planner_args={"buffer_max_off_steps": 2}),
     "pods_prompt_planner_args buffer_max_off_steps=2: the asynchronous worker commits each pilot that passes as "
     "soon as it is scored"),
    (dict(pods_prompt_planner_args={"n_explore_effective": 1}), "n_explore_effective=1: the worker trains on every"),
    (dict(pods_prompt_planner_args={"n_explore": 3, "n_commit": 3}),
     "pods_prompt_planner_args n_explore=3 + n_commit=3 must make num_generations (n=8)"),
    (dict(pods_prompt_planner_args={"diversity_threshold_upper": 2.0}), "diversity_threshold_upper"),
])
def test_bad_pilot_commit_settings_fail_in_one_line_naming_the_worker_argument(tmp_path, tiny_model_dir, settings,
                                                                                message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        pods_worker_kwargs(str(tiny_model_dir), [value], _config(tmp_path), None, pods_m=2, **PC, **settings)
    assert "\n" not in str(error.value)
