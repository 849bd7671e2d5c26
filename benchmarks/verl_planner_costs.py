"""The verl planners' step costs, from the verl lane's runs: a `pods cost`-style table (CPU, labelled).

Runs the lane's few-step planner runs (tests/verl/test_planners.py: verl's own trainer loop up to the buffer's
sample(), PODS's agent loop manager and worker, Ray and TransferQueue on CPU; the LLM is a table) with
PODS_VERL_COSTS set, so that each step writes one JSON line, and summarizes them per planner: medians and the
interquartile range over the steps after each run's first (the warm-up: an empty ledger plans as no planner).
What the seconds are: planning, dispatch, TransferQueue writes, the refills and selection, not a model's
generation or update; they say what the planners add to verl's step, not how long a real step takes. Run it in the
verl lane's environment (.ci/lane-verl.sh builds it):

    .venv-verl/bin/python benchmarks/verl_planner_costs.py            # writes results/<machine>/verl_planners/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from _machine import machine_info, results_dir

ROOT = Path(__file__).resolve().parents[1]
# The lane's runs that train a few steps (the refusals and the verl-args checks build nothing to time).
RUNS = ("without_a_planner or greso_skipped or knapsack_gives or auto_gives or reinforce_ada_samples "
        "or pilot_commit_commits")
PACKAGES = ("pods-rl", "verl", "transferqueue", "ray", "tensordict", "torch")


def run_lane(path: Path, python: str) -> None:
    """The lane's few-step runs, each step logged to ``path`` (JSON lines)."""
    env = {**os.environ, "PODS_VERL_COSTS": str(path)}
    command = [python, "-m", "pytest", "-q", "--lane", "verl", "tests/verl/test_planners.py", "-k", RUNS,
               "--timeout", "300", "-p", "no:cacheprovider", "-p", "no:asyncio"]
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def summarize(records: list[dict]) -> list[dict]:
    """One row per planner combination: steps timed, step seconds (median, IQR), its parts, the planners' own
    milliseconds, rollouts generated and prompts offered per step (medians)."""
    rows = []
    for label in sorted({r["planners"] for r in records}, key=lambda x: (x != "none", x)):
        steps = [r for r in records if r["planners"] == label and r["step"] > 1]
        if not steps:
            continue
        q1, median, q3 = _quartiles([r["dispatch"] + r["sample"] for r in steps])
        rows.append({"planners": label, "steps": len(steps), "step_s_median": median, "step_s_q1": q1,
                     "step_s_q3": q3, "dispatch_s_median": statistics.median(r["dispatch"] for r in steps),
                     "sample_s_median": statistics.median(r["sample"] for r in steps),
                     "plan_ms_median": 1e3 * statistics.median(r["plan_seconds"] for r in steps),
                     "rollouts_median": statistics.median(r["rollouts"] for r in steps),
                     "offered_median": statistics.median(r["offered"] for r in steps),
                     "tests": sorted({r["test"].split("::")[-1] for r in steps})})
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| planners | steps | step s, median [IQR] | dispatch s | sample() s | planners ms | rollouts/step | "
             "prompts offered/step |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['planners']} | {r['steps']} | {r['step_s_median']:.3f} [{r['step_s_q1']:.3f}, "
                     f"{r['step_s_q3']:.3f}] | {r['dispatch_s_median']:.3f} | {r['sample_s_median']:.3f} | "
                     f"{r['plan_ms_median']:.2f} | {r['rollouts_median']:g} | {r['offered_median']:g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder (default results/<machine>/verl_planners)")
    parser.add_argument("--records", type=Path, default=None, help="summarize these JSON lines instead of running")
    args = parser.parse_args(argv)
    out = args.out or results_dir() / "verl_planners"
    out.mkdir(parents=True, exist_ok=True)
    if args.records is None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "steps.jsonl"
            run_lane(path, sys.executable)
            records = [json.loads(line) for line in path.read_text().splitlines()]
    else:
        records = [json.loads(line) for line in args.records.read_text().splitlines()]
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    rows = summarize(records)
    result = {"what": __doc__.split("\n\n")[0], "label": "CPU; LLM a table (no model): orchestration and planner "
              "costs only", "machine": machine_info(), "versions": versions,
              "command": ".venv-verl/bin/python benchmarks/verl_planner_costs.py", "rows": rows, "records": records}
    (out / "verl_planners.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    print(f"wrote {out / 'verl_planners.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
