"""`pods plot` and `pods compare`: accuracy vs training time, seconds per step by phase, time-to-target.

Runs are given as ``RUN_DIR`` or ``RUN_DIR=LABEL``. Runs with the same label are seeds of one method and are
aggregated. The default label comes from the run's config.yaml: ``GRPO (n=16)`` when ``downsample_to`` is
unset or equals ``num_generations``, else ``PODS max_variance (n=64→m=16)``.

Curves. A run's curve is its evaluated checkpoints, (train_seconds, accuracy) sorted by time, from
``eval.json`` (``pods eval``) or, when that is absent, the ``eval/accuracy`` rows of ``metrics.jsonl``.

Mean curve of a label (used by both the figure and compare). Each seed's curve is interpolated LINEARLY
between its checkpoints onto a common grid: the union of all seeds' checkpoint times inside the window where
every seed has data, [max of first times, min of last times] (no extrapolation). The mean is over seeds at each
grid time; the band is ± 1.96 x the standard error across seeds (std with ddof=1 / sqrt(num_seeds)). A label
with a single seed has no across-seed spread: its band is ± 1.96 x the eval's own standard error over the k
samples (``accuracy_stderr`` in eval.json), and none when that is unknown.

Time to target (compare). ``time_to_target`` is the training time of the first checkpoint whose accuracy is
>= target (checkpoint resolution, no interpolation across the crossing; ``inf`` if never). The default target
is the baseline's peak mean accuracy: the maximum over time of the baseline label's mean curve (the paper's
"vanilla GRPO's peak test accuracy"), so the baseline reaches it by construction. A label's time to target is
read off its mean curve; each seed's own time (on its raw curve) is reported too, ``inf``/null when not
reached. Speed-up = baseline time / method time. When the method never reaches the target, the speed-up is
reported as an UPPER bound, baseline time / (method's last evaluated time); when only the baseline never
reaches it (a user --target), a LOWER bound, (baseline's last time) / method time; when neither does,
undefined. The 95% confidence interval is a percentile bootstrap over seeds (each label's seeds resampled with
replacement, independently; the default target re-derived from each resampled baseline; fixed RNG seed),
available when every compared label has >= 2 seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pods_rl.runlog import read_metrics

PHASES = ("generation", "scoring", "selection", "update")
PHASE_COLORS = {"generation": "#4C72B0", "scoring": "#DD8452", "selection": "#55A868", "update": "#C44E52",
                "other": "#BBBBBB"}
METRICS = ("accuracy", "format_accuracy", "both_accuracy", "pass_at_k")
TIME_UNITS = {"s": (1.0, "seconds"), "min": (60.0, "minutes"), "h": (3600.0, "hours")}
TARGET_TOLERANCE = 1e-9  # mean curves are float averages; "reaches" forgives rounding below the target
# Paper-figure look: small but legible fonts at 3.5-7 inch widths.
STYLE = {"font.size": 9, "axes.labelsize": 9, "axes.titlesize": 10, "legend.fontsize": 8, "xtick.labelsize": 8,
         "ytick.labelsize": 8, "axes.spines.top": False, "axes.spines.right": False, "savefig.dpi": 300,
         "pdf.fonttype": 42}


# ------------------------------------------------------------------------------------------------------------
# Loading runs
# ------------------------------------------------------------------------------------------------------------
@dataclass
class RunData:
    """What one run directory contributes to the figures.

    Attributes:
        run_dir: the run directory.
        label: method label (runs sharing it are seeds of one method).
        config: the run's config.yaml ({} if absent).
        seed: config's seed (None if absent).
        times: (E,) cumulative training seconds of each evaluated checkpoint, increasing.
        values: (E,) the metric at those checkpoints.
        stderrs: (E,) the eval standard error over k samples (nan where unknown).
        steps: (E,) optimizer steps of those checkpoints (-1 where unknown).
        metric: which metric ``values`` holds.
        source: "eval.json", "metrics.jsonl", or None (no evaluations found).
        phase_seconds: mean seconds per training step of each phase ("generation", ..., "step").
    """

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
    """``GRPO (n=16)`` or ``PODS <rule> (n=64→m=16)`` from a run config; ``fallback`` without num_generations."""
    n = config.get("num_generations")
    if n is None:
        return fallback
    m = config.get("downsample_to")
    if m is None or int(m) == int(n):
        return f"GRPO (n={n})"
    rule = config.get("downsample_rule", "max_variance")
    return f"PODS {rule} (n={n}→m={m})"


def parse_run_spec(spec) -> tuple[Path, str | None]:
    """``"RUN_DIR=LABEL"`` -> (Path(RUN_DIR), LABEL); ``"RUN_DIR"`` -> (Path(RUN_DIR), None)."""
    spec = str(spec)
    left, sep, label = spec.rpartition("=")
    if sep and left and not Path(spec).exists():
        return Path(left), (label or None)
    return Path(spec), None


def _select_eval_records(records: list[dict], filters: dict, path: Path) -> list[dict]:
    """Records matching ``filters``; if several (task, split, k, temperature) settings remain, the most common
    one (with a warning naming the filters that would pick another)."""
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
    from pods_rl.evaluate import load_results, load_run_config

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
    eval_path = run_dir / "eval.json"
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
        times, values, stderrs, steps = (np.array(col) for col in zip(*points))
        run.times, run.values, run.stderrs, run.steps = times.astype(float), values.astype(float), \
            stderrs.astype(float), steps.astype(int)

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
# Curves and statistics
# ------------------------------------------------------------------------------------------------------------
def mean_curve(runs: Sequence[RunData]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean curve of seeds of one label on a common time grid (see module docstring).

    Returns (grid (G,) seconds, mean (G,), half_width (G,) of the 95% band: 1.96 x the standard error across
    seeds, or for one seed 1.96 x its eval standard error (nan where unknown)).
    """
    curves = [(r.times, r.values) for r in runs if len(r.times)]
    if len(curves) != len(runs):
        missing = [str(r.run_dir) for r in runs if not len(r.times)]
        raise ValueError(f"no evaluations found in {missing}: run `pods eval RUN_DIR --task ...` first")
    if len(runs) == 1:
        return runs[0].times.copy(), runs[0].values.copy(), 1.96 * runs[0].stderrs
    start = max(t[0] for t, _ in curves)
    end = min(t[-1] for t, _ in curves)
    if start > end:
        raise ValueError(f"the seeds of {runs[0].label!r} cover disjoint training-time ranges; cannot average")
    grid = np.unique(np.concatenate([t[(t >= start) & (t <= end)] for t, _ in curves]))  # (G,)
    values = np.stack([np.interp(grid, t, v) for t, v in curves])  # (S, G)
    mean = values.mean(axis=0)
    half_width = 1.96 * values.std(axis=0, ddof=1) / math.sqrt(len(curves))
    return grid, mean, half_width


