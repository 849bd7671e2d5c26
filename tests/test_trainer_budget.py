"""The rollout-budget planners in PODSTrainer (pods_rl.budget): GRESO's skip and Knapsack-RL's allocation
decide which candidates get rollouts and how many; the prompt ledger records every scored group and resumes exactly
from a checkpoint; bad settings are refused in one line before any model loads."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from pods_rl.budget.ledger import LEDGER_FILE
from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer

N, M, B = 4, 2, 2  # rollouts sampled per prompt (at most), kept per prompt, kept groups per step


def solved_by_parity(prompts, completions, **kwargs):
    """Even prompts are always solved (all-equal: nothing to learn), odd ones half the time (by the text)."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        i = int(prompt[-1]["content"].split("+")[0].split()[-1])
        text = completion[0]["content"] if isinstance(completion, list) else completion
        out.append(1.0 if i % 2 == 0 else float(sum(map(ord, text)) % 2))
    return out


def dataset(rows=16):
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+{i}="}] for i in range(rows)]})


def config(tmp_path, **overrides):
    args = dict(output_dir=str(tmp_path / "out"), use_cpu=True, seed=1, learning_rate=1e-2, max_steps=4,
                max_completion_length=4, num_generations=N, downsample_to=M, per_device_train_batch_size=B * M,
                logging_steps=1, report_to="none", save_strategy="no", beta=0.0, bf16=False,
                dataloader_num_workers=0, shuffle_dataset=False)
    args.update(overrides)
    return PODSConfig(**args)


def trainer_for(tmp_path, model_dir, **overrides):
    return PODSTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=[solved_by_parity],
                       args=config(tmp_path, **overrides), train_dataset=dataset(),
                       processing_class=AutoTokenizer.from_pretrained(model_dir))


def logged(trainer, key):
    return [row[key] for row in trainer.state.log_history if key in row]


def test_greso_skips_prompts_it_has_seen_all_equal(tmp_path, tiny_model_dir):
    """Two epochs over 8 prompts (4 candidates, 2 kept groups per step): in the second, the even prompts (always
    solved in the first) are skipped with GRESO's probability, and only the kept groups' rollouts are generated."""
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          reward_funcs=[solved_by_parity], train_dataset=dataset(8),
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                          args=config(tmp_path, prompt_planner="greso", oversample_prompts=2.0, max_steps=8,
                                      prompt_planner_args={"p_easy": 0.05, "min_p": 0.05, "adapt_from_epoch": 99}))
    trainer.train()
    sampled = logged(trainer, "pods/rollouts_sampled")
    assert sampled == [B * N] * 8  # two of the four candidates generated, every step
    skipped = logged(trainer, "pods/prompts_skipped")
    assert sum(skipped[:2]) == 0  # the first epoch knows nothing yet
    assert sum(skipped[2:]) > 0  # the second skips the prompts it saw all-equal
    ledger = trainer._budget.ledger
    assert len(ledger.ids) >= 4 and int(ledger.stats(ledger.ids).groups.sum()) == B * 8


def test_knapsack_spends_its_budget_between_m_and_n(tmp_path, tiny_model_dir):
    trainer = trainer_for(tmp_path, tiny_model_dir, rollout_planner="knapsack", adaptive_budget=3.0,
                          rollout_planner_args={"min_buffer_length": 1, "reward_buffer_length": 4})
    trainer.train()
    sampled = logged(trainer, "pods/rollouts_sampled")
    assert all(B * M <= s <= B * N for s in sampled) and sum(sampled) <= 4 * B * 3 + 1, sampled
    assert logged(trainer, "pods/rollouts_per_prompt_min") and min(logged(trainer, "pods/rollouts_per_prompt_min")) >= M


def test_auto_measures_its_costs_and_plans_between_m_and_n(tmp_path, tiny_model_dir):
    """The phase clock feeds auto: after its warm-up it logs the measured costs, probes while it knows no slope,
    and every plan lies in [m, n]; its cost window and probe counters go into the checkpoint's ledger file."""
    trainer = trainer_for(tmp_path, tiny_model_dir, rollout_planner="auto", max_steps=6, save_strategy="steps",
                          save_steps=6, rollout_planner_args={"warmup_steps": 1, "probe_gap": 2})
    trainer.train()
    sampled = logged(trainer, "pods/rollouts_sampled")
    assert len(sampled) == 6 and all(B * M <= s <= B * N for s in sampled), sampled
    assert logged(trainer, "pods/auto_warmup")[0] == 1.0 and logged(trainer, "pods/auto_probe")[1] == 1.0
    assert sampled[1] == B * N  # the probe: every prompt at n
    assert all(ms > 0 for ms in logged(trainer, "pods/auto_sample_ms") + logged(trainer, "pods/auto_train_ms"))
    saved = torch.load(tmp_path / "out" / "checkpoint-6" / LEDGER_FILE, weights_only=True)["how_many"]
    assert saved["plans"] == 6 and saved["probes"] >= 2 and len(saved["costs"]["sampled"]) == 6


