"""The rollout-budget planners (pods_rl.budget.planners):
each against fixed decisions of the authors' released code, the
common Plan shape and registry, one-line setting errors, determinism, and exact resume.

The expected values marked "their code" were computed by running the authors' functions on these inputs with
benchmarks/budget_crosscheck.py's loader (`extract`: the function's source cut from their file and run as is):
GRESO Infini-AI-Lab/GRESO@b277843 (verl/trainer/ttis/presampling_selector.py: DataProfiler's easy/hard
probabilistic skip, read at a uniform draw just below/above the value); Knapsack-RL liziniu/KnapsackRL@ca5d5f5
(verl/trainer/ppo/exploration_utils.py: sampling_budget_by_knapsack, numpy path); Reinforce-Ada
RLHFlow/Reinforce-Ada@05be605 (the round loop of ray_trainer.py as transcribed in the script, and
core_algos.compute_grpo_outcome_advantage); Pilot-Commit databricks/pilot-commit@6def20e (recipe/pc:
RayPCTrainer.filter_batch / exclude_batch, ReplayBuffer._sample_by_variance / _sample_by_recent).
"""

import pytest
import torch

from pods_rl.adaptive import plan_round, register_adaptive_rule
from pods_rl.budget.ledger import LedgerSettings, PromptLedger
from pods_rl.budget.planners import (
    GresoSettings,
    GresoSkip,
    KnapsackAllocation,
    KnapsackSettings,
    PilotCommit,
    PilotCommitSettings,
    ReinforceAda,
    ReinforceAdaSettings,
    available_planners,
    budget_registry,
    dapo_keep_groups,
    knapsack_allocation,
    make_planner,
    pilot_keep,
    preset,
    register_planner,
)
from pods_rl.downsample import downsample, register_rule
from pods_rl.selection import SelectionSettings, select

STANDARD = {"pods/plan_prompts", "pods/plan_rollouts", "pods/rollouts_per_prompt_mean", "pods/rollouts_per_prompt_min",
            "pods/rollouts_per_prompt_max", "pods/prompts_skipped", "pods/prompts_deferred", "pods/prompts_evicted"}

# Group means GRESO's trainer logs per prompt (DataProfiler traces), and a group of 4 rewards with that mean.
TRACES = [[1.0, 1.0, 1.0], [0.1, 0.0], [0.1, 0.5, 0.0], [1.0] * 10, [1.0, 0.5], [0.0, 1.0]]
GROUP = {1.0: [1.0] * 4, 0.1: [0.1] * 4, 0.0: [0.0] * 4, 0.5: [1.0, 0.0, 1.0, 0.0]}


def greso_ledger():
    ledger = PromptLedger(LedgerSettings(success_threshold=None, success_max=1.0))
    for prompt, trace in enumerate(TRACES):
        for step, mean in enumerate(trace):
            ledger.record(torch.tensor([prompt]), torch.tensor([GROUP[mean]]), step=step)
    return ledger


@pytest.mark.parametrize("p_easy, p_hard, expected", [
    (0.5, 0.5, [0.875, 0.75, 0.5, 0.99, 0.0, 0.5]),  # their code
    (0.3, 0.8, [0.973, 0.36, 0.2, 0.99, 0.0, 0.7]),  # their code
])
def test_greso_skip_probability_is_their_codes(p_easy, p_hard, expected):
    planner = GresoSkip(GresoSettings(p_easy=p_easy, p_hard=p_hard))
    plan = planner.plan(torch.arange(6), greso_ledger(), n=8)
    assert plan.extra["skip_probability"].tolist() == pytest.approx(expected, abs=1e-12)
    assert plan.extra["easy"].tolist() == [True, False, False, True, False, True]
    assert plan.extra["hard"].tolist() == [False, True, True, False, False, False]


