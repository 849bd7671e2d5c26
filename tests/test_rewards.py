"""Verifiable rewards: extraction, correctness, format, tag count, and time bounds on adversarial output."""

import logging
import os
import re
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pods_rl.tasks import rewards, time_limits
from pods_rl.tasks.rewards import (
    answers_match,
    call_with_time_limit,
    completion_text,
    extract_answer_block,
    extract_last_boxed,
    format_reward,
    format_score,
    last_number,
    make_correctness_reward,
    tag_count_reward,
    tag_count_score,
)

GOOD = "<think>16 - 3 - 4 = 9 eggs, 9 * 2 = 18</think>\n<answer>18</answer>"


def chat(text):
    return [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------------------------------
# extraction


def test_completion_text_str_and_conversational():
    assert completion_text("abc") == "abc"
    assert completion_text(chat("abc")) == "abc"
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    assert completion_text([]) == ""
    assert completion_text(None) == ""
    assert completion_text(b"\xff7") == "\ufffd7"


def test_extractors():
    assert extract_answer_block("<think>x</think><answer> 42 </answer>") == "42"
    assert extract_answer_block("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer_block("no tags 42") is None
    assert extract_answer_block("</answer><answer>") is None
    assert (
        extract_last_boxed(r"so \boxed{\frac{1}{2}} and \boxed{\frac{3}{\sqrt{4}}}") == r"\frac{3}{\sqrt{4}}"
    )
    assert extract_last_boxed(r"\fbox{7}") == "7"
    assert extract_last_boxed(r"\boxed 5$") == "5"
    assert extract_last_boxed(r"\boxed{\frac{1}{2}") is None  # unbalanced
    assert last_number("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 1,018") == "1018"
    assert last_number("about -3.5.") == "-3.5"
    assert last_number("no digits") is None


# ---------------------------------------------------------------------------------------------------
# correctness


CORRECT = [  # (completion, gold): each scores 1 (also in a fresh process on busy cores: test_grading_under_load.py)
    (GOOD, "18"),
    ("<think>..</think><answer>$18</answer>", "18"),
    ("<think>..</think><answer>1,018</answer>", "1018"),
    ("<think>..</think><answer>18.0</answer>", "18"),
    ("<think>..</think><answer>\\frac{1}{2}</answer>", "0.5"),
    ("<answer>3/4</answer>", "0.75"),
    ("<answer>\\dfrac{\\sqrt{2}}{2}</answer>", "\\frac{\\sqrt2}{2}"),
    ("<answer>x = 3</answer>", "3"),
    ("The answer is \\boxed{\\frac{3}{4}}.", "\\frac34"),
    ("no tags at all, but the result is 72", "72"),
    ("9 * 2 = $<<9*2=18>>18 every day.\n#### 18", "18"),
]


@pytest.mark.parametrize("completion, gold", CORRECT)
def test_correct_answers_score_one(completion, gold):
    assert answers_match(completion, gold)
    assert make_correctness_reward()(["p"], [completion], answer=[gold]) == [1.0]


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("<think>..</think><answer>17</answer>", "18"),
        ("<think>..</think><answer>\\frac{1}{3}</answer>", "0.5"),
        ("<think>I am not sure</think><answer>many</answer>", "18"),
        ("", "18"),
        ("<answer></answer>", "18"),
        ("<think>unterminated 18", "19"),
        ("<think>18 in the reasoning</think><answer>17</answer>", "18"),  # the committed answer counts
        ("<answer>The answer is 17, not 18</answer>", "18"),  # no last-number second chance for a hedge
    ],
)
def test_wrong_or_malformed_answers_score_zero(completion, gold):
    assert not answers_match(completion, gold)
    assert make_correctness_reward()(["p"], [completion], answer=[gold]) == [0.0]


def test_conversational_and_str_completions_score_the_same():
    reward = make_correctness_reward()
    completions = [GOOD, "<answer>17</answer>"]
    assert reward(["p", "p"], completions, answer=["18", "18"]) == [1.0, 0.0]
    assert reward(["p", "p"], [chat(c) for c in completions], answer=["18", "18"]) == [1.0, 0.0]
    assert format_reward(["p"], [chat(GOOD)]) == format_reward(["p"], [GOOD]) == [1.0]
    assert tag_count_reward(["p"], [chat(GOOD)]) == tag_count_reward(["p"], [GOOD]) == [1.0]


