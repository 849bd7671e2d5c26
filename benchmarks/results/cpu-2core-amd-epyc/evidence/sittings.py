"""Mean training seconds per run of each method, by the sitting each run ran in (the evidence study, #42).

A sitting is one stretch of the study on one VM (2-core AMD EPYC or Intel Xeon: each stage's
`study.json["machine"]`). Runs are assigned to the sitting whose log lists them as done
(`stage1-8-seeds/study.log`, ...); the shipped model's seeds 8-11 ran one at a time under a log that was not kept,
so they are the runs of seeds 8-11. Prints one row per sitting and the ratios adaptive PODS / GRPO and plain PODS /
GRPO of those means: the step-time ratio of the machine the sitting had, which the wall-clock ratio divides into.
The runs' summary.json are read from the study's `study/runs/` when it is unpacked, else from its `runs.tar.xz`.

    python benchmarks/results/cpu-2core-amd-epyc/evidence/sittings.py            # the shipped model
    python benchmarks/results/cpu-2core-amd-epyc/evidence/sittings.py strong     # the strong model
"""

import json
import re
import statistics
import sys
import tarfile
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
MODELS = {  # model: (its study's folder, its methods (GRPO, adaptive, plain PODS, control),
    # plain PODS's label, sittings)
    "shipped": (
        HERE / "shipped",
        ["grpo-n8", "pods-mv-n32m8-pilot8c", "pods-mv-n32m8", "pods-random-n32m8-pilot8c"],
        "PODS 32 -> 8",
        [  # (what, log listing its runs, or None with the seeds it ran)
            ("stage 1, seeds 0-7, busy machine", "stage1-8-seeds/study.log", None),
            ("stage 2, seeds 8-11, one run at a time on one core", None, range(8, 12)),
            ("stage 2, seeds 12-15, quiet", "stage2-16-seeds/study.log", None),
            ("stage 3, part 1, quiet", "stage3-24-seeds/study-stage3-part1.log", None),
            ("stage 3, part 2, quiet, another AMD EPYC VM", "stage3-24-seeds/study-stage3-part2.log", None),
            ("stage 4, part 1, quiet, that VM", "shipped/study-stage4-part1.log", None),
            ("stage 4, part 2, quiet, an Intel Xeon VM", "shipped/study-stage4-part2.log", None),
        ],
    ),
    "strong": (
        HERE / "strong",
        ["grpo-n16", "pods-mv-n64m16-pilot16c", "pods-mv-n64m16", "pods-random-n64m16-pilot16c"],
        "PODS 64 -> 16",
        [
            ("stage 1, quiet, an Intel Xeon VM", "strong/study-stage1.log", None),
            ("stage 2, quiet, an AMD EPYC VM", "strong/study-stage2.log", None),
            ("stage 3, part 1, quiet, that VM", "strong/study-stage3-part1.log", None),
            ("stage 3, part 2, quiet, that VM", "strong/study-stage3-part2.log", None),
            ("stage 3, part 3, quiet, that VM", "strong/study-stage3-part3.log", None),
            ("stage 4, quiet, that VM", "strong/study-stage4.log", None),
        ],
    ),
}


def runs_in(log: str | None, seeds, methods: list[str]) -> list[str]:
    """The run names a sitting finished: those its log reports done, or every method's run of ``seeds``."""
    if log is None:
        return [f"{method}-s{seed}" for seed in seeds for method in methods]
    return re.findall(r"^\[\d+/\d+\] ([\w-]+): done", (HERE / log).read_text(), flags=re.M)


@cache
def summaries(study: Path) -> dict[str, dict]:
    """{run name: its summary.json} of a study's runs: from ``study/runs/`` if unpacked, else from ``runs.tar.xz``."""
    runs = study / "study" / "runs"
    if runs.is_dir():
        return {p.parent.name: json.loads(p.read_text()) for p in runs.glob("*/summary.json")}
    with tarfile.open(study / "runs.tar.xz", "r:xz") as tar:
        return {Path(m.name).parent.name: json.load(tar.extractfile(m)) for m in tar
                if re.fullmatch(r"study/runs/[^/]+/summary\.json", m.name)}


def train_seconds(study: Path, run: str) -> float:
    """``train_seconds`` of a finished run (its ``summary.json``; a resumed run's adds its sittings)."""
    summary = summaries(study)[run]
    assert summary["steps"] == 300, f"{run} did not finish its 300 updates"
    return summary["train_seconds"]


def method_of(run: str) -> str:
    return run.rsplit("-s", 1)[0]


def main(model: str = "shipped") -> None:
    study, methods, plain, sittings = MODELS[model]
    print(f"| sitting | runs | GRPO | adaptive PODS | {plain} | random control | adaptive / GRPO | {plain} / GRPO |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    seen = set()
    for what, log, seeds in sittings:
        runs = runs_in(log, seeds, methods)
        assert not seen & set(runs), f"{what}: a run is in two sittings"
        seen |= set(runs)
        means = [statistics.mean(train_seconds(study, r) for r in runs if method_of(r) == m) for m in methods]
        cells = " | ".join(f"{mean:.0f}" for mean in means)
        print(f"| {what} | {len(runs)} | {cells} | {means[1] / means[0]:.2f} | {means[2] / means[0]:.2f} |")
    every = set(summaries(study))
    assert seen == every, f"runs in no sitting: {sorted(every - seen)}"


if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] not in MODELS):
        sys.exit(f"usage: python sittings.py [{'|'.join(MODELS)}]: which model's study (default: shipped)")
    main(*sys.argv[1:])