def time_to_target(times, accs, target: float) -> float:
    """Training time of the first checkpoint with accuracy >= ``target`` (``inf`` if none).

    Args:
        times: (E,) checkpoint times (any order; sorted here).
        accs: (E,) accuracies at those times.
    """
    times, accs = np.asarray(times, dtype=float), np.asarray(accs, dtype=float)
    if times.shape != accs.shape or times.ndim != 1:
        raise ValueError(f"times and accs must be 1-D of equal length, got {times.shape} and {accs.shape}")
    order = np.argsort(times, kind="stable")
    reached = np.nonzero(accs[order] >= target - TARGET_TOLERANCE)[0]
    return float(times[order][reached[0]]) if len(reached) else math.inf


def speedup(base_time: float, method_time: float, base_end: float, method_end: float) -> tuple[float | None, str]:
    """(baseline time / method time, kind) with kind "estimate", "lower_bound", "upper_bound" or "undefined".

    ``base_end``/``method_end`` are the last observed times, used as bounds for a side that never reaches.
    """
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


def _label_times(groups: dict[str, list[RunData]], baseline: str, target: float | None):
    """(target, {label: (time on mean curve, last time of mean curve)}) for one (possibly resampled) set."""
    curves = {label: mean_curve(runs) for label, runs in groups.items()}
    if target is None:
        target = float(np.max(curves[baseline][1]))
    times = {label: (time_to_target(grid, mean, target), float(grid[-1]))
             for label, (grid, mean, _) in curves.items()}
    return target, times