def test_greso_decisions_are_reproducible_and_skip_at_the_planned_rate():
    ledger, planner = greso_ledger(), GresoSkip()
    ids = torch.tensor([1] * 4000 + [4] * 10)  # prompt 1: P(skip) 0.75; prompt 4: its last group was mixed
    plans = [planner.plan(ids, ledger, n=8, generator=torch.Generator().manual_seed(s)) for s in (3, 3, 4)]
    assert torch.equal(plans[0].skipped, plans[1].skipped) and not torch.equal(plans[0].skipped, plans[2].skipped)
    assert plans[0].skipped[:4000].double().mean().item() == pytest.approx(0.75, abs=0.03)
    assert not plans[0].skipped[4000:].any()
    assert torch.equal(plans[0].rollouts, torch.where(plans[0].skipped, 0, 8))
    assert plans[0].metrics["pods/prompts_skipped"] == plans[0].metrics["pods/prompts_skipped_hard"] > 2900


def test_greso_adapts_its_probabilities_as_their_trainer_does():
    """From epoch 1 on, per step: share of all-success groups >= 0.25/3 -> p_easy - 0.01, else + 0.01; share of
    no-success groups >= 0.25*2/3 -> p_hard - 0.01, else + 0.01 (ray_trainer.py, 'adjust exploration factor')."""
    planner = GresoSkip()
    ledger = PromptLedger(LedgerSettings(success_threshold=None, success_max=1.0))
    easy, hard, mixed = [1.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 0.0]
    steps = [(0, [easy, hard]), (1, [easy, hard, mixed]), (1, [mixed] * 12 + [easy]), (2, [mixed] * 5 + [hard])]
    trajectory = []
    for step, (epoch, groups) in enumerate(steps):
        summary = ledger.record(torch.arange(len(groups)), torch.tensor(groups), step=step)
        planner.update(summary, epoch=epoch)
        trajectory.append((round(planner.p_easy, 10), round(planner.p_hard, 10)))
    # epoch 0 never adapts; 1/13 of easy groups is under 1/12: p_easy rises; 1/6 hard is >= 1/6: p_hard falls
    assert trajectory == [(0.5, 0.5), (0.49, 0.49), (0.5, 0.5), (0.51, 0.49)]
    planner.p_easy = 0.055
    planner.update(ledger.record(torch.arange(2), torch.tensor([easy, easy]), step=9), epoch=3)
    assert planner.p_easy == 0.05  # never below min_p


def test_greso_takes_each_batchs_share_in_float32_as_their_trainer_does():
    """Their trainer: per sampled batch, share = (count / groups) in float32 (compute_reward_metrics), weighted by the
    batch's rows; a step of batches of 2, 12 and 8 groups with 1, 5 and 5 no-success groups has the share
    0.4999999946 there (float32 5/12), not 0.5: under a target of exactly 0.5, p_hard rises. One batch of 11 of 22
    groups (0.5 exactly) falls. p_easy: 0 all-success groups, under its target (0.25): rises both times."""
    settings = GresoSettings(target_zero_variance=0.75)  # p_hard's target: 0.75 * 2 / 3 == 0.5 exactly
    assert settings.target_zero_variance * 2 / 3 == 0.5
    ledger = PromptLedger(LedgerSettings(success_threshold=None, success_max=1.0))
    hard, mixed = GROUP[0.0], GROUP[0.5]
    batches = [[hard] * 1 + [mixed] * 1, [hard] * 5 + [mixed] * 7, [hard] * 5 + [mixed] * 3]
    summaries = [ledger.record(torch.arange(len(b)) + 100 * i, torch.tensor(b), step=0)
                 for i, b in enumerate(batches)]
    planner = GresoSkip(settings)
    metrics = planner.update(summaries, epoch=1)
    assert metrics["pods/greso_too_hard_ratio"] == pytest.approx(0.4999999946, abs=1e-10)
    assert metrics["pods/greso_too_hard_ratio"] < 0.5
    assert (planner.p_hard, planner.p_easy) == (0.51, 0.51)
    one_batch = GresoSkip(settings)
    one_batch.update(ledger.record(torch.arange(22) + 1000, torch.tensor([hard] * 11 + [mixed] * 11), step=1), epoch=1)
    assert (one_batch.p_hard, one_batch.p_easy) == (0.49, 0.51)


