"""Grading: whether an answer candidate equals the gold answer, without ever computing a giant number: a fast
exact / numeric comparison, a linear size estimate that keeps explosive expressions from sympy, then
``math_verify``. Unbounded in time here: ``pods_rl.tasks.time_limits`` bounds every call."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

from pods_rl.tasks.extraction import MAX_PARSE_CHARS, candidate_answers, extract_last_boxed

# One logger for the reward modules (the name users filter on: pods_rl.tasks.rewards).
logger = logging.getLogger("pods_rl.tasks.rewards")

MAX_VALUE_DIGITS = 100_000  # candidates with a (sub)value beyond this many digits are not given to sympy
MAX_GOLD_PARSE_CHARS = 2000  # gold answers are trusted but still capped
MAX_NUMBER_CHARS = 100  # longer digit strings are compared as strings, never converted

_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_PLAIN_INT_RE = re.compile(r"[+-]?\d+")


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
    """Upper bounds of ``|log10|value||`` (size in digits) of the numeric sub-expressions of a short math
    string, by recursive descent. None for anything symbolic; never fails (unknown tokens are skipped); ``explosive``
    once any sub-expression exceeds ``limit`` digits."""

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
    """Whether ``expr`` holds a (sub)value of more than ``max_digits`` digits (``9**9**9**9``,
    ``10^{-10^{10}}``, ``(10^{100})!``), decided in linear time without computing it."""
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


# One of each kind math_verify (and sympy under it) loads code for on its first use: LaTeX (antlr), a plain
# expression, a set, an equation, a root, a polynomial to simplify (the last alone took 2.7 s at a load of 15 on 2
# cores when first, 3 ms after), a tuple, an interval, trigonometry. Graded once per process, so that no real item
# pays for the loading inside its limit (what it misses, the one retry of a short item covers).
_WARM_UP_ITEMS = ((r"\frac{1}{2}", "0.5"), ("$x + 1$", "1 + x"), (r"$\{1, 2\}$", r"\{2, 1\}"), ("x = 3", "3"),
                  (r"\sqrt{8}", r"2\sqrt{2}"), ("x^2+2x+1", "(x+1)^2"), ("$(1, 2)$", "(1,2)"), ("$[0, 1]$", "[0,1]"),
                  (r"\sin^2 x + \cos^2 x", "1"))  # (each graded True: what it loads is what a match needs)
_warm_up_lock = threading.Lock()
_warmed_up = False


def warm_up() -> bool:
    """Load what ``math_verify`` loads on first use by grading ``_WARM_UP_ITEMS``, unbounded: call it before any time
    limit starts. Idempotent and thread-safe (at once after the first call); returns whether this call loaded."""
    global _warmed_up
    if _warmed_up:
        return False
    with _warm_up_lock:
        if _warmed_up:
            return False
        try:
            for candidate, gold in _WARM_UP_ITEMS:
                math_verify_any([candidate], gold)
        except Exception as err:  # noqa: BLE001 - a broken math_verify shows later as "not correct", per item
            logger.warning("Warming up the grader raised %s: %s; its first items may be cut short",
                           type(err).__name__, err)
        _warmed_up = True  # also after a failure: a broken install is not retried on every item
        return True


def triage(text: str, gold: str) -> tuple[bool | None, list[str], bool]:
    """The cheap part of grading ``text`` against ``gold``, without sympy: ``(verdict, undecided, rejected)``;
    ``verdict`` None means ``math_verify`` must look at ``undecided``; ``rejected``: a candidate was too explosive."""
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


def math_verify_any(candidates: Sequence[str], gold: str) -> bool:
    """Whether ``math_verify`` finds any of ``candidates`` equal to ``gold`` (unbounded)."""
    gold = str(gold).strip()
    return any(_math_verify_match_unbounded(cand, gold) for cand in candidates)


def answers_match_unbounded(text: str, gold: str) -> bool:
    """Whether any candidate answer in ``text`` equals ``gold`` (fast path first, then math_verify)."""
    verdict, undecided, _ = triage(text, gold)
    return verdict if verdict is not None else math_verify_any(undecided, gold)
