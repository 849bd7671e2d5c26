"""What the main thread is doing now, in words, for the line a stop prints when a step outlived its grace.

The parts of a step that can take long say so while they run (``doing``): generation and scoring (the trainer's phases),
a reward function (by name), an evaluation. A signal handler reads the innermost one (``current``). Only the main
thread's work is recorded: the signal handler runs there, and it is the main thread that a stop interrupts."""

from __future__ import annotations

import threading
from contextlib import contextmanager

_doing: list[str] = []  # innermost last; the main thread's only
IDLE = "the training step"


@contextmanager
def doing(what: str):
    """Record ``what`` (e.g. ``"generation"``, ``"the reward function 'judge'"``) as running inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _doing.append(what)
    try:
        yield
    finally:
        _doing.pop()


def current() -> str:
    """What the main thread is doing now, innermost first: the last ``doing`` entered and not left, else ``IDLE``."""
    return _doing[-1] if _doing else IDLE
