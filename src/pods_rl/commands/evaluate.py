"""`pods eval`: accuracy of a model, a checkpoint, or every checkpoint of a run directory on a task.

``k`` samples per problem at ``temperature`` give ``correct`` (num_problems, k); sample ``j`` forms repeat ``j``.
A record holds ``accuracy``, ``accuracy_stderr`` (std(correct.mean(0), ddof=1) / sqrt(k); None when k == 1),
``format_accuracy``, ``both_accuracy`` (correct and well formatted), ``pass_at_k`` (unbiased, n = k),
``mean_completion_tokens`` (through the first EOS), ``step``/``train_seconds`` (``pods_clock.json``; 0 for a plain
model) and ``eval_seconds`` (``pods_rl.evaluation`` evaluates one model). Records go to one JSON list
(``run_dir/eval.json``), keyed by (checkpoint, task, split, k, temperature), rewritten atomically after each
checkpoint. Generation: vLLM when it runs here, else transformers."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pods_rl.errors import one_line_parser_errors, run_guarded, spellings
from pods_rl.evaluation import evaluate_model, resolve_task, score_sample  # noqa: F401  (re-exported: they lived here)
from pods_rl.generation import render_prompt  # noqa: F401  (re-exported: it lived here)
from pods_rl.models import check_model_path
from pods_rl.runlog import (  # noqa: F401  (re-exported: the eval.json store and run scanning lived here)
    CLOCK_FILE,
    DEFAULT_EVAL_FILE,
    KEY_FIELDS,
    REUSE_FIELDS,
    already_done,
    checkpoint_clock,
    checkpoint_problems,
    default_out_for_model,
    find_checkpoints,
    is_adapter_dir,
    is_model_dir,
    is_run_dir,
    load_results,
    load_run_config,
    record_entries,
    result_key,
    save_results,
    upsert_result,
)
from pods_rl.tasks import parse_task_args


# ------------------------------------------------------------------------------------------------------------
# Checkpoints of a run
# ------------------------------------------------------------------------------------------------------------
def _checkpoint_name(model_path: Path, out: Path) -> str:
    """Name of a model inside the results file's folder relative to it (so run dirs can move), else absolute."""
    try:
        return str(model_path.resolve().relative_to(out.resolve().parent))
    except ValueError:
        return str(model_path.resolve()) if model_path.exists() else str(model_path)


def _still_there(ckpt: dict) -> bool:
    """Whether a checkpoint found by ``find_checkpoints`` is still a complete model directory."""
    path = Path(ckpt["path"])
    return ckpt["name"] == "base" or (path.is_dir() and (path / CLOCK_FILE).is_file())


REMOVED = "removed while pods eval ran (the training run's save_total_limit rotation deletes older checkpoints)"


def checkpoint_damage(ckpt: dict) -> str | None:
    """Why a run's checkpoint (from ``find_checkpoints``) cannot be evaluated, as a short phrase, or
    None when it looks whole. Cheap: reads headers and JSON, never tensor data."""
    if ckpt["name"] == "base":
        return None  # the run's initial model: often a hub id, checked when it loads
    path = Path(ckpt["path"])
    try:
        if not path.is_dir():
            return REMOVED
        if not is_model_dir(path):
            return "no config.json or adapter_config.json (not a complete model)"
        problems = checkpoint_problems(path)
        if problems:
            file, problem = problems[0]
            return f"{file} is corrupt ({problem})"
        checkpoint_clock(path)  # a clock removed or rewritten since the scan
    except (OSError, ValueError) as err:
        return REMOVED if not path.is_dir() else f"it cannot be read ({type(err).__name__}: {str(err)[:100]})"
    return None


