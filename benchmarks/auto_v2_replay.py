"""A REPLAY, not a training run: the auto planner's second gain and cost models (aged ledger outcomes, n > m only on
a confident gain, the sampling slope from steps close in time) against the first, on the filed 2-core Intel Xeon auto
study's logged pass rates and step timings.

Nothing here trains. From each auto run's metrics.jsonl (rows of 5 steps each; per-prompt outcomes are not logged):

1. **Aging, checked at the batch level.** A prompt comes back one epoch later (512 prompts / prompts per step
   updates). Its predicted pass rate from its stale outcomes is the batch's pass rate one epoch ago; the aged
   posterior's is that, faded by 0.5 ** (epoch / age_half_life), with the prior at the latest step's batch pass rate.
   Realized: the batch's pass rate now (``rewards/correctness_reward/mean``, seed means).
2. **Credited extra variance.** Prompts drawn from a Beta at the batch's pass rate one epoch ago (concentration:
   the calibration's fit at that accuracy, benchmarks/results/cpu-2core-amd-epyc/auto_calibration), moved by the
   batch's progress since (the same logit shift for each), 16 outcomes each at the old rate: the extra selected
   variance g(max_n) - g(m) each posterior credits, over what the prompts' true current rates give.
3. **Mean n per prompt** the planner itself (``AutoN``, fixed costs) chooses for those prompts, first model
   (``age_half_life=None, efficiency_low=None``) and second (the defaults), at the study's `pods cost` costs, the
   H200's (c0 202 ms, c_s 0.056 ms, c_t 0.526 ms) and the study's c0 and c_t with c_s = 0.03 c_t.
4. **The cost fit within a run.** Each auto run's logged rows fed in order to the first fit (Theil-Sen across the
   64-row window) and the second (``RolloutCostModel``): the fitted slope's 10th-90th percentiles over the run.

    PYTHONPATH=src python benchmarks/auto_v2_replay.py   # -> results/cpu-2core-intel-xeon/auto_v2_replay/
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pods_rl.auto_projection import costs_from_rows
from pods_rl.budget.ledger import LedgerSettings, PromptLedger
from pods_rl.budget.planners.auto import (
    SLOW_STEP,
    AutoN,
    AutoSettings,
    RolloutCostModel,
    signal_table,
    success_posterior,
    theil_sen,
)
from pods_rl.machine import machine_info

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "benchmarks" / "results" / "cpu-2core-intel-xeon" / "auto"
OUT = ROOT / "benchmarks" / "results" / "cpu-2core-intel-xeon" / "auto_v2_replay"
CALIBRATION = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc" / "auto_calibration" / "calibration.json"
MODELS = {"shipped": {"m": 8, "max_n": 32, "prompts_per_step": 16, "calibration": "evidence/shipped"},
          "strong": {"m": 16, "max_n": 64, "prompts_per_step": 8, "calibration": "evidence/strong"}}
DATASET = 512  # --train_limit of both studies
HISTORY = 16  # the ledger's window
PROMPTS = 1024  # prompts drawn per level
H200 = {"fixed_ms": 202.0, "sample_ms": 0.056, "train_ms": 0.526}


def _logit(p):
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def auto_rows(root: Path) -> dict[str, list[dict]]:
    """{auto run name: its logged training rows}."""
    runs = {}
    for path in sorted(root.glob("study/runs/*-auto-s*/metrics.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        runs[path.parent.name] = [r for r in rows if "loss" in r and "pods/rollouts_sampled" in r]
    return runs


def batch_pass_rate(runs: dict[str, list[dict]]) -> tuple[np.ndarray, np.ndarray]:
    """(steps (T,), seed-mean batch pass rate (T,)) from the rows' correctness reward."""
    steps = sorted({r["step"] for rows in runs.values() for r in rows})
    rates = [np.mean([r["rewards/correctness_reward/mean"] for rows in runs.values() for r in rows
                      if r["step"] == s]) for s in steps]
    return np.array(steps, dtype=float), np.array(rates)


def concentration(model: dict) -> callable:
    """Accuracy -> the calibration's Beta concentration at that accuracy (interpolated, clipped to its range)."""
    rows = [r for r in json.loads(CALIBRATION.read_text())["rows"]
            if r["study"] == model["calibration"] and r["rule"] == "mv"]
    levels, conc = np.array([r["level"] for r in rows]), np.array([r["beta_concentration"] for r in rows])
    order = np.argsort(levels)
    return lambda p: float(np.interp(p, levels[order], conc[order]))