def test_auto_at_m_runs_grpos_own_step_and_still_records(tmp_path, tiny_model_dir):
    """Where auto gives every prompt m (sampling priced far above any gain), the step is GRPOTrainer's own on each
    prompt's m rows: no selection ran (its metrics absent), yet the ledger holds every group and the planner its N;
    the plan comes first, so no prompt is prepared for the n rows a sampling step would have (TRL prepares the m)."""
    trainer = trainer_for(tmp_path, tiny_model_dir, rollout_planner="auto",
                          rollout_planner_args={"sample_ms": 1e6, "train_ms": 1.0})
    prepared = []
    trainer._rollout_prompts = lambda inputs: prepared.append(len(inputs))
    trainer.train()
    assert prepared == []
    assert logged(trainer, "pods/rollouts_sampled") == [B * M] * 4 and logged(trainer, "pods/auto_n_max") == [M] * 4
    assert not logged(trainer, "pods/frac_zero_std_kept")  # select() never ran
    stats = trainer._budget.ledger.stats(trainer._budget.ledger.ids)
    assert int(stats.groups.sum()) == B * 4 and int(stats.rollouts.sum()) == B * M * 4
    assert [row[0] for row in trainer._budget.how_many.costs.sampled] == [B * M] * 4  # the phase clock's N
    grpo = trainer_for(tmp_path / "grpo", tiny_model_dir, num_generations=M)  # GRPO with m, the same seed and data
    grpo.train()
    for key in ("reward", "loss", "completions/mean_length"):  # GRPO's trajectory, step for step
        assert logged(trainer, key) == logged(grpo, key) and len(logged(grpo, key)) == 4, key


def always_right(completions, **kwargs):
    """1.0 for every completion: beside solved_by_parity, every total is above the ledger's 0.5."""
    return [1.0] * len(completions)


def test_adaptive_reward_decides_the_ledgers_successes_under_a_planner(tmp_path, tiny_model_dir):
    """With a planner and no pilot, the ledger counts a success by adaptive_reward's reward, not by the total (on
    which always_right would make every rollout a success); a name that is not a reward function is refused."""
    counts = {}
    for decider in (None, "solved_by_parity"):
        trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                              reward_funcs=[solved_by_parity, always_right], train_dataset=dataset(),
                              processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                              args=config(tmp_path / str(decider), rollout_planner="auto", adaptive_reward=decider,
                                          max_steps=2))
        trainer.train()
        stats = trainer._budget.ledger.stats(trainer._budget.ledger.ids)
        counts[decider] = (int(stats.successes.sum()), int(stats.rollouts.sum()))
    assert counts[None][0] == counts[None][1] > 0, counts  # on the total: every rollout
    assert 0 < counts["solved_by_parity"][0] < counts["solved_by_parity"][1], counts  # odd prompts: some fail
    with pytest.raises(ValueError, match="adaptive_reward 'nope' is not one of this run's reward functions"):
        trainer_for(tmp_path / "bad", tiny_model_dir, rollout_planner="auto", adaptive_reward="nope")


