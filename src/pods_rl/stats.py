"""Statistics over run directories: seed-mean curves, time (or steps) to a target, speed-ups with bootstrap CIs.

Used by `pods compare`, `pods plot` and the benchmarks; the interval machinery is ``pods_rl.bootstrap``. Runs are
``RUN_DIR`` or ``RUN_DIR=LABEL``; runs sharing a label are seeds of one method (default label from config.yaml:
``GRPO (n=16)`` or ``PODS max_variance (n=64→m=16)``).

- Curve: a run's evaluations (x, accuracy) from ``eval.json`` or else ``metrics.jsonl``; x is training seconds
  (``x="time"``, checkpointing and evaluation excluded) or optimizer steps (``x="steps"``).
- Mean curve: seeds interpolated linearly onto the union of their xs inside the span all cover; band ± 1.96 SE
  across seeds (one seed: its eval's own ``accuracy_stderr``).
- Target: the baseline mean curve's peak, or start + f x (peak - start) (``target_gain_fraction``), or fixed.
- Time to target: the first evaluation at or above it (``inf`` if never), or interpolated (``interpolate=True``).
  Speed-up = baseline / method; an upper bound when the method never reaches, a lower bound when only the
  baseline does not. 95% CI: percentile bootstrap over each label's seeds (>= 2 seeds each).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pods_rl.bootstrap import (  # noqa: F401  (re-exported: they lived here before pods_rl.bootstrap)
    bootstrap_ci,
    break_even,
    mean_se,
    percentile_interval,
    projection,
    ratio_of_means,
    resample,
)
from pods_rl.curves import (
    TARGET_TOLERANCE,
    finite_or_none,
    interpolated_crossing,
    mean_of_curves,
    paired_level_time_ratio,
    sorted_curve,
)
from pods_rl.runlog import DEFAULT_EVAL_FILE, load_results, load_run_config, read_metrics

PHASES = ("generation", "scoring", "selection", "update")
# Per-evaluation metrics a curve can follow (keys of eval.json records / ``eval/*`` rows of metrics.jsonl);
# mean_completion_tokens is the held-out completion length (a length-aware tiebreak should move it).
METRICS = ("accuracy", "format_accuracy", "both_accuracy", "pass_at_k", "mean_completion_tokens")
# x-axis name -> (unit, result key of the value at the target, result key of the last observed x).
X_AXES = {"time": ("seconds", "time_to_target", "last_time"),
          "steps": ("steps", "steps_to_target", "last_step")}


# ------------------------------------------------------------------------------------------------------------
# Loading runs
# ------------------------------------------------------------------------------------------------------------
@dataclass
class RunData:
    """One run directory's evaluations: times, values, stderrs (nan: unknown), steps (-1: unknown), all (E,).

    ``source`` is "eval.json", "metrics.jsonl" or None; ``phase_seconds`` the mean seconds per step of each phase."""

    run_dir: Path
    label: str
    config: dict = field(default_factory=dict)
    seed: int | None = None
    times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    stderrs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    metric: str = "accuracy"
    source: str | None = None
    phase_seconds: dict = field(default_factory=dict)


def default_label(config: dict, fallback: str = "run") -> str:
    """``GRPO (n=16)`` or ``PODS <rule> (n=64→m=16)`` from a run config, `` +<planner>`` for each planner it ran
    (``PODS max_variance (n=32→m=8) +auto``: n is then the most a prompt got); ``fallback`` without num_generations."""
    n = config.get("num_generations")
    if n is None:
        return fallback
    m = config.get("downsample_to")
    planners = "".join(f" +{config[key]}" for key in ("prompt_planner", "rollout_planner") if config.get(key))
    if m is None or int(m) == int(n):
        return f"GRPO (n={n}){planners}"
    rule = config.get("downsample_rule", "max_variance")
    return f"PODS {rule} (n={n}→m={m}){planners}"


def parse_run_spec(spec) -> tuple[Path, str | None]:
    """``"RUN_DIR=LABEL"`` -> (Path(RUN_DIR), LABEL); ``"RUN_DIR"`` -> (Path(RUN_DIR), None)."""
    spec = str(spec)
    left, sep, label = spec.rpartition("=")
    if sep and left and not Path(spec).exists():
        return Path(left), (label or None)
    return Path(spec), None


def _select_eval_records(records: list[dict], filters: dict, path: Path) -> list[dict]:
    """Records matching ``filters``; of several (task, split, k, temperature) settings, the most common (warned)."""
    kept = [r for r in records if all(v is None or r.get(f) == v for f, v in filters.items())]
    groups: dict[tuple, list[dict]] = {}
    for r in kept:
        groups.setdefault((r.get("task"), r.get("split"), r.get("k"), r.get("temperature")), []).append(r)
    if len(groups) > 1:
        chosen = max(groups, key=lambda g: len(groups[g]))
        print(f"warning: {path} holds several eval settings {sorted(groups, key=str)}; using "
              f"task/split/k/temperature = {chosen} (choose with --task/--split/--k/--temperature)",
              file=sys.stderr)
        return groups[chosen]
    return kept


def load_run(run_dir, label: str | None = None, metric: str = "accuracy", task: str | None = None,
             split: str | None = None, k: int | None = None, temperature: float | None = None) -> RunData:
    """Read a run directory's config.yaml, eval.json (or metrics.jsonl eval rows) and phase times."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} does not exist")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    config = load_run_config(run_dir)
    run = RunData(run_dir=run_dir, label=label or default_label(config, fallback=run_dir.name), config=config,
                  seed=config.get("seed"), metric=metric)

    rows = read_metrics(run_dir)  # a torn last line of the append-only log is skipped
    points = []  # (train_seconds, value, stderr, step)
    eval_path = run_dir / DEFAULT_EVAL_FILE
    records = load_results(eval_path) if eval_path.is_file() else []
    records = _select_eval_records(records, {"task": task, "split": split, "k": k, "temperature": temperature},
                                   eval_path)
    for r in records:
        if r.get("train_seconds") is None or r.get(metric) is None:
            continue
        stderr = r.get("accuracy_stderr") if metric == "accuracy" else None
        points.append((float(r["train_seconds"]), float(r[metric]), np.nan if stderr is None else float(stderr),
                       int(r.get("step", -1))))
    if points:
        run.source = "eval.json"
    else:
        key = f"eval/{metric}"
        stderr_key = "eval/accuracy_stderr" if metric == "accuracy" else None
        points = [(float(row["train_seconds"]), float(row[key]), float(row.get(stderr_key, np.nan)),
                   int(row.get("step", -1)))
                  for row in rows if key in row and "train_seconds" in row]
        run.source = "metrics.jsonl" if points else None
    points.sort(key=lambda p: (p[0], p[3]))
    if points:
        columns = np.array(points, dtype=float).T  # (4, E): times, values, stderrs, steps
        run.times, run.values, run.stderrs, run.steps = columns[0], columns[1], columns[2], columns[3].astype(int)

    # Mean seconds per step of each phase over the training log rows that carry it.
    for phase in (*PHASES, "step"):
        samples = [float(row[f"time/{phase}"]) for row in rows if f"time/{phase}" in row]
        if samples:
            run.phase_seconds[phase] = float(np.mean(samples))
    return run


