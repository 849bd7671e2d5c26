"""The rollout-budget planners in TRL's asynchronous worker (pods_rl.engines.trl_async.budget, issue #54): GRESO's
skip where the worker draws its prompts, Knapsack-RL's counts by top-ups, the worker's prompt ledger, its state in
the trainer's checkpoints, and the refusals.

``WorkerBudget`` is tested alone (no TRL); the loop runs TRL's own generate and score loops with generation answered
from a script (``tests.test_async_pods.ScriptedLoop``, no server); the checkpoint callback is tested against the
trainer's callback order and the positions TRL's resume state counts.
"""

from __future__ import annotations

import inspect
import math
import queue
import re
import threading
import types

import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOTrainer  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trl_trainer  # noqa: E402
from trl.experimental.async_grpo import async_rollout_worker as trl_worker  # noqa: E402

from pods_rl.budget.ledger import LEDGER_FILE  # noqa: E402
from pods_rl.budget.planners import KnapsackAllocation, KnapsackSettings  # noqa: E402
from pods_rl.engines.trl_async.budget import (  # noqa: E402
    PODSLedgerCallback,
    WorkerBudget,
    check_budget_settings,
)
from pods_rl.engines.trl_async.worker import PODSRolloutLoop, PODSRolloutWorker, pods_worker_kwargs  # noqa: E402
from tests.test_async_pods import (  # noqa: E402
    SCORED,
    SCRIPT,
    ScriptedLoop,
    _config,
    accelerate_state,  # noqa: F401  (a module fixture)
    close_loop,
    drew_after,
    real_loop,
    run_loops,
    scored_value,
    value,
)

N, M = 8, 3
# GRESO made deterministic: a prompt whose last group was all-equal is always skipped, and nothing adapts.
ALWAYS_SKIP = {"p_easy": 0.0, "p_hard": 0.0, "min_p": 0.0, "min_readmit": 0.0, "adapt_from_epoch": 99}


def rows(count):
    """A dataset's rows as the worker draws them, in order: prompt i says "p{i}"."""
    return [{"prompt": [{"role": "user", "content": f"p{i}"}]} for i in range(count)]


def source(data):
    """``next_row`` over ``data``, starting over at its end (as TRL's iterator)."""
    state = {"i": 0}

    def next_row():
        row = data[state["i"] % len(data)]
        state["i"] += 1
        return row

    return next_row


def worker_budget(window=3, size=6, start=0, seed=0, **settings):
    budget = check_budget_settings(N, M, **settings)
    return WorkerBudget(budget, groups_per_step=window, dataset_size=size, start_index=start, seed=seed)


def record_groups(budget, outcomes: dict[int, list[float]], step=0):
    budget.budget.ledger.record(torch.tensor(list(outcomes)), torch.tensor(list(outcomes.values())), step=step)


# ---- WorkerBudget: drawing, recording, state ------------------------------------------------------------------
def test_greso_skips_the_prompts_its_ledger_saw_all_equal_and_draws_the_next_in_their_place():
    wb = worker_budget(pods_prompt_planner="greso", pods_prompt_planner_args=ALWAYS_SKIP)
    record_groups(wb, {1: [1.0] * 4, 3: [0.0] * 4, 5: [1.0, 0.0, 1.0, 1.0]})  # easy, hard, mixed
    data = rows(6)
    groups, metrics = wb.draw(source(data))
    assert [(g, row["prompt"][0]["content"], count) for g, row, count in groups] == [
        (0, "p0", N), (1, "p2", N), (2, "p4", N)]
    assert wb.positions == [0, 2, 4] and wb.next_position == 5
    assert metrics["pods/prompts_drawn_total"] == 5 and metrics["pods/prompts_skipped_total"] == 2
    assert metrics["pods/prompts_skipped_easy_total"] == 1 and metrics["pods/prompts_skipped_hard_total"] == 1
    assert metrics["pods/prompts_skipped_frac"] == (2.0, 5.0)
    groups, _ = wb.draw(source(data[5:] + data[:5]))  # the dataset goes on at position 5, then starts over
    assert [row["prompt"][0]["content"] for _, row, _ in groups] == ["p5", "p0", "p2"]
    assert wb.positions == [0, 2, 4, 5, 6, 8]


