"""Calibrate the auto planner's one free parameter, ``efficiency`` (kappa), against this repository's CPU studies.

The planner (``pods_rl.budget.planners.auto``) scores n rollouts of a prompt with success probability p by
g(n) = E[V_{n,m}], the expected reward variance of the max-variance m-subset, and its learning signal by
L(n) = g(m) + kappa * (g(n) - g(m)). Over a batch whose success rates p follow a distribution D, the learning per
update of PODS n -> m against GRPO (n = m) is then predicted to be

    1 + kappa * (V - 1),     V = E_D[g(n)] / E_D[g(m)]   (the variance ratio).

This script puts that prediction beside what the studies measured, and fits kappa:

- **measured** M(level): GRPO's updates to an accuracy level / the method's (the studies' "to every accuracy level"
  statistic, per level: ``pods_rl.curves.level_time_ratio`` on the update axis, seed-mean curves, 15 levels from
  20% to 90% of GRPO's gain), for every study and plain PODS method with n > m (max_variance; random selection as
  a control, which the model predicts at 1.0 whatever kappa). Adaptive, knapsack, GRESO, DAPO and Reinforce-Ada
  runs sample differently (pilot rounds, per-prompt n, filters): left out.
- **D**, the distribution of per-prompt success rates, at each logged step of GRPO's runs: a Beta(alpha, beta)
  over prompts matched to two statistics the runs log at every step, pooled over the seeds and the logged steps
  within +-WINDOW updates: the mean correctness reward (the Beta's mean) and TRL's ``frac_reward_zero_std``, the
  fraction of GRPO's m-rollout groups whose rewards are all equal (= E_D[p^m + (1-p)^m], which sets the Beta's
  spread). E_D[g(n)] under a Beta is the Beta-binomial expectation: ``selected_variance_table``.
- **predicted** M(level): the time-to-level ratio is an integral, not a point: a method that learns r(t) times as
  fast as GRPO at each point t of GRPO's path reaches the level GRPO reaches at x after int_0^x dt / r(t) updates,
  so the prediction is x / int_0^x dt / (1 + kappa (V(t) - 1)), V(t) from GRPO's logged statistics at t.
- **kappa**: least squares of log M on the log prediction over every (study, method, level), each weighted by
  1 / (bootstrap variance of log M); its CI: the same fit on 1000 bootstrap replicates that resample each
  study's seeds (paired between GRPO and the method; V recomputed from the resampled GRPO seeds).

    PYTHONPATH=src python benchmarks/auto_calibration.py                  # all studies -> results/.../auto_calibration
    PYTHONPATH=src python benchmarks/auto_calibration.py --boot 200 --work /tmp/calib   # faster; unpack once, reuse

Re-runnable: the archives unpack into ``--work`` (a scratch folder outside the repository, kept for the next run;
a study already unpacked there is not unpacked again), the per-study extract is cached there as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pods_rl import curves, stats
from pods_rl.budget.planners.auto import binomial_pmf, expected_selected_variance, selected_variance_table
from pods_rl.machine import machine_info
from pods_rl.runlog.packed import unpack_runs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc"
OUT = RESULTS / "auto_calibration"
# (study folder under RESULTS, model): the studies with plain PODS n -> m runs beside GRPO n = m.
STUDIES = [("study", "shipped"), ("study600", "shipped"), ("study_cli", "shipped"), ("adaptive", "shipped"),
           ("adaptive_quiet", "shipped"), ("evidence/shipped", "shipped"), ("budgets/shipped", "shipped"),
           ("study_strong", "strong"), ("adaptive_strong", "strong"), ("evidence/strong", "strong")]
# Filed since the calibration (with --since): the 2-core Intel Xeon auto study's GRPO and fixed PODS runs (its auto
# runs do not match PLAIN: left out). The C-GRPO studies beside it hold GRPO and C-GRPO only: no plain comparison.
SINCE = [("../cpu-2core-intel-xeon/auto/shipped", "shipped"), ("../cpu-2core-intel-xeon/auto/strong", "strong")]
PLAIN = re.compile(r"^pods-(mv|random)-n(\d+)m(\d+)$")
WINDOW = 15.0  # updates either side of a step whose logged statistics estimate D there
KAPPA_GRID = np.linspace(0.0, 6.0, 1201)  # kappa's search: every 0.005


# ---------------------------------------------------------------------------------------------------------------
# The model's side: D as a Beta, and the variance ratio.

def beta_none_of_k(alpha, beta, k: int) -> np.ndarray:
    """(K,) Beta(alpha, beta) -> (K,) E[(1-p)^k]: the chance that k samples all fail (1 - pass@k)."""
    alpha, beta = np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64)
    i = np.arange(k, dtype=np.float64)[:, None]  # (k, 1)
    return np.prod((beta + i) / (alpha + beta + i), axis=0)


def fit_beta(mean, pass_at_k, k: int, lo: float = 1e-3, hi: float = 1e4) -> tuple[np.ndarray, np.ndarray]:
    """(K,) mean success rates and (K,) pass@k -> (K,) Beta (alpha, beta) with that mean and that pass@k =
    1 - E[(1-p)^k]. E[(1-p)^k] falls as the concentration s = alpha + beta rises, from 1 - mean (s -> 0: every prompt
    always or never solved) to (1 - mean)^k (s -> inf: every prompt at the mean); outside that range, the nearer end
    (s = lo or hi). Bisection on log s, all K at once."""
    mean = np.clip(np.asarray(mean, dtype=np.float64), 1e-4, 1 - 1e-4)
    target = 1 - np.asarray(pass_at_k, dtype=np.float64)
    log_lo, log_hi = np.full(mean.shape, math.log(lo)), np.full(mean.shape, math.log(hi))
    for _ in range(60):
        mid = (log_lo + log_hi) / 2
        s = np.exp(mid)
        spread_too_wide = beta_none_of_k(mean * s, (1 - mean) * s, k) > target  # s too small
        log_lo, log_hi = np.where(spread_too_wide, mid, log_lo), np.where(spread_too_wide, log_hi, mid)
    s = np.exp((log_lo + log_hi) / 2)
    return mean * s, (1 - mean) * s


def variance_ratio(alpha, beta, m: int, n: int) -> np.ndarray:
    """(K,) Beta(alpha, beta) over prompts -> (K,) V = E[g(n)] / E[g(m)], g(n) = E[V_{n,m}] (the expected variance of
    the max-variance m-subset of n binary rewards), expectations over p ~ Beta: the planner's own table."""
    table = selected_variance_table(alpha, beta, m, [m, n])  # (K, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(table[:, 0] > 0, table[:, 1] / table[:, 0], 1.0)


