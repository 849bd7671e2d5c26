"""The model's text is untrusted input to the graders: property-based tests on adversarial completions.

Every grader (``answers_match``, ``correctness_reward``, the arithmetic task's fast grader, the format
and tag-count rewards, a task's ``score``) must, on anything a model can write: return a number in
[0, 1] within its time bound, raise nothing, execute nothing (a payload that would write a marker file
never does) and keep memory bounded. Completions mix code-execution payloads (plain, in ``$...$``,
``\\boxed{}``, ``<answer>``), power towers, deep nesting, megabyte outputs, NUL bytes and lone surrogates.
"""

import resource
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pods_rl.tasks import arithmetic, get_task, rewards

GRADE_TIMEOUT_S = 0.5  # per-item bound given to answers_match
SLACK_S = 3.0  # scheduling noise on a loaded 2-core CI machine; a hang would blow far past it
MEMORY_BOUND_MB = 600  # peak RSS may grow this much over the warmed-up baseline across all examples

GOLDS = ["7", "-3.5", "x", r"\frac{1}{2}", r"\sqrt{2}", "1,000", "9^9"]

# Python that, if any grader ever eval()'d or exec()'d it, would create the marker file.
CODE_PAYLOADS = [
    "__import__('os').system('touch {marker}')",
    "__import__('pathlib').Path('{marker}').touch()",
    "exec(\"open('{marker}', 'w').close()\")",
    "eval(\"__import__('os').system('touch {marker}')\")",
    "(lambda: open('{marker}', 'w'))()",
    "[c for c in ().__class__.__base__.__subclasses__()][0]('{marker}')",
    "1 + __import__('os').system('touch {marker}')",
    "2*open('{marker}','w').write('x')",
]
WRAPPERS = ["{}", "${}$", r"\boxed{{{}}}", "<think>t</think><answer>{}</answer>", r"\({}\)", "$$ {} $$",
            "The answer is {}.", "#### {}", r"\boxed{{1}} {}", r"\text{{{}}}"]
ODD_CHARS = ["\x00", "\ud800", "\udfff", "\udc80", "\ufffe", "\uffff", "\U0010ffff", "\x1b[2J", "\r", "{", "}",
             "$", "^", "\\", "\\boxed{", "\\frac{", "<answer>", "</answer>", "<think>", "</think>", "9", "**"]
odd_text = st.lists(st.one_of(st.characters(), st.sampled_from(ODD_CHARS)), max_size=30).map("".join)


def code_payload(marker):
    """A code-execution payload for ``marker`` in one of the wrappers, with odd text around it."""
    return st.builds(
        lambda code, wrap, pre, post: pre + wrap.format(code.format(marker=marker)) + post,
        st.sampled_from(CODE_PAYLOADS), st.sampled_from(WRAPPERS), odd_text, odd_text,
    )


@st.composite
def power_tower(draw):
    """``9^9^9^9``, ``9**9**9``, ``9^{9^{9^{9}}}``, ``(10^{100})!`` and relatives."""
    bases = draw(st.lists(st.integers(2, 99), min_size=3, max_size=7))
    style = draw(st.sampled_from(["^", "**", "^{}", "!"]))
    if style == "^{}":
        expr = "".join(f"{b}^{{" for b in bases[:-1]) + str(bases[-1]) + "}" * (len(bases) - 1)
    elif style == "!":
        expr = f"({bases[0]}^{{{bases[1] * 10}}})!"
    else:
        expr = style.join(map(str, bases))
    return draw(st.sampled_from(WRAPPERS)).format(expr)


@st.composite
def deep_nesting(draw):
    """Thousands of nested brackets / fractions / roots, balanced or not."""
    opener, closer = draw(st.sampled_from([("(", ")"), ("{", "}"), ("[", "]"), (r"\frac{1}{", "}"),
                                           (r"\sqrt{", "}"), (r"\boxed{", "}"), ("2^{", "}"), (r"\left(", r"\right)")]))
    depth = draw(st.integers(50, 20_000))
    closed = draw(st.booleans())
    expr = opener * depth + "1" + (closer * depth if closed else "")
    return draw(st.sampled_from(WRAPPERS)).format(expr)


