"""C-GRPO (rollout_planner="cgrpo"): the planner's conformal math against trl-cgrpo 0.2.0's own code on fixed cases,
its rounds along the budget grid, exact resume, one-line refusals (knobs, the config, the calibration set and the
answer extractor, before any model loads), and short PODSTrainer runs on the tiny model, down-sampled and padded.

The values marked "their code" were computed by trl-cgrpo 0.2.0's conformal.py (aps_score, conformal_quantile,
select_delta_auto, resolves_singleton) on these inputs with random.Random(3); benchmarks/budget_crosscheck.py --cgrpo
compares the whole calibration and stop loop (CGRPOTrainer.calibrate / _generate_single_turn) on random cases.
"""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners import CGRPO, CGRPOSettings, encode_answers, make_planner
from pods_rl.budget.planners.cgrpo import aps_scores, conformal_quantile, select_delta_auto

ANSWERS = [["7", "7", "3", "", "7", "3", "9", "7"], ["1", "2", "3", "4", "1", "2", "3", "4"],
           ["", "", "5", "5", "5", "5", "5", "5"], ["2"] * 8, [""] * 8]
GOLD = ["7", "4", "5", "8", "1"]
THEIR_SCORES = [[0.5442292252959519, 0.312860152054027, 0.12967700716400382],  # their code, grid 2, 4, 8
                [1.0, 0.537654106005881, 0.6678528688423981],
                [1.0, 0.37911512314340867, 0.22595074463678425],
                [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def test_aps_scores_quantiles_and_delta_are_their_codes():
    codes, gold = encode_answers(ANSWERS, 8, GOLD)
    rng = random.Random(3)
    scores = aps_scores(codes, gold, (2, 4, 8), rng)
    assert scores.tolist() == THEIR_SCORES
    assert rng.random() == 0.7188239240658031  # their code's stream after the same draws
    assert select_delta_auto(scores[:, -1]) == (0.45, 0.6)  # their code
    assert [conformal_quantile(scores[:, g], 0.5) for g in range(3)] == [1.0, 0.537654106005881, 0.6678528688423981]
    assert conformal_quantile(torch.empty(0), 0.5) == 1.0


def test_encode_answers_treats_none_and_blank_as_no_answer():
    codes, gold = encode_answers([[" 7", "7 ", None, "", "3"], ["x"]], 5, ["7", ""])
    assert codes.tolist() == [[0, 0, -1, -1, 1], [0, -1, -1, -1, -1]]
    assert gold.tolist() == [0, -1]


def test_a_prompt_stops_at_the_first_singleton_set_drawing_as_their_code():
    planner = CGRPO(CGRPOSettings(budget_grid=[8, 2, 4]), seed=3)
    assert planner.settings.budget_grid == (2, 4, 8)
    planner.qhats = torch.tensor([0.6, 0.6, 0.6], dtype=torch.float64)
    codes, _ = encode_answers(ANSWERS, 8)
    counts = torch.full((5,), 4)
    done = planner.resolved(codes, counts, torch.ones(5, dtype=torch.bool))
    assert done.tolist() == [False, False, False, True, False]  # their code
    assert planner.rng.random() == 0.25935401432800764  # their code's stream after the same draws
    # the rounds: 2 each, then up the grid until resolved or at 8
    planner = CGRPO(CGRPOSettings(budget_grid=[2, 4, 8]), seed=0)
    planner.qhats = torch.tensor([1.0, 0.6, 0.6], dtype=torch.float64)
    plan = planner.plan(torch.arange(5), PromptLedger(), n=8)
    assert plan.rollouts.tolist() == [2] * 5
    counts, last = plan.rollouts.clone(), plan.rollouts.clone()
    history = []
    while (more := planner.next_round(codes, counts, last > 0)).any():
        history.append(more.tolist())
        counts, last = counts + more, more
    assert history == [[0, 2, 2, 0, 2], [0, 4, 4, 0, 4]]  # qhat_2 = 1.0: only agreeing pairs stop at 2
    assert counts.tolist() == [2, 8, 8, 2, 8]
    assert planner.round_metrics(counts) == {"pods/cgrpo_mean_k": 5.6, "pods/cgrpo_rollout_savings": 1 - 28 / 40}


def test_calibration_metrics_split_delta_and_exact_resume():
    codes, gold = encode_answers(ANSWERS * 4, 8, GOLD * 4)
    planner = CGRPO(CGRPOSettings(budget_grid=[2, 4, 8], recalibrate_every=3), seed=3)
    assert planner.calibration_due(0)
    metrics = planner.calibrate(codes, gold, step=0)
    assert metrics["pods/cgrpo_calibration_rollouts"] == 20 * 8 and metrics["pods/cgrpo_calibration_solve_rate"] == 0.6
    assert set(metrics) >= {"pods/cgrpo_delta", "pods/cgrpo_qhat_2", "pods/cgrpo_qhat_4", "pods/cgrpo_qhat_8"}
    assert not planner.calibration_due(2) and planner.calibration_due(3)
    state = planner.state_dict()
    again = CGRPO(planner.settings, seed=99)
    again.load_state_dict(state)
    assert again.calibrate(codes, gold, step=3) == planner.calibrate(codes, gold, step=3)
    assert torch.equal(again.qhats, planner.qhats) and again.rng.random() == planner.rng.random()
    assert again.calibration_rollouts == 2 * 20 * 8
    split = CGRPO(CGRPOSettings(budget_grid=[2, 4, 8], split_delta=True), seed=3)
    assert "pods/cgrpo_delta" in split.calibrate(codes, gold)
    fixed = CGRPO(CGRPOSettings(budget_grid=[2, 4, 8], delta=0.5), seed=3)
    assert "pods/cgrpo_calibration_solve_rate" not in fixed.calibrate(codes, gold) and fixed.delta == 0.5


def test_execution_scores_stop_on_an_early_pass():
    planner = CGRPO(CGRPOSettings(budget_grid=[2, 4], score="first_success", delta=0.5), seed=0)
    passes = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    planner.calibrate(passes)
    assert planner.qhats.tolist() == [1.0, 1.0]  # j*/k: [1.0, 1.0, 1.0] at 2 and [.5, 1.0, 1.0] at 4; 2nd smallest
    assert planner.resolved(passes, torch.tensor([2, 2, 2]), torch.ones(3, dtype=torch.bool)).tolist() == [
        True, False, False]


@pytest.mark.parametrize("knobs, message", [
    ({"budget_grid": [2, 2]}, "budget_grid must be distinct positive integers"),
    ({"budget_grid": []}, "budget_grid must be distinct positive integers"),
    ({"delta": 1.0}, r"delta must be a number in \(0.0, 1.0\)"),
    ({"score": "majority"}, "score must be one of"),
    ({"recalibrate_every": -1}, "recalibrate_every must be an integer >= 0"),
    ({"num_calibration_samples": 0}, "num_calibration_samples must be an integer >= 1"),
    ({"split_delta": "yes"}, "split_delta must be True or False"),
    ({"budget": 3}, "has no setting 'budget'"),
])
def test_bad_knobs_are_one_line_naming_the_knob(knobs, message):
    with pytest.raises(ValueError, match=message) as err:
        make_planner("cgrpo", **knobs)
    assert "\n" not in str(err.value)


# ---- PODSTrainer --------------------------------------------------------------------------------------------------


def answer_of(text):
    """The tiny model's 'answer': the parity of its characters' codes (two answers, so sets can be singletons)."""
    return "ab"[sum(map(ord, text)) % 2] if text else None


def reward(prompts, completions, **kwargs):
    return [float(answer_of(c[0]["content"] if isinstance(c, list) else c) == "a") for c in completions]


def chat(fmt, rows):
    return [[{"role": "user", "content": fmt.format(i)}] for i in range(rows)]


TRAIN = Dataset.from_dict({"prompt": chat("{0}+{0}=", 16)})
CALIBRATION = Dataset.from_dict({"prompt": chat("{0}-{0}=", 6), "answer": ["a", "b"] * 3})


def config(tmp_path, m=2, **overrides):
    from pods_rl.engines.trl.trainer import PODSConfig

    args = dict(output_dir=str(tmp_path / "out"), use_cpu=True, seed=1, learning_rate=1e-2, max_steps=3,
                max_completion_length=4, num_generations=4, downsample_to=m, per_device_train_batch_size=2 * m,
                logging_steps=1, report_to="none", save_strategy="no", beta=0.0, bf16=False,
                dataloader_num_workers=0, shuffle_dataset=False, rollout_planner="cgrpo",
                rollout_planner_args={"budget_grid": [2, 4], "recalibrate_every": 2})
    args.update(overrides)
    return PODSConfig(**args)


def logged(trainer, key):
    return [row[key] for row in trainer.state.log_history if key in row]


@pytest.mark.parametrize("m", [2, 4])
def test_cgrpo_runs_in_pods_trainer_down_sampled_or_padded(tmp_path, tiny_model_dir, m):
    """n = 4 on the grid 2, 4: with m = 2 a prompt that needs 4 is down-sampled to 2; with m = 4 (C-GRPO itself) one
    that stops at 2 trains with 2 padding rows masked out. Calibration before steps 0 and 2, its rollouts logged."""
    from pods_rl.engines.trl.trainer import PODSTrainer

    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[reward],
                          args=config(tmp_path, m), train_dataset=TRAIN,
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
                          calibration_dataset=CALIBRATION, answer_extractor=answer_of)
    trainer.train()
    assert logged(trainer, "pods/cgrpo_calibration_rollouts") == [6 * 4, 6 * 4]  # steps 0 and 2
    assert logged(trainer, "pods/cgrpo_calibration_rollouts_total") == [24.0, 24.0, 48.0]
    mean_k, sampled = logged(trainer, "pods/cgrpo_mean_k"), logged(trainer, "pods/rollouts_sampled")
    assert all(2 <= k <= 4 for k in mean_k) and sampled == [2 * k for k in mean_k]
    padding = logged(trainer, "pods/cgrpo_padding_rows")
    if m == 2:
        assert padding == [0.0] * 3
    else:  # the share of kept rows that pad a group stopped at 2
        assert padding == [(4 - k) / 4 for k in mean_k]
    assert all(torch.isfinite(torch.tensor(logged(trainer, "loss"))))
    assert trainer._budget.how_many.qhats is not None


def test_padding_rows_leave_the_loss_and_its_normalizer():
    from pods_rl.engines.trl.rows import mask_padding, padded_kept_rows

    kept = torch.tensor([[0, 1, -1, -1], [0, 1, 2, 3], [-1, -1, -1, -1]])
    rows, padded = padded_kept_rows(kept, torch.tensor([0, 1]), n=4)
    assert rows == [0, 1, 2, 3, 4, 5, 6, 7] and padded == [False, False, True, True] + [False] * 4
    output = {"completion_mask": torch.ones(8, 3, dtype=torch.long), "num_items_in_batch": torch.tensor(24)}
    assert mask_padding(output, padded, lambda t: t) == 0.25
    assert output["completion_mask"][2:4].sum() == 0 and int(output["num_items_in_batch"]) == 18


@pytest.mark.parametrize("overrides, message", [
    (dict(num_generations=8), r"set num_generations to 4 \(n=8\)"),
    (dict(loss_type="grpo"), "set loss_type to one of"),
    (dict(pilot_generations=2), "set one"),
    (dict(rollout_planner_args={"budget_grid": [2, 4], "delta": 2}), "delta must be a number"),
])
def test_bad_config_fails_in_one_line(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message) as err:
        config(tmp_path, **overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(answer_extractor=None), "pass answer_extractor="),
    (dict(calibration_dataset=None), "pass calibration_dataset="),
    (dict(calibration_dataset=Dataset.from_dict({"prompt": chat("{0}+{0}=", 2), "answer": ["a", "b"]})),
     "shares 2 of its 2 prompts with the training set"),
    (dict(calibration_dataset=Dataset.from_dict({"prompt": chat("{0}-{0}=", 2)})), "has no 'answer' column"),
])
def test_bad_calibration_input_fails_before_the_model_loads(tmp_path, kwargs, message):
    """The model is a path that does not exist: the refusal comes first, in one line."""
    from pods_rl.engines.trl.trainer import PODSTrainer

    arguments = dict(model=str(tmp_path / "no-model"), reward_funcs=[reward], args=config(tmp_path),
                     train_dataset=TRAIN, calibration_dataset=CALIBRATION, answer_extractor=answer_of)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message) as err:
        PODSTrainer(**arguments)
    assert "\n" not in str(err.value)


