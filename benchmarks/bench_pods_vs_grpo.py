"""The paper's experiment on the embedded task: GRPO vs GRPO-PODS at an equal training-time budget per run.

Configurations (m = 16 kept rollouts per prompt, the same number of kept rollouts per optimizer step for all:
``--prompts-per-step`` x m, default 4 x 16 = 64):

    grpo-n16               GRPO, n = 16, all kept
    pods-mv-n64m16         PODS max_variance, n = 64 -> m = 16
    pods-mv-n32m16         PODS max_variance, n = 32 -> m = 16
    pods-random-n64m16     PODS random,       n = 64 -> m = 16
    pods-maxreward-n64m16  PODS max_reward,   n = 64 -> m = 16

(``--m`` and ``--n-list`` change the sizes: max_variance runs at every n of the list, the other rules at the
largest.) Each run is ``pods train --config tiny`` with those overrides, ``max_train_seconds = --budget`` and a
held-out evaluation every ``--eval-every`` seconds of training time (plus before the first step and after the
last); training time excludes evaluation and checkpointing, so every method gets the same optimizer-step time.
Runs go one at a time, each in its own subprocess with all cores, in seed-major order (for seed: for config),
so that slow periods of a shared machine spread over all methods. A run whose directory already holds
summary.json is skipped, so the script can be stopped and started again; an unfinished run directory is moved
to ``runs/_incomplete/`` (kept) and the run starts over.

Afterwards: accuracy-vs-time and time-per-phase figures (pods_rl.plots), the time each method needs to reach
GRPO's peak mean accuracy and its speed-up with a bootstrap 95% CI over seeds (pods_rl.stats.compare_runs), a
table, and bench_pods_vs_grpo.json (final accuracy mean ± SE per config, the compare result, the budget, the
machine, the commands).

    python benchmarks/bench_pods_vs_grpo.py                          # 5 configs x 5 seeds, CPU, ~50 min
    python benchmarks/bench_pods_vs_grpo.py --dry-run                # the plan and the 25 commands only
    python benchmarks/bench_pods_vs_grpo.py --configs grpo-n16,pods-mv-n64m16 --seeds 3
    python benchmarks/bench_pods_vs_grpo.py --quick --model PATH --out /tmp/x   # smoke test (~1 min)
    pods build-tiny --hidden-size 256 --num-layers 8 --out /tmp/tiny256      # a larger model, same recipe
    python benchmarks/bench_pods_vs_grpo.py --device cuda --model /tmp/tiny256 --n-list 64,128 --budget 600
Results: benchmarks/results/<machine>/pods_vs_grpo/ (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))  # pods_rl without pip install

from _machine import machine_info, machine_slug, results_dir  # noqa: E402

RULE_ABBREVIATIONS = {"max_variance": "mv", "random": "random", "max_reward": "maxreward"}
DEFAULT_SEEDS = 5
DEFAULT_BUDGET_S = 100.0  # 25 runs x (100 s training + evaluations + start-up) ~ 51 min on 2 CPU cores
DEFAULT_EVAL_EVERY_S = 15.0
DEFAULT_EVAL_PROBLEMS = 100
DEFAULT_EVAL_K = 4
# Planning estimates for a 2-core CPU and a hidden-64, 4-layer tiny model, about 1.5x what was measured with
# one thread (start-up + saves ~8 s; 400 eval samples of 32 tokens ~0.65 s). Revised from real runs as they end.
STARTUP_S = 12.0  # python + torch/trl import, model load, checkpoint and final saves, figure
EVAL_S_PER_SAMPLE = 0.003  # one evaluation sample (completion) at the tiny recipe's length
QUICK = dict(configs=["grpo-n16", "pods-mv-n64m16"], seeds=1, budget=10.0, eval_every=5.0, eval_problems=16,
             eval_k=2)


@dataclass
class BenchConfig:
    """One method of the comparison: n sampled, m kept by ``rule`` (n == m is GRPO)."""

    name: str
    n: int
    m: int
    rule: str

    @property
    def is_grpo(self) -> bool:
        return self.n == self.m


def make_configs(m: int = 16, n_list: list[int] | None = None) -> list[BenchConfig]:
    """GRPO at n = m, PODS max_variance at every n of ``n_list`` (default [64, 32]; each > m), and PODS random
    and max_reward at the largest n. Names follow ``grpo-n16`` / ``pods-mv-n64m16``."""
    n_list = sorted(set(n_list or [4 * m, 2 * m]), reverse=True)
    if m < 2:
        raise ValueError(f"m must be >= 2 (group-normalized advantages of one rollout are 0), got {m}")
    if min(n_list) <= m:
        raise ValueError(f"every n of --n-list must exceed m={m} (n = m is the GRPO baseline), got {n_list}")
    configs = [BenchConfig(f"grpo-n{m}", m, m, "max_variance")]
    configs += [BenchConfig(f"pods-mv-n{n}m{m}", n, m, "max_variance") for n in n_list]
    for rule in ("random", "max_reward"):
        configs.append(BenchConfig(f"pods-{RULE_ABBREVIATIONS[rule]}-n{n_list[0]}m{m}", n_list[0], m, rule))
    return configs


def planned_seconds(num_runs: int, budget: float, eval_every: float, eval_problems: int, eval_k: int) -> dict:
    """Wall-clock estimate of the whole benchmark: per run start-up + budget + evaluations (before the first
    step, every ``eval_every`` training seconds, and at the end)."""
    evals_per_run = 1 + math.ceil(budget / eval_every)
    eval_s = EVAL_S_PER_SAMPLE * eval_problems * eval_k
    per_run = STARTUP_S + budget + evals_per_run * eval_s
    return {"runs": num_runs, "per_run_seconds": per_run, "evals_per_run": evals_per_run,
            "seconds_per_eval": eval_s, "total_seconds": num_runs * per_run}


def train_command(config: BenchConfig, seed: int, run_dir: Path, args) -> list[str]:
    """The ``pods train`` command line of one run."""
    cmd = [sys.executable, "-m", "pods_rl.cli", "train", "--config", args.recipe,
           "--output_dir", str(run_dir),
           "--num_generations", str(config.n), "--downsample_to", str(config.m),
           "--downsample_rule", config.rule, "--seed", str(seed),
           "--per_device_train_batch_size", str(args.prompts_per_step * config.m),
           "--gradient_accumulation_steps", "1",
           "--max_train_seconds", str(args.budget), "--eval_every_seconds", str(args.eval_every),
           "--eval_num_problems", str(args.eval_problems), "--eval_k", str(args.eval_k),
           "--use_cpu", "true" if args.device == "cpu" else "false"]
    if args.model:
        cmd += ["--model_name_or_path", str(args.model)]
    return cmd + shlex.split(args.train_args or "")


def run_one(config: BenchConfig, seed: int, runs_dir: Path, args, env: dict) -> dict:
    """Train one (config, seed) in a subprocess unless its run directory already holds summary.json.

    Returns {"name", "run_dir", "status": "done" | "skipped" | "failed", "wall_seconds", "returncode", "command"}.
    """
    name = f"{config.name}-s{seed}"
    run_dir = runs_dir / name
    record = {"name": name, "config": config.name, "seed": seed, "run_dir": str(run_dir)}
    if (run_dir / "summary.json").is_file():
        return {**record, "status": "skipped"}
    if run_dir.exists():  # an interrupted run: keep it aside and start over (training time must be contiguous)
        aside = runs_dir / "_incomplete" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), str(aside))
        print(f"  {name}: unfinished run directory moved to {aside}")
    cmd = train_command(config, seed, run_dir, args)
    log_path = runs_dir / f"{name}.log"
    timeout = max(600.0, 6 * (args.budget + args.eval_every))
    start = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = "timeout"
    wall = time.perf_counter() - start
    ok = returncode == 0 and (run_dir / "summary.json").is_file()
    record.update(status="done" if ok else "failed", wall_seconds=round(wall, 1), returncode=returncode,
                  command=shlex.join(cmd), log=str(log_path))
    if ok:
        (run_dir / "bench_run.json").write_text(json.dumps(record, indent=1) + "\n")
    else:
        tail = log_path.read_text().strip().splitlines()[-5:]
        print(f"  {name}: FAILED (exit {returncode}); last lines of {log_path}:\n    " + "\n    ".join(tail))
    return record


# ------------------------------------------------------------------------------------------------------------
# Aggregation
# ------------------------------------------------------------------------------------------------------------
def _mean_se(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and standard error (std ddof=1 / sqrt(S)); SE is None for fewer than 2 values."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def summarize(configs: list[BenchConfig], seeds: list[int], runs_dir: Path) -> tuple[dict, list]:
    """Per-config results from the finished run directories; returns (per-config dict, loaded RunData list)."""
    from pods_rl.plots import load_run
    from pods_rl.runlog import read_metrics

    per_config, loaded = {}, []
    for config in configs:
        runs = []
        for seed in seeds:
            run_dir = runs_dir / f"{config.name}-s{seed}"
            summary_path = run_dir / "summary.json"
            if not summary_path.is_file():
                continue
            summary = json.loads(summary_path.read_text())
            run = load_run(run_dir)
            eval_seconds = [row["eval/eval_seconds"] for row in read_metrics(run_dir) if "eval/eval_seconds" in row]
            bench = json.loads((run_dir / "bench_run.json").read_text()) if (run_dir / "bench_run.json").is_file() \
                else {}
            runs.append({"seed": seed, "run_dir": str(run_dir), "label": run.label,
                         "accuracy_before": summary.get("accuracy_before"),
                         "accuracy_after": summary.get("accuracy_after"),
                         "peak_accuracy": float(run.values.max()) if len(run.values) else None,
                         "evaluations": len(run.times), "eval_source": run.source,
                         "eval_seconds_total": round(sum(eval_seconds), 1),
                         "steps": summary.get("steps"), "train_seconds": summary.get("train_seconds"),
                         "wall_seconds": bench.get("wall_seconds"), "phase_seconds_per_step": run.phase_seconds})
            if len(run.times):
                loaded.append(run)
        finals = [r["accuracy_after"] for r in runs if r["accuracy_after"] is not None]
        befores = [r["accuracy_before"] for r in runs if r["accuracy_before"] is not None]
        steps = [r["steps"] for r in runs if r["steps"] is not None]
        mean, se = _mean_se(finals)
        step_s = [r["phase_seconds_per_step"].get("step") for r in runs if r["phase_seconds_per_step"].get("step")]
        per_config[config.name] = {
            "label": runs[0]["label"] if runs else None, "n": config.n, "m": config.m,
            "rule": "none (GRPO)" if config.is_grpo else config.rule, "seeds_done": len(runs),
            "final_accuracy_mean": mean, "final_accuracy_se": se,
            "accuracy_before_mean": _mean_se(befores)[0],
            "steps_mean": _mean_se(steps)[0], "seconds_per_step_mean": _mean_se(step_s)[0],
            "runs": runs,
        }
    return per_config, loaded


def _fmt(value, spec=".3f", none="—"):
    return none if value is None else format(value, spec)


def print_table(per_config: dict, compare: dict | None) -> None:
    """Per-config final accuracy (mean ± SE over seeds), steps, seconds per step, time to target, speed-up."""
    labels = (compare or {}).get("labels", {})
    header = (f"{'config':<24} {'seeds':>5} {'acc before':>10} {'final acc ± SE':>16} {'steps':>6} {'s/step':>7} "
              f"{'t_target(s)':>11} {'speed-up':>9} {'95% CI':>14}")
    print(header)
    print("-" * len(header))
    for name, c in per_config.items():
        entry = labels.get(c["label"], {})
        final = f"{_fmt(c['final_accuracy_mean'])} ± {_fmt(c['final_accuracy_se'])}"
        sp = entry.get("speedup")
        mark = {"lower_bound": ">", "upper_bound": "<"}.get(entry.get("speedup_kind"), "")
        ci = entry.get("speedup_ci95")
        ci_text = "—" if not ci else "[" + ", ".join("inf" if v is None else f"{v:.2f}" for v in ci) + "]"
        print(f"{name:<24} {c['seeds_done']:>5} {_fmt(c['accuracy_before_mean']):>10} {final:>16} "
              f"{_fmt(c['steps_mean'], '.0f'):>6} {_fmt(c['seconds_per_step_mean'], '.2f'):>7} "
              f"{_fmt(entry.get('time_to_target'), '.0f', 'never' if entry else '—'):>11} "
              f"{(mark + _fmt(sp, '.2f') + 'x') if sp is not None else '—':>9} {ci_text:>14}")
    if compare:
        print(f"target: {compare['target']:.4f} = {compare['target_source']} ({compare['baseline']})")


def _parse_int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=None,
                        help=f"training seconds per run (default {DEFAULT_BUDGET_S:g}; quick {QUICK['budget']:g})")
    parser.add_argument("--eval-every", type=float, default=None,
                        help=f"evaluate every this many training seconds (default {DEFAULT_EVAL_EVERY_S:g})")
    parser.add_argument("--eval-problems", type=int, default=None,
                        help=f"held-out problems per evaluation (default {DEFAULT_EVAL_PROBLEMS})")
    parser.add_argument("--eval-k", type=int, default=None,
                        help=f"samples per problem per evaluation (default {DEFAULT_EVAL_K})")
    parser.add_argument("--seeds", type=int, default=None, help=f"seeds per config (default {DEFAULT_SEEDS})")
    parser.add_argument("--configs", default=None, help="comma-separated subset of the config names (see above)")
    parser.add_argument("--m", type=int, default=16, help="kept rollouts per prompt (default 16)")
    parser.add_argument("--n-list", type=_parse_int_list, default=None,
                        help="n values for PODS max_variance (default 4m,2m = 64,32); random and max_reward "
                        "use the largest")
    parser.add_argument("--prompts-per-step", type=int, default=4,
                        help="prompts per optimizer step; per_device_train_batch_size = this x m (default 4)")
    parser.add_argument("--model", default=None, help="HF model directory (default: the shipped tiny model)")
    parser.add_argument("--recipe", default="tiny", help="recipe to start from (default: tiny)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP/MKL threads of each run (default: all usable cores)")
    parser.add_argument("--train-args", default=None,
                        help="extra `pods train` flags for every run, one quoted string, e.g. '--bf16 true'")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2 configs, 1 seed, 10 s budget, 16 problems x 2 samples per eval")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: benchmarks/results/<machine>/pods_vs_grpo)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands, run nothing")
    args = parser.parse_args(argv)

    # Defaults: the quick preset, else the full benchmark; explicit flags win over both.
    preset = QUICK if args.quick else {}
    args.budget = args.budget or preset.get("budget", DEFAULT_BUDGET_S)
    args.eval_every = args.eval_every or preset.get("eval_every", DEFAULT_EVAL_EVERY_S)
    args.eval_problems = args.eval_problems or preset.get("eval_problems", DEFAULT_EVAL_PROBLEMS)
    args.eval_k = args.eval_k or preset.get("eval_k", DEFAULT_EVAL_K)
    num_seeds = args.seeds or preset.get("seeds", DEFAULT_SEEDS)
    if min(args.budget, args.eval_every) <= 0 or min(args.eval_problems, args.eval_k, num_seeds) < 1:
        parser.error("--budget and --eval-every must be > 0; --eval-problems, --eval-k and --seeds >= 1")
    if args.prompts_per_step < 1:
        parser.error("--prompts-per-step must be >= 1")
    try:
        all_configs = make_configs(args.m, args.n_list)
    except ValueError as err:
        parser.error(str(err))
    by_name = {c.name: c for c in all_configs}
    wanted = args.configs.split(",") if args.configs else preset.get("configs", list(by_name))
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        parser.error(f"unknown config(s) {unknown}; choose from {list(by_name)}")
    configs = [by_name[name] for name in wanted]
    seeds = list(range(num_seeds))
    if args.model and not (Path(args.model) / "config.json").is_file():
        print(f"error: --model {args.model} is not a model directory (no config.json)", file=sys.stderr)
        return 2
    if args.model is None:
        from pods_rl.tiny import model_path

        try:
            args.model = str(model_path())
        except FileNotFoundError as err:
            print(f"error: {err}; or pass --model PATH", file=sys.stderr)
            return 2

    info = machine_info()
    if args.device == "cpu":
        info = {**info, "gpu": None}  # a CPU run on a GPU host belongs with CPU results
    out_dir = args.out or results_dir(machine_slug(info)) / "pods_vs_grpo"
    runs_dir = out_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "benchmarks/bench_pods_vs_grpo.py", *(sys.argv[1:] if argv is None else argv)])

    order = [(seed, config) for seed in seeds for config in configs]  # seed-major: noise spreads over methods
    todo = [(s, c) for s, c in order if not (runs_dir / f"{c.name}-s{s}" / "summary.json").is_file()]
    plan = planned_seconds(len(todo), args.budget, args.eval_every, args.eval_problems, args.eval_k)
    print(f"{len(configs)} configs x {len(seeds)} seeds = {len(order)} runs ({len(order) - len(todo)} already "
          f"done); budget {args.budget:g} s of training per run, evaluation every {args.eval_every:g} s on "
          f"{args.eval_problems} problems x {args.eval_k} samples")
    print(f"planned: ~{plan['per_run_seconds']:.0f} s per run ({plan['evals_per_run']} evaluations of "
          f"~{plan['seconds_per_eval']:.0f} s) -> ~{plan['total_seconds'] / 60:.1f} min for {len(todo)} runs "
          f"(estimate for a 2-core CPU; revised below as runs finish)")
    print(f"output: {out_dir}")

    threads = str(args.threads or info.get("usable_cores") or os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if args.device == "cpu" and int(threads) > 1 and load > 0.5:
        # Measured on a 2-core machine with one other busy process: 2 OpenMP threads made steps ~30x slower
        # than 1 thread (threads spin waiting for the busy core). Timings would measure the contention.
        print(f"warning: load average {load:.1f} before starting: other processes use the CPU, and runs with "
              f"{threads} threads slow down badly when a core is shared; wait for a quiet machine or pass "
              f"--threads 1", file=sys.stderr)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}
    if args.dry_run:
        for seed, config in todo:
            print(shlex.join(train_command(config, seed, runs_dir / f"{config.name}-s{seed}", args)))
        return 0

    records, walls, started = [], [], time.perf_counter()
    for i, (seed, config) in enumerate(order, 1):
        record = run_one(config, seed, runs_dir, args, env)
        records.append(record)
        if record["status"] == "skipped":
            print(f"[{i}/{len(order)}] {record['name']}: done before, skipped")
            continue
        walls.append(record["wall_seconds"])
        remaining = sum(1 for s, c in order[i:] if not (runs_dir / f"{c.name}-s{s}" / "summary.json").is_file())
        eta = remaining * sum(walls) / len(walls)
        summary = {}
        if record["status"] == "done":
            summary = json.loads((Path(record["run_dir"]) / "summary.json").read_text())
        print(f"[{i}/{len(order)}] {record['name']}: {record['status']} in {record['wall_seconds']:.0f} s, "
              f"{summary.get('steps', '?')} steps, accuracy {_fmt(summary.get('accuracy_before'))} -> "
              f"{_fmt(summary.get('accuracy_after'))}; ~{eta / 60:.1f} min left", flush=True)
    failed = [r for r in records if r["status"] == "failed"]

    # ---- aggregate -----------------------------------------------------------------------------------------
    from pods_rl.plots import compare_runs, format_compare_table, plot_accuracy_vs_time, plot_phase_times

    per_config, runs = summarize(configs, seeds, runs_dir)
    compare, compare_error, figures = None, None, []
    labels = {c["label"] for c in per_config.values() if c["label"]}
    baseline = next((c["label"] for name, c in per_config.items() if by_name[name].is_grpo and c["label"]), None)
    if runs:
        title = f"{Path(args.model).name}: {args.budget:g} s of training per run"
        try:
            plot_accuracy_vs_time(runs, out=out_dir, title=title)
            figures.append("accuracy_vs_time")
        except ValueError as err:
            print(f"warning: no accuracy figure: {err}", file=sys.stderr)
        try:
            plot_phase_times(runs, out=out_dir, title=title)
            figures.append("step_time_by_phase")
        except ValueError as err:
            print(f"warning: no phase figure: {err}", file=sys.stderr)
        if len(labels) >= 2:
            try:
                compare = compare_runs(runs, baseline=baseline)
            except ValueError as err:
                compare_error = str(err)
                print(f"warning: no comparison: {err}", file=sys.stderr)
    print()
    print_table(per_config, compare)
    if compare:
        print()
        print(format_compare_table(compare))

    payload = {
        "benchmark": "GRPO vs GRPO-PODS at an equal training-time budget per run (pods train, tiny recipe)",
        "command": command,
        "budget_seconds": args.budget,
        "eval_every_seconds": args.eval_every,
        "eval": {"problems": args.eval_problems, "k": args.eval_k},
        "seeds": seeds,
        "prompts_per_step": args.prompts_per_step,
        "kept_rollouts_per_step": {c.name: args.prompts_per_step * c.m for c in configs},
        "model": args.model,
        "recipe": args.recipe,
        "device": args.device,
        "threads_per_run": int(threads),
        "load_average_at_start": load,
        "extra_train_args": args.train_args,
        "order": "seed-major (for seed: for config), one run at a time",
        "plan": plan,
        "wall_seconds_this_invocation": round(time.perf_counter() - started, 1),
        "machine": info,
        "configs": per_config,
        "compare": compare,
        "compare_error": compare_error,
        "figures": [f"{stem}.png" for stem in figures],
        "failed_runs": failed,
        "train_commands": {r["name"]: r.get("command") for r in records if r.get("command")},
    }
    (out_dir / "bench_pods_vs_grpo.json").write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    print(f"wrote {out_dir / 'bench_pods_vs_grpo.json'}" + "".join(f", {f}.png" for f in figures))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
