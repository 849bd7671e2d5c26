"""A PROJECTION, not a measurement: what ``rollout_planner="auto"`` would choose on the H200's measured step costs
(and on the 2-core CPU's, for contrast), and its predicted learning signal per second against GRPO (n = m) and
against fixed PODS max_n -> m.

Nothing here trains. The planner's own functions (``pods_rl.budget.planners.auto.signal_table`` and
``allocate_for_signal``, the same arithmetic ``AutoN.plan`` does with ``AutoSettings(sample_ms, train_ms,
fixed_ms)``) are fed:

- **costs**, per step: c0 (seconds of sampling that do not grow with the rollouts sampled), c_s (the marginal
  seconds of one more sampled rollout: generation + scoring fitted as a + b * N between steps that sampled
  different totals N) and c_t (update seconds per trained rollout), from
  - H200, the shipped tiny model: the 40-s training runs GRPO n = 16 (N = 128) and PODS 64 -> 16 (N = 512)
    (`benchmarks/results/gpu-nvidia-h200/runs/`: the medians of their logged rows after the first), and, as a
    cross-check, ``pods cost``'s per-phase minima at n = 16, 32, 64 (`cost_shipped.json`; its means were decided
    by slow steps, README there);
  - H200, a ~0.4B random-init Qwen2 with 128-token completions (`cost-0.4b/`: n = 16 and 64, two schedules);
  - the 2-core CPU: the evidence studies' own runs (`evidence/shipped`: GRPO n = 8 and PODS 32 -> 8, 32 seeds each;
    `evidence/strong`: GRPO n = 16 and PODS 64 -> 16), medians of the logged rows;
- **pass rates**: a batch of prompts whose success rates follow the Beta that ``benchmarks/auto_calibration.py``
  fitted to GRPO's held-out accuracy and pass@k at the studies' accuracy levels (20%, 50%, 90% of GRPO's gain;
  evidence/shipped for the shipped model, evidence/strong for the strong one), 4096 prompts drawn from it
  (seed 0), the step's costs scaled to that many prompts (the ratio per step is unchanged). What the planner knows
  of each prompt: ``ledger``: a Beta posterior from one group of 16 outcomes (``success_posterior``'s rule: a
  prior of 2 pseudo-outcomes at the batch's pass rate); ``known``: the prompt's p itself;
- **efficiency** (kappa): the calibrated value (`auto_calibration/calibration.json`), the value fitted to the
  pass rates' own model alone (the calibration's comparisons disagree between the models), 1.0 (the planner's
  uncalibrated default), and the calibration's exploratory two-parameter fit (one kappa for prompts whose
  posterior mean is below 1/2, one above: not what the planner implements today).

    PYTHONPATH=src python benchmarks/auto_projection.py   # -> results/gpu-nvidia-h200/auto_projection/
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pods_rl.budget.planners.auto import allocate_for_signal, signal_table, theil_sen
from pods_rl.machine import machine_info

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "gpu-nvidia-h200"
CPU = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc"
OUT = H200 / "auto_projection"
CALIBRATION = CPU / "auto_calibration" / "calibration.json"
PROMPTS = 4096  # prompts drawn from the pass-rate Beta; the step's costs are scaled to them
HISTORY = 16  # outcomes a prompt's ledger posterior has seen (``ledger`` knowledge)
PRIOR_STRENGTH = 2.0  # AutoSettings' default
FRACTIONS = (0.2, 0.5, 0.9)


def _calibration_module():
    spec = importlib.util.spec_from_file_location("auto_calibration", Path(__file__).parent / "auto_calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------------------------
# Costs.

def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_phases(run_dirs) -> dict:
    """Medians over the runs' logged rows (the first, the warm-up, left out) of sampling (generation + scoring) and
    update seconds per step, and the rollouts sampled and trained per step (from the config)."""
    sample, update = [], []
    for run_dir in run_dirs:
        rows = [r for r in _rows(run_dir / "metrics.jsonl") if "time/generation" in r][1:]
        sample += [r["time/generation"] + r.get("time/scoring", 0.0) for r in rows]
        update += [r["time/update"] for r in rows]
    return {"sample_s": statistics.median(sample), "update_s": statistics.median(update), "rows": len(sample)}


def _config(run_dir: Path) -> dict:
    import yaml
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def fit_costs(points: list[tuple[float, float]], trained: list[tuple[float, float]]) -> dict:
    """points: (rollouts sampled N, sampling seconds) per measurement; trained: (rollouts trained, update seconds) ->
    {fixed: c0, per_sampled: c_s, per_trained: c_t} (Theil-Sen on the points, the planner's own fit; slope >= 0)."""
    x, y = np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float)
    slope, intercept = theil_sen(x, y)
    slope = max(slope, 0.0)
    intercept = max(float(np.median(y - slope * x)), 0.0)
    per_trained = float(np.median([s / n for n, s in trained]))
    return {"fixed": intercept, "per_sampled": slope, "per_trained": per_trained,
            "average_per_sampled_at_m": float(y[np.argmin(x)] / x[np.argmin(x)]),
            "points": [[float(a), float(b)] for a, b in zip(x, y)]}


