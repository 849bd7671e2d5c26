"""Reliability, round two (#27): one owner per run directory, user files never overwritten, user code cannot hang
a run, training that cannot learn says so, and every one-liner names the thing and the way on. One table per
class of fault; each row is a fault a user or a cluster produced, and how it must end."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pods_rl import deadline
from pods_rl.reward_guard import (
    MAX_TIMEOUTS_IN_A_ROW,
    TIMEOUT_METRIC,
    RewardFunctionError,
    guard_reward_func,
    guard_reward_funcs,
    reward_weights_of,
)
from pods_rl.runlog import lock as runlock

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str, **kwargs) -> subprocess.Popen:
    """A child Python process running ``code`` (pods_rl importable), stdout and stderr piped."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kwargs)


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 60.0) -> None:
    """Read ``proc``'s stdout until a line contains ``text`` (fails after ``timeout`` seconds)."""
    deadline_at = time.monotonic() + timeout
    while time.monotonic() < deadline_at:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"child never printed {text!r}; stderr: {proc.stderr.read()[-2000:]}")


# ---------------------------------------------------------------------------------------------------------------
# 1. one owner per run directory: the lock itself (the CLI rows are further down)

# The children load runlog/lock.py alone (it needs only the standard library): no torch import, a fast start.
LOAD_LOCK = f"""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lock", {str(Path(SRC) / "pods_rl" / "runlog" / "lock.py")!r})
    runlock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runlock)
"""

HOLDER = LOAD_LOCK + """
    import sys, time
    lock = runlock.hold_run_dir(sys.argv[1], what="pods train")
    print("locked", flush=True)
    time.sleep(120)
"""


