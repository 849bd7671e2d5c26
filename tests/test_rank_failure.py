"""Two `pods train` processes on CPU (gloo) under `accelerate launch`, one rank dying mid-run: killed (SIGKILL),
ending with an error of its own, or hung (SIGSTOP). One `pods` line names the rank, what happened and the resume
command; no rank waits on a collective past a bound (`--ddp_timeout` for a hung rank, the launcher for a dead one);
the resume command it prints resumes the run."""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pods_rl import ranks
from tests import multiproc


def _launch(run_dir, model_dir, *extra, fault="none", fault_step=0, env=None):
    """`accelerate launch` of 2 ranks running `pods train` (through the fault script: its task can fail on rank 1)."""
    command = multiproc.launch_command(
        "train", "--config", "cpu/smoke", "--task", "rankfault", "--model_name_or_path", str(model_dir),
        "--output_dir", str(run_dir), "--eval_before_after", "false", "--save_strategy", "steps", "--save_steps", "2",
        *extra)
    return multiproc.start(command, multiproc.launch_env(fault, PODS_FAULT_RANK="1", PODS_FAULT_STEP=str(fault_step),
                                                         **(env or {})))


def _wait_for(path: Path, proc, seconds=300):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _rank_pid(run_dir, rank) -> int:
    return json.loads((Path(run_dir) / ranks.RANKS_DIR / f"rank{rank}.json").read_text())["pid"]


def _pods_lines(err: str) -> list[str]:
    return [line[line.index("pods train: error"):] for line in err.splitlines() if "pods train: error" in line]


def _end(proc, timeout):
    return multiproc.end(proc, timeout)


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_named_and_the_printed_command_resumes(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, tiny_model_dir, "--max_steps", "12")
    _wait_for(run_dir / "checkpoint-2" / "pods_clock.json", proc)
    pid = _rank_pid(run_dir, 1)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    _, err = _end(proc, timeout=120)
    took = time.monotonic() - killed
    assert proc.returncode != 0 and took < 60, (took, err[-3000:])
    lines = [line for line in _pods_lines(err) if f"rank 1 (pid {pid})" in line]
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    assert "was killed by a signal it cannot catch (SIGKILL" in line, line
    assert "resume with: " in line and "--resume_from_checkpoint true" in line, line
    assert f"--output_dir {run_dir}" in line

    # The command it printed resumes the run from its last complete checkpoint, to the end.
    command = shlex.split(line.split("resume with: ", 1)[1])
    command[command.index("--main_process_port") + 1] = str(multiproc.free_port())
    resumed = subprocess.run(command, capture_output=True, text=True, env=multiproc.launch_env(), timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "final" / "pods_clock.json").read_text())["step"] == 12


@pytest.mark.slow
def test_a_rank_ending_with_an_error_is_named_with_its_exit_code(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, tiny_model_dir, "--max_steps", "40", "--reward_timeout_s", "0", fault="raise",
                   fault_step=3)
    started = time.monotonic()
    _, err = _end(proc, timeout=400)
    assert proc.returncode != 0 and time.monotonic() - started < 300
    pid = _rank_pid(run_dir, 1)
    lines = [line for line in _pods_lines(err) if f"rank 1 (pid {pid}) exited with code" in line]
    assert len(lines) == 1, err[-3000:]
    assert "ZeroDivisionError" in lines[0] and "the judge failed at step 3" in lines[0], lines[0]
    assert "resume with: " in lines[0] and "--resume_from_checkpoint true" in lines[0]


@pytest.mark.slow
def test_a_hung_rank_is_named_once_the_process_group_timeout_passes(tmp_path, tiny_model_dir):
    """SIGSTOP: the launcher sees nothing wrong; rank 0 waits in a collective only --ddp_timeout seconds."""
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, tiny_model_dir, "--max_steps", "400", "--ddp_timeout", "8")
    _wait_for(run_dir / "checkpoint-2" / "pods_clock.json", proc)
    pid = _rank_pid(run_dir, 1)
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        _, err = _end(proc, timeout=150)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    took = time.monotonic() - stopped
    # 8 s of timeout, then the launcher's own teardown of the stopped rank (SIGTERM, SIGKILL 30 s later).
    assert proc.returncode != 0 and took < 100, (took, err[-3000:])
    lines = [line for line in _pods_lines(err) if f"rank 1 (pid {pid}) is stopped" in line]
    assert len(lines) == 1, err[-3000:]
    assert "--ddp_timeout 8" in lines[0] and "resume with: " in lines[0], lines[0]