def load_runs(specs: Sequence, **kwargs) -> list[RunData]:
    """``load_run`` over ``RUN_DIR[=LABEL]`` specs (RunData objects pass through)."""
    runs = []
    for spec in specs:
        if isinstance(spec, RunData):
            runs.append(spec)
            continue
        run_dir, label = parse_run_spec(spec)
        runs.append(load_run(run_dir, label=label, **kwargs))
    if not runs:
        raise ValueError("give at least one run directory")
    return runs


def group_by_label(runs: Sequence[RunData]) -> dict[str, list[RunData]]:
    """{label: [runs]} in order of first appearance."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


# ------------------------------------------------------------------------------------------------------------
# Curves
# ------------------------------------------------------------------------------------------------------------
def _check_x(x: str) -> None:
    if x not in X_AXES:
        raise ValueError(f"x must be one of {list(X_AXES)}, got {x!r}")


def run_curve(run: RunData, x: str = "time") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xs (E,) seconds or steps, increasing; values (E,); stderrs (E,)): one run's curve on axis ``x``."""
    _check_x(x)
    if x == "time":
        return run.times, run.values, run.stderrs
    if (run.steps < 0).any():
        raise ValueError(f"{run.run_dir}: some evaluations carry no optimizer step; use x='time'")
    order = np.argsort(run.steps, kind="stable")
    return run.steps[order].astype(float), run.values[order], run.stderrs[order]


