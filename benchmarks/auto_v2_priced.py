"""auto's second version at another machine's costs, read from `pods study --price_at` folders (issue #74, item 5).

    python benchmarks/auto_v2_priced.py STUDY_DIR --price_at 202,0.056,0.526 [--out priced.json]

For every method against GRPO, on the priced axis (each step c0 + c_s x sampled + c_t x trained, learning as
measured): the whole-rise speed ratio (20-90% of GRPO's gain, seed-paired bootstrap 95% CI), the ratio at each level
from 40% to 90% alone (with its CI), and auto's regret: the best fixed method's priced speed over auto's (> 1: a
fixed n was faster), with a seed-paired bootstrap 95% CI. auto's mean n after update 50 and its share of logged steps
at m (``benchmarks/auto_choices.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from auto_choices import run_choices  # noqa: E402

from pods_rl import stats  # noqa: E402
from pods_rl.bootstrap import percentile_interval, resample  # noqa: E402
from pods_rl.commands.study_priced import parse_priced_costs, priced_times  # noqa: E402
from pods_rl.commands.study_report import load_groups  # noqa: E402
from pods_rl.curves import level_time_ratio, paired_level_time_ratio  # noqa: E402

LEVELS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
WARMUP = 50


def priced_groups(runs_dir: Path, spec: str) -> dict[str, list[stats.RunData]]:
    """The study's runs by method, each with its times replaced by its priced seconds."""
    costs = parse_priced_costs(spec)
    return {name: [dataclasses.replace(run, times=priced_times(run, costs)) for run in group]
            for name, group in load_groups(runs_dir).items()}


def by_seed(group: list[stats.RunData]) -> dict:
    """{seed: (x, accuracy)} on the priced time axis."""
    return {run.seed: stats.run_curve(run, "time")[:2] for run in group if run.seed is not None}


def auto_mean_n(group: list[stats.RunData], m: int) -> dict:
    """Mean over runs of auto's logged mean n after update ``WARMUP``, and of the share of those rows at m."""
    means, at_m = [], []
    for run in group:
        rows = [json.loads(line) for line in (Path(run.run_dir) / "metrics.jsonl").read_text().splitlines()
                if line.strip()]
        settled = [r["pods/auto_n_mean"] for r in rows if "pods/auto_n_mean" in r and r.get("step", 0) > WARMUP]
        means.append(sum(settled) / len(settled))
        at_m.append(sum(abs(x - m) < 1e-9 for x in settled) / len(settled))
    return {"n_mean_after_warmup": sum(means) / len(means), "share_at_m": sum(at_m) / len(at_m),
            "per_run": [run_choices(Path(run.run_dir) / "metrics.jsonl", m) for run in group]}


def paired_regret(base: dict, best: dict, auto: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """The best fixed method's whole-rise speed over auto's (both against GRPO, > 1: the fixed n was faster), with a
    95% CI from one bootstrap of the seeds all three ran (each replicate draws the same seeds for all three)."""
    seeds = sorted(set(base) & set(best) & set(auto))

    def regret(drawn: list) -> float:
        curves = [base[s] for s in drawn]
        fixed = level_time_ratio(curves, [best[s] for s in drawn], count_seeds=False)["ratio"]
        return fixed / level_time_ratio(curves, [auto[s] for s in drawn], count_seeds=False)["ratio"]

    rng = np.random.default_rng(seed)
    ci = percentile_interval([regret(resample(seeds, rng)) for _ in range(n_boot)]) if len(seeds) >= 2 else None
    return {"ratio": regret(seeds), "ci95": list(ci) if ci else None, "seeds": seeds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", help="a pods study --price_at output folder (study/runs/<method>-s<seed>)")
    parser.add_argument("--price_at", required=True, help="c0_ms,sample_ms,train_ms the study was priced at")
    parser.add_argument("--baseline", default=None, help="default: the grpo-* method")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    groups = priced_groups(Path(args.study) / "study" / "runs", args.price_at)
    baseline = args.baseline or next(name for name in groups if name.startswith("grpo"))
    base = by_seed(groups[baseline])
    result = {"price_at": args.price_at, "baseline": baseline, "seeds": sorted(base), "methods": {}}
    for name, group in sorted(groups.items()):
        if name == baseline:
            continue
        curves = by_seed(group)
        whole = paired_level_time_ratio(base, curves)
        levels = {f"{f:.1f}": paired_level_time_ratio(base, curves, fractions=(f,)) for f in LEVELS}
        entry = {"seeds": sorted(set(curves) & set(base)), "whole_rise": {k: whole[k] for k in ("ratio", "ci95")},
                 "levels": {k: {"ratio": v["ratio"], "ci95": v["ci95"], "censored": v["censored"]}
                            for k, v in levels.items()}}
        if name.endswith("-auto"):
            entry["auto"] = auto_mean_n(group, int(re.search(r"m(\d+)-auto$", name).group(1)))
        result["methods"][name] = entry
    autos = [n for n in result["methods"] if n.endswith("-auto")]
    fixed = {baseline: 1.0, **{n: e["whole_rise"]["ratio"] for n, e in result["methods"].items() if n not in autos}}
    best = max(fixed, key=fixed.get)
    for name in autos:
        entry = result["methods"][name]
        entry["regret_vs_best_fixed"] = {"best_fixed": best, "ratio": fixed[best] / entry["whole_rise"]["ratio"]}
        if best != baseline:  # the point estimate above, the same seeds' joint bootstrap for its interval
            regret = paired_regret(base, by_seed(groups[best]), by_seed(groups[name]))
            entry["regret_vs_best_fixed"].update(ci95=regret["ci95"], ci_seeds=regret["seeds"])
    for name, entry in result["methods"].items():
        w = entry["whole_rise"]
        by_level = ", ".join(f"{k}: {v['ratio']:.2f}x [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]"
                             for k, v in entry["levels"].items())
        print(f"{name}: priced speed vs {baseline} {w['ratio']:.2f}x [{w['ci95'][0]:.2f}, {w['ci95'][1]:.2f}] over "
              f"{len(entry['seeds'])} seeds; by level {by_level}")
        if "auto" in entry:
            print(f"  auto: mean n after update {WARMUP} {entry['auto']['n_mean_after_warmup']:.1f}, "
                  f"{100 * entry['auto']['share_at_m']:.0f}% of logged steps at m; regret vs the best fixed "
                  f"({best}): {entry['regret_vs_best_fixed']['ratio']:.3f}"
                  + (" [{:.3f}, {:.3f}]".format(*entry["regret_vs_best_fixed"]["ci95"])
                     if entry["regret_vs_best_fixed"].get("ci95") else ""))
    out = Path(args.out) if args.out else Path(args.study) / "priced.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
