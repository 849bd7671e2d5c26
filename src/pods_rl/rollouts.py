"""Plain helpers over one batch of rollouts as lists (no trainer framework): what a multi-turn rollout holds, what
selection may look at besides the rewards, and the images of a conversational prompt.

    tool_turns(tool_mask)        -> (tool calls, model turns) per rollout, from a 1/0 mask of model/tool tokens
    rollout_features(ids, P ...) -> what a rule or tiebreak sees besides the rewards, each (P, n): one builder for
                                    the synchronous trainer (TRL's ``_generate`` outputs) and the asynchronous
                                    worker (a ``RolloutGroup``'s lists)
    images_in_messages(prompt)   -> the images a conversational prompt carries, in order
"""

from __future__ import annotations

from collections.abc import Collection

import torch


def tool_turns(tool_mask: list[list[int]] | None, num_rollouts: int) -> tuple[list[int], list[int]]:
    """Tool calls and model turns of each rollout, read off its tool mask.

    ``tool_mask``: per rollout, one entry per completion token: 1 for a token the model generated, 0 for a token
    a tool (or environment) inserted. Each run of 0s is one tool result, so one tool call; each run of 1s is one
    model turn. ``None`` (no tools): every rollout is one turn without tool calls. Returns two lists of
    ``num_rollouts`` ints.
    """
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

    Args:
        completion_ids: per rollout, its completion's token ids (N lists).
        num_prompts: P; N must be a multiple of it (n = N / P rollouts per prompt).
        stop_ids: the ids a finished completion ends on (every eos id, and the pad id): a non-empty one ending on
            anything else hit the length cap (``truncated``, as TRL's ``completions/clipped_ratio``).
        tool_mask: per rollout, 1 per token the model generated, 0 per token a tool inserted (TRL's ``_generate``
            with tools); None: every completion token is the model's.
        tool_calls: per rollout, tool calls made, where the caller counts them itself (the asynchronous worker:
            ``RolloutGroup.tool_call_counts``); None: read off ``tool_mask`` (``tool_turns``: 0 without one).
        turns: per rollout, model turns, where the caller counts them itself (the asynchronous worker: assistant
            messages); None: read off ``tool_mask`` (1 without one).
        rewards_per_func: (N, F) or (P, n, F) each reward function's reward. Pass it for a rule that takes features
            (``pods_rl.downsample.rule_takes_features``); None: only the ``lengths`` the tiebreaks read.

    Returns ``lengths`` (P, n) int64, the tokens the model generated (tool results excluded); with
    ``rewards_per_func`` also ``rewards_per_func`` (P, n, F), ``truncated`` (P, n) bool, ``tool_calls`` and
    ``turns`` (P, n) int64.
    """
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
    """The images of a conversational prompt whose messages carry them as ``{"type": "image", "image": ...}``
    parts (as TRL's ``prepare_multimodal_messages`` writes them); None when it has none (or is plain text)."""
    if not isinstance(prompt, list):
        return None
    images = [part["image"] for message in prompt if isinstance(message.get("content"), list)
              for part in message["content"] if isinstance(part, dict) and part.get("type") == "image"
              and "image" in part]
    return images or None