def test_a_whole_pass_skipped_in_a_row_readmits_the_next_prompt():
    wb = worker_budget(window=1, size=3, pods_prompt_planner="greso", pods_prompt_planner_args=ALWAYS_SKIP)
    record_groups(wb, {0: [1.0] * 2, 1: [1.0] * 2, 2: [0.0] * 2})
    groups, metrics = wb.draw(source(rows(3)))
    assert metrics["pods/prompts_skipped_total"] == 3 and metrics["pods/prompts_readmitted_total"] == 1
    assert wb.positions == [3]  # the fourth draw (prompt 0 again) goes through


def test_knapsack_spreads_the_windows_budget_between_m_and_n():
    args = {"min_buffer_length": 4, "reward_buffer_length": 8}
    wb = worker_budget(window=3, pods_rollout_planner="knapsack", pods_rollout_planner_args=args,
                       pods_adaptive_budget=5.0)
    record_groups(wb, {0: [1.0, 0.0] * 4, 1: [1.0] * 8, 2: [0.0] * 8})  # mixed, always solved, never solved
    groups, metrics = wb.draw(source(rows(6)))
    counts = [count for _, _, count in groups]
    expected = KnapsackAllocation(KnapsackSettings(min_n=M, max_n=N, **args)).plan(
        torch.tensor([0, 1, 2]), wb.budget.ledger, n=5, total_budget=15).rollouts.clamp(M, N).tolist()
    assert counts == expected and all(M <= c <= N for c in counts) and sum(counts) <= 15
    assert counts[0] > counts[1]  # the mixed prompt gets more than the solved one
    assert metrics["pods/rollouts_planned_per_prompt"] == (float(sum(counts)), 3.0)
    assert metrics["pods/rollouts_planned_min"] == min(counts) and "pods/prompts_skipped_total" not in metrics


class Clock:
    """A clock the test sets."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_auto_observes_each_windows_sampling_seconds_in_draw_order_less_the_trainers_waits():
    """Windows are delivered in draw order: a window's seconds run from the delivery of the one before (or its own
    draw, if later) to its own last group's close, less the seconds the worker waited on the trainer meanwhile."""
    clock = Clock()
    budget = check_budget_settings(N, M, pods_rollout_planner="auto", pods_rollout_planner_args={"train_ms": 2.5})
    wb = WorkerBudget(budget, groups_per_step=2, dataset_size=6, clock=clock)
    data = source(rows(6))
    for _ in range(3):  # windows 0 (groups 0, 1), 1 (2, 3), 2 (4, 5), all drawn at t = 0
        groups, metrics = wb.draw(data)
        assert [count for _, _, count in groups] == [M, M] and metrics["pods/auto_warmup"] == 1.0
    costs = wb.budget.how_many.costs
    clock.now = 1.0
    assert wb.close(0, sampled=3, trained=3) == {}  # window 0 still has group 1 open
    clock.now = 2.0
    assert wb.close(2, sampled=5, trained=3) == {} and wb.close(3, sampled=3, trained=3) == {}  # 1 waits for 0
    wb.costs.wait(0.5)  # the score loop waited 0.5 s on a full rollout buffer
    clock.now = 4.0
    metrics = wb.close(1, sampled=8, trained=3)  # delivers window 0 (0 -> 4, less 0.5) and window 1 (in no time)
    assert [row[:2] for row in costs.sampled] == [(11.0, 3.5), (8.0, 0.0)] and metrics == {
        "pods/auto_window_sample_s": 0.0, "pods/auto_window_sampled": 8.0}
    assert list(costs.trained) == []  # the worker sees no update: auto takes train_ms
    clock.now = 5.5
    wb.close(4, sampled=3, trained=3)
    wb.close(5, sampled=0, trained=0)  # (nothing came back for it)
    assert list(costs.sampled)[-1][:2] == (3.0, 1.5) and not wb.costs.windows and not wb.costs.window_of
    estimate = wb.budget.how_many.estimate()
    assert estimate.per_trained == pytest.approx(2.5e-3) and not estimate.slope_known
    plain = worker_budget(pods_rollout_planner="knapsack")  # no costs kept without auto
    plain.draw(source(rows(6)))
    assert plain.costs.windows == {} and plain.close(0, sampled=3, trained=3) == {}


