"""`pods cost`: the real trainer per setting, interleaved turns, the summary arithmetic, flags and JSON."""

import json
import threading
import time

import pytest

from pods_rl import interleaved, step_cost
from pods_rl.auto_projection import auto_projection
from pods_rl.commands import cost


def test_turns_rotate_and_skip_finished():
    turns, order = interleaved.Turns(3), []
    steps = {0: 3, 1: 1, 2: 2}  # trainer 1 finishes early and must be skipped afterwards

    def trainer(i):
        turns.wait(i)  # on_train_begin
        for _ in range(steps[i]):
            turns.pass_on(i)  # on_step_begin
            turns.wait(i)
            order.append(i)
            time.sleep(0.001)
        turns.finish(i)

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    # the first pass (0 1 2) lines the trainers up at their first step; then 1 2 0, 2 0 (1 done), then 0 alone
    assert order == [1, 2, 0, 2, 0, 0]


def test_interleaved_trainers_draw_from_their_own_random_streams():
    """Trainers in turn share one process's generators: each must sample as it would alone (its own seed), else two
    runs of one recipe sample different completions and their step times differ by the work, not the speed."""
    import random
    from types import SimpleNamespace

    import numpy as np
    import torch
    from transformers import set_seed

    def draws(seed_value, steps=4):  # what one trainer draws per step, alone
        set_seed(seed_value)
        return [(torch.rand(2).tolist(), float(np.random.rand()), random.random()) for _ in range(steps)]

    seeds = [7, 7, 11]  # two of one recipe, one other
    expected = [draws(s) for s in seeds]
    turns, got = interleaved.Turns(len(seeds)), [[] for _ in seeds]

    def trainer(i):
        callback, args = interleaved.take_turns(turns, i), SimpleNamespace(seed=seeds[i])
        callback.on_train_begin(args, None, None)
        for _ in range(4):
            callback.on_step_begin(args, None, None)
            got[i].append((torch.rand(2).tolist(), float(np.random.rand()), random.random()))
        callback.on_train_end(args, None, None)

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(len(seeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert got == expected
    assert got[0] == got[1] != got[2]


def row(step, gen, upd, **extra):
    return {"step": step, "time/generation": gen, "time/scoring": 0.1, "time/selection": 0.0,
            "time/update": upd, "time/step": gen + 0.1 + upd, **extra}


def test_summarize_means_per_rollout_costs_and_ratios():
    grpo = cost.summarize([row(2, 1.0, 2.0, frac_reward_zero_std=0.5, reward_std=0.2),
                           row(3, 1.0, 2.0, frac_reward_zero_std=0.25, reward_std=0.4)], n=8, m=8,
                          kept_per_step=16)
    pods = cost.summarize([row(2, 3.0, 2.0, **{"pods/frac_zero_std_all": 0.5, "pods/frac_zero_std_kept": 0.0,
                                                "pods/reward_kept_std": 0.3}),
                           row(3, 5.0, 2.2, **{"pods/frac_zero_std_all": 0.3, "pods/frac_zero_std_kept": 0.1,
                                                "pods/reward_kept_std": 0.5})], n=32, m=8, kept_per_step=16)
    assert grpo["seconds"] == pytest.approx({"generation": 1.0, "scoring": 0.1, "selection": 0.0, "update": 2.0,
                                             "step": 3.1})
    assert pods["seconds"]["generation"] == pytest.approx(4.0) and pods["seconds_std"]["generation"] == \
        pytest.approx(2 ** 0.5)  # std(ddof=1) of 3 and 5
    assert (pods["seconds_min"]["update"], pods["seconds_max"]["update"]) == pytest.approx((2.0, 2.2))
    # 16 kept rollouts per step, sampled 16 x 32/8 = 64: 4 s / 64 = 62.5 ms; update 2.1 s / 16 = 131.25 ms.
    assert pods["sampled_per_step"] == 64 and pods["generation_ms_per_sampled_rollout"] == pytest.approx(62.5)
    assert pods["update_ms_per_kept_rollout"] == pytest.approx(131.25)
    # GRPO has no pods/* metrics: TRL's own (all n kept) stand for both.
    assert grpo["frac_zero_std_all"] == grpo["frac_zero_std_kept"] == pytest.approx(0.375)
    assert grpo["kept_reward_std"] == pytest.approx(0.3) and grpo["update_peak_gb"] is None
    assert (pods["frac_zero_std_all"], pods["frac_zero_std_kept"]) == pytest.approx((0.4, 0.05))
    rows = cost.add_ratios([grpo, pods])
    assert rows[0]["step_ratio"] == 1.0 and rows[1]["step_ratio"] == pytest.approx((4.0 + 0.1 + 2.1) / 3.1)
    with pytest.raises(ValueError, match="no measured steps"):
        cost.summarize([], n=8, m=8, kept_per_step=16)


def test_resolve_ns():
    assert cost.resolve_ns(None, 8) == [8, 16, 32]
    assert cost.resolve_ns("64, 16", 16) == [16, 64]  # n = m always measured, sorted
    with pytest.raises(ValueError, match="smaller than m=8"):
        cost.resolve_ns("4,16", 8)
    with pytest.raises(ValueError, match="positive integer"):
        cost.resolve_ns("16,x", 8)


@pytest.mark.parametrize("flags, message", [
    (["--n", "0"], "--n must be a positive integer, got '0'"),
    (["--n", "2.5"], "--n must be a positive integer"),
    (["--n", "2"], "smaller than m=4"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--warmup", "-1"], "--warmup must be an integer >= 0"),
    (["--m", "1"], "--m must be an integer >= 2"),
])
def test_bad_flags_one_line_exit_2(flags, message, capsys):
    assert cost.main(["--config", "cpu/smoke", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("pods cost: error:") and err.count("\n") == 1


def test_bad_recipe_one_line_exit_2(capsys):
    assert cost.main(["--config", "no/such/recipe"]) == 2
    err = capsys.readouterr().err
    assert "packaged recipes" in err and err.startswith("pods cost: error:") and err.count("\n") == 1


def check_schema(result, ns, m):
    assert set(result) - {"auto"} == {"machine", "settings", "rows"}
    for key in ("cpu_model", "usable_cores", "torch", "transformers", "trl", "device"):
        assert key in result["machine"], key
    assert [r["n"] for r in result["rows"]] == ns and all(r["m"] == m for r in result["rows"])
    for r in result["rows"]:
        assert set(r["seconds"]) == {"generation", "scoring", "selection", "update", "step"}
        assert r["seconds"]["generation"] > 0 and r["seconds"]["step"] > 0
        # update is the step minus the other phases: the phases add up to the step, per step and in the mean
        parts = sum(r["seconds"][p] for p in ("generation", "scoring", "selection", "update"))
        assert parts == pytest.approx(r["seconds"]["step"], rel=1e-6)
        assert r["step_ratio"] == pytest.approx(expected_ratio(result, r))
    assert result["rows"][0]["step_ratio"] == 1.0


def expected_ratio(result, row):
    """The step ratio `pods cost` must report for ``row``, recomputed from every step it kept (``per_step``): turn by
    turn when its settings were interleaved, else the ratio of the median steps."""
    reference = result["rows"][0]
    if row is reference:
        return 1.0
    if result["settings"]["schedule"] == "interleaved":
        paired = step_cost.paired_ratio(step_cost.by_step(row), step_cost.by_step(reference))
        if paired:
            assert row["step_ratio_paired"]
            return paired["value"]
    return row["seconds"]["step"] / reference["seconds"]["step"]


def test_cost_cli_on_a_tiny_model(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "cost.json"
    code = cost.main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--n", "8",
                      "--steps", "2", "--warmup", "1", "--out", str(out), "--oversample_prompts", "2",
                      "--auto_prompts", "6", "--auto_samples", "3"])
    assert code == 0
    text = capsys.readouterr().out
    assert "4 -> 4" in text and "8 -> 4" in text and "1.00x" in text and "interleaved" in text
    assert "8 -> 4 x2" in text and "its step takes" in text
    result = json.loads(out.read_text())
    # auto on the plain rows' costs (N = 8, 16) and 6 training prompts x 3 samples of the starting model
    auto = result["auto"]
    assert auto["fit_totals"] == [8.0, 16.0] and (auto["m"], auto["max_n"], auto["prompts"], auto["k"]) == (4, 8, 6, 3)
    assert auto["prompts_per_step"] == 2 and auto["batches"] == 3 and 4 <= auto["n_min"] <= auto["n_max"] <= 8
    assert sum(auto["n_counts"].values()) == 6 and auto["vs_grpo"]["grpo"] == 1.0 and "8" in auto["vs_grpo"]
    assert auto["costs_ms"]["train_per_rollout"] > 0 and "training prompts x 3 samples each" in auto["pass_rates"]
    assert "auto (rollout_planner='auto') on these costs" in text and "auto would give each prompt n = " in text
    assert "predicted signal per second vs GRPO (n = m): auto " in text and "8 -> 4 " in text
    # Each n with and without over-sampling: (4, 1), (4, 2), (8, 1), (8, 2).
    assert [(r["n"], r["oversample_prompts"]) for r in result["rows"]] == [(4, 1.0), (4, 2.0), (8, 1.0), (8, 2.0)]
    plain = [r for r in result["rows"] if r["oversample_prompts"] == 1.0]
    check_schema({**result, "rows": plain}, [4, 8], 4)  # m = the recipe's downsample_to, and n = m added
    assert result["settings"]["schedule"] == "interleaved" and result["machine"]["device"] == "cpu"
    assert result["settings"]["oversample_prompts"] == 2.0
    assert all(r["steps"] == 2 and r["kept_per_step"] == 8 for r in result["rows"])
    assert [r["sampled_per_step"] for r in result["rows"]] == [8, 16, 16, 32]
    pods_row = result["rows"][2]
    assert 0.0 <= pods_row["frac_zero_std_kept"] <= pods_row["frac_zero_std_all"] <= 1.0  # max_variance keeps
    for over, base in [(result["rows"][1], result["rows"][0]), (result["rows"][3], result["rows"][2])]:
        assert over["oversample_step_ratio"] == pytest.approx(over["seconds"]["step"] / base["seconds"]["step"])
        assert base["oversample_step_ratio"] is None


def test_cost_on_the_paper_recipe_with_a_local_model_and_data(tmp_path, tiny_model_dir):
    """gsm8k/pods (LoRA r=64, n=64 -> m=16, vLLM, bf16) made CPU-sized: local model and GSM8K-format JSONL."""
    data = tmp_path / "gsm8k"
    data.mkdir()
    items = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"} for a in range(8)]
    (data / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    recipe = ["--config", "gsm8k/pods", "--model_name_or_path", str(tiny_model_dir),
              "--task_args", f"data_dir={data}", "--use_vllm", "false", "--bf16", "false", "--dtype", "float32",
              "--use_cpu", "true", "--max_completion_length", "8", "--gradient_accumulation_steps", "1",
              "--per_device_train_batch_size", "4", "--torch_threads", "1"]
    result = cost.measure(recipe, ns=[4, 8], m=4, steps=1, warmup=1, schedule="sequential")
    check_schema(result, [4, 8], 4)
    assert result["settings"]["schedule"] == "sequential"
    assert result["rows"][1]["sampled_per_step"] == 8 and result["rows"][1]["kept_per_step"] == 4


def test_cost_measures_adaptive_rows_beside_plain_pods(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "cost.json"
    code = cost.main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--n", "8",
                      "--steps", "2", "--warmup", "1", "--out", str(out), "--pilot_generations", "4"])
    assert code == 0
    text = capsys.readouterr().out
    assert "8 -> 4 k4" in text and "kK = adaptive rollouts, pilot K" in text
    result = json.loads(out.read_text())
    assert [(r["n"], r["pilot_generations"]) for r in result["rows"]] == [(4, None), (8, None), (8, 4)]
    check_schema({**result, "rows": result["rows"][:2]}, [4, 8], 4)
    adaptive = result["rows"][2]
    # 2 prompts per step; a pilot of 4 = m: every prompt has m after one round, at most n = 8 after two
    assert 1 <= adaptive["rounds"] <= 2 and 8 <= adaptive["sampled_per_step"] <= 16
    assert adaptive["step_ratio"] == pytest.approx(expected_ratio(result, adaptive))
    assert result["settings"]["pilot_generations"] == 4
    # pilot_generations is validated like the other flags: one line, exit 2, before anything is built
    assert cost.main(["--config", "cpu/smoke", "--n", "4", "--pilot_generations", "2"]) == 2
    assert "needs an n above m=4" in capsys.readouterr().err


# ---- the auto planner's projection (pods_rl.auto_projection) --------------------------------------------------
def test_the_sampling_fit_is_a_plus_b_n_and_needs_two_totals():
    from pods_rl.auto_projection import fit_sampling_cost

    assert fit_sampling_cost([64, 128, 256, 64], [1.2 + 0.01 * n for n in (64, 128, 256, 64)]) == \
        pytest.approx((1.2, 0.01))
    assert fit_sampling_cost([8, 16], [2.0, 1.0]) == (1.5, 0.0)  # a falling time: slope 0, as the planner clamps
    with pytest.raises(ValueError, match="two or more totals N") as error:
        fit_sampling_cost([64, 64], [1.0, 1.1])
    assert "\n" not in str(error.value)


def test_costs_from_rows_fit_the_plain_rows_only():
    from pods_rl.auto_projection import costs_from_rows

    def cost_row(n, generation, update=1.6, **extra):
        return {"n": n, "sampled_per_step": 16 * n // 8, "kept_per_step": 16, **extra,
                "seconds": {"generation": generation, "scoring": 0.01, "update": update}}

    rows = [cost_row(8, 0.5), cost_row(16, 0.6), cost_row(32, 0.8, update=2.0),
            cost_row(16, 9.0, oversample_prompts=2.0), cost_row(16, 9.0, pilot_generations=4)]
    costs = costs_from_rows(rows)
    assert costs["totals"] == [16.0, 32.0, 64.0]  # the over-sampled and adaptive rows left out
    assert (costs["fixed_s"], costs["sample_s"]) == pytest.approx((0.41, 0.00625))  # pairwise slopes 1/160..1/160
    assert costs["train_s"] == pytest.approx(0.1)  # the median of 1.6/16, 1.6/16, 2/16


def outcomes(rates, k=8):
    """(P, k) 0/1: prompt i succeeds in round(rates[i] * k) of its k samples."""
    import numpy as np

    return np.array([[1.0] * round(r * k) + [0.0] * (k - round(r * k)) for r in rates])


def test_the_projection_is_the_planners_own_choice_and_ratio():
    import torch

    from pods_rl.auto_projection import project_auto
    from pods_rl.budget.ledger import LedgerSettings, PromptLedger
    from pods_rl.budget.planners.auto import AutoN, AutoSettings

    correct = outcomes([0.0, 0.125, 0.5, 0.875, 1.0, 0.25, 0.75, 1.0])
    costs = {"fixed_s": 0.05, "sample_s": 2e-4, "train_s": 4e-3}
    projection = project_auto(correct, m=4, n=16, prompts_per_step=8, fixed_ns=[8, 16, 99], **costs)
    planner = AutoN(AutoSettings(min_n=4, max_n=16, sample_ms=0.2, train_ms=4.0, fixed_ms=50.0))
    ledger = PromptLedger(LedgerSettings())
    ledger.record(torch.arange(8), torch.as_tensor(correct), step=0)
    plan = planner.plan(torch.arange(8), ledger, n=16, m=4)
    assert projection["n_counts"] == {str(int(v)): int((plan.rollouts == v).sum()) for v in plan.rollouts.unique()}
    assert projection["vs_grpo"]["auto"] == pytest.approx(plan.metrics["pods/auto_signal_per_second_vs_m"])
    assert set(projection["vs_grpo"]) == {"grpo", "auto", "8", "16"}  # n beyond the largest measured: left out
    # deciding at the expected efficiency it is the optimum over counts; at the interval's lower end (the default) it
    # samples less, a safer choice that a fixed n can beat on the expected signal
    expected = project_auto(correct, m=4, n=16, prompts_per_step=8, fixed_ns=[8, 16], efficiency_low=None, **costs)
    assert expected["vs_grpo"]["auto"] >= max(expected["vs_grpo"].values()) - 1e-12
    assert expected["n_mean"] >= projection["n_mean"]
    assert projection["frac_all_equal"] == pytest.approx(3 / 8) and projection["pass_rate"] == pytest.approx(0.5625)


def test_the_projection_is_grpo_where_sampling_is_dear_and_n_where_it_is_free():
    from pods_rl.auto_projection import project_auto

    correct = outcomes([0.125, 0.25, 0.875, 0.9] * 4)  # near 0 and 1: where max-variance selection pays
    dear = project_auto(correct, m=4, n=16, prompts_per_step=4, fixed_s=0.0, sample_s=1.0, train_s=1e-3)
    assert dear["n_max"] == 4 and dear["vs_grpo"]["auto"] == 1.0 and dear["batches"] == 4
    free = project_auto(correct, m=4, n=16, prompts_per_step=4, fixed_s=1.0, sample_s=0.0, train_s=1e-3,
                        fixed_ns=[16])
    assert free["n_min"] == 16 and free["frac_above_m"] == 1.0 and free["vs_grpo"]["auto"] > 1.0
    assert free["vs_grpo"]["16"] == pytest.approx(free["vs_grpo"]["auto"])
    partial = project_auto(correct[:6], m=4, n=16, prompts_per_step=4, fixed_s=0.0, sample_s=1.0, train_s=1e-3)
    assert partial["batches"] == 1 and sum(partial["n_counts"].values()) == 4  # a trailing partial batch dropped


def test_one_measured_total_skips_the_projection_in_one_line():
    rows = [{"n": 8, "m": 8, "sampled_per_step": 16, "kept_per_step": 16,
             "seconds": {"generation": 1.0, "scoring": 0.0, "update": 1.0}}]
    auto = auto_projection({"settings": {"m": 8}, "rows": rows}, [])
    assert "two or more totals N" in auto["skipped"]
    assert cost.format_auto(auto) == [f"auto (rollout_planner='auto'): not projected: {auto['skipped']}"]


def test_turns_give_each_trainer_each_place_and_none_two_in_a_row():
    """Three trainers over three sweeps: each takes each place of a sweep once, and no trainer follows itself."""
    turns = interleaved.Turns(3)
    order = [turns.turn]
    for _ in range(3 * 3 - 1):
        turns.pass_on(turns.turn)
        order.append(turns.turn)
    sweeps = [order[k:k + 3] for k in range(0, 9, 3)]
    assert all(sorted(sweep) == [0, 1, 2] for sweep in sweeps)
    assert all(sorted(place) == [0, 1, 2] for place in zip(*sweeps))
    assert all(a != b for a, b in zip(order, order[1:]))