def predicted_level_ratio(path_steps, path_v, level_x, kappa) -> np.ndarray:
    """GRPO's path: steps (T,) ascending with V (T,); levels reached at updates level_x (L,) -> (L,) predicted updates
    ratio x / int_0^x dt / (1 + kappa (V(t) - 1)) (V held at its first value before the first step, at its last
    after the last); kappa (K,) gives (K, L). nan where x is not a finite update count >= 0."""
    kappa = np.asarray(kappa, dtype=np.float64)
    scalar = kappa.ndim == 0
    kappa = np.atleast_1d(kappa)[:, None]  # (K, 1)
    steps, v = np.asarray(path_steps, dtype=np.float64), np.asarray(path_v, dtype=np.float64)
    if steps[0] > 0:
        steps, v = np.concatenate([[0.0], steps]), np.concatenate([[v[0]], v])
    inverse = 1 / (1 + kappa * (v - 1))  # (K, T)
    cumulative = np.concatenate([np.zeros((len(kappa), 1)),
                                 np.cumsum((inverse[:, 1:] + inverse[:, :-1]) / 2 * np.diff(steps), axis=1)], axis=1)
    x = np.asarray(level_x, dtype=np.float64)
    valid = np.isfinite(x) & (x >= 0)
    inside = np.clip(np.where(valid, x, 0.0), 0.0, steps[-1])
    idx = np.clip(np.searchsorted(steps, inside, side="right") - 1, 0, len(steps) - 2)  # segment [idx, idx + 1]
    frac = (inside - steps[idx]) / (steps[idx + 1] - steps[idx])
    spent = cumulative[:, idx] * (1 - frac) + cumulative[:, idx + 1] * frac  # (K, L)
    spent = np.where(x > steps[-1], cumulative[:, -1:] + (x - steps[-1]) * inverse[:, -1:], spent)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(valid & (x > 0), x / spent, np.where(x == 0, 1 / inverse[:, :1], np.nan))
    return ratio[0] if scalar else ratio