@pytest.mark.slow
def test_rank_zero_killed_while_the_other_is_in_a_long_step_is_named_at_once(tmp_path, tiny_model_dir):
    """Rank 1 is inside a step with no collective for minutes (a slow judge) when rank 0 dies: the launcher's
    SIGTERM is not taken as a stop request (finish the step, save) but ends rank 1 at once, with the line."""
    run_dir, mark = tmp_path / "run", tmp_path / "sleeping"
    proc = _launch(run_dir, tiny_model_dir, "--max_steps", "40", "--reward_timeout_s", "0", fault="sleep",
                   fault_step=3, env={"PODS_SLEEP_RANK": "1", "PODS_FAULT_MARK": str(mark)})
    _wait_for(mark, proc)
    pid = _rank_pid(run_dir, 0)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    _, err = _end(proc, timeout=120)
    took = time.monotonic() - killed
    assert proc.returncode != 0 and took < 25, (took, err[-3000:])  # not the launcher's 30 s SIGKILL
    lines = [line for line in _pods_lines(err) if f"rank 0 (pid {pid}) was killed" in line]
    assert len(lines) == 1 and "rank 1 stopped too" in lines[0] and "resume with: " in lines[0], err[-3000:]


@pytest.mark.slow
def test_a_rank_slow_to_leave_after_its_peer_died_still_prints_its_line(tmp_path, tiny_model_dir):
    """Rank 1 dies while rank 0 waits for it in a collective; rank 0 takes 4 s to record its own failure. The
    launcher's SIGTERM comes within a second: it must not kill rank 0 before its line is out (it did, under load)."""
    run_dir, mark = tmp_path / "run", tmp_path / "sleeping"
    proc = _launch(run_dir, tiny_model_dir, "--max_steps", "40", fault="sleep", fault_step=3,
                   env={"PODS_SLEEP_RANK": "1", "PODS_FAULT_MARK": str(mark), "PODS_EXIT_SECONDS": "4"})
    _wait_for(mark, proc)
    time.sleep(2)  # rank 0 reaches the step's first collective and waits there for rank 1
    pid = _rank_pid(run_dir, 1)
    os.kill(pid, signal.SIGKILL)
    _, err = _end(proc, timeout=120)
    lines = [line for line in _pods_lines(err) if line.startswith(f"pods train: error: rank 1 (pid {pid}) was killed")]
    assert len(lines) == 1 and "resume with: " in lines[0], err[-3000:]
    rank0 = _rank_pid(run_dir, 0)
    assert f"exitcode  : 1 (pid: {rank0})" in err, err[-3000:]  # its own exit, not the launcher's SIGTERM (-15)


@pytest.mark.slow
def test_a_rank_aborted_by_a_collective_mismatch_is_named_as_such(tmp_path, tiny_model_dir):
    """Rank 1 reduces 64 values where rank 0 reduces 1 (what a decision taken by one rank alone leads to): gloo
    aborts a rank (SIGABRT, no Python exception); the line says so, not "SIGKILL or the out-of-memory killer"."""
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, tiny_model_dir, "--max_steps", "40", fault="mismatch", fault_step=6)
    _, err = _end(proc, timeout=200)
    assert proc.returncode != 0
    lines = [line for line in _pods_lines(err) if "aborted (SIGABRT) inside the collective" in line]
    assert len(lines) == 1, err[-4000:]
    assert "a collective mismatch" in lines[0] and "resume with: " in lines[0], lines[0]
    assert "out-of-memory" not in lines[0]


# --- without launching: the pieces, fast ----------------------------------------------------------------------
def _record(run_dir, rank, pid, **extra):
    path = Path(run_dir) / ranks.RANKS_DIR / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "world_size": 4, "pid": pid, "agent": os.getppid(),
                                "host": socket.gethostname(), "launch": ranks.launch_id(), **extra}))


