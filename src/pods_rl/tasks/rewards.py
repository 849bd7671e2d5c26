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
4. candidates whose numbers would explode (power towers such as ``9**9**9**9``, ``(10^{100})!``: any
   value beyond ``MAX_VALUE_DIGITS`` digits, estimated in log space by a small linear parser) are
   never handed to sympy either;
5. every grading call runs under a wall-clock limit: a ``SIGALRM`` interval timer in the main thread
   (cheap; sympy is interruptible), or, off the main thread where signals are unavailable, a worker
   subprocess that is killed on timeout (POSIX). A timed-out item scores 0 and logs a warning;
6. a whole call of ``correctness_reward`` is bounded too (``DEFAULT_BATCH_TIMEOUT_S``): once its budget is
   spent, the remaining items that the fast path cannot decide score 0 without being graded.

Items cut short by 4-6 score 0 and are counted: ``correctness_reward`` reports the count of each call
through the ``log_metric`` callback that TRL passes to reward functions (``GRADING_METRIC``), and logs
one warning line per call.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache

from pods_rl import deadline

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 2.0  # per-item wall-clock bound on grading
DEFAULT_BATCH_TIMEOUT_S = 5.0  # wall-clock budget of one correctness_reward call (a batch) for slow grading
GRADING_METRIC = "pods/grading_timeouts"  # items per call whose grading was cut short (they score 0)
MAX_VALUE_DIGITS = 100_000  # candidates with a (sub)value beyond this many digits are not given to sympy
MAX_PARSE_CHARS = 300  # longer answer candidates are not parsed by math_verify (sympy)
MAX_GOLD_PARSE_CHARS = 2000  # gold answers are trusted but still capped
MAX_NUMBER_CHARS = 100  # longer digit strings are compared as strings, never converted

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_THINK_TO_ANSWER_RE = re.compile(r"</think>\s*<answer>")
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_PLAIN_INT_RE = re.compile(r"[+-]?\d+")


class GradingTimeout(deadline.Expired):
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
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
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
        rest = text[i + 1 :].partition("$")[0].strip()  # partition/maxsplit: no list of a megabyte's words
        return rest.split(maxsplit=1)[0] if rest else None
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
    return float(sum(0.25 for tag in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE) if text.count(tag) == 1))


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


# ----------------------------------------------------------------------------------------------------
# explosive expressions: estimated in log space, never computed

_TOKEN_RE = re.compile(r"\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\*\*|\\[a-zA-Z]+|\\.|\S")
_IGNORED_TOKENS = frozenset(
    {"\\left", "\\right", "\\big", "\\Big", "\\bigl", "\\bigr", "\\Bigl", "\\Bigr", "\\displaystyle",
     "\\,", "\\!", "\\;", "\\:", "\\ ", "$"}
)
_OPEN_TO_CLOSE = {"(": ")", "{": "}", "[": "]"}
_CLOSERS = frozenset(_OPEN_TO_CLOSE.values())
_MUL_OPS = frozenset({"*", "/", "\\cdot", "\\times", "\\div"})
_ADD_OPS = frozenset({"+", "-", "\\pm", "\\mp"})
_FRAC_COMMANDS = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"})
_BINOM_COMMANDS = frozenset({"\\binom", "\\dbinom", "\\tbinom"})
_MAX_NESTING = 40


class _TooDeep(Exception):
    pass