def test_a_second_holder_is_refused_naming_the_first_and_a_killed_holder_leaves_no_stale_lock(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = _python(HOLDER.replace("sys.argv[1]", repr(str(run_dir))))
    try:
        _wait_for_line(first, "locked")
        with pytest.raises(runlock.RunDirInUse) as refused:
            runlock.hold_run_dir(run_dir)
        message = str(refused.value)
        assert f"{run_dir} is in use by pods train (pid {first.pid} on {os.uname().nodename}, since " in message
        assert f"kill -TERM {first.pid}" in message and "nothing was changed" in message
        # SIGKILL: no handler runs, yet the operating system drops the lock with the process.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        lock = runlock.hold_run_dir(run_dir)
        assert runlock.read_holder(run_dir / runlock.LOCK_FILE)["pid"] == os.getpid()
        lock.release()
    finally:
        first.kill()
        first.wait(timeout=30)


# A holder caught between taking the lock and writing its name: it locks without a record, says so, writes its
# record ``sys.argv[2]`` seconds later (as try_lock does: over the old bytes, then cut to length), then holds on.
SLOW_NAMER = LOAD_LOCK + """
    import json, os, sys, time
    lock = runlock.try_lock(runlock.Path(sys.argv[1]))
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    data = (json.dumps(runlock.holder_record("pods train")) + "\\n").encode()
    os.pwrite(lock.fd, data, 0)
    os.ftruncate(lock.fd, len(data))
    print("named", flush=True)
    time.sleep(120)
"""


def _slow_namer(run_dir, delay: float) -> subprocess.Popen:
    code = SLOW_NAMER.replace("sys.argv[1]", repr(str(run_dir / runlock.LOCK_FILE)))
    return _python(code.replace("sys.argv[2]", repr(str(delay))))


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


@pytest.mark.parametrize("left_behind", ["nothing", "a killed holder's record", "a record whose pid was reused",
                                         "a longer record"])
def test_a_refused_start_names_a_holder_that_writes_its_name_late(tmp_path, left_behind):
    """The holder has the lock but writes its name a second later; the file may still hold an earlier holder's
    record (killed: the lock went, the record stayed). The refused start waits for the holder's own record."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stale = {"nothing": None,
             "a killed holder's record": {**runlock.holder_record("pods train"), "pid": _dead_pid()},
             # a live process of this host (this one), younger than the record: its pid was the dead holder's
             "a record whose pid was reused": {**runlock.holder_record("pods train"),
                                               "since_unix": time.time() - 3600},
             # longer than the new one: the new record, written over it, must not leave its tail behind
             "a longer record": {**runlock.holder_record("pods train " + "x" * 500), "pid": _dead_pid()}}[left_behind]
    if stale is not None:
        (run_dir / runlock.LOCK_FILE).write_text(json.dumps(stale) + "\n")
    holder = _slow_namer(run_dir, 1.0)
    try:
        _wait_for_line(holder, "locked")
        started = time.monotonic()
        with pytest.raises(runlock.RunDirInUse) as refused:
            runlock.hold_run_dir(run_dir)
        waited = time.monotonic() - started
        assert f"is in use by pods train (pid {holder.pid} on {os.uname().nodename}, since " in str(refused.value)
        assert 0.5 < waited < runlock.NAME_WAIT_SECONDS, waited  # it waited for the name, not for the bound
        assert runlock.read_holder(run_dir / runlock.LOCK_FILE)["pid"] == holder.pid  # parses: no stale tail
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_holder_that_dies_before_writing_its_name_leaves_the_lock_to_the_next(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = _python(LOAD_LOCK + f"""
    import os, time
    lock = runlock.try_lock({str(run_dir / runlock.LOCK_FILE)!r})
    print("locked", flush=True)
    time.sleep(0.5)
    os._exit(0)
""")
    try:
        _wait_for_line(holder, "locked")
        lock = runlock.hold_run_dir(run_dir)  # refused at first; the lock comes free while it waits for the name
        assert runlock.read_holder(run_dir / runlock.LOCK_FILE)["pid"] == os.getpid()
        lock.release()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_naming_the_holder_is_bounded_and_another_hosts_record_is_believed_once_it_stays(tmp_path, monkeypatch):
    """In this process (a second descriptor of the file is refused like another process): a holder that never
    writes its name is reported as such after NAME_WAIT_SECONDS; a record of another host, whose pid cannot be
    checked from here, is named once it stayed unchanged for SETTLE_SECONDS, and a newer one replacing it within
    that time is named instead."""
    monkeypatch.setattr(runlock, "NAME_WAIT_SECONDS", 0.5)
    path = tmp_path / runlock.LOCK_FILE
    held = runlock.try_lock(path)
    try:
        with pytest.raises(runlock.RunDirInUse, match=r"in use by another process \(it has not written its name yet\)"):
            runlock.hold_run_dir(tmp_path)
        monkeypatch.setattr(runlock, "NAME_WAIT_SECONDS", 10.0)
        elsewhere = {**runlock.holder_record("pods train"), "host": "node-elsewhere", "pid": 4242}
        path.write_text(json.dumps(elsewhere))
        started = time.monotonic()
        with pytest.raises(runlock.RunDirInUse, match="pid 4242 on node-elsewhere"):
            runlock.hold_run_dir(tmp_path)
        assert runlock.SETTLE_SECONDS <= time.monotonic() - started < 5.0
        path.write_text(json.dumps(elsewhere))
        newer = {**elsewhere, "host": "node-new", "pid": 77}
        writer = threading.Timer(0.2, lambda: path.write_text(json.dumps(newer)))
        writer.start()
        with pytest.raises(runlock.RunDirInUse, match="pid 77 on node-new"):
            runlock.hold_run_dir(tmp_path)
        writer.join()
    finally:
        held.release()


RMW = LOAD_LOCK + """
    import json, sys
    from pathlib import Path
    path, me = Path(sys.argv[1]), sys.argv[2]
    for i in range(30):
        with runlock.exclusive(runlock.lock_path_for(path), wait_s=60):
            records = json.loads(path.read_text()) if path.exists() else []
            records.append(f"{me}-{i}")
            tmp = path.with_name(path.name + "." + me)
            tmp.write_text(json.dumps(records))
            tmp.replace(path)
"""


def test_the_short_lock_makes_concurrent_read_modify_writes_lose_nothing(tmp_path):
    path = tmp_path / "eval.json"
    writers = [_python(RMW.replace("sys.argv[1]", repr(str(path))).replace("sys.argv[2]", repr(name)))
               for name in ("a", "b", "c")]
    for proc in writers:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert sorted(json.loads(path.read_text())) == sorted(f"{n}-{i}" for n in "abc" for i in range(30))


def test_a_file_system_without_flock_runs_unlocked_with_one_warning(tmp_path, monkeypatch, caplog):
    import errno

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    with caplog.at_level(logging.WARNING, logger="pods_rl.runlog"):
        lock = runlock.hold_run_dir(tmp_path)
        runlock.hold_run_dir(tmp_path)  # nothing is locked: a second holder is not stopped, and not warned twice
    assert lock.fd is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "cannot lock" in warnings[0] and "No locks available" in warnings[0]


# ---------------------------------------------------------------------------------------------------------------
# 3. bounded user code: nestable time limits, and reward functions under a budget with checked returns

class Inner(deadline.Expired):
    pass


class Outer(deadline.Expired):
    pass


def test_time_limits_nest_each_firing_on_its_own_time():
    # The inner limit fires first and is stopped by its own block; the outer one still fires later.
    start = time.monotonic()
    with deadline.time_limit(0.6, Outer) as outer:
        with deadline.time_limit(0.1, Inner) as inner:
            time.sleep(5)
        assert inner.expired and 0.05 < time.monotonic() - start < 0.5
        time.sleep(5)
    assert outer.expired and not deadline._active and 0.5 < time.monotonic() - start < 2.0
    # An outer limit that expires inside an inner block unwinds both; the inner one does not swallow it.
    with deadline.time_limit(0.1, Outer) as outer:
        with deadline.time_limit(10, Inner) as inner:
            time.sleep(5)
    assert outer.expired and not inner.expired and not deadline._active
    # Code that swallows the exception is interrupted again (the timer repeats until the block is left).
    swallowed = 0
    with deadline.time_limit(0.1, Outer) as outer:
        for _ in range(3):
            try:
                time.sleep(5)
            except Outer:
                swallowed += 1
        time.sleep(5)
    assert outer.expired and swallowed == 3
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_time_limits_are_not_enforced_off_the_main_thread():
    seen = {}

    def body():
        with deadline.time_limit(0.05) as limit:
            time.sleep(0.2)
        seen.update(enforced=limit.enforced, expired=limit.expired)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=10)
    assert seen == {"enforced": False, "expired": False}


def _returning(value):
    def my_reward(prompts, completions, **kwargs):
        return value

    return my_reward


def _raising(prompts, completions, **kwargs):
    return {"a": 1}["b"]


# (what the reward function does, a substring of the error; None: accepted, with the value it becomes)
REWARD_RETURNS = [
    (_returning(None), "reward function 'my_reward' returned None; it must return a list of 2 numbers, one per "
     "completion (None for one it does not score): does it end with `return rewards`?"),
    (_returning("1.0"), "reward function 'my_reward' returned a str ('1.0')"),
    (_returning(0.5), "reward function 'my_reward' returned a float (0.5)"),
    (_returning({"r": [1, 0]}), "returned a dict"),
    (_returning([1.0]), "reward function 'my_reward' returned 1 rewards for 2 completions"),
    (_returning([1.0, 0.0, 1.0]), "returned 3 rewards for 2 completions"),
    (_returning(["1.0", "0"]), "returned a str for completion 0 ('1.0') (convert it with float())"),
    (_returning([1.0, [0.0]]), "returned a list for completion 1 ([0.0])"),
    (_returning([1.0, float("inf")]), "returned inf for completion 1; rewards must be finite"),
    (_returning([float("-inf"), 1.0]), "returned -inf for completion 0"),
    (_raising, "reward function '_raising' raised KeyError: 'b'"),
    (lambda prompts, completions, **kw: sys.exit(3), "reward function '<lambda>' called sys.exit(3)"),
    (_returning([1, 0.5]), [1.0, 0.5]),
    (_returning((True, None)), [1.0, None]),
    (_returning(iter([0.25, 0.75])), [0.25, 0.75]),
    # NaN means "not scored", as GRPOTrainer reads it (#39): it becomes None (a note says so once per function)
    (_returning([float("nan"), 1.0]), [None, 1.0]),
    # a magnitude beyond MAX_ABS_REWARD is a scale bug (float32 variance overflows at ~1e19: NaN advantages)
    (_returning([1.0, 1e30]), "returned 1e+30 for completion 1: beyond the bound of 1e+06, a reward-scale bug"),
    (_returning([-2e6, 0.0]), "returned -2e+06 for completion 0: beyond the bound"),
    (_returning([1e6, -1e6]), [1e6, -1e6]),
]


@pytest.mark.parametrize("func, expected", REWARD_RETURNS, ids=[str(r[1])[:40] for r in REWARD_RETURNS])
def test_reward_function_returns_are_checked_by_name(func, expected):
    guarded = guard_reward_func(func, timeout_s=30)
    assert guarded.__name__ == func.__name__  # TRL names the metrics after it
    if isinstance(expected, list):
        assert guarded(["p", "q"], ["a", "b"]) == expected
    else:
        with pytest.raises(RewardFunctionError) as err:
            guarded(["p", "q"], ["a", "b"])
        assert expected in str(err.value) and "\n" not in str(err.value)


def test_tensors_and_arrays_are_accepted():
    import numpy as np
    import torch

    for value in (torch.tensor([1.0, 0.0]), np.array([1.0, 0.0]), [np.float32(1.0), torch.tensor(0.0)]):
        assert guard_reward_func(_returning(value))(["p", "q"], ["a", "b"]) == [1.0, 0.0]


def test_a_hanging_reward_function_is_cut_at_its_budget_and_stops_the_run_when_it_keeps_hanging(caplog):
    calls = []

    def hangs(prompts, completions, **kwargs):
        calls.append(1)
        while True:  # never returns, and swallows what it can
            try:
                time.sleep(60)
            except Exception:  # noqa: BLE001
                pass

    logged = []
    guarded = guard_reward_func(hangs, timeout_s=0.2)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pods_rl.reward_guard"):
        for _ in range(MAX_TIMEOUTS_IN_A_ROW - 1):
            assert guarded(["p"] * 3, ["c"] * 3, log_metric=lambda k, v: logged.append((k, v))) == [None] * 3
        with pytest.raises(RewardFunctionError, match=f"reward function 'hangs' ran past its time budget of 0.2 s on "
                           f"{MAX_TIMEOUTS_IN_A_ROW} calls in a row"):
            guarded(["p"] * 3, ["c"] * 3)
    assert time.monotonic() - start < 5 and len(calls) == MAX_TIMEOUTS_IN_A_ROW
    assert logged == [(TIMEOUT_METRIC, 1.0)] * (MAX_TIMEOUTS_IN_A_ROW - 1)
    assert "reward function 'hangs' ran past its time budget of 0.2 s on 3 completions" in caplog.text


def test_a_call_within_budget_resets_the_timeout_streak_and_the_grader_keeps_its_own_bounds():
    from pods_rl.tasks.rewards import make_correctness_reward

    slow_then_fast = iter([10, 0, 10, 10, 0])

    def sometimes_slow(prompts, completions, **kwargs):
        time.sleep(next(slow_then_fast))
        return [1.0] * len(completions)

    guarded = guard_reward_func(sometimes_slow, timeout_s=0.2)
    assert [guarded(["p"], ["c"]) for _ in range(5)] == [[None], [1.0], [None], [None], [1.0]]

    # The correctness reward bounds each item itself (0.1 s here) inside the function's own budget (30 s): an
    # item that hangs scores 0 and the call goes on, rather than the whole call being cut.
    def hanging_grader(text, gold):
        if text == "hang":
            time.sleep(60)
        return text == gold

    correctness = guard_reward_func(make_correctness_reward(hanging_grader, timeout_s=0.1), timeout_s=30)
    assert correctness(["p"] * 3, ["1", "hang", "2"], answer=["1", "1", "2"]) == [1.0, 0.0, 1.0]


def test_async_reward_functions_get_the_budget_too():
    import asyncio

    async def slow_async(prompts, completions, **kwargs):
        await asyncio.sleep(30)
        return [1.0] * len(completions)

    async def returns_none(prompts, completions, **kwargs):
        return None

    assert asyncio.run(guard_reward_func(slow_async, timeout_s=0.1)(["p"], ["c"])) == [None]
    with pytest.raises(RewardFunctionError, match="'returns_none' returned None"):
        asyncio.run(guard_reward_func(returns_none)(["p"], ["c"]))


def test_reward_models_and_hub_ids_are_left_to_trl():
    from torch import nn

    module = nn.Linear(1, 1)
    assert guard_reward_funcs([module, "org/reward-model"]) == [module, "org/reward-model"]


# ---------------------------------------------------------------------------------------------------------------
# 4. training that cannot learn says so; the two documented ways to train optimise the same objective

def test_the_task_api_and_pods_train_give_the_same_reward_weights(tmp_path, tiny_model_dir):
    """The "Train with TRL" example (docs/guides/trl.md)
    passes ``reward_funcs=task.reward_funcs()`` and no weights; it must
    train the objective `pods train` trains (the task's 1 / 0.1 / 0.1), not TRL's default 1 / 1 / 1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pods_rl import PODSConfig, PODSTrainer
    from pods_rl.recipes import parse_args
    from pods_rl.tasks import get_task

    for task_args, weights in ((None, [1.0, 0.1, 0.1]), ("reward_weights=[1.0,0.5,0.0]", [1.0, 0.5, 0.0])):
        task = get_task("arithmetic", **({} if task_args is None else {"reward_weights": weights}))
        assert reward_weights_of(task.reward_funcs()) == weights
        config = PODSConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none",
                            num_generations=4, per_device_train_batch_size=4, max_steps=1)
        trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                              reward_funcs=task.reward_funcs(), args=config, train_dataset=task.load("train", limit=8),
                              processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
        assert trainer.reward_weights.tolist() == pytest.approx(weights)
        # `pods train` with the same task: its config carries the same weights.
        argv = ["--config", "cpu/smoke"] + ([] if task_args is None else ["--task_args", task_args])
        run, pods_config, _ = parse_args(argv)
        from pods_rl.tasks import parse_task_args

        pods_task = get_task(run.task, **parse_task_args(run.task_args))
        assert list(pods_task.reward_weights) == pytest.approx(weights)
    # Weights given explicitly win over the functions' own.
    config = PODSConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none",
                        num_generations=4, per_device_train_batch_size=4, max_steps=1, reward_weights=[2.0, 0.0, 0.0])
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          reward_funcs=get_task("arithmetic").reward_funcs(), args=config,
                          train_dataset=get_task("arithmetic").load("train", limit=8),
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    assert trainer.reward_weights.tolist() == [2.0, 0.0, 0.0]


