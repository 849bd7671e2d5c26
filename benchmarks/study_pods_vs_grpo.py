"""The evidence study (issue #10), as calls of `pods study`: the stages and flags under which its committed results
were produced, translated to the package's command. The study logic (plan, runs, resume, statistics, report)
lives in ``pods_rl.commands.study``; this script only fixes the evidence study's protocol:

    the embedded recipe (``--config tiny``), m = 16 kept of n per prompt, 8 prompts per update (128 kept rows),
    held-out evaluation every --eval-every updates, one torch thread per run, 2 runs at a time, and the methods
    grpo-n16, pods-mv-n32m16, pods-mv-n64m16, pods-random-n64m16.

Stages (each prints and runs one `pods study` command; ``--dry-run`` prints only that command):

    sweep    GRPO alone at each rate of --lrs, --sweep-seeds seeds each   -> OUT/sweep/runs, OUT/sweep.json
    study    every method at --lr, --seeds seeds each                    -> OUT/study/runs
    options  PODS 32 -> 16 against itself with a selection option (issue #13): ``downsample_tiebreak:
             shorter`` and ``oversample_prompts: 2``                     -> OUT/options/study/runs
    report   statistics, figures, study.json and report.txt from the finished runs of OUT

    python benchmarks/study_pods_vs_grpo.py sweep --lrs 1e-4,2e-4,5e-4,1e-3
    python benchmarks/study_pods_vs_grpo.py study --lr 5e-4 --seeds 8
    python benchmarks/study_pods_vs_grpo.py study --quick --out /tmp/study     # smoke test (small sizes)

The committed results (benchmarks/results/cpu-2core-amd-epyc/study, study600, study_strong) were produced by the
earlier, self-contained version of this script with the same run commands (see each folder's commands.jsonl);
their layout (OUT/{sweep,study}/runs/<method>-s<seed>) is the one `pods study` reads.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
from _machine import machine_info, machine_slug, results_dir  # noqa: E402  (puts src/ on sys.path too)

METHODS = ("grpo-n16", "pods-mv-n32m16", "pods-mv-n64m16", "pods-random-n64m16")
OPTIONS = {"shorter": "--downsample_tiebreak shorter", "over2": "--oversample_prompts 2"}
OPTION_BASELINE = "pods-mv-n32m16"
QUICK = dict(steps=4, eval_every=2, eval_problems=16, eval_k=2, seeds=2, sweep_seeds=2, lrs="2e-4",
             methods="grpo-n16,pods-mv-n64m16")


def study_argv(args) -> list[str]:
    """The `pods study` arguments of one stage of the evidence study."""
    common = ["--config", "tiny", "--m", "16", "--prompts-per-step", str(args.prompts_per_step),
              "--updates", str(args.steps), "--eval-every", str(args.eval_every),
              "--eval-problems", str(args.eval_problems), "--eval-k", str(args.eval_k), "--jobs", str(args.jobs),
              "--threads", "1", "--checkpoint-every", f"{args.checkpoint_every:g}", "--cost-n", "none",
              "--eval_batch_size", "1000", *shlex.split(args.train_args or "")]
    if args.stage == "sweep":
        return [*common, "--out", str(args.out), "--stage", "sweep,report", "--methods", "grpo-n16",
                "--lrs", args.lrs, "--sweep-seeds", str(args.sweep_seeds)]
    if args.stage == "study":
        return [*common, "--out", str(args.out), "--stage", "runs,report", "--methods", args.methods,
                "--seeds", str(args.seeds), "--learning_rate", f"{args.lr:g}"]
    if args.stage == "options":
        names = [OPTION_BASELINE, *(f"{OPTION_BASELINE}-{name}" for name in OPTIONS)]
        variants = [item for name, flags in OPTIONS.items() for item in ("--variant", f"{name}={flags}")]
        return [*common, "--out", str(args.out / "options"), "--stage", "runs,report", "--methods",
                ",".join(names), *variants, "--baseline", OPTION_BASELINE, "--seeds", str(args.seeds),
                "--learning_rate", f"{args.lr:g}"]
    return [*common, "--out", str(args.out), "--stage", "report", "--methods", args.methods]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["sweep", "study", "options", "report"])
    parser.add_argument("--lrs", default="1e-4,2e-4,5e-4,1e-3", help="sweep: learning rates for GRPO")
    parser.add_argument("--sweep-seeds", type=int, default=2, help="sweep: seeds per learning rate")
    parser.add_argument("--lr", type=float, default=None, help="study, options: the learning rate (from the sweep)")
    parser.add_argument("--seeds", type=int, default=8, help="study, options: seeds per method")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"study: a subset of {list(METHODS)}")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    parser.add_argument("--eval-every", type=int, default=25, help="evaluate every N steps (default 25)")
    parser.add_argument("--eval-problems", type=int, default=500, help="held-out problems (default 500)")
    parser.add_argument("--eval-k", type=int, default=4, help="samples per problem (default 4)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="prompts per update (kept rows = this x 16)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each; default 2)")
    parser.add_argument("--train-args", default=None, help="extra `pods train` flags for every run")
    parser.add_argument("--quick", action="store_true", help="smoke test: 4-step runs, 2 seeds, 2 methods")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<machine>/study")
    parser.add_argument("--checkpoint-every", type=float, default=1e9,
                        help="seconds of training between checkpoints, so an interrupted run resumes")
    parser.add_argument("--dry-run", action="store_true", help="print the `pods study` command, run nothing")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
        args.lr = args.lr or float(QUICK["lrs"])
    if args.stage in ("study", "options") and args.lr is None:
        parser.error(f"{args.stage} needs --lr (run the sweep first and take GRPO's best rate)")
    args.out = args.out or results_dir(machine_slug({**machine_info(), "gpu": None})) / "study"

    command = study_argv(args)
    print(shlex.join(["pods", "study", *command]), flush=True)
    if args.dry_run:
        return 0
    from pods_rl.commands.study import main as study_main

    return study_main(command)


if __name__ == "__main__":
    raise SystemExit(main())
