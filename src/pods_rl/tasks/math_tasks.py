"""Competition math: ``math`` (Hendrycks MATH), ``math500`` (MATH-500) and ``amc23`` (AMC 2023).

From the hub by default, or ``data_dir=``: ``{split}.jsonl``, or for MATH the original ``{split}/{subject}/{id}.json``
layout. Rows need ``problem`` (or ``question``) and ``answer`` or a ``solution`` ending in a boxed answer.
(Not named ``math.py``: it would shadow the standard library.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pods_rl.tasks.base import DEFAULT_MAX_ROW_BYTES, Task, row_too_long
from pods_rl.tasks.jsonl import gold_answer, pick_field, read_jsonl, rows_to_dataset
from pods_rl.tasks.rewards import extract_last_boxed

MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


def boxed_answer(solution: str) -> str:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces) of a solution."""
    answer = extract_last_boxed(solution)
    if answer is None:
        raise ValueError(f"solution has no \\boxed{{...}} answer: ...{solution[-120:]!r}")
    return answer


def normalize_math_rows(raw, source: str) -> list[dict]:
    """Rows with ``question``, ``answer`` (and ``solution``/``level``/``subject``) from MATH-like rows."""
    rows = []
    for line, row in enumerate(raw, start=1):
        question = pick_field(row, ("problem", "question", "prompt"), source, line)
        solution = row.get("solution")
        if row.get("answer") is not None:
            answer = gold_answer(row["answer"], source, line)
        elif solution is not None:
            try:
                boxed = boxed_answer(str(solution))
            except ValueError as err:
                raise ValueError(f"{source} row {line}: {err}") from err
            answer = gold_answer(boxed, source, line)
        else:
            raise ValueError(
                f"{source} row {line} has neither 'answer' nor 'solution' (it has {sorted(row)})"
            )
        out = {"question": str(question), "answer": answer, "solution": str(solution or "")}
        out["level"] = str(row.get("level", ""))
        out["subject"] = str(row.get("subject", row.get("type", "")))
        rows.append(out)
    if not rows:
        raise ValueError(f"{source} has no rows")
    return rows


def load_local(data_dir: str, split: str, task_name: str,
               max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES) -> tuple[list[dict], str]:
    """Raw rows of ``split`` from ``{data_dir}/{split}.jsonl`` or ``{data_dir}/{split}/**/*.json`` (one row a
    file); a row over ``max_row_bytes`` is refused naming its file (and line), before it is read whole."""
    root = Path(data_dir).expanduser()
    jsonl = root / f"{split}.jsonl"
    if jsonl.is_file():
        return read_jsonl(jsonl, max_row_bytes=max_row_bytes), str(jsonl)
    tree = root / split
    if tree.is_dir():
        rows = []
        for path in sorted(tree.rglob("*.json")):
            if max_row_bytes and path.stat().st_size > max_row_bytes:
                raise ValueError(row_too_long(str(path), max_row_bytes))
            row = json.loads(path.read_text(encoding="utf-8"))
            row.setdefault("subject", path.parent.name)
            rows.append(row)
        if rows:
            return rows, str(tree)
    raise ValueError(
        f"{task_name} split {split!r}: found neither {jsonl} nor JSON files under {tree}; "
        f"data_dir must hold {split}.jsonl (or the original MATH layout {split}/<subject>/<id>.json)"
    )


def load_hub(hub_id: str, configs: tuple[str | None, ...], split: str, local_format: str = ""):
    """Rows of ``hub_id`` ``split``, concatenated over ``configs``; a clear ValueError when offline (naming the
    local files that would do instead: ``{split}.jsonl``, ``local_format`` said after it)."""
    import datasets

    try:
        parts = [datasets.load_dataset(hub_id, config, split=split) for config in configs]
    except Exception as err:  # noqa: BLE001 - offline, no cache, missing split: all need the same advice
        raise ValueError(
            f"could not load {hub_id} split {split!r} from the Hugging Face hub ({type(err).__name__}: {err}); "
            f"pass data_dir=<dir with {split}.jsonl{local_format}> to load local files"
        ) from err
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


@dataclass
class MATHTask(Task):
    """Hendrycks MATH (12.5k problems); gold = last ``\\boxed{}`` of the reference solution. ``data_dir``: local
    files; else ``hub_id`` (one config per subject)."""

    name: str = "math"
    data_dir: str | None = None
    hub_id: str = "EleutherAI/hendrycks_math"
    hub_configs: ClassVar[tuple[str | None, ...]] = MATH_SUBJECTS  # the hub dataset's configs, concatenated

    def _load_raw(self, split: str):
        if self.data_dir is not None:
            raw, source = load_local(self.data_dir, split, self.name, self.max_row_bytes)
        else:
            raw, source = load_hub(self.hub_id, self.hub_configs, split), f"{self.hub_id}:{split}"
        return rows_to_dataset(normalize_math_rows(raw, source))


@dataclass
class MATH500Task(MATHTask):
    """MATH-500 (Lightman et al.'s test subset of MATH): ``HuggingFaceH4/MATH-500``, split ``test`` only."""

    name: str = "math500"
    hub_id: str = "HuggingFaceH4/MATH-500"
    splits: tuple[str, ...] = ("test",)
    hub_configs: ClassVar[tuple[str | None, ...]] = (None,)


@dataclass
class AMC23Task(MATHTask):
    """AMC 2023 (40 problems, numeric answers): ``math-ai/amc23``, split ``test``. Any ``hub_id`` with
    ``problem``/``question`` and ``answer`` works (set ``splits`` to its split names)."""

    name: str = "amc23"
    hub_id: str = "math-ai/amc23"
    splits: tuple[str, ...] = ("test",)
    hub_configs: ClassVar[tuple[str | None, ...]] = (None,)