def test_groups_are_recorded_a_window_at_a_time_and_greso_adapts_once_per_window():
    settings = {"p_hard": 0.5, "target_zero_variance": 0.25, "p_step": 0.01, "adapt_from_epoch": 0}
    wb = worker_budget(window=2, size=4, pods_prompt_planner="greso", pods_prompt_planner_args=settings)
    wb.draw(source(rows(4)))
    assert wb.record(0, [0.0, 0.0, float("nan")], step=3) == {}  # noted, not yet recorded
    assert len(wb.budget.ledger) == 0
    metrics = wb.record(1, [1.0, 0.0], step=4)  # the window is complete: both recorded, GRESO adapts once
    stats = wb.budget.ledger.stats(torch.tensor([0, 1]))
    assert stats.rollouts.tolist() == [2, 2] and stats.successes.tolist() == [0, 1]
    assert stats.last_step.tolist() == [4, 4] and stats.no_success_streak.tolist() == [1, 0]
    assert metrics["pods/ledger_groups_recorded"] == 2 and metrics["pods/greso_too_hard_ratio"] == 0.5
    assert wb.budget.which.p_hard == pytest.approx(0.49)  # one step down: the hard share reached its target


def test_the_state_resumes_and_maps_trls_resume_point_back_to_the_prompt(tmp_path):
    wb = worker_budget(window=3, size=6, start=6, pods_prompt_planner="greso", pods_prompt_planner_args=ALWAYS_SKIP)
    record_groups(wb, {1: [1.0] * 2, 3: [1.0] * 2})
    data = rows(6)
    wb.draw(source(data))  # positions 6, 8, 10 (prompts 0, 2, 4; 1 and 3 skipped)
    wb.record(0, [1.0, 0.0], step=1)
    path = wb.save(tmp_path / "state.pt")
    for resume_at, position, found in ((6 + 1, 8, True), (6 + 3, 11, True), (6 + 4, 6 + 4, False)):
        again = worker_budget(window=3, size=6, pods_prompt_planner="greso", pods_prompt_planner_args=ALWAYS_SKIP)
        assert again.resume(path, resume_at) == (position, found)
        assert again.next_position == position and again.start_index == resume_at and again.positions == []
        assert again.budget.ledger.state_dict().keys() == wb.budget.ledger.state_dict().keys()
        assert all(torch.equal(a, b) for a, b in zip(again.budget.ledger.state_dict().values(),
                                                      wb.budget.ledger.state_dict().values()) if torch.is_tensor(a))
        assert again.budget.pending == wb.budget.pending and len(again.budget.pending) == 1
        assert torch.equal(again.generator.get_state(), wb.generator.get_state())


# ---- the loop: TRL's generate and score loops, generation from a script ----------------------------------------
def budget_loop(tmp_path, monkeypatch, model_dir, prompts, **pods):
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    loop = real_loop(tmp_path, monkeypatch, model_dir, (scored_value,), dataset, ScriptedLoop,
                     _config(tmp_path, max_inflight_tasks=6), **pods)
    loop.sampled = {}
    return loop


def pushed(loop) -> list[dict]:
    out = []
    while True:
        try:
            out.append(loop._metrics_queue.get_nowait())
        except queue.Empty:
            return out


def test_the_worker_never_generates_a_prompt_after_greso_recorded_it_all_equal(tmp_path, monkeypatch,
                                                                               tiny_model_dir):
    """"flat" (no success in 8) is skipped from the first draw after its group is recorded; "mixed" goes on."""
    loop = budget_loop(tmp_path, monkeypatch, tiny_model_dir, ["mixed", "flat"], pods_m=M,
                       pods_prompt_planner="greso", pods_prompt_planner_args=ALWAYS_SKIP, pods_groups_per_step=1)
    events = []
    draw, record = loop.budget.draw, loop.budget.record

    def logged_draw(next_row):
        groups, metrics = draw(next_row)
        events.append(("draw", [row["prompt"][-1]["content"] for _, row, _ in groups]))
        return groups, metrics

    def logged_record(group_id, rewards, *, step):
        events.append(("record", ["mixed", "flat"][loop.budget.positions[group_id] % 2], rewards))
        return record(group_id, rewards, step=step)

    loop.budget.draw, loop.budget.record = logged_draw, logged_record
    try:
        rows_by_group = run_loops(loop, groups=6, until=lambda: drew_after(events, ("record", "flat")))
    finally:
        close_loop(loop)
    recorded = [event for event in events if event[0] == "record"]
    first_flat = next(i for i, event in enumerate(events) if event[:2] == ("record", "flat"))
    later_draws = [event[1] for event in events[first_flat:] if event[0] == "draw"]
    assert later_draws and all(drawn == ["mixed"] for drawn in later_draws)
    # each group's deciding rewards, all 8 (rollouts finish out of order, as a server's do)
    assert all(sorted(rewards) == sorted(float(c) for c in SCRIPT[text]) for _, text, rewards in recorded)
    metrics = pushed(loop)
    assert sum(m.get("pods/prompts_skipped_hard_total", 0) for m in metrics) >= 1
    assert any("pods/ledger_groups_recorded" in m for m in metrics)
    for group_id, samples in rows_by_group.items():  # every trained group: m rows of the prompt it was drawn for
        prompt = ["mixed", "flat"][loop.budget.positions[group_id] % 2]
        assert len(samples) == M and all(s.prompt[-1]["content"] == prompt for s in samples)
    assert (tmp_path / "out" / LEDGER_FILE).is_file()  # the state file the checkpoints copy


