"""Statistics, figures and study.json for study_pods_vs_grpo.py (the evidence study).

From the finished run directories under ``OUT/sweep/runs`` and ``OUT/study/runs`` it reports:

- the sweep: per learning rate, GRPO's mean held-out accuracy over the second half of training (the
  selection criterion: fast AND stable learning), its start, peak and gain, over seeds;
- (1) learning per update: steps each method needs to reach the target on its seed-mean curve, and the
  ratio GRPO / method with a percentile-bootstrap 95% CI over seeds (``pods_rl.stats.compare_runs``, x=steps);
- (2) the step-time ratio: mean seconds per optimizer step of the method / GRPO's (bootstrap CI over seeds);
- (3) the wall-clock speed-up: the same comparison on the training-time axis (x=time), next to (1)/(2);
- targets: GRPO's peak seed-mean accuracy (the paper's definition) and 80% of GRPO's gain;
- evaluation noise (mean standard error of one evaluation) against the seed-to-seed spread at equal steps;
- a PROJECTION: the wall-clock speed-up that the measured learning per update implies at other step-time
  ratios (the paper's single-GPU step times, this machine's), and the break-even ratio.

    python benchmarks/study_pods_vs_grpo.py report [--out DIR]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from pods_rl.runlog import read_metrics  # noqa: E402
from pods_rl.stats import (  # noqa: E402
    bootstrap_ci,
    compare_runs,
    load_run,
    resample,
)

GAIN_FRACTION = 0.8
# The paper's single-GPU GSM8K seconds per step (Qwen2.5-3B-Instruct, m = 16), n -> seconds.
PAPER_GPU_STEP_SECONDS = {16: 7.6, 32: 7.9, 64: 10.1, 128: 13.8}


def run_finished(run_dir: Path) -> bool:
    """Whether a run trained to its end: summary.json written, and not by a graceful stop (``stopped_by``)."""
    try:
        return "stopped_by" not in json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False


def _runs(runs_dir: Path) -> dict[str, list]:
    """{run name prefix (method or method-lr): [RunData, ...]} of finished runs (see ``run_finished``)."""
    groups: dict[str, list] = {}
    for run_dir in sorted(runs_dir.glob("*-s[0-9]*")):
        if not run_finished(run_dir):
            continue
        prefix = run_dir.name.rsplit("-s", 1)[0]
        groups.setdefault(prefix, []).append(load_run(run_dir, label=prefix))
    return groups


def _mean_se(values) -> tuple[float | None, float | None]:
    values = np.asarray([v for v in values if v is not None], dtype=float)
    if not len(values):
        return None, None
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return float(values.mean()), se


def sweep_report(sweep_dir: Path) -> dict | None:
    """Per learning rate: mean accuracy over the second half of training (criterion), start, peak, final."""
    groups = _runs(sweep_dir / "runs")
    if not groups:
        return None
    rows = {}
    for prefix, runs in groups.items():
        lr = float(prefix.split("-lr", 1)[1])
        second_half = [float(r.values[r.steps >= r.steps.max() / 2].mean()) for r in runs]
        rows[prefix] = {"lr": lr, "seeds": len(runs), "second_half_mean_accuracy": _mean_se(second_half),
                        "start": _mean_se([float(r.values[0]) for r in runs]),
                        "peak": _mean_se([float(r.values.max()) for r in runs]),
                        "final": _mean_se([float(r.values[-1]) for r in runs])}
    best = max(rows.values(), key=lambda row: row["second_half_mean_accuracy"][0])
    return {"criterion": "mean held-out accuracy over the evaluations of the second half of training, mean over "
                         "seeds", "learning_rates": dict(sorted(rows.items(), key=lambda kv: kv[1]["lr"])),
            "best_lr": best["lr"]}


def step_seconds(run) -> float:
    """Mean seconds per optimizer step of a run (time/step as logged, evaluation excluded)."""
    samples = [row["time/step"] for row in read_metrics(run.run_dir) if "time/step" in row]
    return float(np.mean(samples))


def noise_report(groups: dict[str, list]) -> dict:
    """Evaluation noise (mean stderr of one evaluation) vs seed-to-seed spread (std over seeds at equal steps)."""
    out = {}
    for name, runs in groups.items():
        eval_se = float(np.nanmean(np.concatenate([r.stderrs for r in runs])))
        common = sorted(set.intersection(*(set(r.steps.tolist()) for r in runs)) - {0})
        by_step = np.array([[r.values[list(r.steps).index(s)] for s in common] for r in runs])  # (S, E)
        spread = float(by_step.std(axis=0, ddof=1).mean()) if len(runs) > 1 and common else None
        start = np.array([r.values[0] for r in runs])  # the same model for every seed: eval noise only
        # The spread over seeds at equal steps holds evaluation noise too; what is left without it:
        between = math.sqrt(max(spread**2 - eval_se**2, 0.0)) if spread is not None else None
        out[name] = {"eval_stderr_mean": eval_se, "seed_std_mean_over_steps": spread,
                     "seed_std_without_eval_noise": between,
                     "seed_std_at_step_0": float(start.std(ddof=1)) if len(runs) > 1 else None}
    return out


def projection(step_ratios: dict[str, float], efficiency: dict) -> dict:
    """PROJECTED wall-clock speed-up = learning-per-update ratio E / step-time ratio r, at assumed ratios r.

    Args:
        step_ratios: {description: r}, e.g. {"paper 1xGPU GSM8K n=64 (10.1 s / 7.6 s)": 1.33}.
        efficiency: {method: (E, (E_low, E_high) or None)}: steps GRPO needs / steps the method needs.
    Returns {"rows": [{"source", "step_ratio", method: {"speedup", "ci95"}}...], "break_even": {method: ...}}.
    PODS stops paying where r exceeds E (the break-even step-time ratio).
    """
    rows = []
    for source, r in sorted(step_ratios.items(), key=lambda kv: kv[1]):
        row = {"source": source, "step_ratio": r}
        for method, (e, e_ci) in efficiency.items():
            ci = [None if v is None else v / r for v in e_ci] if e_ci else None  # a None bound is infinite
            row[method] = {"speedup": None if e is None else e / r, "ci95": ci}
        rows.append(row)
    return {"rows": rows, "break_even": {method: {"step_ratio": e, "ci95": e_ci}
                                         for method, (e, e_ci) in efficiency.items()}}


def study_report(study_dir: Path, out: Path) -> dict | None:
    """(1)-(3), noise, projection and figures for the study runs."""
    groups = _runs(study_dir / "runs")
    if "grpo-n16" not in groups or len(groups) < 2:
        return None
    from pods_rl.plots import plot_accuracy, plot_phase_times

    labelled = []
    for name, runs in groups.items():
        for run in runs:
            run.label = name
            labelled.append(run)
    result = {"methods": {}, "noise": noise_report(groups)}
    comparisons = {}
    for x in ("steps", "time"):
        for fraction in (None, GAIN_FRACTION):
            key = f"{x}/{'peak' if fraction is None else 'gain80'}"
            comparisons[key] = compare_runs(labelled, baseline="grpo-n16", x=x, target_gain_fraction=fraction)
    result["comparisons"] = comparisons

    seconds = {name: [step_seconds(r) for r in runs] for name, runs in groups.items()}
    base = seconds["grpo-n16"]
    for name, runs in groups.items():
        ratio, ci = _step_ratio(seconds[name], base)
        phases = {p: float(np.mean([r.phase_seconds.get(p, np.nan) for r in runs]))
                  for p in ("generation", "scoring", "selection", "update", "step")}
        entry = {"seeds": len(runs), "seconds_per_step": _mean_se(seconds[name]), "step_ratio": ratio,
                 "step_ratio_ci95": ci, "phase_seconds": phases,
                 "start_accuracy": _mean_se([float(r.values[0]) for r in runs]),
                 "final_accuracy": _mean_se([float(r.values[-1]) for r in runs]),
                 "peak_accuracy": _mean_se([float(r.values.max()) for r in runs])}
        for key, comparison in comparisons.items():
            label = comparison["labels"][name]
            entry[key] = {"to_target": label.get("steps_to_target", label.get("time_to_target")),
                          "ratio": label["speedup"], "kind": label["speedup_kind"],
                          "ci95": label.get("speedup_ci95")}
        for target in ("peak", "gain80"):  # check (3) against (1)/(2) at both targets
            steps_ratio = entry[f"steps/{target}"]["ratio"]
            entry[f"predicted_wall_speedup/{target}"] = steps_ratio / ratio if steps_ratio else None
        result["methods"][name] = entry

    # Selection against its control: the same n -> m generation, max_variance vs random choice of the kept.
    if {"pods-mv-n64m16", "pods-random-n64m16"} <= set(groups):
        control = [r for r in labelled if r.label in ("pods-mv-n64m16", "pods-random-n64m16")]
        result["selection_vs_random"] = {
            f"steps/{'peak' if f is None else 'gain80'}": compare_runs(
                control, baseline="pods-random-n64m16", x="steps", target_gain_fraction=f)
            for f in (None, GAIN_FRACTION)}

    efficiency = {name: (e["steps/peak"]["ratio"], e["steps/peak"]["ci95"])
                  for name, e in result["methods"].items() if name != "grpo-n16"}
    ratios = {f"paper 1xGPU GSM8K, n={n} -> 16 ({sec} s / 7.6 s)": round(sec / PAPER_GPU_STEP_SECONDS[16], 3)
              for n, sec in PAPER_GPU_STEP_SECONDS.items() if n > 16}
    for name, e in result["methods"].items():
        if name != "grpo-n16":
            ratios[f"this machine, {name}"] = round(e["step_ratio"], 3)
    ratios.update({f"assumed {r:g}": r for r in (1.0, 1.5, 2.0, 3.0)})
    result["projection"] = projection(ratios, efficiency)
    figures = []
    for x in ("steps", "time"):
        plot_accuracy(labelled, out=out, x=x, title=f"embedded task, {len(base)} seeds per method")
        figures.append(f"accuracy_vs_{x}.png")
    plot_phase_times(labelled, out=out, title="seconds per step by phase")
    figures.append("step_time_by_phase.png")
    result["figures"] = figures
    return result


def _step_ratio(seconds: list[float], base: list[float]) -> tuple[float, list | None]:
    """Mean step seconds of a method / the baseline's, with a bootstrap 95% CI over seeds."""
    ratio = float(np.mean(seconds) / np.mean(base))
    return ratio, bootstrap_ci(lambda rng: np.mean(resample(seconds, rng)) / np.mean(resample(base, rng)))


