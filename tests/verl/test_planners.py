"""The rollout-budget planners on verl (issue #68): a few steps of verl's own trainer loop per planner, with PODS's
agent loop manager and worker (tests/verl/planner_lane.py says what is real), checking what was generated against
what the planner decided, and a save + resume against the same steps without one."""

from __future__ import annotations

import pytest
import torch
from planner_lane import KW, budget_state, planned_run, reward, run_steps, sessions_by_uid
from verl_lane import pods_overrides, verl_config

from pods_rl.budget.planners import make_planner

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]

N, M, B = 4, 2, 4
GRESO = (KW + "prompt_planner=greso",
         KW + "prompt_planner_args={p_easy:0.05,p_hard:0.05,min_p:0.05,adapt_from_epoch:0}")
PILOT = (KW + "prompt_planner=pilot_commit", KW + "prompt_planner_args={n_explore:2}")
KNAPSACK = (KW + "rollout_planner=knapsack", KW + "rollout_planner_args={max_n:8,min_buffer_length:4}")


def _base(*extra):
    return pods_overrides(M, N, *extra, train_batch_size=B)


def test_without_a_planner_the_manager_dispatches_as_verl_does(tq_store):
    trainer, manager, worker = planned_run(*_base())
    steps = run_steps(trainer, 4)
    assert manager.decisions == [] and trainer.replay_buffer.plan.planned is False
    assert all(sessions == list(range(N)) for sessions in sessions_by_uid(worker).values())
    assert len(sessions_by_uid(worker)) == 4 * B and all(len(step["keys"]) == B * M for step in steps)


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_greso_skipped_prompts_get_no_rollouts_and_the_batch_is_refilled(tq_store, mode):
    trainer, manager, worker = planned_run(*_base(*GRESO), f"trainer.v1.trainer_mode={mode}")
    steps = run_steps(trainer, 4)
    generated = sessions_by_uid(worker)
    skipped = 0
    for decision in manager.decisions:
        for uid, kept in zip(decision["uids"], decision["kept"].tolist()):
            assert generated.get(uid, []) == (list(range(N)) if kept else [])  # a skipped row: not one rollout
            skipped += not kept
    assert skipped > 0  # steps 3 and 4 offer prompts seen all-right / all-wrong: GRESO skips most of them
    assert any(d["wave"] > 0 for d in manager.decisions)  # ... and the dataloader refilled them
    for step in steps:  # every step still trains B groups, m kept of each
        groups = {key.rsplit("_", 2)[0] for key in step["keys"]}
        assert len(groups) == B and len(step["keys"]) == B * M
    offered = sum(len(d["ids"]) for d in manager.decisions if d["step"] == 3)
    assert steps[2]["pods/prompts_skipped"] == offered - B  # the manager's metrics reach the step's
    assert manager.buffer is trainer.replay_buffer  # the manager plans from the buffer it was handed


def test_greso_refills_are_bounded(tq_store):
    """refill_rounds=0: nothing is ever dropped; refill_rounds=1: one refill wave, admitted whole."""
    for rounds, deepest in ((0, 0), (1, 1)):
        trainer, manager, worker = planned_run(*_base(*GRESO, KW + f"refill_rounds={rounds}"))
        run_steps(trainer, 4)
        assert max(d["wave"] for d in manager.decisions) <= deepest
        assert all(bool(d["kept"].all()) for d in manager.decisions if d["wave"] == rounds)
        assert manager.decisions[-1]["step"] == 4


def test_knapsack_gives_each_prompt_its_planned_count_within_the_steps_budget(tq_store):
    trainer, manager, worker = planned_run(*_base(*KNAPSACK))
    run_steps(trainer, 4)
    generated = sessions_by_uid(worker)
    budget = trainer.replay_buffer.budget
    uneven = False
    for decision in manager.decisions:
        counts = decision["counts"]
        assert int(counts.sum()) == len(counts) * N  # sum(n_i) = P x rollout.n: mini-batches unchanged
        assert bool(((counts >= M) & (counts <= 8)).all())
        for uid, count in zip(decision["uids"], counts.tolist()):
            assert generated[uid] == list(range(count))  # per-prompt counts equal the plan
        uneven |= len(set(counts.tolist())) > 1
    assert uneven  # from step 3 the ledger knows the prompts: Knapsack-RL moves rollouts between them
    assert budget.how_many.settings.max_n == 8 and budget.budget_per_prompt == N


