"""One owner per run directory: an advisory lock held for the life of `pods train`, and a short one around each
read-modify-write of a results file (``eval.json``) by `pods eval`.

    with hold_run_dir(run_dir):          # `pods train`: exclusive, fails at once naming the holder
        ...
    with exclusive(lock_path_for(eval_json)):   # `pods eval`: waits its turn (the section is short)
        ...

``fcntl.flock`` on a file in the run directory (``LOCK_FILE``): the operating system releases it however the process
ends. The holder writes its host, pid, start time and command into the file; a refused process waits for a record
naming a live holder (``_wait_for_holder``). Where flock is unsupported the run goes on unlocked with one warning;
docs/guides/stopping.md (Concurrency) lists the file systems."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger("pods_rl.runlog")

LOCK_FILE = ".pods-train.lock"
# errno values meaning "this file system does not do flock" (not "someone else holds it").
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, getattr(errno, "ENOTSUP", -1)}

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


# How long a refused process waits for the holder to write its name, and for a record of another host to stay put.
NAME_WAIT_SECONDS = 10.0
SETTLE_SECONDS = 0.5


class RunDirInUse(ValueError):
    """The run directory is held by another process (the message names it and the way on)."""


def holder_record(what: str) -> dict:
    """What a holder writes into the lock file: who, where, since when, doing what."""
    # Not the command line: it may carry tokens (--hub_token) into a file others can read.
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "since_unix": round(time.time(), 3), "command": what}


def read_holder(lock_path: str | os.PathLike) -> dict | None:
    """The holder record in a lock file, or None if it is empty or unreadable (being written)."""
    try:
        record = json.loads(Path(lock_path).read_text() or "null")
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe_holder(record: dict | None) -> str:
    """``"pods train (pid 123 on node7, since 2025-06-01 12:00:00 +0000)"``, or a fallback when unknown."""
    if not record:
        return "another process (it has not written its name yet)"
    return (f"{record.get('command', 'another process')} (pid {record.get('pid', '?')} on {record.get('host', '?')}, "
            f"since {record.get('since', '?')})")


class Lock:
    """An acquired lock (``path``; ``fd`` None when the file system does not support locking)."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self.fd = path, fd

    def release(self) -> None:
        """Remove the lock file, then unlock: whoever opens the name next makes a new file, and one who opened
        this one meanwhile sees, once it holds it, that it is no longer the file of that name."""
        if self.fd is None:
            return
        try:
            try:
                if os.fstat(self.fd).st_ino == os.stat(self.path).st_ino:
                    os.unlink(self.path)
            except OSError:
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None


_warned_unsupported: set[str] = set()


def _unsupported(path: Path, err: OSError) -> Lock:
    where = str(path.parent)
    if where not in _warned_unsupported:
        _warned_unsupported.add(where)
        logger.warning("warning: cannot lock %s on this file system (%s): a second job writing into it would not be "
                       "stopped; see docs/guides/stopping.md (Concurrency) for mount options",
                       where, err.strerror or err)
    return Lock(path, None)


def try_lock(path: str | os.PathLike, record: dict | None = None, wait_s: float = 0.0) -> Lock | None:
    """Take the exclusive lock on ``path`` (created if missing), waiting up to ``wait_s`` seconds; None if held
    elsewhere. ``record``: written as the holder's name. Without flock support, a ``Lock`` that locks nothing."""
    path = Path(path)
    if fcntl is None:
        return _unsupported(path, OSError(errno.ENOSYS, "no fcntl on this platform"))
    deadline, pause = time.monotonic() + wait_s, 0.002
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            if err.errno in _UNSUPPORTED:
                return _unsupported(path, err)
            owner = "another user's file? " if err.errno == errno.EACCES else ""
            raise ValueError(f"cannot open the lock file {path} ({err.strerror or err}); {owner}remove it, or "
                             "choose another directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in _UNSUPPORTED:
                return _unsupported(path, err)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() >= deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)  # short sections (eval.json) come free within milliseconds
            continue
        # The file may have been replaced between open and flock (someone removed the directory): lock the one
        # that is there now, or two processes could each hold a different file of the same name.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        if record is not None:
            # Over the old bytes, then cut to length (not truncate-then-write): a reader never sees an empty file
            # once a record was there; a torn mix of old and new does not parse, and the reader waits.
            data = (json.dumps(record) + "\n").encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        return Lock(path, fd)


