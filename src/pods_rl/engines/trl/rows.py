"""TRL's per-rollout data by row, for any subset of the rows (``Generated``, ``log_extra`` columns, the rounds' slots):
the step samples P*n rollouts but hands TRL the B*m it keeps, so whatever TRL keeps per rollout is cut to the kept
rows. No trainer here: ``adapter.py`` holds its state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from pods_rl.rollouts import images_in_messages


class Generated(NamedTuple):
    """``GRPOTrainer._generate``'s 8-tuple by name (TRL unpacks it as its own): per-rollout lists, Nones where a
    feature is off, ``extra_fields`` per-rollout or per-batch."""

    prompt_ids: list
    completion_ids: list
    tool_mask: list | None
    completions: list
    logprobs: list | None
    extra_fields: dict | None
    images: list | None
    tool_images: list | None


@dataclass(eq=False)
class Sampled:
    """This process's sampled P*n rows (prompt p's from p*n; past ``counts[p]``, copies selection never sees)."""

    generated: Generated  # GRPOTrainer._generate's tuple, P*n rows
    rewards_per_func: torch.Tensor  # (P*n, F) this process's, NaN on the copies
    counts: torch.Tensor  # (P,) n for every prompt without pilot_generations, else m..n
    extra_logs: dict[str, list]  # the reward functions' log_extra columns, a value per row
    user_metrics: bool  # a reward function called log_metric (with a name of its own, not pods/*)
    trainable: torch.Tensor | None = None  # (P,) bool: the prompts that may train (Pilot-Commit's committed); None: all


class Scored(NamedTuple):
    """One ``_generate`` + ``_calculate_rewards`` over some rows, what TRL buffered per rollout taken out."""

    generated: Generated
    gathered_rewards: torch.Tensor  # (rows*processes, F) every process's rewards per function, as TRL returns them
    extra_logs: dict[str, list]  # the reward functions' log_extra columns, a value per row
    user_metrics: bool  # a reward function called log_metric (with a name of its own, not pods/*)


def select_rows(generated: tuple, rows: list[int], num_rows: int) -> Generated:
    """Keep ``rows`` of every per-rollout entry of ``GRPOTrainer._generate``'s output tuple (``num_rows`` rows)."""

    def pick(value):
        if isinstance(value, list) and len(value) == num_rows:
            return [value[i] for i in rows]
        if isinstance(value, dict):
            return {k: pick(v) for k, v in value.items()}
        return value  # None, or a per-batch scalar

    return Generated(*(pick(value) for value in generated))


def with_dataset_images(generated: Generated, prompts: list, rows: list[int]) -> Generated:
    """The kept rows' tuple, with the dataset's images when ``images`` is None (after a ``rollout_func``)."""
    if generated.images is not None:
        return generated
    images = [images_in_messages(prompts[i]) for i in rows]
    if not any(images):
        return generated
    return generated._replace(images=images)


