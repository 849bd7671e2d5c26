"""`pods eval`: accuracy of a model, a checkpoint, or every checkpoint of a run directory on a task.

For each problem of the split we draw ``k`` completions at ``temperature`` and score each with the task.
``correct`` below is a boolean array of shape (num_problems, k); sample ``j`` of every problem forms
"repeat" ``j``, i.e. one pass over the split. Reported per checkpoint:

    accuracy            mean of ``correct`` over all num_problems * k samples
    accuracy_stderr     standard error of that mean over the k repeats:
                        std(per_repeat_accuracy, ddof=1) / sqrt(k)  where per_repeat_accuracy = correct.mean(0);
                        None when k == 1 (undefined from a single repeat)
    format_accuracy     share of samples in the task's answer format
    both_accuracy       share of samples that are correct AND well formatted
    pass_at_k           mean over problems of the unbiased pass@k of Chen et al. (2021) with n = k samples
    mean_completion_tokens  generated tokens per sample (up to and including the first end-of-sequence token)
    step, train_seconds the checkpoint's optimizer step and cumulative training seconds (``pods_clock.json``;
                        0 / 0 for a plain model)
    eval_seconds        wall time of this evaluation (generation + scoring)

Results are kept in ONE JSON file (a list of records; ``run_dir/eval.json`` by default). A record is keyed by
(checkpoint, task, split, k, temperature): evaluating the same key again replaces the record, any other key is
appended. The file is rewritten atomically (tmp file + ``os.replace``) after each checkpoint, so an interrupted
run keeps everything finished so far. A checkpoint is skipped when a record with its key and the same
``limit``, ``max_new_tokens`` and ``seed`` exists, unless ``force``.

Generation uses vLLM when it is importable and CUDA is available (``backend="auto"``), otherwise transformers
``generate`` with left padding. Sampling is pure temperature sampling (top-p 1, no top-k); temperature 0 is
greedy (one completion, repeated k times). Message prompts are rendered with the tokenizer's chat template
(``add_generation_prompt=True``); both backends get the same token ids.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

CLOCK_FILE = "pods_clock.json"
DEFAULT_EVAL_FILE = "eval.json"
KEY_FIELDS = ("checkpoint", "task", "split", "k", "temperature")
# A record with the same key is only reused ("skipped") when these settings also match.
REUSE_FIELDS = ("limit", "max_new_tokens", "seed")


# ------------------------------------------------------------------------------------------------------------
# Statistics (pure numpy)
# ------------------------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k).

    Args:
        n: samples drawn for the problem.
        c: how many of them are correct (0 <= c <= n).
        k: budget (1 <= k <= n).
    Returns the probability that at least one of k samples drawn without replacement from the n is correct.
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # Numerically stable product form: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i).
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def accuracy_stats(correct) -> dict:
    """Accuracy statistics of a (num_problems, k) array of 0/1 (or bool) sample outcomes.

    Returns {"accuracy", "accuracy_stderr", "per_repeat_accuracy" (list of k), "pass_at_k", "num_problems",
    "k"}. The standard error is taken over the k repeats (column j = sample j of every problem):
    std(per-repeat accuracies, ddof=1) / sqrt(k); it is None when k == 1.
    """
    correct = np.asarray(correct, dtype=float)  # (P, k)
    if correct.ndim != 2 or correct.shape[0] < 1 or correct.shape[1] < 1:
        raise ValueError(f"correct must be a non-empty 2-D array (num_problems, k), got shape {correct.shape}")
    if not np.all((correct == 0) | (correct == 1)):
        raise ValueError("correct must hold only 0/1 (or booleans)")
    num_problems, k = correct.shape
    per_repeat = correct.mean(axis=0)  # (k,)
    stderr = float(per_repeat.std(ddof=1) / math.sqrt(k)) if k > 1 else None
    num_correct = correct.sum(axis=1).astype(int)  # (P,)
    return {
        "accuracy": float(correct.mean()),
        "accuracy_stderr": stderr,
        "per_repeat_accuracy": [float(a) for a in per_repeat],
        "pass_at_k": float(np.mean([pass_at_k(k, c, k) for c in num_correct])),
        "num_problems": int(num_problems),
        "k": int(k),
    }


# ------------------------------------------------------------------------------------------------------------
# Models, prompts, generation
# ------------------------------------------------------------------------------------------------------------
def read_clock(model_dir) -> tuple[int, float]:
    """(step, train_seconds) from ``model_dir/pods_clock.json``; (0, 0.0) when absent (a plain model)."""
    clock_path = Path(model_dir) / CLOCK_FILE
    if not clock_path.is_file():
        return 0, 0.0
    try:
        clock = json.loads(clock_path.read_text())
        return int(clock["step"]), float(clock["train_seconds"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{clock_path} is not a valid clock file ({{'step', 'train_seconds'}}): {err}") from err


def is_adapter_dir(path) -> bool:
    """Whether ``path`` holds a PEFT adapter (``adapter_config.json``) rather than a full model."""
    return (Path(path) / "adapter_config.json").is_file()


def _has_tokenizer_files(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def load_model_and_tokenizer(path, device=None):
    """Load a causal LM (full model dir, PEFT adapter dir, or hub id) and its tokenizer for generation.

    Adapters are loaded on their ``base_model_name_or_path`` and merged (faster generation). The tokenizer
    comes from ``path`` when it has tokenizer files, else from the base model. Weights are bf16 on CUDA,
    fp32 on CPU. Returns (model in eval mode, tokenizer with left padding).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    path_obj = Path(path)
    if is_adapter_dir(path_obj):
        from peft import PeftModel

        base_name = json.loads((path_obj / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base_name:
            raise ValueError(f"{path_obj}/adapter_config.json names no base_model_name_or_path; cannot load it")
        model = AutoModelForCausalLM.from_pretrained(base_name, dtype=dtype)
        model = PeftModel.from_pretrained(model, str(path_obj)).merge_and_unload()
        tokenizer_source = str(path_obj) if _has_tokenizer_files(path_obj) else base_name
    else:
        if path_obj.exists() and not (path_obj / "config.json").is_file():
            raise ValueError(f"{path_obj} has neither config.json nor adapter_config.json: not a model directory")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        tokenizer_source = str(path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    return model.to(device).eval(), tokenizer


def _pad_id(tokenizer) -> int:
    """Pad id for left padding (we pad by hand, so the caller's tokenizer is never modified)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    return int(pad_id)


def render_prompt(prompt, tokenizer) -> tuple[str, bool]:
    """Prompt as text: chat messages through the chat template (with the generation prompt), str as is.

    Returns (text, add_special_tokens): chat templates already contain BOS etc., plain text does not.
    """
    if isinstance(prompt, str):
        return prompt, True
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the task gives chat-message prompts but the tokenizer has no chat template; use an "
                "instruct model, set tokenizer.chat_template, or load the task with prompt_style='base'"
            )
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return text, False
    raise ValueError(f"a prompt must be a str or a list of chat messages, got {type(prompt).__name__}")


def encode_prompts(prompts: Sequence, tokenizer) -> tuple[list[str], list[list[int]]]:
    """(rendered texts, token ids) of each prompt; ids have no padding."""
    texts, ids = [], []
    for prompt in prompts:
        text, add_special = render_prompt(prompt, tokenizer)
        texts.append(text)
        ids.append(tokenizer(text, add_special_tokens=add_special)["input_ids"])
    return texts, ids


def _eos_ids(model, tokenizer) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos if eos is not None else tokenizer.eos_token_id
    eos = eos if isinstance(eos, (list, tuple)) else [eos]
    return {int(e) for e in eos if e is not None}


def generate_hf(model, tokenizer, prompt_ids: list[list[int]], k: int, temperature: float, max_new_tokens: int,
                batch_size: int, seed: int, desc: str = "generate") -> tuple[list[list[str]], np.ndarray]:
    """Sample ``k`` completions per prompt with transformers ``generate``.

    Work items are (prompt, sample) pairs, chunked into batches of ``batch_size`` sequences, left padded
    by hand (the tokenizer is not modified: during training it is the trainer's).
    Returns (completions (P lists of k str), completion_tokens (P, k) int array). Greedy (temperature 0)
    decodes once per prompt and repeats the result k times.
    """
    import torch
    from tqdm.auto import tqdm

    greedy = temperature == 0
    samples_per_prompt = 1 if greedy else k
    items = [(p, j) for p in range(len(prompt_ids)) for j in range(samples_per_prompt)]
    completions = [[""] * samples_per_prompt for _ in prompt_ids]
    lengths = np.zeros((len(prompt_ids), samples_per_prompt), dtype=int)
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = _pad_id(tokenizer)
    device = next(model.parameters()).device
    gen_kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=sorted(eos_ids),
                      use_cache=True)
    if greedy:
        gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        gen_kwargs.update(do_sample=True, temperature=float(temperature), top_p=1.0, top_k=0)
    # Seed inside a forked RNG: reproducible, and the caller's RNG (a trainer's, mid-training) is untouched.
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)  # one seed per pass: reproducible for the same settings and batch size
        for start in tqdm(range(0, len(items), batch_size), desc=desc, unit="batch", leave=False):
            batch = items[start : start + batch_size]
            longest = max(len(prompt_ids[p]) for p, _ in batch)
            input_ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)  # (B, L) left padded
            attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, (p, _) in enumerate(batch):
                ids = prompt_ids[p]
                input_ids[row, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, longest - len(ids) :] = 1
            with torch.no_grad():
                output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                        **gen_kwargs)
            generated = output[:, longest:].cpu()  # (B, T) new tokens, padded after eos
            for row, (p, j) in enumerate(batch):
                tokens = generated[row].tolist()
                end = next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))
                lengths[p, j] = end
                completions[p][j] = tokenizer.decode(tokens[:end], skip_special_tokens=True)
    if greedy:
        completions = [c * k for c in completions]
        lengths = np.repeat(lengths, k, axis=1)
    return completions, lengths


def generate_vllm(model_path, prompt_ids: list[list[int]], k: int, temperature: float, max_new_tokens: int,
                  seed: int) -> tuple[list[list[str]], np.ndarray]:
    """Sample ``k`` completions per prompt with vLLM (CUDA). Same return values as ``generate_hf``.

    PEFT adapter dirs are merged into a temporary full model first. The engine is torn down afterwards so
    the next checkpoint can load.
    """
    import gc
    import tempfile

    import torch
    from vllm import LLM, SamplingParams

    tmp = None
    if is_adapter_dir(model_path):
        model, tokenizer = load_model_and_tokenizer(model_path, device="cpu")
        tmp = tempfile.TemporaryDirectory(prefix="pods-merged-")
        model.save_pretrained(tmp.name)
        tokenizer.save_pretrained(tmp.name)
        del model
        model_path = tmp.name
    greedy = temperature == 0
    try:
        llm = LLM(model=str(model_path), seed=seed, dtype="auto", enable_prefix_caching=True)
        params = SamplingParams(n=1 if greedy else k, temperature=float(temperature), top_p=1.0,
                                max_tokens=max_new_tokens, seed=seed)
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=True)
        completions = [[o.text for o in out.outputs] for out in outputs]
        lengths = np.array([[len(o.token_ids) for o in out.outputs] for out in outputs], dtype=int)
    finally:
        try:
            del llm
        except NameError:
            pass
        gc.collect()
        torch.cuda.empty_cache()
        if tmp is not None:
            tmp.cleanup()
    if greedy:
        completions = [c * k for c in completions]
        lengths = np.repeat(lengths, k, axis=1)
    return completions, lengths


def choose_backend(backend: str = "auto") -> str:
    """"vllm" when requested or (auto) when vllm is importable and CUDA is present; else "hf"."""
    if backend not in ("auto", "hf", "vllm"):
        raise ValueError(f"backend must be 'auto', 'hf' or 'vllm', got {backend!r}")
    if backend != "auto":
        return backend
    try:
        import importlib.util

        import torch

        if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
            return "vllm"
    except ImportError:
        pass
    return "hf"


# ------------------------------------------------------------------------------------------------------------
# Tasks
# ------------------------------------------------------------------------------------------------------------
def resolve_task(task, task_args: dict | None = None):
    """A Task object as is, or ``pods_rl.tasks.get_task(name, **task_args)`` for a name."""
    if isinstance(task, str):
        from pods_rl.tasks import get_task

        return get_task(task, **(task_args or {}))
    if not (hasattr(task, "load") and (hasattr(task, "score") or hasattr(task, "is_correct"))):
        raise ValueError(f"task must be a task name or an object with load() and score(), got {task!r}")
    return task


def score_sample(task, completion: str, answer: str, **extra) -> tuple[bool, bool]:
    """(correct, format) of one completion via ``task.score``; tasks without it give format=False.

    ``extra``: the row's ``task.extra_reward_columns`` values (e.g. test cases), passed only when present.
    """
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
                   name: str | None = None) -> dict:
    """Evaluate one model on ``task``/``split`` with ``k`` samples per problem; return one result record.

    Args:
        model_or_path: a model directory / checkpoint / PEFT adapter dir / hub id, or a loaded
            ``PreTrainedModel`` (then pass ``tokenizer``; generation uses transformers).
        task: a Task object or a registered task name (built with ``task_args``).
        k, temperature, max_new_tokens: sampling settings (temperature 0 = greedy).
        limit: evaluate only the first ``limit`` problems of the split.
        batch_size: sequences per ``generate`` call (transformers backend).
        seed: RNG seed of the sampling.
        num_examples: how many (first-sample) completions to keep in the record.
        name: the record's "checkpoint" field (default: the path, or "<in-memory>").
    Returns a dict with the fields described in the module docstring, plus "checkpoint_path", "backend",
    "examples", the settings, and "evaluated_at" (unix time).
    """
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
        step, train_seconds = read_clock(model_path) if model_path.is_dir() else (0, 0.0)
        chosen = choose_backend(backend)

    dataset = task_obj.load(split, limit=limit)
    if len(dataset) == 0:
        raise ValueError(f"task {getattr(task_obj, 'name', task_obj)!r} split {split!r} has no problems")
    prompts, answers = list(dataset["prompt"]), [str(a) for a in dataset["answer"]]
    extra_columns = tuple(getattr(task_obj, "extra_reward_columns", ()) or ())
    missing = [c for c in extra_columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"the task needs dataset columns {missing} to grade, but split {split!r} lacks them")
    extra_values = {c: list(dataset[c]) for c in extra_columns}
    extras = [{c: values[p] for c, values in extra_values.items()} for p in range(len(prompts))]

    if chosen == "vllm":
        from transformers import AutoTokenizer

        tok_src = model_path
        if is_adapter_dir(model_path) and not _has_tokenizer_files(model_path):
            tok_src = json.loads((model_path / "adapter_config.json").read_text())["base_model_name_or_path"]
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(tok_src))
        texts, prompt_ids = encode_prompts(prompts, tokenizer)
        completions, lengths = generate_vllm(model_path, prompt_ids, k, temperature, max_new_tokens, seed)
    else:
        if in_memory:
            model = model_or_path
        else:
            model, loaded_tokenizer = load_model_and_tokenizer(model_path)
            tokenizer = tokenizer or loaded_tokenizer
        texts, prompt_ids = encode_prompts(prompts, tokenizer)
        desc = name or (model_path.name if model_path else "model")
        completions, lengths = generate_hf(model, tokenizer, prompt_ids, k, temperature, max_new_tokens,
                                           batch_size, seed, desc=desc)

    correct = np.zeros((len(prompts), k), dtype=bool)  # (P, k)
    formatted = np.zeros((len(prompts), k), dtype=bool)  # (P, k)
    for p, answer in enumerate(answers):
        for j in range(k):
            correct[p, j], formatted[p, j] = score_sample(task_obj, completions[p][j], answer, **extras[p])

    stats = accuracy_stats(correct)
    examples = [
        {"prompt": texts[p], "completion": completions[p][0], "answer": answers[p],
         "correct": bool(correct[p, 0]), "format": bool(formatted[p, 0])}
        for p in range(min(num_examples, len(prompts)))
    ]
    return {
        "checkpoint": name or (str(model_path) if model_path else "<in-memory>"),
        "checkpoint_path": str(model_path.resolve()) if model_path and model_path.exists() else
        (str(model_path) if model_path else None),
        "task": getattr(task_obj, "name", str(task)),
        "task_args": dict(task_args or {}),
        "split": split,
        "k": int(k),
        "temperature": float(temperature),
        "max_new_tokens": int(max_new_tokens),
        "limit": limit,
        "seed": int(seed),
        "step": int(step),
        "train_seconds": float(train_seconds),
        **stats,
        "format_accuracy": float(formatted.mean()),
        "both_accuracy": float((correct & formatted).mean()),
        "mean_completion_tokens": float(lengths.mean()),
        "eval_seconds": time.perf_counter() - started,
        "backend": chosen,
        "examples": examples,
        "evaluated_at": time.time(),
    }


# --- the results file ---------------------------------------------------------------------------------------
def result_key(record: dict) -> tuple:
    """(checkpoint, task, split, k, temperature): records with equal keys replace each other."""
    return tuple(record[f] if f != "temperature" else float(record[f]) for f in KEY_FIELDS)


def load_results(path) -> list[dict]:
    """The records of an eval JSON file ([] when it does not exist). Refuses to read a corrupt file."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        records = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); move it away or fix it before evaluating") from err
    if not isinstance(records, list):
        raise ValueError(f"{path} must hold a JSON list of eval records, got {type(records).__name__}")
    return records


def save_results(path, records: list[dict]) -> None:
    """Write ``records`` to ``path`` atomically: a crash leaves either the old or the new file, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def upsert_result(path, record: dict) -> list[dict]:
    """Add ``record`` to the JSON file at ``path``, replacing any record with the same key; returns all."""
    key = result_key(record)
    records = [r for r in load_results(path) if result_key(r) != key] + [record]
    save_results(path, records)
    return records


# --- run directories ----------------------------------------------------------------------------------------
def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or is_adapter_dir(path)


def is_run_dir(path) -> bool:
    """A run directory has ``checkpoint-*`` or ``final`` model dirs (and usually config.yaml)."""
    path = Path(path)
    return path.is_dir() and not _is_model_dir(path) and bool(find_checkpoints(path, verbose=False))


def find_checkpoints(run_dir, include_base: bool = False, verbose: bool = True) -> list[dict]:
    """Model dirs of a run, sorted by step: [{"name", "path", "step", "train_seconds"}].

    ``checkpoint-<N>`` and ``final`` dirs that hold a model and ``pods_clock.json``. The trainer writes the
    clock file last, so a dir without it is incomplete (being saved, or killed mid-save) and is skipped with
    a warning; ``checkpoint-N.incomplete`` dirs never match. ``final`` is dropped when a checkpoint has the
    same step (same weights). ``include_base`` prepends the run's initial model (config.yaml's
    ``model_name_or_path``) at step 0, 0 seconds.
    """
    run_dir = Path(run_dir)
    candidates = [p for p in run_dir.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)]
    found = []
    for path in candidates + [run_dir / "final"]:
        if not (path.is_dir() and _is_model_dir(path)):
            continue
        if not (path / CLOCK_FILE).is_file():
            if verbose:
                print(f"warning: skipping {path}: no {CLOCK_FILE} (incomplete checkpoint)", file=sys.stderr)
            continue
        step, seconds = read_clock(path)
        found.append({"name": path.name, "path": path, "step": step, "train_seconds": seconds})
    checkpoint_steps = {c["step"] for c in found if c["name"] != "final"}
    found = [c for c in found if not (c["name"] == "final" and c["step"] in checkpoint_steps)]
    found.sort(key=lambda c: (c["step"], c["name"] == "final"))
    if include_base:
        base = load_run_config(run_dir).get("model_name_or_path")
        if not base:
            raise ValueError(f"{run_dir}/config.yaml names no model_name_or_path; cannot evaluate the base model")
        found.insert(0, {"name": "base", "path": Path(base), "step": 0, "train_seconds": 0.0})
    return found


def load_run_config(run_dir) -> dict:
    """The run's resolved config.yaml as a dict ({} if absent)."""
    config_path = Path(run_dir) / "config.yaml"
    if not config_path.is_file():
        return {}
    import yaml

    config = yaml.safe_load(config_path.read_text()) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a mapping, got {type(config).__name__}")
    return config


def _checkpoint_name(model_path: Path, out: Path) -> str:
    """Name of a model inside the results file's folder relative to it (so run dirs can move), else absolute."""
    try:
        return str(model_path.resolve().relative_to(out.resolve().parent))
    except ValueError:
        return str(model_path.resolve()) if model_path.exists() else str(model_path)


def _already_done(records: list[dict], key: tuple, settings: dict) -> bool:
    return any(result_key(r) == key and all(r.get(f) == settings[f] for f in REUSE_FIELDS) for r in records)


def evaluate_checkpoints(checkpoints: list[dict], task, out, split: str = "test", k: int = 5,
                         temperature: float = 0.9, max_new_tokens: int = 512, limit: int | None = None,
                         batch_size: int = 64, seed: int = 0, task_args: dict | None = None,
                         backend: str = "auto", force: bool = False, verbose: bool = True) -> list[dict]:
    """Evaluate each of ``checkpoints`` (dicts from ``find_checkpoints``) in order, saving after each.

    Already-evaluated checkpoints (same key and settings in ``out``) are skipped unless ``force``.
    Returns the records of these checkpoints (new or reused), in order.
    """
    out = Path(out)
    task_obj = resolve_task(task, task_args)
    task_name = getattr(task_obj, "name", str(task))
    settings = {"limit": limit, "max_new_tokens": int(max_new_tokens), "seed": int(seed)}
    results = []
    for ckpt in checkpoints:
        # The run's initial model is "base" whatever its path (often a hub id), so the key survives moves.
        name = "base" if ckpt["name"] == "base" else _checkpoint_name(Path(ckpt["path"]), out)
        key = (name, task_name, split, int(k), float(temperature))
        existing = load_results(out)
        if not force and _already_done(existing, key, settings):
            if verbose:
                print(f"skip {name}: already in {out} (use --force to redo)", file=sys.stderr)
            results.append(next(r for r in existing if result_key(r) == key))
            continue
        record = evaluate_model(ckpt["path"], task_obj, split=split, k=k, temperature=temperature,
                                max_new_tokens=max_new_tokens, limit=limit, batch_size=batch_size, seed=seed,
                                task_args=task_args, backend=backend, name=name)
        upsert_result(out, record)
        results.append(record)
        if verbose:
            print(format_table([record], header=not results[:-1]), file=sys.stderr)
    return results


def evaluate_run(run_dir, task, split: str = "test", k: int = 5, temperature: float = 0.9,
                 max_new_tokens: int = 512, limit: int | None = None, batch_size: int = 64, seed: int = 0,
                 out=None, force: bool = False, task_args: dict | None = None, backend: str = "auto",
                 include_base: bool = False, verbose: bool = True) -> list[dict]:
    """Evaluate every checkpoint (+ final) of ``run_dir`` sorted by step; results go to ``run_dir/eval.json``
    (or ``out``), saved atomically after each checkpoint. Returns the records in step order."""
    run_dir = Path(run_dir)
    checkpoints = find_checkpoints(run_dir, include_base=include_base)
    if not checkpoints:
        raise ValueError(f"{run_dir} has no checkpoint-*/ or final/ model directories to evaluate")
    return evaluate_checkpoints(checkpoints, task, out or run_dir / DEFAULT_EVAL_FILE, split=split, k=k,
                                temperature=temperature, max_new_tokens=max_new_tokens, limit=limit,
                                batch_size=batch_size, seed=seed, task_args=task_args, backend=backend,
                                force=force, verbose=verbose)


def default_out_for_model(model_path) -> Path:
    """Where a single model's results go by default: the run dir of a checkpoint (it has pods_clock.json and
    its parent a config.yaml), else the model dir itself, else ./eval.json for a hub id."""
    path = Path(model_path)
    if not path.is_dir():
        return Path(DEFAULT_EVAL_FILE)
    if (path / CLOCK_FILE).is_file() and (path.parent / "config.yaml").is_file():
        return path.parent / DEFAULT_EVAL_FILE
    return path / DEFAULT_EVAL_FILE


# --- terminal table -----------------------------------------------------------------------------------------
def format_table(records: list[dict], header: bool = True) -> str:
    """A fixed-width text table of eval records (one line each)."""
    columns = f"{'checkpoint':<24} {'step':>6} {'train_min':>9} {'accuracy':>15} {'format':>6} {'both':>6} " \
              f"{'pass@k':>6} {'tokens':>7} {'eval_s':>7}"
    lines = [columns, "-" * len(columns)] if header else []
    for r in records:
        stderr = r.get("accuracy_stderr")
        acc = f"{r['accuracy']:.3f}" + (f" ± {stderr:.3f}" if stderr is not None else "")
        lines.append(
            f"{str(r['checkpoint'])[-24:]:<24} {r['step']:>6} {r['train_seconds'] / 60:>9.2f} {acc:>15} "
            f"{r['format_accuracy']:>6.3f} {r['both_accuracy']:>6.3f} {r['pass_at_k']:>6.3f} "
            f"{r['mean_completion_tokens']:>7.1f} {r['eval_seconds']:>7.1f}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------
def parse_task_args(pairs: Sequence[str] | None) -> dict:
    """``["digits=3", "ops=+-"]`` -> {"digits": 3, "ops": "+-"} (see ``pods_rl.tasks.parse_task_args``: the same
    rules as `pods train --task_args`)."""
    from pods_rl.tasks import parse_task_args as parse

    return parse(list(pairs or []))


def build_parser() -> argparse.ArgumentParser:
    """The ``pods eval`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="pods eval",
        description="Evaluate a model dir, a checkpoint, or every checkpoint (+ final) of a run directory: "
        "k samples per problem; accuracy ± standard error over the k repeats, format, pass@k, lengths. "
        "Results are appended to one JSON file (run_dir/eval.json by default).",
    )
    parser.add_argument("target", help="run directory, checkpoint/model directory, PEFT adapter dir, or hub id")
    parser.add_argument("--task", required=True, help="task name, e.g. gsm8k or arithmetic")
    parser.add_argument("--split", default="test")
    parser.add_argument("--k", type=int, default=5, help="samples per problem (default 5)")
    parser.add_argument("--temperature", type=float, default=0.9, help="0 = greedy (default 0.9)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per generate call (transformers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task-arg", "--task_arg", "--task-args", "--task_args", dest="task_arg", action="append",
                        default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="task options (repeatable; the same spellings as `pods train`)")
    parser.add_argument("--out", default=None, help="results JSON (default: RUN_DIR/eval.json)")
    parser.add_argument("--force", action="store_true", help="re-evaluate checkpoints already in the results")
    parser.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto",
                        help="generation engine (auto: vLLM if installed and CUDA present)")
    parser.add_argument("--include-base", action="store_true",
                        help="for a run directory, also evaluate its initial model (step 0)")
    from pods_rl.cli import one_line_parser_errors

    one_line_parser_errors(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``pods eval``: returns 0 on success, 2 on bad input, 1 on another failure (``--debug``: its traceback)."""
    from pods_rl.cli import run_guarded

    return run_guarded("pods eval", _main, argv)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    task_args = parse_task_args(args.task_arg)
    for name in ("k", "limit", "batch_size", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    common = dict(split=args.split, k=args.k, temperature=args.temperature,
                  max_new_tokens=args.max_new_tokens, limit=args.limit, batch_size=args.batch_size,
                  seed=args.seed, task_args=task_args, backend=args.backend, force=args.force)
    target = Path(args.target)
    if is_run_dir(target):
        out = Path(args.out) if args.out else target / DEFAULT_EVAL_FILE
        records = evaluate_run(target, args.task, out=out, include_base=args.include_base, **common)
    else:
        if target.exists() and not _is_model_dir(target):
            raise ValueError(f"{target} is neither a run directory (checkpoint-*/, final/) nor a model "
                             "directory (config.json or adapter_config.json)")
        if not target.exists():  # a path that is not there fails now, not after minutes of hub retries
            from pods_rl.train import check_model_path

            check_model_path(args.target, what="")
        out = Path(args.out) if args.out else default_out_for_model(target)
        ckpt = {"name": target.name, "path": target, "step": None, "train_seconds": None}
        records = evaluate_checkpoints([ckpt], args.task, out, **common)
    print(format_table(records))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
