"""`pods study`: does PODS pay on YOUR model, task and hardware? GRPO against PODS over seeds, with statistics.

    pods study                                        # the embedded default (tiny model, arithmetic, this CPU)
    pods study --smoke --out /tmp/s                   # the whole pipeline at toy sizes, well under a minute
    pods study --config gsm8k/pods --model_name_or_path ./qwen --n 64 --seeds 4 --updates 200 --out st
    pods study --config my.yaml --lrs 1e-4,2e-4,5e-4 --seeds 8 --jobs 2 --out st   # sweep GRPO's lr first
    pods study --n 32 --pilot 8 --out st              # + adaptive rollouts (pilot 8, up to 32) and its control
    pods study ... --price_at h200_cost.json          # + time priced at another machine's step costs

Any other `pods train` flag sets the recipe. The stages, each skipped when its results are in ``--out``: ``cost``
(`pods cost` for every n: ``OUT/cost.json``), ``sweep`` (with ``--lrs``: GRPO's learning rate, best second-half
held-out accuracy), ``runs`` (GRPO n = m, PODS n -> m and controls, ``--seeds`` seeds each, equal updates and kept
rows per update) and ``report`` (``study_report``). Each run is `pods train` in its own process, seed-major (seed 0
of every method, then seed 1, ...) so that a shared machine's slow periods hit all methods alike; ``study_runner``
runs them, resumably. docs/guides/study.md explains the design and the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from pods_rl.commands import study_priced
from pods_rl.commands.study_paths import portable
from pods_rl.commands.study_plan import STUDY_FLAGS, Method, Plan, make_plan
from pods_rl.commands.study_report import load_groups, sweep_report, write_report
from pods_rl.commands.study_runner import Run, Runner, redirected, slot_envs
from pods_rl.errors import one_line_parser_errors, run_guarded, spellings
from pods_rl.runlog import run_finished
from pods_rl.runlog.packed import ARCHIVE, holds_runs, runs_root, unpack_runs

STAGES = ("cost", "sweep", "runs", "report")


def make_run(plan: Plan, method: Method, seed: int, lr: float, run_dir: Path, updates: int) -> Run:
    """One run of the study: ``method`` at ``seed`` and learning rate ``lr``, with its `pods train` flags: the
    recipe, then what the study fixes (later flags win): n and m, and no rollout planner but a variant's (the
    embedded recipe's auto would otherwise choose every method's n)."""
    argv = [*plan.recipe_argv, "--output_dir", str(run_dir), "--rollout_planner", "none",
            "--num_generations", str(method.n),
            "--downsample_to", str(method.m), "--downsample_rule", method.rule, "--seed", str(seed),
            "--learning_rate", f"{lr:g}", "--per_device_train_batch_size", str(plan.prompts_per_step * method.m),
            "--max_steps", str(updates), "--max_train_seconds", "1e9",
            "--save_every_seconds", f"{plan.checkpoint_every:g}", "--save_total_limit", "1",
            "--logging_steps", str(plan.logging_steps), "--eval_every_steps", str(plan.eval_every),
            "--eval_every_seconds", "1e9", "--eval_num_problems", str(plan.eval_problems),
            "--eval_k", str(plan.eval_k), "--disable_tqdm", "true", "--run_figure", "false"]
    if plan.device == "cpu" and plan.threads:
        argv += ["--torch_threads", str(plan.threads)]
    return Run(method.name, seed, lr, run_dir, updates, (*argv, *method.extra))


def lr_name(lr: float) -> str:
    """A learning rate as it appears in folder names: ``1e-4`` -> ``"0.0001"``."""
    return f"{lr:g}".replace("+", "")


def sweep_runs(plan: Plan) -> list[Run]:
    """GRPO at every rate of ``plan.lrs``, seed-major."""
    grpo = next(m for m in plan.methods if m.name == plan.baseline)
    root = plan.out / "sweep" / "runs"
    return [make_run(plan, grpo, seed, lr, root / f"{grpo.name}-lr{lr_name(lr)}-s{seed}",
                     plan.sweep_updates or plan.updates) for seed in range(plan.sweep_seeds) for lr in plan.lrs]


def study_runs(plan: Plan, lr: float) -> list[Run]:
    """Every method at ``lr``, seed-major (the first seed of every method, then the next, ...)."""
    root = plan.out / "study" / "runs"
    seeds = range(plan.first_seed, plan.first_seed + plan.seeds)
    return [make_run(plan, method, seed, lr, root / f"{method.name}-s{seed}", plan.updates)
            for seed in seeds for method in plan.methods]


# ------------------------------------------------------------------------------------------------------------
# Stages
# ------------------------------------------------------------------------------------------------------------
def cost_stage(plan: Plan) -> None:
    """`pods cost` on the recipe for every n of ``plan.cost_n`` (skipped when ``OUT/cost.json`` exists)."""
    path = plan.out / "cost.json"
    if path.is_file():
        print(f"pods study: cost: {path} exists, not measured again", flush=True)
        return
    argv = [*plan.recipe_argv, "--n", ",".join(map(str, plan.cost_n)), "--m", str(plan.m),
            "--steps", str(plan.cost_steps), "--warmup", str(plan.cost_warmup),
            "--per_device_train_batch_size", str(plan.prompts_per_step * plan.m), "--downsample_to", str(plan.m),
            "--out", str(path)]
    if plan.cost_pilot:
        argv += ["--pilot_generations", str(plan.cost_pilot)]
    if plan.device == "cpu" and plan.threads:
        argv += ["--torch_threads", str(plan.threads)]
    print(f"pods study: cost: pods cost for n = {plan.cost_n} -> m = {plan.m} ({plan.cost_warmup} warm-up + "
          f"{plan.cost_steps} measured steps each)", flush=True)
    env = {**os.environ, **slot_envs(plan.device, 1, plan.threads)[0]}
    log_path = plan.out / "cost.log"
    with open(log_path, "w") as log:
        if plan.in_process:
            returncode = redirected("cost", argv, log)
        else:
            returncode = subprocess.run([sys.executable, "-m", "pods_rl.commands.cli", "cost", *argv], env=env,
                                        stdout=log, stderr=subprocess.STDOUT).returncode
    text = log_path.read_text(errors="replace").strip()
    if returncode != 0 or not path.is_file():
        raise RuntimeError(f"pods cost failed (exit {returncode}): {text.splitlines()[-1] if text else ''} "
                           f"(log: {log_path})")
    print("\n".join(line for line in text.splitlines() if not line.startswith("wrote ")), flush=True)


def sweep_stage(plan: Plan, runner: Runner, command: str | None = None) -> float | None:
    """GRPO at each rate of ``plan.lrs``; returns the best rate once every sweep run finished (else None)."""
    runs = sweep_runs(plan)
    records = runner.run_all(runs, "sweep")
    _log_invocation(plan, "sweep", records, command)
    if not all(run_finished(r.run_dir) for r in runs):
        return None
    report = sweep_report(plan.out / "sweep" / "runs")
    (plan.out / "sweep.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"pods study: sweep: best learning rate {report['best_lr']:g} (mean held-out accuracy over the second "
          "half of training)", flush=True)
    return report["best_lr"]


def _log_invocation(plan: Plan, stage: str, records: list[dict], command: str | None) -> None:
    """Append this invocation's command, its runs and their exact commands to ``OUT/commands.jsonl``."""
    if not records:
        return
    entry = portable({"command": command, "stage": stage, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "runs": {r["name"]: {"status": r["status"], "command": r["command"]} for r in records}})
    with open(plan.out / "commands.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def report_info(plan: Plan, lr: float | None) -> dict:
    """What the report shows of the plan."""
    recipe = next((plan.recipe_argv[i + 1] for i, a in enumerate(plan.recipe_argv[:-1]) if a == "--config"), "tiny")
    fields = ("recipe_argv", "m", "prompts_per_step", "updates", "seeds", "first_seed", "lr", "eval_every",
              "eval_problems", "eval_k", "device", "jobs", "baseline")  # "lr": the study's, below
    return {"recipe": recipe, **{key: getattr(plan, key) for key in fields}, "lr": lr,
            "methods": [m.name for m in plan.methods], "labels": {m.name: m.label for m in plan.methods},
            "title": f"{recipe}, {plan.updates} updates", "bootstrap": plan.bootstrap}


def run_study(plan: Plan, stages: tuple[str, ...] = STAGES, max_minutes: float | None = None,
              progress_every: float = 60.0, command: str | None = None, priced=None) -> dict | None:
    """Run the stages of ``plan`` (each skipping what is already done) and return the report (None if the
    report stage did not run). Stops in-flight runs gracefully once ``max_minutes`` have passed."""
    plan.out.mkdir(parents=True, exist_ok=True)
    if set(stages) - {"report"}:  # a report alone reads what is there (committed results too) and writes no plan
        check_plan_file(plan)
    if set(stages) & {"sweep", "runs"}:
        _unpack_to_continue(plan.out)
    deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
    runner = Runner(plan.device, plan.jobs, plan.threads, deadline=deadline, progress_every=progress_every,
                    keep_weights=not plan.drop_weights, in_process=plan.in_process)
    lr = plan.lr
    try:
        with _sigterm_as_interrupt():
            if "cost" in stages and plan.cost_n:
                cost_stage(plan)
            if plan.lrs:
                lr = sweep_stage(plan, runner, command) if "sweep" in stages else _swept_lr(plan)
            if "runs" in stages and lr is None:
                print("pods study: the sweep has not finished; run the same command again to continue", flush=True)
            elif "runs" in stages:
                check_plan_file(plan, study_lr=lr)
                records = runner.run_all(study_runs(plan, lr), f"study at lr {lr:g}")
                _log_invocation(plan, "runs", records, command)
                failed = sum(r["status"] == "failed" for r in records)
                if failed:
                    raise RuntimeError(f"{failed} run(s) failed; their logs are beside their run directories in "
                                       f"{plan.out / 'study' / 'runs'}")
    except KeyboardInterrupt:
        print("pods study: stopped; the runs in flight saved a checkpoint; run the same command again to continue",
              file=sys.stderr, flush=True)
        raise
    if runner.stop.is_set():
        print("pods study: stopped before the end; run the same command again to continue", flush=True)
    if "report" not in stages:
        return None
    return write_report(plan.out, report_info(plan, lr), command, priced=priced)


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a scheduler's or a time limit's) stops the study like Ctrl-C: its runs stop gracefully."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _unpack_to_continue(out: Path) -> None:
    """A study whose runs are packed (``OUT/runs.tar.xz``, no run files beside it): unpack them in place first, so
    that its finished runs are skipped, not run again. (A report alone reads the archive where it is.)"""
    if (out / ARCHIVE).is_file() and not holds_runs(out):
        print(f"pods study: unpacking {out / ARCHIVE} to continue the study (pack it again with `python -m "
              f"pods_rl.runlog.packed pack {out}`)", flush=True)
        unpack_runs(out)