def arrange_rounds(outputs: list[tuple], slots: list[list[int]], num_prompts: int, n: int) -> Generated:
    """The rounds' ``_generate`` tuples merged into P*n rows: slot ``slots[r][i]`` holds round r's i-th row (padding
    dropped); an unfilled slot copies its prompt's first rollout (or the first of all); per-batch values: round 0's."""
    rows_per_round = [len(round_slots) for round_slots in slots]
    empty = object()

    def merge(values):
        if isinstance(values[0], dict):
            return {key: merge([v[key] for v in values]) for key in values[0]}
        per_rollout = all(isinstance(v, list) and len(v) >= rows for v, rows in zip(values, rows_per_round))
        if not per_rollout or len(values[0]) == 0:
            return values[0]  # None, or a per-batch value (e.g. TRL's empty tool_images without tools)
        merged = [empty] * (num_prompts * n)
        for value, round_slots in zip(values, slots):
            for i, slot in enumerate(round_slots):
                merged[slot] = value[i]
        filler = merged[min(s for round_slots in slots for s in round_slots)]
        first = [merged[p * n] if merged[p * n] is not empty else filler for p in range(num_prompts)]
        return [first[slot // n] if value is empty else value for slot, value in enumerate(merged)]

    return Generated(*(merge([output[i] for output in outputs]) for i in range(len(outputs[0]))))


def write_extra_fields(inputs: list[dict], extra_fields: dict | None) -> None:
    """Write a rollout_func's extra fields (per-rollout lists or per-batch values) into the rows of ``inputs``."""
    for key, values in (extra_fields or {}).items():
        for i, row in enumerate(inputs):
            row[key] = values[i] if isinstance(values, list) else values


# ---- log_extra: the completions table's extra columns, one value per row ---------------------------------------


def place_extra_logs(columns_by_round: list[dict[str, list]], slots: list[list[int]], num_rows: int) -> dict:
    """Each round's ``log_extra`` columns placed at its rows' slots of the P*n; None where nothing was logged."""
    placed = defaultdict(lambda: [None] * num_rows)
    for columns, round_slots in zip(columns_by_round, slots, strict=True):
        for column, values in columns.items():
            for slot, value in zip(round_slots, values):
                placed[column][slot] = value
    return dict(placed)


def keep_extra_logs(columns: dict[str, list], rows: list[int]) -> defaultdict:
    """The kept rows' values of every column, as TRL's ``_pending_extra_logs`` holds them."""
    return defaultdict(list, {column: [values[i] for i in rows] for column, values in columns.items()})


def tool_calls_and_failures(completions: list, tool_names: list[set], max_iterations: int,
                            raised: list[int]) -> tuple[list[int], list[int]]:
    """Each rollout's tool calls and failures as TRL's loop counts them (first ``max_iterations`` assistant turns);
    a call fails when unknown, not a function call, or raised (``raised``)."""
    calls, failures = [0] * len(completions), list(raised)
    for i, completion in enumerate(completions):
        if not isinstance(completion, list):
            continue
        turns = [m for m in completion if isinstance(m, dict) and m.get("role") == "assistant"][:max_iterations]
        for message in turns:
            for call in message.get("tool_calls") or []:
                calls[i] += 1
                function = call.get("function") or {}
                if call.get("type") != "function" or function.get("name") not in tool_names[i]:
                    failures[i] += 1
    return calls, failures


# ---- answer rounds' padding rows: a prompt that stops at k < m trains with m - k of them masked out of the loss, as
# the planner's released code pads (one that stops above m is down-sampled to m by PODS's rule) --------------------


def padded_kept_rows(kept: torch.Tensor, groups: torch.Tensor, n: int) -> tuple[list[int], list[bool]]:
    """Selection's kept rollouts (P, m) (-1: a prompt with fewer than m) of the kept ``groups`` (B,) -> B*m rows
    p*n + j, a short group filled with its unused slots (copies with NaN rewards), and which rows are padding."""
    kept = kept[groups]  # (B, m)
    m = kept.shape[1]
    columns = torch.where(kept >= 0, kept, torch.arange(m).expand_as(kept))
    rows = groups.unsqueeze(1) * n + columns  # (B, m)
    return rows.flatten().tolist(), (kept < 0).flatten().tolist()


def mask_padding(output: dict, padded: list[bool], gather: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Take the padding rows (B*m,) out of TRL's batch ``output``: their completion tokens out of the loss mask and of
    ``num_items_in_batch`` (every process's). A collective. Returns the padding rows' share of the kept rows."""
    mask = output["completion_mask"]
    padding = torch.tensor(padded, dtype=torch.bool, device=mask.device)
    loss_mask = mask if output.get("tool_mask") is None else mask * output["tool_mask"]
    tokens = loss_mask[padding].sum().reshape(1).to(output["num_items_in_batch"].dtype) if len(padded) else \
        torch.zeros(1, dtype=output["num_items_in_batch"].dtype, device=mask.device)
    mask[padding] = 0
    output["num_items_in_batch"] = output["num_items_in_batch"] - gather(tokens).sum().to(
        output["num_items_in_batch"].device)
    return float(padding.double().mean()) if len(padded) else 0.0
