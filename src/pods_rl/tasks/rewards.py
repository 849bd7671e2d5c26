"""Verifiable rewards (as in the PODS paper): correctness, format and tag count, bounded in time.

Every reward function here has TRL's reward signature
``f(prompts, completions, answer, **kwargs) -> list[float | None]`` and returns *unweighted* scores in
[0, 1]; TRL multiplies them by ``GRPOConfig.reward_weights`` (the paper uses 1.0, 0.1, 0.1).
``completions`` are either plain strings (base-style prompts) or conversational
``[{"role": "assistant", "content": str}]`` lists.

Grading must never hang or crash a run on adversarial model output (``9^{9^{9^9}}``, 100,000-digit
numbers, 10,000 nested ``\\frac``, binary junk, megabyte strings). Defences, cheapest first:

1. all string scans are linear (no backtracking regexes over the whole completion);
2. a fast exact / numeric comparison decides most items without sympy;
3. candidates longer than ``MAX_PARSE_CHARS`` are never handed to ``math_verify`` (sympy);
4. every grading call runs under a wall-clock limit: a ``SIGALRM`` interval timer in the main thread
   (cheap; sympy is interruptible), or, off the main thread where signals are unavailable, a worker
   subprocess that is killed on timeout (POSIX). A timed-out item scores 0 and logs a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from fractions import Fraction
from functools import lru_cache

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 2.0  # per-item wall-clock bound on grading
MAX_PARSE_CHARS = 300  # longer answer candidates are not parsed by math_verify (sympy)
MAX_GOLD_PARSE_CHARS = 2000  # gold answers are trusted but still capped
MAX_NUMBER_CHARS = 100  # longer digit strings are compared as strings, never converted

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_THINK_TO_ANSWER_RE = re.compile(r"</think>\s*<answer>")
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_PLAIN_INT_RE = re.compile(r"[+-]?\d+")


class GradingTimeout(BaseException):
    """Raised inside a grading call when its time limit expires.

    A BaseException (like math_verify's own TimeoutException) so that the broad ``except Exception``
    blocks inside sympy/math_verify cannot swallow it and keep computing.
    """


# ----------------------------------------------------------------------------------------------------
# completion handling and extraction (all linear-time)


def completion_text(completion) -> str:
    """The text of one completion: a str as-is, or the content of the last message of a chat list.

    Anything else (None, bytes, numbers) becomes a str so graders never crash on odd input.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)):
        if not completion:
            return ""
        last = completion[-1]
        if isinstance(last, dict):
            content = last.get("content", "")
            if isinstance(content, list):  # multimodal-style content parts
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else str(content)
        return str(last)
    if isinstance(completion, bytes):
        return completion.decode("utf-8", errors="replace")
    return "" if completion is None else str(completion)


