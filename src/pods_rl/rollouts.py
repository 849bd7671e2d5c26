"""Plain helpers over one batch of rollouts as lists: tool turns, the features selection sees, prompt images."""

from __future__ import annotations

from collections.abc import Collection

import torch


def tool_turns(tool_mask: list[list[int]] | None, num_rollouts: int) -> tuple[list[int], list[int]]:
    """(tool calls, model turns) per rollout: runs of 0s (tool tokens) and 1s (model tokens) in its tool mask."""
    if tool_mask is None:
        return [0] * num_rollouts, [1] * num_rollouts
    calls, turns = [], []
    for mask in tool_mask:
        starts = [i for i, value in enumerate(mask) if i == 0 or value != mask[i - 1]]  # where each run begins
        calls.append(sum(1 for i in starts if mask[i] == 0))
        turns.append(max(1, sum(1 for i in starts if mask[i] == 1)))
    return calls, turns


def rollout_features(completion_ids: list[list[int]], num_prompts: int, *, stop_ids: Collection[int] = (),
                     tool_mask: list[list[int]] | None = None, tool_calls: list[int] | None = None,
                     turns: list[int] | None = None, rewards_per_func=None) -> dict[str, torch.Tensor]:
    """What selection may look at besides the rewards, for N = P*n rollouts listed prompt by prompt.

    ``stop_ids`` end a finished completion (others are ``truncated``); ``tool_calls``/``turns`` default to counts read
    off ``tool_mask``. Returns ``lengths`` (P, n) (model tokens); with ``rewards_per_func`` (N, F) also
    ``rewards_per_func`` (P, n, F), ``truncated``, ``tool_calls`` and ``turns`` (P, n)."""
    total = len(completion_ids)
    if num_prompts < 1 or total % num_prompts:
        raise ValueError(f"{total} rollouts do not split into {num_prompts} prompts of equal size.")
    shape = (num_prompts, total // num_prompts)
    lengths = [sum(mask) for mask in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
    features = {"lengths": torch.tensor(lengths, dtype=torch.long).view(shape)}
    if rewards_per_func is None:
        return features
    stop_ids = set(stop_ids)
    mask_calls, mask_turns = tool_turns(tool_mask, total)
    features["rewards_per_func"] = torch.as_tensor(rewards_per_func).reshape(*shape, -1)
    features["truncated"] = torch.tensor([len(ids) > 0 and ids[-1] not in stop_ids for ids in completion_ids],
                                         dtype=torch.bool).view(shape)
    features["tool_calls"] = torch.tensor(mask_calls if tool_calls is None else list(tool_calls),
                                          dtype=torch.long).view(shape)
    features["turns"] = torch.tensor(mask_turns if turns is None else list(turns), dtype=torch.long).view(shape)
    return features


def images_in_messages(prompt) -> list | None:
    """A conversational prompt's ``{"type": "image"}`` parts' images, in order; None when it has none."""
    if not isinstance(prompt, list):
        return None
    images = [part["image"] for message in prompt if isinstance(message.get("content"), list)
              for part in message["content"] if isinstance(part, dict) and part.get("type") == "image"
              and "image" in part]
    return images or None