def test_a_custom_task_with_its_own_reward_funcs_carries_its_weights():
    from dataclasses import dataclass

    from pods_rl.tasks import Task

    def always_one(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    @dataclass
    class Mine(Task):
        name: str = "mine"
        reward_weights: tuple = (0.3,)

        def reward_funcs(self):
            return [always_one]

    funcs = Mine().reward_funcs()
    assert [f.__name__ for f in funcs] == ["always_one"] and reward_weights_of(funcs) == [0.3]
    assert not hasattr(always_one, "reward_weight")  # the user's function itself is left alone


def _gold_rows(tmp_path, rows, name="train.jsonl"):
    path = tmp_path / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" if r is not None else "\n" for r in rows))
    return path


# (task, its files' rows, a substring of the error); {path} is the file the rows went to
GOLD_CASES = [
    ("jsonl", [{"question": "1+1", "answer": "2"}, None, {"question": "2+2", "answer": ""}],
     "{path} row 3: the gold answer is empty, so no completion could match it"),
    ("jsonl", [{"question": "1+1", "answer": "   "}], "{path} row 1: the gold answer is empty"),
    ("jsonl", [{"question": "1+1", "answer": [2]}], "{path} row 1: the gold answer must be a string or a number, got "
     "a list ([2])"),
    ("jsonl", [{"question": "1+1", "answer": {"value": 2}}], "got a dict"),
    ("jsonl", [{"question": "1+1", "answer": None}], "got a NoneType"),
    ("jsonl", [{"question": "1+1", "answer": True}], "got a bool"),
    ("jsonl", [{"question": "1+1", "answer": float("nan")}], "got a float (nan)"),
    ("gsm8k", [{"question": "q", "answer": "reasoning\n#### 7"}, {"question": "q", "answer": "reasoning\n#### "}],
     "{path} row 2: the gold answer is empty"),
    ("math", [{"problem": "p", "solution": "so \\boxed{}"}], "{path} row 1: the gold answer is empty"),
    ("math", [{"problem": "p", "answer": ["1", "2"]}], "{path} row 1: the gold answer must be a string or a number"),
]


@pytest.mark.parametrize("task_name, rows, expected", GOLD_CASES, ids=[f"{c[0]}-{c[2][-30:]}" for c in GOLD_CASES])
def test_empty_or_non_string_gold_answers_are_named_by_file_and_row(tmp_path, task_name, rows, expected):
    from pods_rl.tasks import get_task

    path = _gold_rows(tmp_path, rows)
    task = get_task(f"jsonl:{path}") if task_name == "jsonl" else get_task(task_name, data_dir=str(path.parent))
    with pytest.raises(ValueError) as err:
        task.load("train")
    assert expected.format(path=path) in str(err.value), str(err.value)


def test_a_custom_loader_with_bad_gold_answers_is_named_by_task_split_and_row():
    from dataclasses import dataclass

    from datasets import Dataset

    from pods_rl.tasks import Task

    @dataclass
    class Custom(Task):
        name: str = "custom"

        def _load_raw(self, split):
            return Dataset.from_list([{"question": "a", "answer": "1"}, {"question": "b", "answer": " "}])

    with pytest.raises(ValueError, match="task 'custom' split 'train' row 2: the gold answer is empty"):
        Custom().load("train")


def _constant_reward(prompts, completions, **kwargs):
    return [0.5] * len(completions)


def test_no_reward_variance_for_a_while_is_said_once_with_the_likely_cause(tmp_path, tiny_model_dir, caplog,
                                                                           monkeypatch):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pods_rl import PODSConfig, PODSTrainer

    monkeypatch.setattr(PODSTrainer, "NO_VARIANCE_WARN_ROUNDS", 2)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+1="}] for i in range(16)]})
    for temperature, cause in ((1.0, "every completion of every prompt scores 0.5: a reward function that returns a "
                                "constant"), (0.05, "near-greedy sampling (temperature 0.05)")):
        caplog.clear()
        config = PODSConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none", seed=1,
                            num_generations=4, downsample_to=2, per_device_train_batch_size=2, max_steps=3,
                            max_completion_length=4, temperature=temperature, save_strategy="no", logging_steps=1)
        trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                              reward_funcs=[_constant_reward], args=config, train_dataset=dataset,
                              processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
        with caplog.at_level(logging.WARNING, logger="pods_rl.trainer"):
            trainer.train()
        said = [r.getMessage() for r in caplog.records if "reward variance" in r.getMessage()]
        assert len(said) == 1, said  # once, not every step after the second
        assert "for the last 2 generation rounds" in said[0] and "nothing is learned" in said[0]
        assert cause in said[0], said[0]


