"""GRPO group-normalized advantages on the kept rollouts (B, m), numerically identical to TRL's. Plain torch."""

from __future__ import annotations

import math

import torch

from pods_rl.reward_checks import as_reward_tensor, check_finite


def nanstd(tensor: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """NaN-ignoring Bessel-corrected std, op for op as ``trl.trainer.utils.nanstd`` (copied: no TRL import)."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    if keepdim:
        return std
    return std.squeeze(dim) if dim is not None else std.squeeze()


_SCALES = ("group", "batch", "none")


def group_advantages(rewards, eps: float = 1e-4, scale: str | bool = "group") -> torch.Tensor:
    """GRPO group-normalized advantages of the kept rewards, numerically identical to TRL 1.16::

        A[b, i] = (r[b, i] - mean_b) / (std + eps)

    mean_b and the Bessel-corrected std ignore NaN; NaN rewards and groups of undefined std get 0; m == 1 has
    std 0, as in TRL.

    Args:
        rewards: kept rewards (B, m) or (m,), any real dtype, NaN allowed, +-inf not.
        eps: added to the std before dividing (>= 0).
        scale: the std: "group" (True), "batch" (all rewards; the mean stays per group), "none" (False).
    Returns:
        Advantages shaped like ``rewards``; its dtype if floating, else float32.
    """
    grouped, single_group, scale = _checked(rewards, eps, scale)  # (B, m)
    B, m = grouped.shape

    # Huge finite rewards (|r| ~ 1e38 in float32) overflow the squares inside the std, which then reads inf and
    # turns every advantage into a silent 0. Advantages are scale-free, so compute them on r / s (s a power of
    # two: exact) with eps / s. Below the threshold nothing changes, so TRL's numbers are reproduced bit for bit.
    peak = float(torch.nan_to_num(grouped, nan=0.0).abs().max()) if grouped.numel() else 0.0
    if peak > math.sqrt(torch.finfo(grouped.dtype).max / (4.0 * grouped.numel())):
        if scale == "none":
            raise ValueError(
                f"rewards up to {peak:.3g} overflow {grouped.dtype} in r - mean with scale='none'; rescale the "
                "rewards (or use scale='group' / 'batch', which is scale-free)"
            )
        s = 2.0 ** math.floor(math.log2(peak))
        advantages = group_advantages(grouped / s, eps=eps / s, scale=scale)
        return advantages[0] if single_group else advantages
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # (B, 1)
    if scale in ("group", "none"):  # TRL computes the group std for "none" too (logging only)
        std = nanstd(grouped, dim=1, keepdim=True) if m > 1 else torch.zeros_like(grouped)
    else:
        # TRL takes nanstd of the flat (B*m,) vector; flatten so the reduction is the same op.
        flat = grouped.reshape(-1)
        std = nanstd(flat) if flat.numel() > 1 else torch.zeros_like(flat[:1])
    advantages = grouped - mean
    if scale != "none":
        advantages = advantages / (std + eps)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    return advantages[0] if single_group else advantages


def _checked(rewards, eps, scale) -> tuple[torch.Tensor, bool, str]:
    """(rewards as a float (B, m) tensor, whether it was one group, scale as a string); ValueError if invalid."""
    rewards = as_reward_tensor(rewards)
    if rewards.dim() not in (1, 2):
        raise ValueError(
            f"rewards must have shape (m,) or (B, m), got a {rewards.dim()}-d tensor of shape "
            f"{tuple(rewards.shape)}"
        )
    if isinstance(scale, bool):
        scale = "group" if scale else "none"
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {list(_SCALES)} (or True/False), got {scale!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    single_group = rewards.dim() == 1
    grouped = rewards.unsqueeze(0) if single_group else rewards  # (B, m)
    if grouped.shape[1] == 0:
        raise ValueError(f"rewards has an empty group (shape {tuple(rewards.shape)}); need m >= 1")
    if not grouped.is_floating_point():
        grouped = grouped.float()  # TRL's rewards are float32
    check_finite(grouped, allow_nan=True)
    return grouped, single_group, scale


# Where a kept rollout's baseline comes from (PODSConfig's advantage_baseline, the asynchronous worker's
# pods_advantage_baseline): the m kept rollouts (GRPO at m, the default), or every rollout sampled for the prompt.
ADVANTAGE_BASELINES = ("kept", "sampled")


def sampled_baseline_advantages(rewards: torch.Tensor, rows, eps: float = 1e-4, scale: bool = True) -> torch.Tensor:
    """(R,) advantages of the kept ``rows`` (flat ``p * n + j``) against every sampled rollout of their prompt.

    Reinforce-Ada's ``global_stat_est``: (r - mean) [/ (std + eps) if ``scale``] over the prompt's scored rewards (P, n)
    (NaN: padding or unscored); 0 where NaN or the std is undefined, as TRL."""
    rewards = torch.as_tensor(rewards).float()
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (P, n), got {tuple(rewards.shape)}")
    n = rewards.shape[1]
    rows = torch.as_tensor(rows, dtype=torch.long)
    owner = rows // n  # (R,)
    mean = torch.nanmean(rewards, dim=1)  # (P,)
    advantages = rewards.reshape(-1)[rows] - mean[owner]
    if scale:
        advantages = advantages / (nanstd(rewards, dim=1)[owner] + eps)
    return torch.nan_to_num(advantages, nan=0.0)
