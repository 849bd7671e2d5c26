"""The evidence study: does PODS learn more per policy update than GRPO, and what does that buy in time?

Successor of bench_pods_vs_grpo.py (which gave every run the same training-time budget and could not tell
the methods apart). Here every run gets the same number of POLICY UPDATES, so the study measures the three
numbers a user needs separately:

1. learning per update: optimizer steps each method needs to reach a target accuracy (GRPO/PODS ratio);
2. the step-time ratio: seconds per PODS step / seconds per GRPO step on this machine;
3. the wall-clock speed-up: training time to the same target (GRPO/PODS), which should be about (1)/(2).

Methods (every one keeps ``--prompts-per-step`` x m rollouts per step; m = 16):

    grpo-n16               GRPO, n = 16, all kept
    pods-mv-n32m16         PODS max_variance, n = 32 -> m = 16
    pods-mv-n64m16         PODS max_variance, n = 64 -> m = 16
    pods-random-n64m16     PODS random,       n = 64 -> m = 16 (the control: same generation, no selection)

Stages:

    sweep    GRPO alone at several learning rates (--lrs), --sweep-seeds seeds each: pick the rate for GRPO;
    study    all methods at that rate (--lr), --seeds seeds each, --steps updates, held-out evaluation every
             --eval-every steps on --eval-problems x --eval-k samples (500 x 4 by default);
    options  PODS 32 -> 16 against itself with a selection option on (issue #13): ``downsample_tiebreak:
             shorter`` and ``oversample_prompts: 2``, --seeds seeds each, the study's protocol (options.json);
    report   statistics, figures and study.json from whatever runs are finished (runs after each stage too).

Every run is ``pods train --config tiny`` with overrides, in its own subprocess with one torch thread;
``--jobs`` runs go in parallel (2 on a 2-core machine), taken in seed-major order (for seed: for method) so
slow periods of a shared machine spread over all methods. A run whose directory holds summary.json is
skipped: stop and start again at will. An unfinished run continues from its last complete checkpoint
(exact resume; ``--checkpoint-every`` seconds of training between saves) and without one it is moved to
``runs/_incomplete/`` and started over.

    python benchmarks/study_pods_vs_grpo.py sweep --lrs 1e-4,2e-4,5e-4,1e-3
    python benchmarks/study_pods_vs_grpo.py study --lr 5e-4 --seeds 8
    python benchmarks/study_pods_vs_grpo.py report
    python benchmarks/study_pods_vs_grpo.py study --quick --out /tmp/study     # smoke test (~1 min)
Results: benchmarks/results/<machine>/study/ (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))  # pods_rl without pip install

from _machine import machine_info, machine_slug, results_dir  # noqa: E402
from study_report import run_finished, write_report  # noqa: E402

from pods_rl import runlog  # noqa: E402

QUICK = dict(steps=4, eval_every=2, eval_problems=16, eval_k=2, seeds=2, sweep_seeds=2, lrs=[2e-4],
             methods=["grpo-n16", "pods-mv-n64m16"])


@dataclass(frozen=True)
class Method:
    """n sampled per prompt, m kept by ``rule`` (n == m is GRPO)."""

    name: str
    n: int
    m: int
    rule: str
    extra: tuple[str, ...] = ()  # more `pods train` flags (the selection options of the options stage)

    @property
    def is_grpo(self) -> bool:
        return self.n == self.m


METHODS = {m.name: m for m in (
    Method("grpo-n16", 16, 16, "max_variance"),
    Method("pods-mv-n32m16", 32, 16, "max_variance"),
    Method("pods-mv-n64m16", 64, 16, "max_variance"),
    Method("pods-random-n64m16", 64, 16, "random"),
)}
# The options stage (issue #13): PODS 32 -> 16 against itself with one selection option switched on.
OPTION_BASELINE = "pods-mv-n32m16"
OPTIONS = {m.name: m for m in (
    Method("pods-mv-n32m16-shorter", 32, 16, "max_variance", ("--downsample_tiebreak", "shorter")),
    Method("pods-mv-n32m16-over2", 32, 16, "max_variance", ("--oversample_prompts", "2")),
)}
LABELS = {"grpo-n16": "GRPO (n=16)", "pods-mv-n32m16": "PODS max_variance (n=32→m=16)",
          "pods-mv-n64m16": "PODS max_variance (n=64→m=16)", "pods-random-n64m16": "PODS random (n=64→m=16)"}


def train_command(method: Method, seed: int, lr: float, run_dir: Path, args) -> list[str]:
    """The ``pods train`` command line of one run (a fixed number of optimizer steps)."""
    cmd = [sys.executable, "-m", "pods_rl.cli", "train", "--config", "tiny", "--output_dir", str(run_dir),
           "--num_generations", str(method.n), "--downsample_to", str(method.m),
           "--downsample_rule", method.rule, "--seed", str(seed), "--learning_rate", f"{lr:g}",
           "--per_device_train_batch_size", str(args.prompts_per_step * method.m),
           "--gradient_accumulation_steps", "1", "--max_steps", str(args.steps),
           "--max_train_seconds", "1e9", "--save_every_seconds", f"{args.checkpoint_every:g}",
           "--save_total_limit", "1", "--logging_steps", "5",
           "--eval_every_steps", str(args.eval_every), "--eval_every_seconds", "1e9", "--eval_num_problems", str(args.eval_problems),
           "--eval_k", str(args.eval_k), "--eval_batch_size", "1000", "--torch_threads", "1",
           "--disable_tqdm", "true", *method.extra]
    return cmd + shlex.split(args.train_args or "")


def run_one(job: tuple, runs_dir: Path, args, env: dict) -> dict:
    """Train one (method, seed, lr) in a subprocess unless its run directory already holds summary.json."""
    method, seed, lr, name = job
    run_dir = runs_dir / name
    record = {"name": name, "method": method.name, "seed": seed, "lr": lr, "run_dir": str(run_dir)}
    if run_finished(run_dir):
        return {**record, "status": "skipped"}
    resume = run_dir.exists() and bool(runlog.list_checkpoints(run_dir))
    if run_dir.exists() and not resume:  # interrupted before its first checkpoint: keep it aside, start over
        aside = runs_dir / "_incomplete" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), str(aside))
    cmd = train_command(method, seed, lr, run_dir, args) + (["--resume_from_checkpoint", "true"] if resume else [])
    log_path = runs_dir / f"{name}.log"
    start = time.perf_counter()
    with open(log_path, "a" if resume else "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    ok = proc.returncode == 0 and run_finished(run_dir)
    stopped = not ok and (run_dir / "summary.json").is_file() and bool(runlog.list_checkpoints(run_dir))
    record.update(status="done" if ok else "stopped" if stopped else "failed", wall_seconds=round(wall, 1), returncode=proc.returncode,
                  command=shlex.join(cmd), log=str(log_path), resumed=resume)
    if ok:
        (run_dir / "study_run.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def run_jobs(jobs: list[tuple], runs_dir: Path, args) -> list[dict]:
    """Run ``jobs`` (seed-major order) ``args.jobs`` at a time; print one line per finished run."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}
    if args.dry_run:
        for method, seed, lr, name in jobs:
            print(shlex.join(train_command(method, seed, lr, runs_dir / name, args)))
        return []
    todo = [j for j in jobs if not run_finished(runs_dir / j[3])]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} done before; {len(todo)} to go, {args.jobs} at a time "
          f"-> {runs_dir}", flush=True)
    records, started = [], time.perf_counter()

    def work(job):
        record = run_one(job, runs_dir, args, env)
        done = len(records) + 1
        elapsed = time.perf_counter() - started
        summary = {}
        if record["status"] == "done":
            summary = json.loads((Path(record["run_dir"]) / "summary.json").read_text())
        print(f"[{done}/{len(todo)}] {record['name']}: {record['status']} in {record.get('wall_seconds', 0):.0f} s, "
              f"accuracy {summary.get('accuracy_before', float('nan')):.3f} -> "
              f"{summary.get('accuracy_after', float('nan')):.3f}; {elapsed / 60:.1f} min elapsed", flush=True)
        if record["status"] == "failed":
            print("   " + "\n   ".join(Path(record["log"]).read_text().strip().splitlines()[-5:]), flush=True)
        records.append(record)
        return record

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(work, todo))
    return records


