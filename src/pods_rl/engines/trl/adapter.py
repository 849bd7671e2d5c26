"""The GRPOTrainer state the PODS step reads and swaps, written only here: each private name of TRL's used here is
pinned by ``tests/test_trl_surface.py`` (``ADAPTER_PRIVATE_NAMES``), each swap a named context manager that says why."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import contextmanager
from importlib.metadata import version

import torch
from packaging.version import Version

from pods_rl.engines.trl.config import TRL_RANGE
from pods_rl.engines.trl.rows import Generated

# TRL 1.15 keeps the generation config's EOS ids beside the tokenizer's (GRPOTrainer.eos_token_ids) and counts a
# completion ending in any of them as terminated; earlier ones know only the tokenizer's. tests/test_trl_surface.py
# pins both sides of the line.
TRL_KEEPS_EOS_TOKEN_IDS = Version(version("trl")) >= Version("1.15")


# ---- TRL's step entered on rows PODS chose: where TRL has no hook (docs/guides/trl.md, "What TRL would need") ------

def trl_step_on(trainer, trl_step: Callable[[list[dict]], dict], inputs: list[dict], generate: Callable,
                calculate_rewards: Callable | None = None) -> dict:
    """``trl_step`` (GRPOTrainer's ``_generate_and_score_completions``) on ``inputs``, its ``_generate`` and
    ``_calculate_rewards`` calls answered by the callables given: TRL's batch, built on rollouts PODS already has."""
    # Instance attributes for the call, which is how TRL's `self._generate(...)` reaches them; a wrapper already set
    # on the instance (tests set them) is put back after.
    answers = {"_generate": generate, "_calculate_rewards": calculate_rewards}
    answers = {name: answer for name, answer in answers.items() if answer is not None}
    before = {name: vars(trainer)[name] for name in answers if name in vars(trainer)}
    vars(trainer).update(answers)
    try:
        return trl_step(inputs)
    finally:
        for name in answers:
            vars(trainer).pop(name, None)
        vars(trainer).update(before)


class _PromptsPrepared(BaseException):  # noqa: N818 - a signal, not an error: passes TRL's `except Exception`
    def __init__(self, prompts: list):
        super().__init__("prompts prepared")
        self.prompts = prompts


def trl_prepared_prompts(trainer, trl_step: Callable[[list[dict]], dict], inputs: list[dict]) -> list:
    """The prompts ``trl_step`` (GRPOTrainer's ``_generate_and_score_completions``) hands ``_generate`` for ``inputs``
    (environments drawn and reset, tool dicts, images); nothing generated or scored."""
    # The one place TRL offers no hook: it prepares the prompts inline, with no method of its own, so its step is
    # stopped at `_generate` by a BaseException (which TRL's `except Exception` lets through), caught only here.
    def stop(prompts: list):
        raise _PromptsPrepared(prompts)

    try:
        trl_step_on(trainer, trl_step, inputs, generate=stop)
    except _PromptsPrepared as prepared:
        return prepared.prompts
    raise RuntimeError("GRPOTrainer._generate_and_score_completions returned without calling _generate: this TRL "
                       f"is not one pods-rl supports (trl{TRL_RANGE}).")


@contextmanager
def grouped_by(trainer, num_generations: int):
    """TRL groups rows by ``num_generations`` (advantages; vLLM server's de-duplication): the block's own grouping."""
    n = trainer.num_generations
    trainer.num_generations = num_generations
    try:
        yield
    finally:
        trainer.num_generations = n


@contextmanager
def kept_environments(trainer, kept_rows: list[int]):
    """Inside TRL's call on the kept rows, each gets back its rollout's environment instance, not reset again
    (TRL's pool holds just those); afterwards ``trainer.environments`` lists the whole batch's."""
    environments = getattr(trainer, "environments", None)
    if not environments:
        yield
        return
    names, pool = trainer._batch_environments, trainer._environment_pool
    kept_pool = {name: [] for name in pool}
    for i in kept_rows:
        kept_pool[names[i]].append(environments[i])
    kept = {id(environments[i]): environments[i] for i in kept_rows}
    for environment in kept.values():
        environment.reset = _no_observation  # an instance attribute: the class's reset is not touched
    trainer._environment_pool = kept_pool
    try:
        yield
    finally:
        for environment in kept.values():
            vars(environment).pop("reset", None)
        trainer._environment_pool = pool
        trainer.environments, trainer._batch_environments = environments, names


def _no_observation(**kwargs):
    """Stands in for a kept environment's ``reset`` during TRL's call on the kept rows: nothing to add."""
    return None


@contextmanager
def one_sleep_per_step(trainer):
    """Adaptive rounds with vLLM's sleep mode (colocate): one weight push and one sleep per step, not per round.

    TRL sleeps the engine at level 2 after every ``generate`` and pushes the weights again before the next; inside
    the block ``sleep`` is deferred (the weights stay) and runs once on leaving."""
    generation = getattr(trainer, "vllm_generation", None)
    if not (getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "colocate"
            and getattr(generation, "enable_sleep_mode", False) and getattr(generation, "llm", None) is not None):
        yield
        return
    engine, generate = generation.llm, generation.generate
    sleep, deferred = engine.sleep, []

    def defer_sleep(level: int = 1, *args, **kwargs):
        deferred.append((level, args, kwargs))

    def generate_and_stay_awake(*args, **kwargs):
        try:
            return generate(*args, **kwargs)
        finally:
            generation._llm_weights_sleeping = False  # its sleep was deferred: the weights are still loaded

    engine.sleep, generation.generate = defer_sleep, generate_and_stay_awake
    try:
        yield
    finally:
        engine.sleep, generation.generate = sleep, generate
        if deferred:
            level, args, kwargs = deferred[-1]
            sleep(level, *args, **kwargs)
            generation._llm_weights_sleeping = True


# ---- what TRL buffers per rollout: metrics, log_extra, log_metric -----------------------------------------------

def log_train_metrics(trainer, metrics: dict[str, float]) -> None:
    """Append ``metrics`` to TRL's train metrics (averaged and logged at the next log step)."""
    for name, value in metrics.items():
        trainer._metrics["train"][name].append(value)


def completions_column(trainer, name: str) -> list:
    """The completions table's column ``name`` as TRL logged it (every process's rows, the last at the end)."""
    return trainer._logs[name]


def add_extra_logs(trainer, columns: dict[str, list]) -> None:
    """Hand TRL ``log_extra`` columns for the rows of its next call, as if its reward functions had logged them."""
    trainer._pending_extra_logs.update(columns)


@contextmanager
def extra_logs_set_aside(trainer):
    """The block's ``log_extra`` values dropped, TRL's pending ones as before it."""
    pending = trainer._pending_extra_logs
    before = dict(pending)
    pending.clear()
    try:
        yield
    finally:
        pending.clear()
        pending.update(before)


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


# ---- the per-rollout state TRL prepared for the batch: environments, tool dicts, stop ids ---------------------------

def eos_token_ids(trainer) -> list[int]:
    """The token ids TRL counts as a completion's end (besides padding) in its clipped ratio, as this TRL does."""
    if TRL_KEEPS_EOS_TOKEN_IDS:
        return list(trainer.eos_token_ids)
    return [trainer._tokenizer.eos_token_id]


def stop_ids(trainer) -> set[int]:
    """The token ids a completion may end with: TRL's EOS ids and padding."""
    return {*eos_token_ids(trainer), trainer._tokenizer.pad_token_id}


def tool_names(trainer, rows: list[int]) -> list[set]:
    """The names of the tools each of ``rows`` could call (TRL's per-rollout tool dicts)."""
    return [set(trainer._sync_tool_dicts[i]) | set(trainer._async_tool_dicts[i]) for i in rows]


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