def mean_curve(runs: Sequence[RunData], x: str = "time") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid (G,), mean (G,), half_width (G,) of the 95% band): one label's seed-mean curve (module docstring)."""
    if any(not len(r.times) for r in runs):
        missing = [str(r.run_dir) for r in runs if not len(r.times)]
        raise ValueError(f"no evaluations found in {missing}: run `pods eval RUN_DIR --task ...` first")
    curves = [run_curve(r, x) for r in runs]
    if len(curves) == 1:
        xs, values, stderrs = curves[0]
        return xs.copy(), values.copy(), 1.96 * stderrs
    if max(c[0][0] for c in curves) > min(c[0][-1] for c in curves):
        raise ValueError(f"the seeds of {runs[0].label!r} cover disjoint {x} ranges; cannot average")
    grid, mean = mean_of_curves([c[:2] for c in curves])  # (G,), (G,)
    values = np.stack([np.interp(grid, xs, v) for xs, v, _ in curves])  # (S, G)
    return grid, mean, 1.96 * values.std(axis=0, ddof=1) / math.sqrt(len(curves))


# ------------------------------------------------------------------------------------------------------------
# Time (steps) to target and speed-up
# ------------------------------------------------------------------------------------------------------------
def time_to_target(times, accs, target: float) -> float:
    """x of the first checkpoint (times (E,), accs (E,), any order) with accuracy >= ``target``; ``inf`` if none."""
    times, accs = sorted_curve(times, accs)
    reached = np.nonzero(accs >= target - TARGET_TOLERANCE)[0]
    return float(times[reached[0]]) if len(reached) else math.inf


steps_to_target = time_to_target  # the same first crossing, read on a steps axis


def speedup(base_time: float, method_time: float, base_end: float, method_end: float) -> tuple[float | None, str]:
    """(baseline x / method x, "estimate" | "lower_bound" | "upper_bound" | "undefined"); ends bound a miss."""
    base_ok, method_ok = math.isfinite(base_time), math.isfinite(method_time)
    if base_ok and method_ok:
        if method_time == 0:
            return (1.0 if base_time == 0 else math.inf), "estimate"
        return base_time / method_time, "estimate"
    if method_ok:  # baseline never got there within base_end
        return (base_end / method_time if method_time > 0 else math.inf), "lower_bound"
    if base_ok:  # method never got there within method_end
        return (base_time / method_end if method_end > 0 else math.inf), "upper_bound"
    return None, "undefined"


def baseline_target(mean, gain_fraction: float | None = None) -> float:
    """The baseline mean curve's (G,) peak, or start + gain_fraction x (peak - start)."""
    mean = np.asarray(mean, dtype=float)
    peak = float(np.max(mean))
    if gain_fraction is None:
        return peak
    start = float(mean[0])
    return start + gain_fraction * (peak - start)


def _label_times(groups: dict[str, list[RunData]], baseline: str, target: float | None,
                 gain_fraction: float | None, x: str, crossing=time_to_target):
    """(target, {label: (x at target, last x)}) on each label's mean curve, for one (resampled) set of runs."""
    curves = {label: mean_curve(runs, x) for label, runs in groups.items()}
    if target is None:
        target = baseline_target(curves[baseline][1], gain_fraction)
    times = {label: (crossing(grid, mean, target), float(grid[-1]))
             for label, (grid, mean, _) in curves.items()}
    return target, times