def test_correctness_reward_validates_lengths_and_extra_columns():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        make_correctness_reward()(["p", "p"], ["1", "2"], answer=["1"])
    reward = make_correctness_reward(lambda text, gold, key: key == "ok", extra_columns=("key",))
    assert reward(["p", "p"], ["a", "b"], answer=["1", "1"], key=["ok", "no"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="'key'"):
        reward(["p"], ["a"], answer=["1"])


# ---------------------------------------------------------------------------------------------------
# format and tag count

PAPER_FORMAT_RE = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL)


def test_format_and_tag_count_examples():
    assert format_score(GOOD) == 1.0
    assert format_score("  " + GOOD + "\n") == 1.0  # surrounding whitespace is ignored
    assert format_score("<think>x</think> text <answer>1</answer>") == 0.0
    assert format_score("<answer>1</answer>") == 0.0
    assert format_score("<think>x</think><answer>1</answer> trailing") == 0.0
    assert format_score("<think></answer>") == 0.0
    assert tag_count_score(GOOD) == 1.0
    assert tag_count_score("<think>x</think>") == 0.5
    assert tag_count_score("<think><think></think><answer>1</answer>") == 0.75
    assert tag_count_score("") == 0.0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "x", "7"]), max_size=12
    )
)
def test_format_score_is_the_papers_regex(pieces):
    text = "".join(pieces)
    assert format_score(text) == (1.0 if PAPER_FORMAT_RE.match(text.strip()) else 0.0)


def test_format_score_is_linear_on_many_tags():
    text = "<think>" + "</think><answer></answer>x" * 20000  # quadratic for the lazy regex
    started = time.perf_counter()
    assert format_score(text) == 0.0
    assert time.perf_counter() - started < 1.0


# ---------------------------------------------------------------------------------------------------
# time bounds

ADVERSARIAL = [
    "<answer>" + "9" * 100_000 + "</answer>",  # a 100,000-digit number
    "<answer>" + "\\frac{1}{" * 10_000 + "2" + "}" * 10_000 + "</answer>",  # 10,000 nested \frac
    "<answer>$9^{9^{9^{9}}}$</answer>",  # short, but sympy would compute a gigantic power
    "so $9^{9^{9^{9}}}$",  # the same as the whole (short) text
    "<answer>(10^{100})!</answer>",
    "<answer>1e99999999</answer>",  # Fraction() would build this int in C, out of a signal's reach
    "<answer>9^{999999999}</answer>",
    "<answer>" + "\\sqrt{" * 200 + "2" + "}" * 200 + "</answer>",
    bytes(range(256)).decode("latin-1") * 200,  # binary junk
    "<think>" + "a" * 2_000_000 + "</think><answer>" + "{" * 100_000 + "</answer>",  # huge strings
    "\\boxed{" * 50_000,
    "1," * 100_000,
]


def test_adversarial_completions_are_bounded_and_score_zero(caplog):
    reward = make_correctness_reward(timeout_s=1.0)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="pods_rl.tasks.rewards"):
        scores = reward(["p"] * len(ADVERSARIAL), ADVERSARIAL, answer=["72"] * len(ADVERSARIAL))
    elapsed = time.perf_counter() - started
    assert scores == [0.0] * len(ADVERSARIAL)
    assert elapsed < 20.0, f"grading {len(ADVERSARIAL)} adversarial items took {elapsed:.1f} s"
    assert any("timed out" in r.getMessage() for r in caplog.records)  # the 9^9^9^9 items hit the bound
    # ... and grading still works afterwards (the timer was disarmed).
    assert reward(["p"], [GOOD], answer=["18"]) == [1.0]


def test_time_limit_interrupts_code_that_swallows_exceptions(caplog):
    def stubborn():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                time.sleep(0.01)
            except Exception:  # noqa: BLE001 - like sympy's broad handlers
                pass
        return 1.0

    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="pods_rl.tasks.rewards"):
        assert call_with_time_limit(stubborn, timeout_s=0.3, default=0.0) == 0.0
    assert time.perf_counter() - started < 5.0
    assert "timed out" in caplog.text


