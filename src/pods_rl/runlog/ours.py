"""What a pods-rl run directory is, so that `pods train` never writes over what is not its own."""

from __future__ import annotations

import os
from pathlib import Path

from pods_rl.runlog.lock import LOCK_FILE
from pods_rl.runlog.store import (
    CLOCK_FILE,
    METRICS_FILE,
    RUN_MARKER,
    list_checkpoints,
    load_run_config,
    read_metrics,
)

# What a resolved config.yaml has and a user's recipe rarely has all of (a run written before RUN_MARKER existed).
RESOLVED_CONFIG_KEYS = frozenset({"accept_config_changes", "downsample_rule", "downsample_to", "eval_before_after",
                                  "num_generations", "output_dir"})
# Entries that do not make a directory "hold files": our lock, and what file systems and desktops leave around.
IGNORABLE = frozenset({LOCK_FILE, ".DS_Store", "Thumbs.db", "lost+found", ".ipynb_checkpoints", ".gitkeep"})


def is_pods_run(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` is a pods-rl run: ``RUN_MARKER``, or (an older run) a clocked checkpoint, metrics
    rows with ``train_seconds``, or a resolved config.yaml (all of ``RESOLVED_CONFIG_KEYS``)."""
    run_dir = Path(run_dir)
    if (run_dir / RUN_MARKER).is_file():
        return True
    models = [*list_checkpoints(run_dir, complete_only=False), run_dir / "final"]
    if any((path / CLOCK_FILE).is_file() for path in models):
        return True
    rows = read_metrics(run_dir)[:1] if (run_dir / METRICS_FILE).is_file() else []
    if rows and isinstance(rows[0], dict) and "train_seconds" in rows[0] and "step" in rows[0]:
        return True
    try:
        config = load_run_config(run_dir)
    except ValueError:
        return False
    return RESOLVED_CONFIG_KEYS <= config.keys()


def foreign_entries(run_dir: str | os.PathLike) -> list[str]:
    """The names in ``run_dir`` that show it holds something (``IGNORABLE`` and NFS ``.nfs*`` files aside)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(p.name for p in run_dir.iterdir()
                  if p.name not in IGNORABLE and not p.name.startswith((".nfs", ".pods-write-test-")))


def check_not_foreign(run_dir: str | os.PathLike) -> None:
    """Refuse (ValueError, one line) a non-empty ``run_dir`` that is not a pods-rl run: `pods train` would write
    its config.yaml, README.md (the model card), metrics and checkpoints over what is there."""
    entries = foreign_entries(run_dir)
    if entries and not is_pods_run(run_dir):
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ValueError(f"--output_dir {run_dir} holds files that are not a pods-rl run ({shown}); `pods train` "
                         "writes config.yaml, README.md, metrics.jsonl and checkpoints there, so it only uses an empty "
                         "or new directory, or a run of its own: pass another --output_dir (nothing was changed)")