# Long because the target, the bootstrap and the per-label table share the loaded groups and crossing rule.
def compare_runs(runs: Sequence, baseline: str | None = None, target: float | None = None,
                 target_gain_fraction: float | None = None, x: str = "time", metric: str = "accuracy",
                 n_boot: int = 2000, seed: int = 0, interpolate: bool = False, **load_kwargs) -> dict:
    """Time (or steps) to the target per label and seed, and the speed-up baseline / method with a 95% CI.

    ``baseline`` defaults to the first "GRPO" label; ``target`` to the baseline's peak (see the module docstring).
    Returns a JSON-ready dict: metric, x, baseline, target, target_source, crossing, bootstrap, labels: {label:
    {num_seeds, seeds_not_reached, time_to_target | steps_to_target (null: not reached), speedup, speedup_kind,
    speedup_ci95, seeds}}."""
    _check_x(x)
    if target is not None and target_gain_fraction is not None:
        raise ValueError("give either target or target_gain_fraction, not both")
    if target_gain_fraction is not None and not 0 < target_gain_fraction <= 1:
        raise ValueError(f"target_gain_fraction must be in (0, 1], got {target_gain_fraction}")
    runs = load_runs(runs, metric=metric, **load_kwargs)
    groups = group_by_label(runs)
    if baseline is None:
        baseline = next((label for label in groups if label.startswith("GRPO")), next(iter(groups)))
    if baseline not in groups:
        raise ValueError(f"baseline label {baseline!r} is not among the runs' labels {list(groups)}")
    fixed = target
    if fixed is not None:
        target_source = "user"
    elif target_gain_fraction is None:
        target_source = "baseline peak mean accuracy"
    else:
        target_source = f"baseline start + {target_gain_fraction:g} x (peak - start) of the mean accuracy"
    crossing = interpolated_crossing if interpolate else time_to_target
    target, times = _label_times(groups, baseline, fixed, target_gain_fraction, x, crossing)

    # Bootstrap over seeds: resample each label's seeds, recompute curves, (derived) target, times, ratio.
    can_bootstrap = n_boot > 0 and all(len(g) >= 2 for g in groups.values())
    boot_ratios: dict[str, list] = {label: [] for label in groups if label != baseline}
    if can_bootstrap:
        rng = np.random.default_rng(seed)
        for _ in range(n_boot):
            sample = {label: resample(g, rng) for label, g in groups.items()}
            _, t = _label_times(sample, baseline, fixed, target_gain_fraction, x, crossing)
            for label in boot_ratios:
                boot_ratios[label].append(speedup(t[baseline][0], t[label][0], t[baseline][1], t[label][1]))

    unit, to_key, last_key = X_AXES[x]
    base_time, base_end = times[baseline]
    result = {"metric": metric, "x": x, "x_unit": unit, "baseline": baseline, "target": target,
              "target_source": target_source, "target_gain_fraction": target_gain_fraction,
              "crossing": "interpolated between evaluations" if interpolate else "first evaluation reaching it",
              "bootstrap": {"replicates": n_boot if can_bootstrap else 0, "seed": seed}, "labels": {}}
    for label, label_runs in groups.items():
        label_time, label_end = times[label]
        seeds = []
        for run in label_runs:
            xs, values, _ = run_curve(run, x)
            t = crossing(xs, values, target)
            seeds.append({"run_dir": str(run.run_dir), "seed": run.seed, "source": run.source,
                          to_key: finite_or_none(t), "reached": math.isfinite(t),
                          "peak": float(values.max()), last_key: float(xs[-1])})
        entry = {"num_seeds": len(label_runs), "seeds_not_reached": sum(not s["reached"] for s in seeds),
                 to_key: finite_or_none(label_time),
                 "reached": math.isfinite(label_time), "peak_mean": float(np.max(mean_curve(label_runs, x)[1])),
                 last_key: label_end, "seeds": seeds}
        if label == baseline:
            entry.update(speedup=1.0, speedup_kind="baseline", speedup_ci95=None)
        else:
            value, kind = speedup(base_time, label_time, base_end, label_end)
            entry.update(speedup=finite_or_none(value), speedup_kind=kind)
            entry.update(speedup_interval(boot_ratios[label], can_bootstrap))
        result["labels"][label] = entry
    return result


def speedup_interval(replicates: list, available: bool) -> dict:
    """95% interval of bootstrap speed-ups (value, kind): undefined ones dropped, bounds kept; counts in a note."""
    if not available:
        return {"speedup_ci95": None, "ci_note": "needs >= 2 seeds for every label"}
    bounded = sum(kind in ("lower_bound", "upper_bound") for _, kind in replicates)
    undefined = sum(kind == "undefined" for _, kind in replicates)
    interval = percentile_interval([v if kind != "undefined" else None for v, kind in replicates])
    if interval is None:
        return {"speedup_ci95": None, "ci_note": "target never reached in any bootstrap replicate"}
    note = "percentile bootstrap over seeds"
    if bounded or undefined:
        note += f"; {bounded} replicates were bounds and {undefined} undefined of {len(replicates)}"
    return {"speedup_ci95": [finite_or_none(v) for v in interval], "ci_note": note}


