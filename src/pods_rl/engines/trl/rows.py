"""TRL's per-rollout data by row, for any subset of the rows: ``GRPOTrainer._generate``'s tuple (``Generated``), the
``log_extra`` columns and ``log_metric`` values, and the generation metrics TRL computes from them. The PODS step
samples P*n rollouts but hands TRL the B*m it keeps, so whatever TRL keeps per rollout is cut to the kept rows.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from typing import NamedTuple

import torch
from packaging.version import Version

from pods_rl.rollouts import images_in_messages

# TRL 1.15 keeps the generation config's EOS ids beside the tokenizer's (GRPOTrainer.eos_token_ids) and counts a
# completion ending in any of them as terminated; earlier ones know only the tokenizer's. tests/test_trl_surface.py
# pins both sides of the line.
TRL_KEEPS_EOS_TOKEN_IDS = Version(version("trl")) >= Version("1.15")


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
    """A process's sampled P*n rows (prompt p's from p*n; past ``counts[p]``, copies selection never sees)."""

    generated: Generated  # GRPOTrainer._generate's tuple, P*n rows
    rewards_per_func: torch.Tensor  # (P*n*processes, F) gathered, NaN on the copies
    counts: torch.Tensor  # (P,) n for every prompt without pilot_generations, else m..n
    extra_logs: dict[str, list]  # the reward functions' log_extra columns, a value per row
    user_metrics: bool  # a reward function called log_metric (with a name of its own, not pods/*)
    trainable: torch.Tensor | None = None  # (P,) bool: the prompts that may train (Pilot-Commit's committed); None: all


class Scored(NamedTuple):
    """One ``_generate`` + ``_calculate_rewards`` over some rows, what TRL buffered per rollout taken out."""

    generated: Generated
    rewards_per_func: torch.Tensor  # (rows*processes, F) gathered
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

def take_extra_logs(trainer, num_rows: int) -> dict[str, list]:
    """The ``log_extra`` columns of the last scoring call (TRL's ``_pending_extra_logs``, emptied), one value per row;
    a column of another length is refused (TRL would misalign it)."""
    pending = trainer._pending_extra_logs
    columns = {column: list(values) for column, values in pending.items()}
    pending.clear()
    for column, values in columns.items():
        if len(values) != num_rows:
            raise ValueError(f"a reward function logged {len(values)} values in the log_extra column {column!r} for "
                             f"{num_rows} completions: log_extra takes one value per completion it was given, in "
                             "their order.")
    return columns


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


@contextmanager
def metrics_logged(trainer):
    """The block's ``log_metric`` values, yielded as {name: [values]}; TRL's ``_pending_metrics`` restored after."""
    pending = trainer._pending_metrics
    before = {name: list(values) for name, values in pending.items()}
    pending.clear()
    logged: dict[str, list] = {}
    try:
        yield logged
    finally:
        logged.update({name: list(values) for name, values in pending.items()})
        pending.clear()
        for name, values in before.items():
            pending[name].extend(values)


def put_back_metrics(trainer, logged: dict[str, list], owned: bool) -> None:
    """Put back into TRL's buffer ``logged``'s ``pods/*`` values when ``owned``, else the reward functions' own."""
    for name, values in logged.items():
        if name.startswith("pods/") == owned:
            trainer._pending_metrics[name].extend(values)


# ---- the generation metrics TRL's `_generate` logs, for the rows TRL trains on ------------------------------------

@contextmanager
def generation_metrics_dropped(trainer):
    """Undo what ``GRPOTrainer._generate`` logs of the rollouts generated in the block (tokens, lengths, clipped
    ratio, tool use): they are all sampled ones; ``log_generation_metrics`` logs the kept rows' instead."""
    metrics = trainer._metrics["train"]
    lengths = {key: len(values) for key, values in metrics.items()}
    num_tokens = list(metrics["num_tokens"]) if "num_tokens" in metrics else None
    seen = trainer.state.num_input_tokens_seen
    try:
        yield
    finally:
        for key in list(metrics):
            if key not in lengths:
                del metrics[key]
            else:
                del metrics[key][lengths[key]:]
        if num_tokens is not None:
            metrics["num_tokens"] = num_tokens
        trainer.state.num_input_tokens_seen = seen


def eos_token_ids(trainer) -> list[int]:
    """The token ids TRL counts as a completion's end (besides padding) in its clipped ratio, as this TRL does."""
    if TRL_KEEPS_EOS_TOKEN_IDS:
        return list(trainer.eos_token_ids)
    return [trainer._tokenizer.eos_token_id]


def count_tool_exceptions(trainer, num_rows: int) -> list[int]:
    """Wrap each rollout's tools (TRL's per-rollout tool dicts) to count raised calls; returns the live counts
    (``num_rows``,). A rollout's messages lose the error when TRL rolls an overflowing result back."""
    raised = [0] * num_rows

    def counted(tool, row):
        if inspect.iscoroutinefunction(tool):
            async def counted_async(*args, **kwargs):
                try:
                    return await tool(*args, **kwargs)
                except Exception:
                    raised[row] += 1
                    raise
            return functools.wraps(tool)(counted_async)

        def counted_sync(*args, **kwargs):
            try:
                return tool(*args, **kwargs)
            except Exception:
                raised[row] += 1
                raise
        return functools.wraps(tool)(counted_sync)

    for dicts in (trainer._sync_tool_dicts, trainer._async_tool_dicts):
        for row, tools in enumerate(dicts):
            for name, tool in list(tools.items()):
                tools[name] = counted(tool, row)
    return raised


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


def log_generation_metrics(trainer, generated: Generated, tool_calls: list[int] | None = None,
                           tool_failures: list[int] | None = None) -> None:
    """Log for ``generated``'s rows (gathered here) what ``GRPOTrainer._generate`` logs, as TRL computes it:
    ``num_tokens``, ``completions/*`` lengths and clipped ratio, and with tools ``tools/*`` frequencies."""
    gather = trainer.accelerator.gather
    device = trainer.accelerator.device
    metrics = trainer._metrics["train"]
    prompt_ids, completion_ids, tool_mask = generated.prompt_ids, generated.completion_ids, generated.tool_mask
    prompt_lengths = gather(torch.tensor([len(ids) for ids in prompt_ids], device=device))
    if tool_mask is not None:  # only the tokens the model generated
        completion_lengths = torch.tensor([sum(mask) for mask in tool_mask], device=device)
    else:
        completion_lengths = torch.tensor([len(ids) for ids in completion_ids], device=device)
    completion_lengths = gather(completion_lengths)
    trainer.state.num_input_tokens_seen += (prompt_lengths.sum() + completion_lengths.sum()).item()
    metrics["num_tokens"] = [trainer.state.num_input_tokens_seen]
    metrics["completions/mean_length"].append(completion_lengths.float().mean().item())
    metrics["completions/min_length"].append(completion_lengths.float().min().item())
    metrics["completions/max_length"].append(completion_lengths.float().max().item())
    eos_and_pad = [*eos_token_ids(trainer), trainer._tokenizer.pad_token_id]
    truncated = gather(torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids], device=device))
    metrics["completions/clipped_ratio"].append(truncated.float().mean().item())
    terminated = completion_lengths[~truncated]
    if len(terminated) == 0:  # as TRL: no completion ended
        terminated = torch.zeros(1, device=device)
    metrics["completions/mean_terminated_length"].append(terminated.float().mean().item())
    metrics["completions/min_terminated_length"].append(terminated.float().min().item())
    metrics["completions/max_terminated_length"].append(terminated.float().max().item())
    if trainer.tools:
        total_calls = gather(torch.tensor(sum(tool_calls), device=device)).sum()
        total_failures = gather(torch.tensor(sum(tool_failures), device=device)).sum()
        metrics["tools/call_frequency"].append((total_calls / len(prompt_lengths)).item())
        metrics["tools/failure_frequency"].append(
            (total_failures / total_calls).item() if total_calls > 0 else 0.0)


# ---- the per-rollout state TRL prepared for the batch (environments, tool dicts), for a round's rows ---------------

ROLLOUT_STATE = ("environments", "_batch_environments", "_sync_tool_dicts", "_async_tool_dicts")


@contextmanager
def batch_rollout_state(trainer):
    """The batch's per-rollout state as TRL prepared it ({name: per-row list}), yielded and restored on leaving."""
    batch = {name: getattr(trainer, name) for name in ROLLOUT_STATE if getattr(trainer, name, None) is not None}
    try:
        yield batch
    finally:
        for name, values in batch.items():
            setattr(trainer, name, values)


@contextmanager
def round_rollout_state(trainer, batch: dict, slots: list[int], padding: int, inputs: list[dict], prompts: list,
                        prepare_prompts: Callable[[list[dict]], list]):
    """Yields the round's rows (``slots``, then ``padding`` throw-away rows) and prompts, with TRL's per-rollout
    state set so each row's tools reach its slot's environment. Padding rows repeat the first prompt, prepared
    by TRL (``prepare_prompts``) with fresh environment instances."""
    rows = [dict(inputs[i]) for i in slots]
    texts = [prompts[i] for i in slots]
    padded = {name: [] for name in batch}
    if padding:
        pad_inputs = [dict(inputs[0]) for _ in range(padding)]
        if batch:  # tools or environments
            pool = getattr(trainer, "_environment_pool", None)
            if pool is not None:  # TRL creates (and resets) a fresh instance for each padding row
                trainer._environment_pool = {name: [] for name in pool}
            try:
                texts += prepare_prompts(pad_inputs)
            finally:
                if pool is not None:
                    trainer._environment_pool = pool
            padded = {name: list(getattr(trainer, name)) for name in batch}
        else:
            texts += [prompts[0]] * padding
        rows += pad_inputs
    for name, values in batch.items():
        setattr(trainer, name, [values[i] for i in slots] + padded[name])
    yield rows, texts