def aging_check(steps, rates, epoch: int, half_life: float, prior: float = 2.0) -> dict:
    """Predicted (stale, aged) against realized batch pass rate of prompts coming back one epoch later."""
    weight = 0.5 ** (epoch / half_life)
    stale, aged, realized = [], [], []
    for i, t in enumerate(steps):
        if t < epoch + steps[0] or i == 0:
            continue
        then = float(np.interp(t - epoch, steps, rates))
        latest = rates[i - 1]  # the ledger's "now": the latest recorded step's groups (other prompts)
        stale.append(then)
        aged.append((weight * HISTORY * then + prior * latest) / (weight * HISTORY + prior))
        realized.append(rates[i])
    stale, aged, realized = map(np.array, (stale, aged, realized))
    return {"points": len(realized), "epoch_updates": epoch, "half_life": half_life, "outcome_weight": weight,
            "stale": {"bias": float((stale - realized).mean()), "mae": float(np.abs(stale - realized).mean())},
            "aged": {"bias": float((aged - realized).mean()), "mae": float(np.abs(aged - realized).mean())}}


def level_ledger(rng, p_then: np.ndarray, latest_rate: float, epoch: int) -> PromptLedger:
    """Prompts 0..P-1 with 16 outcomes at step 0 (rates ``p_then``); 64 other prompts' groups at step ``epoch``
    at ``latest_rate`` (the batch the ledger calls now)."""
    ledger = PromptLedger(LedgerSettings(success_threshold=0.5))
    ledger.record(torch.arange(len(p_then)), torch.from_numpy(
        (rng.random((len(p_then), HISTORY)) < p_then[:, None]).astype(np.float64)), step=0)
    latest = (np.arange(64 * HISTORY) < round(latest_rate * 64 * HISTORY)).astype(np.float64).reshape(64, HISTORY)
    ledger.record(torch.arange(10**6, 10**6 + 64), torch.from_numpy(latest), step=epoch)
    return ledger


def credited(ledger, ids, p_now, m, max_n, half_life) -> float:
    """Sum over prompts of the extra selected variance g(max_n) - g(m) the posterior credits (aged with
    ``half_life``, None: stale), over what the true current rates give."""
    from pods_rl.budget.planners.auto import ledger_now

    stats = ledger.columns(ids, "window", "last_step")
    if half_life is None:
        a, b = success_posterior(stats["window"], 2.0)
    else:
        now, rate = ledger_now(ledger)
        a, b = success_posterior(stats["window"], 2.0, age=now - stats["last_step"], half_life=half_life,
                                 pass_rate_now=rate)
    believed = signal_table(a, b, m, max_n, 1.0).numpy()
    truth = signal_table(p_now * 1e5, (1 - p_now) * 1e5, m, max_n, 1.0).numpy()
    return float((believed[:, -1] - believed[:, 0]).sum() / (truth[:, -1] - truth[:, 0]).sum())


def mean_n(ledger, count: int, model: dict, costs: dict, **knobs) -> float:
    """The planner's mean rollouts per prompt over the prompts, planned ``prompts_per_step`` at a time."""
    planner = AutoN(AutoSettings(min_n=model["m"], max_n=model["max_n"], **costs, **knobs))
    batch = model["prompts_per_step"]
    chosen = [planner.plan(torch.arange(s, s + batch), ledger, n=model["max_n"], m=model["m"]).rollouts
              for s in range(0, count - batch + 1, batch)]
    return float(torch.cat(chosen).double().mean())


def old_slope(window: list[tuple[float, float]], spread: float = 1.25) -> float | None:
    """The first cost model's slope (Theil-Sen across the window, slow steps set aside, then refit)."""
    x, y = (np.array(c) for c in zip(*window))
    low, high = x.min(), x.max()
    middle = (low + high) / 2
    if len(x) < 4 or high < spread * low or (x < middle).sum() < 2 or (x >= middle).sum() < 2:
        return None
    slope, intercept = theil_sen(x, y)
    usual = y <= SLOW_STEP * np.maximum(intercept + slope * x, 1e-12)
    if usual.sum() >= 4 and len(np.unique(x[usual])) >= 2:
        slope, _ = theil_sen(x[usual], y[usual])
    return max(slope, 0.0)