# Long because the skip-and-replace rules for damaged checkpoints read best in one loop.
def evaluate_checkpoints(checkpoints: list[dict], task, out, split: str = "test", k: int = 5,
                         temperature: float = 0.9, max_new_tokens: int = 512, limit: int | None = None,
                         batch_size: int = 64, seed: int = 0, task_args: dict | None = None,
                         backend: str = "auto", force: bool = False, verbose: bool = True,
                         trust_remote_code: bool = False, skipped: list | None = None) -> list[dict]:
    """Evaluate each of ``checkpoints`` (from ``find_checkpoints``) in order, saving after each; return the records.
    Records already in ``out`` are reused unless ``force``. A run's checkpoint that fails is skipped with a warning
    and a skip entry (also in ``skipped``; ``final`` stands in); a lone model (``step`` None) raises, as does nothing
    evaluated (``out`` unchanged)."""
    out = Path(out)
    task_obj = resolve_task(task, task_args)
    task_name = getattr(task_obj, "name", str(task))
    settings = {"limit": limit, "max_new_tokens": int(max_new_tokens), "seed": int(seed)}
    results, skips = [], []
    pending = list(checkpoints)
    while pending:
        ckpt = pending.pop(0)
        # The run's initial model is "base" whatever its path (often a hub id), so the key survives moves.
        name = "base" if ckpt["name"] == "base" else _checkpoint_name(Path(ckpt["path"]), out)
        key = (name, task_name, split, int(k), float(temperature))
        why = ckpt.get("why")
        existing = load_results(out)
        if why is None and not force and already_done(existing, key, settings):
            if verbose:
                print(f"skip {name}: already in {out} (use --force to redo)", file=sys.stderr)
            results.append(next(r for r in existing if result_key(r) == key))
            continue
        if why is None:
            why, record = _evaluate_or_why(ckpt, task_obj, name, split=split, k=k, temperature=temperature,
                                           max_new_tokens=max_new_tokens, limit=limit, batch_size=batch_size,
                                           seed=seed, task_args=task_args, backend=backend,
                                           trust_remote_code=trust_remote_code)
        if why is not None:
            print(f"note: {ckpt['path']} was {why}; skipped" if why == REMOVED else
                  f"warning: skipping {ckpt['path']}: {why}", file=sys.stderr)
            stand_in = ckpt.get("final")
            skips.append({"checkpoint": name, "checkpoint_path": str(ckpt["path"]), "task": task_name,
                          "split": split, "k": int(k), "temperature": float(temperature), **settings,
                          "step": ckpt.get("step"), "skipped": True, "why": why,
                          "evaluated_instead": stand_in["name"] if stand_in is not None else None,
                          "skipped_at": time.time()})
            if stand_in is not None:  # the final model has the same step: it stands in
                pending.insert(0, stand_in)
            continue
        upsert_result(out, record)
        results.append(record)
        if verbose:
            print(format_table([record], header=not results[:-1]), file=sys.stderr)
    if skips and not results:
        listed = "; ".join(f"{Path(s['checkpoint_path']).name}: {s['why']}" for s in skips)
        raise ValueError(f"no model could be evaluated: every one was skipped ({listed[:300]}); "
                         "evaluate another run or checkpoint")
    if skips:
        record_entries(out, skips)
        if skipped is not None:
            skipped.extend(skips)
    return results


def _evaluate_or_why(ckpt: dict, task_obj, name: str, **settings):
    """``(None, record)`` for a checkpoint evaluated, or ``(why, None)`` for a run's checkpoint that
    cannot be. The one model asked for by itself (``step`` None) raises instead."""
    if ckpt.get("step") is None:  # the one model asked for: what is wrong with it is an error
        problems = checkpoint_problems(ckpt["path"]) if Path(ckpt["path"]).is_dir() else []
        if problems:
            file, problem = problems[0]
            raise ValueError(f"{Path(ckpt['path']) / file} is corrupt: {problem}; evaluate another checkpoint")
    else:
        why = checkpoint_damage(ckpt)
        if why is not None:
            return why, None
    try:
        return None, evaluate_model(ckpt["path"], task_obj, name=name, **settings)
    except Exception as err:
        # A run that is still training rotates its checkpoints (save_total_limit): one listed at the start may be
        # gone by the time its turn comes, or while it loads; or its weights fail to load. Neither is an error of
        # this evaluation. A failure to generate or grade is.
        damaged = getattr(err, "pods_unloadable", None) and ckpt["name"] != "base"
        if ckpt.get("step") is None or (_still_there(ckpt) and not damaged):
            raise
        return checkpoint_damage(ckpt) or f"it failed to load ({type(err).__name__}: {str(err)[:100]})", None