def test_reinforce_ada_samples_rounds_until_its_rule_holds(tq_store):
    trainer, manager, worker = planned_run(*_base(KW + "rollout_planner=reinforce_ada", KW + "rule=reinforce_ada"))
    steps = run_steps(trainer, 2)
    planner = make_planner("reinforce_ada", max_rounds=4, round_repeat=N, final_keep_per_prompt=M)
    by_index = {}
    for uid, sessions in sessions_by_uid(worker).items():
        index = next(i for _, u, i, _ in worker.generated if u == uid)
        count = len(sessions)
        assert sessions == list(range(count)) and count % N == 0  # whole rounds, session ids continuing
        rewards = torch.tensor([[reward(index, s) for s in range(count)]], dtype=torch.float64)
        done = bool(planner.finished(rewards, torch.tensor([count]))[0])
        # It stopped at the first round its rule held, or at max_rounds.
        assert done or count == planner.settings.cap
        if count > N:
            assert not bool(planner.finished(rewards[:, :count - N], torch.tensor([count - N]))[0])
        by_index[index] = count
    assert by_index == {0: 16, 1: 16, 2: 4, 3: 8, 4: 16, 5: 16, 6: 4, 7: 8}
    for step in steps:
        assert len(step["keys"]) == B * M  # PODS keeps m of each group, whatever its size


def test_auto_gives_each_prompt_its_planned_count_from_the_costs_it_measures(tq_store):
    trainer, manager, worker = planned_run(*_base(KW + "rollout_planner=auto",
                                                  KW + "rollout_planner_args={max_n:8,warmup_steps:0,probe_gap:1}"))
    run_steps(trainer, 4)
    generated = sessions_by_uid(worker)
    auto = trainer.replay_buffer.budget.how_many
    totals = []
    for decision in manager.decisions:
        counts = decision["counts"]
        assert bool(((counts >= M) & (counts <= 8)).all())
        for uid, count in zip(decision["uids"], counts.tolist()):
            assert generated[uid] == list(range(count))  # per-prompt counts equal the plan
        totals.append(int(counts.sum()))
    # Step 1 plans at m (no cost yet); step 2 probes at twice the total, each prompt's count doubled up to max_n (the
    # slope is unknown); each step after the first hands the step before it to the cost model: rollouts dispatched,
    # and the rows the buffer returned.
    assert totals[:2] == [B * M, B * min(2 * M, 8)]
    assert [row[0] for row in auto.costs.sampled] == totals[:3] and list(auto.costs.trained)
    assert len(auto.costs.trained) == 3 and all(seconds >= 0 for _, seconds, _ in auto.costs.sampled)


def test_the_cost_meter_hands_auto_each_step_at_the_next_steps_first_dispatch():
    """verl's costs through ``CostMeter.dispatched``/``trained``: sampling from a step's first dispatch to its batch,
    update from there to the next step's first dispatch; a refill dispatch adds its rollouts to its step."""
    from types import SimpleNamespace

    from pods_rl.budget.costs import CostMeter

    seen = []
    times = iter([1.0, 2.0, 5.0, 6.0, 9.0])
    meter = CostMeter(SimpleNamespace(needs={"costs"}, observe=lambda **kw: seen.append(kw)), clock=lambda: next(times))
    meter.dispatched(1)  # at 1 s
    meter.sampled(8)
    meter.dispatched(1)  # a refill at 2 s: the same step
    meter.sampled(4)
    meter.trained(1, 16)  # the buffer hands step 1's 16 rows at 5 s
    meter.dispatched(2)  # at 6 s: step 1 is observed
    meter.sampled(6)
    meter.dispatched(3)  # at 9 s: step 2 was never handed to the trainer, so nothing
    assert seen == [{"sampled": 12, "sample_seconds": 4.0, "trained": 16, "update_seconds": 1.0}]


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_pilot_commit_commits_the_pilots_that_pass_and_replaces_the_others(tq_store, mode):
    trainer, manager, worker = planned_run(*_base(*PILOT), f"trainer.v1.trainer_mode={mode}")
    steps = run_steps(trainer, 3)
    judge = make_planner("pilot_commit", n_explore=2, n_commit=2)
    generated, admitted = sessions_by_uid(worker), set()
    for decision in manager.decisions:
        admitted |= {uid for uid in decision["uids"] if decision["admitted"]}
    trained = {key.rsplit("_", 2)[0] for step in steps for key in step["keys"]}
    from pods_rl.budget.ledger import PromptLedger

    for uid, sessions in generated.items():
        index = next(i for _, u, i, _ in worker.generated if u == uid)
        pilot = torch.tensor([[reward(index, s) for s in range(2)]], dtype=torch.float64)
        passed = bool(judge.after_pilot(torch.tensor([index]), pilot, None, PromptLedger(), step=0,
                                        evict=False).extra["passed"][0])
        if passed or uid in admitted:  # committed: the pilot and n_commit more, one group of rollout.n, trained
            assert sessions == list(range(N)) and uid in trained
        else:  # dropped after its pilot: nothing more, never trained
            assert sessions == [0, 1] and uid not in trained
    for step in steps:
        assert len({key.rsplit("_", 2)[0] for key in step["keys"]}) == B and len(step["keys"]) == B * M
    ledger = trainer.replay_buffer.ledger
    assert bool(ledger.stats(torch.tensor([0, 4])).evicted.all())  # solved pilots: evicted, as the planner says
    late = [d for d in manager.decisions if d["step"] == 3 and not d["admitted"]]
    for decision in late:  # ... and dropped before generation when the dataloader offers them again
        for uid, index, kept in zip(decision["uids"], decision["ids"].tolist(), decision["kept"].tolist()):
            assert kept == (index % 4 != 0) and (uid in generated) == kept
    assert steps[0]["pods/pilots_dropped"] > 0