def cost_fit_replay(runs: dict[str, list[dict]]) -> dict:
    """Per run, the fitted slope (ms per sampled rollout) after each logged row: first and second models."""
    out = {}
    for name, rows in runs.items():
        new, window, old_slopes, new_slopes = RolloutCostModel(), [], [], []
        for r in rows:
            sampled, seconds = r["pods/rollouts_sampled"], r["time/generation"] + r.get("time/scoring", 0.0)
            new.observe(sampled=round(sampled), sample_seconds=seconds, trained=1, update_seconds=r["time/update"])
            window = (window + [(sampled, seconds)])[-64:]
            old = old_slope(window)
            estimate = new.estimate()
            if old is not None:
                old_slopes.append(1e3 * old)
            if estimate is not None and estimate.slope_known:
                new_slopes.append(1e3 * estimate.per_sampled)

        def spread(values):
            return {"p10": float(np.percentile(values, 10)), "median": float(np.median(values)),
                    "p90": float(np.percentile(values, 90)), "rows": len(values)} if values else None

        out[name] = {"first": spread(old_slopes), "second": spread(new_slopes)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--every", type=int, default=3, help="replay every k-th logged step (default 3)")
    parser.add_argument("--half_life", type=float, default=AutoSettings().age_half_life)
    args = parser.parse_args(argv)
    started = time.time()
    result = {"what": "A REPLAY (no training ran): the auto planner's first and second gain/cost models on the filed "
                      "2-core Intel Xeon auto study's logged pass rates and step timings",
              "label": "replay", "machine": machine_info(), "command": " ".join(["python", *sys.argv]),
              "study": "benchmarks/results/cpu-2core-intel-xeon/auto", "models": {}}
    with tempfile.TemporaryDirectory(prefix="pods-auto-v2-") as scratch:
        for name, model in MODELS.items():
            root = Path(scratch) / name
            with tarfile.open(STUDY / name / "runs.tar.xz") as archive:
                archive.extractall(root, filter="data")
            runs = auto_rows(root)
            steps, rates = batch_pass_rate(runs)
            epoch = DATASET // model["prompts_per_step"]
            fitted = costs_from_rows(json.loads((STUDY / name / "cost.json").read_text())["rows"])
            study_costs = {"fixed_ms": 1e3 * fitted["fixed_s"], "sample_ms": 1e3 * fitted["sample_s"],
                           "train_ms": 1e3 * fitted["train_s"]}
            cost_sets = {"study (pods cost)": study_costs, "H200": H200,
                         "c_s/c_t = 0.03": {**study_costs, "sample_ms": 0.03 * study_costs["train_ms"]}}
            kappa = concentration(model)
            rng = np.random.default_rng(0)
            levels = []
            for i in range(1, len(steps), args.every):
                t = steps[i]
                if t < epoch + steps[0]:
                    continue
                then, now, latest = float(np.interp(t - epoch, steps, rates)), rates[i], rates[i - 1]
                c = kappa(then)
                p_then = rng.beta(then * c, (1 - then) * c, PROMPTS)
                p_now = 1 / (1 + np.exp(-(_logit(p_then) + _logit(now) - _logit(then))))
                ledger = level_ledger(rng, p_then, latest, epoch)
                ids = torch.arange(PROMPTS)
                row = {"step": t, "pass_rate_then": then, "pass_rate_now": float(now),
                       "credited_over_true": {
                           "first": credited(ledger, ids, p_now, model["m"], model["max_n"], None),
                           "second": credited(ledger, ids, p_now, model["m"], model["max_n"], args.half_life)},
                       "n_mean": {}}
                for cost_name, costs in cost_sets.items():
                    row["n_mean"][cost_name] = {
                        "first": mean_n(ledger, PROMPTS, model, costs, age_half_life=None, efficiency_low=None),
                        "second": mean_n(ledger, PROMPTS, model, costs, age_half_life=args.half_life)}
                levels.append(row)
            summary = {"credited_over_true": {v: float(np.mean([r["credited_over_true"][v] for r in levels]))
                                              for v in ("first", "second")},
                       "n_mean": {c: {v: float(np.mean([r["n_mean"][c][v] for r in levels]))
                                      for v in ("first", "second")} for c in cost_sets}}
            result["models"][name] = {**model, "epoch_updates": epoch, "auto_runs": sorted(runs),
                                      "costs_ms": cost_sets, "aging_check": aging_check(steps, rates, epoch,
                                                                                        args.half_life),
                                      "levels": levels, "summary": summary,
                                      "cost_fit_within_runs": cost_fit_replay(runs)}
    result["seconds"] = time.time() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


def table(result: dict) -> str:
    """The replay's summary as text."""
    lines = ["REPLAY (no training ran)"]
    for name, r in result["models"].items():
        a = r["aging_check"]
        lines.append(f"{name}: m {r['m']}, max_n {r['max_n']}, epoch {r['epoch_updates']} updates; returning "
                     f"prompts' pass rate, predicted - realized: stale bias {a['stale']['bias']:+.3f} (MAE "
                     f"{a['stale']['mae']:.3f}), aged {a['aged']['bias']:+.3f} ({a['aged']['mae']:.3f})")
        s = r["summary"]
        lines.append(f"  extra variance credited / true: first {s['credited_over_true']['first']:.2f}, second "
                     f"{s['credited_over_true']['second']:.2f}")
        for cost, v in s["n_mean"].items():
            lines.append(f"  mean n per prompt at {cost}: first {v['first']:.1f}, second {v['second']:.1f} "
                         f"(of {r['m']}..{r['max_n']})")
        for run, fit in r["cost_fit_within_runs"].items():
            parts = [f"{k} p10-p90 {v['p10']:.2f}-{v['p90']:.2f} ms (median {v['median']:.2f})"
                     for k, v in fit.items() if v]
            lines.append(f"  {run}: fitted slope " + "; ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
