"""The step-cost estimator: one setting's training-step cost and its ratio to another's, from measured steps.

One estimator for every place that quotes a step cost (`pods cost`, `pods study`, the GPU preset, the results
pages). Step times have a floor and a long upper tail (on one H200, steps of 0.24-0.30 s had maxima of 0.9-3.5 s),
so a cost is the **median** after steps over ``SLOW_STEP`` x the median are set aside, its spread the IQR; warm-up
ends at the first steady step (``steady_start``); interleaved settings compare turn by turn (``paired_ratio``).

    costs = {name: summary(step_seconds) for name, step_seconds in measured.items()}  # step_seconds (S,)
    r = ratio(costs["pods"], costs["grpo"])   # {"value", "low", "high"}: medians, and quartiles crossed
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

STEADY_WINDOW = 3  # steps after a candidate first step whose median it is compared with
STEADY_TOLERANCE = 0.25  # ... it may be at most this fraction slower
MAX_EXTRA_WARMUP = 8  # warm-up steps beyond the minimum before giving up on a steady state (and saying so)
CUDA_BYTES_PER_WEIGHT_BYTE = 8  # a heuristic: weights, gradients, Adam's moments, activations, generation cache
SLOW_STEP = 2.0  # a step over this multiple of the median is an interruption: counted, not averaged in
TRUST_SPREAD = 0.25  # a setting whose interquartile range exceeds this fraction of its median is too noisy


def summary(seconds: Sequence[float], slow: float = SLOW_STEP) -> dict:
    """Robust statistics of step times (S,) seconds: steps over ``slow`` x the median are counted, left out.

    Returns {"median", "q25", "q75", "min", "max", "mean" (these three over all S), "spread" (IQR / median), "steps",
    "slow_steps"}."""
    values = np.asarray(seconds, dtype=float)  # (S,)
    if values.size == 0:
        raise ValueError("no measured steps to summarize")
    usual = values[values <= slow * np.median(values)] if np.median(values) > 0 else values  # (S',) S' >= S / 2
    q25, median, q75 = (float(q) for q in np.quantile(usual, [0.25, 0.5, 0.75]))
    return {"median": median, "q25": q25, "q75": q75, "min": float(values.min()), "max": float(values.max()),
            "mean": float(values.mean()), "spread": (q75 - q25) / median if median > 0 else 0.0,
            "steps": int(values.size), "slow_steps": int(values.size - usual.size)}


def central_steps(step_seconds: Sequence[float]) -> list[int]:
    """Indices of the middle half of the steps by time, centred on the median (no slow step moves them)."""
    order = sorted(range(len(step_seconds)), key=lambda i: step_seconds[i])
    S = len(order)
    k = S // 2 + (S - S // 2) % 2  # S - k even: as many dropped above as below
    return sorted(order[(S - k) // 2:(S - k) // 2 + k])


def phase_split(phases: dict[str, Sequence[float]], step: str = "step") -> dict[str, float]:
    """Seconds per phase (name -> (S,)) of a typical step: the median step split by the central steps' shares."""
    step_seconds = list(phases[step])
    middle = central_steps(step_seconds)
    median = summary(step_seconds)["median"]
    total = sum(step_seconds[i] for i in middle)
    scale = median / total if total > 0 else 0.0
    split = {name: scale * sum(values[i] for i in middle) for name, values in phases.items() if name != step}
    return {**split, step: median}


def ratio(setting: dict, reference: dict) -> dict:
    """{"value": median ratio, "low", "high": quartiles crossed} of two ``summary`` dicts."""
    if reference["median"] <= 0:
        return {"value": None, "low": None, "high": None}
    return {"value": setting["median"] / reference["median"],
            "low": setting["q25"] / reference["q75"] if reference["q75"] > 0 else None,
            "high": setting["q75"] / reference["q25"] if reference["q25"] > 0 else None}


def by_step(row: dict) -> dict[int, float]:
    """A `pods cost` row's measured steps: optimizer step -> seconds (its ``per_step``, warm-up left out)."""
    return {s["optimizer_step"]: s["seconds"]["step"] for s in row.get("per_step") or [] if not s["warmup"]}