def test_each_pilot_is_judged_once_by_the_runs_planner(tq_store):
    trainer, manager, worker = planned_run(*_base(*PILOT))
    planner, judged = trainer.replay_buffer.budget.which, []
    after_pilot = planner.after_pilot

    def counted(ids, *args, **kwargs):
        judged.extend(torch.as_tensor(ids).tolist())
        return after_pilot(ids, *args, **kwargs)

    planner.after_pilot = counted
    run_steps(trainer, 3)
    piloted = [index for decision in manager.decisions if not decision["admitted"]
               for index, kept in zip(decision["ids"].tolist(), decision["kept"].tolist()) if kept]
    assert sorted(judged) == sorted(piloted) and len(piloted) > 3 * B  # every pilot, once; some were replaced


@pytest.mark.parametrize("planners", [
    {"prompt_planner": "greso", "prompt_planner_args": {"p_easy": 0.3}},
    {"rollout_planner": "knapsack", "rollout_planner_args": {"max_n": 8, "min_buffer_length": 4}},
    {"rollout_planner": "reinforce_ada", "rollout_planner_args": {"max_rounds": 2}},
    {"prompt_planner": "greso", "rollout_planner": "knapsack", "refill_rounds": 2},
    {"prompt_planner": "pilot_commit", "prompt_planner_args": {"n_explore": 2}},
    {"rollout_planner": "auto", "rollout_planner_args": {"max_n": 8}},
])
def test_verl_args_with_a_planner_prints_a_run_verl_accepts(tq_store, tiny_model_dir, planners):
    """`pods verl-args --rollout_planner ...`'s overrides alone: verl composes and validates them, its trainer builds
    the buffer with the planners, the manager is handed it, and a step generates and trains B groups of m."""
    from test_batch_settings import MICRO
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from pods_rl.engines.verl.agent_loop import PODSAgentLoopWorker
    from pods_rl.engines.verl.batch_settings import verl_batch_settings

    settings = verl_batch_settings(prompts=B, n=N, m=M, dp=1, mini_batch=N, planners=planners)
    overrides = [*settings.overrides, "algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=1", *MICRO,
                 f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}"]
    config = verl_config(*overrides)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    trainer, manager, worker = planned_run(*overrides)
    assert manager.agent_loop_workers_class is PODSAgentLoopWorker and trainer.replay_buffer.plan.planned
    steps = run_steps(trainer, 2)
    assert all(len(step["keys"]) == B * M for step in steps)
    assert len(trainer.replay_buffer.ledger) == 2 * B


@pytest.mark.parametrize("planners", [GRESO + KNAPSACK, PILOT, (KW + "rollout_planner=reinforce_ada",)],
                         ids=["greso+knapsack", "pilot_commit", "reinforce_ada"])
def test_the_ledger_after_save_and_resume_equals_the_ledger_without(tq_store, tmp_path, planners):
    overrides = _base(*planners, f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                      "trainer.checkpoint_callback_class=pods_rl.engines.verl.replay_buffer.PODSCheckpointCallback")
    straight, _, _ = planned_run(*overrides)
    run_steps(straight, 4)

    first, _, _ = planned_run(*overrides)
    run_steps(first, 2)
    folder = tmp_path / "ckpt" / "global_step_2"
    folder.mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    first.checkpoint_callback.on_save(trainer=first, global_step=2, checkpoint_dir=str(folder), async_save=False)
    position = first._fetch_one_gen_batch.position  # verl restores its dataloader from data.pt
    resumed, _, _ = planned_run(*overrides, position=position)
    run_steps(resumed, 2, start=3)

    assert budget_state(resumed.replay_buffer) == budget_state(straight.replay_buffer)
    assert budget_state(first.replay_buffer) != budget_state(straight.replay_buffer)  # the comparison can fail
    assert len(straight.replay_buffer.ledger) == 8