def h200_costs(work: Path) -> dict:
    """The cost profiles: name -> {fixed, per_sampled, per_trained, m, max_n, prompts, source}."""
    profiles = {}
    # The H200 training runs (shipped tiny, HF generate, 8 prompts x 16 kept).
    grpo, pods = H200 / "runs" / "grpo-n16", H200 / "runs" / "pods-mv-n64m16"
    g, p = run_phases([grpo]), run_phases([pods])
    cg, cp = _config(grpo), _config(pods)
    prompts = cg["per_device_train_batch_size"] // cg["num_generations"]
    n_g, n_p = prompts * cg["num_generations"], prompts * cp["num_generations"]
    kept = prompts * cp["downsample_to"]
    profiles["h200-shipped-runs"] = {
        **fit_costs([(n_g, g["sample_s"]), (n_p, p["sample_s"])], [(n_g, g["update_s"]), (kept, p["update_s"])]),
        "m": 16, "max_n": 64, "prompts": prompts,
        "source": "gpu-nvidia-h200/runs/{grpo-n16,pods-mv-n64m16}: medians of the logged rows after the first "
                  f"({g['rows']} and {p['rows']} rows of 5 steps), shipped tiny model, HF generate"}
    # pods cost on the H200 (shipped tiny): per-phase minima at n = 16, 32, 64 (plain rows only).
    cost = json.loads((H200 / "cost_shipped.json").read_text())
    rows = [r for r in cost["rows"] if r["pilot_generations"] is None]
    profiles["h200-shipped-cost-minima"] = {
        **fit_costs([(r["sampled_per_step"], r["seconds_min"]["generation"] + r["seconds_min"]["scoring"])
                     for r in rows], [(r["kept_per_step"], r["seconds_min"]["update"]) for r in rows]),
        "m": 16, "max_n": 64, "prompts": rows[0]["kept_per_step"] // 16,
        "source": "gpu-nvidia-h200/cost_shipped.json: pods cost's per-phase minima over 5 steps at n = 16, 32, 64"}
    # The 0.4B model on the H200: both schedules' means and minima, all four (N, seconds) pairs per n.
    points, trained = [], []
    for name in ("cost_n64_interleaved.json", "cost_n64_sequential.json"):
        for r in json.loads((H200 / "cost-0.4b" / name).read_text())["rows"]:
            for key in ("seconds", "seconds_min"):
                points.append((r["sampled_per_step"], r[key]["generation"] + r[key]["scoring"]))
            trained.append((r["kept_per_step"], r["seconds"]["update"]))
    profiles["h200-0.4b-cost"] = {
        **fit_costs(points, trained), "m": 16, "max_n": 64, "prompts": 8,
        "source": "gpu-nvidia-h200/cost-0.4b/cost_n64_{interleaved,sequential}.json: ~0.4B random-init Qwen2, "
                  "128-token completions, n = 16 and 64, per-phase means and minima of both schedules"}
    # The 2-core CPU: the evidence studies' own runs.
    calibration = _calibration_module()
    for study, grpo_name, pods_name, m, n in (("evidence/shipped", "grpo-n8", "pods-mv-n32m8", 8, 32),
                                              ("evidence/strong", "grpo-n16", "pods-mv-n64m16", 16, 64)):
        root = calibration.unpacked(study, work)
        runs = {name: sorted(root.glob(f"study/runs/{name}-s*/")) for name in (grpo_name, pods_name)}
        runs = {name: [r for r in dirs if r.name.rpartition("-s")[2].isdigit()] for name, dirs in runs.items()}
        g, p = run_phases(runs[grpo_name]), run_phases(runs[pods_name])
        cg = _config(runs[grpo_name][0])
        prompts = cg["per_device_train_batch_size"] // cg["num_generations"]
        profiles[f"cpu-{study.split('/')[1]}-runs"] = {
            **fit_costs([(prompts * m, g["sample_s"]), (prompts * n, p["sample_s"])],
                        [(prompts * m, g["update_s"]), (prompts * m, p["update_s"])]),
            "m": m, "max_n": n, "prompts": prompts,
            "source": f"cpu-2core-amd-epyc/{study}: {grpo_name} and {pods_name} runs ({len(runs[grpo_name])} seeds "
                      f"each), medians of the logged rows after the first"}
    return profiles


