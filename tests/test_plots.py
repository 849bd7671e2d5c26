"""`pods plot` / `pods compare`: curves, time-to-target, speed-ups and their CI on synthetic run dirs."""

import json
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import yaml

from pods_rl.commands import plots


def make_run(root, name, times, accs, config=None, stderrs=None, phase_rows=(), eval_in_metrics=False):
    """A run dir with config.yaml and either eval.json (default) or metrics.jsonl eval/accuracy rows."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {"num_generations": 16, "downsample_to": 16, "seed": 0, **(config or {})}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    rows = list(phase_rows)
    if eval_in_metrics:
        rows += [{"step": i, "train_seconds": t, "eval/accuracy": a, "eval/accuracy_stderr": 0.01}
                 for i, (t, a) in enumerate(zip(times, accs))]
    else:
        records = [{"checkpoint": f"checkpoint-{i}", "task": "arithmetic", "split": "test", "k": 4,
                    "temperature": 0.9, "step": i, "train_seconds": t, "accuracy": a, "format_accuracy": 1.0,
                    "both_accuracy": a, "pass_at_k": min(1.0, 2 * a),
                    "accuracy_stderr": None if stderrs is None else stderrs[i]}
                   for i, (t, a) in enumerate(zip(times, accs))]
        (run_dir / "eval.json").write_text(json.dumps(records))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def phase_row(step, gen, score, sel, upd, total):
    return {"step": step, "train_seconds": float(step), "time/generation": gen, "time/scoring": score,
            "time/selection": sel, "time/update": upd, "time/step": total}


# ----------------------------------------------------------------------------------------------------------
# Labels and loading
# ----------------------------------------------------------------------------------------------------------
def test_default_label():
    assert plots.default_label({"num_generations": 16, "downsample_to": 16}) == "GRPO (n=16)"
    assert plots.default_label({"num_generations": 8}) == "GRPO (n=8)"
    assert plots.default_label({"num_generations": 64, "downsample_to": 16, "downsample_rule": "max_variance"}) \
        == "PODS max_variance (n=64→m=16)"
    assert plots.default_label({}, fallback="myrun") == "myrun"
    # a planner's run is not every prompt at n: the label says which planner ran
    assert plots.default_label({"num_generations": 32, "downsample_to": 8, "rollout_planner": "auto"}) \
        == "PODS max_variance (n=32→m=8) +auto"
    assert plots.default_label({"num_generations": 8, "downsample_to": 8, "prompt_planner": "greso",
                                "rollout_planner": None}) == "GRPO (n=8) +greso"


def test_parse_run_spec(tmp_path):
    assert plots.parse_run_spec("runs/a=My method") == (plots.Path("runs/a"), "My method")
    assert plots.parse_run_spec("runs/a") == (plots.Path("runs/a"), None)
    odd = tmp_path / "lr=0.1"
    odd.mkdir()
    assert plots.parse_run_spec(str(odd)) == (odd, None)  # an existing dir with '=' is a path


def test_load_run_eval_json_and_metrics_fallback(tmp_path):
    run_dir = make_run(tmp_path, "a", [30.0, 0.0, 60.0], [0.5, 0.1, 0.7],
                       config={"num_generations": 64, "downsample_to": 16, "downsample_rule": "max_variance",
                               "seed": 3},
                       phase_rows=[phase_row(1, 2.0, 0.2, 0.1, 1.0, 3.5), phase_row(2, 4.0, 0.4, 0.1, 1.0, 5.5)])
    run = plots.load_run(run_dir)
    assert run.label == "PODS max_variance (n=64→m=16)" and run.seed == 3 and run.source == "eval.json"
    assert run.times.tolist() == [0.0, 30.0, 60.0] and run.values.tolist() == [0.1, 0.5, 0.7]  # sorted by time
    assert run.phase_seconds == pytest.approx({"generation": 3.0, "scoring": 0.3, "selection": 0.1,
                                               "update": 1.0, "step": 4.5})
    assert plots.load_run(run_dir, metric="pass_at_k").values.tolist() == [0.2, 1.0, 1.0]

    fallback = plots.load_run(make_run(tmp_path, "b", [10.0, 20.0], [0.2, 0.4], eval_in_metrics=True), label="X")
    assert fallback.source == "metrics.jsonl" and fallback.label == "X"
    assert fallback.times.tolist() == [10.0, 20.0] and fallback.values.tolist() == [0.2, 0.4]
    assert fallback.stderrs.tolist() == [0.01, 0.01]

    with pytest.raises(ValueError, match="does not exist"):
        plots.load_run(tmp_path / "missing")
    with pytest.raises(ValueError, match="metric"):
        plots.load_run(run_dir, metric="loss")


def test_load_run_picks_one_eval_setting(tmp_path, capsys):
    run_dir = make_run(tmp_path, "a", [0.0, 10.0], [0.1, 0.3])
    records = json.loads((run_dir / "eval.json").read_text())
    records.append({**records[0], "k": 1, "accuracy": 0.9})  # a lone record with other settings
    (run_dir / "eval.json").write_text(json.dumps(records))
    assert plots.load_run(run_dir).values.tolist() == [0.1, 0.3]  # the most common setting
    assert "several eval settings" in capsys.readouterr().err
    assert plots.load_run(run_dir, k=1).values.tolist() == [0.9]


# ----------------------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------------------
def test_mean_curve_interpolates_on_common_grid(tmp_path):
    a = plots.load_run(make_run(tmp_path, "a", [0.0, 100.0, 200.0], [0.0, 0.4, 0.6]))
    b = plots.load_run(make_run(tmp_path, "b", [0.0, 50.0, 200.0, 300.0], [0.2, 0.5, 0.8, 0.9]))
    grid, mean, half_width = plots.mean_curve([a, b])
    assert grid.tolist() == [0.0, 50.0, 100.0, 200.0]  # b's 300 s lies outside a's range: dropped
    # a(50) = 0.2 (linear), b(100) = 0.5 + 0.3 * 50/150 = 0.6
    assert mean == pytest.approx([0.1, 0.35, 0.5, 0.7])
    # seeds at t=0: 0.0 and 0.2 -> std(ddof=1) = 0.1414, se = 0.1, half width 1.96 * 0.1
    assert half_width[0] == pytest.approx(0.196)

    single = plots.load_run(make_run(tmp_path, "c", [0.0, 10.0], [0.2, 0.4], stderrs=[0.01, 0.02]))
    grid, mean, half_width = plots.mean_curve([single])
    assert half_width == pytest.approx([0.0196, 0.0392])  # one seed: the eval's own standard error


def test_time_to_target():
    times, accs = [0.0, 60.0, 120.0, 180.0], [0.1, 0.45, 0.5, 0.48]
    assert plots.time_to_target(times, accs, 0.5) == 120.0
    assert plots.time_to_target(times, accs, 0.45) == 60.0
    assert plots.time_to_target(times, accs, 0.05) == 0.0
    assert plots.time_to_target(times, accs, 0.51) == math.inf
    assert plots.time_to_target(times[::-1], accs[::-1], 0.5) == 120.0  # order does not matter
    with pytest.raises(ValueError, match="equal length"):
        plots.time_to_target([0.0, 1.0], [0.5], 0.5)


def test_speedup_kinds():
    assert plots.speedup(300.0, 100.0, 300.0, 150.0) == (3.0, "estimate")
    assert plots.speedup(300.0, math.inf, 300.0, 150.0) == (2.0, "upper_bound")  # method never got there
    assert plots.speedup(math.inf, 100.0, 400.0, 150.0) == (4.0, "lower_bound")  # baseline never got there
    assert plots.speedup(math.inf, math.inf, 400.0, 150.0) == (None, "undefined")


def make_compare_runs(root):
    """Baseline seeds A, B (peaks 0.6 and 0.8 at 300 s) and method seeds C, D (0.75 at 100 s, 0.8 at 150 s)."""
    grpo = {"num_generations": 16, "downsample_to": 16}
    pods = {"num_generations": 64, "downsample_to": 16, "downsample_rule": "max_variance"}
    base_t, method_t = [0.0, 100.0, 200.0, 300.0], [0.0, 50.0, 100.0, 150.0]
    return [
        make_run(root, "grpo_s0", base_t, [0.1, 0.3, 0.5, 0.6], config={**grpo, "seed": 0}),
        make_run(root, "grpo_s1", base_t, [0.1, 0.3, 0.5, 0.8], config={**grpo, "seed": 1}),
        make_run(root, "pods_s0", method_t, [0.1, 0.4, 0.75, 0.8], config={**pods, "seed": 0}),
        make_run(root, "pods_s1", method_t, [0.1, 0.4, 0.75, 0.8], config={**pods, "seed": 1}),
    ]


def test_compare_runs_hand_computed_speedup_and_ci(tmp_path):
    result = plots.compare_runs(make_compare_runs(tmp_path), n_boot=400, seed=0)
    base, method = result["baseline"], "PODS max_variance (n=64→m=16)"
    assert base == "GRPO (n=16)"
    # Baseline mean curve peaks at (0.6 + 0.8) / 2 = 0.7 at 300 s; PODS' mean curve is 0.75 at 100 s.
    assert result["target"] == pytest.approx(0.7)
    grpo, pods = result["labels"][base], result["labels"][method]
    assert grpo["time_to_target"] == 300.0 and pods["time_to_target"] == 100.0
    assert pods["speedup"] == pytest.approx(3.0) and pods["speedup_kind"] == "estimate"
    # Per seed: A peaks at 0.6 < 0.7 (never), B reaches 0.8 at 300 s.
    assert [s["time_to_target"] for s in grpo["seeds"]] == [None, 300.0]
    assert [s["reached"] for s in grpo["seeds"]] == [False, True]
    # Bootstrap: baseline resamples {A,A}: target 0.6 -> 300/100 = 3; {A,B}: 0.7 -> 3; {B,B}: 0.8 -> 300/150 = 2.
    # P({B,B}) = 1/4 > 2.5%, so the 95% interval is [2, 3].
    assert pods["speedup_ci95"] == pytest.approx([2.0, 3.0])
    json.dumps(result, allow_nan=False)  # strict JSON


def test_compare_runs_not_reached_is_a_bound_and_user_target(tmp_path):
    runs = make_compare_runs(tmp_path)
    result = plots.compare_runs(runs[:3], target=0.85, n_boot=0)  # nobody reaches 0.85
    method = result["labels"]["PODS max_variance (n=64→m=16)"]
    assert result["target_source"] == "user"
    assert method["time_to_target"] is None and method["speedup"] is None
    assert method["speedup_kind"] == "undefined"
    assert method["speedup_ci95"] is None and "2 seeds" in method["ci_note"]  # one PODS seed only

    result = plots.compare_runs(runs, target=0.78, n_boot=0)  # only PODS reaches 0.78 (at 150 s)
    method = result["labels"]["PODS max_variance (n=64→m=16)"]
    assert result["labels"]["GRPO (n=16)"]["time_to_target"] is None
    assert method["speedup_kind"] == "lower_bound" and method["speedup"] == pytest.approx(300.0 / 150.0)

    with pytest.raises(ValueError, match="baseline label"):
        plots.compare_runs(runs, baseline="nope")


def test_compare_cli_writes_json_and_table(tmp_path, capsys):
    runs = make_compare_runs(tmp_path)
    out = tmp_path / "cmp" / "compare.json"
    specs = [f"{r}=GRPO" if "grpo" in r.name else f"{r}=PODS" for r in runs]
    assert plots.compare_main([*specs, "--baseline", "GRPO", "--bootstrap", "200", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3.00x" in text and "[2.00, 3.00]" in text
    assert "—,5.0" in text  # GRPO seed 0 never reaches the target; seed 1 at 300 s = 5.0 min
    saved = json.loads(out.read_text())
    assert saved["labels"]["PODS"]["speedup"] == pytest.approx(3.0)
    assert plots.compare_main([str(tmp_path / "nothing")]) == 2


# ----------------------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------------------
def test_plot_accuracy_vs_time_figure_and_files(tmp_path):
    import matplotlib.pyplot as plt

    open_before = set(plt.get_fignums())  # another test's figure may be open; this test counts plots.py's own
    runs = make_compare_runs(tmp_path)
    out = tmp_path / "figs"
    fig = plots.plot_accuracy_vs_time([str(r) for r in runs], out=out, title="Arithmetic")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Training time (minutes)"
    assert ax.get_ylabel() == "Test accuracy (fraction)"
    assert ax.get_title() == "Arithmetic"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["GRPO (n=16) (2 seeds)", "PODS max_variance (n=64→m=16) (2 seeds)",
                      "shaded: 95% band, ± 1.96 standard errors across seeds"]
    # The PODS mean line: minutes on x, the mean of its (identical) seeds on y.
    pods_line = [line for line in ax.get_lines() if line.get_label().startswith("PODS")][0]
    assert pods_line.get_xdata().tolist() == pytest.approx([0.0, 50 / 60, 100 / 60, 150 / 60])
    assert pods_line.get_ydata().tolist() == pytest.approx([0.1, 0.4, 0.75, 0.8])
    assert len(ax.collections) == 2  # one band per label
    width, height = fig.get_size_inches()
    assert 3.5 <= width <= 7.0 and height < width
    for ext in ("png", "pdf"):
        assert (out / f"accuracy_vs_time.{ext}").stat().st_size > 1000

    fig_s = plots.plot_accuracy_vs_time(runs[:1], time_unit="s", metric="pass_at_k")
    assert fig_s.axes[0].get_xlabel() == "Training time (seconds)"
    assert fig_s.axes[0].get_ylabel() == "pass@k (fraction)"
    assert fig_s.axes[0].get_title() == "pass@k against training time"  # a title even when none is given
    legend = [t.get_text() for t in fig_s.axes[0].get_legend().get_texts()]
    assert not fig_s.axes[0].collections and not any(text.startswith("shaded") for text in legend)  # no band here
    assert set(plt.get_fignums()) <= open_before, "plots.py leaves figures open"


def test_plot_phase_times_stacked_bars(tmp_path):
    grpo = make_run(tmp_path, "grpo", [0.0], [0.1], phase_rows=[phase_row(1, 2.0, 0.2, 0.0, 1.0, 3.5),
                                                               phase_row(2, 4.0, 0.2, 0.0, 1.0, 5.5)])
    pods_a = make_run(tmp_path, "pods_a", [0.0], [0.1],
                      config={"num_generations": 64, "downsample_to": 16, "downsample_rule": "max_variance"},
                      phase_rows=[phase_row(1, 5.0, 0.4, 0.1, 0.5, 6.0)])
    pods_b = make_run(tmp_path, "pods_b", [0.0], [0.1],
                      config={"num_generations": 64, "downsample_to": 16, "downsample_rule": "max_variance",
                              "seed": 1},
                      phase_rows=[phase_row(1, 7.0, 0.6, 0.1, 0.5, 8.2)])
    out = tmp_path / "figs"
    fig = plots.plot_phase_times([grpo, pods_a, pods_b], out=out)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Time per training step (seconds)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["GRPO (n=16)", "PODS max_variance (n=64→m=16)"]
    bars = {c.get_label(): [p.get_width() for p in c.patches] for c in ax.containers}
    assert bars["generation"] == pytest.approx([3.0, 6.0])
    assert bars["scoring"] == pytest.approx([0.2, 0.5])
    assert bars["selection"] == pytest.approx([0.0, 0.1])
    assert bars["update"] == pytest.approx([1.0, 0.5])
    assert bars["other"] == pytest.approx([0.3, 0.0])  # time/step minus the phases: 4.5 - 4.2, 7.1 - 7.1
    for ext in ("png", "pdf"):
        assert (out / f"step_time_by_phase.{ext}").stat().st_size > 1000


def test_plot_cli(tmp_path, capsys):
    runs = make_compare_runs(tmp_path)
    with_phases = make_run(tmp_path, "timed", [0.0, 60.0], [0.2, 0.3],
                           phase_rows=[phase_row(1, 1.0, 0.1, 0.0, 0.5, 1.7)])
    out = tmp_path / "figs"
    assert plots.plot_main([*map(str, runs), f"{with_phases}=timed", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "accuracy_vs_time.pdf", "accuracy_vs_time.png", "step_time_by_phase.pdf", "step_time_by_phase.png"]
    assert "wrote" in capsys.readouterr().out

    empty = tmp_path / "empty"
    empty.mkdir()
    assert plots.plot_main([str(empty), "--out", str(tmp_path / "none")]) == 2
    assert "nothing to plot" in capsys.readouterr().err
    assert np.isfinite(plots.load_run(with_phases).phase_seconds["step"])


def test_plot_and_compare_on_steps(tmp_path, capsys):
    """--x steps: the figure's x is optimizer steps; compare counts steps to target (make_run's eval rows
    carry step = 0, 1, 2, 3, so GRPO reaches its peak mean 0.7 at step 3 and PODS' mean 0.75 at step 2)."""
    runs = make_compare_runs(tmp_path)
    fig = plots.plot_accuracy([str(r) for r in runs], x="steps")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Policy updates (optimizer steps)"
    pods_line = [line for line in ax.get_lines() if line.get_label().startswith("PODS")][0]
    assert pods_line.get_xdata().tolist() == [0, 1, 2, 3]

    out = tmp_path / "figs"
    assert plots.plot_main([*map(str, runs), "--x", "steps", "--out", str(out)]) == 0
    assert (out / "accuracy_vs_steps.png").stat().st_size > 1000 and not (out / "accuracy_vs_time.png").exists()

    cmp_out = tmp_path / "cmp.json"
    assert plots.compare_main([*map(str, runs), "--x", "steps", "--bootstrap", "0", "--out", str(cmp_out)]) == 0
    saved = json.loads(cmp_out.read_text())
    pods = saved["labels"]["PODS max_variance (n=64→m=16)"]
    assert saved["x"] == "steps" and saved["labels"]["GRPO (n=16)"]["steps_to_target"] == 3.0
    assert pods["steps_to_target"] == 2.0 and pods["speedup"] == pytest.approx(1.5)
    # 0.5 of GRPO's gain: 0.1 + 0.5 * (0.7 - 0.1) = 0.4: GRPO at step 2 (0.5), PODS at step 1 (0.4).
    assert plots.compare_main([*map(str, runs), "--x", "steps", "--target-gain-fraction", "0.5",
                               "--bootstrap", "0", "--out", str(cmp_out)]) == 0
    assert json.loads(cmp_out.read_text())["labels"]["PODS max_variance (n=64→m=16)"]["speedup"] == 2.0
    capsys.readouterr()
    assert plots.compare_main([*map(str, runs), "--target-gain-fraction", "1.5", "--out", str(cmp_out)]) == 2
    assert "(0, 1]" in capsys.readouterr().err
