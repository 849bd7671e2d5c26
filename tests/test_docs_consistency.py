"""One statement per fact across the README and the docs (#63): what sampling a rollout costs against training on
one, where the shipped model starts (each number with its evaluation set), which versions each results page ran,
no machine nobody measured on, and the project environment named wherever a page runs Python."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ROLLOUT_COST = "sampling a rollout costs about half as much as training on one"


def text(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8")).replace("**", "")


def cost_ratios(folders) -> list[float]:
    """Generation ms per sampled rollout / update ms per kept rollout, each row of the studies' `pods cost`."""
    return [row["generation_ms_per_sampled_rollout"] / row["update_ms_per_kept_rollout"]
            for folder in folders for row in json.loads((RESULTS / folder / "cost.json").read_text())["rows"]]


def test_one_wording_for_what_a_rollout_costs():
    """`pods cost` at the evidence studies' settings: sampling costs 0.39-0.53 of training, per rollout, which
    every page words the same way; no page says "about as much"."""
    ratios = cost_ratios(["evidence/shipped", "evidence/strong", "evidence/shipped-levels", "evidence/strong-levels"])
    span = f"{min(ratios):.2f}-{max(ratios):.2f}"
    assert 0.35 < min(ratios) and max(ratios) < 0.6, span
    for path in PAGES:
        said = text(path)
        for wrong in ("about as much to sample as to train", "costs about as much as training on one",
                      "about half as much as an updated one"):
            assert wrong not in said, f"{path.relative_to(ROOT)} says {wrong!r}: {ROLLOUT_COST}"
    for relative in ("docs/concepts/when-pods-pays.md", "docs/results/micro-benchmarks.md"):
        assert ROLLOUT_COST in text(ROOT / relative) and span in text(ROOT / relative), (relative, span)
    for relative in ("docs/concepts/adaptive.md", "docs/results/evidence-adaptive.md", "docs/results/index.md",
                     "docs/results/projection.md"):
        assert ROLLOUT_COST in text(ROOT / relative), relative


def test_the_starting_accuracy_names_its_evaluation_set():
    """The shipped model's start on each evaluation set, from the build's scan, `pods train`'s summaries and the
    studies' JSON (400 problems x 4 samples, the shipped model)."""
    scan = json.loads((RESULTS / "tiny_model" / "scan.json").read_text())
    shipped = [b["build_info"] for b in scan["builds"] if b["build_info"].get("sft", {}).get("steps") == 4000
               and b["build_info"].get("num_heads") == 2]
    build = {f"{100 * b['held_out_accuracy']['sampled_t1']['accuracy']:.1f}%" for b in shipped}
    trains = {f"{100 * json.loads((RESULTS / 'tiny_model' / f / 'summary.json').read_text())['accuracy_before']:.1f}%"
              for f in ("default_run_quiet", "make_train_shared", "default_run")}
    starts = []
    for path in RESULTS.rglob("study.json"):
        data = json.loads(path.read_text())
        plan = data.get("plan") or {}
        if (plan.get("eval_problems"), plan.get("eval_k")) == (400, 4) and not any(
                "model_name_or_path" in arg for arg in plan.get("recipe_argv") or []):
            starts += [m["start_accuracy"][0] for m in data["study"]["methods"].values() if m.get("start_accuracy")]
    page = text(ROOT / "docs/results/default-run.md")
    assert len(build) == 1 and len(trains) == 1, (build, trains)
    assert f"{build.pop()} on `pods build-tiny`'s 200 problems x 4 samples" in page
    assert f"{trains.pop()} on `pods train`'s 200 x 4" in page
    studies = f"{100 * min(starts):.1f}-{100 * max(starts):.1f}% on the studies' 400 x 4"
    assert studies in page and studies in text(ROOT / "docs/results/index.md")
    get_started = text(ROOT / "docs/get-started.md")
    assert "200 held-out problems x 4 samples" in get_started


def test_no_machine_nobody_measured_on():
    for path in PAGES:
        assert "laptop" not in text(path).lower(), path.relative_to(ROOT)