def test_reward_function_faults_reach_the_trainer_by_name(tmp_path, tiny_model_dir):
    """Inside a real PODSTrainer step: a function returning None stops with its name; one that hangs past
    reward_timeout_s is cut, its completions unscored, the step goes on and the metric counts it."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pods_rl import PODSConfig, PODSTrainer

    def forgot_return(prompts, completions, **kwargs):
        [len(c) for c in completions]

    first_call = []

    def hangs_once(prompts, completions, **kwargs):
        if not first_call:
            first_call.append(1)
            time.sleep(60)
        return [float(len(c[0]["content"]) % 3) for c in completions]

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+1="}] for i in range(16)]})

    def trainer_for(func, **overrides):
        config = PODSConfig(**{**dict(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none",
                                      num_generations=4, per_device_train_batch_size=4, max_steps=2, logging_steps=1,
                                      max_completion_length=4, save_strategy="no"), **overrides})
        return PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[func],
                           args=config, train_dataset=dataset,
                           processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))

    with pytest.raises(RewardFunctionError, match="reward function 'forgot_return' returned None"):
        trainer_for(forgot_return).train()
    trainer = trainer_for(hangs_once, reward_timeout_s=1.0)
    start = time.monotonic()
    trainer.train()
    assert time.monotonic() - start < 50 and trainer.state.global_step == 2
    assert [h[TIMEOUT_METRIC] for h in trainer.state.log_history if TIMEOUT_METRIC in h] == [1.0, 0.0]
    with pytest.raises(ValueError, match="reward_timeout_s must be a number of seconds >= 0"):
        trainer_for(hangs_once, reward_timeout_s=-1)


# ---------------------------------------------------------------------------------------------------------------
# `pods train` and `pods eval` end to end on a tiny model: the run directory's owner, its files, its faults

def _train_args(model_dir, run_dir, *extra):
    return ["--config", "cpu/smoke", "--model_name_or_path", str(model_dir), "--output_dir", str(run_dir),
            "--eval_before_after", "false", *extra]


def _pods_process(*argv, prelude: str = "", env: dict | None = None) -> subprocess.Popen:
    """``pods ARGV`` in a child process (after ``prelude``, e.g. registering a task), stdout and stderr piped."""
    code = (f"import sys\n{textwrap.dedent(prelude)}\n"
            "from pods_rl.commands.cli import main\nsys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               **(env or {}))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _error_lines(text: str) -> list[str]:
    return [line[line.index("pods "):] for line in text.splitlines() if "pods train: error" in line
            or "pods eval: error" in line or "Traceback" in line]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A finished 4-step run with checkpoint-2, checkpoint-4 and final/; tests copy it before changing it."""
    from pods_rl.commands.train import main as train_main

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert train_main(_train_args(tiny_model_dir, run_dir, "--max_steps", "4", "--save_strategy", "steps",
                                  "--save_steps", "2")) == 0
    return run_dir


def _copy_run(run_dir, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(run_dir, tmp_path / "run"))


# Both starts reach the run directory's lock together (each waits for the other there, then takes it). Started at
# once is not enough: on a loaded machine their imports took 32 to 52 s, and one can trail the other by the whole
# of the other's run (1 run in 24), then find a finished run instead of a held lock.
MEET_AT_THE_LOCK = """
    import os, time
    from pathlib import Path
    from pods_rl import runlog
    take = runlog.hold_run_dir

    def hold_run_dir_together(run_dir, what="pods train"):
        meet = Path(os.environ["PODS_MEET"])
        (meet / str(os.getpid())).touch()
        deadline = time.monotonic() + 300
        while len(list(meet.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        return take(run_dir, what)

    runlog.hold_run_dir = hold_run_dir_together
"""


