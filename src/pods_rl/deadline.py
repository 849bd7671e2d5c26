"""Wall-clock time limits for code running in the main thread, nestable: a grader's per-item bound inside a reward
function's per-call budget inside a graceful stop, each firing on its own time.

    with time_limit(5.0, lambda: MyTimeout("took over 5 s")) as limit:
        user_code()
    if limit.expired:
        ...  # user_code was interrupted after 5 s

One SIGALRM timer, armed for the earliest deadline, serves every limit; of several expired, the outermost's exception is
raised. It repeats every ``REPEAT_S`` s after an expiry, so swallowed exceptions recur; they derive from ``Expired`` (a
``BaseException``), past ``except Exception``. Only a POSIX main thread gets signals (``usable()``; elsewhere
``limit.enforced`` is False), and C code holding the GIL cannot be interrupted."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

REPEAT_S = 0.25  # after an expiry, fire again this often until the block is left


class Expired(BaseException):
    """Raised in the main thread when a ``time_limit`` expires (``.limit`` says which)."""

    limit: Limit | None = None


class Limit:
    """One active (or finished) time limit: ``deadline`` (``time.monotonic()`` seconds), ``expired`` once it fired
    and was caught by its own block, ``enforced`` whether a timer bounds it at all."""

    def __init__(self, seconds: float, make_error: Callable[[], Expired]):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.make_error = make_error
        self.expired = False
        self.enforced = False


_active: list[Limit] = []  # outermost first; only the main thread touches it
_previous_handler = None


def usable() -> bool:
    """Whether time limits can be enforced here (POSIX, main thread)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def active() -> bool:
    """Whether a time limit is running in this thread."""
    return usable() and bool(_active)


def _arm() -> None:
    if not _active:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return
    delay = min(limit.deadline for limit in _active) - time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-4), REPEAT_S)


def _on_alarm(signum, frame) -> None:
    now = time.monotonic()
    expired = [limit for limit in _active if limit.deadline <= now]
    if not expired:
        _arm()  # an earlier limit ended before its time: wait for the next one
        return
    error = expired[0].make_error()
    error.limit = expired[0]
    raise error


@contextmanager
def _signals_blocked():
    """SIGALRM held back while the stack of limits changes (a handler must never see it half-changed)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})


@contextmanager
def time_limit(seconds: float, make_error: Callable[[], Expired] | None = None):
    """Interrupt the block after ``seconds`` of wall-clock time by raising ``make_error()`` (an ``Expired``) in it;
    the block's own exception is stopped here and ``limit.expired`` set. Yields the ``Limit``. Not enforced off the
    main thread or without ``signal.setitimer`` (``limit.enforced`` False): the block then runs unbounded."""
    limit = Limit(seconds, make_error or (lambda: Expired(f"time limit of {seconds} s exceeded")))
    if not usable() or not seconds or seconds <= 0 or seconds == float("inf"):
        yield limit
        return
    global _previous_handler
    with _signals_blocked():
        if not _active:
            _previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
        _active.append(limit)
        limit.enforced = True
        _arm()
    try:
        yield limit
    except Expired as err:
        if err.limit is not limit:
            raise
        limit.expired = True
    finally:
        with _signals_blocked():
            if limit in _active:
                _active.remove(limit)
            _arm()
            if not _active:
                signal.signal(signal.SIGALRM, _previous_handler or signal.SIG_DFL)


def remaining(limit: Limit) -> float:
    """Seconds left before ``limit`` expires (may be negative)."""
    return limit.deadline - time.monotonic()