def _train_mean(run, key: str) -> float | None:
    """Mean over a run's logged training rows of ``key`` (e.g. completions/mean_length), None if never logged."""
    values = [row[key] for row in read_metrics(run.run_dir) if key in row]
    return float(np.mean(values)) if values else None


def options_report(options_dir: Path, baseline: str = "pods-mv-n32m16") -> dict | None:
    """Each selection option against PODS without it: (1)-(3) as in the study, plus completion length.

    Length: the mean completion length of the kept rollouts over training (``completions/mean_length``, what
    the update sees) and of held-out samples over the second half of training (``eval/mean_completion_tokens``),
    each as option / baseline with a bootstrap 95% CI over seeds.
    """
    groups = _runs(options_dir / "runs")
    if baseline not in groups or len(groups) < 2:
        return None
    from pods_rl.plots import plot_accuracy

    labelled = [run for runs in groups.values() for run in runs]
    comparisons = {f"{x}/{'peak' if f is None else 'gain80'}": compare_runs(labelled, baseline=baseline, x=x,
                                                                           target_gain_fraction=f)
                   for x in ("steps", "time") for f in (None, GAIN_FRACTION)}
    seconds = {name: [step_seconds(r) for r in runs] for name, runs in groups.items()}

    def held_out_length(run) -> float:
        length = load_run(run.run_dir, label=run.label, metric="mean_completion_tokens")
        return float(length.values[length.steps >= length.steps.max() / 2].mean())

    lengths = {name: {"train_kept": [_train_mean(r, "completions/mean_length") for r in runs],
                      "held_out_second_half": [held_out_length(r) for r in runs]} for name, runs in groups.items()}
    pods_keys = sorted({k for runs in groups.values() for r in runs for row in read_metrics(r.run_dir)
                        for k in row if k.startswith("pods/")})
    methods = {}
    for name, runs in groups.items():
        ratio, ratio_ci = _step_ratio(seconds[name], seconds[baseline])
        entry = {"seeds": len(runs), "seconds_per_step": _mean_se(seconds[name]), "step_ratio": ratio,
                 "step_ratio_ci95": ratio_ci, "final_accuracy": _mean_se([float(r.values[-1]) for r in runs]),
                 "pods_metrics": {k: _mean_se([_train_mean(r, k) for r in runs]) for k in pods_keys}}
        for key, comparison in comparisons.items():
            label = comparison["labels"][name]
            entry[key] = {"to_target": label.get("steps_to_target", label.get("time_to_target")),
                          "ratio": label["speedup"], "kind": label["speedup_kind"],
                          "ci95": label.get("speedup_ci95")}
        for kind, values in lengths[name].items():
            base = [v for v in lengths[baseline][kind] if v is not None]
            values = [v for v in values if v is not None]
            entry[f"length/{kind}"] = {
                "mean": _mean_se(values),
                "ratio_to_baseline": float(np.mean(values) / np.mean(base)) if values and base else None,
                "ci95": bootstrap_ci(lambda rng, v=values, b=base: np.mean(resample(v, rng)) /
                                     np.mean(resample(b, rng))) if values and base else None}
        methods[name] = entry
    out = options_dir
    for x in ("steps", "time"):
        plot_accuracy(labelled, out=out, x=x, title=f"selection options, {len(groups[baseline])} seeds each")
    plot_accuracy(labelled, out=out, x="steps", metric="mean_completion_tokens",
                  title="held-out completion length")
    return {"baseline": baseline, "comparisons": comparisons, "methods": methods,
            "figures": ["options/accuracy_vs_steps.png", "options/accuracy_vs_time.png",
                        "options/mean_completion_tokens_vs_steps.png"]}


