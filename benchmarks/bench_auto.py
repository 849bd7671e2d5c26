"""Micro-benchmark of the auto planner's step (``rollout_planner="auto"``): its time per plan at P prompts.

One plan is what ``PODSTrainer`` calls once per generation: the ledger's stats for the P candidates, their Beta
posteriors, the signal table over n = m..max_n (prompts with the same posterior computed once) and the exact
signal-per-second allocation. The ledger holds a realistic history (each prompt seen 16 times, pass rates spread
over [0, 1]) and a cost fit (a launch-bound sampler: the plans raise n). Goal (issue #67): under 2 ms at 512 prompts
on CPU. Timing: warm-up, then the median over repeats. Prints a table; JSON to
benchmarks/results/<machine>/bench_auto.json.

    python benchmarks/bench_auto.py            # P = 64, 512, 2048; (m, max_n) = (8, 32), (16, 64)
    python benchmarks/bench_auto.py --quick    # fewer repeats (smoke test)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install

from _machine import add_threads_argument, machine_info, results_dir  # noqa: E402

from pods_rl.budget.ledger import LedgerSettings, PromptLedger  # noqa: E402
from pods_rl.budget.planners import make_planner  # noqa: E402

GOAL_MS = 2.0  # at 512 prompts (the goal)
CASES = [(P, m, max_n) for P in (64, 512, 2048) for m, max_n in ((8, 32), (16, 64))]


def planner_with_history(P: int, m: int, max_n: int, seed: int = 0):
    """An auto planner whose cost fit knows a launch-bound slope, and a ledger of P prompts seen 16 times each."""
    generator = torch.Generator().manual_seed(seed)
    ledger = PromptLedger(LedgerSettings(success_threshold=0.5))
    rates = torch.rand(P, generator=generator)  # (P,) pass rates over [0, 1]
    rewards = (torch.rand(P, 16, generator=generator) < rates[:, None]).double()  # (P, 16)
    ledger.record(torch.arange(P), rewards, step=0)
    planner = make_planner("auto", min_n=m, max_n=max_n, warmup_steps=0)
    for step in range(8):  # sampling 0.17 s + 0.06 ms per rollout, at two totals; 0.5 ms per trained rollout
        N = P * (m if step % 2 else max_n)
        planner.observe(sampled=N, sample_seconds=0.17 + 6e-5 * N, trained=P * m, update_seconds=5e-4 * P * m)
    return planner, ledger


def time_plans(P: int, m: int, max_n: int, repeats: int) -> dict:
    """Median milliseconds of one ``plan`` over ``repeats`` calls, and the plan's mean n."""
    planner, ledger = planner_with_history(P, m, max_n)
    ids = torch.arange(P)
    for _ in range(3):
        plan = planner.plan(ids, ledger, n=max_n, m=m)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan = planner.plan(ids, ledger, n=max_n, m=m)
        times.append(time.perf_counter() - start)
    return {"prompts": P, "m": m, "max_n": max_n, "ms_median": 1e3 * statistics.median(times),
            "ms_min": 1e3 * min(times), "repeats": repeats, "mean_n": float(plan.rollouts.double().mean())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke test)")
    parser.add_argument("--out", default=None, help="folder for bench_auto.json (default: results/<machine>/)")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [time_plans(P, m, max_n, 5 if args.quick else 50) for P, m, max_n in CASES]
    print(f"{'prompts':>7} {'m':>3} {'max_n':>5} {'ms/plan (median)':>16} {'min':>6} {'mean n':>7}")
    for r in rows:
        print(f"{r['prompts']:>7} {r['m']:>3} {r['max_n']:>5} {r['ms_median']:>16.2f} {r['ms_min']:>6.2f} "
              f"{r['mean_n']:>7.1f}")
    at_goal = [r for r in rows if r["prompts"] == 512]
    worst = max(r["ms_median"] for r in at_goal)
    print(f"goal: under {GOAL_MS} ms per plan at 512 prompts: worst {worst:.2f} ms "
          f"({'met' if worst < GOAL_MS else 'NOT met'})")
    out = Path(args.out) if args.out else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("bench_auto_quick.json" if args.quick else "bench_auto.json")
    path.write_text(json.dumps({"machine": machine_info(), "goal_ms_at_512": GOAL_MS, "rows": rows,
                                "command": "python benchmarks/bench_auto.py" + (" --quick" if args.quick else "")},
                               indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