def test_grader_errors_score_zero_not_crash(caplog):
    def broken(text, gold):
        raise KeyError("bug")

    with caplog.at_level(logging.WARNING, logger="pods_rl.tasks.rewards"):
        assert make_correctness_reward(broken)(["p"], ["x"], answer=["1"]) == [0.0]
    assert "KeyError" in caplog.text


def test_answers_match_off_the_main_thread_is_bounded():
    """Signals only work in the main thread; elsewhere sympy work goes to a killable worker process."""
    results = {}

    def grade():
        started = time.perf_counter()
        results["hard"] = answers_match("<answer>$9^{9^{9^{9}}}$</answer>", "72", timeout_s=1.0)
        results["hard_s"] = time.perf_counter() - started
        results["sympy_needed"] = answers_match(
            "<answer>\\frac{1}{2}</answer>", "\\frac{2}{4}", timeout_s=30.0
        )
        results["fast"] = answers_match(GOOD, "18", timeout_s=1.0)

    thread = threading.Thread(target=grade)
    thread.start()
    thread.join(timeout=90)
    assert not thread.is_alive()
    assert results["hard"] is False and results["hard_s"] < 60  # includes spawning the worker once
    assert results["sympy_needed"] is True
    assert results["fast"] is True
    assert rewards.deadline._active == []  # no time limit left behind


# ---------------------------------------------------------------------------------------------------
# a bound per batch: explosive expressions rejected up front, and a time budget per call

EXPLOSIVE = [
    "9**9**9**9",
    "\\boxed{9^{9^{9^9}}}",
    "<think>big</think><answer>$9^{9^{9^{9}}}$</answer>",
    "$10^{10^{10^{10}}}$",
    "\\boxed{99999^{99999^{99999}}}",
    "<answer>(10^{100})!</answer>",
    "<answer>10^{-10^{10}}</answer>",
    "<answer>x^{9^{9^9}}</answer>",
    "<answer>\\sin(9^{9^{9}})</answer>",
    "<answer>\\binom{10^{9}}{10^{8}}</answer>",
    "<answer>\\left(10^{10}\\right)!</answer>",
    "<answer>2^{2^{2^{2^{2^{2}}}}}</answer>",
]
NORMAL = [  # (completion, gold, score): fast-path and sympy-graded items, right and wrong
    (GOOD, "18", 1.0),
    ("<answer>17</answer>", "18", 0.0),
    ("<answer>\\frac{\\sqrt{3}}{2}</answer>", "\\frac{\\sqrt3}{2}", 1.0),
    ("<answer>x^2+2x+1</answer>", "(x+1)^2", 1.0),
    ("<answer>\\sqrt{8}</answer>", "2\\sqrt{2}", 1.0),
    ("<answer>\\frac{1}{3}</answer>", "0.5", 0.0),
]


@pytest.mark.parametrize("expr", [c for c in EXPLOSIVE if "answer>" not in c] + [
    "9^{9^{9^9}}", "1e99999999", "9^{999999999}", "100000!", "\\frac{1}{9^{9^9}}", "\\sqrt{10^{10^{10}}}"])
def test_too_explosive_catches_power_towers_and_huge_factorials(expr):
    assert rewards.too_explosive(expr)


@pytest.mark.parametrize("expr", [
    "x^2+2x+1", "\\frac{\\sqrt{3}}{2}", "2^{10}", "2^{2^{2}}", "e^{i\\pi}", "x^{y^{z^{w}}}", "3!", "10!",
    "(1, 2)", "2^{100000}", "10^{99999}", "\\sqrt[3]{27}", "0.000001", "a_{n}=2^{n}", "1 != 2", "\\{1,2\\}",
    "1^{10^{100}}", "-" * 500 + "1", "(" * 500 + "1" + ")" * 500, "{" * 300, "^^**!!..", ""])
def test_too_explosive_leaves_ordinary_answers_alone(expr):
    assert not rewards.too_explosive(expr)