def extract_answer_block(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` block (stripped), or None if there is none."""
    end = text.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end].strip()


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None.

    Also accepts ``\\boxed 5`` (no braces). Unbalanced braces -> None.
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if i < len(text) and text[i] == " ":  # "\boxed 5" form
        rest = text[i + 1 :].split("$")[0].strip()
        return rest.split()[0] if rest else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands commas removed (e.g. ``"1,234.5"`` -> ``"1234.5"``)."""
    last = None
    for last in _NUMBER_RE.finditer(text):  # noqa: B007 - we only want the final match
        pass
    if last is None:
        return None
    return last.group(0).replace(",", "").rstrip(".")


# ----------------------------------------------------------------------------------------------------
# format rewards


def format_score(text: str) -> float:
    """1.0 if ``text`` matches ``^<think>.*?</think>\\s*<answer>.*?</answer>$`` (DOTALL), else 0.0.

    Leading/trailing whitespace is ignored. Implemented without the regex because the lazy pattern can
    backtrack quadratically on adversarial strings with many tags; this is the same language in O(len).
    """
    text = text.strip()
    if not (text.startswith(THINK_OPEN) and text.endswith(ANSWER_CLOSE)):
        return 0.0
    # The first "</think>\s*<answer>" after the opening tag ends earliest, so if it does not leave room
    # for the closing "</answer>", no later one does either.
    match = _THINK_TO_ANSWER_RE.search(text, len(THINK_OPEN))
    if match is None or match.end() > len(text) - len(ANSWER_CLOSE):
        return 0.0
    return 1.0


def tag_count_score(text: str) -> float:
    """0.25 for each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` that occurs exactly once."""
    return sum(0.25 for tag in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE) if text.count(tag) == 1)


def format_reward(prompts, completions, **kwargs) -> list[float]:
    """TRL reward: 1.0 per completion that is well-formed ``<think>..</think><answer>..</answer>``."""
    return [format_score(completion_text(c)) for c in completions]


def tag_count_reward(prompts, completions, **kwargs) -> list[float]:
    """TRL reward: 0.25 per reasoning/answer tag that occurs exactly once (in [0, 1])."""
    return [tag_count_score(completion_text(c)) for c in completions]


# ----------------------------------------------------------------------------------------------------
# answer comparison


def _strip_wrappers(s: str) -> str:
    """Cheap normalisation of a short answer string: ``$``, ``\\boxed{}``, ``\\text{}``, spaces, ``.``."""
    s = s.strip()
    boxed = extract_last_boxed(s) if ("\\boxed" in s or "\\fbox" in s) else None
    if boxed is not None:
        s = boxed
    s = s.strip().strip("$").strip()
    if s.startswith("\\text{") and s.endswith("}"):
        s = s[len("\\text{") : -1]
    for prefix in ("\\$", "$"):
        if s.startswith(prefix):
            s = s[len(prefix) :]
    s = s.replace("\\!", "").replace("\\,", "").replace("{,}", "")
    s = s.rstrip(".").strip()
    if s.endswith("\\%"):
        s = s[:-2]
    elif s.endswith("%"):
        s = s[:-1]
    return s.replace(" ", "")


def _as_number(s: str) -> Fraction | None:
    """``s`` as an exact number if it is a plain int/decimal/``a/b`` (commas allowed), else None."""
    if len(s) > MAX_NUMBER_CHARS:
        return None
    s = s.replace(",", "")
    # Only plain decimals: Fraction("1e999999999") would build a giant int in C, beyond any signal's reach.
    if _PLAIN_NUMBER_RE.fullmatch(s):
        return Fraction(s)
    num, slash, den = s.partition("/")
    if slash and _PLAIN_INT_RE.fullmatch(num) and _PLAIN_INT_RE.fullmatch(den) and int(den) != 0:
        return Fraction(int(num), int(den))
    return None


def fast_match(candidate: str, gold: str) -> bool | None:
    """Fast path: True/False when a cheap string or exact-numeric comparison decides, else None."""
    cand, ref = _strip_wrappers(candidate), _strip_wrappers(gold)
    if not cand:
        return False
    if cand == ref or cand.replace(",", "") == ref.replace(",", ""):
        return True
    cand_num, ref_num = _as_number(cand), _as_number(ref)
    if cand_num is not None and ref_num is not None:
        return cand_num == ref_num  # two plain numbers: decided, no sympy needed
    if ref_num is not None and len(cand) > MAX_NUMBER_CHARS and cand.lstrip("-").isdigit():
        return False  # an absurdly long integer cannot equal a plain short number
    return None


def _import_math_verify():
    """math_verify, with its one-time "timeout is disabled" warning silenced: we bound time ourselves."""
    import math_verify
    import math_verify.grader
    import math_verify.parser

    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    """math_verify parse of a gold answer (cached: the same gold is graded n times per prompt)."""
    math_verify = _import_math_verify()
    parsed = math_verify.parse(f"${gold}$", parsing_timeout=None)
    if not parsed:
        parsed = math_verify.parse(gold, parsing_timeout=None)
    return parsed


def _math_verify_match_unbounded(candidate: str, gold: str) -> bool:
    """math_verify comparison with its own (signal-based) timeouts disabled; callers bound the time."""
    math_verify = _import_math_verify()
    if len(candidate) > MAX_PARSE_CHARS or len(gold) > MAX_GOLD_PARSE_CHARS:
        return False
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return False
    pred = math_verify.parse(candidate, parsing_timeout=None)
    if not pred and "$" not in candidate:
        pred = math_verify.parse(f"${candidate}$", parsing_timeout=None)
    if not pred:
        return False
    return bool(math_verify.verify(gold_parsed, pred, timeout_seconds=None))


def _has_exactly_one_number(text: str) -> bool:
    matches = _NUMBER_RE.finditer(text)
    return next(matches, None) is not None and next(matches, None) is None


def candidate_answers(text: str) -> list[str]:
    """Answer candidates from a completion, in the order tried (any one matching counts as correct).

    With a non-empty ``<answer>`` block the model has committed to an answer, so only the block is
    graded: the block itself, plus its number if it holds exactly one (``"18 dollars"`` -> ``"18"``;
    a hedge like ``"17, not 18"`` gets no second chance). Without a block: the last ``\boxed{}``, the
    whole text (if at most ``MAX_PARSE_CHARS``), then the last number (GSM8K's ``#### 72`` convention).
    """
    block = extract_answer_block(text)
    if block:
        candidates = [block]
        if _has_exactly_one_number(block):
            number = last_number(block)
            if number != block:
                candidates.append(number)
        return candidates
    candidates = []
    boxed = extract_last_boxed(text)
    if boxed:
        candidates.append(boxed)
    stripped = text.strip()
    if stripped and len(stripped) <= MAX_PARSE_CHARS and stripped not in candidates:
        candidates.append(stripped)
    number = last_number(text)
    if number is not None and number not in candidates:
        candidates.append(number)
    return candidates


def _answers_match_unbounded(text: str, gold: str) -> bool:
    """Whether any candidate answer in ``text`` equals ``gold`` (fast path first, then math_verify)."""
    gold = str(gold).strip()
    candidates = candidate_answers(text)
    undecided = []
    for cand in candidates:
        decided = fast_match(cand, gold)
        if decided:
            return True
        if decided is None:
            undecided.append(cand)
    for cand in undecided:
        if _math_verify_match_unbounded(cand, gold):
            return True
    return False


# ----------------------------------------------------------------------------------------------------
# time bounds


_bound_state = threading.local()  # .active: a SIGALRM bound is running in this (main) thread


def _signals_usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _disarm() -> None:
    """Stop the grading timer (idempotent)."""
    _bound_state.active = False
    signal.setitimer(signal.ITIMER_REAL, 0)


@contextmanager
def _alarm(timeout_s: float):
    """Raise GradingTimeout in the block after ``timeout_s`` s (main thread only; nesting: outer wins).

    The timer repeats every 0.25 s after the first expiry, so the block is interrupted even if some
    code inside catches one GradingTimeout and carries on.
    """
    if getattr(_bound_state, "active", False):
        yield  # an enclosing bound already covers this block
        return

    def on_alarm(signum, frame):
        if getattr(_bound_state, "active", False):
            raise GradingTimeout(f"grading exceeded {timeout_s} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    _bound_state.active = True
    signal.setitimer(signal.ITIMER_REAL, timeout_s, 0.25)
    try:
        yield
    finally:
        _disarm()
        signal.signal(signal.SIGALRM, previous)


def worker_main() -> None:  # pragma: no cover - runs in the child process
    """Grading worker: read ``[text, gold]`` JSON lines on stdin, answer ``1``/``0`` lines on stdout."""
    for line in sys.stdin:
        try:
            text, gold = json.loads(line)
            ok = _answers_match_unbounded(text, gold)
        except Exception:  # noqa: BLE001 - a grading error means "not correct"
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


class _GradingWorker:
    """A child Python process that grades off the main thread; killed and restarted on timeout.

    A plain ``python -c`` subprocess rather than multiprocessing: no fork of a threaded (torch) parent,
    and no re-import of the user's ``__main__`` script as ``spawn`` would do.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None

    def _start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from pods_rl.tasks.rewards import worker_main; worker_main()"],
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
            raise GradingTimeout(f"grading exceeded {timeout_s} s")
        verdict = self._process.stdout.readline()
        if not verdict:  # EOF: the worker crashed
            self._kill()
            raise GradingTimeout("grading worker died")
        return verdict.strip() == "1"

    def grade(self, text: str, gold: str, timeout_s: float) -> bool:
        """Whether ``text`` matches ``gold``, decided in the worker within ``timeout_s`` seconds."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
                # The first item also pays for the child's imports (sympy); don't count that against it.
                self._ask("0", "0", timeout_s=120)
            return self._ask(text, gold, timeout_s)


_worker = _GradingWorker()


def call_with_time_limit(fn: Callable, *args, timeout_s: float = DEFAULT_TIMEOUT_S, default=0.0, **kwargs):
    """``fn(*args, **kwargs)``, or ``default`` (with a logged warning) if it exceeds ``timeout_s`` seconds
    or raises. In the main thread the bound is a SIGALRM timer; elsewhere it is not enforced here (use
    ``answers_match``, which falls back to a killable worker process off the main thread)."""
    try:
        if _signals_usable() and timeout_s and timeout_s > 0:
            with _alarm(timeout_s):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)
    except GradingTimeout:
        if _signals_usable():
            _disarm()  # in case the timeout fired during the context manager's own cleanup
        logger.warning(
            "Grading timed out after %.2f s; scoring 0 (%s)", timeout_s, getattr(fn, "__name__", fn)
        )
        return default
    except RecursionError:
        logger.warning("Grading hit the recursion limit; scoring 0 (%s)", getattr(fn, "__name__", fn))
        return default
    except Exception as err:  # noqa: BLE001 - a grader bug must not kill a training run
        logger.warning("Grading raised %s: %s; scoring 0", type(err).__name__, err)
        return default


def answers_match(text: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether the final answer in completion ``text`` equals ``gold``, within ``timeout_s`` seconds.

    Tries the ``<answer>`` block, the last ``\\boxed{}``, the whole text, then the last number; each by
    a fast exact/numeric comparison, then ``math_verify``. Timeouts and errors count as not correct.
    """
    text, gold = completion_text(text), str(gold)
    if _signals_usable() or getattr(_bound_state, "active", False):
        return bool(
            call_with_time_limit(_answers_match_unbounded, text, gold, timeout_s=timeout_s, default=False)
        )
    # Off the main thread: decide what we can cheaply here, send only sympy work to the worker process.
    if not any(fast_match(c, gold) is None for c in candidate_answers(text)):
        return any(fast_match(c, gold) for c in candidate_answers(text))
    try:
        return _worker.grade(text, gold, timeout_s)
    except GradingTimeout:
        logger.warning("Grading timed out after %.2f s in the worker process; scoring 0", timeout_s)
        return False


# ----------------------------------------------------------------------------------------------------
# correctness reward factory


def make_correctness_reward(
    is_correct: Callable[..., bool] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    extra_columns: Sequence[str] = (),
) -> Callable:
    """Build TRL's ``correctness_reward``: 1.0 if a completion's answer is correct, else 0.0.

    Args:
        is_correct: ``is_correct(text, answer, **extra) -> bool``; defaults to ``answers_match``.
        timeout_s: per-item time bound; a timed-out item scores 0.0 and logs a warning.
        extra_columns: dataset columns (passed by TRL as kwargs lists, one entry per completion) that
            ``is_correct`` needs, e.g. ``("entry",)`` for reasoning-gym scorers.
    """

    def correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
        """1.0 per completion (B,) whose final answer matches its gold ``answer`` (B,), else 0.0."""
        if len(answer) != len(completions):
            raise ValueError(
                f"correctness_reward got {len(completions)} completions but {len(answer)} answers"
            )
        missing = [col for col in extra_columns if col not in kwargs]
        if missing:
            raise ValueError(
                f"correctness_reward needs dataset column(s) {missing}; keep them in the dataset"
            )
        scores = []
        for i, (completion, gold) in enumerate(zip(completions, answer)):
            text = completion_text(completion)
            extra = {col: kwargs[col][i] for col in extra_columns}
            if is_correct is None:
                ok = answers_match(text, gold, timeout_s=timeout_s)
            else:
                ok = call_with_time_limit(is_correct, text, gold, timeout_s=timeout_s, default=False, **extra)
            scores.append(1.0 if ok else 0.0)
        return scores

    return correctness_reward


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_PARSE_CHARS",
    "GradingTimeout",
    "answers_match",
    "call_with_time_limit",
    "candidate_answers",
    "completion_text",
    "extract_answer_block",
    "extract_last_boxed",
    "fast_match",
    "format_reward",
    "format_score",
    "last_number",
    "make_correctness_reward",
    "tag_count_reward",
    "tag_count_score",
]
