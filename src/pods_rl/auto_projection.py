"""What ``rollout_planner="auto"`` would choose on measured costs and pass rates (`pods cost`'s projection).

    costs = costs_from_rows(rows)     # a + b*N sampling fit and c_t, from `pods cost`'s measured rows
    projection = project_auto(correct, m=8, n=32, prompts_per_step=16, fixed_s=costs["fixed_s"],
                              sample_s=costs["sample_s"], train_s=costs["train_s"], fixed_ns=[16, 32])

``correct`` (P, k) holds each of P prompts' k sampled outcomes (1 = correct). They go into a prompt ledger, and the
planner itself (``AutoN``, its default knobs, the costs fixed) plans the prompts a step's batch at a time, as it
would once its ledger had seen each prompt k times. The signal is the planner's own (``signal_table`` on
``success_posterior``); its sum over the batches over their seconds, T = a + b * sum(n_i) + c_t * m * B per batch,
is compared with the same at n = m for every prompt (GRPO) and at each fixed n (plain PODS n -> m).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pods_rl.budget.ledger import LedgerSettings, PromptLedger
from pods_rl.budget.planners.auto import AutoN, AutoSettings, _theil_sen, signal_table, success_posterior

__all__ = ["costs_from_rows", "fit_sampling_cost", "project_auto"]


def fit_sampling_cost(sampled: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(S,) rollouts sampled per step, (S,) sampling seconds -> (a, b) of seconds = a + b * N: Theil-Sen (the
    planner's estimator: the median of pairwise slopes, the median residual), both clamped at 0 as the planner
    clamps them. One line of ValueError unless the steps sampled at least two distinct totals."""
    x, y = np.asarray(sampled, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if len(np.unique(x)) < 2:
        raise ValueError(f"the sampling cost a + b*N needs steps at two or more totals N, got {sorted(set(x))}: "
                         "measure two n's (pods cost --n with an n above m)")
    slope, _ = _theil_sen(x, y)
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
                 prior_strength: float | None = None) -> dict:
    """The auto planner's counts for the prompts of ``correct`` (P, k) 0/1, planned ``prompts_per_step`` (B) at a
    time (a trailing partial batch is dropped when there is a full one), on fixed costs in seconds: sampling
    ``fixed_s`` + ``sample_s`` per rollout, ``train_s`` per trained rollout (m per prompt).

    Returns ``n_mean``, ``n_min``, ``n_max``, ``n_counts`` {n: prompts}, ``frac_above_m``, ``pass_rate`` (mean),
    ``frac_all_equal`` (prompts whose k outcomes are all equal), ``signal_per_second`` {"grpo", "auto", "<n>"...}
    and ``vs_grpo`` (the same over GRPO's): the sum of the planner's signal over the batches over their seconds."""
    correct = torch.as_tensor(np.asarray(correct, dtype=np.float64))
    if correct.ndim != 2 or correct.shape[0] < 1 or correct.shape[1] < 1:
        raise ValueError(f"correct must be (prompts, samples) 0/1, got shape {tuple(correct.shape)}")
    if not 1 <= m < n or prompts_per_step < 1:
        raise ValueError(f"the projection needs 1 <= m < n and a batch of prompts, got m={m}, n={n}, "
                         f"prompts_per_step={prompts_per_step}")
    knobs = {k: v for k, v in (("efficiency", efficiency), ("prior_strength", prior_strength)) if v is not None}
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