def _process_start(pid: int) -> float | None:
    """When local process ``pid`` started (Unix seconds, to about 1 s), or None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime (clock ticks after boot)
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_state(pid: int) -> str | None:
    """The state letter of a local process (R, S, D, T, Z...), "?" when /proc cannot say, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2]
    except (OSError, ValueError, IndexError):
        try:
            os.kill(pid, 0)
            return "?"
        except ProcessLookupError:
            return None
        except OSError:  # EPERM: another user's process, alive
            return "?"


def _names_live_holder(record: dict) -> bool | None:
    """Whether ``record`` names a live process of this host as old as the record (None: cannot tell)."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return None
    state = process_state(pid)
    if state is None or state in "ZX":  # gone, or exited and not yet reaped: its locks are gone
        return False
    started, since = _process_start(pid), record.get("since_unix")
    if started is not None and isinstance(since, (int, float)) and started > since + 2.0:
        return False  # the pid was reused (after a reboot, say) by a process younger than the record
    return True


def _wait_for_holder(path: Path, record: dict | None) -> tuple[Lock | None, dict | None]:
    """After a refused ``try_lock(path, record)``: wait until the file names a live holder, retrying the
    lock meanwhile. Returns ``(Lock, None)`` if it became ours, else ``(None, holder)``: the last record read after at
    most ``NAME_WAIT_SECONDS`` (possibly None or stale)."""
    deadline, pause = time.monotonic() + NAME_WAIT_SECONDS, 0.01
    unchanged_since, last = None, None
    while True:
        holder = read_holder(path)
        if holder is not None:
            live = _names_live_holder(holder)
            if live:
                return None, holder
            if live is None:  # another host's: believed once it stayed the same long enough
                if holder != last:
                    unchanged_since = time.monotonic()
                elif time.monotonic() - unchanged_since >= SETTLE_SECONDS:
                    return None, holder
        last = holder
        if time.monotonic() >= deadline:
            return None, holder
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
        lock = try_lock(path, record)
        if lock is not None:
            return lock, None


@contextmanager
def exclusive(path: str | os.PathLike, what: str = "pods eval", wait_s: float = 600.0):
    """Hold the exclusive lock on ``path`` inside the block, waiting up to ``wait_s`` seconds (short sections)."""
    record = holder_record(what)
    lock = try_lock(path, record, wait_s=wait_s)
    if lock is None:
        lock, holder = _wait_for_holder(path, record)
        if lock is None:
            raise RuntimeError(f"{path} stayed locked by {describe_holder(holder)} for {wait_s:.0f} s")
    try:
        yield lock
    finally:
        lock.release()


def lock_path_for(results_file: str | os.PathLike) -> Path:
    """The lock file guarding ``results_file`` (``.eval.json.lock`` beside ``eval.json``)."""
    results_file = Path(results_file)
    return results_file.with_name(f".{results_file.name}.lock")


def hold_run_dir(run_dir: str | os.PathLike, what: str = "pods train") -> Lock:
    """Take ``run_dir``'s lock for the life of this process (the directory must exist). Raises
    ``RunDirInUse`` naming the holder when another process has it."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    record = holder_record(what)
    lock = try_lock(path, record)
    if lock is None:
        lock, holder = _wait_for_holder(path, record)
    if lock is None:
        raise RunDirInUse(
            f"{run_dir} is in use by {describe_holder(holder)}: one run directory has one writer. Wait for it to "
            f"finish (or stop it: kill -TERM {holder.get('pid', 'PID') if holder else 'PID'} on "
            f"{holder.get('host', 'its host') if holder else 'its host'}), or pass another --output_dir; nothing "
            "was changed")
    return lock
