"""Many processes: when a rank dies, the ranks left say which one, how, and how to resume, in one ``pods`` line.

A dead rank only makes the others' collective fail or time out. So each rank records itself in the run directory
(``RANKS_DIR/rank<N>.json``: pid, host, launch; and its error line when it fails), and a rank that sees a collective
fail, or a SIGTERM while a peer is gone, reads those and the peers' /proc:

    rank 1 (pid 4242) exited with code 1 (pods train: error: ...)
    rank 1 (pid 4242) was killed by a signal it cannot catch (SIGKILL: `kill -9`, or the out-of-memory killer)
    rank 1 (pid 4242) is stopped (SIGSTOP) / stopped answering (hung) and the collective waited past ddp_timeout

Plain library code: torch only inside ``bound_collectives`` (the caller passes the rank and the world size)."""

from __future__ import annotations

import datetime
import json
import logging
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from pods_rl.errors import error_line, exception_chain
from pods_rl.runlog.lock import process_state
from pods_rl.runlog.store import write_json_atomic

RANKS_DIR = ".ranks"
logger = logging.getLogger(__name__)

# What a collective raises when a peer process is gone or never answers (gloo, NCCL, the TCP store, c10d).
_PEER_LOST_WORDS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "timeout",
                    "nccl communicator was aborted", "nccl error", "socket closed", "failed to recv",
                    "failed to send", "dist_backend", "distbackenderror", "connection refused", "peer")


class PeerLost(Exception):
    """Raised in a rank whose peer rank is gone (the launcher's SIGTERM arrived while a peer had died)."""


def launch_id() -> str:
    """What all ranks of one launch share: torchrun's run id with its rendezvous address, else the parent pid."""
    parts = [os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")]
    return "/".join(parts) if any(parts) else f"ppid-{os.getppid()}"


def _record_path(run_dir, rank: int) -> Path:
    return Path(run_dir) / RANKS_DIR / f"rank{rank}.json"


def _fault_path(run_dir, rank: int) -> Path:
    return Path(run_dir) / RANKS_DIR / f"rank{rank}.fault"


_fault_file = None  # kept open for faulthandler for the life of the process


def oom_kills() -> int | None:
    """How many processes the out-of-memory killer has ended in this machine's (or container's) memory cgroup so far
    (cgroup v2 ``memory.events``), or None where that is not readable."""
    try:
        for line in Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def register(run_dir, rank: int, world_size: int) -> None:
    """Write this rank's record (pid, host, launch, the cgroup's OOM-kill count) when training starts, and have a fatal
    signal (SIGABRT, SIGSEGV: a C++ abort in a collective, a crash) leave this rank's Python stack in ``rank<N>.fault``
    beside it (``faulthandler``), for the ranks left to say what happened; nothing for a single process."""
    global _fault_file
    if world_size <= 1:
        return
    (Path(run_dir) / RANKS_DIR).mkdir(parents=True, exist_ok=True)
    write_json_atomic(_record_path(run_dir, rank), {"rank": rank, "world_size": world_size, "pid": os.getpid(),
                                                    "agent": os.getppid(), "host": socket.gethostname(),
                                                    "launch": launch_id(), "started": time.time(),
                                                    "oom_kills": oom_kills()})
    try:
        import faulthandler

        fault_file = open(_fault_path(run_dir, rank), "w")  # noqa: SIM115 - open until the process ends
        faulthandler.enable(file=fault_file, all_threads=True)
        if _fault_file is not None:
            _fault_file.close()
        _fault_file = fault_file
    except OSError as err:
        logger.warning("could not set up %s: %s", _fault_path(run_dir, rank), err)
    if rank == 0:  # a resume on fewer processes: the records of ranks this launch does not have are stale
        for path in (Path(run_dir) / RANKS_DIR).glob("rank*.json"):
            if path.stem[4:].isdigit() and int(path.stem[4:]) >= world_size:
                path.unlink(missing_ok=True)


def record_failure(run_dir, rank: int, exit_code: int, line: str, peer_lost: bool) -> None:
    """Add how this rank ends (its exit code and one line: 0 when it finished or stopped cleanly) to its record, for
    the ranks left to name it when it failed, and not to take a clean exit for a death."""
    path = _record_path(run_dir, rank)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # never registered (a single process, or it failed before training)
    record.update(exit_code=exit_code, line=line, peer_lost=peer_lost, failed=time.time())
    try:
        write_json_atomic(path, record)
    except OSError:
        pass  # the disk may be why it failed: the ranks left still see the process gone


def record_exit(run_dir, err: BaseException | None) -> None:
    """Record how this rank of a multi-process ``pods train`` ends: ``err`` (an exception or SystemExit: its exit code
    and one line), or None for a clean end (exit 0). Nothing for a single process or before the run directory."""
    if not run_dir or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if err is None:
        line, code = "pods train: finished", 0
    elif isinstance(err, Exception):
        line, code = error_line("pods train", err)
    else:
        line, code = f"pods train: exited (SystemExit: {err.code})", err.code if isinstance(err.code, int) else 1
    record_failure(run_dir, int(os.environ.get("RANK", "0")), code, line,
                   peer_lost=err is not None and peer_lost_error(err))


def bound_collectives(timeout_s) -> None:
    """Make ``--ddp_timeout`` (seconds) the bound of every collective, so that no rank waits longer on a rank that
    hung or was stopped. transformers passes it to the process group on GPUs only, not with ``use_cpu`` (gloo,
    whose default is 30 minutes); this sets it on the group already made, whatever made it."""
    import torch.distributed as dist  # loaded by now in any caller (a trainer is built); not at import time

    if timeout_s and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        try:
            dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=float(timeout_s)))
        except (AttributeError, RuntimeError, ValueError) as err:  # a torch without it: the group's own default
            logger.warning("could not set the process group's timeout to --ddp_timeout %s s: %s", timeout_s, err)


