"""`pods eval` over a damaged run directory: any damaged checkpoint is skipped with one line and never fails the
scan; the final model is always evaluated, even when the checkpoint it duplicates is damaged or disappears."""

import json
import os
import shutil
import struct

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from pods_rl import evaluation
from pods_rl.commands import evaluate as ev
from pods_rl.runlog import evals as store  # find_checkpoints and what it calls (split out of store.py)
from tests.test_evaluate import FakeTask, make_run_dir

COMMON = ["--task", "fake", "--k", "1", "--max-new-tokens", "2", "--limit", "2", "--batch-size", "2"]


@pytest.fixture
def fake_task(monkeypatch):
    """`--task fake` is the FakeTask of test_evaluate (the task registry is not what is tested here)."""
    real = ev.resolve_task
    monkeypatch.setattr(ev, "resolve_task", lambda task, task_args=None: FakeTask() if task == "fake"
                        else real(task, task_args))


@pytest.fixture
def run_dir(tmp_path, tiny_model_dir):
    """checkpoint-2/, checkpoint-4/ and final/ (the same step as checkpoint-4), each a real tiny model."""
    return make_run_dir(tmp_path, tiny_model_dir, steps=(2, 4), seconds=(10.0, 25.0), final=True)


def _evaluated(run_dir):
    return [r["checkpoint"] for r in json.loads((run_dir / "eval.json").read_text()) if not r.get("skipped")]


def _skipped(run_dir):
    """{checkpoint: why} of the skip entries eval.json holds."""
    return {r["checkpoint"]: r["why"] for r in json.loads((run_dir / "eval.json").read_text()) if r.get("skipped")}


def _notes(err, name):
    return [line for line in err.splitlines() if name in line and ("skipping" in line or "skipped" in line)]