def test_knapsack_groups_get_their_planned_count_by_top_ups_and_keep_m(tmp_path, monkeypatch, tiny_model_dir):
    SCORED.clear()
    loop = budget_loop(tmp_path, monkeypatch, tiny_model_dir, ["mixed", "flat"], pods_m=M,
                       pods_rollout_planner="knapsack", pods_adaptive_budget=5.0, pods_groups_per_step=2,
                       pods_rollout_planner_args={"min_buffer_length": 4})
    try:
        assert loop.num_generations == M and loop.pods_n == N  # TRL's generate loop emits m, the rest is topped up
        rows_by_group = run_loops(loop, groups=6)
    finally:
        close_loop(loop)
    planned_windows = [m["pods/rollouts_planned_per_prompt"] for m in pushed(loop)
                       if "pods/rollouts_planned_per_prompt" in m]
    assert planned_windows[0] == (10.0, 2.0)  # nothing estimated yet: 5 each
    assert all(total <= 5.0 * count for total, count in planned_windows)
    for group_id in range(6):
        samples = rows_by_group[group_id]
        metrics = samples[0].metrics
        count = int(metrics["pods/rollouts_planned"])
        assert M <= count <= N and metrics["pods/rollouts_sampled"] == count == loop.sampled[group_id]
        assert sorted(j for g, j in SCORED if g == group_id) == list(range(count))  # each rollout scored once
        assert len(samples) == M and metrics["pods/rounds"] == (1 if count == M else 2)


def test_auto_runs_in_the_worker_on_its_own_sampling_seconds(tmp_path, monkeypatch, tiny_model_dir):
    """auto in TRL's generate and score loops: each group gets its count in [m, n] by top-ups and keeps m; the
    planner learns from the windows the worker delivered, and its pods/auto_* metrics reach the trainer."""
    SCORED.clear()
    loop = budget_loop(tmp_path, monkeypatch, tiny_model_dir, ["mixed", "flat"], pods_m=M, pods_groups_per_step=2,
                       pods_rollout_planner="auto",
                       pods_rollout_planner_args={"train_ms": 5.0, "warmup_steps": 0, "probe_gap": 1})
    try:
        assert loop.num_generations == M and loop.pods_n == N
        rows_by_group = run_loops(loop, groups=12)
    finally:
        close_loop(loop)
    metrics = pushed(loop)
    planned = [m for m in metrics if "pods/auto_n_mean" in m]
    assert planned and all(M <= m["pods/auto_n_mean"] <= m["pods/auto_n_max"] <= N for m in planned)
    assert any("pods/auto_sample_ms" in m and m["pods/auto_train_ms"] == 5.0 for m in planned)
    # the slope is unknown (every window so far sampled m per prompt): a probe plans a window at twice m (at most n)
    assert any(m["pods/auto_probe"] == 1.0 and m["pods/auto_n_mean"] == min(2 * M, N) for m in planned)
    windows = [m for m in metrics if "pods/auto_window_sample_s" in m]
    costs = loop.budget.budget.how_many.costs
    assert windows and len(costs.sampled) >= len(windows) and all(seconds >= 0 for _, seconds, _ in costs.sampled)
    for group_id in range(12):
        samples = rows_by_group[group_id]
        count = int(samples[0].metrics["pods/rollouts_planned"])
        assert M <= count <= N and samples[0].metrics["pods/rollouts_sampled"] == count == loop.sampled[group_id]
        assert len(samples) == M
    # every window the planner observed sampled its groups' counts: m each, or twice m (at most n) each in a probe
    assert all(total in (2 * M, 2 * min(2 * M, N)) for total, _, _ in costs.sampled)