def format_compare_table(result: dict) -> str:
    """The compare result as a text table (times in minutes, or steps)."""
    x = result.get("x", "time")
    _, to_key, _ = X_AXES[x]
    column = "t_target(min)" if x == "time" else "steps_to_target"
    crossing = f"; x at target: {result['crossing']}" if result.get("crossing") else ""
    lines = [f"target {result['metric']} = {result['target']:.4f} ({result['target_source']}); "
             f"baseline: {result['baseline']}{crossing}",
             f"{'label':<36} {'seeds':>5} {'peak':>6} {column:>15} {'per-seed':<24} "
             f"{'speed-up':>9} {'95% CI':>15}"]
    lines.append("-" * len(lines[1]))

    def show(v, per_seed=False):
        if v is None:
            return "—" if per_seed else "not reached"
        if x == "time":
            return f"{v / 60:.1f}" if per_seed else f"{v / 60:.2f}"
        return f"{v:.0f}"

    for label, e in result["labels"].items():
        per_seed = ",".join(show(s[to_key], per_seed=True) for s in e["seeds"])
        sp = e["speedup"]
        mark = {"lower_bound": ">", "upper_bound": "<"}.get(e["speedup_kind"], "")
        sp_text = "undefined" if sp is None and e["speedup_kind"] == "undefined" else \
            ("inf" if sp is None else f"{mark}{sp:.2f}x")
        ci = e.get("speedup_ci95")
        ci_text = "—" if not ci else "[" + ", ".join("inf" if c is None else f"{c:.2f}" for c in ci) + "]"
        lines.append(f"{label[:36]:<36} {e['num_seeds']:>5} {e['peak_mean']:>6.3f} "
                     f"{show(e[to_key]):>15} {per_seed[:24]:<24} {sp_text:>9} {ci_text:>15}")
    for label, e in result["labels"].items():
        if e.get("seeds_not_reached"):  # the mean curve can reach a target some seeds never do, or miss it
            lines.append(f"{label}: target not reached in {e['seeds_not_reached']} of {e['num_seeds']} seeds")
    unit = "min" if x == "time" else "steps"
    lines.append(f"per-seed in {unit}; — = seed never reached the target; >x / <x = lower / upper bound "
                 "(one side never reached it)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# Study statistics over runs: evaluation noise against seed spread (the ratio, break-even and projection are in
# pods_rl.bootstrap)
# ------------------------------------------------------------------------------------------------------------
def second_half_mean(run: RunData) -> float:
    """Mean evaluation over the second half of a run's steps (the sweep's criterion: fast and stable)."""
    return float(run.values[run.steps >= run.steps.max() / 2].mean())


def eval_noise(runs: Sequence[RunData]) -> dict:
    """Evaluation noise (mean eval SE) against the seed spread at equal steps, for one method's seeds.

    Returns {eval_stderr_mean, seed_std_mean_over_steps, seed_std_without_eval_noise, eval_share_of_seed_variance (se^2
    / spread^2), seed_std_at_step_0 (evaluation noise alone)}; spread entries None for one seed."""
    se = float(np.nanmean(np.concatenate([r.stderrs for r in runs]))) if runs else float("nan")
    common = sorted(set.intersection(*(set(r.steps.tolist()) for r in runs)) - {0}) if runs else []
    spread = None
    if len(runs) > 1 and common:
        by_step = np.array([[r.values[list(r.steps).index(s)] for s in common] for r in runs])  # (S, E)
        spread = float(by_step.std(axis=0, ddof=1).mean())
    at_zero = [r.values[list(r.steps).index(0)] for r in runs if 0 in r.steps.tolist()]
    return {"eval_stderr_mean": None if math.isnan(se) else se, "seed_std_mean_over_steps": spread,
            "seed_std_without_eval_noise": None if spread is None or math.isnan(se)
            else math.sqrt(max(spread**2 - se**2, 0.0)),
            "eval_share_of_seed_variance": None if not spread or math.isnan(se) else se**2 / spread**2,
            "seed_std_at_step_0": float(np.std(at_zero, ddof=1)) if len(at_zero) > 1 else None}


def level_time_ratios(groups: dict[str, list[RunData]], baseline: str, n_boot: int = 2000) -> dict:
    """{method: {"time": ..., "steps": ...}} of ``curves.paired_level_time_ratio`` against ``baseline``.

    Runs without a seed are left out; {} when the baseline has none, None for a method sharing no seed."""
    by_seed = {name: {x: {r.seed: run_curve(r, x)[:2] for r in group if r.seed is not None} for x in X_AXES}
               for name, group in groups.items()}
    if not by_seed.get(baseline, {}).get("time"):
        return {}
    return {name: {x: paired_level_time_ratio(by_seed[baseline][x], seeds[x], n_boot=n_boot)
                   if set(seeds[x]) & set(by_seed[baseline][x]) else None for x in X_AXES}
            for name, seeds in by_seed.items() if name != baseline}
