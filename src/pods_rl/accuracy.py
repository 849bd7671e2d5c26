"""The statistics of an evaluation: accuracy over k samples per problem, its standard error, and pass@k.

Pure numpy, no model: ``pods eval`` (``pods_rl.commands.evaluate``) computes each checkpoint's record with it."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["accuracy_stats", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k) for c correct of n samples, 1 <= k <= n."""
    n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # Numerically stable product form: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i).
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def accuracy_stats(correct) -> dict:
    """{"accuracy", "accuracy_stderr", "per_repeat_accuracy", "pass_at_k", "num_problems", "k"} of 0/1 (P, k).

    The standard error is over the k repeats (column j: sample j of every problem); None when k == 1."""
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
