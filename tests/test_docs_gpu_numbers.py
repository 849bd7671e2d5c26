"""The GPU numbers the docs quote are the ones the GPU results folders hold (the same rule as
tests/test_docs_numbers.py for the CPU's): each phrase below is formatted here from a JSON under
benchmarks/results/<gpu>/, and every page that quotes a GPU number must contain it as written, so a page that
quotes another number, or a results file that changes, fails this test.

To check another page (the README's verdict, say), add it to ``PAGES`` with the names of the phrases it quotes.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from tests.test_docs_numbers import ratio, study

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "gpu-nvidia-h200"
RUNS = {"grpo": "grpo-n16", "pods": "pods-mv-n64m16", "adaptive": "pods-mv-n64m16-pilot16"}


def load(relative: str) -> dict:
    return json.loads((H200 / relative).read_text())


def page(relative: str) -> str:
    """A page's text with line breaks and repeated spaces folded (a phrase may wrap) and bold marks dropped."""
    return re.sub(r"\s+", " ", (ROOT / relative).read_text(encoding="utf-8")).replace("**", "")


@cache
def phrases() -> dict[str, str]:
    """Every GPU phrase the docs quote, by name, formatted from the H200's JSON."""
    out = {}
    answer, again = load("answer.json"), load("reestimate.json")
    runs = {key: answer[f"train_{name}"] for key, name in RUNS.items()}
    grpo_step = runs["grpo"]["seconds_per_update"]["step"]
    for key, run in runs.items():  # the 40-s training runs, bf16, the shipped model
        step = run["seconds_per_update"]["step"]
        out[f"run_{key}"] = f"{run['updates']} updates, {step:.3f} s per update"
        out[f"run_{key}_accuracy"] = f"{run['accuracy_before']:.3f} -> {run['accuracy_after']:.3f}"
        if key != "grpo":
            out[f"run_{key}_ratio"] = f"{step / grpo_step:.2f}x"
            entry = again["runs"][RUNS[key]]["ratio"]
            out[f"run_{key}_median_ratio"] = f"{entry['value']:.2f}x [{entry['low']:.2f}, {entry['high']:.2f}]"
    cost = {f"{r['n']}{'k' if r.get('pilot_generations') else ''}": r for r in load("cost_shipped.json")["rows"]}
    out["old_cost"] = (f"{cost['64']['step_ratio']:.2f}x GRPO's step, adaptive 64 -> 16 at "
                       f"{cost['64k']['step_ratio']:.2f}x, adaptive 32 -> 16 at {cost['32k']['step_ratio']:.2f}x")
    minima = again["cost_shipped"]
    out["old_cost_minima"] = (f"{minima['32 -> 16']['ratio_of_minima']:.2f}x (32 -> 16), "
                              f"{minima['64 -> 16']['ratio_of_minima']:.2f}x (64 -> 16), "
                              f"{minima['64 -> 16 k16']['ratio_of_minima']:.2f}x (adaptive 64 -> 16)")
    model = load("cost-0.4b/build_info.json")
    out["big_model"] = f"{model['num_parameters'] / 1e9:.2f}B parameters (hidden {model['hidden_size']}, " \
                       f"{model['num_layers']} layers)"
    for name in ("sequential", "interleaved"):
        data = load(f"cost-0.4b/cost_n64_{name}.json")
        grpo, pods = data["rows"]
        assert (grpo["n"], pods["n"], pods["m"]) == (16, 64, 16)
        # `pods cost` as it was on that day: the mean of the steps, named with the number
        out[f"big_{name}"] = f"{pods['step_ratio']:.2f}x (the mean of {data['settings']['steps']} steps, {name})"
        out[f"big_{name}_generation"] = f"{100 * pods['seconds']['generation'] / pods['seconds']['step']:.0f}%"
        if name == "interleaved":
            out["big_per_rollout"] = (f"{grpo['generation_ms_per_sampled_rollout']:.1f} ms at n = 16, "
                                      f"{pods['generation_ms_per_sampled_rollout']:.1f} ms at n = 64")
    big = sorted(load(f"cost-0.4b/cost_n64_{name}.json")["rows"][1]["step_ratio"] for name in ("sequential",
                                                                                             "interleaved"))
    out["big_range"] = f"cost {big[0]:.2f}-{big[1]:.2f}x a GRPO step (the means of 4 and 2 steps"
    rows = load("selection/bench_downsample.json")["results"]
    steady = [r for r in rows if (r["B"], r["n"]) != (64, 16)]  # the first case, B = 64, n = 16, stated apart
    out["selection"] = (f"{min(r['max_variance_s'] for r in steady) * 1e6:.0f}-"
                        f"{max(r['max_variance_s'] for r in steady) * 1e6:.0f} us per call")
    first = next(r for r in rows if (r["B"], r["n"]) == (64, 16))
    out["selection_first"] = f"{first['max_variance_s'] * 1e6:.0f} us in the first case measured (B = 64, n = 16)"
    out["median_pair"] = (f"median steps give {again['runs'][RUNS['pods']]['ratio']['value']:.2f}x and "
                          f"{again['runs'][RUNS['adaptive']]['ratio']['value']:.2f}x")
    strong = study("evidence/strong")["study"]["methods"]["pods-mv-n64m16"]
    out["cpu_same_step"] = (f"the same PODS 64 -> 16 step cost "
                            f"{ratio({'value': strong['step_ratio'], 'ci95': strong['step_ratio_ci95']})} GRPO's "
                            "(mean step")
    out["selection_sort"] = (f"{min(r['sort_s'] for r in rows) * 1e6:.0f}-{max(r['sort_s'] for r in rows) * 1e6:.0f}"
                             f" us for a bare torch.sort: {min(r['ratio_to_sort'] for r in rows):.1f}-"
                             f"{max(r['ratio_to_sort'] for r in rows):.1f}x")
    return out