REFUSALS = [  # (overrides beyond PODS's, phrases of the one line), each refused when verl builds the buffer
    ([KW + "rollout_planner=reinforce_ada", "reward.reward_model.enable=True",
      "reward.reward_model.enable_resource_pool=False"],
     ["needs each rollout's reward when it is sampled", "enable_resource_pool=True"]),
    ([KW + "prompt_planner=greso", "data.gen_batch_size=4"], ["data.gen_batch_size=1"]),
    ([KW + "prompt_planner=pilot_commit", KW + "prompt_planner_args={buffer_max_off_steps:2}"],
     ["buffer_max_off_steps=2", "commits each pilot that passes as soon as it is scored", "set it to 0"]),
    ([KW + "prompt_planner=pilot_commit", KW + "prompt_planner_args={n_explore:1,n_commit:2}"],
     ["n_explore=1 + n_commit=2 must make"]),
    ([KW + "prompt_planner=pilot_commit", KW + "rollout_planner=knapsack"], ["decides how many rollouts", "drop"]),
    ([KW + "prompt_planner=pilot_commit", "reward.reward_model.enable=True",
      "reward.reward_model.enable_resource_pool=False"], ["judges each pilot", "enable_resource_pool=True"]),
    ([KW + "rollout_planner=knapsack", KW + "rollout_planner_args={max_n:4}"], ["max_n=4", "above 4"]),
    ([KW + "rollout_planner=knapsack", KW + "rollout_planner_args={alpha:2}"], ["Knapsack-RL alpha"]),
    ([KW + "rollout_planner=reinforce_ada", KW + "rollout_planner_args={round_repeat:8}"], ["round_repeat", "drop"]),
    ([KW + "rollout_planner=reinforce_ada", KW + "rollout_planner_args={max_rounds:0}"], ["max_rounds"]),
    ([KW + "rollout_planner=dapo"], ["rollout_planner='dapo'", "knapsack"]),
    ([KW + "prompt_planner=greso", KW + "refill_rounds=-1"], ["refill_rounds must be an integer >= 0"]),
]


@pytest.mark.parametrize("overrides, phrases", REFUSALS)
def test_what_verl_cannot_meet_is_refused_in_one_line(overrides, phrases):
    from planner_lane import MANAGER
    from verl_lane import make_trainer

    base = [o for o in _base() if not any(o.startswith(x.split("=")[0] + "=") for x in overrides)]
    with pytest.raises(ValueError) as excinfo:
        make_trainer(*base, "data.gen_batch_size=1", MANAGER, *overrides)
    message = str(excinfo.value)
    assert "\n" not in message and all(phrase in message for phrase in phrases), message


def test_planners_without_the_manager_and_a_manager_without_the_buffer_are_refused():
    from verl_lane import make_trainer, verl_config

    from pods_rl.engines.verl.agent_loop import PODSAgentLoopManager

    with pytest.raises(ValueError) as excinfo:
        make_trainer(*_base(*KNAPSACK))
    assert "agent_loop_manager_class=pods_rl.engines.verl.agent_loop.PODSAgentLoopManager" in str(excinfo.value)
    with pytest.raises(ValueError) as excinfo:
        PODSAgentLoopManager(config=verl_config(*_base()), llm_client=None)
    assert "no PODS buffer was built from this config" in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_verls_task_runner_hands_the_manager_its_trainers_buffer(monkeypatch):
    """The one wiring verl leaves to PODS (``agent_loop.task_runner_buffer``): verl's own
    ``TaskRunnerV1.init_agent_loop_manager`` creates PODS's manager, which is handed the trainer's PODS buffer; a
    trainer without one is refused in one line."""
    from planner_lane import MANAGER
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl_lane import make_trainer

    from pods_rl.engines.verl.agent_loop import PODSAgentLoopManager

    async def no_workers(self):  # verl's workers need an LLM server
        self.agent_loop_workers = []

    monkeypatch.setattr(PODSAgentLoopManager, "_init_agent_loop_workers", no_workers)
    runner = TaskRunnerV1.__ray_actor_class__()
    runner.trainer = make_trainer(*_base(*GRESO), "data.gen_batch_size=1", MANAGER)
    runner.config = runner.trainer.config
    runner.trainer.get_llm_client = runner.trainer.get_reward_handles = lambda: None  # no servers, no reward workers
    runner.init_agent_loop_manager()
    assert type(runner.agent_loop_manager) is PODSAgentLoopManager
    assert runner.agent_loop_manager.buffer is runner.trainer.replay_buffer
    runner.trainer.replay_buffer = None
    with pytest.raises(ValueError) as excinfo:
        runner.init_agent_loop_manager()
    assert "no PODS buffer was built from this config" in str(excinfo.value) and "\n" not in str(excinfo.value)
