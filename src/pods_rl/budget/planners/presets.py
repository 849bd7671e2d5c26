"""Named presets: a published method expressed as settings of what pods-rl already has.

``dapo``: DAPO's dynamic sampling (Yu et al. 2025; verl's ``recipe/dapo``): sample 3x the prompts, keep every
rollout, train on the groups whose rewards vary; in pods-rl ``oversample_prompts=3`` with ``downsample_to =
num_generations``. ``dapo_keep_groups`` is DAPO's own filter, the reference the preset is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["PRESETS", "Preset", "available_presets", "dapo_keep_groups", "preset"]


@dataclass(frozen=True)
class Preset:
    """A method as settings: ``overrides`` are ``PODSConfig`` fields (``"num_generations"`` as a value stands for
    the run's n); ``differences`` says where the preset is not the method."""

    name: str
    description: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    differences: str = ""


PRESETS: dict[str, Preset] = {
    "dapo": Preset(
        name="dapo",
        description="DAPO's dynamic sampling: 3x the prompts, all n rollouts kept, groups whose rewards vary trained",
        overrides={"oversample_prompts": 3.0, "downsample_to": "num_generations"},
        differences=("DAPO keeps the first B groups with varying rewards in sampling order, pods-rl the B whose "
                     "rewards vary most (both drop all-equal groups first); with fewer than B varying groups DAPO "
                     "samples another batch (up to max_num_gen_batches=10), pods-rl trains on all-equal groups in "
                     "the free places (advantage 0: no gradient). DAPO's other parts (clip-higher, token-level "
                     "loss, overlong shaping) are not sampling and are not in the preset."),
    ),
}


def available_presets() -> list[str]:
    """Names of the presets, sorted."""
    return sorted(PRESETS)


def preset(name: str, *, num_generations: int) -> dict[str, Any]:
    """The ``PODSConfig`` field overrides of preset ``name`` for a run of ``num_generations`` rollouts per prompt."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available presets: {available_presets()}")
    return {key: num_generations if value == "num_generations" else value
            for key, value in PRESETS[name].overrides.items()}


def dapo_keep_groups(rewards, num_groups: int) -> torch.Tensor:
    """DAPO's dynamic-sampling filter on one generation batch: the prompts whose rewards are not all equal (the
    recipe's ``np.std(metric) > 0``), the first ``num_groups`` of them in order. rewards (P, n) -> (K,) int64,
    K <= num_groups (fewer: DAPO would sample another batch)."""
    rewards = torch.as_tensor(rewards)
    varies = rewards.amax(dim=1) > rewards.amin(dim=1)
    return torch.nonzero(varies).flatten()[:num_groups]
