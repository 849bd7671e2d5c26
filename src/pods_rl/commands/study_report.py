"""The report of `pods study`: from finished run directories to the three numbers, their intervals and figures.

For each method against the baseline (GRPO, n = m, unless ``--baseline`` names another), over seeds: (1) learning
per update (updates to the target, baseline / method), (2) the step-time ratio (seconds per optimizer step, method /
baseline), (3) the wall-clock speed-up (training time to the target), and the break-even (PODS pays iff (1) > (2));
targets: the baseline's peak seed-mean accuracy and 80% of its gain, read at the first evaluation reaching them and
interpolated between them. Also accuracy at equal updates and time, area under accuracy vs time, time to every
accuracy level, evaluation noise, selection against its random control, a projection onto other step-time ratios,
the sweep and figures; CIs: percentile bootstraps over seeds (``pods_rl.stats``, ``pods_rl.curves``), a seed's
methods paired only when they ran on the same machine. Written as ``study.json``, PNGs and ``report.txt``, which
docs/guides/study.md reads."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

from pods_rl import curves, stats
from pods_rl.commands.study_paths import portable
from pods_rl.commands.study_priced import priced_lines, priced_report
from pods_rl.commands.study_runner import machine_lines, same_machine_pairs
from pods_rl.machine import machine_info
from pods_rl.runlog import read_metrics, run_finished
from pods_rl.runlog.packed import runs_root

GAIN_FRACTION = 0.8
TARGETS = {"peak": None, "gain80": GAIN_FRACTION}  # target name -> fraction of the baseline's gain (None = peak)
# The paper's single-GPU GSM8K seconds per step (Qwen2.5-3B-Instruct, m = 16), n -> seconds.
PAPER_GPU_STEP_SECONDS = {16: 7.6, 32: 7.9, 64: 10.1, 128: 13.8}
PHASES = ("generation", "scoring", "selection", "update", "step")


def load_groups(runs_dir: Path) -> dict[str, list[stats.RunData]]:
    """{run name without its ``-s<seed>`` (the method, or method-lr<rate>): [RunData labelled so]} of the
    finished runs in ``runs_dir``."""
    groups: dict[str, list] = {}
    for run_dir in sorted(Path(runs_dir).glob("*-s[0-9]*")):
        if run_dir.is_dir() and run_finished(run_dir):
            prefix = run_dir.name.rsplit("-s", 1)[0]
            groups.setdefault(prefix, []).append(stats.load_run(run_dir, label=prefix))
    return groups


# ------------------------------------------------------------------------------------------------------------
# The sweep and the cost
# ------------------------------------------------------------------------------------------------------------
def sweep_report(runs_dir: Path) -> dict | None:
    """Per learning rate: mean held-out accuracy over the second half of training (the criterion), start, peak,
    final, over seeds; ``best_lr``. None without finished sweep runs."""
    groups = load_groups(runs_dir)
    if not groups:
        return None
    rows = {prefix: {"lr": float(prefix.split("-lr", 1)[1]), "seeds": len(runs),
                     "second_half_mean_accuracy": stats.mean_se([stats.second_half_mean(r) for r in runs]),
                     "start": stats.mean_se([float(r.values[0]) for r in runs]),
                     "peak": stats.mean_se([float(r.values.max()) for r in runs]),
                     "final": stats.mean_se([float(r.values[-1]) for r in runs])} for prefix, runs in groups.items()}
    best = max(rows.values(), key=lambda row: row["second_half_mean_accuracy"][0])
    return {"criterion": "mean held-out accuracy over the evaluations of the second half of training, mean over "
                         "seeds", "learning_rates": dict(sorted(rows.items(), key=lambda kv: kv[1]["lr"])),
            "best_lr": best["lr"]}


def cost_summary(cost: dict | None) -> dict | None:
    """The `pods cost` result reduced to {settings, rows: [{n, m, step_seconds, step_ratio, update_peak_gb, ...}]}."""
    if not cost:
        return None
    rows = [{"n": r["n"], "m": r["m"], "step_seconds": r["seconds"]["step"], "step_ratio": r["step_ratio"],
             "generation_seconds": r["seconds"]["generation"], "update_seconds": r["seconds"]["update"],
             "update_peak_gb": r.get("update_peak_gb"), "frac_zero_std_kept": r.get("frac_zero_std_kept"),
             # adaptive rollouts: what its rounds sampled
             **({"pilot_generations": r["pilot_generations"], "sampled_per_step": r["sampled_per_step"],
                 "rounds": r.get("rounds")} if r.get("pilot_generations") else {})}
            for r in cost["rows"] if r.get("oversample_prompts", 1.0) == 1.0]
    return {"settings": cost.get("settings"), "device": cost.get("machine", {}).get("device"), "rows": rows}


# ------------------------------------------------------------------------------------------------------------
# The study
# ------------------------------------------------------------------------------------------------------------
def _train_mean(run: stats.RunData, key: str) -> float | None:
    """Mean over a run's logged training rows of ``key`` (e.g. completions/mean_length), None if never logged."""
    values = [row[key] for row in read_metrics(run.run_dir) if key in row]
    return float(np.mean(values)) if values else None


