"""The line an ``auto`` run ends with: what auto chose (its ``pods/auto_*`` rows), on which costs, and what it would
choose at one H200's measured costs on the run's last pass rates (its ledger)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners.auto import AutoN, AutoSettings

__all__ = ["H200_COSTS_MS", "WARMUP_UPDATES", "auto_choices", "auto_line", "would_choose"]

# One H200, measured by `pods cost` (shared gpu-results 2026-11-28): c0, c_s per sampled and c_t per trained rollout
H200_COSTS_MS = {"fixed_ms": 202.0, "sample_ms": 0.056, "train_ms": 0.526}
WARMUP_UPDATES = 50  # the first updates (cost window filling, probes) are not what auto settles on


def auto_choices(rows: Sequence[dict], *, m: int, warmup: int = WARMUP_UPDATES) -> dict | None:
    """Metrics rows -> ``n_mean`` of ``pods/auto_n_mean`` after ``warmup`` updates (all rows if shorter), its
    ``share_at_m``, ``probes``, the last costs (``fixed_ms``, ``sample_ms``, ``train_ms``); None without auto."""
    auto = [r for r in rows if "pods/auto_n_mean" in r and math.isfinite(r["pods/auto_n_mean"])]
    if not auto:
        return None
    settled = [r for r in auto if r.get("step", 0) > warmup] or auto
    means = [r["pods/auto_n_mean"] for r in settled]
    costs = next((r for r in reversed(auto) if "pods/auto_sample_ms" in r), {})
    return {"n_mean": sum(means) / len(means), "share_at_m": sum(abs(x - m) < 1e-9 for x in means) / len(means),
            "rows": len(settled), "after_update": warmup if len(settled) < len(auto) else 0,
            "probes": auto[-1].get("pods/auto_probes", 0.0),
            **{key: costs.get(f"pods/auto_{key}") for key in ("fixed_ms", "sample_ms", "train_ms")}}


def would_choose(ledger: PromptLedger, *, m: int, n: int, prompts_per_step: int, costs_ms: dict) -> float | None:
    """The mean n auto plans for every prompt of ``ledger`` (its pass rates as they are now), ``prompts_per_step`` at
    a time, at the fixed costs ``costs_ms`` (``fixed_ms``, ``sample_ms``, ``train_ms``); None for an empty ledger."""
    ids = ledger.ids  # (N,)
    if len(ids) == 0 or prompts_per_step < 1:
        return None
    planner = AutoN(AutoSettings(min_n=m, max_n=n, **costs_ms))
    counts = [planner.plan(ids[start:start + prompts_per_step], ledger, n=n, m=m).rollouts
              for start in range(0, len(ids), prompts_per_step)]  # each (B,), 0 where evicted
    planned = torch.cat(counts)
    planned = planned[planned > 0].double()
    return float(planned.mean()) if len(planned) else None


def auto_line(choices: dict, *, m: int, n: int, at_h200: float | None) -> str:
    """One line: auto's mean n (m..n), the costs it measured (c_s / c_t: what decides), and ``at_h200``'s mean n."""
    when = f"after update {choices['after_update']}" if choices["after_update"] else "over the run"
    line = (f"auto chose n = {choices['n_mean']:.1f} on average {when} (m = {m}, up to n = {n}; "
            f"{100 * choices['share_at_m']:.0f}% of logged steps at m)")
    sample, train, fixed = choices["sample_ms"], choices["train_ms"], choices["fixed_ms"]
    if None not in (sample, train, fixed):
        ratio = sample / train if train else float("inf")
        line += (f", planning on {fixed:.0f} ms a step + {sample:.3g} ms per sampled and {train:.3g} ms per trained "
                 f"rollout (c_s/c_t {ratio:.2f}): ")
        line += ("it predicted that more rollouts would not pay here" if choices["n_mean"] < m + 0.5 else
                 "it predicted that more rollouts would pay here")
    if at_h200 is not None:
        h = H200_COSTS_MS
        line += (f"; at one H200's measured costs ({h['fixed_ms']:.0f} ms + {h['sample_ms']} / {h['train_ms']} ms) it "
                 f"would choose n = {at_h200:.1f} on this run's last pass rates")
    return line