def test_the_crosscheck_runs_our_side_of_a_case():
    """benchmarks/budget_crosscheck.py --cgrpo: our side of its random cases (theirs needs trl-cgrpo's environment)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "budget_crosscheck.py"
    spec = importlib.util.spec_from_file_location("budget_crosscheck_cgrpo", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rng = random.Random(0)
    for _ in range(5):
        case = script._cgrpo_case(rng)
        ours = script._cgrpo_ours(case)
        assert len(ours["stops"]) == len(case["steps"]) and ours["calibrations"][0]["step"] == 0
        assert all(k in case["budget_grid"] for stops in ours["stops"] for k in stops)


def test_cgrpo_runs_from_pods_train(tmp_path, tiny_model_dir, monkeypatch):
    """`pods train --rollout_planner cgrpo`: the task's answer extractor, calibration prompts from the test split past
    the evaluation's 8, n = 8 on the grid 2, 4, 8 down-sampled to m = 4; its calibration rows checked once."""
    from pods_rl import runlog
    from pods_rl.budget import cgrpo_run
    from pods_rl.commands.train import main as train_main

    checked = []  # the calibration sets whose rows were checked (the overlap with training read each time)

    class Counted(cgrpo_run.CalibrationSet):
        def __init__(self, *args):
            super().__init__(*args)
            checked.append(self)

    monkeypatch.setattr(cgrpo_run, "CalibrationSet", Counted)

    run_dir = tmp_path / "run"
    code = train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir",
                       str(run_dir), "--max_steps", "1", "--max_completion_length", "8", "--eval_before_after", "false",
                       "--rollout_planner", "cgrpo",
                       "--rollout_planner_args", '{"budget_grid": [2, 4, 8], "num_calibration_samples": 3}'])
    assert code == 0
    rows = runlog.read_metrics(run_dir)
    assert [r["pods/cgrpo_calibration_rollouts"] for r in rows if "pods/cgrpo_calibration_rollouts" in r] == [24.0]
    assert len([r for r in rows if "pods/cgrpo_mean_k" in r]) == 1
    assert len(checked) == 1 and len(checked[0].rows) == 3