# ---------------------------------------------------------------------------------------------------------------
# The runs' side.

def unpacked(study: str, work: Path) -> Path:
    """The study's runs unpacked under ``work`` (once)."""
    dest = work / "runs" / study.replace("/", "_")
    if not (dest / ".done").is_file():
        if dest.exists():
            import shutil
            shutil.rmtree(dest)
        unpack_runs(RESULTS / study, dest)
        (dest / ".done").write_text("ok\n")
    return dest


def logged(run_dir: Path) -> tuple[dict, dict]:
    """One run's ({step: mean correctness reward} of its training rows, {step: (accuracy, pass@k)} of its
    evaluations)."""
    train, evals = {}, {}
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "rewards/correctness_reward/mean" in row:
                train[int(row["step"])] = float(row["rewards/correctness_reward/mean"])
            if "eval/accuracy" in row and "eval/pass_at_k" in row:
                evals[int(row["step"])] = (float(row["eval/accuracy"]), float(row["eval/pass_at_k"]))
    return train, evals


def extract(study: str, model: str, work: Path) -> dict:
    """One study's runs reduced to what the calibration needs (cached as JSON in ``work``): per method and seed the
    eval curve on the update axis, and for GRPO the logged training statistics."""
    cache = work / "extract" / f"{study.replace('/', '_')}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    root = unpacked(study, work)
    run_dirs = sorted(p.parent for p in root.glob("**/study/runs/*/metrics.jsonl")) or \
        sorted(p.parent for p in root.glob("runs/*/metrics.jsonl"))
    methods: dict[str, dict] = {}
    for run_dir in run_dirs:
        name, _, seed = run_dir.name.rpartition("-s")
        if not seed.isdigit() or not (name.startswith("grpo-n") and name[6:].isdigit() or PLAIN.match(name)):
            continue
        run = stats.load_run(run_dir)
        xs, values, _ = stats.run_curve(run, "steps")
        entry = {"steps": xs.tolist(), "accuracy": values.tolist()}
        if name.startswith("grpo-"):
            train, evals = logged(run_dir)
            entry.update(train={str(k): v for k, v in sorted(train.items())},
                         evals={str(k): v for k, v in sorted(evals.items())}, eval_k=int(run.config["eval_k"]))
        methods.setdefault(name, {})[seed] = entry
    data = {"study": study, "model": model, "methods": methods}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(data))
    return data


def v_path(grpo: dict, seeds, m: int, n: int, mean_from: str = "eval") -> dict:
    """GRPO's seeds' logs -> its path: at each evaluation step (T,), D = a Beta over prompts whose spread matches the
    seed-mean held-out accuracy and pass@k there, and whose mean is that accuracy (``mean_from="eval"``) or the mean
    correctness reward of the training rows within +-WINDOW updates (``"train"``); V (T,) under D."""
    k = grpo[seeds[0]]["eval_k"]
    steps = sorted(set.intersection(*(set(grpo[s]["evals"]) for s in seeds)), key=int)
    accuracy = np.array([np.mean([grpo[s]["evals"][t][0] for s in seeds]) for t in steps])
    pass_k = np.array([np.mean([grpo[s]["evals"][t][1] for s in seeds]) for t in steps])
    alpha, beta = fit_beta(accuracy, pass_k, k)
    concentration = alpha + beta
    rows = np.array([(int(t), c) for s in seeds for t, c in grpo[s]["train"].items()])
    x = np.array([int(t) for t in steps], dtype=np.float64)
    near = np.abs(rows[None, :, 0] - x[:, None]) <= WINDOW  # (T, R)
    train_mean = (near * rows[None, :, 1]).sum(1) / np.maximum(near.sum(1), 1)
    train_mean = np.where(near.sum(1) > 0, train_mean, accuracy)  # step 0: no training row yet
    mean = accuracy if mean_from == "eval" else train_mean
    v = variance_ratio(mean * concentration, (1 - mean) * concentration, m, n)
    return {"steps": x, "v": v, "accuracy": accuracy, "pass_at_k": pass_k, "k": k, "concentration": concentration,
            "train_mean": train_mean}


