"""Figures of runs: accuracy vs training time or optimizer steps, seconds per step by phase (matplotlib, PNG + PDF).

Accuracy figure: per label, the seed-mean curve (``stats.mean_curve``) with its 95% band (± 1.96 x the standard error
across seeds; one seed: ± 1.96 x the eval's own standard error; the legend says which), thin lines = the seeds, a title
(the metric against the x-axis unless one is given); on the x-axis training time (``x="time"``) or optimizer steps
(``x="steps"``: how much each policy update teaches, whatever it costs). The numbers behind them are
``pods_rl.stats``'s; `pods plot` draws them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pods_rl.stats import PHASES, X_AXES, group_by_label, load_runs, mean_curve, run_curve

PHASE_COLORS = {"generation": "#4C72B0", "scoring": "#DD8452", "selection": "#55A868", "update": "#C44E52",
                "other": "#BBBBBB"}
TIME_UNITS = {"s": (1.0, "seconds"), "min": (60.0, "minutes"), "h": (3600.0, "hours")}
# Paper-figure look: small but legible fonts at 3.5-7 inch widths.
STYLE = {"font.size": 9, "axes.labelsize": 9, "axes.titlesize": 10, "legend.fontsize": 8, "xtick.labelsize": 8,
         "ytick.labelsize": 8, "axes.spines.top": False, "axes.spines.right": False, "savefig.dpi": 300,
         "pdf.fonttype": 42}


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


def plot_accuracy(runs: Sequence, out=None, x: str = "time", metric: str = "accuracy", title: str | None = None,
                  time_unit: str = "min", **load_kwargs):
    """Mean accuracy per label against training time (``x="time"``) or optimizer steps (``x="steps"``), with a 95% band
    over seeds (see ``pods_rl.stats``); thin lines = seeds.

    ``runs``: RunData objects or ``RUN_DIR[=LABEL]`` specs. Saves ``out/accuracy_vs_time.{png,pdf}`` (or
    ``accuracy_vs_steps``; ``<metric>_vs_<x>`` for another metric) when ``out`` is given. Returns the Figure."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    if x not in X_AXES:
        raise ValueError(f"x must be one of {list(X_AXES)}, got {x!r}")
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {list(TIME_UNITS)}, got {time_unit!r}")
    from matplotlib.patches import Patch

    runs = load_runs(runs, metric=metric, **load_kwargs)
    divisor, unit_name = TIME_UNITS[time_unit] if x == "time" else (1.0, "steps")
    groups = group_by_label(runs)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(5.0, 3.3))
        for i, (label, label_runs) in enumerate(groups.items()):
            color = f"C{i}"
            grid, mean, half_width = mean_curve(label_runs, x)
            if len(label_runs) > 1:
                for run in label_runs:
                    xs, values, _ = run_curve(run, x)
                    ax.plot(xs / divisor, values, color=color, alpha=0.25, linewidth=0.8)
            # Markers only where they are checkpoints of a single seed (a mean grid point is not one).
            marker = "o" if len(label_runs) == 1 else None
            ax.plot(grid / divisor, mean, color=color, marker=marker, markersize=2.5, linewidth=1.6,
                    label=f"{label}" + (f" ({len(label_runs)} seeds)" if len(label_runs) > 1 else ""))
            if np.isfinite(half_width).any():
                ax.fill_between(grid / divisor, mean - half_width, mean + half_width, color=color, alpha=0.2,
                                linewidth=0)
        ylabel = {"accuracy": "Test accuracy (fraction)", "format_accuracy": "Format accuracy (fraction)",
                  "both_accuracy": "Correct and formatted (fraction)", "pass_at_k": "pass@k (fraction)",
                  "mean_completion_tokens": "Held-out completion length (tokens)"}[metric]
        ax.set_xlabel(f"Training time ({unit_name})" if x == "time" else "Policy updates (optimizer steps)")
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3, linewidth=0.5)
        handles, _ = ax.get_legend_handles_labels()
        if ax.collections:  # say what the shading is
            seeds = {len(label_runs) > 1 for label_runs in groups.values()}
            band = ("shaded: 95% band, ± 1.96 standard errors across seeds" if seeds == {True} else
                    "shaded: 95% interval, ± 1.96 standard errors of each evaluation" if seeds == {False} else
                    "shaded: 95% band (across seeds; one seed: of each evaluation)")
            handles.append(Patch(facecolor="0.5", alpha=0.3, linewidth=0, label=band))
        ax.legend(handles=handles, frameon=False, loc="best")
        ax.set_title(title if title is not None else
                     f"{ylabel.split(' (')[0]} against {'training time' if x == 'time' else 'policy updates'}")
        fig.tight_layout()
        _save(fig, out, f"accuracy_vs_{x}" if metric == "accuracy" else f"{metric}_vs_{x}")
    plt.close(fig)  # out of pyplot's registry (the Figure returned still draws and saves)
    return fig


def plot_accuracy_vs_time(runs: Sequence, out=None, **kwargs):
    """``plot_accuracy`` with training time on the x-axis (saves ``accuracy_vs_time.{png,pdf}``)."""
    return plot_accuracy(runs, out, x="time", **kwargs)


def plot_phase_times(runs: Sequence, out=None, title: str | None = None, **load_kwargs):
    """Seconds per training step per label as horizontal stacked bars (generation, scoring, selection, update, and
    "other" = time/step minus the phases when positive), averaged over the logged steps and the seeds.

    Saves ``out/step_time_by_phase.{png,pdf}`` when ``out`` is given. Returns the matplotlib Figure."""
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
    plt.close(fig)  # out of pyplot's registry (the Figure returned still draws and saves)
    return fig
