"""Where auto's top-up rule would fire: from an auto study's logged rows, the share by which every prompt at max_n
would have lengthened each step, at the costs the planner used.

auto gives every prompt max_n where that lengthens its predicted step by at most ``free_share`` (3%). Per logged
row (a 5-step mean): with P prompts, m kept, a mean n chosen and the costs it planned on (``pods/auto_fixed_ms``,
``pods/auto_sample_ms``, ``pods/auto_train_ms``),

    share = c_s * P * (max_n - n) / (c0 + c_t * P * m + c_s * P * n)

A row at or under ``free_share`` is one where the rule would have fired; rows before the cost model knew its slope
(``pods/auto_slope_known`` 0) never fire. Reads run folders (unpack a filed ``runs.tar.xz`` first:
``make unpack-runs STUDY=<folder>``); prints one line per study and writes JSON with ``--out``.

    python benchmarks/auto_top_up_share.py <study> [<study> ...] --out share.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install

from pods_rl.budget.planners.auto import AutoSettings  # noqa: E402
from pods_rl.runlog import read_metrics  # noqa: E402


def row_shares(rows: list[dict], *, prompts: int, m: int, max_n: int) -> np.ndarray:
    """Logged rows -> (R,) the top-up share of each row that planned with a known slope."""
    shares = []
    for row in rows:
        if "pods/auto_n_mean" not in row or "pods/auto_sample_ms" not in row or not row.get("pods/auto_slope_known"):
            continue
        n, c_s = row["pods/auto_n_mean"], row["pods/auto_sample_ms"]
        step = row["pods/auto_fixed_ms"] + row["pods/auto_train_ms"] * prompts * m + c_s * prompts * n
        shares.append(c_s * prompts * (max_n - n) / step)
    return np.asarray(shares, dtype=np.float64)


def study_shares(study: Path) -> dict:
    """Every auto run of ``study`` (``study/runs/*-auto-s*``) -> the shares' percentiles and the share that fire."""
    free_share, label = AutoSettings().free_share, "/".join(study.resolve().parts[-2:])  # e.g. strong/h200
    shares = []
    for run in sorted((study / "study" / "runs").glob("*-auto-s*")):
        if not run.is_dir():
            continue
        config = yaml.safe_load((run / "config.yaml").read_text())
        m, max_n = int(config["downsample_to"]), int(config["num_generations"])
        prompts = int(config["per_device_train_batch_size"]) // m
        shares.append(row_shares(read_metrics(run), prompts=prompts, m=m, max_n=max_n))
    every = np.concatenate(shares) if shares else np.zeros(0)
    if len(every) == 0:
        return {"study": label, "runs": 0, "rows": 0}
    return {"study": label, "runs": len(shares), "rows": len(every), "free_share": free_share,
            "percentiles": {str(q): float(np.percentile(every, q)) for q in (0, 10, 50, 90, 100)},
            "fires": float((every <= free_share).mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = [study_shares(study) for study in args.studies]
    for r in results:
        if not r["rows"]:
            print(f"{r['study']}: no auto rows with a known slope")
            continue
        p = r["percentiles"]
        print(f"{r['study']}: {r['runs']} runs, {r['rows']} rows; top-up share min {p['0']:.4f}, median {p['50']:.4f}, "
              f"max {p['100']:.4f}; at or under {r['free_share']:.0%}: {r['fires']:.1%} of rows")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