# ---- checkpoints: the callback and the trainer ------------------------------------------------------------------
class FakeWorker:
    """What the callback reads of a PODSRolloutWorker (TRL's worker cannot be built without vLLM)."""

    def __init__(self, **loop_kwargs):
        self._loop_kwargs, self._process = dict(loop_kwargs), None
        self.rollout_buffer = self.metrics_queue = queue.Queue()


def trainer_state(step, main=True):
    return types.SimpleNamespace(global_step=step, is_world_process_zero=main)


def test_the_callback_copies_the_workers_ledger_into_each_checkpoint_and_hands_it_back(tmp_path):
    live = tmp_path / "out" / LEDGER_FILE
    worker = FakeWorker(pods_ledger_path=str(live), dataset_start_index=0)
    callback, args = PODSLedgerCallback(worker), types.SimpleNamespace(output_dir=str(tmp_path / "out"))
    wb = worker_budget(pods_prompt_planner="greso")
    wb.draw(source(rows(6)))
    wb.save(live)
    (tmp_path / "out" / "checkpoint-2").mkdir()
    callback.on_save(args, trainer_state(2), None)
    saved = tmp_path / "out" / "checkpoint-2" / LEDGER_FILE
    assert saved.read_bytes() == live.read_bytes()
    callback.on_save(args, trainer_state(2, main=False), None)  # other ranks copy nothing
    callback.on_train_begin(args, trainer_state(0), None)  # a fresh run: nothing to resume
    assert "pods_ledger_resume" not in worker._loop_kwargs
    callback.on_train_begin(args, trainer_state(2), None)  # resumed at step 2
    assert worker._loop_kwargs["pods_ledger_resume"] == str(saved)
    worker._process = object()  # the worker already started: too late to hand it the ledger
    with pytest.raises(RuntimeError, match=r"callbacks=\[PODSLedgerCallback\(worker\)\]"):
        callback.on_train_begin(args, trainer_state(2), None)


def test_the_callback_runs_before_the_trainer_starts_its_worker(tmp_path, monkeypatch, tiny_model_dir):
    """AsyncGRPOTrainer adds the callback that starts its worker after the constructor's callbacks, so ours sees
    the worker before its child is spawned."""
    class NoTransfer:
        def init_weight_transfer(self):
            pass

    monkeypatch.setattr(trl_trainer, "get_peak_flops_per_device", lambda *a, **k: None, raising=False)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "2 + 2?"}]] * 4, "answer": ["4"] * 4})
    worker = FakeWorker(pods_ledger_path=str(tmp_path / LEDGER_FILE))
    trainer = AsyncGRPOTrainer(model=str(tiny_model_dir), reward_funcs=[value], args=_config(tmp_path),
                               train_dataset=dataset, weight_transfer=NoTransfer(), rollout_worker=worker,
                               callbacks=[PODSLedgerCallback(worker)])
    names = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    assert names.index("PODSLedgerCallback") < names.index("_TrainBeginCallback")
    start = trl_trainer._TrainBeginCallback.on_train_begin
    assert "rollout_worker.start()" in inspect.getsource(start)
    save = inspect.getsource(trl_trainer.AsyncGRPOTrainer._save_checkpoint)
    assert 'f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"' in save and "first_untrained" in save


