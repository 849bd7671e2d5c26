"""What ``rollout_planner="auto"`` chose in a study's runs: how often it sampled more than m, how much, its probes and
the costs it measured (from each auto run's metrics.jsonl, the ``pods/auto_*`` rows the trainer logs).

    python benchmarks/auto_choices.py STUDY_DIR [--out auto_choices.json]

STUDY_DIR is a ``pods study`` output folder (``study/runs/<method>-s<seed>/metrics.jsonl``). Prints one line per auto
run and the mean over seeds; writes the same as JSON. Logged rows average ``logging_steps`` steps each, so "steps above
m" counts logged rows whose mean n was above m.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def run_choices(metrics_path: Path, m: int) -> dict:
    """One auto run's choices: logged rows, the share above m, the mean n, probes, the last costs (ms)."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    auto = [r for r in rows if "pods/auto_n_mean" in r]
    means = [r["pods/auto_n_mean"] for r in auto]
    sampled = [r["pods/rollouts_sampled"] for r in rows if "pods/rollouts_sampled" in r]
    last = auto[-1] if auto else {}
    return {"logged_rows": len(auto), "share_above_m": sum(x > m + 1e-9 for x in means) / max(len(means), 1),
            "n_mean": statistics.mean(means) if means else None, "n_max": max((r["pods/auto_n_max"] for r in auto),
                                                                            default=None),
            "rollouts_per_update": statistics.mean(sampled) if sampled else None,
            "probes": last.get("pods/auto_probes"), "sample_ms_last": last.get("pods/auto_sample_ms"),
            "fixed_ms_last": last.get("pods/auto_fixed_ms"), "train_ms_last": last.get("pods/auto_train_ms"),
            "signal_per_second_vs_m_mean": statistics.mean(r["pods/auto_signal_per_second_vs_m"] for r in auto
                                                           if "pods/auto_signal_per_second_vs_m" in r)
            if any("pods/auto_signal_per_second_vs_m" in r for r in auto) else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", help="a pods study output folder")
    parser.add_argument("--out", default=None, help="write the JSON here (default: STUDY/auto_choices.json)")
    args = parser.parse_args(argv)
    runs = sorted(Path(args.study).glob("study/runs/*-auto-s*/metrics.jsonl"))
    if not runs:
        print(f"auto_choices: no auto run under {args.study}/study/runs (names *-auto-s<seed>)", file=sys.stderr)
        return 2
    out = {}
    for path in runs:
        name = path.parent.name
        m = int(re.search(r"-n\d+m(\d+)-", name).group(1))
        out[name] = {"m": m, **run_choices(path, m)}
        r = out[name]
        print(f"{name}: {r['logged_rows']} logged rows, {100 * r['share_above_m']:.0f}% with mean n above m={m}, "
              f"mean n {r['n_mean']:.1f} (max {r['n_max']:.0f}), {r['rollouts_per_update']:.0f} rollouts per update, "
              f"{r['probes']:.0f} probes; last costs: sample {r['sample_ms_last']:.2f} ms + {r['fixed_ms_last']:.0f} "
              f"ms, train {r['train_ms_last']:.2f} ms")
    summary = {key: statistics.mean(r[key] for r in out.values())
               for key in ("share_above_m", "n_mean", "rollouts_per_update", "probes")}
    print("mean over runs: " + ", ".join(f"{k} {v:.3g}" for k, v in summary.items()))
    path = Path(args.out) if args.out else Path(args.study) / "auto_choices.json"
    path.write_text(json.dumps({"runs": out, "mean": summary, "command": "python benchmarks/auto_choices.py "
                                + args.study}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