def evaluate_run(run_dir, task, out=None, include_base: bool = False, **settings) -> list[dict]:
    """Evaluate every checkpoint (+ final) of ``run_dir`` by step into ``run_dir/eval.json`` (or ``out``);
    returns the records in step order. ``settings`` (k, split, ...) and skips are as in ``evaluate_checkpoints``."""
    run_dir = Path(run_dir)
    scan_skips: list[dict] = []
    checkpoints = find_checkpoints(run_dir, include_base=include_base, verbose=False, skipped=scan_skips)
    if not checkpoints:
        for skip in scan_skips:
            print(f"warning: skipping {skip['path']}: {skip['why']}", file=sys.stderr)
        raise ValueError(f"{run_dir} has no checkpoint-*/ or final/ model directories to evaluate")
    return evaluate_checkpoints([*scan_skips, *checkpoints], task, out or run_dir / DEFAULT_EVAL_FILE, **settings)


# --- terminal table -----------------------------------------------------------------------------------------
def skip_line(skip: dict) -> str:
    """The line naming one skipped checkpoint (a skip entry of ``evaluate_checkpoints``) and why."""
    instead = f"; {skip['evaluated_instead']}/ (the same step) was evaluated in its place" \
        if skip.get("evaluated_instead") else ""
    return f"skipped {skip['checkpoint']}: {skip['why']}{instead}"


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
    parser.add_argument(*spellings("--max-new-tokens"), type=int, default=512)
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    parser.add_argument(*spellings("--batch-size"), type=int, default=64,
                        help="sequences per generate call (transformers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task-arg", "--task_arg", "--task-args", "--task_args", dest="task_arg", action="append",
                        default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="task options (repeatable; the same spellings as `pods train`)")
    parser.add_argument("--out", default=None, help="results JSON (default: RUN_DIR/eval.json)")
    parser.add_argument("--force", action="store_true", help="re-evaluate checkpoints already in the results")
    parser.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto",
                        help="generation engine (auto: vLLM when it can run the model here: CUDA, or vLLM's CPU "
                        "build with a head size its CPU attention takes)")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", type=_true_or_false, default=False,
                        metavar="true|false", help="let a model's own Python code (auto_map) run: only for a model "
                        "from a source you trust (default false: such a model is refused)")
    parser.add_argument(*spellings("--include-base"), action="store_true",
                        help="for a run directory, also evaluate its initial model (step 0)")
    one_line_parser_errors(parser)
    return parser


def _true_or_false(text: str) -> bool:
    """``true`` / ``false`` (as `pods train` spells its booleans) -> bool."""
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value in ("true", "1", "yes")


def main(argv: Sequence[str] | None = None) -> int:
    """``pods eval``: returns 0 on success, 2 on bad input, 1 on another failure (``--debug``: its traceback)."""
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
                  seed=args.seed, task_args=task_args, backend=args.backend, force=args.force,
                  trust_remote_code=args.trust_remote_code)
    target, skipped = Path(args.target), []
    if is_run_dir(target):
        out = Path(args.out) if args.out else target / DEFAULT_EVAL_FILE
        records = evaluate_run(target, args.task, out=out, include_base=args.include_base, skipped=skipped, **common)
    else:
        if target.exists() and not is_model_dir(target):
            raise ValueError(f"{target} is neither a run directory (checkpoint-*/, final/) nor a model "
                             "directory (config.json or adapter_config.json)")
        if not target.exists():  # a path that is not there fails now, not after minutes of hub retries
            check_model_path(args.target, what="")
        out = Path(args.out) if args.out else default_out_for_model(target)
        ckpt = {"name": target.name, "path": target, "step": None, "train_seconds": None}
        records = evaluate_checkpoints([ckpt], args.task, out, **common)
    print(format_table(records))
    for skip in skipped:  # after the table, where they are read (the warnings scroll by with the progress bars)
        print(skip_line(skip))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