def test_peer_states_name_each_way_a_rank_can_go(tmp_path):
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        time.sleep(0.2)
        _record(tmp_path, 1, gone.pid)
        _record(tmp_path, 2, stopped.pid)
        _record(tmp_path, 3, 999_999, exit_code=2, line="pods train: error: bad judge", peer_lost=False)
        _record(tmp_path, 0, os.getpid())  # this rank: never its own peer
        found = [text for _, text in ranks.peer_states(tmp_path, 0)]
        assert found == [f"rank 1 (pid {gone.pid}) was killed by a signal it cannot catch (SIGKILL: `kill -9`, or the "
                         "out-of-memory killer) or crashed; the launcher's report below gives its exit code",
                         f"rank 2 (pid {stopped.pid}) is stopped (SIGSTOP / SIGTSTP) and stopped answering",
                         "rank 3 (pid 999999) exited with code 2 (pods train: error: bad judge)"]
    finally:
        stopped.kill()
        stopped.wait()


def test_records_of_an_earlier_launch_and_followers_are_not_blamed(tmp_path):
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    _record(tmp_path, 1, gone.pid, agent=-1)  # written under another launcher: a stale record
    _record(tmp_path, 2, gone.pid, launch="another-launch")
    assert ranks.peer_states(tmp_path, 0) == []
    _record(tmp_path, 4, gone.pid, exit_code=0, line="pods train: finished", peer_lost=False)  # a clean end
    assert ranks.peer_states(tmp_path, 0) == []
    _record(tmp_path, 3, gone.pid, exit_code=1, line="pods train: error: rank 1 ...", peer_lost=True)
    assert [text for _, text in ranks.peer_states(tmp_path, 0)] == [
        f"rank 3 (pid {gone.pid}) exited after losing a peer itself (pods train: error: rank 1 ...)"]


@pytest.mark.parametrize("err, lost", [
    (RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer "
                  "[127.0.0.1]:4242"), True),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 8000ms for recv "
                  "operation to complete"), True),
    (RuntimeError("NCCL communicator was aborted on rank 0."), True),
    (ranks.PeerLost("rank 1 is gone"), True),
    (RuntimeError("probability tensor contains either inf, nan or element < 0"), False),
    (ValueError("Connection closed by peer"), False),
    (OSError(28, "No space left on device"), False),
])
def test_which_errors_are_a_lost_peer(err, lost):
    assert ranks.peer_lost_error(err) is lost
    wrapped = RuntimeError("pods train: step 3 failed")
    wrapped.__cause__ = err
    assert ranks.peer_lost_error(wrapped) is lost


def test_how_a_gone_rank_died_is_read_from_what_it_left(tmp_path, monkeypatch):
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    fault = tmp_path / ranks.RANKS_DIR / "rank1.fault"
    fault.parent.mkdir(parents=True)
    _record(tmp_path, 1, gone.pid, oom_kills=3)
    monkeypatch.setattr(ranks, "oom_kills", lambda: 3)
    assert "signal it cannot catch (SIGKILL" in ranks.how_it_died(tmp_path, {"rank": 1, "oom_kills": 3})
    monkeypatch.setattr(ranks, "oom_kills", lambda: 4)  # the cgroup counted an OOM kill since the rank started
    assert ranks.how_it_died(tmp_path, {"rank": 1, "oom_kills": 3}).startswith(
        "was killed by the out-of-memory killer (this machine's memory cgroup counted 1 OOM kill(s)")
    fault.write_text("Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n"
                     '  File "/x/torch/distributed/distributed_c10d.py", line 2796 in all_reduce\n'
                     '  File "/x/pods_rl/ranks.py", line 120 in agree_max\n')
    found = [text for _, text in ranks.peer_states(tmp_path, 0)]
    assert found == [f"rank 1 (pid {gone.pid}) aborted (SIGABRT) inside the collective all_reduce: the ranks called "
                     "different collectives (a collective mismatch: one rank took a step, a save or an evaluation "
                     f"the others did not), or the backend failed; its Python stack is in {fault}"]
    fault.write_text("Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
                     '  File "/x/model.py", line 3 in forward\n')
    assert ranks.how_it_died(tmp_path, {"rank": 1}) == ("crashed (Segmentation fault in forward); "
                                                        f"its Python stack is in {fault}")


def test_a_rank_leaves_its_stack_on_a_fatal_signal(tmp_path):
    """register() points faulthandler at rank<N>.fault: a SIGABRT leaves the Python stack there."""
    code = ("import os, signal, sys; from pods_rl import ranks; ranks.register(sys.argv[1], 1, 2); "
            "os.kill(os.getpid(), signal.SIGABRT)")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGABRT
    fault = (tmp_path / ranks.RANKS_DIR / "rank1.fault").read_text()
    assert fault.startswith("Fatal Python error: Aborted") and 'File "<string>", line 1' in fault, fault