def test_a_resumed_loop_draws_from_the_prompt_the_saved_positions_name(tmp_path, monkeypatch, tiny_model_dir):
    """TRL resumes at the saved session's start + its first untrained group id (3 here); the saved positions say
    that group's prompt came from position 5 (two prompts were skipped before it): the loop, built as the child
    builds it with TRL's dataset_start_index and the callback's file, draws from there with the saved ledger."""
    prompts = [f"q{i}" for i in range(8)]
    wb = worker_budget(window=4, size=8, pods_prompt_planner="greso", pods_prompt_planner_args=ALWAYS_SKIP)
    record_groups(wb, {1: [1.0] * 2, 2: [0.0] * 2})
    wb.draw(source([{"prompt": [{"role": "user", "content": p}]} for p in prompts]))
    assert wb.positions == [0, 3, 4, 5]
    saved = wb.save(tmp_path / "saved.pt")
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    monkeypatch.setattr(trl_worker, "aiohttp", types.SimpleNamespace(ClientSession=object), raising=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.response_template = {"placeholder": True}
    kwargs = pods_worker_kwargs(str(tiny_model_dir), [value], _config(tmp_path), dataset, tokenizer, pods_m=M,
                                pods_prompt_planner="greso", pods_prompt_planner_args=ALWAYS_SKIP)
    loop = PODSRolloutLoop(**kwargs, dataset_start_index=3, pods_ledger_resume=str(saved),
                           rollout_buffer=queue.Queue(), model_version_value=types.SimpleNamespace(value=0),
                           heartbeat_value=types.SimpleNamespace(value=0.0), failed_event=threading.Event(),
                           exception_info_queue=queue.Queue(), metrics_queue=queue.Queue())
    try:
        assert loop.budget.next_position == 5 and loop.budget.start_index == 3
        assert len(loop.budget.budget.ledger) == 2  # the saved ledger
        drawn = [row["prompt"][-1]["content"] for _ in range(3) for _, row, _ in loop.budget.draw(loop._next_row)[0]]
        assert drawn == ["q5", "q6", "q7", "q0", "q3", "q4"]  # windows of 2 (4 rows / m = 3); q1, q2 skipped
    finally:
        close_loop(loop)


# ---- settings ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, message", [
    (dict(pods_prompt_planner="dapo"), "pods_prompt_planner='dapo': the asynchronous worker runs ['greso', "
                                        "'pilot_commit'] for this question (registered: ['greso', 'pilot_commit'])"),
    (dict(pods_rollout_planner="reinforce_ada"), "pods_rollout_planner='reinforce_ada': in the asynchronous worker "
                                                  "Reinforce-Ada runs as its round rule, its keep and its baseline: "
                                                  "pods_pilot=K, pods_adaptive_rule='reinforce_ada'"),
    (dict(pods_rollout_planner="knapsack", pods_pilot=4), "pods_rollout_planner and pods_pilot both decide"),
    (dict(pods_rollout_planner="knapsack", pods_m=8), "with m = n every prompt gets n"),
    (dict(pods_rollout_planner="knapsack", environment_factory=object),
     "pods_rollout_planner does not support environment_factory"),
    (dict(pods_rollout_planner="knapsack", pods_adaptive_budget=1.5), "pods_adaptive_budget=1.5: Knapsack-RL's"),
    (dict(pods_rollout_planner="knapsack", pods_rollout_planner_args={"min_n": 1}),
     "pods_rollout_planner_args min_n=1: with PODS every prompt Knapsack-RL samples gets between pods_m (m=2)"),
    (dict(pods_prompt_planner="greso", pods_prompt_planner_args={"p_easy": 2.0}), "GRESO p_easy must be"),
    (dict(pods_prompt_planner="greso", pods_prompt_planner_args={"nope": 1}), "planner 'greso' has no setting"),
    (dict(pods_prompt_planner="greso", pods_adaptive_reward="correct"),
     "pods_adaptive_reward 'correct' is not one of this run's reward functions ['value']"),
    (dict(pods_prompt_planner="greso", pods_groups_per_step=0), "pods_groups_per_step must be a positive integer"),
    (dict(pods_prompt_planner="greso", pods_ledger_success_threshold=float("inf")),
     "pods_ledger_success_threshold must be a finite number"),
    (dict(pods_rollout_planner="auto"), "pods_rollout_planner='auto' in the asynchronous worker needs "
                                        "pods_rollout_planner_args={'train_ms': MS}"),
    (dict(pods_rollout_planner="auto", pods_rollout_planner_args={"sample_ms": 1.0}), "(its upd/kept column)"),
    (dict(pods_rollout_planner="auto", pods_rollout_planner_args={"train_ms": -1.0}), "auto train_ms must be"),
    (dict(pods_rollout_planner="auto", pods_pilot=4), "pods_rollout_planner and pods_pilot both decide"),
    (dict(pods_rollout_planner="auto", pods_adaptive_budget=5.0, pods_rollout_planner_args={"train_ms": 1.0}),
     "pods_rollout_planner='auto' chooses how many rollouts to spend from the measured costs: drop "
     "pods_adaptive_budget"),
])
def test_bad_planner_settings_fail_in_one_line_naming_the_worker_argument(tmp_path, tiny_model_dir, settings,
                                                                           message):
    settings = {"pods_m": 2, **settings}
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        pods_worker_kwargs(str(tiny_model_dir), [value], _config(tmp_path), None, **settings)
    assert "\n" not in str(error.value)