def test_batch_of_256_adversarial_completions_is_graded_within_10_s(caplog):
    """Issue requirement: 256 adversarial completions in under 10 s in all (here: well under 1 s), each
    scoring 0 and counted in the logged metric; the normal items of the same batch graded as usual."""
    adversarial = [EXPLOSIVE[i % len(EXPLOSIVE)] for i in range(256)]
    completions = adversarial + [c for c, _, _ in NORMAL]
    golds = ["42"] * 256 + [g for _, g, _ in NORMAL]
    logged = {}
    reward = make_correctness_reward()  # the defaults
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="pods_rl.tasks.rewards"):
        scores = reward(["p"] * len(completions), completions, answer=golds, log_metric=logged.__setitem__)
    elapsed = time.perf_counter() - started
    assert elapsed < 10.0, f"grading 256 adversarial completions took {elapsed:.1f} s"
    assert scores == [0.0] * 256 + [s for _, _, s in NORMAL]
    assert logged == {rewards.GRADING_METRIC: 256.0, rewards.RETRY_METRIC: 0.0}  # explosive: cut without a try
    summaries = [r.getMessage() for r in caplog.records if "cut short" in r.getMessage()]
    assert len(summaries) == 1 and "256 of 262" in summaries[0]  # one line per call, not one per item


def test_batch_budget_bounds_slow_grading_that_passes_the_checks(caplog):
    """Items that slip past ``too_explosive`` (here a symbolic power sympy expands, a huge Gamma) are
    bounded per item, then per call: once the budget is spent, items that need sympy score 0 ungraded,
    while items the fast path decides are still graded."""
    slow = ["<answer>(x+1)^{5000}</answer>", "<answer>\\Gamma(10^{9})</answer>"] * 32
    completions = slow + [GOOD, "<answer>17</answer>", "<answer>\\frac{\\sqrt{3}}{2}</answer>"]
    golds = ["42"] * len(slow) + ["18", "18", "\\frac{\\sqrt3}{2}"]
    logged = {}
    reward = make_correctness_reward(timeout_s=0.2, batch_timeout_s=0.5)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="pods_rl.tasks.rewards"):
        scores = reward(["p"] * len(completions), completions, answer=golds, log_metric=logged.__setitem__)
    elapsed = time.perf_counter() - started
    assert elapsed < 3.0, f"a 0.5 s budget took {elapsed:.1f} s"
    # The last item needs sympy and comes after the budget is spent: it is cut short like the slow ones.
    assert scores == [0.0] * len(slow) + [1.0, 0.0, 0.0]
    assert logged[rewards.GRADING_METRIC] == len(slow) + 1.0
    # The short slow items are retried once, within what is left of the budget: a few at most before it is spent.
    assert logged[rewards.RETRY_METRIC] <= 3.0
    assert "timed out" in caplog.text and "time budget was spent" in caplog.text
    # A fresh call has a fresh budget.
    assert reward(["p"], [completions[-1]], answer=[golds[-1]], log_metric=logged.__setitem__) == [1.0]
    assert logged == {rewards.GRADING_METRIC: 0.0, rewards.RETRY_METRIC: 0.0}


# ---------------------------------------------------------------------------------------------------
# the grader's loading outside every limit, and one more try for a short item a limit cut