def test_the_ledger_resumes_exactly(tmp_path, tiny_model_dir):
    """4 steps straight, or 2 steps, a checkpoint, and 2 more from it: the same ledger, GRESO's state and plans (its
    second epoch skips prompts: what it skips depends on the ledger of the first)."""
    def build(where, **overrides):
        return PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           reward_funcs=[solved_by_parity], train_dataset=dataset(8),
                           processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                           args=config(where, prompt_planner="greso", oversample_prompts=2.0,
                                       prompt_planner_args={"p_easy": 0.05, "min_p": 0.05}, **overrides))

    straight = build(tmp_path, save_strategy="steps", save_steps=2)
    straight.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / LEDGER_FILE).is_file()
    resumed = build(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    a, b = straight._budget.state_dict(), resumed._budget.state_dict()
    assert a["which"] == b["which"]
    for key, value in a["ledger"].items():
        other = b["ledger"][key]
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, key
    skipped = logged(straight, "pods/prompts_skipped")
    assert sum(skipped[2:]) > 0 and logged(resumed, "pods/prompts_skipped") == skipped


def test_knapsack_resumes_exactly(tmp_path, tiny_model_dir):
    """Knapsack-RL's counts come from the ledger's success rates: 4 steps straight, or 2, a checkpoint, and 2 more,
    plan the same rollouts per prompt and leave the same ledger."""
    def build(where, **overrides):  # 4 prompts, 2 per step: each comes back with a history in steps 3 and 4
        return PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           reward_funcs=[solved_by_parity], train_dataset=dataset(4),
                           processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                           args=config(where, rollout_planner="knapsack", adaptive_budget=3.0,
                                       rollout_planner_args={"min_buffer_length": 1, "reward_buffer_length": 4},
                                       **overrides))

    straight = build(tmp_path, save_strategy="steps", save_steps=2)
    straight.train()
    resumed = build(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    a, b = straight._budget.state_dict()["ledger"], resumed._budget.state_dict()["ledger"]
    for key, value in a.items():
        assert torch.equal(value, b[key]) if isinstance(value, torch.Tensor) else value == b[key], key
    for key in ("pods/rollouts_sampled", "pods/rollouts_per_prompt_min", "pods/rollouts_per_prompt_max", "loss"):
        assert logged(resumed, key) == logged(straight, key) and len(logged(straight, key)) == 4, key
    lows, highs = logged(straight, "pods/rollouts_per_prompt_min"), logged(straight, "pods/rollouts_per_prompt_max")
    assert any(low < high for low, high in zip(lows, highs)), (lows, highs)  # the ledger split the budget unevenly


def pilot_commit(where, model_dir, rows=8, **overrides):
    """Pilot-Commit with n = 4 (a pilot of 1, a commit of 3), 4 candidates per step, 2 of them committed."""
    args = dict(prompt_planner="pilot_commit", oversample_prompts=2.0,
                prompt_planner_args={"diversity_threshold_upper": 0.0, "diversity_threshold_lower": 0.0})
    args.update(overrides)
    return PODSTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=[solved_by_parity],
                       train_dataset=dataset(rows), processing_class=AutoTokenizer.from_pretrained(model_dir),
                       args=config(where, **args))


def test_pilot_commit_pilots_every_candidate_and_commits_the_batch(tmp_path, tiny_model_dir):
    """Each step pilots its candidates with 1 rollout (n // 4) and commits 2 of them to 3 more, in two rounds. A
    pilot that solves its prompt evicts it (exclude_threshold_upper 1.0): the even prompts, always solved, are all
    evicted in the first epoch; in the second, the candidates it evicted get no pilot unless the batch needs them
    (re-admitted). Only the committed groups reach selection, and the ledger holds every rollout."""
    trainer = pilot_commit(tmp_path, tiny_model_dir, max_steps=4)
    trainer.train()
    sampled, evicted = logged(trainer, "pods/rollouts_sampled"), logged(trainer, "pods/prompts_evicted")
    assert evicted[:2] == [0, 0] and all(e >= 2 for e in evicted[2:]), evicted  # 2 evens among each step's 4
    piloted = [max(B, 4 - int(e)) for e in evicted]
    assert sampled == [p * 1 + B * 3 for p in piloted], (sampled, evicted)
    assert logged(trainer, "pods/prompts_readmitted") == [p - (4 - e) for p, e in zip(piloted, evicted)]
    assert logged(trainer, "pods/rounds") == [2.0] * 4
    assert logged(trainer, "pods/prompts_committed") == [B] * 4
    assert logged(trainer, "pods/prompts_sampled") == [B] * 4  # selection sees the committed groups only
    ledger = trainer._budget.ledger
    evens = torch.tensor([prompt_id(i) for i in range(0, 8, 2)])
    assert bool(ledger.stats(evens).evicted.all())
    assert sum(logged(trainer, "pods/pilot_solved")[:2]) >= 4
    assert int(ledger.stats(ledger.ids).rollouts.sum()) == sum(sampled)  # every pilot and commit rollout
    assert len(trainer._budget.which) == 0  # nothing kept past its step


def prompt_id(i: int) -> int:
    from pods_rl.budget.ledger import prompt_key

    return prompt_key([{"role": "user", "content": f"{i}+{i}="}])


