"""`gsm8k`: grade-school math word problems (Cobbe et al. 2021); gold = the number after ``####``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pods_rl.tasks.base import Task
from pods_rl.tasks.jsonl import gold_answer, pick_field, read_jsonl, rows_to_dataset
from pods_rl.tasks.math_tasks import load_hub

HUB_ID, HUB_CONFIG = "openai/gsm8k", "main"


def gsm8k_gold(solution: str) -> str:
    """The final answer of a GSM8K reference solution: the text after the last ``####``, no commas."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '#### <answer>' line: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "").rstrip(".")


@dataclass
class GSM8KTask(Task):
    """GSM8K from the hub (``openai/gsm8k``) or from ``data_dir/{split}.jsonl`` in the original format.
    Columns: ``question``, ``answer`` (the gold number), ``solution``."""

    name: str = "gsm8k"
    data_dir: str | None = None

    def _load_raw(self, split: str):
        if self.data_dir is not None:
            path = Path(self.data_dir).expanduser() / f"{split}.jsonl"
            if not path.is_file():
                raise ValueError(f"gsm8k split {split!r}: no file {path}; data_dir must hold {split}.jsonl")
            raw = read_jsonl(path, line_numbers=True, max_row_bytes=self.max_row_bytes)
            source = str(path)
        else:
            raw = list(enumerate(load_hub(HUB_ID, (HUB_CONFIG,), split, " in the grade-school-math format"), start=1))
            source = f"{HUB_ID}:{split}"
        rows = []
        for line, row in raw:
            solution = str(pick_field(row, ("answer",), source, line))
            question = pick_field(row, ("question",), source, line)
            try:
                gold = gsm8k_gold(solution)
            except ValueError as err:
                raise ValueError(f"{source} row {line}: {err}") from None
            rows.append({"question": question, "answer": gold_answer(gold, source, line), "solution": solution})
        if not rows:
            raise ValueError(f"gsm8k split {split!r} from {source} is empty")
        return rows_to_dataset(rows)