def comparison(data: dict, method: str, seeds, mean_from: str = "eval") -> dict:
    """Measured per-level updates ratios and GRPO's V along its path, on the given (possibly repeated) seeds."""
    kind, n, m = PLAIN.match(method).groups()
    n, m = int(n), int(m)
    grpo = data["methods"][f"grpo-n{m}"]
    runs = data["methods"][method]
    base_curves = [(grpo[s]["steps"], grpo[s]["accuracy"]) for s in seeds]
    level = curves.level_time_ratio(base_curves, [(runs[s]["steps"], runs[s]["accuracy"]) for s in seeds])
    path = v_path(grpo, seeds, m, n, mean_from)
    v = path["v"] if kind == "mv" else np.ones_like(path["v"])
    return {"level": level, "path_steps": path["steps"], "path_v": v, "path": path, "n": n, "m": m, "rule": kind}


# ---------------------------------------------------------------------------------------------------------------
# The fit.

def fit_kappa(points: list[tuple], weights: np.ndarray, grid=None) -> float:
    """points: (path_steps, path_v, level_x (L,), measured (L,)) per comparison; weights: one per level, in order ->
    the kappa on ``grid`` (default KAPPA_GRID) minimizing sum w (log measured - log predicted(kappa))^2."""
    grid = KAPPA_GRID if grid is None else np.asarray(grid, dtype=np.float64)
    loss, i = np.zeros(len(grid)), 0
    for steps, v, xs, measured in points:
        predicted = predicted_level_ratio(steps, v, xs, grid)  # (K, L)
        w = weights[i:i + len(xs)]
        i += len(xs)
        ok = np.isfinite(predicted) & ((measured > 0) & np.isfinite(measured))[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            residual = np.where(ok, np.log(np.where(measured > 0, measured, 1.0)) - np.log(predicted), 0.0)
        loss += (w * residual**2).sum(axis=1)
    return float(grid[int(loss.argmin())])


def split_gains(path: dict, m: int, n: int, draws: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    """GRPO's path -> (T,) twice: E_D[(g(n) - g(m)) 1{p < 1/2}] / E_D[g(m)] and the same for p >= 1/2, the gain of
    sampling more split between prompts below and above p = 1/2 (Monte Carlo over D, ``draws`` p's, seed 0)."""
    below, above = [], []
    for accuracy, concentration in zip(path["accuracy"], path["concentration"]):
        p = np.random.default_rng(0).beta(accuracy * concentration, (1 - accuracy) * concentration, draws)
        g_m = expected_selected_variance(binomial_pmf(p, m), m).numpy()
        g_n = expected_selected_variance(binomial_pmf(p, n), m).numpy()
        low = p < 0.5
        below.append(float(((g_n - g_m) * low).mean() / g_m.mean()))
        above.append(float(((g_n - g_m) * ~low).mean() / g_m.mean()))
    return np.array(below), np.array(above)


def fit_split(points: list[tuple], weights: dict, grid) -> tuple[float, float, float]:
    """points: (key, path_steps, gain below (T,), gain above (T,), level_x (L,), measured (L,)) -> (kappa below,
    kappa above, loss): the grid pair minimizing the weighted squared log error, r(t) = 1 + kb Gb(t) + ka Ga(t)."""
    loss = np.zeros((len(grid), len(grid)))
    for key, steps, below, above, xs, measured in points:
        ok_measured = (measured > 0) & np.isfinite(measured)
        log_measured = np.log(np.where(ok_measured, measured, 1.0))
        for i, kb in enumerate(grid):
            v = 1 + kb * below[None, :] + grid[:, None] * above[None, :]  # (K, T): every kappa above at once
            predicted = np.array([predicted_level_ratio(steps, row, xs, 1.0) for row in v])  # (K, L)
            ok = np.isfinite(predicted) & ok_measured[None, :]
            residual = np.where(ok, log_measured - np.log(np.where(ok, predicted, 1.0)), 0.0)
            loss[i] += (weights[key] * residual**2).sum(axis=1)
    i, j = np.unravel_index(int(loss.argmin()), loss.shape)
    return float(grid[i]), float(grid[j]), float(loss[i, j])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pods-auto-calibration",
                        help="scratch folder for the unpacked runs and the extract cache (outside the repository)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--boot", type=int, default=1000, help="bootstrap replicates (seeds resampled per study)")
    parser.add_argument("--kappa-file", type=Path, default=None, help="also write {efficiency, ci, note} here")
    parser.add_argument("--since", action="store_true", help="also the studies filed since the calibration "
                        "(SINCE); default --out then auto_calibration/since/")
    args = parser.parse_args(argv)
    studies = STUDIES + SINCE if args.since else STUDIES
    if args.since and args.out == OUT:
        args.out = OUT / "since"
    started = time.time()

    comparisons = []  # (study, model, method, seeds)
    extracts = {}
    for study, model in studies:
        data = extract(study, model, args.work)
        extracts[study] = data
        for method in sorted(data["methods"]):
            match = PLAIN.match(method)
            if not match or int(match.group(2)) <= int(match.group(3)):
                continue
            base = data["methods"].get(f"grpo-n{match.group(3)}", {})
            seeds = sorted(set(base) & set(data["methods"][method]), key=int)
            if len(seeds) >= 2:
                comparisons.append((study, model, method, seeds))
        print(f"{study}: extracted ({time.time() - started:.0f}s)", file=sys.stderr)

    def measured(c):
        return np.array(c["level"]["per_level"], dtype=np.float64)

    def points_of(source, keys):
        return [(source[key]["path_steps"], source[key]["path_v"], np.array(source[key]["level"]["baseline_x"]),
                 measured(source[key])) for key in keys]

    point = {(s, meth): comparison(extracts[s], meth, seeds) for s, _, meth, seeds in comparisons}
    rng = np.random.default_rng(0)
    boot = []  # per replicate: {(study, method): comparison}, each study's seeds resampled (paired)
    for r in range(args.boot):
        replicate = {}
        for study, _, method, seeds in comparisons:
            drawn = [seeds[i] for i in rng.integers(0, len(seeds), len(seeds))]
            replicate[(study, method)] = comparison(extracts[study], method, drawn)
        boot.append(replicate)
        if (r + 1) % 100 == 0:
            print(f"bootstrap {r + 1}/{args.boot} ({time.time() - started:.0f}s)", file=sys.stderr)

    # The fit: max_variance comparisons only (random selection is the control), weights 1 / var(log measured).
    fitted = [key for key in point if point[key]["rule"] == "mv"]
    log_var = {key: np.nanvar(np.log(np.clip([measured(b[key]) for b in boot], 1e-6, None)), axis=0, ddof=1)
               for key in point}
    weight = {key: 1 / np.maximum(log_var[key], 1e-4) for key in point}
    weights = np.concatenate([weight[key] for key in fitted])
    kappa = fit_kappa(points_of(point, fitted), weights)
    print(f"kappa = {kappa:.3f} ({time.time() - started:.0f}s); bootstrapping its CI", file=sys.stderr)
    coarse = KAPPA_GRID
    kappa_boot = np.array([fit_kappa(points_of(b, fitted), weights, grid=coarse) for b in boot])
    kappa_ci_seeds = [float(np.percentile(kappa_boot, 2.5)), float(np.percentile(kappa_boot, 97.5))]
    # The CI that also counts the comparisons' disagreement: each replicate resamples the comparisons too.
    kappa_boot2 = []
    for b in boot:
        keys = [fitted[i] for i in rng.integers(0, len(fitted), len(fitted))]
        kappa_boot2.append(fit_kappa(points_of(b, keys), np.concatenate([weight[key] for key in keys]), grid=coarse))
    kappa_ci = [float(np.percentile(kappa_boot2, 2.5)), float(np.percentile(kappa_boot2, 97.5))]
    if args.kappa_file:  # the lead waits for this: written before the rest
        args.kappa_file.write_text(json.dumps({"efficiency": round(kappa, 3), "ci": [round(x, 3) for x in kappa_ci],
                                               "note": "preliminary: written as soon as fitted"}, indent=1) + "\n")
    # Sensitivities: no weights; D's mean from the training rows' correctness instead of held-out accuracy; one
    # kappa per model; one per comparison (how much the comparisons agree).
    sensitivity = {"unweighted": fit_kappa(points_of(point, fitted), np.ones_like(weights))}
    train_point = {key: comparison(extracts[key[0]], key[1], next(c[3] for c in comparisons if c[0] == key[0]
                                                                   and c[2] == key[1]), "train") for key in fitted}
    sensitivity["mean_from_train_rows"] = fit_kappa(points_of(train_point, fitted), weights)
    # Exploratory, two parameters: kappa for prompts below p = 1/2 and above it (point fit; leave-one-out range).
    split_points = [(key, point[key]["path_steps"], *split_gains(point[key]["path"], point[key]["m"], point[key]["n"]),
                     np.array(point[key]["level"]["baseline_x"]), measured(point[key])) for key in fitted]
    below, above, split_loss = fit_split(split_points, weight, np.linspace(0.0, 3.0, 61))
    single_loss = fit_split([(k, s, g + h, np.zeros_like(g), x, y) for k, s, g, h, x, y in split_points], weight,
                            np.linspace(0.0, 3.0, 61))
    left_out = [fit_split([q for q in split_points if q[0] != key], weight, np.linspace(0.0, 2.0, 41))[:2]
                for key in fitted]
    split_pred = {key: predicted_level_ratio(st, 1 + below * b + above * a, x, 1.0)
                  for key, st, b, a, x, _ in split_points}
    sensitivity["split_at_half"] = {
        "kappa_below": below, "kappa_above": above, "loss": split_loss,
        "loss_single_kappa": single_loss[2], "single_kappa_same_grid": single_loss[0],
        "leave_one_comparison_out": {"kappa_below": [min(b for b, _ in left_out), max(b for b, _ in left_out)],
                                     "kappa_above": [min(a for _, a in left_out), max(a for _, a in left_out)]},
        "share_of_gain_below_half": {f"{k[0]}:{k[1]}": float(np.mean(b / np.maximum(b + a, 1e-12)))
                                     for k, _, b, a, _, _ in split_points},
        "predicted_geomean": {f"{k[0]}:{k[1]}": float(np.exp(np.mean(np.log(v)))) for k, v in split_pred.items()},
        "note": "exploratory: two parameters fitted on the same 12 x 15 points, no bootstrap CI; D by Monte Carlo "
                "(4000 draws)"}
    print(f"split at 1/2: below {below:.2f}, above {above:.2f} ({time.time() - started:.0f}s)", file=sys.stderr)
    for model in ("shipped", "strong"):
        keys = [key for key in fitted if next(c[1] for c in comparisons if c[0] == key[0]) == model]
        w = np.concatenate([weight[key] for key in keys])
        boots = [fit_kappa(points_of(b, keys), w, grid=coarse) for b in boot]
        sensitivity[f"model_{model}"] = {"kappa": fit_kappa(points_of(point, keys), w),
                                         "ci95": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]}
    alone = {}
    for key in fitted:
        boots = [fit_kappa(points_of(b, [key]), weight[key], grid=coarse) for b in boot]
        alone[key] = {"kappa": fit_kappa(points_of(point, [key]), weight[key]),
                      "ci95": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]}

    rows = []
    for (study, model, method, seeds) in comparisons:
        c = point[(study, method)]
        path = c["path"]
        xs = np.array(c["level"]["baseline_x"])
        at_level = np.interp(xs, c["path_steps"], c["path_v"])
        pred1 = predicted_level_ratio(c["path_steps"], c["path_v"], xs, 1.0)
        predk = predicted_level_ratio(c["path_steps"], c["path_v"], xs, kappa)
        meas_boot = np.array([measured(b[(study, method)]) for b in boot])  # (B, L)
        for j, fraction in enumerate(c["level"].get("fractions", curves.LEVEL_FRACTIONS)):
            finite = meas_boot[:, j][np.isfinite(meas_boot[:, j])]
            rows.append({"study": study, "model": model, "method": method, "rule": c["rule"], "n": c["n"],
                         "m": c["m"], "seeds": len(seeds), "fraction": float(fraction),
                         "level": float(c["level"]["levels"][j]), "grpo_updates": float(xs[j]),
                         "method_updates": float(c["level"]["method_x"][j]),
                         "pass_at_k": float(np.interp(xs[j], c["path_steps"], path["pass_at_k"])), "k": path["k"],
                         "beta_concentration": float(np.interp(xs[j], c["path_steps"], path["concentration"])),
                         "train_correct_mean": float(np.interp(xs[j], c["path_steps"], path["train_mean"])),
                         "v_at_level": float(at_level[j]) if c["rule"] == "mv" else 1.0,
                         "predicted_kappa1": float(pred1[j]), "predicted_fitted": float(predk[j]),
                         "measured": float(measured(c)[j]),
                         "measured_ci95": [float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))]
                         if len(finite) > 1 else None,
                         "in_fit": c["rule"] == "mv"})

    summary = []
    for (study, model, method, seeds) in comparisons:
        mine = [r for r in rows if r["study"] == study and r["method"] == method]
        level = point[(study, method)]["level"]
        ratio_boot = [b[(study, method)]["level"]["ratio"] for b in boot]
        ratio_boot = [x for x in ratio_boot if x is not None and math.isfinite(x)]
        summary.append({"study": study, "model": model, "method": method, "seeds": len(seeds),
                        "v_at_levels_geomean": geomean(mine, "v_at_level"),
                        "predicted_kappa1_geomean": geomean(mine, "predicted_kappa1"),
                        "predicted_fitted_geomean": geomean(mine, "predicted_fitted"),
                        "measured_geomean": level["ratio"],
                        "measured_geomean_ci95": [float(np.percentile(ratio_boot, 2.5)),
                                                  float(np.percentile(ratio_boot, 97.5))],
                        "kappa_alone": alone.get((study, method))})

    result = {
        "what": "calibration of the auto planner's efficiency (kappa) against the CPU studies' learning per update",
        "kappa": kappa, "kappa_ci95": kappa_ci, "kappa_ci95_seeds_only": kappa_ci_seeds, "bootstrap": args.boot,
        "kappa_boot_median": float(np.median(kappa_boot)), "sensitivity": sensitivity,
        "fit": "least squares of log measured on log predicted over every (study, max_variance method, level), "
               "weights 1 / bootstrap variance of log measured; predicted = x / int_0^x dt / (1 + kappa (V(t)-1)) "
               "on GRPO's path; CI: percentile bootstrap resampling the comparisons and, within each study, the "
               "seeds (paired); kappa_ci95_seeds_only resamples the seeds alone",
        "d_estimate": "Beta over held-out prompts matched, at each of GRPO's evaluations (seed means), to its "
                      "accuracy (the mean) and pass@k (the spread: 1 - pass@k = E[(1-p)^k]). TRL's "
                      "frac_reward_zero_std is 0 in every run (the tag-count reward's small values break ties), "
                      "so the training groups cannot give the spread; no GRPO run kept a ledger",
        "left_out": "adaptive (pilot rounds), knapsack, GRESO, DAPO, Reinforce-Ada, pilot-commit methods: other "
                    "samplers the model does not describe; pods_vs_grpo/ (time-based evaluations, an early pilot); "
                    "evidence/interim-* and stage* (subsets of evidence/shipped)",
        "machine": machine_info(), "command": " ".join(["python", *sys.argv]),
        "studies": [s for s, _ in studies], "summary": summary, "rows": rows,
        "seconds": time.time() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "table.md").write_text(markdown(result))
    if args.kappa_file:
        args.kappa_file.write_text(json.dumps({"efficiency": round(kappa, 3), "ci": [round(x, 3) for x in kappa_ci],
                                               "note": note(result)}, indent=1) + "\n")
    print(markdown(result))
    return 0