def transformers_of(paths) -> set[str]:
    found = set()
    for path in paths:
        found |= {".".join(v.split(".")[:2]) for v in re.findall(r'"transformers": "([^"]+)"', path.read_text())}
    return found


# (results page, the JSON its numbers come from)
VERSION_PAGES = [
    ("docs/results/vllm-cpu.md", sorted((RESULTS / "generation").glob("*.json"))),
    ("docs/results/micro-benchmarks.md", [RESULTS / "bench_phases.json", RESULTS / "bench_downsample.json"]),
    ("docs/results/options.md", [RESULTS / "study" / "study.json"]),
    ("docs/results/evidence-adaptive.md", [RESULTS / f / "study.json" for f in
                                           ("evidence/shipped", "evidence/strong", "evidence/shipped-levels",
                                            "evidence/strong-levels")]),
    ("docs/results/rollout-budgets.md", sorted((RESULTS / "budgets").glob("*/study.json"))),
]


@pytest.mark.parametrize("relative, sources", VERSION_PAGES, ids=[p for p, _ in VERSION_PAGES])
def test_each_results_page_gives_the_transformers_its_json_ran(relative, sources):
    header = next(line for line in (ROOT / relative).read_text().splitlines() if line.startswith("> **Machine:**"))
    said = set(re.findall(r"transformers (\d+\.\d+)", header))
    assert said == transformers_of(sources), (relative, said, transformers_of(sources))


def test_the_results_index_gives_every_transformers_the_results_ran():
    every = transformers_of(RESULTS.rglob("*.json"))
    intro = (ROOT / "docs/results/index.md").read_text().split("\n\n")[1]
    assert set(re.findall(r"\b(5\.\d+)\b", intro)) == every, (every, intro)


# Pages that run pods or Python in the project's environment (verl and asynchronous GRPO make their own).
RUNS_PYTHON = ["docs/get-started.md", "docs/guides/eval-plot.md", "docs/guides/multi-gpu.md", "docs/guides/study.md",
               "docs/guides/trl.md", "docs/guides/vllm.md", "docs/guides/writing-a-rule.md",
               "docs/guides/writing-a-task.md", "docs/guides/stopping.md", "docs/concepts/adaptive.md",
               "docs/concepts/pods.md", "docs/concepts/rollout-budgets.md", "README.md"]


@pytest.mark.parametrize("relative", RUNS_PYTHON)
def test_pages_that_run_python_say_to_activate_the_environment(relative):
    assert ". .venv/bin/activate" in text(ROOT / relative), relative


def test_the_short_run_and_the_defaults_speed_are_in_the_readme():
    readme = text(ROOT / "README.md")
    assert 'make train ARGS="--max_train_seconds 60"' in readme
    study = json.loads((RESULTS / "budgets" / "shipped" / "study.json").read_text())
    time = study["study"]["methods"]["pods-mv-n16m8"]["to_levels"]["time"]
    quoted = f"{time['ratio']:.2f}x [{time['ci95'][0]:.2f}, {time['ci95'][1]:.2f}]"
    assert f"PODS 16 -> 8 is the one PODS setting measured slower than GRPO on this CPU, {quoted}" in readme
    assert "reward_weights=" in readme[readme.index("## From a GRPOTrainer script"):readme.index("## Two commands")]


def test_when_pods_pays_says_why_its_columns_do_not_divide():
    """The page explains that learning / step cost misses the measured wall clock, with the numbers of the study."""
    data = json.loads((RESULTS / "evidence" / "strong-levels" / "study.json").read_text())
    method = data["study"]["methods"]["pods-mv-n64m16-pilot16c"]
    learning, cost = method["to_levels"]["steps"]["ratio"], method["step_ratio"]
    wall = method["to_levels"]["time"]["ratio"]
    page = text(ROOT / "docs/concepts/when-pods-pays.md")
    assert f"{learning:.2f} / {cost:.2f} = {learning / cost:.2f} understates the measured {wall:.2f}x" in page
