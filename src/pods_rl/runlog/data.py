"""What a run trains on: a fingerprint of its training rows in ``data.json``, checked when the run resumes.

    data_fingerprint(rows, source)   {"sha256", "rows", "columns", "source"} of the rows a run trains on
    check_data_change(run_dir, new, allow, explained)
                                     None when the data is what the run recorded (or it recorded nothing: a run
                                     of an earlier version); else the change, if allowed, or one ValueError line
    record_data(run_dir, new, step, change)
                                     write data.json (atomically): the fingerprint, and every change a resume made

The fingerprint hashes the rows themselves (every column, the rendered prompt included), whatever produced them:
a JSONL file rewritten in place, a hub dataset that moved on, a generator whose output changed with a version, a
different system prompt. ``source`` says where they came from (task, its options, split, limit): the resolved
config.yaml checks those settings already; this checks what they produced.
"""

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
    """The fingerprint of ``rows`` (a ``datasets.Dataset``, or anything with ``column_names``, ``len`` and
    ``rows[column]`` -> list): sha256 over every column, in name order, of canonical JSON; ``source`` (task,
    options, split, limit) is kept beside it, for the reader. One pass over the data (seconds for 100k rows)."""
    digest = hashlib.sha256()
    columns = sorted(rows.column_names)
    for column in columns:
        digest.update(json.dumps(column).encode())
        for value in rows[column]:
            digest.update(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
            digest.update(b"\n")
    return {"sha256": digest.hexdigest(), "rows": len(rows), "columns": columns, "source": source}


def read_data_record(run_dir) -> dict | None:
    """``data.json`` of ``run_dir`` as a dict, or None when the run has none (a run of an earlier version) or it
    cannot be read (it is then written anew: the record is a check, not the data)."""
    try:
        record = json.loads((Path(run_dir) / DATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("fingerprint"), dict) else None


def _describe(fingerprint: dict) -> str:
    return f"{fingerprint.get('rows')} rows, sha256 {str(fingerprint.get('sha256'))[:12]}"


def check_data_change(run_dir, new: dict, allow: bool, explained: bool = False) -> dict | None:
    """Compare the training rows of a resume (``new``) with those ``run_dir`` recorded. None when they are the same
    or nothing was recorded. A change is returned (``{"from", "to", "allowed_by"}``) when ``allow``
    (``--allow_data_change true``) or ``explained`` (an accepted change of a data-defining setting); otherwise it
    is one ValueError line naming both and the fix."""
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
    """Write ``data.json``: ``new`` as the current fingerprint, the earlier changes kept, and ``change`` (from
    ``check_data_change``) added with the ``step`` from which the new data applies."""
    record = read_data_record(run_dir) or {"changes": []}
    changes = list(record.get("changes") or [])
    if change is not None:
        changes.append({"from_step": step, **change})
    write_json_atomic(Path(run_dir) / DATA_FILE, {"fingerprint": new, "changes": changes})