@pytest.mark.parametrize("args, message", [
    ('{"budget_grid": [2, 4, 8], "calibration_split": "train", "num_calibration_samples": 4}',
     "shares 4 of its 4 prompts with the training set"),
    ('{"budget_grid": [2, 4, 8], "calibration_split": "dev"}', "has no split 'dev' to calibrate C-GRPO on"),
    ('{"budget_grid": [2, 4, 8]}', "has no answer extractor"),
])
def test_pods_train_refuses_bad_calibration_in_one_line(tmp_path, tiny_model_dir, capsys, monkeypatch, args, message):
    from pods_rl.commands.train import main as train_main
    from pods_rl.tasks.arithmetic import ArithmeticTask

    if "answer extractor" in message:
        monkeypatch.setattr(ArithmeticTask, "answer_extractor", lambda self: None)
    code = train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tmp_path / "no-model"), "--output_dir",
                       str(tmp_path / "run"), "--eval_before_after", "false", "--rollout_planner", "cgrpo",
                       "--rollout_planner_args", args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert __import__("re").search(message, err), err


def test_the_tasks_answer_extractor_reads_the_final_answer():
    from pods_rl.tasks import get_task
    from pods_rl.tasks.extraction import final_answer

    assert final_answer("<think>2+2</think><answer> 4 </answer>") == "4"
    assert final_answer("<answer>x = 1,234.</answer>") == "1234"  # the block's lone number
    assert final_answer("<answer>17, not 18</answer>") == "17, not 18"
    assert final_answer([{"role": "assistant", "content": "so 12"}]) == "12" and final_answer("") is None
    assert get_task("arithmetic").answer_extractor() is final_answer


