"""The README's verdict ("Is PODS faster than GRPO?") stays one sentence and one short table that its JSON backs.

The section is held to at most 12 ratio estimates and 350 words, so the next study goes to the results pages and
not into the README; every number in its table, and each figure its prose gives, is formatted here from the
results files (the CPU studies' study.json, the H200's answer.json and pods cost JSON). The sentence is the same on
the site's home and the results index, and what it says is checked against every study's wall-clock intervals.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_docs_numbers import LEVELS, levels, ratio, study

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "gpu-nvidia-h200"
MAX_WORDS, MAX_RATIOS = 350, 12
# A ratio estimate: a number with its "x" or "times" ("0.97x", "1.7-2 times"); its bracketed interval is part of it.
RATIO = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:x\b| times\b)")


def section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Is PODS faster than GRPO?")
    return text[start:text.index("\n## ", start + 1)]


def words(markdown: str) -> list[str]:
    """Every whitespace-separated token, the table's included: what a reader's eye passes over."""
    return markdown.split()


def table_rows() -> dict[tuple[str, str], list[str]]:
    """{(method, machine and model): cells} of the verdict's table, bold marks dropped."""
    rows = {}
    for line in section().splitlines():
        if line.startswith("| ") and not line.startswith("| method") and not line.startswith("| ---"):
            cells = [cell.strip().replace("**", "") for cell in line.strip("|").split("|")]
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def test_the_verdict_is_short():
    section_words, ratios = words(section()), RATIO.findall(section())
    assert len(section_words) <= MAX_WORDS, f"the verdict has {len(section_words)} words (at most {MAX_WORDS}): " \
                                            "move detail to docs/results/"
    assert len(ratios) <= MAX_RATIOS, f"the verdict quotes {len(ratios)} ratios (at most {MAX_RATIOS}): {ratios}"


def test_the_limits_see_what_they_count():
    assert RATIO.findall("0.97x [0.88, 1.07] and 1.7-2 times, not 300 updates") == ["0.97x", "1.7-2 times"]
    assert len(words("| a | b -> c |\n| 1.10x | — |")) == 12


# (method, machine, model and evaluation set, study folder, method label): the CPU rows, read at every level
CPU_ROWS = [("adaptive 64->16", "2-core CPU, strong tiny, 500 x 8", *LEVELS["strong"]),
            ("adaptive 32->8", "2-core CPU, shipped tiny, 400 x 4", *LEVELS["shipped"])]


@pytest.mark.parametrize("name, machine, folder, method", CPU_ROWS)
def test_each_cpu_row_is_its_study(name, machine, folder, method):
    """The step cost (a ratio of mean steps, as `pods study` computes it), the learning and wall clock to every
    level, and the evaluation set the study used, in the row."""
    entry = study(folder)["study"]["methods"][method]
    step = ratio({"value": entry["step_ratio"], "ci95": entry["step_ratio_ci95"]})
    assert table_rows()[(name, machine)] == [step, levels(method, "steps", folder), levels(method, "time", folder)]
    plan = study(folder)["plan"]
    assert machine.endswith(f", {plan['eval_problems']} x {plan['eval_k']}")
    assert "2-core" in machine and "AMD EPYC" in study(folder)["machine"]["cpu_model"]


def test_the_auto_row_is_its_study():
    """auto's row (its second version's wall-clock study, #74, on another VM: a 2-core Intel Xeon) is its study's
    numbers, seeds and set."""
    folder, method = "../cpu-2core-intel-xeon/auto_v2/strong/measured2", "pods-mv-n64m16-auto"
    data = study(folder)
    entry = data["study"]["methods"][method]
    step = ratio({"value": entry["step_ratio"], "ci95": entry["step_ratio_ci95"]})
    plan = data["plan"]
    row = table_rows()[(f"[auto](docs/concepts/auto-n.md), {plan['seeds']} seeds",
                        f"2-core Xeon CPU, strong tiny, {plan['eval_problems']} x {plan['eval_k']}")]
    assert row == [step, levels(method, "steps", folder), levels(method, "time", folder)]
    assert "Xeon" in data["machine"]["cpu_model"] and data["machine"]["logical_cores"] == 2