# (page, the phrases it quotes)
PAGES = [
    ("docs/guides/gpu.md", ["run_grpo", "run_pods", "run_adaptive", "run_pods_ratio", "run_adaptive_ratio",
                            "run_grpo_accuracy", "run_pods_accuracy", "run_adaptive_accuracy",
                            "run_pods_median_ratio", "run_adaptive_median_ratio", "big_model", "big_sequential",
                            "big_interleaved", "big_interleaved_generation", "big_per_rollout", "old_cost",
                            "old_cost_minima", "selection", "selection_first", "selection_sort",
                            "cpu_same_step"]),
    ("docs/results/index.md", ["run_pods_ratio", "run_adaptive_ratio", "big_sequential", "big_interleaved",
                               "big_model"]),
    ("docs/results/projection.md", ["run_pods_ratio", "big_sequential", "big_interleaved", "median_pair"]),
    ("docs/concepts/when-pods-pays.md", ["big_range"]),
]


@pytest.mark.parametrize("relative, names", PAGES)
def test_the_gpu_numbers_are_quoted_from_their_json(relative, names):
    text, quoted = page(relative), phrases()
    missing = [f"{name}: {quoted[name]!r}" for name in names if quoted[name] not in text]
    assert not missing, f"{relative} does not quote, as the JSON gives them: {missing}"


def test_the_phrases_are_what_the_results_say():
    """A check of the formatter itself against the H200's README (written from the same files by hand)."""
    quoted = phrases()
    assert quoted["run_pods_ratio"] == "1.10x" and quoted["run_adaptive_ratio"] == "1.56x"
    assert quoted["big_sequential"].startswith("1.04x") and quoted["big_interleaved"].startswith("0.94x")
    assert quoted["selection_sort"].endswith("17.7-23.2x")
    assert quoted["selection_first"].startswith("1250 us") and quoted["median_pair"].endswith("1.10x and 1.65x")


# The projection page's rows: (study folder, method, kind of sampling: "adaptive" or "pods", statistic)
PROJECTION_ROWS = [
    ("evidence/strong-levels", "pods-mv-n64m16-pilot16c", "adaptive", "levels"),
    ("evidence/shipped-levels", "pods-mv-n32m8-pilot8c", "adaptive", "levels"),
    ("evidence/shipped", "pods-mv-n32m8-pilot8c", "adaptive", "peak"),
    ("evidence/shipped", "pods-mv-n32m8", "pods", "peak"),
    ("evidence/shipped", "pods-random-n32m8-pilot8c", "adaptive", "peak"),
    ("evidence/strong", "pods-mv-n64m16-pilot16c", "adaptive", "peak"),
    ("evidence/strong", "pods-mv-n64m16", "pods", "peak"),
    ("evidence/strong", "pods-random-n64m16-pilot16c", "adaptive", "peak"),
]


def h200_step_cost(kind: str) -> float:
    """The H200's step-time ratio to GRPO n = 16 of the 40-s runs: plain PODS 64 -> 16 or adaptive PODS."""
    runs = {key: load("answer.json")[f"train_{name}"]["seconds_per_update"]["step"] for key, name in RUNS.items()}
    return runs[kind] / runs["grpo"]


@pytest.mark.parametrize("folder, method, kind, statistic", PROJECTION_ROWS)
def test_the_projection_divides_the_learning_by_the_h200_step_cost(folder, method, kind, statistic):
    """Each row of docs/results/projection.md: the learning per update (CPU studies) / the one step cost the H200
    measured for that kind of sampling, written in the row beside it."""
    text, r = page("docs/results/projection.md"), h200_step_cost(kind)
    if statistic == "levels":
        entry = study(folder)["study"]["methods"][method]["to_levels"]["steps"]
        value, ci = entry["ratio"], entry["ci95"]
    else:
        entry = study(folder)["study"]["comparisons_interpolated"]["steps/peak"]["labels"][method]
        value, ci = entry["speedup"], entry["speedup_ci95"]
    learning = ratio({"value": value, "ci95": ci})
    projected = ratio({"value": value / r, "ci95": [c / r for c in ci]})
    row = f"{learning} | {r:.2f} | {projected}"
    assert row in text, f"projection.md has no row with {row!r} ({folder}, {method})"