def _swept_lr(plan: Plan) -> float | None:
    path = plan.out / "sweep.json"
    return json.loads(path.read_text())["best_lr"] if path.is_file() else None


def check_plan_file(plan: Plan, study_lr: float | None = None) -> None:
    """Record the study's settings in ``OUT/plan.json`` (and, once known, the learning rate of its study runs), or
    refuse settings that differ from those of the runs already in ``OUT``: their results would not compare."""
    path = plan.out / "plan.json"
    settings = portable(json.loads(json.dumps(plan.settings())))
    if study_lr is not None:
        settings["study_lr"] = study_lr
    # an older plan.json may name the checkout's folder in full: the same settings once written relative to it
    old = portable(json.loads(path.read_text()).get("settings", {})) if path.is_file() else {}
    changed = {k: (old[k], v) for k, v in settings.items() if k in old and old[k] != v}
    if changed:
        listed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"{plan.out} holds a study with other settings ({listed}); use another --out, or the "
                         "same settings to continue it (more --seeds or methods may be added)")
    path.write_text(json.dumps({"settings": {**old, **settings}, "methods": [m.name for m in plan.methods],
                                "seeds": plan.seeds, "first_seed": plan.first_seed, "baseline": plan.baseline},
                               indent=1) + "\n")


# ------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The `pods study` parser; other flags pass on to `pods train`. A flag takes the spelling of the `pods train`
    flag it means too (``--updates`` / ``--max_steps``), and hyphens or underscores."""
    parser = argparse.ArgumentParser(prog="pods study", allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                     epilog=study_epilog())

    def add(*names, **kwargs):
        parser.add_argument(*spellings(*names), **kwargs)

    add("--out", default=None, help="the study's folder (default ./pods_study, ./pods_study_smoke with --smoke)")
    add("--stage", default="all", help=f"comma-separated subset of {','.join(STAGES)} (default all)")
    add("--m", "--downsample_to", default=None, help="rollouts kept per prompt (default: the recipe's downsample_to)")
    add("--n", default=None, help="PODS n values, comma-separated (default 4m); each runs n -> m max_variance")
    add("--control", default=None, help="n values that also get the random control (default: the largest n; "
        "'none' for none)")
    add("--methods", default=None, help="explicit method names instead: grpo-n16,pods-mv-n64m16,pods-random-n64m16")
    add("--variant", action="append", default=[], metavar="NAME=FLAGS",
        help="a method variant with more `pods train` flags, used as pods-mv-n32m16-NAME in --methods")
    add("--pilot", "--pilot_generations", default=None, help="adaptive rollouts: also run each PODS n -> m with a "
        "pilot round of K rollouts per prompt, more rounds for prompts still all-equal, up to n (method suffix "
        "-pilotK; with --methods, declare it yourself with --variant)")
    add("--baseline", default=None, help="the method the others are compared with (default: GRPO, grpo-n<m>)")
    add("--seeds", type=int, default=4, help="seeds per method (default 4; CIs need >= 2)")
    add("--first-seed", type=int, default=0, help="the first seed (default 0): seeds FIRST .. FIRST + SEEDS - 1, "
        "e.g. fresh seeds for a new study beside an old one")
    add("--updates", "--max_steps", type=int, default=300,
        help="policy updates (optimizer steps) per run (default 300)")
    add("--eval-every", "--eval_every_steps", type=int, default=None,
        help="evaluate every N updates (default updates / 12)")
    add("--eval-problems", "--eval_num_problems", type=int, default=500,
        help="held-out problems per evaluation (default 500)")
    add("--eval-k", type=int, default=4, help="samples per held-out problem (default 4)")
    add("--prompts-per-step", type=int, default=None, help="prompts per update; kept rollouts = this x m (default: "
        "the recipe's per_device_train_batch_size / its m)")
    add("--lrs", default=None, help="sweep GRPO's learning rate over these first (comma-separated)")
    add("--sweep-seeds", type=int, default=2, help="seeds per learning rate in the sweep (default 2)")
    add("--sweep-updates", type=int, default=None, help="updates per sweep run (default --updates)")
    add("--cost-n", default=None, help="n values `pods cost` measures (default m and the study's n; 'none' skips)")
    add("--cost-steps", type=int, default=5, help="measured steps per setting in pods cost (default 5)")
    add("--cost-warmup", type=int, default=1, help="unmeasured steps first in pods cost (default 1)")
    add("--jobs", type=int, default=None, help="runs at a time (default: one per CPU core, or one per visible GPU)")
    add("--threads", type=int, default=None, help="torch threads per run on CPU (default cores / jobs); on CPU it "
        "replaces the recipe's --torch_threads, on CUDA the recipe's is kept")
    add("--checkpoint-every", "--save_every_seconds", type=float, default=120.0,
        help="seconds of training between checkpoints (default 120)")
    add("--max-minutes", type=float, default=None, help="stop in-flight runs gracefully after this long (resumable)")
    add("--progress-every", type=float, default=60.0, help="seconds between progress lines (default 60)")
    add("--drop-weights", action="store_true", help="delete a finished run's final/ and checkpoints (logs stay)")
    add("--in-process", action="store_true", help="run `pods train` (and `pods cost`) in this process, one run "
        "after another: saves each run's start-up (seconds of imports) in small studies")
    add("--bootstrap", type=int, default=2000, help="bootstrap replicates per confidence interval (default 2000)")
    add("--price_at", default=None, metavar="COSTS", help="also price every method's time at another machine's "
        "step costs: a `pods cost` JSON file or c0_ms,sample_ms,train_ms; each step costs c0 + c_s x rollouts "
        "sampled + c_t x rollouts trained, time to each accuracy level on that axis labelled 'priced'; auto methods "
        "plan with the same costs")
    add("--smoke", action="store_true", help="the whole pipeline at toy sizes on this CPU (well under a minute)")
    add("--dry-run", action="store_true", help="print the plan's `pods train` commands and exit")
    one_line_parser_errors(parser)
    return parser


def study_epilog() -> str:
    """The end of `pods study --help`: which `pods train` flags pass on to the recipe, and which the study sets."""
    refused = ", ".join(f"{flag} {instead}" if instead.startswith("(") else f"{flag} (use {instead})"
                        for flag, instead in STUDY_FLAGS.items())
    return ("Any other flag is a `pods train` flag and sets the recipe (--config, the model, the task, batch options, "
            f"--learning_rate...), except those the study sets for each run, which are refused: {refused}. Each run "
            "also gets --max_train_seconds and --eval_every_seconds 1e9 (runs end and evaluate by updates), "
            "--save_total_limit 1, --logging_steps, --disable_tqdm and --run_figure from the study, whatever the "
            "recipe says.")


def main(argv: list[str] | None = None) -> int:
    """``pods study``: exit code 0, 2 on bad input, 1 on another failure (e.g. a run failed)."""
    return run_guarded("pods study", _main, argv)


def _main(argv: list[str]) -> int:
    args, recipe_argv = build_parser().parse_known_args(argv)
    stages = STAGES if args.stage == "all" else tuple(s.strip() for s in args.stage.split(",") if s.strip())
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"--stage {args.stage!r}: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    plan = make_plan(args, recipe_argv)
    # --price_at: checked before any run starts
    plan, priced = _priced_plan(plan, args.price_at) if args.price_at is not None else (plan, None)
    if args.dry_run:
        lrs = plan.lrs and sweep_runs(plan)
        for run in [*(lrs or []), *study_runs(plan, plan.lr if plan.lr is not None else float("nan"))]:
            print(shlex.join(["pods", "train", *run.argv]))
        return 0
    command = shlex.join(["pods", "study", *argv])
    run_study(plan, stages, max_minutes=args.max_minutes, progress_every=args.progress_every, command=command,
              priced=priced)
    return 0


def _priced_plan(plan: Plan, spec: str):
    """``--price_at``: the costs (one line on bad ones), a warning where they were measured on another model or
    task, the runs already in ``OUT`` checked for the counts pricing needs, and auto methods given the costs."""
    costs = study_priced.parse_priced_costs(spec)
    warning = study_priced.cost_file_mismatch(costs, plan.recipe_argv)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if plan.out.is_dir():  # the runs already there (packed or not) must tell what pricing needs
        with runs_root(plan.out) as root:
            if (root / "study" / "runs").is_dir():
                study_priced.check_runs_logged(load_groups(root / "study" / "runs"))
    print(study_priced.describe(costs), flush=True)
    methods = [dataclasses.replace(m, extra=study_priced.priced_planner_argv(m.extra, costs)) for m in plan.methods]
    return dataclasses.replace(plan, methods=methods), costs