def h200_mean_step_ratio(run: str) -> float:
    """A 40-s training run's mean logged step over GRPO's (answer.json's `seconds_per_update.step`)."""
    answer = json.loads((H200 / "answer.json").read_text())
    return answer[f"train_{run}"]["seconds_per_update"]["step"] / answer["train_grpo-n16"]["seconds_per_update"]["step"]


def projected() -> list[float]:
    """The projection page's whole-rise rows: each CPU study's learning per update / the H200's adaptive step cost."""
    r = round(h200_mean_step_ratio("pods-mv-n64m16-pilot16"), 2)
    return sorted(study(f)["study"]["methods"][m]["to_levels"]["steps"]["ratio"] / r for f, m in LEVELS.values())


def test_each_gpu_row_is_the_h200s():
    """The H200's rows: adaptive PODS's mean-step ratio of the 40-s runs with the projection beside it, and the 0.4B
    model's `pods cost` ratios (the means of 4 interleaved and 2 sequential steps, both given). Nothing else is
    measured on a GPU (not measured)."""
    answer = json.loads((H200 / "answer.json").read_text())
    config = (H200 / "runs" / "pods-mv-n64m16-pilot16" / "config.yaml").read_text()
    assert "eval_num_problems: 400" in config and "eval_k: 4" in config
    big = [json.loads((H200 / "cost-0.4b" / f"cost_n64_{name}.json").read_text())
           for name in ("interleaved", "sequential")]
    for data in big:
        grpo, pods = data["rows"]
        assert (grpo["n"], pods["n"], pods["m"]) == (16, 64, 16)
    assert [data["settings"]["steps"] for data in big] == [4, 2]
    costs = sorted(data["rows"][1]["step_ratio"] for data in big)
    low, high = projected()
    rows = table_rows()
    assert rows[("adaptive 64->16", "one H200, shipped tiny, 400 x 4")] == [
        f"{h200_mean_step_ratio('pods-mv-n64m16-pilot16'):.2f}x", "not measured", f"projected {low:.2f}-{high:.2f}x"]
    assert rows[("PODS 64->16", "one H200, 0.4B random init, none")] == [
        f"{costs[0]:.2f}-{costs[1]:.2f}x", "not measured", "not measured"]
    assert answer["train_pods-mv-n64m16-pilot16"]["bf16"] is True
    text = " ".join(section().split())
    assert "4 and 2 `pods cost` steps on the 0.4B model" in text
    # the projection spelled out: a division by the H200's step cost, its statistic named
    assert (f"the CPU rows' learning per update over its mean-step cost, "
            f"{h200_mean_step_ratio('pods-mv-n64m16-pilot16'):.2f}") in text
    assert "mean-step cost, PODS / GRPO" in text  # the statistic, named


def test_the_table_reads_one_way():
    """Each column's header gives its direction (the step cost is a cost: above 1, dearer; the others above 1 favour
    PODS); the projected cell says so; no cell is left blank."""
    text = " ".join(section().split()).replace("**", "")
    header = next(line for line in section().splitlines() if line.startswith("| method"))
    assert [cell.strip() for cell in header.strip("|").split("|")][2:] == [
        "mean-step cost, PODS / GRPO (>1: dearer)", "learning per update (>1: more)",
        "wall-clock speed-up (>1: faster)"]
    assert "geometric mean over levels" in text and "from 20% to 90% of GRPO's gain" in text
    assert "Projected, not measured" in text
    for cells in table_rows().values():
        assert all(cell and cell != "—" for cell in cells), cells


def test_the_prose_is_the_studies():
    """What the prose says of the CPU (what a rollout costs) and of its studies."""
    text = " ".join(section().split()).replace("**", "")
    cost = json.loads((ROOT / "benchmarks/results/cpu-2core-amd-epyc/cost/cost_default.json").read_text())["rows"][0]
    assert 0.4 < cost["generation_ms_per_sampled_rollout"] / cost["update_ms_per_kept_rollout"] < 0.6
    assert "sampling a rollout costs about half as much as training on one" in text
    seeds, updates = study(LEVELS["strong"][0])["plan"]["seeds"], study(LEVELS["strong"][0])["plan"]["updates"]
    assert f"{seeds} seeds x {updates} updates per method" in text
    for stale in ("under way", "is level", "at least 1.7x", "the columns do not divide"):
        assert stale not in text, stale
    assert "has never run here" in text or "have never run here" in text  # the paper's recipe, and vLLM on CUDA