def test_greso_resumes_exactly(tmp_path):
    ledger, planner = greso_ledger(), GresoSkip()
    planner.update(ledger.record(torch.tensor([0, 1]), torch.tensor([GROUP[1.0], GROUP[0.0]]), step=20), epoch=4)
    ledger.save(tmp_path / "ledger.pt")
    torch.save(planner.state_dict(), tmp_path / "greso.pt")
    restored, again = PromptLedger.load(tmp_path / "ledger.pt"), GresoSkip()
    again.load_state_dict(torch.load(tmp_path / "greso.pt", weights_only=True))
    for seed in range(5):
        a = planner.plan(torch.arange(8).repeat(50), ledger, n=4, generator=torch.Generator().manual_seed(seed))
        b = again.plan(torch.arange(8).repeat(50), restored, n=4, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(a.skipped, b.skipped) and a.metrics == b.metrics


# Knapsack-RL: (success rates, estimated, knobs) -> their sampling_budget_by_knapsack's allocation.
KNAPSACK_CASES = [
    ([0.5, 0.125, 0.875, 0.0, 1.0, 0.0, 0.25, 0.25], [1, 1, 1, 1, 1, 0, 1, 1], dict(n=8, min_n=2, max_n=16), None,
     [7, 16, 4, 2, 2, 8, 13, 12]),
    ([0.5, 0.5, 0.0, 0.0, 1.0], [1] * 5, dict(n=16, min_n=2, max_n=32), None, [5, 5, 34, 34, 2]),  # fallback
    ([0.3, 0.7, 0.05, 0.95, 0.5, 0.5], [1] * 6, dict(n=8, min_n=2, max_n=16, cost_estimation="expectation",
                                                     allow_fallback=False), 58, [13, 11, 16, 2, 8, 8]),
    ([0.25] * 5, [1] * 5, dict(n=4, min_n=1, max_n=8, allow_fallback=False), 22, [5, 5, 4, 4, 4]),  # ties: first
    ([0.25] * 5, [1] * 5, dict(n=4, min_n=1, max_n=8, allow_fallback=False), 26, [6, 5, 5, 5, 5]),
    ([0.25, 0.75, 0.25, 0.75], [1] * 4, dict(n=4, min_n=1, max_n=8, allow_fallback=False), 15, [5, 3, 5, 2]),
    # no mixed prompt: the budget left goes to p = 0 and to prompts not estimated (their code keeps those at 0)
    ([0.0, 1.0, 0.0, 0.0], [1, 1, 0, 1], dict(n=8, min_n=2, max_n=16), None, [8, 2, 14, 8]),
]


@pytest.mark.parametrize("rates, estimated, knobs, total, expected", KNAPSACK_CASES)
def test_knapsack_allocation_is_their_codes(rates, estimated, knobs, total, expected):
    n = knobs.pop("n")
    counts, _ = knapsack_allocation(torch.tensor(rates), torch.tensor(estimated, dtype=torch.bool), n, total,
                                    KnapsackSettings(**knobs))
    assert counts.tolist() == expected
    assert counts.sum().item() == (len(rates) * n if total is None else total)


def test_knapsack_plans_from_the_ledger_and_refuses_a_budget_below_the_floors():
    ledger = PromptLedger()
    rows = [[1] * 16, [1] * 8 + [0] * 8, [0] * 16, [1] * 4 + [0] * 12, [1, 0]]  # the last: too few to estimate
    ledger.record(torch.arange(5), torch.tensor([r + [float("nan")] * (16 - len(r)) for r in rows]),
                  torch.tensor([len(r) for r in rows]), step=0)
    ledger.evict(torch.tensor([6]))
    plan = KnapsackAllocation().plan(torch.arange(7), ledger, n=8)
    assert plan.extra["estimated"].tolist() == [True, True, True, True, False, False, False]
    assert plan.extra["success_rate"].tolist()[:5] == [1.0, 0.5, 0.0, 0.25, 0.5]
    assert plan.rollouts[6] == 0 and plan.evicted.tolist() == [False] * 6 + [True]
    # Floors 2 (estimated) and n = 8 (not estimated); the two mixed prompts cost 3 + 8 < the 32 left, so the
    # surplus 21 goes evenly to the "p = 0" prompts, which in their code include those not estimated; the knapsack
    # then splits the 11 left between prompts 1 and 3. (The evicted prompt's share stays in the total.)
    assert plan.rollouts.tolist() == [2, 6, 9, 9, 15, 15, 0]
    assert STANDARD <= set(plan.metrics) and plan.metrics["pods/knapsack_effective"] == 2
    with pytest.raises(ValueError, match="total_budget=10 is below the rollouts the prompts get anyway"):
        KnapsackAllocation().plan(torch.arange(7), ledger, n=8, total_budget=10)


# Reinforce-Ada: rewards of 4 prompts over 2 rounds of 4, m = 4, positive = reward > 0.7.
RA_REWARDS = [[1, 0, 1, 0.5, 1, 1, 1, 1], [0, 0, 0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1],
              [0.5, 0, 0, 0, 0, 0, 0, 0]]


def run_rounds(planner, rewards):
    full = torch.tensor(rewards, dtype=torch.float64)
    counts = torch.zeros(len(rewards), dtype=torch.long)
    mask = lambda: torch.where(torch.arange(full.shape[1]) < counts.unsqueeze(1), full, float("nan"))  # noqa: E731
    while (more := planner.plan_round(mask(), counts)).any():
        counts += more
    return mask(), counts


@pytest.mark.parametrize("choice, counts", [("balanced", [4, 8, 8, 8]), ("positive_focused", [4, 8, 4, 8])])
@pytest.mark.parametrize("norm, advantages", [
    (False, [[0.5, -0.5, 0.5, 0.0], [-0.125, -0.125, -0.125, 0.875], [0.0] * 4, [0.5, 0.0, 0.0, 0.0]]),
    (True, [[0.8660238981246948, -0.8660238981246948, 0.8660238981246948, 0.0],
            [-0.35355237126350403, -0.35355237126350403, -0.35355237126350403, 2.4748666286468506], [0.0] * 4,
            [250000.0, 0.0, 0.0, 0.0]]),  # an all-negative group whose rewards vary below the threshold: std eps
])
def test_reinforce_ada_rounds_keep_and_baseline_are_their_codes(choice, counts, norm, advantages):
    planner = ReinforceAda(ReinforceAdaSettings(reinforce_ada_choice=choice, max_rounds=2, round_repeat=4,
                                                final_keep_per_prompt=4, norm_adv_by_std_in_grpo=norm))
    rewards, got_counts = run_rounds(planner, RA_REWARDS)
    assert got_counts.tolist() == counts
    kept = planner.keep(rewards, got_counts)
    assert kept.tolist() == [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert planner.advantages(rewards, got_counts, kept).tolist() == advantages


def test_reinforce_ada_local_baseline_sums_the_kept_rewards_in_their_row_order():
    """global_stat_est=False: their code averages the kept scores in its row order, positives first (pos[:k] +
    neg[:k]); for rewards [0.3, 0.3, 0.3, 0.71], keep 4, the positive's advantage is 0.71 - mean = 0.30750000 in
    float32 there (0.30749997 in rollout order), and the negatives' -0.10249996."""
    planner = ReinforceAda(ReinforceAdaSettings(max_rounds=1, round_repeat=4, final_keep_per_prompt=4,
                                                global_stat_est=False))
    rewards, counts = torch.tensor([[0.3, 0.3, 0.3, 0.71]]), torch.tensor([4])
    kept = planner.keep(rewards, counts)
    assert kept.tolist() == [[0, 1, 2, 3]]  # returned ascending; the baseline still sums in their order
    advantages = planner.advantages(rewards, counts, kept)
    scores = torch.tensor([0.71, 0.3, 0.3, 0.3])  # their rows
    theirs = (scores - scores.mean())[[1, 2, 3, 0]]
    assert torch.equal(advantages[0], theirs)
    assert f"{advantages[0, 3].item():.8f}" == "0.30750000"
    assert f"{advantages[0, 0].item():.8f}" == "-0.10249996"


def test_reinforce_ada_plugs_into_the_adaptive_rounds_and_the_rules(scratch_registry, monkeypatch):
    import importlib

    adaptive = importlib.import_module("pods_rl.adaptive")
    monkeypatch.setattr(adaptive, "_RULES", adaptive._RULES.copy())  # registered here, gone after the test
    planner = ReinforceAda(ReinforceAdaSettings(max_rounds=2, round_repeat=4, final_keep_per_prompt=4))
    register_adaptive_rule("test_reinforce_ada", planner.as_adaptive_rule(), overwrite=True)
    register_rule("test_reinforce_ada_keep", planner.as_downsample_rule(), overwrite=True)
    rewards, counts = run_rounds(planner, RA_REWARDS)
    assert plan_round(rewards, torch.full((4,), 4), 4, 8, 4, "test_reinforce_ada").tolist() == [0, 4, 4, 4]
    with pytest.raises(ValueError, match="num_generations = 8"):
        plan_round(rewards, torch.full((4,), 4), 4, 8, 2, "test_reinforce_ada")
    full = torch.tensor(RA_REWARDS, dtype=torch.float64)
    assert downsample(full, 4, "test_reinforce_ada_keep").tolist() == planner.keep(full, torch.full((4,), 8)).tolist()
    plan = planner.plan(torch.arange(3), PromptLedger(), n=8)
    assert plan.rollouts.tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="set num_generations to 8"):
        planner.plan(torch.arange(3), PromptLedger(), n=16)


# Pilot-Commit: 7 prompts piloted with 8 rollouts, k of them successes.
PILOT = {10: 0, 11: 1, 12: 2, 13: 4, 14: 6, 15: 7, 16: 8}


def pilot_rewards(successes, n=8):
    return torch.tensor([[1.0] * k + [0.0] * (n - k) for k in successes])


def test_pilot_commit_verdicts_and_buffer_order_are_their_codes(tmp_path):
    ledger, planner = PromptLedger(), PilotCommit()
    verdict = planner.after_pilot(torch.tensor(list(PILOT)), pilot_rewards(PILOT.values()), None, ledger, step=0)
    ids = torch.tensor(list(PILOT))
    # their filter_batch: pass [11, 12, 13, 14], 2 too correct, 1 too incorrect; exclude_batch: [16]
    assert ids[verdict.extra["passed"]].tolist() == [11, 12, 13, 14]
    assert ids[verdict.skipped].tolist() == [15, 16] and ids[verdict.deferred].tolist() == [10]
    assert ids[verdict.evicted].tolist() == [16] and ledger.stats(ids).evicted.tolist() == [False] * 6 + [True]
    assert verdict.metrics["pods/prompts_deferred"] == 1 and verdict.rollouts.sum() == 0
    planner.after_pilot(torch.tensor([14]), pilot_rewards([6]), None, ledger, step=1)  # re-piloted: newer step
    state = planner.state_dict()
    # their _sample_by_variance: std 0.5 first, then the two of std 0.433 by step (14: step 1) -> [13, 14, 12]
    commit = planner.commit(3)
    assert commit.ids.tolist() == [13, 14, 12] and commit.rollouts.tolist() == [24] * 3
    assert commit.extra["pilot_step"].tolist() == [0, 1, 0] and planner.buffered.tolist() == [11]
    again = PilotCommit(PilotCommitSettings(buffer_sampling_method="most_recent"))
    again.load_state_dict(state)
    assert again.commit(2).ids.tolist() == [14, 11]  # their _sample_by_recent
    assert PilotCommit().plan(ids, ledger, n=32).rollouts.tolist() == [8] * 6 + [0]  # 16 was evicted


def test_pilot_commit_flushes_stale_pilots_and_keeps_balanced_pilot_rollouts():
    ledger, planner = PromptLedger(), PilotCommit(PilotCommitSettings(buffer_max_off_steps=2))
    for step in range(4):
        planner.after_pilot(torch.tensor([step]), pilot_rewards([4]), None, ledger, step=step)
    assert planner.flush(4).tolist() == [0, 1] and planner.buffered.tolist() == [2, 3]
    successes = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], [1] * 8])
    kept = pilot_keep(successes, 4, generator=torch.Generator().manual_seed(0))
    assert successes.gather(1, kept).sum(1).tolist() == [2, 1, 4]
    assert torch.equal(kept, pilot_keep(successes, 4, generator=torch.Generator().manual_seed(0)))