class _SizeEstimator:
    """Upper bounds of ``|log10|value||`` (the size in digits, of a huge or a tiny value) of the
    numeric sub-expressions of a short math string, by recursive descent over its tokens.

    A size is a float (``inf`` allowed), or None for anything symbolic (``x``, ``\\pi``, unknown
    commands), which stays unknown through every operation. Reading never fails: a token that fits
    nowhere is skipped. ``explosive`` is set once any sub-expression exceeds ``limit`` digits.
    """

    def __init__(self, text: str, limit: float) -> None:
        self.tokens = [t for t in _TOKEN_RE.findall(text) if t not in _IGNORED_TOKENS]
        self.i = 0
        self.limit = limit
        self.explosive = False

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _note(self, size: float | None) -> float | None:
        if size is not None and size > self.limit:
            self.explosive = True
        return size

    def sequence(self, closer: str | None = None, depth: int = 0) -> float | None:
        """Expressions (separated by anything unreadable: ``,``, ``=``, ...) up to ``closer``."""
        if depth > _MAX_NESTING:
            raise _TooDeep
        sizes = []
        while (tok := self._peek()) is not None and tok != closer:
            start = self.i
            sizes.append(self._sum(depth))
            if self.i == start:
                self.i += 1  # unreadable here (a separator, a stray closer): skip it
        if tok == closer and closer is not None:
            self.i += 1
        return None if not sizes or None in sizes else max(sizes)

    def _sum(self, depth: int) -> float | None:
        size = self._product(depth)
        while self._peek() in _ADD_OPS:
            self.i += 1
            other = self._product(depth)
            size = None if size is None or other is None else self._note(max(size, other) + 0.31)
        return size

    def _starts_atom(self, tok: str | None) -> bool:
        if tok is None or tok in _CLOSERS or tok in _MUL_OPS or tok in _ADD_OPS:
            return False
        return tok[0].isalnum() or _is_number(tok) or tok in _OPEN_TO_CLOSE or (
            tok[0] == "\\" and tok[1:].isalpha()
        )

    def _product(self, depth: int) -> float | None:
        size = self._signed(depth)
        while True:
            tok = self._peek()
            if tok in _MUL_OPS:
                self.i += 1
            elif not self._starts_atom(tok):  # juxtaposition is a product too
                return size
            other = self._signed(depth)
            size = None if size is None or other is None else self._note(size + other)

    def _signed(self, depth: int) -> float | None:
        if depth > _MAX_NESTING:
            raise _TooDeep
        if self._peek() in _ADD_OPS:
            self.i += 1
            return self._signed(depth + 1)
        return self._power(depth)

    def _power(self, depth: int) -> float | None:
        base = self._postfix(depth)
        if self._peek() not in ("^", "**"):
            return base
        self.i += 1
        exponent = self._signed(depth + 1)  # right-associative: 9**9**9 is 9**(9**9)
        if base is None or exponent is None:
            return None
        if base == 0:
            return 0.0
        bound = 10.0**exponent if exponent < 300 else math.inf  # |exponent| <= bound
        return self._note(base * bound)

    def _postfix(self, depth: int) -> float | None:
        size = self._atom(depth)
        while self._peek() == "!" and (self.i + 1 >= len(self.tokens) or self.tokens[self.i + 1] != "="):
            self.i += 1
            if size is not None:
                n = 10.0**size if size < 8 else math.inf
                size = self._note(n * max(1.0, _log10(n)))  # log10(n!) <= n log10 n
        return size

    def _atom(self, depth: int) -> float | None:
        tok = self._peek()
        if tok is None or not self._starts_atom(tok):
            return None
        self.i += 1
        if tok in _OPEN_TO_CLOSE:
            return self._note(self.sequence(_OPEN_TO_CLOSE[tok], depth + 1))
        if _is_number(tok):
            return self._note(_number_size(tok))
        if tok in _FRAC_COMMANDS:
            num, den = self._atom(depth + 1), self._atom(depth + 1)
            return None if num is None or den is None else self._note(num + den)
        if tok in _BINOM_COMMANDS:  # binom(n, k) <= 2^n
            n, _ = self._atom(depth + 1), self._atom(depth + 1)
            return None if n is None else self._note((10.0**n if n < 300 else math.inf) * 0.302)
        if tok == "\\sqrt":
            if self._peek() == "[":  # \sqrt[n]{x}: the root's degree does not make it bigger
                self.i += 1
                self.sequence("]", depth + 1)
            return self._atom(depth + 1)
        return None  # a letter or a command: symbolic


def _is_number(tok: str) -> bool:
    return tok[0].isdigit() or (len(tok) > 1 and tok[0] == "." and tok[1].isdigit())


def _log10(x: float) -> float:
    return math.log10(x) if 0 < x < math.inf else (math.inf if x > 0 else 0.0)


def _number_size(tok: str) -> float:
    """``|log10|x||`` (an upper bound) of a numeric literal, without float overflow on long ones."""
    mantissa, _, exp = tok.lower().partition("e")
    if len(mantissa) <= 15:
        size = abs(_log10(float(mantissa))) if float(mantissa) else 0.0
    else:
        whole, _, frac = mantissa.partition(".")
        whole, frac = whole.lstrip("0"), frac.rstrip("0")
        size = float(len(whole)) if whole else float(len(frac) - len(frac.lstrip("0")) + 1)
    if not exp:
        return size
    return size + abs(int(exp)) if len(exp) < 12 else math.inf


def too_explosive(expr: str, max_digits: float = MAX_VALUE_DIGITS) -> bool:
    """Whether ``expr`` holds a numeric (sub)value of more than ``max_digits`` digits (huge or tiny):
    ``9**9**9**9``, ``9^{9^{9^9}}``, ``10^{-10^{10}}``, ``(10^{100})!``. Sympy would try to compute such
    a value exactly; this decides in time linear in ``len(expr)`` without computing anything."""
    estimator = _SizeEstimator(expr, max_digits)
    try:
        estimator.sequence()
    except (_TooDeep, RecursionError):
        return False  # deeply nested but short: left to the time bounds
    except Exception as err:  # noqa: BLE001 - a bug here must not stop grading
        logger.warning("too_explosive raised %s: %s; leaving %r to the time bounds", type(err).__name__, err, expr)
        return False
    return estimator.explosive


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