def test_two_trains_started_at_once_on_one_directory(tmp_path, tiny_model_dir):
    """Exactly one owns the directory and finishes intact; the other exits 2 at once with one line naming it (the
    winner's, even when it read the lock file before the winner wrote its name there)."""
    from pods_rl import runlog

    run_dir, meet = tmp_path / "run", tmp_path / "meet"
    meet.mkdir()
    argv = ["train", *_train_args(tiny_model_dir, run_dir, "--max_steps", "2", "--save_strategy", "steps",
                                  "--save_steps", "1")]
    procs = [_pods_process(*argv, prelude=MEET_AT_THE_LOCK, env={"PODS_MEET": str(meet)}) for _ in range(2)]
    outputs = [p.communicate(timeout=400) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outputs
    winner = next(p for p in procs if p.returncode == 0)
    loser_err = next(o[1] for p, o in zip(procs, outputs) if p.returncode == 2)
    lines = _error_lines(loser_err)
    assert len(lines) == 1, loser_err[-2000:]
    assert (f"pods train: error: {run_dir} is in use by pods train (pid {winner.pid} on {os.uname().nodename}, "
            "since ") in lines[0] and "pass another --output_dir; nothing was changed" in lines[0]
    steps = [r["step"] for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert steps == [1, 2]  # one run's log: no step twice
    assert [runlog.read_clock(c)["step"] for c in runlog.list_checkpoints(run_dir)] == [1, 2]
    assert runlog.read_clock(run_dir / "final")["step"] == 2
    assert not (run_dir / runlog.LOCK_FILE).exists()  # released (and removed) at the end


def test_two_evals_at_once_lose_no_record(tmp_path, finished_run):
    """Two `pods eval` on one run that is training, different settings, at the same time: neither waits for the
    trainer, and every record of both is in eval.json."""
    run_dir = _copy_run(finished_run, tmp_path)
    # A `pods train` holds the run (as when evaluating while it trains): `pods eval` does not wait for it.
    trainer = _python(HOLDER.replace("sys.argv[1]", repr(str(run_dir))))
    try:
        _wait_for_line(trainer, "locked")
        common = ["eval", run_dir, "--task", "arithmetic", "--limit", "2", "--max-new-tokens", "4", "--backend", "hf"]
        procs = [_pods_process(*common, "--k", str(k)) for k in (1, 2)]
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-2000:]
    finally:
        trainer.kill()
        trainer.wait(timeout=30)
    records = json.loads((run_dir / "eval.json").read_text())
    assert sorted((r["checkpoint"], r["k"]) for r in records) == [
        ("checkpoint-2", 1), ("checkpoint-2", 2), ("checkpoint-4", 1), ("checkpoint-4", 2)]
    assert not (run_dir / ".eval.json.lock").exists()


FAULTY_TASK = """
import os, sys, time
from dataclasses import dataclass
from pods_rl.tasks import register_task
from pods_rl.tasks.arithmetic import ArithmeticTask

def slow_judge(prompts, completions, trainer_state=None, **kwargs):
    fault = os.environ.get("PODS_FAULT", "")
    if fault == "hang" and trainer_state is not None and trainer_state.global_step >= 2:
        open(os.environ["PODS_FAULT_MARK"], "w").write("hanging")
        while True:  # a judge that never answers (and swallows what it can)
            try:
                time.sleep(3600)
            except Exception:
                pass
    if fault == "uninterruptible" and trainer_state is not None and trainer_state.global_step >= 2:
        open(os.environ["PODS_FAULT_MARK"], "w").write("hanging")
        while not os.path.exists(os.environ["PODS_FAULT_MARK"] + ".block"):
            time.sleep(0.05)
        import signal
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # as C code that ignores them
        time.sleep(3600)
    if fault == "none":
        return None
    return [0.0] * len(completions)

@dataclass
class Faulty(ArithmeticTask):
    name: str = "faulty"
    reward_weights: tuple = (1.0, 0.1, 0.1, 1.0)

    def reward_funcs(self):
        return [*ArithmeticTask.reward_funcs(self), slow_judge]

register_task("faulty", Faulty)
"""


def test_sigterm_while_a_reward_function_hangs_saves_and_exits_within_the_grace(tmp_path, tiny_model_dir):
    """Kubernetes' case: SIGTERM, then SIGKILL after the grace. A reward function that never returns is abandoned
    once the step's share of the grace is spent; the last complete step is saved (from memory: no checkpoint was
    due) and the process is gone within the grace, saying what it did. The saved checkpoint resumes."""
    from pods_rl import runlog
    from pods_rl.commands.train import main as train_main

    run_dir, mark, grace = tmp_path / "run", tmp_path / "hanging", 15
    argv = ["train", *_train_args(tiny_model_dir, run_dir, "--task", "faulty", "--max_steps", "50",
                                  "--stop_grace_seconds", str(grace), "--reward_timeout_s", "0")]
    proc = _pods_process(*argv, prelude=FAULTY_TASK, env={"PODS_FAULT": "hang", "PODS_FAULT_MARK": str(mark)})
    try:
        deadline_at = time.monotonic() + 400
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline_at:
            time.sleep(0.05)
        assert mark.exists(), proc.communicate(timeout=30)[1][-3000:]
        time.sleep(0.5)  # the judge is well into its endless wait
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=grace + 30)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert took < grace, f"exited {took:.1f} s after SIGTERM, past the {grace} s grace"
    assert ("pods train: SIGTERM: the step in progress (step 3) did not end within" in out
            and "(it was in the reward function 'slow_judge'): abandoned; saving checkpoint-2 from the last "
            "complete step" in out), out
    assert f"stopped by SIGTERM: saved {run_dir / 'checkpoint-2'} (step 2" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["abandoned_step_in"] == "the reward function 'slow_judge'" and summary["steps"] == 2
    assert runlog.read_clock(run_dir / "checkpoint-2")["step"] == 2
    # The checkpoint saved from memory is a real one: the run resumes from it (the judge fixed).
    exec(compile(textwrap.dedent(FAULTY_TASK), "faulty_task", "exec"), {})
    os.environ.pop("PODS_FAULT", None)
    assert train_main([*argv[1:], "--max_steps", "3", "--resume_from_checkpoint", "true"]) == 0
    assert [r["step"] for r in runlog.read_metrics(run_dir) if "loss" in r] == [1, 2, 3]
    assert runlog.read_clock(run_dir / "final")["step"] == 3


