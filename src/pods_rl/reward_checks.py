"""Checks of reward tensors shared by the down-sampling rules and the advantages: one-line ValueErrors that name the bad
groups and the fix. Plain torch (core: imports nothing of ours)."""

from __future__ import annotations

import torch


def as_reward_tensor(rewards, what: str = "rewards") -> torch.Tensor:
    """torch.as_tensor with a clear error; rejects complex and non-numeric input."""
    try:
        tensor = torch.as_tensor(rewards)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"{what} must be a tensor (or nested list/array) of numbers of shape (n,) or (B, n): {err}"
        ) from None
    if tensor.is_complex():
        raise ValueError(f"{what} must be real numbers, got dtype {tensor.dtype}")
    return tensor


def group_list(bad_rows: torch.Tensor) -> list[int]:
    """Row indices where ``bad_rows`` (B,) is True, as a short Python list for error messages."""
    rows = torch.nonzero(bad_rows).flatten().tolist()
    return rows if len(rows) <= 20 else rows[:20] + ["..."]


def check_finite(rewards: torch.Tensor, allow_nan: bool = False) -> None:
    """Raise ValueError naming the groups (rows of a (B, n) tensor) that hold NaN or +-inf."""
    if not rewards.is_floating_point():
        return
    # Fast path: one whole-tensor reduction; the per-group ones below only run to word an error.
    if bool(torch.isfinite(rewards).all()) or (allow_nan and not bool(torch.isinf(rewards).any())):
        return
    if not allow_nan:
        nan_rows = torch.isnan(rewards).any(dim=1)
        if bool(nan_rows.any()):
            raise ValueError(
                f"rewards contain NaN in group(s) {group_list(nan_rows)}; score every rollout with a finite "
                "reward (e.g. 0 for unscorable completions) or drop those groups before down-sampling"
            )
    inf_rows = torch.isinf(rewards).any(dim=1)
    if bool(inf_rows.any()):
        raise ValueError(
            f"rewards contain infinite values in group(s) {group_list(inf_rows)}; clip or replace them "
            "with finite rewards"
        )


def check_finite_or_defer(checks: list | None, rewards: torch.Tensor) -> None:
    """Check that ``rewards`` are finite now (``checks`` None) or append the answer, a 0-d bool tensor on their
    device, to ``checks`` without reading it (no host synchronization)."""
    if checks is None:
        check_finite(rewards)
    else:
        checks.append(torch.isfinite(rewards).all())


def raise_unless_ok(ok: torch.Tensor, rewards) -> None:
    """Read the flag ``pods_rl.downsample.downsample_deferred`` returned (one host synchronization on CUDA) and,
    if it is False, raise the ValueError ``downsample`` would have raised for ``rewards``: the groups with NaN or
    +-inf, or else too wide a spread for a float64 variance."""
    if bool(ok):
        return
    grouped = as_reward_tensor(rewards)
    check_finite(grouped.reshape(-1, grouped.shape[-1]))
    raise ValueError("rewards spread too wide (max - min > ~1e150) for a float64 variance; rescale them")