def test_auto_without_train_ms_is_refused_before_any_model_loads(tmp_path):
    """The worker logs no update times: without train_ms, one line, before the tokenizer or the child."""
    message = re.escape("pods_rollout_planner='auto' in the asynchronous worker needs pods_rollout_planner_args=")
    with pytest.raises(ValueError, match=message):  # (the model is not there: nothing was read)
        pods_worker_kwargs(str(tmp_path / "no-such-model"), [value], _config(tmp_path), None, pods_m=2,
                           pods_rollout_planner="auto")
    with pytest.raises(ValueError, match=message):
        PODSRolloutWorker(pods_m=2, num_generations=8, reward_funcs=[value], pods_rollout_planner="auto",
                          pods_rollout_planner_args={"efficiency": 0.5})


def test_an_iterable_dataset_and_an_unknown_keyword_are_refused(tmp_path, tiny_model_dir):
    stream = Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]] * 2}).to_iterable_dataset()
    with pytest.raises(ValueError, match="need a dataset with a length"):
        pods_worker_kwargs(str(tiny_model_dir), [value], _config(tmp_path), stream, pods_m=2,
                           pods_prompt_planner="greso")
    with pytest.raises(TypeError, match="pods_prompt_plannr"):
        pods_worker_kwargs(str(tiny_model_dir), [value], _config(tmp_path), None, pods_m=2,
                           pods_prompt_plannr="greso")


def test_the_worker_kwargs_carry_the_window_the_state_file_and_knapsacks_inflight(tmp_path, tiny_model_dir):
    args = _config(tmp_path)  # 4 rows per step, n = 8
    plain = pods_worker_kwargs(str(tiny_model_dir), [value], args, None, pods_m=2)
    assert not any(key in plain for key in ("pods_groups_per_step", "pods_ledger_path"))
    greso = pods_worker_kwargs(str(tiny_model_dir), [value], args, None, pods_m=2, pods_prompt_planner="greso")
    assert greso["pods_groups_per_step"] == math.ceil(4 / 2)
    assert greso["pods_ledger_path"] == str(tmp_path / "out" / LEDGER_FILE)
    assert greso["max_inflight_tasks"] == plain["max_inflight_tasks"] == 4 * 4 * 8 // 2
    knapsack = pods_worker_kwargs(str(tiny_model_dir), [value], args, None, pods_m=2, pods_rollout_planner="knapsack")
    assert knapsack["max_inflight_tasks"] == 4 * 4  # a group starts with m rollouts (the rest are top-ups)


def test_trl_internals_the_planners_touch_are_where_they_expect_them():
    from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

    generate = inspect.getsource(_AsyncRolloutLoop._generate_loop)
    assert "work_iter = self._repeat_iterator()" in generate and "group_id, row = next(work_iter)" in generate
    assert "pending_completed[group_id] == self.num_generations" in generate  # a fixed group size: Knapsack tops up
    iterator = inspect.getsource(_AsyncRolloutLoop._repeat_iterator)
    assert "next(self._dataset_iter)" in iterator and "iter(self.dataset)" in iterator
    init = inspect.getsource(_AsyncRolloutLoop.__init__)
    assert "dataset.select(range(start, len(dataset)))" in init and "self._metrics_queue" in init
    assert inspect.signature(_AsyncRolloutLoop._push_metrics).parameters.keys() == {"self", "values"}
    trainer = inspect.getsource(AsyncGRPOTrainer.__init__)
    assert "self.add_callback(_TrainBeginCallback(self))" in trainer
    resume = inspect.getsource(AsyncGRPOTrainer._inner_training_loop)
    assert '_loop_kwargs["dataset_start_index"] = rollout_state["prompt_index"]' in resume