def _wall_clock_intervals():
    """Every wall-clock speed-up interval the CPU studies hold: to every level, and to GRPO's peak (interpolated)."""
    out = []
    for path in (ROOT / "benchmarks" / "results").rglob("study.json"):
        data = json.loads(path.read_text())
        for name, method in data["study"]["methods"].items():
            time = (method.get("to_levels") or {}).get("time")
            if time and time.get("ci95"):
                out.append((path, name, time["ci95"]))
        for key, comparison in (data["study"].get("comparisons_interpolated") or {}).items():
            if key.startswith("time/"):
                out += [(path, name, e["speedup_ci95"]) for name, e in comparison["labels"].items()
                        if e.get("speedup_ci95")]
    return out


VERDICT = ("Not shown yet: on a 2-core CPU no PODS setting was measured faster than GRPO in wall clock (adaptive "
           "PODS's intervals include 1; some settings were slower), and on a GPU only step costs were measured, "
           "from which, on one H200, adaptive PODS is projected slower and plain PODS faster (to GRPO's peak only).")


def plain(relative: str) -> str:
    """A page's text, folded, with bold marks dropped and links reduced to their text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", (ROOT / relative).read_text(encoding="utf-8"))
    return " ".join(text.split()).replace("**", "")


@pytest.mark.parametrize("relative", ["README.md", "docs/index.md", "docs/results/index.md"])
def test_one_verdict_on_every_page_that_gives_one(relative):
    """The README, the site's home and the results index answer in the same sentence."""
    assert VERDICT in plain(relative).replace("GRPO? Not shown", "Not shown").replace(
        "so far. Not shown", "Not shown"), relative


def test_the_verdict_is_what_the_results_hold():
    """No CPU study measured a PODS setting faster in wall clock (no interval above 1), some slower (intervals below
    1), adaptive PODS's two verdict intervals include 1, no GPU folder holds a study (no wall clock), the projection
    for adaptive PODS on the H200 is below 1 and plain PODS's, to GRPO's peak, above."""
    intervals = _wall_clock_intervals()
    assert intervals and not [i for i in intervals if i[2][0] > 1], [i for i in intervals if i[2][0] > 1]
    assert [i for i in intervals if i[2][1] < 1]
    for folder, method in LEVELS.values():
        low, high = study(folder)["study"]["methods"][method]["to_levels"]["time"]["ci95"]
        assert low < 1 < high
    assert not list(H200.rglob("study.json"))
    assert max(projected()) < 1
    # plain PODS projected faster to GRPO's peak: each study's learning to the peak over the H200's PODS step cost
    r = h200_mean_step_ratio("pods-mv-n64m16")
    for folder, method in (("evidence/shipped", "pods-mv-n32m8"), ("evidence/strong", "pods-mv-n64m16")):
        assert study(folder)["study"]["comparisons_interpolated"]["steps/peak"]["labels"][method]["speedup"] / r > 1


# The settings docs/results/index.md names as measured slower: (study folder, method, statistic)
SLOWER = [("budgets/shipped", "pods-mv-n16m8", "levels"), ("budgets/strong-followups", "pods-mv-n32m16-pc", "levels"),
          ("budgets/reinforce-ada", "pods-mv-n32m8-ra", "levels"), ("budgets/strong-followups", "pods-mv-n64m16-ra",
                                                                   "levels"),
          ("budgets/dapo", "pods-mv-n8m8-dapo", "levels"), ("budgets/dapo-strong", "pods-mv-n16m16-dapo", "levels"),
          ("evidence/strong", "pods-random-n64m16-pilot16c", "peak")]


@pytest.mark.parametrize("folder, method, statistic", SLOWER)
def test_the_settings_named_slower_were_measured_slower(folder, method, statistic):
    data = study(folder)["study"]
    if statistic == "levels":
        high = data["methods"][method]["to_levels"]["time"]["ci95"][1]
    else:
        high = data["comparisons_interpolated"]["time/peak"]["labels"][method]["speedup_ci95"][1]
    assert high < 1, (folder, method, high)


def test_the_results_index_gives_the_projection():
    low, high = projected()
    assert f"projects it at {low:.2f}-{high:.2f}x GRPO's speed" in plain("docs/results/index.md")