def print_options(report: dict) -> None:
    """The options stage as a text table."""
    print(f"\noptions against {report['baseline']} (ratio baseline / option; > 1 favours the option):")
    for name, e in report["methods"].items():
        cells = []
        for key in ("steps/peak", "steps/gain80", "time/gain80"):
            entry = e[key]
            mark = {"upper_bound": "<", "lower_bound": ">"}.get(entry["kind"], "")
            ratio = "—" if entry["ratio"] is None else f"{mark}{entry['ratio']:.2f}x"
            cells.append(f"{key} {ratio} {_fmt_ci(entry['ci95'])}")
        length = e["length/train_kept"]
        held = e["length/held_out_second_half"]
        print(f"  {name:<24} " + "  ".join(cells) + f"  step ratio {e['step_ratio']:.2f} "
              f"{_fmt_ci(e['step_ratio_ci95'])}  kept length {length['mean'][0]:.2f} "
              f"(x{length['ratio_to_baseline']:.3f} {_fmt_ci(length['ci95'])})  held-out length "
              f"{held['mean'][0]:.2f} (x{held['ratio_to_baseline']:.3f} {_fmt_ci(held['ci95'])})  "
              f"final acc {e['final_accuracy'][0]:.3f} ± {e['final_accuracy'][1] or 0:.3f}")