# ---------------------------------------------------------------------------------------------------------------
# The planner on a batch.

def posteriors(p: np.ndarray, knowledge: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """(P,) true success rates -> (P,) Beta posteriors as the planner would hold them."""
    if knowledge == "known":
        return p * 1e4, (1 - p) * 1e4
    successes = rng.binomial(HISTORY, p).astype(float)
    pass_rate = min(max(successes.sum() / (HISTORY * len(p)), 1e-3), 1 - 1e-3)
    return PRIOR_STRENGTH * pass_rate + successes, PRIOR_STRENGTH * (1 - pass_rate) + HISTORY - successes


def project(costs: dict, alpha_pop: float, beta_pop: float, kappa: float, knowledge: str) -> dict:
    """The planner's choice and its predicted signal per second on one cost profile and pass-rate Beta."""
    rng = np.random.default_rng(0)
    p = rng.beta(alpha_pop, beta_pop, PROMPTS)
    a, b = posteriors(p, knowledge, rng)
    m, max_n = costs["m"], costs["max_n"]
    scale = PROMPTS / costs["prompts"]  # the step's prompts -> PROMPTS: its fixed seconds scale with it
    if isinstance(kappa, (tuple, list)):  # (below, above) p = 1/2, by each prompt's posterior mean
        gains = signal_table(a, b, m, max_n, 1.0).numpy()  # (P, K) g(n) itself
        per_prompt = np.where(a / (a + b) >= 0.5, kappa[1], kappa[0])[:, None]
        signal = gains[:, :1] + per_prompt * (gains - gains[:, :1])
    else:
        signal = signal_table(a, b, m, max_n, kappa).numpy()  # (P, K) counts m..max_n
    counts = np.arange(m, max_n + 1)
    fixed = scale * costs["fixed"] + costs["per_trained"] * m * PROMPTS  # AutoN.plan's fixed seconds
    chosen, ratio = allocate_for_signal(signal, counts, sample_seconds=costs["per_sampled"], fixed_seconds=fixed)
    chosen = chosen.numpy()

    def per_second(column):
        return float(signal[:, column].sum()) / (fixed + costs["per_sampled"] * counts[column] * PROMPTS)

    grpo, full = per_second(0), per_second(len(counts) - 1)
    step = costs["fixed"] + costs["per_sampled"] * costs["prompts"] * m + costs["per_trained"] * m * costs["prompts"]
    auto_step = (fixed + costs["per_sampled"] * chosen.sum()) / scale
    return {"n_mean": float(chosen.mean()), "n_median": float(np.median(chosen)),
            "fraction_at_m": float((chosen == m).mean()), "fraction_at_max_n": float((chosen == max_n).mean()),
            "signal_per_second_vs_grpo": ratio / grpo, "signal_per_second_vs_fixed_max_n": ratio / full,
            "fixed_max_n_vs_grpo": full / grpo, "step_seconds_grpo": step, "step_seconds_auto": float(auto_step),
            "step_ratio_auto_vs_grpo": float(auto_step / step)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pods-auto-calibration",
                        help="scratch folder for the CPU studies' unpacked runs (auto_calibration.py's)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--calibration", type=Path, default=CALIBRATION)
    args = parser.parse_args(argv)
    started = time.time()
    calibration = json.loads(args.calibration.read_text())
    split = calibration["sensitivity"]["split_at_half"]
    kappas = {"fitted": calibration["kappa"], "uncalibrated": 1.0,
              "split at p = 1/2 (exploratory)": [split["kappa_below"], split["kappa_above"]]}
    # The pass-rate Betas: GRPO's held-out accuracy and its Beta's concentration at the study's levels.
    dists = {}
    for model, study in (("shipped", "evidence/shipped"), ("strong", "evidence/strong")):
        rows = [r for r in calibration["rows"] if r["study"] == study and r["rule"] == "mv"]
        for fraction in FRACTIONS:
            r = min(rows, key=lambda row: abs(row["fraction"] - fraction))
            dists[f"{model}@{fraction:.1f}"] = {"model": model, "fraction": r["fraction"], "accuracy": r["level"],
                                                "concentration": r["beta_concentration"],
                                                "alpha": r["level"] * r["beta_concentration"],
                                                "beta": (1 - r["level"]) * r["beta_concentration"],
                                                "source": f"{study}, GRPO, {r['fraction']:.0%} of its gain"}
    profiles = h200_costs(args.work)
    results = []
    for profile, costs in profiles.items():
        for dist_name, dist in dists.items():
            if profile.startswith("cpu-") and dist["model"] not in profile:  # the CPU's costs: its own model only
                continue
            per_model = calibration["sensitivity"][f"model_{dist['model']}"]["kappa"]
            for kappa_name, kappa in {**kappas, "this model's": per_model}.items():
                for knowledge in ("ledger", "known"):
                    results.append({"costs": profile, "pass_rates": dist_name, "kappa": kappa_name,
                                    "efficiency": kappa, "knowledge": knowledge,
                                    **project(costs, dist["alpha"], dist["beta"], kappa, knowledge)})
    out = {"what": "A PROJECTION (no training ran): the auto planner's choice of n and its predicted learning signal "
                   "per second on measured step costs, against GRPO (n = m) and fixed PODS max_n -> m",
           "machine": machine_info(), "command": " ".join(["python", *sys.argv]),
           "label": "projection", "kappas": kappas, "cost_profiles": profiles, "pass_rate_distributions": dists,
           "prompts_drawn": PROMPTS, "history_outcomes": HISTORY, "results": results,
           "caveats": ["signal is the planner's model (expected selected variance, scaled by the calibrated "
                       "efficiency), not measured learning; the CPU calibration's comparisons disagree with each "
                       "other (auto_calibration/README.md)",
                       "H200 costs are one seed, a few minutes, HF generate; selection's launch-bound ~3 ms per "
                       "step is not in the planner's cost model",
                       "pass-rate distributions are the tiny models' on the CPU studies' task, not the H200 runs'"],
           "seconds": time.time() - started}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "projection.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "table.md").write_text(table(out))
    print(table(out))
    return 0


def table(out: dict) -> str:
    lines = ["PROJECTION (no training ran). Costs (ms): c0 fixed per step, c_s per sampled rollout (marginal), "
             "c_t per trained rollout", ""]
    for name, c in out["cost_profiles"].items():
        lines.append(f"  {name}: c0 {1e3 * c['fixed']:.1f}, c_s {1e3 * c['per_sampled']:.3f} (average at m "
                     f"{1e3 * c['average_per_sampled_at_m']:.3f}), c_t {1e3 * c['per_trained']:.3f}; m {c['m']}, "
                     f"max_n {c['max_n']}, {c['prompts']} prompts/step")
    lines += ["", "| costs | pass rates | kappa | knows | n mean | at m | at max_n | step vs GRPO | signal/s vs GRPO "
              "| vs fixed max_n->m | fixed vs GRPO |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
              "| --- |"]
    for r in out["results"]:
        kappa = r["efficiency"]
        kappa = f"{kappa[0]:.2f}/{kappa[1]:.2f}" if isinstance(kappa, list) else f"{kappa:.2f}"
        lines.append(f"| {r['costs']} | {r['pass_rates']} | {kappa} | {r['knowledge']} | "
                     f"{r['n_mean']:.1f} | {r['fraction_at_m']:.2f} | {r['fraction_at_max_n']:.2f} | "
                     f"{r['step_ratio_auto_vs_grpo']:.3f} | {r['signal_per_second_vs_grpo']:.3f} | "
                     f"{r['signal_per_second_vs_fixed_max_n']:.3f} | {r['fixed_max_n_vs_grpo']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