def paired_ratio(setting: dict[int, float], reference: dict[int, float], slow: float = SLOW_STEP) -> dict | None:
    """Step-cost ratio from steps taken in the same turn ({step: seconds} each), so the machine's drift cancels.

    Returns {"value" (interquartile mean of the pair ratios), "low", "high", "pairs", "slow_pairs"}, or None with fewer
    than 2 usual pairs."""
    common = sorted(set(setting) & set(reference))
    if len(common) < 2:
        return None
    cut_s, cut_r = (slow * float(np.median([steps[k] for k in common])) for steps in (setting, reference))
    usual = [k for k in common if setting[k] <= cut_s and reference[k] <= cut_r and reference[k] > 0]
    if len(usual) < 2:
        return None
    ratios = np.array([setting[k] / reference[k] for k in usual])  # (P,)
    q25, q75 = (float(q) for q in np.quantile(ratios, [0.25, 0.75]))
    middle = ratios[central_steps(list(ratios))]  # (about P / 2,) the middle half, centred on the median
    return {"value": float(middle.mean()), "low": q25, "high": q75, "pairs": len(usual),
            "slow_pairs": len(common) - len(usual)}


def spread_warning(name: str, setting: dict, reference: dict, limit: float = TRUST_SPREAD) -> str | None:
    """One line when either setting's spread exceeds ``limit`` (the ratio is then not to be trusted), else None."""
    wide = [(label, s) for label, s in (("it", setting), ("the reference", reference)) if s["spread"] > limit]
    if not wide:
        return None
    said = ", ".join(f"{label} {100 * s['spread']:.0f}%" for label, s in wide)
    return (f"warning: {name}: step times spread too wide to trust its ratio (interquartile range / median: {said}, "
            f"limit {100 * limit:.0f}%); measure more steps (--steps) or on a quieter machine")


def steady_start(seconds: Sequence[float], min_warmup: int = 1, window: int = STEADY_WINDOW,
                 tolerance: float = STEADY_TOLERANCE, max_extra: int = MAX_EXTRA_WARMUP) -> int | None:
    """Index of the first measured step: the first ``s >= min_warmup`` that is ``steady``, of times (T,).

    None while too few steps; ``min_warmup + max_extra`` when none settled by then."""
    last = min_warmup + max_extra
    for s in range(min_warmup, last):
        if len(seconds) < s + 1 + max(1, window):
            return None
        if steady(seconds, s, window, tolerance):
            return s
    return last


def steady(seconds: Sequence[float], start: int, window: int = STEADY_WINDOW,
           tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether step ``start`` takes at most ``1 + tolerance`` times the median of the ``window`` steps after it."""
    after = seconds[start + 1:start + 1 + max(1, window)]
    return len(after) > 0 and seconds[start] <= (1 + tolerance) * float(np.median(after))


def window_for(steps: int) -> int:
    """``STEADY_WINDOW``, or fewer for few ``steps``, so finding the warm-up's end takes no extra steps."""
    return max(1, min(STEADY_WINDOW, steps - 1))


def enough_steps(seconds: Sequence[float], steps: int, min_warmup: int = 1) -> bool:
    """Whether a setting has taken its warm-up and ``steps`` measured steps (so it can stop)."""
    start = steady_start(seconds, min_warmup, window_for(steps))
    return start is not None and len(seconds) >= start + max(steps, 1 + window_for(steps))


def fits_together(setting_bytes: Sequence[int], free_bytes: int, headroom: float = 0.6) -> bool:
    """Whether the settings' ``setting_bytes`` fit in ``headroom`` of ``free_bytes`` at once (then interleave)."""
    return sum(setting_bytes) <= headroom * free_bytes


def stop_when_measured(steps: int, warmup: int):
    """A TrainerCallback that stops training after the warm-up (``steady_start``) and ``steps`` measured steps."""
    from transformers import TrainerCallback

    class StopWhenMeasured(TrainerCallback):
        def __init__(self):
            self.seconds = []  # (T,) every step's time/step so far

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "time/step" in logs:
                self.seconds.append(float(logs["time/step"]))
                if enough_steps(self.seconds, steps, warmup):
                    control.should_training_stop = True

    return StopWhenMeasured()


def cuda_fits_together(trainer, count: int) -> bool:
    """Whether ``count`` trainers like the built ``trainer`` fit on its GPU (weights x CUDA_BYTES_PER_WEIGHT_BYTE)."""
    import torch

    device = trainer.accelerator.device
    weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    free, _ = torch.cuda.mem_get_info(device)
    return fits_together([weights * CUDA_BYTES_PER_WEIGHT_BYTE] * count, free + weights)