def test_with_a_response_template_the_stop_rule_reads_the_content_as_the_reward_does():
    """A tokenizer with a response template makes TRL split each completion into ``reasoning_content`` and
    ``content``. pods-rl's stop rule and calibration read the content, as the correctness reward does; trl-cgrpo
    0.2.0 reads the raw decoded text (reasoning included). An answer stated only in the reasoning stops a prompt
    there, not here (docs/concepts/rollout-budgets.md, C-GRPO: where it differs)."""
    from pods_rl.budget.cgrpo_run import CalibrationSet, CGRPORun
    from pods_rl.tasks.extraction import completion_text, final_answer
    from pods_rl.tasks.rewards import make_correctness_reward

    def reply(reasoning, content):
        return [{"role": "assistant", "reasoning_content": reasoning, "content": content}]

    in_reasoning = [reply("2 + 5 = 7, so the answer is 7", "I am not sure."), reply("it is 7", "")]
    in_content = [reply("2 + 5 = 7", "The answer is 7."), reply("it is 7", "7")]
    raw = "<think>\n2 + 5 = 7, so the answer is 7\n</think>\n\nI am not sure."  # what trl-cgrpo decodes and reads
    assert final_answer(raw) == "7" and [final_answer(c) for c in in_reasoning] == ["I am not sure.", None]
    assert make_correctness_reward()(["p"] * 2, in_reasoning, answer=["7"] * 2) == [0.0, 0.0]  # the reward agrees

    def planner():
        made = CGRPO(CGRPOSettings(budget_grid=[2, 4]), seed=0)
        made.qhats = torch.tensor([0.6, 0.6], dtype=torch.float64)  # two agreeing answers of two stop a prompt
        made.last_calibration_step = 0
        return made

    def run():  # as both engines build it: the completion's text as their rewards read it
        return CGRPORun(planner(), CalibrationSet([], final_answer), completion_text)

    def trainer_round(completions):  # PODSTrainer's rounds: a step's prompts, their slots
        made = run()
        made.start_step(1, 4)
        return made.next_round(completions, [0, 1], torch.tensor([2]), torch.tensor([2])).tolist()

    def worker_round(completions):  # the asynchronous worker's: one group judged alone
        return run().group_more(completions)

    assert trainer_round(in_content) == [0] and worker_round(in_content) == 0  # stated in the content: stops at 2
    assert trainer_round(in_reasoning) == [2] and worker_round(in_reasoning) == 2  # only in the reasoning: goes on


