"""What ``rollout_planner="auto"`` would choose on measured costs and pass rates (`pods cost`'s projection):
``costs_from_rows`` fits `pods cost`'s rows (a + b*N sampling, c_t); ``project_auto`` puts P prompts' k sampled outcomes
in a ledger and lets ``AutoN`` itself plan them a batch at a time, its signal per second against GRPO's and each fixed
n's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pods_rl.budget.ledger import LedgerSettings, PromptLedger
from pods_rl.budget.planners.auto import AutoN, AutoSettings, signal_table, success_posterior, theil_sen
from pods_rl.recipes import parse_args

__all__ = ["auto_projection", "costs_from_rows", "fit_sampling_cost", "project_auto", "starting_outcomes"]

DEFAULT_AUTO_PROMPTS = 32  # training prompts whose starting pass rates `pods cost`'s auto projection plans
DEFAULT_AUTO_SAMPLES = 8  # samples of each


def fit_sampling_cost(sampled: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(S,) rollouts sampled per step, (S,) sampling seconds -> (a, b) of seconds = a + b * N: Theil-Sen (the
    planner's estimator: the median of pairwise slopes, the median residual), both clamped at 0 as the planner
    clamps them. One line of ValueError unless the steps sampled at least two distinct totals."""
    x, y = np.asarray(sampled, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if len(np.unique(x)) < 2:
        raise ValueError(f"the sampling cost a + b*N needs steps at two or more totals N, got {sorted(set(x))}: "
                         "measure two n's (pods cost --n with an n above m)")
    slope, _ = theil_sen(x, y)
    slope = max(slope, 0.0)
    return max(float(np.median(y - slope * x)), 0.0), slope


def costs_from_rows(rows: Sequence[dict]) -> dict:
    """`pods cost`'s plain rows (no over-sampling, no pilot) -> ``{"fixed_s", "sample_s", "train_s", "totals"}``:
    sampling (generation + scoring, each row's median step split) fitted as a + b*N over the rows'
    ``sampled_per_step``; c_t = the median over rows of update seconds per kept rollout."""
    plain = [r for r in rows if r.get("oversample_prompts", 1.0) == 1.0 and not r.get("pilot_generations")]
    totals = [float(r["sampled_per_step"]) for r in plain]
    sampling = [r["seconds"]["generation"] + r["seconds"]["scoring"] for r in plain]
    fixed, per_sampled = fit_sampling_cost(totals, sampling)
    per_trained = float(np.median([r["seconds"]["update"] / r["kept_per_step"] for r in plain]))
    return {"fixed_s": fixed, "sample_s": per_sampled, "train_s": per_trained, "totals": totals}


def project_auto(correct, *, m: int, n: int, prompts_per_step: int, fixed_s: float, sample_s: float,
                 train_s: float, fixed_ns: Sequence[int] = (), efficiency: float | None = None,
                 prior_strength: float | None = None, **knobs) -> dict:
    """The auto planner's counts for the prompts of ``correct`` (P, k) 0/1, planned ``prompts_per_step`` (B) at a
    time (a trailing partial batch is dropped when there is a full one), on fixed costs in seconds: sampling
    ``fixed_s`` + ``sample_s`` per rollout, ``train_s`` per trained rollout (m per prompt); ``knobs``: more
    ``AutoSettings`` (e.g. ``efficiency_low``). The signal is counted at ``efficiency``, the expected one.

    Returns ``n_mean``, ``n_min``, ``n_max``, ``n_counts`` {n: prompts}, ``frac_above_m``, ``pass_rate`` (mean),
    ``frac_all_equal`` (prompts whose k outcomes are all equal), ``signal_per_second`` {"grpo", "auto", "<n>"...}
    and ``vs_grpo`` (the same over GRPO's): the sum of the planner's signal over the batches over their seconds."""
    correct = torch.as_tensor(np.asarray(correct, dtype=np.float64))
    if correct.ndim != 2 or correct.shape[0] < 1 or correct.shape[1] < 1:
        raise ValueError(f"correct must be (prompts, samples) 0/1, got shape {tuple(correct.shape)}")
    if not 1 <= m < n or prompts_per_step < 1:
        raise ValueError(f"the projection needs 1 <= m < n and a batch of prompts, got m={m}, n={n}, "
                         f"prompts_per_step={prompts_per_step}")
    knobs = {**knobs, **{k: v for k, v in (("efficiency", efficiency), ("prior_strength", prior_strength))
                         if v is not None}}
    settings = AutoSettings(min_n=m, max_n=n, sample_ms=1e3 * sample_s, train_ms=1e3 * train_s,
                            fixed_ms=1e3 * fixed_s, **knobs)
    planner, ledger = AutoN(settings), PromptLedger(LedgerSettings(success_threshold=0.5))  # 0/1: success = 1
    prompts = correct.shape[0]
    ledger.record(torch.arange(prompts), correct, step=0)
    batch = min(prompts_per_step, prompts)
    starts = range(0, prompts - batch + 1, batch)  # whole batches only (one, of all P, when P < B)
    fixed_ns = sorted({int(x) for x in fixed_ns if m < int(x) <= n})
    gain = dict.fromkeys(["grpo", "auto", *map(str, fixed_ns)], 0.0)
    seconds = dict.fromkeys(gain, 0.0)
    chosen = []
    for start in starts:
        ids = torch.arange(start, start + batch)
        rollouts = planner.plan(ids, ledger, n=n, m=m).rollouts  # (B,) in [m, n]
        a, b = success_posterior(ledger.columns(ids, "window")["window"], settings.prior_strength)
        signal = signal_table(a, b, m, n, settings.efficiency).numpy()  # (B, n - m + 1): L(m) .. L(n)
        step = fixed_s + train_s * m * batch  # a step's seconds but the per-rollout sampling
        columns = {"grpo": np.full(batch, m), "auto": rollouts.numpy(),
                   **{str(x): np.full(batch, x) for x in fixed_ns}}
        for name, counts in columns.items():
            gain[name] += float(signal[np.arange(batch), counts - m].sum())
            seconds[name] += step + sample_s * float(counts.sum())
        chosen.append(rollouts)
    counts = torch.cat(chosen)
    per_second = {name: gain[name] / seconds[name] if seconds[name] > 0 else None for name in gain}  # (JSON: no inf)
    base = per_second["grpo"]
    outcomes = correct.sum(dim=1)
    return {
        "prompts": prompts, "k": int(correct.shape[1]), "prompts_per_step": batch, "batches": len(starts),
        "pass_rate": float(correct.mean()),
        "frac_all_equal": float(((outcomes == 0) | (outcomes == correct.shape[1])).double().mean()),
        "n_mean": float(counts.double().mean()), "n_min": int(counts.min()), "n_max": int(counts.max()),
        "n_counts": {str(int(v)): int((counts == v).sum()) for v in torch.unique(counts)},
        "frac_above_m": float((counts > m).double().mean()),
        "signal_per_second": per_second,
        "vs_grpo": {name: value / base if value is not None and base else None for name, value in per_second.items()},
        "efficiency": settings.efficiency, "prior_strength": settings.prior_strength,
    }


PASS_RATE_SOURCE = ("the starting model's pass rates: {prompts} training prompts x {k} samples each, sampled here "
                    "at the recipe's temperature and completion length (pods_rl.evaluation, split {split!r})")


def starting_outcomes(recipe_argv: Sequence[str], prompts: int, samples: int) -> tuple[list[list[int]], dict]:
    """(P, k) 0/1 correctness of the recipe's starting model on its first ``prompts`` training prompts, ``samples``
    each (the task's grader, the recipe's temperature and max_completion_length), and what was evaluated."""
    from pods_rl.evaluation import evaluate_model
    from pods_rl.models import default_model_path
    from pods_rl.tasks import parse_task_args

    run, config, model_args = parse_args(list(recipe_argv))
    limit = prompts if run.train_limit is None else min(prompts, run.train_limit)
    record = evaluate_model(default_model_path(model_args.model_name_or_path), run.task, split=run.train_split,
                            k=samples, temperature=config.temperature, max_new_tokens=config.max_completion_length,
                            limit=limit, batch_size=run.eval_batch_size, seed=config.seed,
                            task_args=parse_task_args(run.task_args), num_examples=0,
                            trust_remote_code=bool(config.trust_remote_code), per_problem=True)
    return record["correct"], {"split": run.train_split, "eval_seconds": record["eval_seconds"],
                               "backend": record["backend"]}


def auto_projection(result: dict, recipe_argv: Sequence[str], prompts: int = DEFAULT_AUTO_PROMPTS,
                    samples: int = DEFAULT_AUTO_SAMPLES) -> dict:
    """``result["auto"]``: the auto planner's counts and predicted signal per second against GRPO on ``measure``'s
    costs (``costs_from_rows``) and the starting pass rates (``starting_outcomes``);
    ``{"skipped": reason}`` when the rows cannot give the costs (one total N sampled)."""
    plain = [r for r in result["rows"] if r.get("oversample_prompts", 1.0) == 1.0 and not r.get("pilot_generations")]
    m, n = result["settings"]["m"], max(r["n"] for r in plain)
    try:
        costs = costs_from_rows(plain)
    except ValueError as err:
        return {"skipped": str(err)}
    if n <= m:
        return {"skipped": f"no n above m={m} measured: auto chooses between m and the largest n (pods cost --n)"}
    correct, evaluated = starting_outcomes(recipe_argv, prompts, samples)
    projection = project_auto(correct, m=m, n=n, prompts_per_step=max(1, plain[0]["kept_per_step"] // m),
                              fixed_s=costs["fixed_s"], sample_s=costs["sample_s"], train_s=costs["train_s"],
                              fixed_ns=[r["n"] for r in plain])
    source = PASS_RATE_SOURCE.format(prompts=projection["prompts"], k=projection["k"], split=evaluated["split"])
    return {**projection, "m": m, "max_n": n, "pass_rates": source, **evaluated,
            "costs_ms": {"sample_fixed": 1e3 * costs["fixed_s"], "sample_per_rollout": 1e3 * costs["sample_s"],
                         "train_per_rollout": 1e3 * costs["train_s"]},
            "fit_totals": costs["totals"]}
