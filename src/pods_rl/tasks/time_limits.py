"""Grading within a wall-clock limit: a ``SIGALRM`` timer in the main thread, a killable worker subprocess off it. A
timed-out item scores 0 and logs a warning; nothing a model writes can hang or crash a run."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from pods_rl import deadline
from pods_rl.tasks import grading
from pods_rl.tasks.extraction import completion_text
from pods_rl.tasks.grading import answers_match_unbounded, math_verify_any, triage

logger = logging.getLogger("pods_rl.tasks.rewards")  # one logger for the reward modules

DEFAULT_TIMEOUT_S = 2.0  # per-item wall-clock bound on grading
RETRY_MAX_CHARS = 64  # a timed-out item whose undecided candidates total at most this many characters is retried once
WORKER_START_S = 120.0  # the wait for a (re)started worker's imports and warm-up: before any item's limit


class GradingTimeout(deadline.Expired):
    """Raised inside a grading call when its time limit expires; a BaseException, so that the broad
    ``except Exception`` blocks inside sympy / math_verify cannot swallow it."""


# ----------------------------------------------------------------------------------------------------
# time bounds


def _signals_usable() -> bool:
    return deadline.usable()


def _grading_limit(timeout_s: float):
    """A ``deadline.time_limit`` raising GradingTimeout; nests inside a caller's own limits."""
    return deadline.time_limit(timeout_s, lambda: GradingTimeout(f"grading exceeded {timeout_s} s"))


def worker_main() -> None:  # pragma: no cover - runs in the child process
    """Grading worker: ``[text, gold]`` JSON lines on stdin, ``1``/``0`` lines on stdout. It warms up the grader
    first (the parent waits generously), or the first item would pay for the loading, time out and be killed."""
    grading.warm_up()
    for line in sys.stdin:
        try:
            text, gold = json.loads(line)
            ok = answers_match_unbounded(text, gold)
        except Exception:  # noqa: BLE001 - a grading error means "not correct"
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


class _GradingWorker:
    """A child Python process that grades off the main thread; killed and restarted on timeout. A plain
    ``python -c`` subprocess: no fork of a threaded parent, no re-import of the user's ``__main__``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._warm = False  # the running worker has answered once (its imports are done)

    def _start(self) -> None:
        self._warm = False
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from pods_rl.tasks.time_limits import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=5)
        self._process = None

    def _ask(self, text: str, gold: str, timeout_s: float) -> bool:
        """Send one item and wait up to ``timeout_s`` for the verdict; kill the worker on timeout."""
        try:
            self._process.stdin.write(json.dumps([text, gold]) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            self._kill()
            raise GradingTimeout("grading worker died") from None
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        if not ready:
            self._kill()
            self._start()  # its replacement imports while the caller goes on: the next item need not wait as long
            raise GradingTimeout(f"grading exceeded {timeout_s} s")
        verdict = self._process.stdout.readline()
        if not verdict:  # EOF: the worker crashed
            self._kill()
            raise GradingTimeout("grading worker died")
        return verdict.strip() == "1"

    def _ready(self) -> None:
        """A running worker past its imports and warm-up (started, and waited for, if need be). Lock held."""
        if self._process is None or self._process.poll() is not None:
            self._start()
        if not self._warm:
            # The worker's imports and warm-up come before its first answer; don't count them against an item.
            self._ask("0", "0", timeout_s=WORKER_START_S)
            self._warm = True

    def warm_up(self) -> None:
        """Start the worker and wait for its warm-up, so that no item's limit pays for it."""
        with self._lock:
            self._ready()

    def grade(self, text: str, gold: str, timeout_s: float) -> bool:
        """Whether ``text`` matches ``gold``, decided in the worker within ``timeout_s`` seconds."""
        with self._lock:
            self._ready()
            return self._ask(text, gold, timeout_s)


_worker = _GradingWorker()


def warm_up_grading() -> None:
    """Pay the grader's one-time loading now, outside any limit, where this thread grades: in this process (main
    thread), else in the grading worker (started and waited for). Cheap once done."""
    if _signals_usable():
        grading.warm_up()
        return
    try:
        _worker.warm_up()
    except GradingTimeout:  # a worker that cannot start: each item will say so by scoring 0, as before
        logger.warning("The grading worker did not start within %.0f s; its items score 0", WORKER_START_S)