def _rewrite_safetensors_dtype(path):
    """A header that still parses and lists the right sizes, but a dtype no loader knows: only loading finds it."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + n].replace(b'"F32"', b'"Q32"')
    path.write_bytes(data[:8] + header + data[8 + n :])


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble(path):
    path.write_bytes(os.urandom(path.stat().st_size))


def _replace_by_dir(path):
    path.unlink()
    path.mkdir()  # a name every check expects to be a file: open() fails on it


def _only_clock(ckpt):
    for child in ckpt.iterdir():
        if child.name != "pods_clock.json":
            shutil.rmtree(child) if child.is_dir() else child.unlink()


DAMAGE = {
    "weights missing, clock kept": lambda c: (c / "model.safetensors").unlink(),
    "weights truncated": lambda c: _truncate(c / "model.safetensors"),
    "weights garbled": lambda c: _garble(c / "model.safetensors"),
    "weights empty": lambda c: (c / "model.safetensors").write_bytes(b""),
    "weights with an unknown dtype": lambda c: _rewrite_safetensors_dtype(c / "model.safetensors"),
    "weights are a directory": lambda c: _replace_by_dir(c / "model.safetensors"),
    "clock file without weights": _only_clock,
    "config missing": lambda c: (c / "config.json").unlink(),
    "config not JSON": lambda c: (c / "config.json").write_text("{'not': json"),
    "config is a directory": lambda c: _replace_by_dir(c / "config.json"),
    "config of an unknown model": lambda c: (c / "config.json").write_text('{"model_type": "no-such-arch"}'),
    "clock garbled": lambda c: (c / "pods_clock.json").write_bytes(b"\xff\xfe{"),
    "clock missing": lambda c: (c / "pods_clock.json").unlink(),
    "tokenizer not JSON": lambda c: next(p for p in c.iterdir() if p.name.startswith("tokenizer")).write_text("{"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_skipped_with_one_line(run_dir, fake_task, capsys, damage):
    DAMAGE[damage](run_dir / "checkpoint-2")
    assert ev.main([str(run_dir), *COMMON]) == 0
    err = capsys.readouterr().err
    assert len(_notes(err, "checkpoint-2")) == 1, err[-3000:]
    assert _evaluated(run_dir) == ["checkpoint-4"]  # final/ duplicates checkpoint-4
    assert list(_skipped(run_dir)) == ["checkpoint-2"]  # named in the results too, whatever the damage


@pytest.mark.parametrize("damage", ["weights missing, clock kept", "weights with an unknown dtype", "config missing",
                                    "clock file without weights"])
def test_the_final_model_stands_in_for_the_damaged_checkpoint_it_duplicates(run_dir, fake_task, capsys, damage):
    DAMAGE[damage](run_dir / "checkpoint-4")
    assert ev.main([str(run_dir), *COMMON]) == 0
    assert len(_notes(capsys.readouterr().err, "checkpoint-4")) == 1
    assert _evaluated(run_dir) == ["checkpoint-2", "final"]


def test_the_final_model_is_evaluated_when_its_checkpoint_disappears_after_the_scan(run_dir, fake_task, capsys):
    found = ev.find_checkpoints(run_dir)
    assert [c["name"] for c in found] == ["checkpoint-2", "checkpoint-4"]  # final rides along with checkpoint-4
    shutil.rmtree(run_dir / "checkpoint-4")  # rotated away by a training run still going
    records = ev.evaluate_checkpoints(found, FakeTask(), run_dir / "eval.json", k=1, max_new_tokens=2, limit=2,
                                      backend="hf")
    assert [(r["checkpoint"], r["step"]) for r in records] == [("checkpoint-2", 2), ("final", 4)]
    assert f"note: {run_dir / 'checkpoint-4'} was removed while pods eval ran" in capsys.readouterr().err


def test_a_checkpoint_disappearing_while_it_loads_is_skipped_and_final_evaluated(run_dir, fake_task, capsys,
                                                                                 monkeypatch):
    real_load = evaluation.load_model_and_tokenizer

    def load_after_rotation(path, *args, **kwargs):
        if path.name == "checkpoint-4":
            shutil.rmtree(path)
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(evaluation, "load_model_and_tokenizer", load_after_rotation)
    assert ev.main([str(run_dir), *COMMON]) == 0
    assert len(_notes(capsys.readouterr().err, "checkpoint-4")) == 1
    assert _evaluated(run_dir) == ["checkpoint-2", "final"]


@pytest.mark.parametrize("moment", ["is_model_dir", "clock_problem", "checkpoint_clock"])
def test_a_checkpoint_disappearing_during_the_scan_never_fails_it(run_dir, fake_task, capsys, monkeypatch, moment):
    """The directory is removed at each point of find_checkpoints' look at it (a rotation racing the scan)."""
    real = getattr(store, moment)
    seen = []

    def vanish_first(path, *args, **kwargs):
        if path.name == "checkpoint-4" and not seen:
            seen.append(path)
            shutil.rmtree(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(store, moment, vanish_first)
    assert ev.main([str(run_dir), *COMMON]) == 0
    assert _evaluated(run_dir) == ["checkpoint-2", "final"]


def test_a_run_whose_every_model_is_damaged_is_one_line(run_dir, fake_task, capsys):
    for name in ("checkpoint-2", "checkpoint-4", "final"):
        (run_dir / name / "model.safetensors").unlink()
    assert ev.main([str(run_dir), *COMMON]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and lines[0].startswith("pods eval: error: no model could be evaluated"), lines
    assert not (run_dir / "eval.json").exists()


def test_one_damaged_checkpoint_asked_for_by_itself_is_still_an_error(run_dir, fake_task, capsys):
    (run_dir / "checkpoint-2" / "model.safetensors").unlink()
    assert ev.main([str(run_dir / "checkpoint-2"), *COMMON]) == 2
    assert "checkpoint-2/model.safetensors is corrupt: missing" in capsys.readouterr().err


def _summary_skips(out):
    return [line for line in out.splitlines() if line.startswith("skipped ")]


def test_a_checkpoint_without_its_weights_is_named_after_the_table_and_in_eval_json(run_dir, fake_task, capsys):
    """The half-finished deletion of issue #41: checkpoint-2 lost model.safetensors, its folder and clock remain."""
    (run_dir / "checkpoint-2" / "model.safetensors").unlink()
    assert ev.main([str(run_dir), *COMMON]) == 0
    out = capsys.readouterr().out
    assert _summary_skips(out) == ["skipped checkpoint-2: model.safetensors is corrupt (missing (no weights file of "
                                   "any kind in the checkpoint))"], out
    assert out.index("checkpoint-4 ") < out.index("skipped checkpoint-2") < out.index("results: ")
    entry = json.loads((run_dir / "eval.json").read_text())[-1]
    assert entry["skipped"] is True and entry["checkpoint"] == "checkpoint-2" and entry["step"] == 2
    assert entry["why"].startswith("model.safetensors is corrupt (missing")
    assert (entry["task"], entry["split"], entry["k"], entry["evaluated_instead"]) == ("fake", "test", 1, None)
    # Readers of the results (pods plot, compare, study) see results only; the skips have their own reader.
    assert [r["checkpoint"] for r in store.load_results(run_dir / "eval.json")] == ["checkpoint-4"]
    assert [r["checkpoint"] for r in store.load_skips(run_dir / "eval.json")] == ["checkpoint-2"]


def test_a_skip_is_replaced_once_the_checkpoint_is_evaluated_and_never_replaces_a_result(run_dir, fake_task, capsys):
    weights = run_dir / "checkpoint-2" / "model.safetensors"
    weights.rename(run_dir / "aside.safetensors")
    assert ev.main([str(run_dir), *COMMON]) == 0
    assert list(_skipped(run_dir)) == ["checkpoint-2"] and len(_summary_skips(capsys.readouterr().out)) == 1
    (run_dir / "aside.safetensors").rename(weights)  # restored: the next eval evaluates it, the skip entry goes
    assert ev.main([str(run_dir), *COMMON]) == 0
    assert _skipped(run_dir) == {} and sorted(_evaluated(run_dir)) == ["checkpoint-2", "checkpoint-4"]
    assert _summary_skips(capsys.readouterr().out) == []
    weights.unlink()  # damaged after it was evaluated: --force names the skip, the result of the whole one stays
    assert ev.main([str(run_dir), *COMMON, "--force"]) == 0
    assert [line.split(":")[0] for line in _summary_skips(capsys.readouterr().out)] == ["skipped checkpoint-2"]
    assert _skipped(run_dir) == {} and sorted(_evaluated(run_dir)) == ["checkpoint-2", "checkpoint-4"]


def test_a_skipped_checkpoint_the_final_model_stands_in_for_says_so(run_dir, fake_task, capsys):
    _truncate(run_dir / "checkpoint-4" / "model.safetensors")
    assert ev.main([str(run_dir), *COMMON]) == 0
    lines = _summary_skips(capsys.readouterr().out)
    assert len(lines) == 1 and lines[0].startswith("skipped checkpoint-4: model.safetensors is corrupt (truncated")
    assert lines[0].endswith("; final/ (the same step) was evaluated in its place")
    assert _evaluated(run_dir) == ["checkpoint-2", "final"]
    assert json.loads((run_dir / "eval.json").read_text())[-1]["evaluated_instead"] == "final"


def test_a_checkpoint_the_scan_skips_is_named_and_recorded_too(run_dir, fake_task, capsys):
    (run_dir / "checkpoint-2" / "pods_clock.json").unlink()  # incomplete: being saved, or killed mid-save
    skipped = []
    records = ev.evaluate_run(run_dir, FakeTask(), k=1, max_new_tokens=2, limit=2, backend="hf", skipped=skipped)
    assert [r["checkpoint"] for r in records] == ["checkpoint-4"]
    assert [(s["checkpoint"], s["why"]) for s in skipped] == [("checkpoint-2", "no pods_clock.json (incomplete "
                                                                               "checkpoint)")]
    assert _skipped(run_dir) == {"checkpoint-2": "no pods_clock.json (incomplete checkpoint)"}
    assert len(_notes(capsys.readouterr().err, "checkpoint-2")) == 1