def test_the_budget_saves_and_restores_the_thresholds_and_the_stream(tmp_path):
    """RolloutBudget (the engines' hold of the planners) seeds C-GRPO with the run's seed and keeps its state in the
    checkpoint's pods_ledger.pt: a resumed run calibrates on schedule and draws what it would have drawn."""
    from pods_rl.budget.rollout_budget import BudgetSettings, RolloutBudget

    settings = BudgetSettings(num_generations=8, downsample_to=4, rollout_planner="cgrpo",
                              rollout_planner_args={"budget_grid": [2, 4, 8], "recalibrate_every": 5}, seed=3)
    budget = RolloutBudget.from_config(settings)
    assert budget.how_many.rng.random() == random.Random(3).random()
    budget.how_many.use_seed(3)
    codes, gold = encode_answers(ANSWERS, 8, GOLD)
    budget.how_many.calibrate(codes, gold, step=0)
    first, _ = budget.plan(torch.arange(5), 5, step=0, rank=0)
    assert first.tolist() == [2] * 5  # budget_grid[0] each, not clamped to m
    budget.save(tmp_path)
    resumed = RolloutBudget.from_config(settings)
    assert resumed.load(tmp_path)
    a, b = budget.how_many, resumed.how_many
    assert torch.equal(a.qhats, b.qhats) and a.delta == b.delta and not b.calibration_due(4) and b.calibration_due(5)
    assert a.rng.random() == b.rng.random()


@pytest.mark.slow
def test_cgrpo_on_two_processes_calibrates_on_every_prompt_once_and_agrees(tmp_path, tiny_model_dir):
    """`pods train --rollout_planner cgrpo` under `accelerate launch`, 2 CPU ranks: 5 calibration prompts (rank 1's
    share padded with prompt 0, which must not count), calibrations at steps 0 and 2, rounds up the grid whose sizes
    the ranks agree on (a disagreement is a collective mismatch: gloo aborts or a rank waits); the checkpoint holds
    the thresholds and delta the run logged, which every rank took from rank 0."""
    from tests import multiproc

    run_dir = tmp_path / "run"
    args = '{"budget_grid": [2, 4, 8], "num_calibration_samples": 5, "recalibrate_every": 2}'
    command = multiproc.launch_command(
        "train", "--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(run_dir),
        "--max_steps", "3", "--max_completion_length", "8", "--eval_before_after", "false", "--save_strategy", "steps",
        "--save_steps", "3", "--rollout_planner", "cgrpo", "--rollout_planner_args", args)
    proc = multiproc.start(command, multiproc.launch_env())
    _, err = multiproc.end(proc, timeout=400)
    assert proc.returncode == 0, err[-4000:]
    rows = multiproc.metrics_rows(run_dir)
    calibrations = [r for r in rows if "pods/cgrpo_calibration_rollouts" in r]
    # Every calibration prompt sampled k_max = 8 times across the two ranks, the padding row left out; before the
    # updates of global steps 0 and 2 (logged in the rows of steps 1 and 3).
    assert [(r["step"], r["pods/cgrpo_calibration_rollouts"]) for r in calibrations] == [(1, 40.0), (3, 40.0)]
    steps = [r for r in rows if "pods/cgrpo_mean_k" in r]
    assert len(steps) == 3 and all(2 <= r["pods/cgrpo_mean_k"] <= 8 for r in steps)
    assert steps[-1]["pods/cgrpo_calibration_rollouts_total"] == 80.0
    state = torch.load(run_dir / "checkpoint-3" / "pods_ledger.pt", weights_only=False)["how_many"]
    last = calibrations[-1]
    assert state["last_calibration_step"] == 2 and state["calibration_rollouts"] == 80
    assert state["delta"] == pytest.approx(last["pods/cgrpo_delta"])
    assert [float(q) for q in state["qhats"]] == pytest.approx([last[f"pods/cgrpo_qhat_{k}"] for k in (2, 4, 8)])
