"""Accuracy of one model on a task: ``k`` samples per problem -> one record (``evaluate_model``).

``k`` samples per problem at ``temperature`` give ``correct`` (num_problems, k); sample ``j`` forms repeat ``j``. A
record holds ``accuracy``, ``accuracy_stderr`` (std(correct.mean(0), ddof=1) / sqrt(k); None when k == 1),
``format_accuracy``, ``both_accuracy`` (correct and well formatted), ``pass_at_k`` (unbiased, n = k),
``mean_completion_tokens`` (through the first EOS), ``step``/``train_seconds`` (``pods_clock.json``; 0 for a plain
model) and ``eval_seconds``. Generation: vLLM when it runs here, else transformers. `pods eval` runs it over a run's
checkpoints (``pods_rl.commands.evaluate``); `pods train` runs it while training (``pods_rl.training_run``)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np

from pods_rl.accuracy import accuracy_stats
from pods_rl.generation import choose_backend, encode_prompts, generate_hf, generate_vllm
from pods_rl.models import check_remote_code, load_model_and_tokenizer, tokenizer_source
from pods_rl.runlog import checkpoint_clock
from pods_rl.tasks import get_task


# ------------------------------------------------------------------------------------------------------------
# Tasks
# ------------------------------------------------------------------------------------------------------------
def resolve_task(task, task_args: dict | None = None):
    """A Task object as is, or ``pods_rl.tasks.get_task(name, **task_args)`` for a name."""
    if isinstance(task, str):
        return get_task(task, **(task_args or {}))
    if not (hasattr(task, "load") and (hasattr(task, "score") or hasattr(task, "is_correct"))):
        raise ValueError(f"task must be a task name or an object with load() and score(), got {task!r}")
    return task


def score_sample(task, completion: str, answer: str, **extra) -> tuple[bool, bool]:
    """(correct, format) of one completion via ``task.score``; tasks without it give format=False.
    ``extra``: the row's ``task.extra_reward_columns`` values, passed only when present."""
    if hasattr(task, "score"):
        result = task.score(completion, answer, **extra)
        return bool(result["correct"]), bool(result["format"])
    return bool(task.is_correct(completion, answer, **extra)), False