def compare_runs(runs: Sequence, baseline: str | None = None, target: float | None = None,
                 metric: str = "accuracy", n_boot: int = 2000, seed: int = 0, **load_kwargs) -> dict:
    """Time to reach ``target`` per label (mean curve) and per seed, and speed-ups vs ``baseline``.

    Args:
        runs: RunData objects or ``RUN_DIR[=LABEL]`` specs.
        baseline: the reference label (default: the first label starting with "GRPO", else the first label).
        target: accuracy to reach (default: the baseline's peak mean accuracy).
        n_boot: bootstrap replicates for the 95% CI of the speed-up (0 disables it).
        seed: the bootstrap RNG seed.
    Returns a JSON-ready dict (see ``compare_main``; times in seconds, ``null`` = not reached).
    """
    runs = load_runs(runs, metric=metric, **load_kwargs)
    groups = group_by_label(runs)
    if baseline is None:
        baseline = next((label for label in groups if label.startswith("GRPO")), next(iter(groups)))
    if baseline not in groups:
        raise ValueError(f"baseline label {baseline!r} is not among the runs' labels {list(groups)}")
    target_source = "user" if target is not None else "baseline peak mean accuracy"
    target, times = _label_times(groups, baseline, target)

    # Bootstrap over seeds: resample each label's seeds, recompute curves, (default) target, times, ratio.
    can_bootstrap = n_boot > 0 and all(len(g) >= 2 for g in groups.values())
    boot_ratios: dict[str, list] = {label: [] for label in groups if label != baseline}
    if can_bootstrap:
        rng = np.random.default_rng(seed)
        for _ in range(n_boot):
            sample = {label: [g[i] for i in rng.integers(0, len(g), len(g))] for label, g in groups.items()}
            _, t = _label_times(sample, baseline, None if target_source != "user" else target)
            for label in boot_ratios:
                boot_ratios[label].append(speedup(t[baseline][0], t[label][0], t[baseline][1], t[label][1]))

    base_time, base_end = times[baseline]
    result = {"metric": metric, "baseline": baseline, "target": target, "target_source": target_source,
              "time_unit": "seconds", "bootstrap": {"replicates": n_boot if can_bootstrap else 0, "seed": seed},
              "labels": {}}
    for label, label_runs in groups.items():
        label_time, label_end = times[label]
        seeds = []
        for run in label_runs:
            t = time_to_target(run.times, run.values, target)
            seeds.append({"run_dir": str(run.run_dir), "seed": run.seed, "source": run.source,
                          "time_to_target": _finite_or_none(t), "reached": math.isfinite(t),
                          "peak": float(run.values.max()), "last_time": float(run.times[-1])})
        entry = {"num_seeds": len(label_runs), "time_to_target": _finite_or_none(label_time),
                 "reached": math.isfinite(label_time), "peak_mean": float(np.max(mean_curve(label_runs)[1])),
                 "last_time": label_end, "seeds": seeds}
        if label == baseline:
            entry.update(speedup=1.0, speedup_kind="baseline", speedup_ci95=None)
        else:
            value, kind = speedup(base_time, label_time, base_end, label_end)
            entry.update(speedup=_finite_or_none(value), speedup_kind=kind)
            entry.update(_bootstrap_ci(boot_ratios[label], can_bootstrap))
        result["labels"][label] = entry
    return result


def _finite_or_none(x):
    return float(x) if x is not None and math.isfinite(x) else None


def _bootstrap_ci(replicates: list, available: bool) -> dict:
    """95% percentile interval of bootstrap speed-ups; undefined replicates are dropped and counted."""
    if not available:
        return {"speedup_ci95": None, "ci_note": "needs >= 2 seeds for every label"}
    values = np.array([v for v, kind in replicates if kind != "undefined"], dtype=float)
    bounded = sum(kind in ("lower_bound", "upper_bound") for _, kind in replicates)
    undefined = sum(kind == "undefined" for _, kind in replicates)
    if not len(values):
        return {"speedup_ci95": None, "ci_note": "target never reached in any bootstrap replicate"}
    # inverted_cdf: a percentile is always an observed replicate (no interpolation with inf).
    low, high = np.quantile(values, [0.025, 0.975], method="inverted_cdf")
    note = "percentile bootstrap over seeds"
    if bounded or undefined:
        note += f"; {bounded} replicates were bounds and {undefined} undefined of {len(replicates)}"
    return {"speedup_ci95": [_finite_or_none(low), _finite_or_none(high)], "ci_note": note}