def _triage(text: str, gold: str) -> tuple[bool | None, list[str], bool]:
    """The cheap part of grading ``text`` against ``gold``, without sympy.

    Returns ``(verdict, undecided, rejected)``: ``verdict`` is True/False when the fast path decides
    (None: ``math_verify`` must look at the ``undecided`` candidates); ``rejected`` says that some
    candidate was dropped unexamined because its numbers would explode (``too_explosive``).
    """
    gold = str(gold).strip()
    undecided, rejected = [], False
    for cand in candidate_answers(text):
        decided = fast_match(cand, gold)
        if decided:
            return True, [], False
        if decided is None and len(cand) <= MAX_PARSE_CHARS:
            if too_explosive(cand):
                rejected = True
            else:
                undecided.append(cand)
    return (None if undecided else False), undecided, rejected


def _math_verify_any(candidates: Sequence[str], gold: str) -> bool:
    """Whether ``math_verify`` finds any of ``candidates`` equal to ``gold`` (unbounded)."""
    gold = str(gold).strip()
    return any(_math_verify_match_unbounded(cand, gold) for cand in candidates)


def _answers_match_unbounded(text: str, gold: str) -> bool:
    """Whether any candidate answer in ``text`` equals ``gold`` (fast path first, then math_verify)."""
    verdict, undecided, _ = _triage(text, gold)
    return verdict if verdict is not None else _math_verify_any(undecided, gold)


# ----------------------------------------------------------------------------------------------------
# time bounds


def _signals_usable() -> bool:
    return deadline.usable()


def _grading_limit(timeout_s: float):
    """A ``deadline.time_limit`` that raises GradingTimeout; nests inside a caller's own limits (a reward
    function's per-call budget), each firing on its own time."""
    return deadline.time_limit(timeout_s, lambda: GradingTimeout(f"grading exceeded {timeout_s} s"))


def worker_main() -> None:  # pragma: no cover - runs in the child process
    """Grading worker: read ``[text, gold]`` JSON lines on stdin, answer ``1``/``0`` lines on stdout.

    It imports sympy and math_verify (seconds) before its first answer, which the parent waits for with a generous
    bound: otherwise the first item that needs them pays for the import, runs past its limit, and the worker is
    killed and restarted, again and again."""
    try:
        _math_verify_any(["x + 1"], "1 + x")
    except Exception:  # noqa: BLE001 - grading will say "not correct" later if math_verify is broken
        pass
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
        self._warm = False  # the running worker has answered once (its imports are done)

    def _start(self) -> None:
        self._warm = False
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
            self._start()  # its replacement imports while the caller goes on: the next item need not wait as long
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
            if not self._warm:
                # The worker's imports (sympy) come before its first answer; don't count them against an item.
                self._ask("0", "0", timeout_s=120)
                self._warm = True
            return self._ask(text, gold, timeout_s)


_worker = _GradingWorker()


def _run_limited(fn: Callable, args: tuple, kwargs: dict, timeout_s: float) -> tuple[object, str | None]:
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
    except GradingTimeout:  # raised by the grading worker (off the main thread)
        return None, "timeout"
    except RecursionError:
        return None, "timeout"
    except Exception as err:  # noqa: BLE001 - a grader bug must not kill a training run
        logger.warning("Grading raised %s: %s; scoring 0", type(err).__name__, err)
        return None, "error"


def call_with_time_limit(fn: Callable, *args, timeout_s: float = DEFAULT_TIMEOUT_S, default=0.0, **kwargs):
    """``fn(*args, **kwargs)``, or ``default`` (with a logged warning) if it exceeds ``timeout_s`` seconds
    or raises. In the main thread the bound is a SIGALRM timer; elsewhere it is not enforced here (use
    ``answers_match``, which falls back to a killable worker process off the main thread)."""
    value, failure = _run_limited(fn, args, kwargs, timeout_s)
    if failure == "timeout":
        logger.warning(
            "Grading timed out after %.2f s (or hit the recursion limit); scoring 0 (%s)",
            timeout_s, getattr(fn, "__name__", fn),
        )
    return default if failure else value