def test_dapo_preset_trains_on_the_groups_dapo_keeps():
    assert preset("dapo", num_generations=8) == {"oversample_prompts": 3.0, "downsample_to": 8}
    overrides = preset("dapo", num_generations=4)
    settings = SelectionSettings.validated(overrides["downsample_to"],
                                           oversample_prompts=overrides["oversample_prompts"])
    generator = torch.Generator().manual_seed(0)
    for mixed_share in (0.2, 0.6):
        rewards = (torch.rand(12, 4, generator=generator) < 0.5).double()
        rewards[torch.rand(12, generator=generator) > mixed_share] = 1.0  # many all-equal groups
        B = settings.sampled_prompts(4) // 3
        selection = select(rewards.unsqueeze(2), torch.ones(1), B, settings)
        dapo = set(dapo_keep_groups(rewards, B).tolist())
        varied = rewards.amax(1) > rewards.amin(1)
        if len(dapo) < B:  # DAPO would sample again; pods-rl trains on every varied group DAPO has
            assert dapo <= set(selection.groups.tolist())
        else:
            assert bool(varied[selection.groups].all()) and len(selection.groups) == len(dapo)


def test_the_registry_lists_every_kind_and_builds_planners_by_name():
    registry = budget_registry()
    assert registry["which_prompts"] == ["greso", "pilot_commit"] == available_planners("which_prompts")
    assert registry["how_many"] == ["auto", "cgrpo", "knapsack", "reinforce_ada"]
    assert "until_mixed" in registry["how_many_rounds"] and "max_variance" in registry["which_rollouts"]
    assert make_planner("greso", p_easy=0.3).settings.p_easy == 0.3
    with pytest.raises(ValueError, match=r"planner 'greso' has no setting 'p'; its settings are \['p_easy'"):
        make_planner("greso", p=0.3)
    with pytest.raises(ValueError, match="unknown planner 'nope'"):
        make_planner("nope")
    with pytest.raises(ValueError, match="kind in"):
        register_planner("bad", type("Bad", (), {}))
    with pytest.raises(ValueError, match="already registered"):
        register_planner("greso", GresoSkip)
    assert register_planner("greso", GresoSkip, overwrite=True) is GresoSkip