def format_compare_table(result: dict) -> str:
    """The compare result as a text table (times in minutes)."""
    lines = [f"target {result['metric']} = {result['target']:.4f} ({result['target_source']}); "
             f"baseline: {result['baseline']}",
             f"{'label':<36} {'seeds':>5} {'peak':>6} {'t_target(min)':>13} {'per-seed t (min)':<24} "
             f"{'speed-up':>9} {'95% CI':>15}"]
    lines.append("-" * len(lines[1]))

    def minutes(t):
        return "not reached" if t is None else f"{t / 60:.2f}"

    for label, e in result["labels"].items():
        per_seed = ",".join("—" if s["time_to_target"] is None else f"{s['time_to_target'] / 60:.1f}"
                            for s in e["seeds"])
        sp = e["speedup"]
        mark = {"lower_bound": ">", "upper_bound": "<"}.get(e["speedup_kind"], "")
        sp_text = "undefined" if sp is None and e["speedup_kind"] == "undefined" else \
            ("inf" if sp is None else f"{mark}{sp:.2f}x")
        ci = e.get("speedup_ci95")
        ci_text = "—" if not ci else "[" + ", ".join("inf" if c is None else f"{c:.2f}" for c in ci) + "]"
        lines.append(f"{label[:36]:<36} {e['num_seeds']:>5} {e['peak_mean']:>6.3f} "
                     f"{minutes(e['time_to_target']):>13} {per_seed[:24]:<24} {sp_text:>9} {ci_text:>15}")
    lines.append("— = seed never reached the target; >x / <x = lower / upper bound (one side never reached it)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------------------
def _save(fig, out, stem: str) -> None:
    if out is None:
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for ext in ("png", "pdf"):
        fig.savefig(out / f"{stem}.{ext}", bbox_inches="tight")


def plot_accuracy_vs_time(runs: Sequence, out=None, metric: str = "accuracy", title: str | None = None,
                          time_unit: str = "min", **load_kwargs):
    """Mean accuracy vs training time per label with a 95% band (see module docstring); thin lines = seeds.

    ``runs``: RunData objects or ``RUN_DIR[=LABEL]`` specs. Saves ``out/accuracy_vs_time.{png,pdf}`` when
    ``out`` is given. Returns the matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {list(TIME_UNITS)}, got {time_unit!r}")
    runs = load_runs(runs, metric=metric, **load_kwargs)
    divisor, unit_name = TIME_UNITS[time_unit]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(5.0, 3.3))
        for i, (label, label_runs) in enumerate(group_by_label(runs).items()):
            color = f"C{i}"
            grid, mean, half_width = mean_curve(label_runs)
            if len(label_runs) > 1:
                for run in label_runs:
                    ax.plot(run.times / divisor, run.values, color=color, alpha=0.25, linewidth=0.8)
            # Markers only where they are checkpoints of a single seed (a mean grid point is not one).
            marker = "o" if len(label_runs) == 1 else None
            ax.plot(grid / divisor, mean, color=color, marker=marker, markersize=2.5, linewidth=1.6,
                    label=f"{label}" + (f" ({len(label_runs)} seeds)" if len(label_runs) > 1 else ""))
            if np.isfinite(half_width).any():
                ax.fill_between(grid / divisor, mean - half_width, mean + half_width, color=color, alpha=0.2,
                                linewidth=0)
        pretty = {"accuracy": "Test accuracy", "format_accuracy": "Format accuracy",
                  "both_accuracy": "Correct and formatted", "pass_at_k": "pass@k"}[metric]
        ax.set_xlabel(f"Training time ({unit_name})")
        ax.set_ylabel(f"{pretty} (fraction)")
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3, linewidth=0.5)
        ax.legend(frameon=False, loc="lower right")
        if title:
            ax.set_title(title)
        fig.tight_layout()
        _save(fig, out, "accuracy_vs_time")
    return fig


def plot_phase_times(runs: Sequence, out=None, title: str | None = None, **load_kwargs):
    """Seconds per training step per label as horizontal stacked bars (generation, scoring, selection, update,
    and "other" = time/step minus the phases when positive), averaged over the logged steps and the seeds.

    Saves ``out/step_time_by_phase.{png,pdf}`` when ``out`` is given. Returns the matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(runs, **load_kwargs)
    groups = group_by_label(runs)
    per_label = {}  # label -> {phase: mean seconds per step}
    for label, label_runs in groups.items():
        with_times = [r for r in label_runs if r.phase_seconds]
        if not with_times:
            continue
        phases = {p: float(np.mean([r.phase_seconds.get(p, 0.0) for r in with_times])) for p in PHASES}
        steps = [r.phase_seconds["step"] for r in with_times if "step" in r.phase_seconds]
        phases["other"] = max(0.0, float(np.mean(steps)) - sum(phases.values())) if steps else 0.0
        per_label[label] = phases
    if not per_label:
        raise ValueError("no run has phase times (time/generation, ... rows in metrics.jsonl)")

    labels = list(per_label)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(5.0, 0.9 + 0.45 * len(labels)))
        left = np.zeros(len(labels))  # (L,) running bar start
        for phase in (*PHASES, "other"):
            widths = np.array([per_label[label][phase] for label in labels])  # (L,)
            if phase == "other" and not widths.any():
                continue
            ax.barh(range(len(labels)), widths, left=left, color=PHASE_COLORS[phase], label=phase, height=0.6)
            left += widths
        for row, total in enumerate(left):
            ax.text(total, row, f" {total:.2f} s", va="center", fontsize=8)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()  # first label on top
        ax.set_xlabel("Time per training step (seconds)")
        ax.set_xlim(0, left.max() * 1.18)
        ax.legend(frameon=False, ncol=5, loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=7,
                  handlelength=1.0, handletextpad=0.4, columnspacing=0.8, borderaxespad=0.2)
        if title:
            ax.set_title(title, pad=18)
        fig.tight_layout()
        _save(fig, out, "step_time_by_phase")
    return fig