def _lr_name(lr: float) -> str:
    return f"{lr:g}".replace("+", "")


def sweep_jobs(args) -> list[tuple]:
    """GRPO at every rate of --lrs, seed-major."""
    grpo = METHODS["grpo-n16"]
    return [(grpo, seed, lr, f"grpo-n16-lr{_lr_name(lr)}-s{seed}")
            for seed in range(args.sweep_seeds) for lr in args.lrs]


def study_jobs(args) -> list[tuple]:
    """Every method of --methods at --lr, seed-major."""
    return [(METHODS[name], seed, args.lr, f"{name}-s{seed}") for seed in range(args.seeds) for name in args.methods]


def options_jobs(args) -> list[tuple]:
    """PODS 32 -> 16 and each selection option at --lr, seed-major."""
    methods = [METHODS[OPTION_BASELINE], *OPTIONS.values()]
    return [(m, seed, args.lr, f"{m.name}-s{seed}") for seed in range(args.seeds) for m in methods]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["sweep", "study", "options", "report"])
    parser.add_argument("--lrs", default="1e-4,2e-4,5e-4,1e-3", help="sweep: learning rates for GRPO")
    parser.add_argument("--sweep-seeds", type=int, default=2, help="sweep: seeds per learning rate")
    parser.add_argument("--lr", type=float, default=None, help="study: the learning rate (from the sweep)")
    parser.add_argument("--seeds", type=int, default=8, help="study: seeds per method")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"study: subset of {list(METHODS)}")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 300)")
    parser.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (default 25)")
    parser.add_argument("--eval-problems", type=int, default=None, help="held-out problems (default 500)")
    parser.add_argument("--eval-k", type=int, default=None, help="samples per problem (default 4)")
    parser.add_argument("--prompts-per-step", type=int, default=8,
                        help="prompts per step; kept rollouts per step = this x 16 (default 8, as the tiny "
                        "recipe's 128 rows)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each; default 2)")
    parser.add_argument("--train-args", default=None, help="extra `pods train` flags for every run")
    parser.add_argument("--quick", action="store_true", help="smoke test: 4-step runs, 2 seeds, 2 methods")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<machine>/study")
    parser.add_argument("--checkpoint-every", type=float, default=1e9,
                        help="seconds of training between checkpoints, so an interrupted run resumes (default: none)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)

    preset = QUICK if args.quick else {}
    args.steps = args.steps or preset.get("steps", 300)
    args.eval_every = args.eval_every or preset.get("eval_every", 25)
    args.eval_problems = args.eval_problems or preset.get("eval_problems", 500)
    args.eval_k = args.eval_k or preset.get("eval_k", 4)
    if args.quick:
        args.seeds, args.sweep_seeds = preset["seeds"], preset["sweep_seeds"]
        args.methods, args.lrs = ",".join(preset["methods"]), ",".join(str(x) for x in preset["lrs"])
    try:
        args.lrs = [float(x) for x in args.lrs.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--lrs must be comma-separated numbers, got {args.lrs!r}")
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if min(args.steps, args.eval_every, args.eval_problems, args.eval_k, args.seeds, args.jobs) < 1:
        parser.error("--steps, --eval-every, --eval-problems, --eval-k, --seeds and --jobs must be >= 1")
    if args.stage in ("study", "options") and args.lr is None:
        args.lr = args.lrs[0] if args.quick else None
        if args.lr is None:
            parser.error("study needs --lr (run the sweep first and take GRPO's best rate)")

    out = args.out or results_dir(machine_slug({**machine_info(), "gpu": None})) / "study"
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "benchmarks/study_pods_vs_grpo.py", *(sys.argv[1:] if argv is None else argv)])
    if args.stage in ("sweep", "study", "options"):
        jobs = {"sweep": sweep_jobs, "study": study_jobs, "options": options_jobs}[args.stage](args)
        try:
            records = run_jobs(jobs, out / args.stage / "runs", args)
        except KeyboardInterrupt:
            print(f"study: interrupted; the runs in flight saved a checkpoint and continue from it when the same "
                  f"command runs again ({out / args.stage / 'runs'})", file=sys.stderr)
            return 130
        if args.dry_run:
            return 0
        log = out / "commands.jsonl"  # every invocation and its runs' exact commands
        with open(log, "a") as f:
            f.write(json.dumps({"command": command, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "runs": {r["name"]: r.get("command") for r in records if r.get("command")}}) + "\n")
        if any(r["status"] == "failed" for r in records):
            return 1
    write_report(out, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