def test_pilot_commit_resumes_exactly(tmp_path, tiny_model_dir):
    """4 steps straight, or 2, a checkpoint, and 2 more: the same ledger (evictions included) and decisions."""
    straight = pilot_commit(tmp_path, tiny_model_dir, save_strategy="steps", save_steps=2)
    straight.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    resumed = pilot_commit(tmp_path / "resumed", tiny_model_dir)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    a, b = straight._budget.state_dict()["ledger"], resumed._budget.state_dict()["ledger"]
    for key, value in a.items():
        assert torch.equal(value, b[key]) if isinstance(value, torch.Tensor) else value == b[key], key
    assert bool(a["evicted"].any())
    for key in ("pods/prompts_evicted", "pods/prompts_readmitted", "pods/rollouts_sampled", "loss"):
        assert logged(resumed, key) == logged(straight, key) and len(logged(straight, key)) == 4, key


@pytest.mark.parametrize("overrides, message", [
    (dict(prompt_planner="greso"), "set oversample_prompts above 1"),
    (dict(prompt_planner="knapsack", oversample_prompts=2.0),
     r"PODSTrainer runs \['greso', 'pilot_commit'\] for this question"),
    (dict(rollout_planner="knapsack", pilot_generations=2), "set one"),
    (dict(rollout_planner="auto", pilot_generations=2), "rollout_planner and pilot_generations both decide"),
    (dict(rollout_planner="auto", adaptive_budget=3.0), r"^rollout_planner='auto' .* drop adaptive_budget"),
    (dict(rollout_planner="auto", downsample_to=N), "raise num_generations above downsample_to"),
    (dict(rollout_planner="auto", rollout_planner_args={"max_n": 64}), r"max_n=64: .* auto .* set it in \[2, 4\]"),
    (dict(rollout_planner="auto", rollout_planner_args={"probe_gap": -1}), "^auto probe_gap must be an integer"),
    (dict(rollout_planner="auto", rollout_planner_args={"budget": 3}), "^planner 'auto' has no setting 'budget'"),
    (dict(rollout_planner="knapsack", downsample_to=N), "raise num_generations above downsample_to"),
    (dict(rollout_planner="knapsack", rollout_planner_args={"max_n": 64}), r"max_n=64: .* set it in \[2, 4\]"),
    (dict(prompt_planner="greso", oversample_prompts=2.0, prompt_planner_args='{"p_easy": 2}'), "p_easy"),
    (dict(prompt_planner="greso", oversample_prompts=2.0, prompt_planner_args="{nope"), "a dict or a JSON object"),
    (dict(prompt_planner="pilot_commit", oversample_prompts=2.0, pilot_generations=2), "drop pilot_generations"),
    (dict(prompt_planner="pilot_commit", oversample_prompts=2.0, rollout_planner="knapsack"), "drop rollout_planner"),
    (dict(prompt_planner="pilot_commit", oversample_prompts=2.0, prompt_planner_args={"n_explore": 2, "n_commit": 8}),
     r"n_explore=2 \+ n_commit=8 must make num_generations \(n=4\)"),
    (dict(prompt_planner="pilot_commit", oversample_prompts=2.0, prompt_planner_args={"buffer_max_off_steps": 4}),
     "commits a prompt in the step that piloted it"),
    (dict(prompt_planner="pilot_commit", oversample_prompts=2.0, prompt_planner_args={"n_explore_effective": 1,
                                                                                       "n_explore": 2}),
     "trains on every pilot rollout"),
])
def test_bad_planner_settings_fail_in_one_line(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message) as err:
        config(tmp_path, **overrides)
    assert "\n" not in str(err.value)


def test_pilot_commit_runs_from_pods_train(tmp_path, tiny_model_dir):
    """`pods train` with Pilot-Commit's flags: n = 8 split 2 + 6 (n_explore given, n_commit the rest), 4 candidates
    for 2 kept groups; each logged step is a pilot and a commit round."""
    from pods_rl import runlog
    from pods_rl.commands.train import main as train_main

    run_dir = tmp_path / "run"
    code = train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir",
                       str(run_dir), "--max_steps", "2", "--eval_before_after", "false", "--prompt_planner",
                       "pilot_commit", "--oversample_prompts", "2", "--prompt_planner_args", '{"n_explore": 2}'])
    assert code == 0
    rows = [r for r in runlog.read_metrics(run_dir) if "pods/prompts_committed" in r]
    assert [r["pods/rounds"] for r in rows] == [2.0, 2.0]
    assert all(r["pods/prompts_committed"] == 2 and r["pods/plan_rollouts"] <= 4 * 2 for r in rows), rows
    assert all(r["pods/rollouts_sampled"] == r["pods/plan_rollouts"] + 2 * 6 for r in rows), rows