def test_a_step_that_cannot_be_interrupted_still_ends_before_the_grace_runs_out(tmp_path, tiny_model_dir):
    """The last resort: the main thread no longer takes signals (C code that blocks them, a rank waiting on a
    collective). The watchdog ends the process itself just before the grace, naming the last complete checkpoint."""
    run_dir, mark, grace = tmp_path / "run", tmp_path / "hanging", 10
    argv = ["train", *_train_args(tiny_model_dir, run_dir, "--task", "faulty", "--max_steps", "50",
                                  "--save_strategy", "steps", "--save_steps", "1", "--stop_grace_seconds", str(grace))]
    proc = _pods_process(*argv, prelude=FAULTY_TASK,
                         env={"PODS_FAULT": "uninterruptible", "PODS_FAULT_MARK": str(mark)})
    try:
        deadline_at = time.monotonic() + 400
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline_at:
            time.sleep(0.05)
        assert mark.exists(), proc.communicate(timeout=30)[1][-3000:]
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # noted by the handler; from now on the main thread takes no signal
        Path(str(mark) + ".block").write_text("")
        out, err = proc.communicate(timeout=grace + 30)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert grace - 4 < took < grace, f"exited {took:.1f} s after SIGTERM (grace {grace} s)"
    assert (f"pods train: stopped by SIGTERM: the step did not end within the grace period ({grace} s) and could not "
            f"be interrupted; exiting without saving: the last complete checkpoint is {run_dir / 'checkpoint-2'}; "
            f"resume with the same command plus --output_dir {run_dir} --resume_from_checkpoint true") in err


def test_a_reward_function_returning_none_stops_pods_train_naming_it(tmp_path, tiny_model_dir, capsys, monkeypatch):
    from pods_rl.commands.train import main as train_main

    exec(compile(textwrap.dedent(FAULTY_TASK), "faulty_task", "exec"), {})
    monkeypatch.setenv("PODS_FAULT", "none")
    run_dir = tmp_path / "run"
    assert train_main(_train_args(tiny_model_dir, run_dir, "--task", "faulty", "--max_steps", "2")) == 2
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("pods train: error: reward function 'slow_judge' returned None; "
                                                   "it must return a list of 16 numbers"), lines
    assert lines[0].endswith("no checkpoint was saved yet: fix it and run again")


@pytest.fixture
def forbid_loading(monkeypatch):
    """Loading a model fails the test: the faults below must be found before."""
    import transformers

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the fault was found")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)


def _user_folder(tmp_path):
    folder = tmp_path / "my-recipe"
    folder.mkdir()
    (folder / "README.md").write_text("# my notes\n")
    (folder / "config.yaml").write_text("task: arithmetic\nnum_generations: 8\ndownsample_to: 4\nlearning_rate: 1e-5\n")
    return folder