def _grade(text: str, gold: str, timeout_s: float) -> tuple[bool, str | None]:
    """Whether ``text``'s answer equals ``gold``, and why the grading was cut short (else None):
    ``"explosive"`` (numbers too large to compute), ``"timeout"`` (sympy took over ``timeout_s`` s), or
    ``"budget"`` (sympy was needed but ``timeout_s <= 0``: no time left). A cut item is not correct."""
    try:
        verdict, undecided, rejected = _triage(text, gold)
    except Exception as err:  # noqa: BLE001 - a grader bug must not kill a training run
        logger.warning("Grading raised %s: %s; scoring 0", type(err).__name__, err)
        return False, None
    if verdict is not None:
        return verdict, ("explosive" if rejected and not verdict else None)
    if timeout_s <= 0:
        return False, "budget"
    if _signals_usable():
        ok, failure = _run_limited(_math_verify_any, (undecided, gold), {}, timeout_s)
        ok = bool(ok) and failure is None
    else:  # off the main thread: the sympy work goes to the killable worker process
        try:
            ok, failure = _worker.grade(text, gold, timeout_s), None
        except GradingTimeout:
            ok, failure = False, "timeout"
    if failure == "error":
        failure = None  # logged as a grader bug, not counted as cut short
    return ok, (failure or ("explosive" if rejected and not ok else None))


_CUT_REASONS = {
    "explosive": "too explosive to compute (would have timed out)",
    "timeout": "timed out",
    "budget": "not graded: the call's time budget was spent",
}


def answers_match(text: str, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether the final answer in completion ``text`` equals ``gold``, within ``timeout_s`` seconds.

    Tries the ``<answer>`` block, the last ``\\boxed{}``, the whole text, then the last number; each by
    a fast exact/numeric comparison, then ``math_verify``. Timeouts, expressions too explosive to
    compute and errors count as not correct (with a logged warning).
    """
    ok, cut = _grade(completion_text(text), str(gold), timeout_s)
    if cut:
        logger.warning("Grading cut short (%s, limit %.2f s); scoring 0", _CUT_REASONS[cut], timeout_s)
    return ok


# ----------------------------------------------------------------------------------------------------
# correctness reward factory


def make_correctness_reward(
    is_correct: Callable[..., bool] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    extra_columns: Sequence[str] = (),
    batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S,
) -> Callable:
    """Build TRL's ``correctness_reward``: 1.0 if a completion's answer is correct, else 0.0.

    Args:
        is_correct: ``is_correct(text, answer, **extra) -> bool``; defaults to ``answers_match``.
        timeout_s: per-item time bound; a timed-out item scores 0.0.
        extra_columns: dataset columns (passed by TRL as kwargs lists, one entry per completion) that
            ``is_correct`` needs, e.g. ``("entry",)`` for reasoning-gym scorers.
        batch_timeout_s: time budget of one call (a batch). Each item's bound is the smaller of
            ``timeout_s`` and what is left of the budget; once it is spent, the items the fast path
            cannot decide (those that need sympy, or any item with a custom ``is_correct``) score 0.0
            ungraded. ``math.inf`` turns the budget off.

    Items cut short (timed out, too explosive to compute, or left when the budget was spent) score 0.0.
    Each call logs one warning with their number when there are any, and reports it (0 included) as
    metric ``GRADING_METRIC`` through ``log_metric(name, value)`` when the caller passes that keyword
    (TRL's GRPOTrainer does).
    """
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    if not batch_timeout_s or batch_timeout_s <= 0:
        raise ValueError(f"batch_timeout_s must be > 0 seconds, got {batch_timeout_s!r}")

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
        deadline = time.monotonic() + batch_timeout_s
        scores, cut_reasons = [], []
        for i, (completion, gold) in enumerate(zip(completions, answer)):
            text = completion_text(completion)
            limit = min(timeout_s, deadline - time.monotonic())
            if is_correct is None:
                ok, cut = _grade(text, str(gold), limit)
            elif limit <= 0:
                ok, cut = False, "budget"
            else:
                extra = {col: kwargs[col][i] for col in extra_columns}
                ok, cut = _run_limited(is_correct, (text, gold), extra, limit)
                ok, cut = bool(ok), (cut if cut == "timeout" else None)
            scores.append(1.0 if ok else 0.0)
            if cut:
                cut_reasons.append(cut)
        if cut_reasons:
            counts = ", ".join(f"{cut_reasons.count(r)} {_CUT_REASONS[r]}" for r in _CUT_REASONS if r in cut_reasons)
            logger.warning(
                "Correctness grading cut short for %d of %d completions, which score 0 (%s; per-item limit "
                "%.2f s, per-call budget %.2f s)", len(cut_reasons), len(completions), counts, timeout_s,
                batch_timeout_s,
            )
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(GRADING_METRIC, float(len(cut_reasons)))
        return scores

    return correctness_reward


__all__ = [
    "DEFAULT_BATCH_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "GRADING_METRIC",
    "MAX_VALUE_DIGITS",
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
    "too_explosive",
]
