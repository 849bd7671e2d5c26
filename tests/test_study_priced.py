"""`pods study --price_at`: time priced at another machine's step costs (pods_rl.commands.study_priced): the costs
and their bad input, the cost file's model and task, priced time against a hand computation, runs that do not tell
their rollouts, and auto planning at the priced costs."""

import json
from pathlib import Path

import numpy as np
import pytest

from pods_rl import stats
from pods_rl.commands import study_priced
from pods_rl.commands.study_priced import PricedCosts, parse_priced_costs

ROOT = Path(__file__).resolve().parents[1]
XEON_COST = ROOT / "benchmarks" / "results" / "cpu-2core-intel-xeon" / "auto" / "strong" / "cost.json"


def test_given_costs_are_three_milliseconds():
    costs = parse_priced_costs("202, 0.056,0.526")
    assert (costs.fixed_ms, costs.sample_ms, costs.train_ms) == (202.0, 0.056, 0.526) and costs.recipe_argv is None


@pytest.mark.parametrize(("spec", "message"), [
    ("", r"^--price_at is empty: give --price_at a `pods cost` JSON file or three numbers"),
    ("202,0.056", r"^--price_at '202,0.056': expected 3 costs c0_ms,sample_ms,train_ms, got 2; give"),
    ("202,-0.056,0.5", r"^--price_at '202,-0.056,0.5': sample_ms must be a finite number >= 0, got -0.056; give"),
    ("202,fast,0.5", r"^--price_at '202,fast,0.5': sample_ms 'fast' is not a number; give"),
    ("202,0.05,nan", r"^--price_at '202,0.05,nan': train_ms must be a finite number >= 0, got nan; give"),
    ("missing_cost.json", r"^--price_at missing_cost.json: no such file; give"),
])
def test_bad_costs_are_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_priced_costs(spec)
    assert "\n" not in str(err.value)


def test_a_cost_file_gives_the_fitted_costs_and_a_warning_for_another_model():
    from pods_rl.auto_projection import costs_from_rows

    cost = json.loads(XEON_COST.read_text())
    costs = parse_priced_costs(str(XEON_COST))
    fitted = costs_from_rows(cost["rows"])
    assert costs.sample_ms == pytest.approx(1e3 * fitted["sample_s"]) and costs.train_ms == pytest.approx(
        1e3 * fitted["train_s"]) and costs.fixed_ms == pytest.approx(1e3 * fitted["fixed_s"])
    recipe = list(cost["settings"]["recipe_argv"])
    assert study_priced.cost_file_mismatch(costs, recipe) is None
    other = [*recipe, "--model_name_or_path", "./other-model"]
    warning = study_priced.cost_file_mismatch(costs, other)
    assert warning.startswith("pods study: warning: --price_at's costs were measured on another model or task")
    assert "./other-model here" in warning and "evidence/strong/model there" in warning and "\n" not in warning
    assert "--task (default) there, gsm8k here" in study_priced.cost_file_mismatch(costs, [*recipe, "--task",
                                                                                           "gsm8k"])


def _run(tmp_path, name, rows, config, eval_steps):
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return stats.RunData(run_dir=run_dir, label=name, config=config, steps=np.array(eval_steps),
                         times=np.zeros(len(eval_steps)), values=np.zeros(len(eval_steps)),
                         stderrs=np.zeros(len(eval_steps)))


def test_priced_time_equals_a_hand_computation(tmp_path):
    """Rows logged every 5 steps (each the mean of its 5); evaluations at steps 0, 5, 8 and 10."""
    costs = PricedCosts(100.0, 2.0, 3.0, source="test")
    config = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "rollout_planner": "auto",
              "num_generations": 8, "downsample_to": 2}
    rows = [{"step": 5, "loss": 0.1, "pods/rollouts_sampled": 20.0}, {"step": 10, "loss": 0.1,
                                                                       "pods/rollouts_sampled": 40.0}]
    run = _run(tmp_path, "auto", rows, config, [0, 5, 8, 10])
    first, second = 5 * (100 + 2 * 20 + 3 * 16), 5 * (100 + 2 * 40 + 3 * 16)  # ms: 940 and 1140
    expected = np.array([0.0, first, first + 3 / 5 * second, first + second]) / 1e3
    assert study_priced.priced_times(run, costs) == pytest.approx(expected)
    # GRPO logs no rollouts: n per kept group of its config, 16 x 8 / 2 = 64 per step
    grpo = _run(tmp_path, "grpo", [{"step": 10, "loss": 0.1}], {**config, "rollout_planner": None}, [10])
    assert study_priced.priced_times(grpo, costs) == pytest.approx([10 * (100 + 2 * 64 + 3 * 16) / 1e3])