def world_size() -> int:
    """The number of processes in torch's default process group (1 when there is none)."""
    import torch.distributed as dist  # loaded by now in any caller (a trainer is built); not at import time

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def agree_max(values: list[float]) -> list[float]:
    """The element-wise maximum of ``values`` over all ranks (one all-reduce every rank must reach): one decision."""
    if world_size() <= 1:
        return [float(v) for v in values]
    import torch
    import torch.distributed as dist

    # NCCL reduces CUDA tensors only; gloo (CPU, also under DeepSpeed's and FSDP's CPU paths) CPU ones.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)  # (len(values),)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.cpu().tolist()


_step_started: tuple[int, int] | None = None  # (id of the trainer's state, global_step) of the last step start


def start_step_together(state) -> None:
    """Wait until every rank starts the step after ``state.global_step``, once per step however many callbacks ask.

    The step clocks start after it, so rank 0's logging and checkpointing do not count as others' training time."""
    global _step_started
    if world_size() <= 1:
        return
    key = (id(state), state.global_step)
    if key == _step_started:
        return
    _step_started = key
    agree_max([0.0])  # a barrier on the process group's own device (an all-reduce every rank must join)


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (every rank must call this at the same point)."""
    return agree_max([1.0 if flag else 0.0])[0] > 0


def _peer_records(run_dir, rank: int) -> list[dict]:
    """The other ranks' records of this launch, by rank."""
    records = []
    for path in sorted((Path(run_dir) / RANKS_DIR).glob("rank*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        stale = record.get("host") == socket.gethostname() and record.get("agent") != os.getppid()
        if record.get("rank") != rank and record.get("launch") == launch_id() and not stale:
            records.append(record)  # (a record of this host under another launcher is from an earlier launch)
    return sorted(records, key=lambda r: r["rank"])


def peer_states(run_dir, rank: int) -> list[tuple[dict, str]]:
    """``[(record, what happened)]`` for each other rank of this launch that is gone, stopped, or failed."""
    host = socket.gethostname()
    found, followers = [], []
    for record in _peer_records(run_dir, rank):
        who = f"rank {record['rank']} (pid {record['pid']}{'' if record['host'] == host else ' on ' + record['host']})"
        if "exit_code" in record:
            if record["exit_code"] == 0:
                continue  # it finished (or stopped cleanly, with the others): nothing went wrong there
            if record.get("peer_lost"):  # it lost a peer itself and left: the cause is elsewhere, if seen
                followers.append((record, f"{who} exited after losing a peer itself ({record['line'][:200]})"))
            else:
                found.append((record, f"{who} exited with code {record['exit_code']} ({record['line'][:200]})"))
            continue
        if record["host"] != host:
            continue  # another machine: its own ranks report it
        state = process_state(int(record["pid"]))
        if state is None or state in "ZX":
            found.append((record, f"{who} {how_it_died(run_dir, record)}"))
        elif state in "Tt":
            found.append((record, f"{who} is stopped (SIGSTOP / SIGTSTP) and stopped answering"))
    return found or followers


def how_it_died(run_dir, record: dict) -> str:
    """What ended a rank whose process is gone without recording an exit of its own (``record``: its record), in
    words: a fatal signal whose stack ``faulthandler`` left (an abort inside a collective: the ranks called
    different collectives; another crash), the out-of-memory killer (the cgroup's OOM-kill count rose since the rank
    started), else a signal no process can catch (SIGKILL)."""
    try:
        fault = _fault_path(run_dir, record["rank"]).read_text(errors="replace")
    except OSError:
        fault = ""
    if fault.strip():
        first = fault.strip().splitlines()[0].removeprefix("Fatal Python error: ").strip()
        frames = [line.strip() for line in fault.splitlines() if line.strip().startswith("File ")]
        # The innermost frame of torch.distributed: the collective the rank was in when it died.
        collective = next((line.rsplit(" in ", 1)[-1] for line in frames if "distributed_c10d.py" in line), None)
        if "Aborted" in first and collective:
            return (f"aborted (SIGABRT) inside the collective {collective}: the ranks called different collectives "
                    "(a collective mismatch: one rank took a step, a save or an evaluation the others did not), or "
                    "the backend failed; its Python stack is in "
                    f"{_fault_path(run_dir, record['rank'])}")
        where = f" in {frames[0].rsplit(' in ', 1)[-1]}" if frames else ""
        return f"crashed ({first}{where}); its Python stack is in {_fault_path(run_dir, record['rank'])}"
    now, then = oom_kills(), record.get("oom_kills")
    if now is not None and then is not None and now > then:
        return (f"was killed by the out-of-memory killer (this machine's memory cgroup counted {now - then} OOM "
                "kill(s) since the rank started): lower the batch, n or the completion length, or use more memory")
    return ("was killed by a signal it cannot catch (SIGKILL: `kill -9`, or the out-of-memory killer) or crashed; "
            "the launcher's report below gives its exit code")


def peer_lost_error(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it chains) is a collective failing because a peer went away or hung."""
    for item in exception_chain(err):
        if isinstance(item, PeerLost):
            return True
        kind = type(item).__name__.lower()
        text = str(item).lower()
        if "distbackenderror" in kind or "distnetworkerror" in kind or "diststoreerror" in kind or (
                isinstance(item, RuntimeError) and any(word in text for word in _PEER_LOST_WORDS)
                and ("gloo" in text or "nccl" in text or "c10d" in text or "tcp" in text or "peer" in text)):
            return True
    return False


def resume_command(run_dir) -> str:
    """The command that resumes this run: the launcher's own command line (read from the parent process) with
    ``--resume_from_checkpoint true`` and ``--output_dir``, else a description of it."""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")[:-1]
    except (OSError, UnicodeDecodeError):
        argv = []
    if not any(a in ("train", "pods_rl.commands.cli") for a in argv):  # not a launcher of `pods train`: our own argv
        argv = ["pods", *sys.argv[1:]] if sys.argv[1:2] == ["train"] else []
    if not argv:
        return f"the same launch command with --output_dir {run_dir} --resume_from_checkpoint true"
    for flag, value in (("--resume_from_checkpoint", "true"), ("--output_dir", str(run_dir))):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            argv[argv.index(flag) + 1] = value
        elif not any(a.startswith(flag + "=") for a in argv):
            argv += [flag, value]
        else:
            argv = [f"{flag}={value}" if a.startswith(flag + "=") else a for a in argv]
    return shlex.join(argv)


def lost_rank_line(run_dir, rank: int, err: BaseException | None, last_checkpoint: str | None,
                   timeout_s: float | None = None) -> str:
    """The one line that says which rank is gone and how, what this rank did, and the resume command."""
    states = peer_states(run_dir, rank)
    deadline = time.monotonic() + 3.0
    while not states and time.monotonic() < deadline:
        # A killed process closes its sockets while it exits: the collective fails a moment before it is gone.
        time.sleep(0.1)
        states = peer_states(run_dir, rank)
    timed_out = err is not None and "timed out" in str(err).lower()
    if not states and timed_out:  # every peer is alive: the one(s) this rank waited for are hung
        host = socket.gethostname()
        states = [(r, f"rank {r['rank']} (pid {r['pid']}) is alive but did not answer (hung, e.g. in a deadlock or "
                      "an endless wait)") for r in _peer_records(run_dir, rank) if r["host"] == host]
    if states:
        what = "; ".join(description for _, description in states)
        if timed_out and timeout_s:
            what += f" (rank {rank} waited for it --ddp_timeout {timeout_s:g} s)"
    else:
        waited = f" (the process group's timeout is {timeout_s:g} s: --ddp_timeout)" if timeout_s else ""
        first = (str(err).strip().splitlines() or [""])[0][:160] if err is not None else ""
        what = f"another rank stopped answering{waited}: {type(err).__name__ if err else 'PeerLost'}: {first}"
    kept = f"the last complete checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was saved yet"
    return f"{what}; rank {rank} stopped too and the launcher ends the rest; {kept}; resume with: " \
           f"{resume_command(run_dir)}"
