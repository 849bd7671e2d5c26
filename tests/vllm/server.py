"""A vLLM server for the lane's tests, started in a process group of its own and always stopped: the asynchronous
worker's tests and the asynchronous guide's runnable example share it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from pods_rl.engines.trl_async.cpu import wait_for_health

SERVER_START_S = 300  # vLLM's CPU build loads a tiny model in about a minute; a hang fails here, not at the job's limit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(command: list[str], url: str, log_path: Path, env: dict, cwd: Path | None = None):
    """Runs ``command`` (its output to ``log_path``), waits at most ``SERVER_START_S`` for ``url``'s ``/health``
    (failing the test with the log's end if it never comes), yields the process, then stops its whole group:
    SIGTERM, and SIGKILL after 30 s."""
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        try:
            wait_for_health(url, SERVER_START_S, server)
        except (RuntimeError, TimeoutError) as err:
            pytest.fail(f"{err}:\n{log_path.read_text()[-3000:]}")
        yield server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
