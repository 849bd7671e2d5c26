"""Answer extraction: what a completion says its answer is, in linear time (no backtracking regex); whether
it is right is ``pods_rl.tasks.grading``'s job."""

from __future__ import annotations

import re
from collections import deque

MAX_PARSE_CHARS = 300  # longer answer candidates are not parsed by math_verify (sympy)

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def completion_text(completion) -> str:
    """The text of one completion: a str as-is, the last message's content of a chat list, else str()."""
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
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed 5``), or None if unbalanced."""
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
    last = deque(_NUMBER_RE.finditer(text), maxlen=1)  # the final match only, however many there are
    return last[0].group(0).replace(",", "").rstrip(".") if last else None

def _has_exactly_one_number(text: str) -> bool:
    matches = _NUMBER_RE.finditer(text)
    return next(matches, None) is not None and next(matches, None) is None


def final_answer(text) -> str | None:
    """The one answer a completion (str or chat messages) states, for comparing completions with each other (C-GRPO's
    prediction sets): the last of ``candidate_answers`` (an ``<answer>`` block's lone number, else the block; without
    one the last number), None if it states none."""
    candidates = candidate_answers(completion_text(text))
    return candidates[-1] if candidates else None


def candidate_answers(text: str) -> list[str]:
    """Answer candidates from a completion, in the order tried (any one matching counts).

    With a non-empty ``<answer>`` block only the block is graded: itself, plus its number if it holds exactly one
    (a hedge like ``"17, not 18"`` gets no second chance). Without one: the last ``\\boxed{}``, the whole text (up to
    ``MAX_PARSE_CHARS``), then the last number."""
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