def test_runs_that_do_not_tell_their_rollouts_are_refused_in_one_line(tmp_path):
    config = {"per_device_train_batch_size": 16, "rollout_planner": "auto", "num_generations": 8,
              "downsample_to": 2}
    quiet = _run(tmp_path, "auto", [{"step": 5, "loss": 0.1}], config, [5])
    with pytest.raises(ValueError, match=r"its logged rows hold no pods/rollouts_sampled and its n varies"):
        study_priced.check_runs_logged({"auto": [quiet]})
    empty = _run(tmp_path, "empty", [], config, [5])
    with pytest.raises(ValueError, match=r"no logged training rows \(metrics.jsonl\): priced time needs"):
        study_priced.step_counts(empty)


def test_auto_methods_plan_at_the_priced_costs(tmp_path):
    from pods_rl.commands.study import _priced_plan, build_parser
    from pods_rl.commands.study_plan import make_plan

    args, recipe = build_parser().parse_known_args([
        "--out", str(tmp_path / "st"), "--m", "8", "--methods", "grpo-n8,pods-mv-n32m8,pods-mv-n32m8-auto",
        "--variant", "auto=--rollout_planner auto --rollout_planner_args '{\"max_probes\": 2}'"])
    plan, costs = _priced_plan(make_plan(args, recipe), "202,0.056,0.526")
    extra = {m.name: m.extra for m in plan.methods}
    assert extra["grpo-n8"] == () and extra["pods-mv-n32m8"] == ()
    auto = list(extra["pods-mv-n32m8-auto"])
    assert auto.count("--rollout_planner_args") == 1
    assert json.loads(auto[auto.index("--rollout_planner_args") + 1]) == {
        "max_probes": 2, "fixed_ms": 202.0, "sample_ms": 0.056, "train_ms": 0.526}


def test_the_study_refuses_bad_costs_before_anything_runs(tmp_path, capsys):
    from pods_rl.commands.study import main

    out = tmp_path / "st"
    assert main(["--smoke", "--out", str(out), "--price_at", "1,-2,3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "c0_ms must" not in err and "sample_ms must be a finite number >= 0" in err
    assert not out.exists()


def test_priced_report_on_the_filed_xeon_study(tmp_path):
    """The shipped model's auto study (filed runs): every method priced at the H200's costs; GRPO's priced step is
    c0 + c_s x 128 + c_t x 128 exactly (16 prompts x 8 rollouts, all kept)."""
    from pods_rl.commands.study_report import load_groups
    from pods_rl.runlog.packed import unpack_runs

    root = unpack_runs(ROOT / "benchmarks" / "results" / "cpu-2core-intel-xeon" / "auto" / "shipped", tmp_path)
    groups = load_groups(root / "study" / "runs")
    costs = PricedCosts(202.0, 0.056, 0.526, source="H200")
    report = study_priced.priced_report(groups, "grpo-n8", costs, n_boot=0)
    grpo = report["methods"]["grpo-n8"]
    assert grpo["seconds_per_step"][0] == pytest.approx((202 + 0.056 * 128 + 0.526 * 128) / 1e3)
    auto = report["methods"]["pods-mv-n32m8-auto"]
    assert auto["rollouts_sampled_per_step"][0] > 128 and auto["to_levels"]["ratio"] > 0
    assert report["label"] == "priced"
    lines = study_priced.priced_lines(report, {})
    assert lines[0].lstrip().startswith("PRICED time (not measured here)") and len(lines) == 1 + len(groups)
