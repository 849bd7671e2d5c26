"""The run directory, read and written in one place::

    run_dir/
      config.yaml          the resolved configuration (a changed resume keeps the old as config.until-step-N.yaml)
      metrics.jsonl        one JSON row per logging step, each with "step" and "train_seconds"
      checkpoint-<step>/   HF checkpoint + pods_clock.json {"step", "train_seconds"}, written last (else incomplete)
      final/               the final model + pods_clock.json
      eval.json            `pods eval` records (``runlog.evals``)
      summary.json         what `pods train` reports at its end (or where it stopped)
      .pods-run            marks a pods-rl run;  .pods-train.lock: held by the owning `pods train`
      _set_aside/          what a resume moved out of the way; never deleted by pods-rl

Plain files only (json, yaml): no torch, no transformers."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import yaml

from pods_rl.errors import storage_fault

logger = logging.getLogger("pods_rl.runlog")

CLOCK_FILE = "pods_clock.json"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
DEFAULT_EVAL_FILE = "eval.json"
# An eval.json record is keyed by these: evaluating the same key again replaces the record.
KEY_FIELDS = ("checkpoint", "task", "split", "k", "temperature")
# A record with the same key is only reused ("skipped") when these settings also match.
REUSE_FIELDS = ("limit", "max_new_tokens", "seed")
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and ``os.replace`` (never half-written)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # one per process: two writers never share it
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=json_default)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def json_default(value):
    """JSON for what json cannot write: tensors and numpy scalars by value, anything else as text."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def clock_problem(checkpoint_dir: str | os.PathLike) -> str | None:
    """Why a checkpoint has no usable clock: ``"missing"``, what is wrong with the file, or None when fine."""
    path = Path(checkpoint_dir) / CLOCK_FILE
    if not path.is_file():
        return "missing"
    try:
        clock = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"its {CLOCK_FILE} cannot be read ({type(err).__name__}: {str(err)[:80]})"
    try:
        int(clock["step"]), float(clock["train_seconds"])
    except (TypeError, KeyError, ValueError):
        return f"its {CLOCK_FILE} is not a {{'step', 'train_seconds'}} record ({str(clock)[:60]})"
    return None


def read_clock(checkpoint_dir: str | os.PathLike) -> dict | None:
    """A checkpoint's ``{"step", "train_seconds"}``, or None if missing (incomplete) or unreadable."""
    if clock_problem(checkpoint_dir) is not None:
        return None
    clock = json.loads((Path(checkpoint_dir) / CLOCK_FILE).read_text())
    return {**clock, "step": int(clock["step"]), "train_seconds": float(clock["train_seconds"])}


