"""Data (issue 34, item 3): a run records a fingerprint of the rows it trains on (data.json); a resume on other
data is refused in one line unless `--allow_data_change true` (then recorded); a row over the size bound is
refused while loading, before the model loads, naming the file and the row."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from pods_rl.tasks.base import DEFAULT_MAX_ROW_BYTES, Task


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sums(start: int) -> list[dict]:
    return [{"question": f"{a} + {a + 1}", "answer": str(2 * a + 1)} for a in range(start, start + 16)]


def _train_argv(run_dir, data_file, *extra):
    return ["--config", "cpu/smoke", "--output_dir", str(run_dir), "--task", f"jsonl:{data_file}",
            "--eval_before_after", "false", *map(str, extra)]


@pytest.fixture
def forbid_loading(monkeypatch):
    import transformers

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the fault was found")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)


@pytest.fixture(scope="module")
def one_step_jsonl_run(tmp_path_factory, tiny_model_dir):
    """(run directory, its training file): 1 step on a 16-row JSONL file, checkpoint-1 and final/."""
    from pods_rl.commands.train import main as train_main

    root = tmp_path_factory.mktemp("data-run")
    data_file = _jsonl(root / "data" / "train.jsonl", _sums(1))
    run_dir = root / "run"
    assert train_main(_train_argv(run_dir, data_file, "--model_name_or_path", tiny_model_dir, "--max_steps", 1,
                                  "--save_strategy", "steps", "--save_steps", 1)) == 0
    return run_dir, data_file


def _copy(run_and_data, tmp_path) -> tuple[Path, Path]:
    run_dir, data_file = run_and_data
    new_data = _jsonl(tmp_path / "data" / "train.jsonl", [json.loads(x) for x in data_file.read_text().splitlines()])
    run_dir = Path(shutil.copytree(run_dir, tmp_path / "run"))
    shutil.rmtree(run_dir / "final")  # a run stopped after checkpoint-1: a resume continues it
    config = (run_dir / "config.yaml").read_text().replace(str(data_file), str(new_data))
    (run_dir / "config.yaml").write_text(config)
    return run_dir, new_data


def test_a_run_records_its_data_and_a_resume_on_rewritten_data_is_refused(one_step_jsonl_run, tmp_path,
                                                                          tiny_model_dir, forbid_loading, capsys):
    from pods_rl.commands.cli import main as pods

    run_dir, data_file = _copy(one_step_jsonl_run, tmp_path)
    record = json.loads((run_dir / "data.json").read_text())
    assert record["fingerprint"]["rows"] == 16 and len(record["fingerprint"]["sha256"]) == 64
    assert record["changes"] == [] and record["fingerprint"]["source"]["split"] == "train"
    old_sha = record["fingerprint"]["sha256"]

    _jsonl(data_file, _sums(100))  # the file rewritten under the run: same size, other problems
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    argv = ["train", *_train_argv(run_dir, data_file, "--model_name_or_path", tiny_model_dir, "--max_steps", 2,
                                  "--resume_from_checkpoint", "true")]
    assert pods(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"pods train: error: the training data changed since {run_dir} recorded it in "
                               f"data.json (was 16 rows, sha256 {old_sha[:12]}; now 16 rows, sha256 ")
    assert lines[0].endswith("pass --allow_data_change true to continue on the new data (the change is recorded in "
                             "data.json); nothing was changed")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_allow_data_change_continues_and_records_the_change(one_step_jsonl_run, tmp_path, tiny_model_dir):
    from pods_rl import runlog
    from pods_rl.commands.train import main as train_main

    run_dir, data_file = _copy(one_step_jsonl_run, tmp_path)
    old_sha = json.loads((run_dir / "data.json").read_text())["fingerprint"]["sha256"]
    _jsonl(data_file, _sums(100)[:12])
    assert train_main(_train_argv(run_dir, data_file, "--model_name_or_path", tiny_model_dir, "--max_steps", 2,
                                  "--resume_from_checkpoint", "true", "--allow_data_change", "true")) == 0
    record = json.loads((run_dir / "data.json").read_text())
    assert record["fingerprint"]["rows"] == 12
    assert record["changes"] == [{"from_step": 1, "from": old_sha, "to": record["fingerprint"]["sha256"],
                                  "rows_from": 16, "rows_to": 12, "allowed_by": "--allow_data_change true"}]
    assert runlog.read_clock(run_dir / "final")["step"] == 2
    assert "allow_data_change" not in runlog.config_changes({"allow_data_change": False},
                                                            {"allow_data_change": True})


def test_a_resume_on_the_same_data_goes_on(one_step_jsonl_run, tmp_path, tiny_model_dir, forbid_loading, capsys):
    from pods_rl.commands.cli import main as pods

    run_dir, data_file = _copy(one_step_jsonl_run, tmp_path)
    argv = ["train", *_train_argv(run_dir, data_file, "--model_name_or_path", tiny_model_dir, "--max_steps", 2,
                                  "--resume_from_checkpoint", "true")]
    assert pods(argv) == 1  # past every check: it got as far as loading the model (forbidden here)
    assert "a model was loaded before the fault was found" in capsys.readouterr().err


@pytest.mark.parametrize("flags, reaches_loading", [([], False), (["--max_row_bytes", 2_000_000], True)])
def test_a_row_over_the_bound_is_named_by_file_and_line_before_loading(flags, reaches_loading, tmp_path,
                                                                      forbid_loading, capsys):
    from pods_rl.commands.cli import main as pods

    rows = _sums(1)
    rows[2]["question"] = "What is " + "1 + " * 200_000 + "1?"  # ~800 KB: a file pasted into a field
    data_file = _jsonl(tmp_path / "data" / "train.jsonl", rows)
    code = pods(["train", *_train_argv(tmp_path / "run", data_file, *flags)])
    err = capsys.readouterr().err
    if reaches_loading:
        assert code == 1 and "a model was loaded before the fault was found" in err
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and lines == [f"pods train: error: {data_file}:3 is a row of more than {DEFAULT_MAX_ROW_BYTES} "
                                   "bytes (the limit, max_row_bytes): fix or remove that row, or raise the limit (pods "
                                   "train --max_row_bytes N, or the task option max_row_bytes=N)"]
    assert not (tmp_path / "run").exists()


@dataclass
class Generated(Task):
    """A task whose rows come from code (no file to name): the bound is checked on the loaded rows."""

    name: str = "generated"

    def _load_raw(self, split):
        import datasets

        questions = ["1 + 1", "x" * (DEFAULT_MAX_ROW_BYTES // 3 + 1) + "é" * 200_000, "2 + 2"]
        return datasets.Dataset.from_dict({"question": questions, "answer": ["2", "0", "4"]})


def test_rows_from_any_source_are_bounded_and_the_bound_is_the_tasks_option():
    with pytest.raises(ValueError) as err:
        Generated().load("train")
    assert str(err.value).startswith(f"task 'generated' split 'train' row 2 is a row of more than "
                                     f"{DEFAULT_MAX_ROW_BYTES} bytes (its question is ")
    assert len(Generated(max_row_bytes=1_000_000).load("train")) == 3
    assert len(Generated(max_row_bytes=None).load("train")) == 3
    with pytest.raises(ValueError, match="max_row_bytes must be a positive number of bytes"):
        Generated(max_row_bytes=0)