# ------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------
def _add_selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR[=LABEL]",
                        help="run directories; runs with the same label are seeds of one method")
    parser.add_argument("--metric", choices=METRICS, default="accuracy")
    parser.add_argument("--task", default=None, help="use only eval.json records of this task")
    parser.add_argument("--split", default=None, help="use only eval.json records of this split")
    parser.add_argument("--k", type=int, default=None, help="use only eval.json records with this k")
    parser.add_argument("--temperature", type=float, default=None,
                        help="use only eval.json records with this temperature")


def _selection(args) -> dict:
    return {"task": args.task, "split": args.split, "k": args.k, "temperature": args.temperature}


def plot_main(argv: Sequence[str] | None = None) -> int:
    """``pods plot``: accuracy_vs_time and step_time_by_phase figures (PNG + PDF)."""
    parser = argparse.ArgumentParser(prog="pods plot", description=__doc__.split("\n\n")[0])
    _add_selection_args(parser)
    parser.add_argument("--out", default="figures", help="output folder (default ./figures)")
    parser.add_argument("--title", default=None)
    parser.add_argument("--time-unit", choices=list(TIME_UNITS), default="min")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        runs = load_runs(args.runs, metric=args.metric, **_selection(args))
        written = []
        if any(len(r.times) for r in runs):
            with_evals = [r for r in runs if len(r.times)]
            if len(with_evals) < len(runs):
                skipped = [str(r.run_dir) for r in runs if not len(r.times)]
                print(f"warning: no evaluations in {skipped}; left out of the accuracy figure", file=sys.stderr)
            plot_accuracy_vs_time(with_evals, out=args.out, metric=args.metric, title=args.title,
                                  time_unit=args.time_unit)
            written.append("accuracy_vs_time")
        else:
            print("warning: no run has evaluations (eval.json or eval/accuracy rows); no accuracy figure",
                  file=sys.stderr)
        if any(r.phase_seconds for r in runs):
            plot_phase_times(runs, out=args.out, title=args.title)
            written.append("step_time_by_phase")
        else:
            print("warning: no run has phase times in metrics.jsonl; no phase figure", file=sys.stderr)
    except ValueError as err:
        print(f"pods plot: error: {err}", file=sys.stderr)
        return 2
    if not written:
        print("pods plot: error: nothing to plot", file=sys.stderr)
        return 2
    for stem in written:
        print(f"wrote {Path(args.out) / stem}.png and .pdf")
    return 0


def compare_main(argv: Sequence[str] | None = None) -> int:
    """``pods compare``: time to target accuracy and speed-up vs a baseline, as a table and JSON."""
    parser = argparse.ArgumentParser(
        prog="pods compare",
        description="Training time for each label to first reach a target accuracy (default: the baseline's "
        "peak mean accuracy) and the speed-up vs the baseline with a bootstrap 95%% CI over seeds.")
    _add_selection_args(parser)
    parser.add_argument("--baseline", default=None, help="baseline label (default: first label starting GRPO)")
    parser.add_argument("--target", type=float, default=None, help="target accuracy (default: baseline peak)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap replicates (0 = no CI)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap RNG seed")
    parser.add_argument("--out", default="compare.json", help="JSON output (default ./compare.json)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        result = compare_runs(args.runs, baseline=args.baseline, target=args.target, metric=args.metric,
                              n_boot=args.bootstrap, seed=args.seed, **_selection(args))
    except ValueError as err:
        print(f"pods compare: error: {err}", file=sys.stderr)
        return 2
    print(format_compare_table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, allow_nan=False))
    print(f"wrote {out}")
    return 0
