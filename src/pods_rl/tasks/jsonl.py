"""`jsonl:<path>`: your own prompts and gold answers, plus the JSONL helpers the other loaders share.

One JSON object a line, with ``question`` (or ``prompt``) and ``answer``; ``<path>`` is one file (the ``train``
split) or a directory of ``{split}.jsonl`` files."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from pods_rl.tasks.base import DEFAULT_MAX_ROW_BYTES, Task, row_too_long


def read_jsonl(path: str | Path, line_numbers: bool = False,
               max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES) -> list[dict] | list[tuple[int, dict]]:
    """Rows of a JSON-lines file (blank lines skipped; ``line_numbers``: ``(line, row)`` pairs). A bad line, or
    one over ``max_row_bytes`` (refused before reading more of it), is a ValueError naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such JSONL file: {path}")
    rows = []
    with path.open("rb") as f:  # bytes, so that a bad encoding can be reported with its line
        line_no = 0
        while True:
            # Bounded: a 50 MB line is refused after max_row_bytes, not read whole and tokenized later.
            raw = f.readline(max_row_bytes + 1) if max_row_bytes else f.readline()
            if not raw:
                break
            line_no += 1
            if max_row_bytes and len(raw.rstrip(b"\r\n")) > max_row_bytes:
                raise ValueError(row_too_long(f"{path}:{line_no}", max_row_bytes))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}:{line_no} is not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                    "re-save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}:{line_no} is not valid JSON ({err.msg}); fix or remove that line"
                ) from err
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no} is a JSON {type(row).__name__}, expected an object")
            rows.append((line_no, row) if line_numbers else row)
    return rows


def answer_to_str(value) -> str:
    """A gold answer as a string; integral floats lose their ``.0`` (``27.0`` -> ``"27"``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def gold_answer(value, source: str, row: int) -> str:
    """``value`` as a non-empty string gold answer, else a ValueError naming ``source`` and ``row`` (an empty
    gold answer would make every correctness reward 0 in silence)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ValueError(f"{source} row {row}: the gold answer must be a string or a number, got a "
                         f"{type(value).__name__} ({shown}); no completion could match it: fix or remove that row")
    text = answer_to_str(value)
    if not text:
        raise ValueError(f"{source} row {row}: the gold answer is empty, so no completion could match it (every "
                         "correctness reward 0): fill it in or remove that row")
    return text


def pick_field(row: dict, keys: tuple[str, ...], source: str, line: int):
    """``row[k]`` for the first ``k`` of ``keys`` present; ValueError naming the missing field otherwise."""
    for key in keys:
        if key in row and row[key] is not None:
            return row[key]
    raise ValueError(
        f"{source} row {line} has none of the fields {list(keys)} (it has {sorted(row)}); "
        f"rename the field to {keys[0]!r}"
    )


def rows_to_dataset(rows: list[dict]):
    """A ``datasets.Dataset`` from a list of flat dicts with the same keys."""
    import datasets

    return datasets.Dataset.from_list(rows)


def split_files(directory: Path) -> dict[str, Path]:
    """``{split: path}`` for every ``{split}.jsonl`` in ``directory``."""
    return {p.stem: p for p in sorted(directory.glob("*.jsonl"))}


@dataclass
class JSONLTask(Task):
    """Prompts and answers from local JSON lines; ``path``: a ``.jsonl`` file or a directory of them."""

    path: str = ""
    name: str = "jsonl"
    files: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        location = Path(self.path).expanduser()
        if location.is_dir():
            self.files = split_files(location)
            if not self.files:
                raise ValueError(
                    f"directory {location} has no *.jsonl files; add e.g. train.jsonl and test.jsonl"
                )
        elif location.is_file():
            self.files = {"train": location}
        else:
            raise ValueError(f"jsonl task path {str(location)!r} is neither a file nor a directory")
        self.splits = tuple(self.files)
        self.name = f"jsonl:{self.path}"
        super().__post_init__()

    def load(self, split: str = "train", limit: int | None = None):
        """Load ``split`` (see ``Task.load``); a single file only has the ``train`` split."""
        if split not in self.files and len(self.files) == 1 and "train" in self.files:
            raise ValueError(
                f"{self.name!r} is a single file, i.e. only split 'train'; for a {split!r} split point the task at a "
                f"directory with train.jsonl and {split}.jsonl, or evaluate on split 'train'"
            )
        return super().load(split, limit)

    def _load_raw(self, split: str):
        path = self.files[split]
        rows = []
        for line, row in read_jsonl(path, line_numbers=True, max_row_bytes=self.max_row_bytes):
            question = pick_field(row, ("question", "prompt", "problem"), str(path), line)
            if not isinstance(question, str):
                raise ValueError(
                    f"{path} row {line}: the question must be a str, got {type(question).__name__}"
                )
            answer = row.get("answer") if "answer" in row else pick_field(row, ("answer",), str(path), line)
            rows.append({"question": question, "answer": gold_answer(answer, str(path), line)})
        if not rows:
            raise ValueError(f"{path} has no rows; split {split!r} is empty")
        return rows_to_dataset(rows)