def _held_out_length(run: stats.RunData) -> float | None:
    """Mean held-out completion length (tokens) over the second half of training."""
    length = stats.load_run(run.run_dir, label=run.label, metric="mean_completion_tokens")
    return stats.second_half_mean(length) if len(length.values) else None


def _rollouts_per_update(run: stats.RunData) -> float | None:
    """Rollouts a run generated per optimizer step: its logged ``pods/rollouts_sampled`` (PODS, adaptive), else
    n per kept group of its config (GRPO, which logs none)."""
    logged = _train_mean(run, "pods/rollouts_sampled")
    if logged is not None:
        return logged
    config = run.config or {}
    try:
        return float(config["per_device_train_batch_size"]) * config["num_generations"] / config["downsample_to"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _ratio_entry(values: list, base: list, n_boot: int) -> dict:
    values, base = [v for v in values if v is not None], [b for b in base if b is not None]
    ratio, ci = stats.ratio_of_means(values, base, n_boot=n_boot) if values and base else (None, None)
    return {"mean": stats.mean_se(values), "ratio_to_baseline": ratio, "ci95": ci}


# Long because every number shares the groups, the comparisons and the bootstrap settings; its parts are below.
def study_report(runs_dir: Path, out: Path | None, baseline: str, labels: dict[str, str] | None = None,
                 cost: dict | None = None, title: str = "", n_boot: int = 2000, figures: bool = True,
                 priced=None) -> dict | None:
    """The three numbers, break-even, noise, controls, projection and figures of the finished runs in ``runs_dir``
    (``<method>-s<seed>``) against ``baseline`` (GRPO n = m); None unless it and one other method have finished runs.
    Figures go to ``out`` (with ``figures``), named by ``labels`` ({method: label}); ``cost``: the `pods cost` JSON, if
    measured; ``n_boot``: bootstrap replicates per CI (0: none); ``priced``: a ``study_priced.PricedCosts`` to also
    price time at another machine's costs (``result["priced"]``)."""
    groups, machines = same_machine_pairs(load_groups(runs_dir), baseline)
    if baseline not in groups or len(groups) < 2:
        return None
    labels = labels or {}
    runs = [run for group in groups.values() for run in group]
    # At evaluation resolution, and the x at target interpolated between evaluations (what the table shows); below,
    # the accuracy at equal budgets and the area under the curve, read on each seed's curve over the span all cover.
    comparisons, interpolated = ({f"{x}/{target}": stats.compare_runs(runs, baseline=baseline, x=x, n_boot=n_boot,
                                                                      target_gain_fraction=fraction, interpolate=at)
                                  for x in ("steps", "time") for target, fraction in TARGETS.items()}
                                 for at in (False, True))
    curve_stats = {x: curves.curve_comparison({name: [stats.run_curve(r, x)[:2] for r in group]
                                               for name, group in groups.items()}, baseline, n_boot=n_boot)
                   for x in ("steps", "time")}
    to_levels = stats.level_time_ratios(groups, baseline, n_boot=n_boot)
    seconds = {name: [r.phase_seconds["step"] for r in group] for name, group in groups.items()}
    pods_keys = sorted({k for r in runs for row in read_metrics(r.run_dir) for k in row if k.startswith("pods/")})
    lengths = {name: {"train_kept": [_train_mean(r, "completions/mean_length") for r in group],
                      "held_out_second_half": [_held_out_length(r) for r in group]} for name, group in groups.items()}
    rollouts = {name: [_rollouts_per_update(r) for r in group] for name, group in groups.items()}
    methods = {}
    for name, group in groups.items():
        ratio, ratio_ci = stats.ratio_of_means(seconds[name], seconds[baseline], n_boot=n_boot)
        entry = {"label": labels.get(name, name), "seeds": len(group),
                 "seconds_per_step": stats.mean_se(seconds[name]), "step_ratio": ratio, "step_ratio_ci95": ratio_ci,
                 "phase_seconds": {p: float(np.mean([r.phase_seconds.get(p, np.nan) for r in group])) for p in PHASES},
                 "start_accuracy": stats.mean_se([float(r.values[0]) for r in group]),
                 "final_accuracy": stats.mean_se([float(r.values[-1]) for r in group]),
                 "peak_accuracy": stats.mean_se([float(r.values.max()) for r in group]),
                 "selection_metrics": {k: stats.mean_se([_train_mean(r, k) for r in group]) for k in pods_keys},
                 "completion_length": {kind: _ratio_entry(values, lengths[baseline][kind], n_boot)
                                       for kind, values in lengths[name].items()},
                 # rollouts generated per update, and that over the baseline's (CI: bootstrap over seeds)
                 "rollouts_per_update": {**_ratio_entry(rollouts[name], rollouts[baseline], n_boot),
                                         "mean_ci95": stats.bootstrap_ci([v for v in rollouts[name] if v is not None],
                                                                         n_boot=n_boot) if n_boot else None}}
        entry["interpolated"] = {}  # the same keys as below, the x at target interpolated between evaluations
        for numbers, by_key in ((entry, comparisons), (entry["interpolated"], interpolated)):
            numbers.update({key: _to_target(comparison["labels"][name]) for key, comparison in by_key.items()})
            for target in TARGETS:  # (3) against (1)/(2) at both targets
                learning = numbers[f"steps/{target}"]["ratio"]
                numbers[f"predicted_wall_speedup/{target}"] = learning / ratio if learning else None
                numbers[f"break_even/{target}"] = stats.break_even(learning, numbers[f"steps/{target}"]["ci95"],
                                                                   ratio, ratio_ci)
        for x, key in (("steps", "updates"), ("time", "time")):  # accuracy at equal budgets, area under the curve
            entry[f"accuracy_at_equal_{key}"] = curve_stats[x]["labels"][name]["at_budget"]
            entry[f"area_vs_{key}"] = curve_stats[x]["labels"][name]["area"]
        entry["to_levels"] = to_levels.get(name)
        methods[name] = entry
    result = {"baseline": baseline, "methods": methods, "comparisons": comparisons,
              "comparisons_interpolated": interpolated, "curves": curve_stats, "verdict_rule": curves.VERDICT_RULE,
              "noise": {name: stats.eval_noise(group) for name, group in groups.items()}}
    if machines:
        result["machines"] = machines
    if priced is not None:
        result["priced"] = priced_report(groups, baseline, priced, n_boot=n_boot)
    result["selection_vs_random"] = _selection_vs_random(groups, runs, n_boot)
    result["projection"] = _projection(methods, baseline, cost)
    result["figures"] = _figures(runs, out, labels, title) if figures else []
    return result


def _to_target(label: dict) -> dict:
    """One label of a ``stats.compare_runs`` result as {to_target, ratio, kind, ci95, verdict}."""
    ci = label.get("speedup_ci95")
    return {"to_target": label.get("steps_to_target", label.get("time_to_target")), "ratio": label["speedup"],
            "kind": label["speedup_kind"], "ci95": ci,
            "verdict": "baseline" if label["speedup_kind"] == "baseline" else curves.interval_verdict(ci)}


def seeds_per_method(counts: list[int]) -> str:
    """The figures' "N seeds per method" from each method's finished seeds ``counts`` (L,); "N-M" when they differ."""
    low, high = min(counts), max(counts)
    return f"{low} seeds per method" if low == high else f"{low}-{high} seeds per method"


def _figures(runs: list, out: Path, labels: dict[str, str], title: str) -> list[str]:
    """accuracy_vs_steps, accuracy_vs_time and step_time_by_phase as PNG in ``out``; their names."""
    import matplotlib.pyplot as plt

    from pods_rl.figures import STYLE, plot_accuracy, plot_phase_times

    named = [dataclasses.replace(r, label=labels.get(r.label, r.label)) for r in runs]
    seeds = seeds_per_method([len(g) for g in stats.group_by_label(named).values()])
    figures = {f"accuracy_vs_{x}.png": plot_accuracy(named, x=x, title=f"{title}{', ' if title else ''}{seeds}")
               for x in ("steps", "time")}
    figures["step_time_by_phase.png"] = plot_phase_times(named, title="seconds per step by phase")
    Path(out).mkdir(parents=True, exist_ok=True)
    with plt.rc_context({**STYLE, "savefig.dpi": 150}):
        for name, fig in figures.items():
            fig.savefig(Path(out) / name, bbox_inches="tight")
            plt.close(fig)
    return list(figures)


def headline(study: dict) -> dict:
    """The three numbers of each method against the baseline, to GRPO's peak: {method: {learning_per_update,
    step_time_ratio, wall_clock_speedup, break_even}}, each number as {value, ci95, ...}, at evaluation
    resolution; the same interpolated between evaluations (``*_interpolated``, with their verdicts), and the
    accuracy at equal updates and training time and the area under accuracy vs training time against the baseline."""
    numbers = {}
    for name, e in study["methods"].items():
        if name == study["baseline"]:
            continue
        numbers[name] = {
            "learning_per_update": _number(e["steps/peak"], updates_to_target=e["steps/peak"]["to_target"]),
            "step_time_ratio": {"value": e["step_ratio"], "ci95": e["step_ratio_ci95"],
                                "seconds_per_step": e["seconds_per_step"][0]},
            "wall_clock_speedup": _number(e["time/peak"], seconds_to_target=e["time/peak"]["to_target"]),
            "break_even": e["break_even/peak"],
            # rollouts generated per update (PODS: n per prompt; adaptive: what its rounds needed), over seeds
            "rollouts_per_update": e.get("rollouts_per_update"),
            "rounds_per_update": e.get("selection_metrics", {}).get("pods/rounds")}
        i = e.get("interpolated")
        if i:  # a report computed before interpolation was added has none
            numbers[name].update({
                "learning_per_update_interpolated": _number(i["steps/peak"], verdict=i["steps/peak"]["verdict"],
                                                            updates_to_target=i["steps/peak"]["to_target"]),
                "wall_clock_speedup_interpolated": _number(i["time/peak"], verdict=i["time/peak"]["verdict"],
                                                           seconds_to_target=i["time/peak"]["to_target"]),
                "break_even_interpolated": i["break_even/peak"],
                "accuracy_at_equal_updates": e["accuracy_at_equal_updates"],
                "accuracy_at_equal_time": e["accuracy_at_equal_time"], "area_vs_time": e["area_vs_time"]})
        for x, key in (("time", "wall_clock_speedup_levels"), ("steps", "learning_per_update_levels")):
            level = (e.get("to_levels") or {}).get(x)
            if level:  # a report computed before the levels statistic was added has none
                numbers[name][key] = {k: level[k] for k in curves.LEVEL_SUMMARY if k in level}
    return numbers


def _number(entry: dict, **more) -> dict:
    return {"value": entry["ratio"], "ci95": entry["ci95"], "kind": entry["kind"], **more}


# ------------------------------------------------------------------------------------------------------------
# The printed table
# ------------------------------------------------------------------------------------------------------------
def fmt_ci(ci) -> str:
    """A confidence interval as ``[lo, hi]`` (two decimals; ``inf`` for None, ``[—]`` when absent)."""
    if not ci:
        return "[—]"
    return "[" + ", ".join("inf" if v is None else f"{v:.2f}" for v in ci) + "]"


def _fmt_ratio(entry: dict) -> str:
    mark = {"upper_bound": "<", "lower_bound": ">"}.get(entry["kind"], "")
    return "—" if entry["ratio"] is None else f"{mark}{entry['ratio']:.2f}x"


def _selection_vs_random(groups: dict, runs: list, n_boot: int) -> dict:
    """Selection against its control: the same n -> m generation, max_variance vs a random choice of the kept;
    updates to the control's target, at evaluation resolution and interpolated."""
    pairs = {name.replace("pods-random-", "pods-mv-", 1): name for name in groups if name.startswith("pods-random-")}
    return {f"{selected} vs {name}": {
        f"steps/{target}{suffix}": stats.compare_runs([r for r in runs if r.label in (name, selected)], baseline=name,
                                                      x="steps", n_boot=n_boot, target_gain_fraction=f,
                                                      interpolate=bool(suffix))
        for target, f in TARGETS.items() for suffix in ("", "/interpolated")}
        for selected, name in pairs.items() if selected in groups}


def _projection(methods: dict, baseline: str, cost: dict | None) -> dict:
    """Wall-clock speed-up projected to other step-time ratios: the paper's GPU ones, this study's, `pods cost`'s
    and a few assumed ones, from each method's learning per update (interpolated between evaluations)."""
    efficiency = {name: (e["interpolated"]["steps/peak"]["ratio"], e["interpolated"]["steps/peak"]["ci95"])
                  for name, e in methods.items() if name != baseline}
    ratios = {f"paper 1xGPU GSM8K, n={n} -> 16 ({sec} s / 7.6 s)": round(sec / PAPER_GPU_STEP_SECONDS[16], 3)
              for n, sec in PAPER_GPU_STEP_SECONDS.items() if n > 16}
    ratios.update({f"this study's runs, {name}": round(e["step_ratio"], 3) for name, e in methods.items()
                   if name != baseline})
    for row in (cost or {}).get("rows", []):
        if row["n"] != row["m"]:
            pilot = f" k{row['pilot_generations']}" if row.get("pilot_generations") else ""
            ratios[f"pods cost, n={row['n']} -> {row['m']}{pilot}"] = round(row["step_ratio"], 3)
    ratios.update({f"assumed {r:g}": r for r in (1.0, 1.5, 2.0, 3.0)})
    return stats.projection(ratios, efficiency)


def format_report(report: dict) -> str:
    """The report as text: the sweep, the three numbers with CIs and the break-even, noise, cost, projection."""
    lines = _setup_lines(report)
    study = report.get("study")
    if not study:
        lines.append("\nno study report yet: the baseline and at least one other method need finished runs")
        return "\n".join(lines)
    others = {name: e for name, e in study["methods"].items() if name != study["baseline"]}
    lines += _numbers_lines(study, others)
    lines += _curve_lines(study, others)
    lines += _noise_and_projection_lines(study)
    if study.get("priced"):
        lines += priced_lines(study["priced"], {name: e["label"] for name, e in study["methods"].items()})
    return "\n".join(lines + machine_lines(study))


def _setup_lines(report: dict) -> list[str]:
    """What the study ran: the plan, the learning-rate sweep, `pods cost`'s step-time ratios."""
    lines = []
    plan = report.get("plan") or {}
    if plan:
        lines.append(f"pods study: {plan.get('recipe')}; m = {plan.get('m')}, {plan.get('prompts_per_step')} prompts x "
                     f"m kept rollouts per update, {plan.get('updates')} updates, lr {plan.get('lr')}, evaluation "
                     f"every {plan.get('eval_every')} updates on {plan.get('eval_problems')} problems x "
                     f"{plan.get('eval_k')} samples; device {plan.get('device')}")
    sweep = report.get("sweep")
    if sweep:
        lines.append(f"\nGRPO learning-rate sweep ({sweep['criterion']}):")
        for row in sweep["learning_rates"].values():
            m, se = row["second_half_mean_accuracy"]
            lines.append(f"  lr {row['lr']:<8g} seeds {row['seeds']}  2nd-half accuracy {m:.3f} ± {se or 0:.3f}  "
                         f"start {row['start'][0]:.3f}  peak {row['peak'][0]:.3f}  final {row['final'][0]:.3f}")
        lines.append(f"  best: {sweep['best_lr']:g}")
    cost = report.get("cost")
    if cost:
        cells = ", ".join(f"{r['n']} -> {r['m']}"
                          f"{' k' + str(r['pilot_generations']) if r.get('pilot_generations') else ''}: "
                          f"{r['step_ratio']:.2f} ({r['step_seconds']:.3f} s"
                          + (f", update peak {r['update_peak_gb']:.2f} GB" if r.get("update_peak_gb") else "") + ")"
                          for r in cost["rows"])
        lines.append(f"\npods cost step-time ratios ({cost['settings']['schedule']}, {cost['settings']['steps']} "
                     f"steps each, {cost['device']}): {cells}")
    return lines


# Long because it is one table and its footnotes, line by line as printed.
def _numbers_lines(study: dict, others: dict) -> list[str]:
    """The three numbers per method with their CIs and the break-even, then the other targets and readings."""
    lines = []
    base = study["methods"][study["baseline"]]
    c = study["comparisons"]
    lines.append(f"\nThe three numbers (ratios {study['baseline']} / method: > 1 favours the method; 95% CIs: "
                 f"percentile bootstrap over seeds). Target: {study['baseline']}'s peak seed-mean accuracy "
                 f"{c['steps/peak']['target']:.4f} on the update axis, {c['time/peak']['target']:.4f} on the time "
                 "axis. "
                 "Updates and time to target interpolated between evaluations (linearly, between the last evaluation "
                 "below the target and the first at or above it).")
    head = (f"  {'method':<34} {'seeds':>5}  {'(1) learning per update':<31} {'(2) step-time ratio':<22} "
            f"{'(3) wall-clock speed-up':<31} {'(1)/(2)':>7}  break-even: pays iff (1) > (2)")
    lines += [head, "  " + "-" * (len(head) - 2)]
    for name, e in study["methods"].items():
        i, pred = e["interpolated"], e["interpolated"]["predicted_wall_speedup/peak"]
        if name == study["baseline"]:  # (1), (2), (3), (1)/(2), break-even
            cells = (f"1 ({i['steps/peak']['to_target']:.0f} updates)" if i["steps/peak"]["to_target"] else "1",
                     f"1 ({e['seconds_per_step'][0]:.3f} s/step)",
                     f"1 ({i['time/peak']['to_target']:.0f} s)" if i["time/peak"]["to_target"] else "1",
                     "1", "(baseline)")
        else:
            cells = (f"{_fmt_ratio(i['steps/peak'])} {fmt_ci(i['steps/peak']['ci95'])} {i['steps/peak']['verdict']}",
                     f"{e['step_ratio']:.2f} {fmt_ci(e['step_ratio_ci95'])}",
                     f"{_fmt_ratio(i['time/peak'])} {fmt_ci(i['time/peak']['ci95'])} {i['time/peak']['verdict']}",
                     "—" if pred is None else format(pred, ".2f") + "x", i["break_even/peak"]["verdict"])
        lines.append("  {:<34} {:>5}  {:<31} {:<22} {:<31} {:>7}  {}".format(e["label"][:34], e["seeds"], *cells))
    lines.append("  at evaluation resolution (the first evaluation reaching the target: values on the evaluation "
                 "grid): " + "; ".join(f"{e['label']}: (1) {_fmt_ratio(e['steps/peak'])} "
                                       f"{fmt_ci(e['steps/peak']['ci95'])}, (3) {_fmt_ratio(e['time/peak'])} "
                                       f"{fmt_ci(e['time/peak']['ci95'])}" for e in others.values()))
    lines.append(f"  at 80% of {study['baseline']}'s gain (target {c['steps/gain80']['target']:.4f}): " + "; ".join(
        f"{e['label']}: (1) {_fmt_ratio(i['steps/gain80'])} {fmt_ci(i['steps/gain80']['ci95'])}, (3) "
        f"{_fmt_ratio(i['time/gain80'])} {fmt_ci(i['time/gain80']['ci95'])} {i['time/gain80']['verdict']}, "
        f"break-even: {i['break_even/gain80']['verdict']}" for e in others.values() for i in [e["interpolated"]]))
    leveled = [(e["label"], e["to_levels"]) for e in others.values() if e.get("to_levels")]
    if leveled:
        f = leveled[0][1]["time"]["fractions"]
        lines.append(f"  to every accuracy level from {f[0]:.0%} to {f[-1]:.0%} of {study['baseline']}'s gain "
                     f"({len(f)} levels, seed-mean curves; geometric mean of the baseline's x / the method's; "
                     "CI: bootstrap paired by seed): " + "; ".join(
                         f"{label}: (3) {curves.format_level(v['time'])}, (1) {curves.format_level(v['steps'])}"
                         for label, v in leveled))
    sampled = [(e["label"], e["rollouts_per_update"], e.get("selection_metrics", {}).get("pods/rounds"))
               for e in study["methods"].values() if (e.get("rollouts_per_update") or {}).get("mean", (None,))[0]]
    if sampled:
        lines.append("  rollouts generated per update (mean over seeds [95% CI]; x the baseline's [CI]; rounds): "
                     + "; ".join(
            f"{label} {v['mean'][0]:.1f} {fmt_ci(v.get('mean_ci95'))}"
            + (f" = {v['ratio_to_baseline']:.2f}x {fmt_ci(v['ci95'])}" if v.get("ratio_to_baseline") else "")
            + (f" ({r[0]:.2f} rounds)" if r and r[0] is not None else "") for label, v, r in sampled))
    lines.append("  break-even: 'pays' = (1)'s CI lies above (2)'s, 'does not pay' = below, 'undecided' = they "
                 "overlap (more seeds or updates)")
    last = c["steps/peak"]["labels"][study["baseline"]]["last_step"]
    if base["steps/peak"]["to_target"] == last:
        lines.append(f"  note: {study['baseline']}'s seed-mean accuracy peaks at its last evaluation ({last:.0f} "
                     "updates): it is still rising, so its 'peak' is the end of the budget, not a plateau")
    lines.append(f"  final accuracy (start {base['start_accuracy'][0]:.3f}): " + ", ".join(
        f"{e['label']} {e['final_accuracy'][0]:.3f} ± {e['final_accuracy'][1] or 0:.3f}"
        for e in study["methods"].values()))
    for pair, comparison in study.get("selection_vs_random", {}).items():
        selected = pair.split(" vs ")[0]
        label = comparison["steps/peak/interpolated"]["labels"][selected]
        lines.append(f"  selection vs its random control ({pair}), updates to the control's peak (interpolated): "
                     f"{_fmt_ratio({'ratio': label['speedup'], 'kind': label['speedup_kind']})} "
                     f"{fmt_ci(label.get('speedup_ci95'))} {curves.interval_verdict(label.get('speedup_ci95'))}")
    return lines


def _noise_and_projection_lines(study: dict) -> list[str]:
    """Evaluation noise against the seed spread, and the projection to other step-time ratios."""
    lines = ["\nevaluation noise against seed spread (std of accuracy over seeds at equal updates):"]
    for name, n in study["noise"].items():
        share = n["eval_share_of_seed_variance"]
        lines.append(f"  {study['methods'][name]['label'][:34]:<34} eval SE {_f(n['eval_stderr_mean'])}  seed std "
                     f"{_f(n['seed_std_mean_over_steps'])}  without eval noise {_f(n['seed_std_without_eval_noise'])}"
                     + (f"  evaluation = {100 * share:.0f}% of the seed variance" if share is not None else ""))
    worst = max((n["eval_share_of_seed_variance"] or 0 for n in study["noise"].values()), default=0)
    if worst > 0.5:
        lines.append("  warning: evaluation noise is over half the seed variance; raise --eval-problems or --eval-k")
    proj = study["projection"]
    lines.append("\nPROJECTION (not a measurement): wall-clock speed-up = (1) / step-time ratio r")
    for row in proj["rows"]:
        cells = "  ".join(f"{m}: {'—' if row[m]['speedup'] is None else format(row[m]['speedup'], '.2f')}x "
                          f"{fmt_ci(row[m]['ci95'])}" for m in proj["break_even"])
        lines.append(f"  r={row['step_ratio']:<6.3g} {row['source']:<46} {cells}")
    return lines


def _curve_lines(study: dict, others: dict) -> list[str]:
    """The accuracy at equal updates and training time, the area under accuracy vs time, the verdict rule."""
    base = study["methods"][study["baseline"]]
    lines = [f"\naccuracy at equal budgets, read on each seed's curve (interpolated between evaluations) at "
             f"25/50/75/100% of the span every run covers; method - {study['baseline']} [95% CI] verdict:"]
    for key, unit in (("updates", ""), ("time", " s")):
        lines.append(f"  {base['label'][:34]:<34} {key:<7} " + " | ".join(
            f"{row['x']:.0f}{unit}: {row['mean']:.3f}" for row in base[f"accuracy_at_equal_{key}"]) + " (baseline)")
        for e in others.values():
            lines.append(f"  {e['label'][:34]:<34} {key:<7} " + " | ".join(
                f"{row['x']:.0f}{unit}: {curves.format_difference(row)}" for row in e[f"accuracy_at_equal_{key}"]))
    start, end = study["curves"]["time"]["span"]
    area = base["area_vs_time"]
    lines.append(f"area under accuracy vs training time over {start:.0f}-{end:.0f} s, divided by the span (the mean "
                 f"accuracy over it): {base['label']} {area['mean']:.3f}; " + "; ".join(
                     f"{e['label']} {e['area_vs_time']['mean']:.3f}: {curves.format_difference(e['area_vs_time'])}, "
                     f"ratio {curves.format_area_ratio(e['area_vs_time'])}" for e in others.values()))
    return lines + [f"{study['verdict_rule']}; break-even as above"]


def _f(value) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def write_report(out: Path, plan_info: dict | None = None, command: str | None = None, priced=None) -> dict:
    """Compute the report from ``out/{sweep,study}/runs`` (or ``out/runs.tar.xz``) and ``out/cost.json``; write
    ``out/study.json``, ``out/report.txt`` and the figures; print the table. ``plan_info``: baseline, labels...;
    ``priced``: ``study_priced.PricedCosts`` to price time at too."""
    out = Path(out)
    plan_info = portable(plan_info or {})
    cost = json.loads((out / "cost.json").read_text()) if (out / "cost.json").is_file() else None
    with runs_root(out) as root:  # out, or its archive unpacked
        root = Path(os.path.abspath(root))  # so that every run folder below is named relative to it
        runs = root / "study" / "runs"
        report = {"command": portable(command), "plan": plan_info, "machine": machine_info(),
                  "cost": cost_summary(cost), "sweep": portable(sweep_report(root / "sweep" / "runs"), root)}
        baseline = plan_info.get("baseline") or _guess_baseline(runs)
        lr = _run_learning_rate(runs, baseline)
        if lr is not None:  # the rate the study's runs trained with (a report alone does not know it otherwise)
            report["plan"] = plan_info = {**plan_info, "lr": lr}
        study = study_report(runs, out, baseline, plan_info.get("labels"), report["cost"], plan_info.get("title", ""),
                             plan_info.get("bootstrap", 2000), priced=priced) if baseline else None
        report["study"] = portable(study, root)  # its run folders relative to the study's folder
    report["headline"] = headline(report["study"]) if report["study"] else None
    text = format_report(report)
    print(text)
    (out / "report.txt").write_text(text + "\n")
    (out / "study.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(f"\nwrote {out / 'study.json'}, {out / 'report.txt'}" + (
        ", " + ", ".join(report["study"]["figures"]) if report["study"] else ""))
    return report


def _run_learning_rate(runs_dir: Path, baseline: str | None) -> float | None:
    """The learning rate in the config.yaml of the baseline's first finished study run, if any."""
    finished = [d for d in sorted(Path(runs_dir).glob(f"{baseline}-s[0-9]*")) if run_finished(d)] if baseline else []
    return stats.load_run(finished[0]).config.get("learning_rate") if finished else None


def _guess_baseline(runs_dir: Path) -> str | None:
    """The GRPO method among the run names (``grpo-n<m>``), if exactly one."""
    names = {p.name.rsplit("-s", 1)[0] for p in Path(runs_dir).glob("grpo-n*-s[0-9]*")}
    return names.pop() if len(names) == 1 else None
