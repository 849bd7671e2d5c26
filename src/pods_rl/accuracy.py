"""The statistics of an evaluation: accuracy over k samples per problem, its standard error, and pass@k.

Pure numpy, no model: ``pods eval`` (``pods_rl.commands.evaluate``) computes each checkpoint's record with it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["accuracy_stats", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k).

    Args:
        n: samples drawn for the problem.
        c: how many of them are correct (0 <= c <= n).
        k: budget (1 <= k <= n).
    Returns the probability that at least one of k samples drawn without replacement from the n is correct.
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # Numerically stable product form: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i).
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def accuracy_stats(correct) -> dict:
    """Accuracy statistics of a (num_problems, k) array of 0/1 (or bool) sample outcomes.

    Returns {"accuracy", "accuracy_stderr", "per_repeat_accuracy" (list of k), "pass_at_k", "num_problems",
    "k"}. The standard error is taken over the k repeats (column j = sample j of every problem):
    std(per-repeat accuracies, ddof=1) / sqrt(k); it is None when k == 1.
    """
    correct = np.asarray(correct, dtype=float)  # (P, k)
    if correct.ndim != 2 or correct.shape[0] < 1 or correct.shape[1] < 1:
        raise ValueError(f"correct must be a non-empty 2-D array (num_problems, k), got shape {correct.shape}")
    if not np.all((correct == 0) | (correct == 1)):
        raise ValueError("correct must hold only 0/1 (or booleans)")
    num_problems, k = correct.shape
    per_repeat = correct.mean(axis=0)  # (k,)
    stderr = float(per_repeat.std(ddof=1) / math.sqrt(k)) if k > 1 else None
    num_correct = correct.sum(axis=1).astype(int)  # (P,)
    return {
        "accuracy": float(correct.mean()),
        "accuracy_stderr": stderr,
        "per_repeat_accuracy": [float(a) for a in per_repeat],
        "pass_at_k": float(np.mean([pass_at_k(k, c, k) for c in num_correct])),
        "num_problems": int(num_problems),
        "k": int(k),
    }
