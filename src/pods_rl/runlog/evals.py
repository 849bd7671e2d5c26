"""What `pods eval` reads and writes in a run directory: a run's saved models and ``eval.json`` (records
keyed by KEY_FIELDS, upserted under the file's own lock, written atomically). Plain files only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pods_rl.runlog.lock import exclusive, lock_path_for
from pods_rl.runlog.store import (
    CLOCK_FILE,
    CONFIG_FILE,
    DEFAULT_EVAL_FILE,
    KEY_FIELDS,
    REUSE_FIELDS,
    clock_problem,
    is_checkpoint_name,
    load_run_config,
    write_json_atomic,
)


# --- eval.json ----------------------------------------------------------------------------------------------
def result_key(record: dict) -> tuple:
    """(checkpoint, task, split, k, temperature): records with equal keys replace each other."""
    return tuple(record[f] if f != "temperature" else float(record[f]) for f in KEY_FIELDS)


def is_skip(entry: dict) -> bool:
    """Whether an eval.json entry records a skipped checkpoint (``"skipped": true``) rather than a result."""
    return entry.get("skipped") is True


def load_entries(path) -> list[dict]:
    """Every entry of an eval JSON file, results and skips ([] if absent); refuses a corrupt or foreign file."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        records = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); move it away or fix it before evaluating") from err
    if not isinstance(records, list):
        raise ValueError(f"{path} must hold a JSON list of eval records, got {type(records).__name__}")
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not set(KEY_FIELDS) <= record.keys():
            # Not ours: writing our records into it would replace what it holds.
            raise ValueError(f"{path} is not a `pods eval` results file (item {i} is not an eval record with "
                             f"{list(KEY_FIELDS)}); pass another --out, nothing was changed")
    return records


def load_results(path) -> list[dict]:
    """The evaluation records of an eval JSON file ([] when absent), skip entries left out."""
    return [r for r in load_entries(path) if not is_skip(r)]


def load_skips(path) -> list[dict]:
    """The skip entries of an eval JSON file (``{"checkpoint", "why", "skipped": true, ...}``), one per key."""
    return [r for r in load_entries(path) if is_skip(r)]


def save_results(path, records: list[dict]) -> None:
    """Write ``records`` to ``path`` atomically: a crash leaves either the old or the new file, never half."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, records)


def upsert_result(path, record: dict) -> list[dict]:
    """Add ``record`` to ``path``, replacing the entry with its key, under the file's own lock; all results."""
    return record_entries(path, [record])


def record_entries(path, entries: list[dict]) -> list[dict]:
    """Add ``entries`` (results and skips) to ``path`` in one locked read-modify-write; each replaces the
    entry with its key, but a skip never replaces a result. Returns all results of the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(lock_path_for(path), what="pods eval"):
        records = load_entries(path)
        for entry in entries:
            key = result_key(entry)
            if is_skip(entry) and any(result_key(r) == key and not is_skip(r) for r in records):
                continue
            records = [r for r in records if result_key(r) != key] + [entry]
        save_results(path, records)
    return [r for r in records if not is_skip(r)]


def already_done(records: list[dict], key: tuple, settings: dict) -> bool:
    """Whether ``records`` hold ``key`` evaluated with the same ``REUSE_FIELDS`` ``settings``."""
    return any(result_key(r) == key and all(r.get(f) == settings[f] for f in REUSE_FIELDS) for r in records)


def default_out_for_model(model_path) -> Path:
    """Where a single model's results go: its run dir (a checkpoint), the model dir, or ./eval.json (hub id)."""
    path = Path(model_path)
    if not path.is_dir():
        return Path(DEFAULT_EVAL_FILE)
    if (path / CLOCK_FILE).is_file() and (path.parent / CONFIG_FILE).is_file():
        return path.parent / DEFAULT_EVAL_FILE
    return path / DEFAULT_EVAL_FILE


# --- the saved models of a run ------------------------------------------------------------------------------
def is_adapter_dir(path) -> bool:
    """Whether ``path`` holds a PEFT adapter (``adapter_config.json``) rather than a full model."""
    return (Path(path) / "adapter_config.json").is_file()


def is_model_dir(path) -> bool:
    """Whether ``path`` holds a saved model: a full one (``config.json``) or a PEFT adapter."""
    return (Path(path) / "config.json").is_file() or is_adapter_dir(path)


def checkpoint_clock(model_dir) -> tuple[int, float]:
    """(step, train_seconds) of ``model_dir/pods_clock.json``; (0, 0.0) if absent; ValueError if malformed."""
    clock_path = Path(model_dir) / CLOCK_FILE
    if not clock_path.is_file():
        return 0, 0.0
    try:
        clock = json.loads(clock_path.read_text())
        return int(clock["step"]), float(clock["train_seconds"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{clock_path} is not a valid clock file ({{'step', 'train_seconds'}}): {err}") from err


def is_run_dir(path) -> bool:
    """A run directory has ``checkpoint-*`` or ``final`` model dirs (and usually config.yaml)."""
    path = Path(path)
    return path.is_dir() and not is_model_dir(path) and bool(find_checkpoints(path, verbose=False))


def find_checkpoints(run_dir, include_base: bool = False, verbose: bool = True,
                     skipped: list | None = None) -> list[dict]:
    """Model dirs of a run, sorted by step: [{"name", "path", "step", "train_seconds"}].

    ``checkpoint-<N>`` and ``final`` dirs holding a model and ``pods_clock.json`` (written last); others (incomplete,
    no config, unreadable, vanished) are skipped with a warning (when ``verbose``) and appended to ``skipped``
    (``{"name", "path", "why"}``). A ``final`` with the same step as a checkpoint rides along as its ``"final"``.
    ``include_base`` prepends the run's initial model at step 0."""
    run_dir = Path(run_dir)
    candidates = [p for p in run_dir.glob("checkpoint-*") if is_checkpoint_name(p.name)]
    found = []
    for path in candidates + [run_dir / "final"]:
        try:
            if not path.is_dir():
                continue  # gone (or never there): nothing to say
            if not is_model_dir(path) and not path.is_dir():
                continue  # removed just now
            why = None if is_model_dir(path) else "no config.json or adapter_config.json (not a complete model)"
            problem = None if why else clock_problem(path)
            if problem is not None:
                why = f"no {CLOCK_FILE} (incomplete checkpoint)" if problem == "missing" else problem
            if why is None:
                step, seconds = checkpoint_clock(path)
        except (OSError, ValueError) as err:  # removed or rewritten between the checks above, or unreadable
            why = f"it could not be read ({type(err).__name__}: {str(err)[:80]})"
        if why is not None:
            if verbose:
                print(f"warning: skipping {path}: {why}", file=sys.stderr)
            if skipped is not None:
                skipped.append({"name": path.name, "path": path, "why": why})
            continue
        found.append({"name": path.name, "path": path, "step": step, "train_seconds": seconds})
    final = next((c for c in found if c["name"] == "final"), None)
    same_step = [c for c in found if final is not None and c is not final and c["step"] == final["step"]]
    if same_step:
        same_step[-1]["final"] = final
        found.remove(final)
    found.sort(key=lambda c: (c["step"], c["name"] == "final"))
    if include_base:
        base = load_run_config(run_dir).get("model_name_or_path")
        if not base:
            raise ValueError(f"{run_dir}/config.yaml names no model_name_or_path; cannot evaluate the base model")
        found.insert(0, {"name": "base", "path": Path(base), "step": 0, "train_seconds": 0.0})
    return found
