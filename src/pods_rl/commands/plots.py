"""`pods plot` and `pods compare`: accuracy vs training time or optimizer steps, seconds per step by phase,
and the compare table.

The figures are drawn by ``pods_rl.figures``; the curves, time (steps) to target, speed-ups and bootstrap CIs are
computed in ``pods_rl.stats`` (see its docstring for the definitions). The names below are re-exported from
there, so ``pods_rl.commands.plots.compare_runs``, ``pods_rl.commands.plots.plot_accuracy`` etc. keep working.
On the x-axis: training time (``--x time``, default) or optimizer steps (``--x steps``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pods_rl.errors import one_line_parser_errors, run_guarded, spellings
from pods_rl.figures import (  # noqa: F401  (re-exported: the figures lived here)
    PHASE_COLORS,
    STYLE,
    TIME_UNITS,
    plot_accuracy,
    plot_accuracy_vs_time,
    plot_phase_times,
)
from pods_rl.stats import (  # noqa: F401  (re-exported: the API of pods_rl.commands.plots before pods_rl.stats)
    METRICS,
    PHASES,
    TARGET_TOLERANCE,
    X_AXES,
    RunData,
    baseline_target,
    compare_runs,
    default_label,
    format_compare_table,
    group_by_label,
    load_run,
    load_runs,
    mean_curve,
    parse_run_spec,
    run_curve,
    speedup,
    speedup_interval,
    time_to_target,
)


# ------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------
def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser of the runs and the eval.json records both commands read, its errors one line."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    one_line_parser_errors(parser)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR[=LABEL]",
                        help="run directories; runs with the same label are seeds of one method")
    parser.add_argument("--metric", choices=METRICS, default="accuracy")
    parser.add_argument("--task", default=None, help="use only eval.json records of this task")
    parser.add_argument("--split", default=None, help="use only eval.json records of this split")
    parser.add_argument("--k", type=int, default=None, help="use only eval.json records with this k")
    parser.add_argument("--temperature", type=float, default=None,
                        help="use only eval.json records with this temperature")
    parser.add_argument("--x", choices=list(X_AXES), default="time",
                        help="x-axis: training time (default) or optimizer steps (policy updates)")
    return parser


def _selection(args) -> dict:
    return {"task": args.task, "split": args.split, "k": args.k, "temperature": args.temperature}


def plot_main(argv: Sequence[str] | None = None) -> int:
    """``pods plot``: accuracy_vs_time (or accuracy_vs_steps with ``--x steps``) and step_time_by_phase
    figures (PNG + PDF). Exit code 0, 2 on bad input, 1 on another failure."""
    return run_guarded("pods plot", _plot_main, argv)


def _plot_main(argv: list[str]) -> int:
    parser = _parser("pods plot", __doc__.split("\n\n")[0])
    parser.add_argument("--out", default="figures", help="output folder (default ./figures)")
    parser.add_argument("--title", default=None)
    parser.add_argument(*spellings("--time-unit"), choices=list(TIME_UNITS), default="min")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs, metric=args.metric, **_selection(args))
    with_evals, written = [r for r in runs if len(r.times)], []
    if with_evals:
        if len(with_evals) < len(runs):
            skipped = [str(r.run_dir) for r in runs if not len(r.times)]
            print(f"warning: no evaluations in {skipped}; left out of the accuracy figure", file=sys.stderr)
        plot_accuracy(with_evals, out=args.out, x=args.x, metric=args.metric, title=args.title,
                      time_unit=args.time_unit)
        written.append(f"accuracy_vs_{args.x}")
    else:
        print("warning: no run has evaluations (eval.json or eval/accuracy rows); no accuracy figure",
              file=sys.stderr)
    if any(r.phase_seconds for r in runs):
        plot_phase_times(runs, out=args.out, title=args.title)
        written.append("step_time_by_phase")
    else:
        print("warning: no run has phase times in metrics.jsonl; no phase figure", file=sys.stderr)
    if not written:
        print("pods plot: error: nothing to plot", file=sys.stderr)
        return 2
    for stem in written:
        print(f"wrote {Path(args.out) / stem}.png and .pdf")
    return 0


def compare_main(argv: Sequence[str] | None = None) -> int:
    """``pods compare``: time (or steps) to a target accuracy and speed-up vs a baseline, as a table and JSON.
    Exit code 0, 2 on bad input, 1 on another failure."""
    return run_guarded("pods compare", _compare_main, argv)


def _compare_main(argv: list[str]) -> int:
    parser = _parser("pods compare", "Training time (--x time) or optimizer steps (--x steps) for each label to first "
                     "reach a target accuracy (default: the baseline's peak mean accuracy) and the speed-up baseline "
                     "/ method with a percentile-bootstrap 95%% CI over seeds.")
    parser.add_argument("--baseline", default=None, help="baseline label (default: first label starting GRPO)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target", type=float, default=None, help="target accuracy (default: baseline peak)")
    target.add_argument(*spellings("--target-gain-fraction"), type=float, default=None, metavar="F",
                        help="target = start + F x (peak - start) of the baseline mean curve, 0 < F <= 1")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap replicates (0 = no CI)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap RNG seed")
    parser.add_argument("--out", default="compare.json", help="JSON output (default ./compare.json)")
    args = parser.parse_args(argv)
    result = compare_runs(args.runs, baseline=args.baseline, target=args.target,
                          target_gain_fraction=args.target_gain_fraction, x=args.x, metric=args.metric,
                          n_boot=args.bootstrap, seed=args.seed, **_selection(args))
    print(format_compare_table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, allow_nan=False))
    print(f"wrote {out}")
    return 0
