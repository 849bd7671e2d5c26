"""The line a run with rollout_planner="auto" ends with (pods_rl.auto_summary), and `pods train` printing it."""

import json

import torch

from pods_rl import runlog
from pods_rl.auto_summary import H200_COSTS_MS, auto_choices, auto_line, would_choose
from pods_rl.budget.ledger import LedgerSettings, PromptLedger
from pods_rl.commands.train import main as train_main


def rows_of(means, *, m=16, costs=(22.0, 0.87, 1.9)):
    """Metrics rows logged every 5 updates, auto's mean n per row given."""
    fixed, sample, train = costs
    return [{"step": 5 * (i + 1), "pods/auto_n_mean": x, "pods/auto_probes": 1.0, "pods/auto_fixed_ms": fixed,
             "pods/auto_sample_ms": sample, "pods/auto_train_ms": train} for i, x in enumerate(means)]


def test_choices_after_warm_up_and_no_line_without_auto():
    # 10 rows in warm-up (updates 5..50) at 32, then 10 at m and 10 at 20
    choices = auto_choices(rows_of([32.0] * 10 + [16.0] * 10 + [20.0] * 10), m=16)
    assert choices["n_mean"] == 18.0 and choices["share_at_m"] == 0.5 and choices["after_update"] == 50
    assert (choices["fixed_ms"], choices["sample_ms"], choices["train_ms"]) == (22.0, 0.87, 1.9)
    short = auto_choices(rows_of([32.0, 16.0]), m=16)  # a run shorter than the warm-up: every row
    assert short["n_mean"] == 24.0 and short["after_update"] == 0
    assert auto_choices([{"step": 5, "loss": 0.1}], m=16) is None


def test_the_line_names_the_choice_the_costs_and_the_h200():
    line = auto_line(auto_choices(rows_of([16.0] * 20), m=16), m=16, n=64, at_h200=48.25)
    assert line.startswith("auto chose n = 16.0 on average after update 50 (m = 16, up to n = 64; 100% of")
    assert "c_s/c_t 0.46" in line and "would not pay here" in line
    assert "at one H200's measured costs (202 ms + 0.056 / 0.526 ms) it would choose n = 48.2" in line


def test_at_gpu_costs_prompts_near_one_half_get_more_and_at_dear_sampling_m():
    ledger = PromptLedger(LedgerSettings(success_threshold=0.5))
    outcomes = torch.tensor([[1.0, 0.0] * 4] * 8)  # 8 prompts, each 4 of 8 right
    ledger.record(torch.arange(8), outcomes, step=0)
    cheap = would_choose(ledger, m=4, n=16, prompts_per_step=4, costs_ms=H200_COSTS_MS)
    dear = would_choose(ledger, m=4, n=16, prompts_per_step=4,
                        costs_ms={"fixed_ms": 1.0, "sample_ms": 1000.0, "train_ms": 1.0})
    assert cheap > 8 and dear == 4.0
    assert would_choose(PromptLedger(), m=4, n=16, prompts_per_step=4, costs_ms=H200_COSTS_MS) is None


def test_pods_train_with_auto_ends_with_the_line(tmp_path, tiny_model_dir, capsys):
    run_dir = tmp_path / "run"
    assert train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir",
                       str(run_dir), "--max_steps", "4", "--num_generations", "8", "--downsample_to", "4",
                       "--rollout_planner", "auto", "--eval_before_after", "false", "--logging_steps", "1"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("auto chose n = ") and "(m = 4, up to n = 8;" in printed[-1]
    auto = json.loads((run_dir / "summary.json").read_text())["auto"]
    logged = [r["pods/auto_n_mean"] for r in runlog.read_metrics(run_dir) if "pods/auto_n_mean" in r]
    assert auto["n_mean"] == sum(logged) / len(logged) and 4 <= auto["n_mean"] <= 8
    assert 4 <= auto["at_h200_n_mean"] <= 8 and auto["line"] == printed[-1]


def test_the_embedded_default_is_auto_and_ends_with_the_line(tmp_path, tiny_model_dir, capsys):
    """`pods train` with no recipe named runs auto (m = 8 .. n = 32) and its last printed line is auto's summary."""
    run_dir = tmp_path / "run"
    assert train_main(["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(run_dir), "--max_steps", "3",
                       "--per_device_train_batch_size", "32", "--eval_num_problems", "8", "--eval_batch_size", "16",
                       "--eval_k", "2", "--logging_steps", "1", "--run_figure", "false"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("auto chose n = ") and "(m = 8, up to n = 32;" in printed[-1], printed[-1]
    assert "at one H200's measured costs" in printed[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and 8 <= summary["auto"]["n_mean"] <= 32
    assert "rollout_planner: auto" in (run_dir / "config.yaml").read_text()
