"""What a run trains on: a fingerprint of its training rows (every column, the rendered prompt included) in
``data.json``, checked when the run resumes, whatever produced the rows (a file rewritten, a dataset moved on)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pods_rl.runlog.store import write_json_atomic

DATA_FILE = "data.json"
ALLOW_FLAG = "--allow_data_change true"
# config.yaml fields that define the training rows: a resume that changes them (accepted with
# --accept_config_changes) changes the data knowingly.
DATA_FIELDS = ("task", "task_args", "train_split", "train_limit")


def data_fingerprint(rows, source: dict) -> dict:
    """``{"sha256", "rows", "columns", "source"}`` of ``rows``: sha256 of every column's canonical JSON."""
    digest = hashlib.sha256()
    columns = sorted(rows.column_names)
    for column in columns:
        digest.update(json.dumps(column).encode())
        for value in rows[column]:
            digest.update(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
            digest.update(b"\n")
    return {"sha256": digest.hexdigest(), "rows": len(rows), "columns": columns, "source": source}


def read_data_record(run_dir) -> dict | None:
    """``data.json`` of ``run_dir`` as a dict, or None when absent or unreadable (then written anew)."""
    try:
        record = json.loads((Path(run_dir) / DATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("fingerprint"), dict) else None


def _describe(fingerprint: dict) -> str:
    return f"{fingerprint.get('rows')} rows, sha256 {str(fingerprint.get('sha256'))[:12]}"


def check_data_change(run_dir, new: dict, allow: bool, explained: bool = False) -> dict | None:
    """Compare a resume's rows (``new``) with those recorded: None when the same or none recorded; the
    change (``{"from", "to", "allowed_by"}``) when ``allow`` or ``explained``; else one ValueError line."""
    record = read_data_record(run_dir)
    if record is None or record["fingerprint"].get("sha256") == new["sha256"]:
        return None
    old = record["fingerprint"]
    if not (allow or explained):
        where = ", ".join(f"{k} {v!r}" for k, v in new.get("source", {}).items() if v is not None)
        raise ValueError(f"the training data changed since {run_dir} recorded it in {DATA_FILE} (was "
                         f"{_describe(old)}; now {_describe(new)}; {where}): this resume would train on other data "
                         f"without a word; restore the data, or pass {ALLOW_FLAG} to continue on the new data (the "
                         f"change is recorded in {DATA_FILE}); nothing was changed")
    return {"from": old["sha256"], "to": new["sha256"], "rows_from": old.get("rows"), "rows_to": new["rows"],
            "allowed_by": ALLOW_FLAG if allow else "--accept_config_changes true (a data setting changed)"}


def record_data(run_dir, new: dict, step: int, change: dict | None = None) -> None:
    """Write ``data.json``: ``new`` as current, earlier changes kept, ``change`` added at ``step``."""
    record = read_data_record(run_dir) or {"changes": []}
    changes = list(record.get("changes") or [])
    if change is not None:
        changes.append({"from_step": step, **change})
    write_json_atomic(Path(run_dir) / DATA_FILE, {"fingerprint": new, "changes": changes})