# ------------------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------------------
def evaluate_model(model_or_path, task, split: str = "test", k: int = 5, temperature: float = 0.9,
                   max_new_tokens: int = 512, limit: int | None = None, batch_size: int = 64, seed: int = 0,
                   tokenizer=None, task_args: dict | None = None, backend: str = "auto", num_examples: int = 3,
                   name: str | None = None, trust_remote_code: bool = False, per_problem: bool = False) -> dict:
    """Evaluate one model on ``task``/``split`` with ``k`` samples per problem; return one result record.

    ``model_or_path``: a model / checkpoint / adapter directory, hub id, or loaded ``PreTrainedModel`` (pass
    ``tokenizer``). ``task``: a Task or registered name (built with ``task_args``). ``limit``: the first problems
    only. ``name``: the record's "checkpoint". Without ``trust_remote_code`` a model with its own code is refused.
    ``per_problem``: also ``"correct"``, the (P, k) 0/1 outcomes as lists (`pods cost`'s starting pass rates)."""
    if k < 1 or max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"k, max_new_tokens and batch_size must be >= 1, got {k}, {max_new_tokens}, {batch_size}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    task_obj = resolve_task(task, task_args)
    started = time.perf_counter()

    in_memory = not isinstance(model_or_path, (str, os.PathLike))
    if in_memory:
        if tokenizer is None:
            raise ValueError("pass tokenizer= together with an in-memory model")
        model_path, step, train_seconds, chosen = None, 0, 0.0, "hf"
    else:
        model_path = Path(model_or_path)
        check_remote_code(str(model_or_path), trust_remote_code)
        with _loading(model_path):
            step, train_seconds = checkpoint_clock(model_path) if model_path.is_dir() else (0, 0.0)
            chosen = choose_backend(backend, model_path)

    prompts, answers, extras = _problems(task_obj, split, limit)
    sampling = dict(k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    if chosen == "vllm":
        texts, completions, lengths = _sample_vllm(model_path, tokenizer, prompts, sampling, trust_remote_code)
    else:
        texts, completions, lengths = _sample_hf(None if in_memory else model_path,
                                                 model_or_path if in_memory else None, tokenizer, prompts, sampling,
                                                 batch_size, name, trust_remote_code)

    correct = np.zeros((len(prompts), k), dtype=bool)  # (P, k)
    formatted = np.zeros((len(prompts), k), dtype=bool)  # (P, k)
    for p, answer in enumerate(answers):
        for j in range(k):
            correct[p, j], formatted[p, j] = score_sample(task_obj, completions[p][j], answer, **extras[p])
    examples = [
        {"prompt": texts[p], "completion": completions[p][0], "answer": answers[p],
         "correct": bool(correct[p, 0]), "format": bool(formatted[p, 0])}
        for p in range(min(num_examples, len(prompts)))
    ]
    settings = {"task": getattr(task_obj, "name", str(task)), "task_args": dict(task_args or {}), "split": split,
                "k": int(k), "temperature": float(temperature), "max_new_tokens": int(max_new_tokens), "limit": limit,
                "seed": int(seed), "step": int(step), "train_seconds": float(train_seconds)}
    record = _record(name, model_path, settings, correct, formatted, lengths, started, chosen, examples)
    if per_problem:
        record["correct"] = correct.astype(int).tolist()
    return record


def _record(name, model_path: Path | None, settings: dict, correct, formatted, lengths, started: float,
            backend: str, examples: list[dict]) -> dict:
    """One evaluation's record (the fields of the module docstring): ``correct`` and ``formatted`` (P, k) bool,
    ``lengths`` (P, k) completion tokens."""
    return {
        "checkpoint": name or (str(model_path) if model_path else "<in-memory>"),
        "checkpoint_path": str(model_path.resolve()) if model_path and model_path.exists() else
        (str(model_path) if model_path else None),
        **settings,
        **accuracy_stats(correct),
        "format_accuracy": float(formatted.mean()),
        "both_accuracy": float((correct & formatted).mean()),
        "mean_completion_tokens": float(lengths.mean()),
        "eval_seconds": time.perf_counter() - started,
        "backend": backend,
        "examples": examples,
        "evaluated_at": time.time(),
    }


def _problems(task_obj, split: str, limit: int | None) -> tuple[list, list[str], list[dict]]:
    """The split's prompts, answers (as strings) and, per problem, the extra columns its grader reads."""
    dataset = task_obj.load(split, limit=limit)
    if len(dataset) == 0:
        raise ValueError(f"task {getattr(task_obj, 'name', task_obj)!r} split {split!r} has no problems")
    prompts, answers = list(dataset["prompt"]), [str(a) for a in dataset["answer"]]
    extra_columns = tuple(getattr(task_obj, "extra_reward_columns", ()) or ())
    missing = [c for c in extra_columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"the task needs dataset columns {missing} to grade, but split {split!r} lacks them")
    extra_values = {c: list(dataset[c]) for c in extra_columns}
    return prompts, answers, [{c: values[p] for c, values in extra_values.items()} for p in range(len(prompts))]


def _sample_vllm(model_path: Path, tokenizer, prompts: list, sampling: dict, trust_remote_code: bool):
    """(prompt texts, completions (P lists of k), lengths (P, k)) sampled with vLLM."""
    from transformers import AutoTokenizer  # seconds to import; `pods eval --help` does not need it

    with _loading(model_path):
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(tokenizer_source(model_path),
                                                               trust_remote_code=bool(trust_remote_code))
    texts, prompt_ids = encode_prompts(prompts, tokenizer)
    completions, lengths = generate_vllm(model_path, prompt_ids, sampling["k"], sampling["temperature"],
                                         sampling["max_new_tokens"], sampling["seed"],
                                         trust_remote_code=trust_remote_code)
    return texts, completions, lengths


def _sample_hf(model_path: Path | None, model, tokenizer, prompts: list, sampling: dict, batch_size: int,
               name: str | None, trust_remote_code: bool):
    """(prompt texts, completions (P lists of k), lengths (P, k)) sampled with transformers: from ``model`` when
    given (in memory), else loaded from ``model_path``."""
    if model is None:
        with _loading(model_path):
            model, loaded_tokenizer = load_model_and_tokenizer(model_path, trust_remote_code=trust_remote_code)
        tokenizer = tokenizer or loaded_tokenizer
    texts, prompt_ids = encode_prompts(prompts, tokenizer)
    desc = name or (model_path.name if model_path else "model")
    completions, lengths = generate_hf(model, tokenizer, prompt_ids, sampling["k"], sampling["temperature"],
                                       sampling["max_new_tokens"], batch_size, sampling["seed"], desc=desc)
    return texts, completions, lengths


@contextmanager
def _loading(model_path: Path):
    """Marks an exception raised while reading a model's files with the path (``err.pods_unloadable``): a
    run's damaged checkpoint is then skipped, while a failure to generate or grade still stops the evaluation."""
    try:
        yield
    except Exception as err:
        with suppress(AttributeError):  # an exception type without a __dict__: it is reported as it is
            err.pods_unloadable = str(model_path)
        raise