def list_checkpoints(run_dir: str | os.PathLike, complete_only: bool = True) -> list[Path]:
    """``checkpoint-<step>`` directories of a run, sorted by step; by default only complete ones."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = []
    for child in run_dir.iterdir():
        match = _CHECKPOINT_RE.match(child.name)
        if match and child.is_dir() and (not complete_only or read_clock(child) is not None):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """Rows of ``metrics.jsonl``; a torn last line (a run killed mid-write) is ignored."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    # A kill mid-write can cut a multi-byte character: undecodable bytes make that line torn, not the file unreadable.
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("ignoring a torn line in %s", path)
    return rows


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is a ``checkpoint-<step>`` directory name."""
    return _CHECKPOINT_RE.match(name) is not None


def move_aside(path: Path, suffix: str, into: Path | None = None) -> Path:
    """Rename ``path`` to ``<name><suffix>`` in ``into`` (default its folder; ``-2``... if taken); the new path."""
    folder = into or path.parent
    target, i = folder / (path.name + suffix), 2
    while target.exists():
        target = folder / f"{path.name}{suffix}-{i}"
        i += 1
    os.replace(path, target)
    return target


SET_ASIDE_DIR = "_set_aside"


def set_aside(run_dir: str | os.PathLike, path: Path, suffix: str = "") -> Path:
    """Move ``path`` into ``run_dir/_set_aside/`` (kept, beyond TRL's rotation); returns where it went."""
    folder = Path(run_dir) / SET_ASIDE_DIR
    folder.mkdir(exist_ok=True)
    return move_aside(path, suffix, into=folder)


def prepare_resume(run_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None, modify: bool = True
                   ) -> tuple[Path | None, float]:
    """Make ``run_dir`` consistent for resuming; return (the checkpoint to resume, its training seconds).

    Unless ``modify=False``: moves the newest clockless checkpoint to ``.incomplete``, other clockless ones and those
    after ``checkpoint`` to ``_set_aside/``, and later metrics rows to ``metrics.rolled_back.jsonl``."""
    run_dir = Path(run_dir)
    found = list_checkpoints(run_dir, complete_only=False)
    for path in found if modify else []:
        problem = clock_problem(path)
        if problem is None:
            continue
        if problem == "missing" and path == found[-1]:
            target = move_aside(path, ".incomplete")
            logger.warning("checkpoint %s is incomplete (no %s: killed while saving): moved to %s", path, CLOCK_FILE,
                           target.name)
        else:
            why = f"no {CLOCK_FILE}, though later checkpoints exist" if problem == "missing" else problem
            target = set_aside(run_dir, path)
            logger.warning("warning: %s is not resumable (%s): moved to %s with its weights, which are kept (not "
                           "used for resuming; restore its %s to use it again)", path, why, target, CLOCK_FILE)
    final = run_dir / "final"
    if modify and checkpoint is None and final.is_dir() and clock_problem(final) is not None:
        # A final model whose clock is unreadable: the run resumes and writes a new final/; keep this one.
        target = set_aside(run_dir, final)
        logger.warning("warning: %s has no readable %s: moved to %s with its weights (kept); the run resumes from "
                       "its last checkpoint", final, CLOCK_FILE, target)
    checkpoints = list_checkpoints(run_dir)
    if checkpoint is not None:
        last = Path(checkpoint)
        step = read_clock(last)["step"]
        later = [p for p in checkpoints if read_clock(p)["step"] > step]
        if (run_dir / "final").is_dir():
            later.append(run_dir / "final")
        for path in later if modify else []:
            target = set_aside(run_dir, path, ".rolled_back")
            logger.warning("resuming from %s: moved the later %s aside to %s", last.name, path.name, target.name)
    else:
        last = checkpoints[-1] if checkpoints else None
    clock = read_clock(last) if last else {"step": 0, "train_seconds": 0.0}
    if not modify:
        return last, float(clock["train_seconds"])
    rows = read_metrics(run_dir)
    keep = [r for r in rows if r.get("step", 0) <= clock["step"]]
    dropped = [r for r in rows if r.get("step", 0) > clock["step"]]
    if dropped:
        with open(run_dir / "metrics.rolled_back.jsonl", "a") as f:
            f.writelines(json.dumps(row, default=json_default) + "\n" for row in dropped)
    if dropped or (run_dir / METRICS_FILE).exists():
        tmp = run_dir / f".{METRICS_FILE}.tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row, default=json_default) + "\n" for row in keep)
        os.replace(tmp, run_dir / METRICS_FILE)
    return last, float(clock["train_seconds"])


_INCOMPLETE_RE = re.compile(r"^checkpoint-(\d+)\.incomplete(-\d+)?$")


def remove_incomplete(run_dir: str | os.PathLike, complete_step: int) -> list[Path]:
    """Delete ``checkpoint-N.incomplete*`` leftovers with N <= ``complete_step``; returns what was removed."""
    removed = []
    for child in Path(run_dir).iterdir():
        match = _INCOMPLETE_RE.match(child.name)
        if match and int(match.group(1)) <= complete_step and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            logger.info("removed the incomplete leftover %s: checkpoint-%d is complete", child.name, complete_step)
            removed.append(child)
    return removed


def disk_full_message(err: BaseException, run_dir: str | os.PathLike, step: int, saving: str | None = None
                      ) -> str | None:
    """One line for an error raised by a full disk (quota, read-only or failing file system) while
    writing ``saving`` (default ``checkpoint-<step>``), or None if ``err`` is something else."""
    fault = storage_fault(err)
    if fault is None:
        return None
    saving = saving or f"checkpoint-{step}"
    complete = list_checkpoints(run_dir)
    kept = f"the last complete checkpoint is {complete[-1].name}" if complete else "no checkpoint was complete yet"
    return (f"{fault[0]} while saving {saving} in {run_dir} (step {step}): nothing complete was lost ({kept}; a "
            f"partial {saving} is set aside on resume); {fault[1]}, then resume with --output_dir {run_dir} "
            "--resume_from_checkpoint true")


def write_summary(run_dir: str | os.PathLike, summary: dict) -> None:
    """``summary.json``: what the run reports at its end (or where a signal stopped it)."""
    write_json_atomic(Path(run_dir) / SUMMARY_FILE, summary)


def read_summary(run_dir: str | os.PathLike) -> dict | None:
    """A run's ``summary.json``, or None when it is absent or torn (the run has not ended)."""
    try:
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def run_finished(run_dir: str | os.PathLike) -> bool:
    """Whether a run trained to its end: summary.json written, and not by a graceful stop (``stopped_by``)."""
    summary = read_summary(run_dir)
    return summary is not None and "stopped_by" not in summary


def run_stopped(run_dir: str | os.PathLike) -> bool:
    """Whether a signal stopped the run gracefully (summary.json says ``stopped_by``; it can resume)."""
    summary = read_summary(run_dir)
    return summary is not None and "stopped_by" in summary


def write_clock(model_dir: str | os.PathLike, step: int, train_seconds: float) -> None:
    """``pods_clock.json`` of a saved model: written last, its presence marks the directory complete."""
    write_json_atomic(Path(model_dir) / CLOCK_FILE, {"step": step, "train_seconds": train_seconds})


# --- the configuration and its history ----------------------------------------------------------------------
# Settings that do not change what is trained: budgets, saving, logging, evaluation, threads. A resume may change
# them freely; any other difference from config.yaml needs --accept_config_changes.
NOT_TRAINING_FIELDS = frozenset({
    "output_dir", "resume_from_checkpoint", "accept_config_changes", "overwrite_output_dir", "max_steps",
    "num_train_epochs", "max_train_seconds", "save_every_seconds", "save_steps", "save_strategy", "save_total_limit",
    "save_only_model", "logging_dir", "logging_steps", "logging_strategy", "logging_first_step", "report_to",
    "run_name", "disable_tqdm", "log_completions", "num_completions_to_print", "log_level", "push_to_hub",
    "hub_model_id", "hub_strategy", "hub_private_repo", "dataloader_num_workers", "torch_threads", "eval_split",
    "eval_num_problems", "eval_k", "eval_temperature", "eval_max_new_tokens", "eval_batch_size",
    "eval_every_seconds", "eval_every_steps", "eval_before_after", "run_figure", "stop_grace_seconds",
    "reward_timeout_s", "allow_data_change", "max_row_bytes",
})


def load_run_config(run_dir) -> dict:
    """The run's config.yaml as a dict ({} if absent); a file that is not a YAML mapping is a ValueError."""
    config_path = Path(run_dir) / CONFIG_FILE
    if not config_path.is_file():
        return {}
    way_on = (f"restore it, or move it aside (mv {config_path} {config_path}.broken) and run again: `pods train` "
              "then writes the settings of its command line as the run's config")
    try:
        config = yaml.safe_load(config_path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{config_path} is not text (byte {err.start} is not UTF-8: binary or damaged); "
                         f"{way_on}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{config_path} is not valid YAML{where} ({getattr(err, 'problem', None) or err}); "
                         f"{way_on}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a mapping of settings, got a YAML {type(config).__name__}; "
                         f"{way_on}")
    return config


def config_changes(old: dict, new: dict) -> dict:
    """``{field: (old, new)}`` for the training fields whose values differ (fields new in this version skipped)."""
    return {key: (old[key], new.get(key)) for key in sorted(old)
            if key not in NOT_TRAINING_FIELDS and key in new and old[key] != new[key]}


def free_name(path: Path) -> Path:
    """``path``, or ``path`` with ``-2``, ``-3``... before the suffix if it is taken."""
    candidate, i = path, 2
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{i}{path.suffix}")
        i += 1
    return candidate


def save_config(run_dir: str | os.PathLike, flat: dict, resume: bool, resumed_from: Path | None) -> int | None:
    """Write ``config.yaml`` from ``flat``. On a resume whose settings differ, the previous one becomes
    ``config.until-step-N.yaml`` (N: the step of ``resumed_from``) and N is returned; None otherwise."""
    config_file, changed_at = Path(run_dir) / CONFIG_FILE, None
    mark_as_run(run_dir)
    if config_file.is_file() and resume:
        old = load_run_config(run_dir)
        if {k: v for k, v in old.items() if k != "resume_from_checkpoint"} != {
                k: v for k, v in flat.items() if k != "resume_from_checkpoint"}:
            changed_at = read_clock(resumed_from)["step"] if resumed_from else 0
            os.replace(config_file, free_name(Path(run_dir) / f"config.until-step-{changed_at}.yaml"))
    if not config_file.is_file() or not resume:
        config_file.write_text(yaml.safe_dump(flat, sort_keys=True))
    return changed_at


# --- starting and resuming ----------------------------------------------------------------------------------
class RunFinished(Exception):
    """Resuming a run that already finished: nothing to do (not an error)."""


def check_output_dir(run_dir: Path) -> None:
    """``run_dir`` must be a directory (or creatable as one) in a writable place."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--output_dir {run_dir} is a file; pass a directory path")
    ancestor = run_dir.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"--output_dir {run_dir} lies under {ancestor}, which is a file; pass another path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"--output_dir {run_dir}: {ancestor} is not writable; pass a path in a writable place")
    # os.access trusts permission bits; a read-only mount or a pseudo file system (/proc) only shows when one tries.
    # An empty directory made and removed at once leaves nothing behind.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pods-write-test-", dir=ancestor))
    except OSError as err:
        raise ValueError(f"--output_dir {run_dir}: cannot create anything in {ancestor} ({err.strerror}); pass a "
                         "path in a writable place") from None


RUN_MARKER = ".pods-run"  # marks a directory as a pods-rl run (see runlog.ours)


def mark_as_run(run_dir: str | os.PathLike) -> None:
    """Write ``RUN_MARKER``: this directory is a pods-rl run (``is_pods_run``)."""
    marker = Path(run_dir) / RUN_MARKER
    if not marker.exists():
        marker.write_text("pods-rl run directory (this file marks it; `pods train` writes only into such "
                          "directories or empty ones)\n")


def holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` already holds a run (a checkpoint, complete or not, or a metrics log)."""
    return bool(list_checkpoints(run_dir, complete_only=False)) or (run_dir / METRICS_FILE).exists()


def plan_resume(run_dir: Path, resume_from_checkpoint, output_dir_given: bool) -> Path | None:
    """Check a resume request before anything loads; returns the explicit checkpoint asked for, if any.
    Raises ``RunFinished`` for a run that already ended."""
    explicit = None if str(resume_from_checkpoint).lower() == "true" else Path(resume_from_checkpoint)
    if not output_dir_given:
        hint = f" {explicit.parent}" if explicit is not None else " RUN_DIR"
        raise ValueError(f"--resume_from_checkpoint needs the run directory to continue: pass --output_dir{hint}")
    run_dir = Path(run_dir)
    if explicit is not None and not explicit.exists() and (run_dir / explicit).is_dir():
        explicit = run_dir / explicit  # a checkpoint named relative to the run directory (checkpoint-20)
    if not run_dir.is_dir():
        raise ValueError(f"--resume_from_checkpoint is set but the run directory {run_dir} does not exist; drop "
                         "--resume_from_checkpoint to start a new run there")
    if explicit is not None:
        complete = [p.name for p in list_checkpoints(run_dir)]
        if (not explicit.is_dir() or explicit.resolve().parent != run_dir.resolve()
                or not is_checkpoint_name(explicit.name)):
            raise ValueError(f"--resume_from_checkpoint {explicit} is not a checkpoint directory of --output_dir "
                             f"{run_dir}; complete checkpoints there: {complete}")
        problem = clock_problem(explicit)
        if problem is not None:
            why = f"is incomplete (no {CLOCK_FILE})" if problem == "missing" else f"is not resumable: {problem}"
            raise ValueError(f"--resume_from_checkpoint {explicit} {why}; choose a complete one: {complete}")
        return explicit
    finished = read_clock(run_dir / "final")
    if finished is not None:
        last = list_checkpoints(run_dir)
        raise RunFinished(
            f"{run_dir} already finished (final/ at step {finished['step']}, "
            f"{float(finished['train_seconds']):.0f} s of training); nothing was changed. To train on, resume from "
            f"an explicit checkpoint (--resume_from_checkpoint {last[-1] if last else run_dir / 'checkpoint-N'} "
            "with a larger budget) or start a new run from --model_name_or_path " + str(run_dir / "final"))
    return None
