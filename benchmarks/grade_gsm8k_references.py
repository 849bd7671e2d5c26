"""Grade the GSM8K test set's own reference solutions with the gsm8k correctness reward.

Each reference solution (with its ``<<48/2=24>>`` calculator annotations and final ``#### 72``) is
graded as if a model had written it; the reward must call all of them correct (100%). A sanity check
of answer extraction, and a measure of grading throughput.

    python benchmarks/grade_gsm8k_references.py [--data ../shared/data/gsm8k/test.jsonl] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))  # run from a checkout without installing

from pods_rl.tasks import get_task  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Grade the references; print percent correct and time taken; exit 1 unless 100% correct."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=str(REPO_ROOT / "../shared/data/gsm8k/test.jsonl"),
        help="GSM8K test.jsonl in the grade-school-math format",
    )
    parser.add_argument("--limit", type=int, default=None, help="grade only the first N problems")
    args = parser.parse_args(argv)

    data = Path(args.data).resolve()
    if not data.is_file():
        print(f"error: no such file {data}; pass --data <path to gsm8k test.jsonl>", file=sys.stderr)
        return 2
    # The file's stem names the split (test.jsonl -> "test").
    task = get_task("gsm8k", data_dir=str(data.parent), splits=(data.stem,))
    dataset = task.load(data.stem, limit=args.limit)
    correctness_reward = task.reward_funcs()[0]

    solutions, answers = list(dataset["solution"]), list(dataset["answer"])
    started = time.perf_counter()
    scores = correctness_reward(dataset["prompt"], solutions, answer=answers)  # (N,)
    seconds = time.perf_counter() - started

    n_correct = sum(s == 1.0 for s in scores)
    print(f"graded {len(scores)} GSM8K reference solutions from {data}")
    print(f"correct: {n_correct}/{len(scores)} = {100.0 * n_correct / len(scores):.2f}%")
    print(f"time: {seconds:.2f} s ({1e3 * seconds / len(scores):.3f} ms per item)")
    for solution, answer, score in zip(solutions, answers, scores):
        if score != 1.0:
            print(f"  MISSED gold={answer!r}: ...{solution[-100:]!r}")
    return 0 if n_correct == len(scores) else 1


if __name__ == "__main__":
    sys.exit(main())