@pytest.mark.parametrize("name, knobs, message", [
    ("greso", dict(p_easy=0.99), r"GRESO p_easy must be a number in \[0.05, 0.95\], got 0.99; keep it in"),
    ("greso", dict(target_zero_variance=0), "target_zero_variance must be a number in"),
    ("knapsack", dict(max_n=1), "Knapsack-RL max_n must be an integer in|Knapsack-RL max_n must be an integer >= 2"),
    ("knapsack", dict(cost_estimation="mean"), r"cost_estimation must be one of \['probability', 'expectation'\]"),
    ("reinforce_ada", dict(reinforce_ada_choice="greedy"), "reinforce_ada_choice must be one of"),
    ("reinforce_ada", dict(max_rounds=0), "max_rounds must be an integer >= 1"),
    ("pilot_commit", dict(diversity_threshold_upper=0.5, diversity_threshold_lower=0.6), "or no prompt can pass"),
    ("pilot_commit", dict(n_explore_effective=9), r"n_explore_effective must be an integer in \[1, 8\]"),
])
def test_bad_settings_are_one_line_naming_the_knob(name, knobs, message):
    with pytest.raises(ValueError, match=message):
        make_planner(name, **knobs)


@pytest.mark.parametrize("name", ["greso", "knapsack", "reinforce_ada", "pilot_commit", "cgrpo"])
def test_every_planner_returns_the_same_plan_shape(name):
    planner = make_planner(name)
    ledger = greso_ledger()
    n = {"reinforce_ada": 32, "pilot_commit": 32, "cgrpo": 32}.get(name, 8)
    plan = planner.plan(torch.arange(9), ledger, n=n, generator=torch.Generator().manual_seed(1))
    for mask in (plan.rollouts, plan.skipped, plan.deferred, plan.evicted):
        assert mask.shape == (9,)
    assert plan.rollouts.dtype == torch.long and STANDARD <= set(plan.metrics)
    assert plan.metrics["pods/plan_rollouts"] == plan.rollouts.sum().item()
    assert planner.kind in ("which_prompts", "how_many") and isinstance(planner.state_dict(), dict)


