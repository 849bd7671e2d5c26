"""Step-cost ratios of a GPU results folder, again, with `pods cost`'s estimator (pods_rl.step_cost).

    python benchmarks/gpu/reestimate.py benchmarks/results/gpu-nvidia-h200     # writes reestimate.json there

What it reads: the 40-s `pods train` runs of the preset's call 1 (``runs/<name>/metrics.jsonl``: one row per 5
optimizer steps, each row's ``time/step`` the mean of those 5) and the `pods cost` JSONs filed before cost kept
every step (``cost_shipped.json``: only each setting's mean, min and max survive). For the runs it gives the
estimator's ratio (median of the logged rows after the warm-up, rows over 2x the median set aside) beside the
ratio of means the preset's answer quoted; for the old cost JSONs the ratio of minima and of means (their medians
were not kept).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from pods_rl import step_cost  # noqa: E402

REFERENCE = "grpo-n16"
RUNS = ("grpo-n16", "pods-mv-n64m16", "pods-mv-n64m16-pilot16")


def run_rows(folder: Path, name: str) -> list[float]:
    """``time/step`` of each logged row of a run, in order (seconds per step, each the mean of its rows' steps)."""
    rows = [json.loads(line) for line in (folder / "runs" / name / "metrics.jsonl").read_text().splitlines() if line]
    return [float(r["time/step"]) for r in sorted(rows, key=lambda r: r["step"]) if "time/step" in r]


def runs_section(folder: Path) -> dict:
    """Per run: the rows' robust summary (warm-up rows dropped) and its ratio to GRPO's; the mean's ratio too."""
    out = {}
    for name in RUNS:
        seconds = run_rows(folder, name)
        start = step_cost.steady_start(seconds, min_warmup=1) or 1
        out[name] = {"rows": len(seconds), "warmup_rows": start, "summary": step_cost.summary(seconds[start:]),
                     "seconds_per_step_logged": seconds}
    reference = out[REFERENCE]["summary"]
    for entry in out.values():
        entry["ratio"] = step_cost.ratio(entry["summary"], reference)
        entry["ratio_of_means"] = entry["summary"]["mean"] / reference["mean"]
    return out


def cost_section(path: Path) -> dict:
    """An old cost JSON's ratios from its per-setting minima and means (all it kept)."""
    rows = json.loads(path.read_text())["rows"]
    grpo = next(r for r in rows if r["n"] == r["m"] and not r.get("pilot_generations"))
    name = lambda r: f"{r['n']} -> {r['m']}" + (f" k{r['pilot_generations']}" if r.get("pilot_generations") else "")  # noqa: E731
    return {name(r): {"ratio_of_minima": r["seconds_min"]["step"] / grpo["seconds_min"]["step"],
                      "ratio_of_means": r["seconds"]["step"] / grpo["seconds"]["step"],
                      "steps": r["steps"]} for r in rows}


def main(argv: list[str] | None = None) -> int:
    """Write ``reestimate.json`` into the results folder given; print its ratios."""
    folder = Path((argv or sys.argv[1:] or ["benchmarks/results/gpu-nvidia-h200"])[0])
    result = {"estimator": "pods_rl.step_cost: median of the measured rows (rows over "
                           f"{step_cost.SLOW_STEP:g}x the median set aside), warm-up until a row is within "
                           f"{100 * step_cost.STEADY_TOLERANCE:.0f}% of the next rows' median",
              "runs": runs_section(folder)}
    for path in sorted(folder.glob("cost*.json")):
        result[path.stem] = cost_section(path)
    (folder / "reestimate.json").write_text(json.dumps(result, indent=1))
    for name, entry in result["runs"].items():
        r = entry["ratio"]
        print(f"{name:>24}: median {entry['summary']['median']:.4f} s/step over {entry['summary']['steps']} rows, "
              f"ratio {r['value']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] (of means {entry['ratio_of_means']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