def run_limited(fn: Callable, args: tuple, kwargs: dict, timeout_s: float) -> tuple[object, str | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, "timeout")`` past ``timeout_s`` seconds (or at the
    recursion limit), or ``(None, "error")`` if it raised (logged: a grader bug must not kill a run).
    In the main thread the bound is a SIGALRM timer; elsewhere it is not enforced here."""
    try:
        if _signals_usable() and timeout_s and timeout_s > 0:
            with _grading_limit(timeout_s) as limit:
                return fn(*args, **kwargs), None
            if limit.expired:
                return None, "timeout"
        return fn(*args, **kwargs), None
    except (GradingTimeout, RecursionError):  # GradingTimeout: raised by the grading worker (off the main thread)
        return None, "timeout"
    except Exception as err:  # noqa: BLE001 - a grader bug must not kill a training run
        logger.warning("Grading raised %s: %s; scoring 0", type(err).__name__, err)
        return None, "error"


def call_with_time_limit(fn: Callable, *args, timeout_s: float = DEFAULT_TIMEOUT_S, default=0.0, **kwargs):
    """``fn(*args, **kwargs)``, or ``default`` (logged) if it exceeds ``timeout_s`` or raises. The
    bound holds in the main thread only (``answers_match`` uses a worker process elsewhere)."""
    value, failure = run_limited(fn, args, kwargs, timeout_s)
    if failure == "timeout":
        logger.warning(
            "Grading timed out after %.2f s (or hit the recursion limit); scoring 0 (%s)",
            timeout_s, getattr(fn, "__name__", fn),
        )
    return default if failure else value


class Graded(NamedTuple):
    """One item's grading: ``correct``, ``cut`` (a ``CUT_REASONS`` key, or None), ``retried`` (graded twice)."""

    correct: bool
    cut: str | None
    retried: bool


def _attempt(text: str, gold: str, undecided: list[str], timeout_s: float) -> tuple[bool, str | None]:
    """math_verify on ``undecided`` within ``timeout_s``: in this process (main thread) or in the worker."""
    if _signals_usable():
        grading.warm_up()  # before the limit starts; at once after the first time
        ok, failure = run_limited(math_verify_any, (undecided, gold), {}, timeout_s)
        return bool(ok) and failure is None, failure
    try:  # off the main thread: the sympy work goes to the killable worker process (warmed before the limit)
        return _worker.grade(text, gold, timeout_s), None
    except GradingTimeout:
        return False, "timeout"


# Once loaded, math_verify decides a short answer that passed the size estimate (no tower, no giant factorial) in well
# under a second, so a limit of seconds cut on one is more likely the machine's (other processes on the cores,
# swapping, a garbage collection, sympy code loaded on first use that the warm-up did not reach) than the expression's;
# a long one may be pathological and is cut at once. A short pathological one is retried once too: it costs at most
# twice its limit, still bounded, and the retry gets only what is left of the caller's budget.
def _cut_may_be_the_machines(undecided: list[str]) -> bool:
    """Whether a timeout on ``undecided`` is worth one more try (see above)."""
    return sum(len(c) for c in undecided) <= RETRY_MAX_CHARS


def grade_item(text: str, gold: str, timeout_s: float, budget_end: float = float("inf")) -> Graded:
    """``text`` graded against ``gold`` (see ``grade_with_limits``), ``timeout_s`` per attempt; a short answer cut by
    its limit is tried once more, before ``budget_end`` (``time.monotonic()``: the caller's budget)."""
    try:
        verdict, undecided, rejected = triage(text, gold)
    except Exception as err:  # noqa: BLE001 - a grader bug must not kill a training run
        logger.warning("Grading raised %s: %s; scoring 0", type(err).__name__, err)
        return Graded(False, None, False)
    if verdict is not None:
        return Graded(verdict, "explosive" if rejected and not verdict else None, False)
    if timeout_s <= 0:
        return Graded(False, "budget", False)
    ok, failure = _attempt(text, gold, undecided, timeout_s)
    retried = False
    if failure == "timeout" and _cut_may_be_the_machines(undecided):
        retry_s = min(timeout_s, budget_end - time.monotonic())
        if retry_s > 0:  # (off the main thread, the replacement worker's start is waited for outside retry_s)
            retried = True
            ok, failure = _attempt(text, gold, undecided, retry_s)
    if failure == "error":
        failure = None  # logged as a grader bug, not counted as cut short
    return Graded(ok, failure or ("explosive" if rejected and not ok else None), retried)


def grade_with_limits(text: str, gold: str, timeout_s: float) -> tuple[bool, str | None]:
    """Whether ``text``'s answer equals ``gold``, and why the grading was cut short (else None):
    ``"explosive"`` (numbers too large to compute), ``"timeout"`` (sympy took over ``timeout_s`` s; see ``grade_item``),
    or ``"budget"`` (sympy was needed but ``timeout_s <= 0``: no time left). A cut item is not correct."""
    graded = grade_item(text, gold, timeout_s)
    return graded.correct, graded.cut


CUT_REASONS = {
    "explosive": "too explosive to compute (would have timed out)",
    "timeout": "timed out",
    "budget": "not graded: the call's time budget was spent",
}


def answers_match(text: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether the final answer in ``text`` equals ``gold``, within ``timeout_s`` seconds: the candidates of
    ``candidate_answers``, each by fast comparison then ``math_verify``. Timeouts and errors count as not correct."""
    ok, cut = grade_with_limits(completion_text(text), str(gold), timeout_s)
    if cut:
        logger.warning("Grading cut short (%s, limit %.2f s); scoring 0", CUT_REASONS[cut], timeout_s)
    return ok

