"""Right answers score 1 in a fresh process while other processes keep every core busy (issue #76).

In a fresh process the first item that reaches ``math_verify`` used to pay for its lazy loading (sympy, the LaTeX
parser) inside its 2-s limit: 0.7-0.8 s on a quiet machine, past 2 s on a busy one, and a right answer scored 0.
The loading is now paid outside every limit (``grading.warm_up``) and a short item cut by its limit is graded once
more; here a fresh process grades ``test_rewards``'s right answers on cores kept busy, in the main thread (the
SIGALRM limit) and off it (the grading worker process), each with the default limits.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.test_rewards import CORRECT, NORMAL

BUSY_S = 180  # each busy loop ends by itself after this long, even if the test dies before it is killed
CASES = CORRECT + [(completion, gold) for completion, gold, score in NORMAL if score == 1.0]

# The fresh process: no warm-up of its own; prints, per case, [answers_match, correctness_reward, answers_match
# off the main thread].
GRADE_ALL = """
import json, sys, threading
from pods_rl.tasks.rewards import answers_match, make_correctness_reward
cases = json.load(sys.stdin)
main = [answers_match(c, g) for c, g in cases]
reward = make_correctness_reward()
rewarded = [reward(["p"], [c], answer=[g]) == [1.0] for c, g in cases]
off = []
thread = threading.Thread(target=lambda: off.extend(answers_match(c, g) for c, g in cases))
thread.start()
thread.join()
print(json.dumps([list(v) for v in zip(main, rewarded, off)]))
"""


@pytest.fixture()
def busy_cores():
    """One busy loop per core (two at least), bounded in time and always killed."""
    count = max(2, os.cpu_count() or 1)
    loop = f"import time\nend = time.monotonic() + {BUSY_S}\nwhile time.monotonic() < end:\n    pass\n"
    loops = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]
    try:
        yield count
    finally:
        for process in loops:
            process.kill()
            process.wait(timeout=30)


def test_right_answers_score_one_in_a_fresh_process_on_busy_cores(busy_cores):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", GRADE_ALL], input=json.dumps(CASES), capture_output=True,
                          text=True, timeout=BUSY_S - 30, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = [(case, v) for case, v in zip(CASES, verdicts) if v != [True, True, True]]
    assert not wrong, f"right answers scored 0 on {busy_cores} busy cores: {wrong}\n{done.stderr[-3000:]}"