def _jsonl_with_empty_gold(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": ""}\n')
    return data / "train.jsonl"


# (how to make the fault in {tmp}, the flags, a substring of the one line); every row exits 2 before any model loads
BEFORE_LOADING = [
    (_user_folder, "--output_dir {dir}", "--output_dir {dir} holds files that are not a pods-rl run (README.md, "
     "config.yaml); `pods train` writes config.yaml, README.md, metrics.jsonl and checkpoints there"),
    (_user_folder, "--output_dir {dir} --resume_from_checkpoint true", "holds files that are not a pods-rl run"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --train_limit 1", "split 'train' of task 'arithmetic' has 1 "
     "prompts but one generation round needs 2 (per_device_train_batch_size 8 x steps_per_generation 1 = 8 kept "
     "rollouts / m=4): training would take 0 steps"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --train_limit 3 --oversample_prompts 2",
     "has 3 prompts but one generation round needs 4"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --max_steps -1 --num_train_epochs 0",
     "--num_train_epochs must be > 0 when --max_steps is not set, got 0.0"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --reward_timeout_s -5", "reward_timeout_s must be a number of "
     "seconds >= 0"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --stop_grace_seconds 0", "--stop_grace_seconds must be > 0"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --temperature 0", "--temperature must be > 0, got 0.0"),
    (lambda tmp: (tmp / "run" / ".pods-train.lock").mkdir(parents=True) or tmp / "run", "--output_dir {dir}",
     "cannot open the lock file {dir}/.pods-train.lock (Is a directory); remove it, or choose another directory"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --reward_weights 0 0 0", "reward_weights are all 0 ([0.0, 0.0, "
     "0.0]): every reward would be 0 and nothing would be learned"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --reward_weights 1 1e30 1", "--reward_weights 1 1e+30 1: a weight "
     "of 1e+30 is beyond the reward bound of 1e+06"),
    (lambda tmp: tmp / "run", "--output_dir {dir} --reward_weights 1 nan 1", "a weight of nan is beyond the reward "
     "bound"),
    (_jsonl_with_empty_gold, "--output_dir {tmp}/run --task jsonl:{dir} --eval_split train",
     "{dir} row 2: the gold answer is empty, so no completion could match it"),
]


@pytest.mark.parametrize("make, flags, expected", BEFORE_LOADING, ids=[r[2][:50] for r in BEFORE_LOADING])
def test_faults_found_before_loading_get_one_line(make, flags, expected, tmp_path, forbid_loading, capsys):
    from pods_rl.commands.cli import main as pods

    target = make(tmp_path)
    made_run = (tmp_path / "run").exists()

    def snapshot(folder):
        return {p.name: p.read_bytes() if p.is_file() else "dir" for p in folder.iterdir()}

    before = snapshot(target) if target.is_dir() else None
    fill = {"dir": target, "tmp": tmp_path}
    argv = ["train", "--config", "cpu/smoke", *flags.format(**fill).split()]
    assert pods(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and expected.format(**fill) in lines[0], lines
    if before is not None:  # a user's folder is left exactly as it was
        assert snapshot(target) == before
    if not made_run:
        assert not (tmp_path / "run").exists()  # a refused start leaves no run directory


def test_a_second_train_on_a_held_directory_names_the_holder_before_loading(tmp_path, forbid_loading, capsys,
                                                                           monkeypatch):
    from pods_rl.commands.cli import main as pods

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = _python(HOLDER.replace("sys.argv[1]", repr(str(run_dir))))
    argv = ["train", "--config", "cpu/smoke", "--output_dir", str(run_dir)]
    try:
        _wait_for_line(holder, "locked")
        for flags in ([], ["--resume_from_checkpoint", "true"]):  # a new run, or a requeued resume
            assert pods(argv + flags) == 2
            lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
            assert len(lines) == 1, lines
            assert lines[0].startswith(f"pods train: error: {run_dir} is in use by pods train (pid {holder.pid} on ")
        # Under a multi-process launcher only RANK 0 takes the lock; the other ranks go on (to loading, here
        # forbidden) rather than contend with their own rank 0.
        monkeypatch.setenv("RANK", "1")
        assert pods(argv) == 1
        assert "a model was loaded before the fault was found" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait(timeout=30)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _scramble_head(path):
    """Zero the first record's header: the zip directory at the end still reads, the record does not."""
    data = bytearray(path.read_bytes())
    data[:64] = bytes(64)
    path.write_bytes(bytes(data))


# (what to break in the copied run, the resume flags, exit code, a substring of the one line, whether a model may
# load first); {run} is the run directory
RUN_FAULTS = [
    (lambda run: _truncate(run / "checkpoint-4" / "model.safetensors"), "{run}/checkpoint-4", 2,
     "{run}/checkpoint-4/model.safetensors is corrupt: truncated ({size} bytes, its header lists {full}); resume from "
     "the last intact one: --resume_from_checkpoint {run}/checkpoint-2 (nothing was changed)", False),
    (lambda run: _truncate(run / "checkpoint-4" / "optimizer.pt"), "{run}/checkpoint-4", 2,
     "{run}/checkpoint-4/optimizer.pt is corrupt: truncated or damaged", False),
    (lambda run: (run / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4,'), "{run}/checkpoint-4",
     2, "{run}/checkpoint-4/trainer_state.json is corrupt: not valid JSON", False),
    (lambda run: (run / "config.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff"), "{run}/checkpoint-4", 2,
     "{run}/config.yaml is not text (byte 0 is not UTF-8: binary or damaged); restore it, or move it aside (mv "
     "{run}/config.yaml {run}/config.yaml.broken) and run again", False),
    (lambda run: (run / "config.yaml").write_text("- learning_rate\n- 0.001\n"), "{run}/checkpoint-4", 2,
     "{run}/config.yaml must hold a mapping of settings, got a YAML list; restore it, or move it aside", False),
    # found by reading it weights-only before anything loads (it was found by the optimizer's loader, naming only the
    # checkpoint)
    (lambda run: _scramble_head(run / "checkpoint-4" / "optimizer.pt"), "{run}/checkpoint-4", 2,
     "{run}/checkpoint-4/optimizer.pt is not a weights-only torch file (damaged, or a pickle of Python objects): "
     "refused unread, since loading it could run code; resume from the last intact one: --resume_from_checkpoint "
     "{run}/checkpoint-2 (nothing was changed)", False),
]


@pytest.mark.parametrize("damage, resume, code, expected, loads", RUN_FAULTS, ids=[r[3][:60] for r in RUN_FAULTS])
def test_a_damaged_run_directory_is_named_with_the_way_on(damage, resume, code, expected, loads, tmp_path,
                                                          finished_run, tiny_model_dir, capsys, monkeypatch):
    from pods_rl.commands.train import main as train_main

    run_dir = _copy_run(finished_run, tmp_path)
    full = (run_dir / "checkpoint-4" / "model.safetensors").stat().st_size
    damage(run_dir)
    size = (run_dir / "checkpoint-4" / "model.safetensors").stat().st_size
    if not loads:
        import transformers

        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: 1 / 0)
    before = sorted(p.name for p in run_dir.rglob("*"))
    argv = _train_args(tiny_model_dir, run_dir, "--max_steps", "6", "--resume_from_checkpoint",
                       resume.format(run=run_dir))
    assert train_main(argv) == code
    lines = _error_lines(capsys.readouterr().err)
    fill = {"run": run_dir, "size": size, "full": full}
    assert len(lines) == 1 and expected.format(**fill) in lines[0], lines
    if loads:  # found by the loader, after the resume plan moved final/ aside (kept in _set_aside/)
        assert f"resume from the last intact one: --resume_from_checkpoint {run_dir}/checkpoint-2" in lines[0]
    else:
        assert sorted(p.name for p in run_dir.rglob("*")) == before  # nothing moved, nothing written


def test_a_checkpoint_with_an_unreadable_clock_is_set_aside_with_its_weights(tmp_path, finished_run, tiny_model_dir,
                                                                             caplog):
    from pods_rl import runlog
    from pods_rl.commands.train import main as train_main

    run_dir = _copy_run(finished_run, tmp_path)
    import shutil

    shutil.rmtree(run_dir / "final")
    (run_dir / runlog.RUN_MARKER).unlink()  # as written by a version before the marker: still recognised as a run
    (run_dir / "checkpoint-4" / runlog.CLOCK_FILE).write_text('{"step": 4, "train_sec')  # torn by a bad disk
    weights = (run_dir / "checkpoint-4" / "model.safetensors").read_bytes()
    with caplog.at_level(logging.WARNING, logger="pods_rl.runlog"):
        assert train_main(_train_args(tiny_model_dir, run_dir, "--max_steps", "4", "--save_strategy", "steps",
                                      "--save_steps", "2", "--resume_from_checkpoint", "true")) == 0
    err = caplog.text
    aside = run_dir / runlog.SET_ASIDE_DIR / "checkpoint-4"
    assert f"warning: {run_dir / 'checkpoint-4'} is not resumable (its pods_clock.json cannot be read" in err
    assert f"moved to {aside} with its weights, which are kept" in err
    assert (aside / "model.safetensors").read_bytes() == weights  # kept, byte for byte
    assert [r["step"] for r in runlog.read_metrics(run_dir) if "loss" in r] == [1, 2, 3, 4]  # resumed from 2
    assert runlog.read_clock(run_dir / "checkpoint-4")["step"] == 4 and runlog.read_clock(run_dir / "final")


def test_disk_full_raised_by_safetensors_is_one_line_with_the_resume(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """safetensors raises its own SafetensorError (not an OSError) for ENOSPC; it is still a full disk."""
    import safetensors
    import transformers.modeling_utils

    def full(*args, **kwargs):
        raise safetensors.SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                          'message: "No space left on device" })')

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    from pods_rl.commands.train import main as train_main

    run_dir = tmp_path / "run"
    assert train_main(_train_args(tiny_model_dir, run_dir, "--max_steps", "1", "--save_strategy", "steps",
                                  "--save_steps", "1")) == 1
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"pods train: error: disk full while saving checkpoint-1 in "
                                                   f"{run_dir} (step 1): nothing complete was lost"), lines
    assert lines[0].endswith(f"resume with --output_dir {run_dir} --resume_from_checkpoint true")


class SafetensorLike(Exception):
    pass


def _chained(outer, inner):
    try:
        try:
            raise inner
        except BaseException as err:
            raise outer from err
    except BaseException as err:
        return err


# (exception, the words that must open the line; None: not a full disk)
DISK_ERRORS = [
    (OSError(28, "No space left on device", "/runs/x/eval.json"), "disk full writing /runs/x/eval.json"),
    (OSError(122, "Disk quota exceeded"), "disk quota exceeded"),
    (SafetensorLike("Error while serializing: IoError(Os { code: 28, message: \"No space left on device\" })"),
     "disk full"),
    (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"), "disk full"),
    (_chained(RuntimeError("could not save"), OSError(28, "No space left on device")), "disk full"),
    (_chained(ValueError("tokenizer save failed"), OSError(122, "Disk quota exceeded", "/q/t.json")),
     "disk quota exceeded writing /q/t.json"),
    (OSError(30, "Read-only file system", "/runs/x/config.yaml"), "the file system is read-only writing "
     "/runs/x/config.yaml: remount it writable (or write elsewhere)"),
    (_chained(RuntimeError("save failed"), OSError(5, "Input/output error")), "an I/O error (a failing disk"),
    (RuntimeError("CUDA out of memory"), None),
    (OSError(13, "Permission denied"), None),
]


@pytest.mark.parametrize("err, words", DISK_ERRORS, ids=[repr(e[0])[:50] for e in DISK_ERRORS])
def test_a_full_disk_is_named_whatever_library_raised_it(err, words):
    from pods_rl.errors import error_line

    line, code = error_line("pods eval", err)
    if words is None:
        assert "disk" not in line
    else:
        assert line.startswith(f"pods eval: error: {words}") and code == 1, line
        assert "(or write elsewhere) and run the command again; what was written completely before is intact" in line


def test_pods_eval_skips_a_checkpoint_removed_while_it_runs(tmp_path, finished_run, capsys):
    """A training run with save_total_limit deletes older checkpoints while `pods eval` works through the list."""
    import shutil

    from pods_rl.commands import evaluate

    run_dir = _copy_run(finished_run, tmp_path)
    found = evaluate.find_checkpoints(run_dir)
    assert [c["name"] for c in found] == ["checkpoint-2", "checkpoint-4"]
    shutil.rmtree(run_dir / "checkpoint-2")  # rotated away after the scan
    records = evaluate.evaluate_checkpoints(found, "arithmetic", run_dir / "eval.json", k=1, limit=2,
                                            max_new_tokens=4, backend="hf")
    assert [r["checkpoint"] for r in records] == ["checkpoint-4"]
    assert (f"note: {run_dir / 'checkpoint-2'} was removed while pods eval ran (the training run's save_total_limit "
            "rotation deletes older checkpoints); skipped") in capsys.readouterr().err


def test_pods_eval_names_a_corrupt_checkpoint_and_refuses_a_results_file_that_is_not_its_own(tmp_path, finished_run,
                                                                                            capsys):
    from pods_rl.commands.cli import main as pods

    run_dir = _copy_run(finished_run, tmp_path)
    _truncate(run_dir / "checkpoint-2" / "model.safetensors")
    notes = tmp_path / "notes.json"
    notes.write_text('[{"title": "my notes"}]')
    common = ["--task", "arithmetic", "--limit", "2", "--max-new-tokens", "4", "--k", "1", "--backend", "hf"]
    assert pods(["eval", str(run_dir), *common, "--out", str(notes)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert lines == [f"pods eval: error: {notes} is not a `pods eval` results file (item 0 is not an eval record "
                     "with ['checkpoint', 'task', 'split', 'k', 'temperature']); pass another --out, nothing was "
                     "changed"]
    assert notes.read_text() == '[{"title": "my notes"}]'
    # A run with one corrupt checkpoint: that one is skipped, naming the file; the others are evaluated.
    assert pods(["eval", str(run_dir), *common]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipping {run_dir / 'checkpoint-2'}: model.safetensors is corrupt (truncated" in err
    entries = json.loads((run_dir / "eval.json").read_text())
    assert [(r["checkpoint"], bool(r.get("skipped"))) for r in entries] == [("checkpoint-4", False),
                                                                            ("checkpoint-2", True)]
    # Asked for by itself, it is an error naming the file.
    assert pods(["eval", str(run_dir / "checkpoint-2"), *common]) == 2
    assert f"{run_dir / 'checkpoint-2' / 'model.safetensors'} is corrupt: truncated" in capsys.readouterr().err


def test_a_metrics_log_cut_inside_a_character_is_a_torn_line_not_an_unreadable_file(tmp_path):
    from pods_rl import runlog

    row = json.dumps({"step": 1, "train_seconds": 0.5, "note": "é"}, ensure_ascii=False) + "\n"
    cut = (json.dumps({"step": 2, "note": "é"}, ensure_ascii=False)).encode()
    (tmp_path / runlog.METRICS_FILE).write_bytes(row.encode() + cut[: cut.index("é".encode()) + 1])
    assert runlog.read_metrics(tmp_path) == [{"step": 1, "train_seconds": 0.5, "note": "é"}]


def test_a_refused_start_never_deletes_the_directory_of_the_one_that_holds_it(tmp_path, forbid_loading, monkeypatch,
                                                                              capsys):
    """Two starts on a directory that does not exist yet both make it; the one that loses the lock must not
    remove what the winner is writing there."""
    from pods_rl import runlog
    from pods_rl.commands.cli import main as pods

    run_dir, winner = tmp_path / "new-run", []
    real = runlog.hold_run_dir

    def the_other_start_wins_the_race(path, what="pods train"):
        # This start has made the directory; the other one takes the lock and writes in it first.
        winner.append(_python(HOLDER.replace("sys.argv[1]", repr(str(run_dir)))))
        _wait_for_line(winner[0], "locked")
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "train_seconds": 0.1}\n')
        return real(path, what)

    monkeypatch.setattr(runlog, "hold_run_dir", the_other_start_wins_the_race)
    try:
        assert pods(["train", "--config", "cpu/smoke", "--output_dir", str(run_dir)]) == 2
    finally:
        for proc in winner:
            proc.kill()
            proc.wait(timeout=30)
    assert "is in use by pods train" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1, "train_seconds": 0.1}\n'


def test_an_error_while_reading_a_checkpoint_has_a_type_of_its_own(tmp_path):
    """Classified by type where it is raised (runlog.reading_checkpoint around the trainer's loaders), not by the
    names in its traceback; a stop request passes through."""
    from pods_rl import runlog

    with pytest.raises(runlog.CheckpointUnreadable) as caught:
        with runlog.reading_checkpoint(tmp_path / "checkpoint-4"):
            raise RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory")
    assert caught.value.checkpoint == tmp_path / "checkpoint-4"
    assert str(caught.value) == (f"{tmp_path}/checkpoint-4 cannot be loaded (RuntimeError: PytorchStreamReader failed "
                                 "reading zip archive: failed finding central directory)")
    assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(KeyboardInterrupt):
        with runlog.reading_checkpoint(tmp_path):
            raise KeyboardInterrupt


def test_what_a_stop_interrupted_is_recorded_by_the_code_that_runs_not_read_off_a_traceback():
    """pods_rl.activity: the innermost part of the step that is running, main thread only."""
    import threading

    from pods_rl import activity

    assert activity.current() == activity.IDLE == "the training step"
    with activity.doing("scoring"):
        with activity.doing("the reward function 'judge'"):
            seen = []
            worker = threading.Thread(target=lambda: seen.append(activity.doing("elsewhere").__enter__()))
            worker.start()
            worker.join()
            assert activity.current() == "the reward function 'judge'"  # another thread's work is not recorded
        assert activity.current() == "scoring"
    assert activity.current() == "the training step"