@st.composite
def megabyte(draw):
    """About a megabyte of one repeated unit (digits, braces, tags, whitespace, junk)."""
    unit = draw(st.sampled_from(["1", "9,", "{", "}", "$", "\\boxed{", "<answer>", "</think> ", " ", "\x00",
                                 "\ud800", "a b ", "1.", "^9", "\\frac{1}{2}", "é"]))
    body = unit * (1_000_000 // len(unit))
    return draw(st.sampled_from(["{}", r"\boxed{{{}}}", "<answer>{}</answer>", "${}$", r"\boxed {}"])).format(body)


# The tasks whose graders see model text: arithmetic (linear, no sympy) and the math tasks (sympy, time-bounded).
TASKS = [arithmetic.ArithmeticTask(),
         get_task("gsm8k", grading_timeout_s=GRADE_TIMEOUT_S, grading_batch_timeout_s=1.0),
         get_task("math500", grading_timeout_s=GRADE_TIMEOUT_S, grading_batch_timeout_s=1.0)]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@pytest.fixture(scope="module")
def baseline_mb():
    """Peak RSS once sympy/math_verify are loaded (their import is not what the memory bound is about)."""
    rewards.answers_match(r"\boxed{\frac{2}{4}}", r"\frac{1}{2}")
    return peak_rss_mb()


def grade_everywhere(text: str, gold: str) -> None:
    """Run every grader on ``text``; assert each returns a number in [0, 1] within its bound."""
    chat = [{"role": "assistant", "content": text}]
    start = time.monotonic()
    verdict = rewards.answers_match(text, gold, timeout_s=GRADE_TIMEOUT_S)
    assert isinstance(verdict, bool)
    assert time.monotonic() - start < GRADE_TIMEOUT_S + SLACK_S

    reward = rewards.make_correctness_reward(timeout_s=GRADE_TIMEOUT_S, batch_timeout_s=1.0)
    start = time.monotonic()
    scores = reward(["q", "q"], [text, chat], answer=[gold, gold], log_metric=lambda name, value: None)
    assert time.monotonic() - start < 1.0 + SLACK_S
    fast = arithmetic.correctness_reward(["q"], [text], answer=[gold])
    scores += fast + rewards.format_reward(["q"], [text, chat]) + rewards.tag_count_reward(["q"], [text, chat])
    for task in TASKS:  # what `pods eval` calls, and the reward functions `pods train` gives TRL
        start = time.monotonic()
        assert set(task.score(chat, gold)) == {"correct", "format"}
        for reward_func in task.reward_funcs():
            scores += reward_func(["q"], [chat], answer=[gold])
        assert time.monotonic() - start < 2 * (GRADE_TIMEOUT_S + 1.0) + SLACK_S
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores), scores


@pytest.fixture()
def marker(tmp_path_factory):
    return tmp_path_factory.mktemp("marker") / "pwned"


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_code_payloads_are_never_executed(data, marker, baseline_mb):
    text = data.draw(code_payload(marker))
    gold = data.draw(st.sampled_from(GOLDS))
    grade_everywhere(text, gold)
    assert not marker.exists(), f"a grader executed {text!r}"
    assert peak_rss_mb() - baseline_mb < MEMORY_BOUND_MB


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.one_of(power_tower(), deep_nesting(), odd_text), gold=st.sampled_from(GOLDS))
def test_towers_nesting_and_odd_characters_are_bounded(text, gold, baseline_mb):
    grade_everywhere(text, gold)
    assert peak_rss_mb() - baseline_mb < MEMORY_BOUND_MB


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=megabyte(), gold=st.sampled_from(GOLDS))
def test_megabyte_outputs_are_bounded(text, gold, baseline_mb):
    grade_everywhere(text, gold)
    assert peak_rss_mb() - baseline_mb < MEMORY_BOUND_MB


def test_off_the_main_thread_payloads_go_to_the_worker_and_are_not_executed(marker):
    """Off the main thread sympy runs in a killable worker process: it must not execute payloads either,
    and must survive NUL bytes and lone surrogates on its pipe."""
    texts = [wrap.format(code.format(marker=marker)) for code in CODE_PAYLOADS[:3] for wrap in WRAPPERS[:3]]
    texts += ["\ud800 \\boxed{\udfff}", "x\x00y \\boxed{7\x00}", r"\boxed{9^{9^{9^{9}}}}", r"\boxed{x^2 + 1}"]
    results, errors = [], []

    def grade_all():
        try:
            start = time.monotonic()
            rewards.answers_match(r"\boxed{x^2}", "x", timeout_s=GRADE_TIMEOUT_S)  # starts the worker
            startup = time.monotonic() - start  # an item after a timeout may wait for a new worker this long
            for text in texts:
                start = time.monotonic()
                results.append(rewards.answers_match(text, "x", timeout_s=GRADE_TIMEOUT_S))
                assert time.monotonic() - start < GRADE_TIMEOUT_S + startup + SLACK_S
        except BaseException as err:  # noqa: BLE001 - reported to the main thread below
            errors.append(err)

    thread = threading.Thread(target=grade_all)
    thread.start()
    thread.join(timeout=180)
    assert not thread.is_alive() and not errors, errors
    assert len(results) == len(texts) and all(isinstance(r, bool) for r in results)
    assert not marker.exists()


def test_odd_message_structures_do_not_raise():
    """Chat completions whose content parts hold non-strings still grade (as text), never raise."""
    odd = [{"role": "assistant", "content": [{"type": "text", "text": 7}, {"text": None}, "junk"]}]
    assert rewards.completion_text(odd) == "7None"
    assert rewards.make_correctness_reward()(["q"], [odd], answer=["7None"]) == [1.0]
    assert rewards.format_reward(["q"], [odd]) == [0.0] and rewards.tag_count_reward(["q"], [odd]) == [0.0]