def geomean(rows: list[dict], key: str) -> float:
    return float(np.exp(np.mean(np.log([r[key] for r in rows]))))


def note(result: dict) -> str:
    """The one line for the lead's kappa file."""
    sens = result["sensitivity"]
    return (f"fitted on {sum(1 for s in result['summary'] if s['kappa_alone'])} max_variance comparisons x 15 "
            f"accuracy levels of the CPU studies (benchmarks/auto_calibration.py, "
            f"benchmarks/results/cpu-2core-amd-epyc/auto_calibration/); {result['fit']}. Sensitivity: unweighted "
            f"{sens['unweighted']:.2f}, D's mean from training rows {sens['mean_from_train_rows']:.2f}, shipped model "
            f"alone {sens['model_shipped']['kappa']:.2f}, strong alone {sens['model_strong']['kappa']:.2f}")


def _alone(alone) -> str:
    return f"{alone['kappa']:.2f}{_ci(alone['ci95'])}" if alone else "control"


def _ci(ci) -> str:
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""


def markdown(result: dict) -> str:
    """The calibration table: the summary per comparison, then every level."""
    sens = result["sensitivity"]
    split = sens["split_at_half"]
    lines = [f"kappa (efficiency) = **{result['kappa']:.2f}**{_ci(result['kappa_ci95'])} (95% CI, "
             f"{result['bootstrap']} bootstrap replicates resampling the comparisons and their seeds; the seeds "
             f"alone: {_ci(result['kappa_ci95_seeds_only'])}). Sensitivity: unweighted "
             f"{sens['unweighted']:.2f}; D's mean from the training rows {sens['mean_from_train_rows']:.2f}; "
             f"shipped model alone {sens['model_shipped']['kappa']:.2f}{_ci(sens['model_shipped']['ci95'])}, strong "
             f"model alone {sens['model_strong']['kappa']:.2f}{_ci(sens['model_strong']['ci95'])}.", "",
             f"Exploratory, two parameters (kappa for prompts below / above p = 1/2): {split['kappa_below']:.2f} / "
             f"{split['kappa_above']:.2f} (leave one comparison out: {split['leave_one_comparison_out']['kappa_below']}"
             f" / {split['leave_one_comparison_out']['kappa_above']}); weighted loss {split['loss']:.0f} against "
             f"{split['loss_single_kappa']:.0f} for one kappa.", "",
             "Learning per update, PODS n -> m against GRPO n = m: GRPO's updates to each accuracy level / the "
             "method's (> 1: PODS learns more per update). Predicted: x / int_0^x dt / (1 + kappa (V(t) - 1)) on "
             "GRPO's path, V = E[g(n)] / E[g(m)] under a Beta over prompts fitted to GRPO's held-out accuracy and "
             "pass@k at each evaluation. Random selection is a control (predicted 1.0 at any kappa), not fitted.",
             "",
             "## Per comparison (geometric means over the 15 levels)", "",
             "| study | model | method | seeds | V at levels | predicted (kappa=1) | predicted (fitted) | "
             "measured [95% CI] | kappa alone [95% CI] |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in result["summary"]:
        lines.append(f"| {s['study']} | {s['model']} | {s['method']} | {s['seeds']} | {s['v_at_levels_geomean']:.3f} "
                     f"| {s['predicted_kappa1_geomean']:.3f} | {s['predicted_fitted_geomean']:.3f} | "
                     f"{s['measured_geomean']:.3f}{_ci(s['measured_geomean_ci95'])} | "
                     f"{_alone(s['kappa_alone'])} |")
    lines += ["", "## Per level", "",
              "| study | model | n->m | rule | level (frac of gain) | GRPO updates | pass@k (k) | Beta a+b | V | "
              "predicted (kappa=1) | predicted (fitted) | measured [95% CI] |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['study']} | {r['model']} | {r['n']}->{r['m']} | {r['rule']} | {r['level']:.3f} "
                     f"({r['fraction']:.2f}) | {r['grpo_updates']:.0f} | {r['pass_at_k']:.3f} ({r['k']}) | "
                     f"{r['beta_concentration']:.2f} | {r['v_at_level']:.3f} | {r['predicted_kappa1']:.3f} | "
                     f"{r['predicted_fitted']:.3f} | {r['measured']:.3f}{_ci(r['measured_ci95'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
