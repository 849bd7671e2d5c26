"""Verifiable rewards (as in the PODS paper): correctness, format and tag count, bounded in time.

Each has TRL's signature ``f(prompts, completions, answer, **kwargs) -> list[float | None]`` and returns unweighted
scores in [0, 1] (the paper's weights: 1.0, 0.1, 0.1); ``completions`` are strings or chat message lists.

Grading never hangs or crashes a run on adversarial output (``9^{9^{9^9}}``, huge numbers, deep nesting, junk), cheapest
defence first: linear scans (``extraction``); a fast exact / numeric comparison and never handing sympy over-long or
explosive candidates (``grading``); a wall-clock limit per item (``time_limits``: SIGALRM, or a killable worker off the
main thread); and a budget per ``correctness_reward`` call. Items cut short score 0 and are counted (``GRADING_METRIC``
through TRL's ``log_metric``); the grader loads outside every limit and a short item cut by its limit is retried once
(``RETRY_METRIC``). This module holds the reward functions and re-exports the others' public names."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence

from pods_rl import deadline  # noqa: F401  (re-exported: the time limits' state is checked through here)
from pods_rl.tasks.extraction import (  # noqa: F401  (re-exported: they lived here before the split)
    ANSWER_CLOSE,
    ANSWER_OPEN,
    MAX_PARSE_CHARS,
    THINK_CLOSE,
    THINK_OPEN,
    candidate_answers,
    completion_text,
    extract_answer_block,
    extract_last_boxed,
    last_number,
)
from pods_rl.tasks.grading import (  # noqa: F401  (re-exported: they lived here before the split)
    MAX_GOLD_PARSE_CHARS,
    MAX_NUMBER_CHARS,
    MAX_VALUE_DIGITS,
    answers_match_unbounded,
    fast_match,
    too_explosive,
)
from pods_rl.tasks.time_limits import (  # noqa: F401  (re-exported: they lived here before the split)
    CUT_REASONS,
    DEFAULT_TIMEOUT_S,
    GradingTimeout,
    answers_match,
    call_with_time_limit,
    grade_item,
    grade_with_limits,
    run_limited,
    warm_up_grading,
)

logger = logging.getLogger(__name__)

DEFAULT_BATCH_TIMEOUT_S = 5.0  # wall-clock budget of one correctness_reward call (a batch) for slow grading
GRADING_METRIC = "pods/grading_timeouts"  # items per call whose grading was cut short (they score 0)
RETRY_METRIC = "pods/grading_retries"  # items per call graded once more after their limit cut a short answer


_THINK_TO_ANSWER_RE = re.compile(r"</think>\s*<answer>")


# ----------------------------------------------------------------------------------------------------
# format rewards


def format_score(text: str) -> float:
    """1.0 if ``text`` matches ``^<think>.*?</think>\\s*<answer>.*?</answer>$`` (DOTALL, outer whitespace
    ignored), else 0.0; without the regex, which backtracks quadratically on adversarial tags."""
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
# correctness reward factory


def make_correctness_reward(
    is_correct: Callable[..., bool] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    extra_columns: Sequence[str] = (),
    batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S,
) -> Callable:
    """Build TRL's ``correctness_reward``: 1.0 if a completion's answer is correct, else 0.0.

    ``is_correct(text, answer, **extra)`` defaults to ``answers_match``; ``extra_columns``: the dataset columns it
    needs. Each item is bounded by the smaller of ``timeout_s`` and what is left of ``batch_timeout_s`` (``math.inf``:
    no budget); once spent, items the fast path cannot decide score 0 ungraded. Items cut short score 0, logged in one
    warning and reported as ``GRADING_METRIC`` through ``log_metric`` when the caller passes it (TRL does), the default
    grader's second tries (``grade_item``) as ``RETRY_METRIC``; it is warmed up here and before each call's budget."""
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    if not batch_timeout_s or batch_timeout_s <= 0:
        raise ValueError(f"batch_timeout_s must be > 0 seconds, got {batch_timeout_s!r}")
    if is_correct is None:
        warm_up_grading()  # the loading is paid here, not by the first items' limits

    def correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
        """1.0 per completion (B,) whose final answer matches its gold ``answer`` (B,), else 0.0."""
        if len(answer) != len(completions):
            raise ValueError(f"correctness_reward got {len(completions)} completions but {len(answer)} answers")
        missing = [col for col in extra_columns if col not in kwargs]
        if missing:
            raise ValueError(f"correctness_reward needs dataset column(s) {missing}; keep them in the dataset")
        if is_correct is None:
            warm_up_grading()  # in the process and thread that grade (TRL's async worker: another), before the budget
        deadline = time.monotonic() + batch_timeout_s  # noqa: F811 (a local, not the module)
        scores, cut_reasons, retries = [], [], 0
        for i, (completion, gold) in enumerate(zip(completions, answer)):
            text = completion_text(completion)
            limit = min(timeout_s, deadline - time.monotonic())
            if is_correct is None:
                ok, cut, retried = grade_item(text, str(gold), limit, budget_end=deadline)
                retries += retried
            elif limit <= 0:
                ok, cut = False, "budget"
            else:
                extra = {col: kwargs[col][i] for col in extra_columns}
                ok, cut = run_limited(is_correct, (text, gold), extra, limit)
                ok, cut = bool(ok), (cut if cut == "timeout" else None)
            scores.append(1.0 if ok else 0.0)
            if cut:
                cut_reasons.append(cut)
        if cut_reasons:
            counts = ", ".join(f"{cut_reasons.count(r)} {CUT_REASONS[r]}" for r in CUT_REASONS if r in cut_reasons)
            logger.warning(
                "Correctness grading cut short for %d of %d completions, which score 0 (%s; per-item limit "
                "%.2f s, per-call budget %.2f s)", len(cut_reasons), len(completions), counts, timeout_s,
                batch_timeout_s,
            )
        if callable(log_metric := kwargs.get("log_metric")):
            log_metric(GRADING_METRIC, float(len(cut_reasons)))
            if is_correct is None:
                log_metric(RETRY_METRIC, float(retries))
        return scores

    return correctness_reward


__all__ = [
    "DEFAULT_BATCH_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "GRADING_METRIC",
    "MAX_VALUE_DIGITS",
    "MAX_PARSE_CHARS",
    "RETRY_METRIC",
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
    "warm_up_grading",
]