def test_building_the_reward_loads_the_grader_outside_every_limit():
    """In a fresh process math_verify is loaded (lazily, on its first use) by ``make_correctness_reward``, not by
    the first item; a second warm-up does nothing."""
    import subprocess
    import sys

    code = ("import sys; from pods_rl.tasks import grading, rewards\n"
            "assert 'math_verify' not in sys.modules\n"
            "rewards.make_correctness_reward()\n"
            "assert 'math_verify' in sys.modules and grading._parse_gold.cache_info().currsize > 0\n"
            "assert grading.warm_up() is False\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]


def fake_attempts(monkeypatch, outcomes):
    """``time_limits._attempt`` answering ``outcomes`` in turn, recording the limits it was given."""
    from pods_rl.tasks import time_limits

    limits = []

    def attempt(text, gold, undecided, timeout_s):
        limits.append(timeout_s)
        return outcomes[len(limits) - 1]

    monkeypatch.setattr(time_limits, "_attempt", attempt)
    return limits


def test_a_short_answer_cut_by_its_limit_is_graded_once_more(monkeypatch):
    limits = fake_attempts(monkeypatch, [(False, "timeout"), (True, None)])
    assert rewards.grade_item("<answer>\\frac{1}{2}</answer>", "0.5", 2.0) == (True, None, True)
    assert limits == [2.0, 2.0]
    limits = fake_attempts(monkeypatch, [(False, "timeout"), (False, "timeout")])
    assert rewards.grade_item("<answer>\\frac{1}{2}</answer>", "0.5", 2.0) == (False, "timeout", True)
    assert len(limits) == 2  # once more, not again and again


def test_no_second_try_for_long_answers_explosive_ones_or_a_spent_budget(monkeypatch):
    long = "<answer>" + "+".join(["x"] * (time_limits.RETRY_MAX_CHARS // 2 + 1)) + "</answer>"
    limits = fake_attempts(monkeypatch, [(False, "timeout"), (True, None)])
    assert rewards.grade_item(long, "1", 2.0) == (False, "timeout", False) and len(limits) == 1
    limits = fake_attempts(monkeypatch, [(False, "timeout"), (True, None)])
    assert rewards.grade_item("<answer>9^{9^{9^9}}</answer>", "1", 2.0) == (False, "explosive", False)
    assert limits == []  # never reaches math_verify
    limits = fake_attempts(monkeypatch, [(False, "timeout"), (True, None)])
    spent = time.monotonic() - 1.0
    assert rewards.grade_item("<answer>\\frac{1}{2}</answer>", "0.5", 2.0, budget_end=spent) == (
        False, "timeout", False)
    assert len(limits) == 1


def test_the_retry_gets_no_more_than_the_budget_left(monkeypatch):
    limits = fake_attempts(monkeypatch, [(False, "timeout"), (True, None)])
    graded = rewards.grade_item("<answer>\\frac{1}{2}</answer>", "0.5", 2.0, budget_end=time.monotonic() + 0.5)
    assert graded == (True, None, True) and limits[0] == 2.0 and 0 < limits[1] <= 0.5


def test_a_short_pathological_answer_is_still_cut_in_bounded_time():
    """Retried once (it is short), cut again, scored 0: about twice its limit, never more."""
    started = time.perf_counter()
    graded = rewards.grade_item("<answer>(x+1)^{5000}</answer>", "42", 0.3)
    assert graded == (False, "timeout", True)
    assert time.perf_counter() - started < 2 * 0.3 + 3.0  # slack for a loaded 2-core machine


def test_the_retries_are_counted_per_call(monkeypatch):
    fake_attempts(monkeypatch, [(False, "timeout"), (True, None), (False, "timeout"), (False, "timeout")])
    logged = {}
    scores = make_correctness_reward()(["p"] * 3, [GOOD, "<answer>\\frac{1}{2}</answer>", "<answer>x^2</answer>"],
                                       answer=["18", "0.5", "y"], log_metric=logged.__setitem__)
    assert scores == [1.0, 1.0, 0.0]
    assert logged == {rewards.GRADING_METRIC: 1.0, rewards.RETRY_METRIC: 2.0}


def test_batch_budget_applies_to_custom_graders():
    def slow_is_correct(text, gold):
        time.sleep(0.05)
        return True

    reward = make_correctness_reward(slow_is_correct, timeout_s=1.0, batch_timeout_s=0.3)
    logged = {}
    started = time.perf_counter()
    scores = reward(["p"] * 40, ["x"] * 40, answer=["1"] * 40, log_metric=logged.__setitem__)
    assert time.perf_counter() - started < 2.0
    # the items graded within the budget count: at most 0.3 / 0.05 of them, at least one however busy the machine
    # (a 0.12-s budget graded 1 item, not 2-3, when two studies and the suite shared two cores)
    assert 1 <= sum(scores) <= 7 and scores[-1] == 0.0
    assert logged[rewards.GRADING_METRIC] == 40 - sum(scores)


def test_batch_budget_is_validated():
    with pytest.raises(ValueError, match="batch_timeout_s must be > 0"):
        make_correctness_reward(batch_timeout_s=0)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        make_correctness_reward(timeout_s=-1)
    from pods_rl.tasks import get_task

    assert get_task("gsm8k", grading_batch_timeout_s=20).grading_batch_timeout_s == 20
    with pytest.raises(ValueError, match="grading_batch_timeout_s must be > 0"):
        get_task("gsm8k", grading_batch_timeout_s=0)