def _fmt_ci(ci) -> str:
    if not ci:
        return "—"
    return "[" + ", ".join("inf" if v is None else f"{v:.2f}" for v in ci) + "]"


def print_tables(report: dict) -> None:
    """The sweep, the three numbers and the projection as text tables."""
    sweep = report.get("sweep")
    if sweep:
        print(f"sweep ({sweep['criterion']}):")
        for row in sweep["learning_rates"].values():
            m, se = row["second_half_mean_accuracy"]
            print(f"  lr {row['lr']:<8g} seeds {row['seeds']}  2nd-half acc {m:.3f} ± {se or 0:.3f}  "
                  f"start {row['start'][0]:.3f}  peak {row['peak'][0]:.3f}  final {row['final'][0]:.3f}")
        print(f"  best: {sweep['best_lr']:g}")
    study = report.get("study")
    if not study:
        return
    for key in ("steps/peak", "steps/gain80", "time/peak", "time/gain80"):
        c = study["comparisons"][key]
        print(f"\n{key}: target {c['target']:.4f} ({c['target_source']})")
        for name, e in study["methods"].items():
            entry = e[key]
            mark = {"upper_bound": "<", "lower_bound": ">"}.get(entry["kind"], "")
            ratio = "—" if entry["ratio"] is None else f"{mark}{entry['ratio']:.2f}x"
            print(f"  {name:<20} to target {entry['to_target']}  ratio {ratio}  95% CI {_fmt_ci(entry['ci95'])}")
    print("\nstep-time ratio and predicted wall-clock speed-up = (1)/(2), at the peak and gain80 targets:")
    for name, e in study["methods"].items():
        pred = [e[f"predicted_wall_speedup/{t}"] for t in ("peak", "gain80")]
        pred = " / ".join("—" if p is None else f"{p:.2f}x" for p in pred)
        print(f"  {name:<20} s/step {e['seconds_per_step'][0]:.3f}  ratio {e['step_ratio']:.2f} "
              f"{_fmt_ci(e['step_ratio_ci95'])}  (1)/(2) {pred}  "
              f"final acc {e['final_accuracy'][0]:.3f} ± {e['final_accuracy'][1] or 0:.3f}")
    for key, c in study.get("selection_vs_random", {}).items():
        label = c["labels"]["pods-mv-n64m16"]
        print(f"selection vs its control ({key}, target {c['target']:.4f}): max_variance n=64 -> 16 needs "
              f"{label.get('steps_to_target')} steps, random {c['labels']['pods-random-n64m16'].get('steps_to_target')}"
              f": ratio {'—' if label['speedup'] is None else format(label['speedup'], '.2f')}x {_fmt_ci(label.get('speedup_ci95'))}")
    proj = study["projection"]
    methods = list(proj["break_even"])
    print("\nPROJECTION: wall-clock speed-up = (1) / step-time ratio")
    for row in proj["rows"]:
        cells = "  ".join(f"{m}: {'—' if row[m]['speedup'] is None else format(row[m]['speedup'], '.2f')}x "
                          f"{_fmt_ci(row[m]['ci95'])}" for m in methods)
        print(f"  r={row['step_ratio']:<6.3g} {row['source']:<48} {cells}")
    print("  break-even step-time ratio: " + ", ".join(
        f"{m} {'—' if v['step_ratio'] is None else format(v['step_ratio'], '.2f')} {_fmt_ci(v['ci95'])}"
        for m, v in proj["break_even"].items()))
    print("\nnoise: eval stderr vs seed-to-seed std")
    for name, n in study["noise"].items():
        print(f"  {name:<20} eval SE {n['eval_stderr_mean']:.4f}  seed std {n['seed_std_mean_over_steps']:.4f}  "
              f"without eval noise {n['seed_std_without_eval_noise']:.4f}  (step 0, the same model for every "
              f"seed: {n['seed_std_at_step_0']:.4f})")


def write_report(out: Path, command: str | None = None) -> dict:
    """Compute everything from ``out/{sweep,study}/runs``, print it, and write ``out/study.json``."""
    from _machine import machine_info

    report = {"command": command, "machine": {**machine_info(), "gpu": None},
              "sweep": sweep_report(out / "sweep"), "study": study_report(out / "study", out),
              "options": options_report(out / "options") if (out / "options" / "runs").is_dir() else None}
    print_tables(report)
    if report["options"]:
        print_options(report["options"])
    (out / "study.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(f"\nwrote {out / 'study.json'}")
    return report
