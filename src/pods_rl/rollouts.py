"""Plain helpers over one batch of rollouts as lists (no framework): what a multi-turn rollout holds, and the
images of a conversational prompt.

    tool_turns(tool_mask)      -> (tool calls, model turns) per rollout, from a 1/0 mask of model/tool tokens
    images_in_messages(prompt) -> the images a conversational prompt carries, in order
"""

from __future__ import annotations


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


def images_in_messages(prompt) -> list | None:
    """The images of a conversational prompt whose messages carry them as ``{"type": "image", "image": ...}``
    parts (as TRL's ``prepare_multimodal_messages`` writes them); None when it has none (or is plain text)."""
    if not isinstance(prompt, list):
        return None
    images = [part["image"] for message in prompt if isinstance(message.get("content"), list)
              for part in message["content"] if isinstance(part, dict) and part.get("type") == "image"
              and "image" in part]
    return images or None