def test_the_crosscheck_script_loads_functions_and_methods_from_source():
    """benchmarks/budget_crosscheck.py runs the authors' functions cut from their files; its loader and its imports
    of our API stay in working order here (the authors' repositories are not needed for this)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "budget_crosscheck.py"
    spec = importlib.util.spec_from_file_location("budget_crosscheck", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    source = ("import verl.heavy\n\n@register('x')\ndef twice(x: Optional[int]) -> int:\n    return 2 * helper(x)\n\n"
              "def helper(x):\n    return x + 1\n\nclass Trainer(Base):\n    def score(self, v):\n"
              "        return np.mean(v)\n")
    shared = {}
    script.extract(source, "helper", namespace=shared)
    assert script.extract(source, "twice", namespace=shared)(3) == 8  # decorator dropped, helper shared
    assert script.extract(source, "score", cls="Trainer")(None, [1.0, 2.0]) == 1.5
    tally = script.Tally()
    tally.add("a", True)
    tally.add("a", False, documented=True)
    assert tally.report()
    tally.add("a", False)
    assert not tally.report()


@pytest.mark.parametrize("normalize", [False, True])
def test_the_trainer_sampled_baseline_is_reinforce_adas_on_binary_rewards(normalize):
    """PODSTrainer's advantage_baseline=sampled (``sampled_baseline_advantages``) gives Reinforce-Ada's advantages
    (``global_stat_est``) on 0/1 rewards: mean #positive / #all over every sampled rollout; with the std, the same
    up to where the two put their epsilon (TRL's 1e-4 added; the code's 1e-6 clamp and add)."""
    from pods_rl.advantages import sampled_baseline_advantages

    generator = torch.Generator().manual_seed(3)
    P, n, m = 64, 12, 4
    counts = torch.randint(m, n + 1, (P,), generator=generator)
    rewards = (torch.rand(P, n, generator=generator) < torch.rand(P, 1, generator=generator)).float()
    rewards[torch.arange(n) >= counts.unsqueeze(1)] = float("nan")
    ada = ReinforceAda(ReinforceAdaSettings(max_rounds=3, round_repeat=4, final_keep_per_prompt=m,
                                            norm_adv_by_std_in_grpo=normalize))
    kept = ada.keep(rewards, counts)  # (P, m)
    theirs = ada.advantages(rewards, counts, kept)  # (P, m)
    rows = (kept + n * torch.arange(P).unsqueeze(1)).flatten()
    ours = sampled_baseline_advantages(rewards, rows, scale=normalize).view(P, m)
    mixed = (rewards == 1).any(dim=1) & (rewards == 0).any(dim=1)  # (all-equal groups: 0 in both)
    torch.testing.assert_close(ours[mixed], theirs[mixed], rtol=1e-3 if normalize else 1e-6, atol=1e-6)
    assert bool((ours[~mixed] == 0).all())
