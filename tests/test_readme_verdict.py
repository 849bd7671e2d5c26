"""The README's verdict ("Is PODS faster than GRPO?") stays one short table that its JSON backs.

The section is held to at most 12 ratio estimates and 350 words, so the next study goes to the results pages and
not into the README; every number in its table, and each figure its prose gives, is formatted here from the
results files (the CPU studies' study.json, the H200's reestimate.json and pods cost JSON).
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


# (method, machine and model, study folder, method label): the CPU rows, read at every accuracy level
CPU_ROWS = [("adaptive 64->16", "2-core CPU, strong tiny", *LEVELS["strong"]),
            ("adaptive 32->8", "2-core CPU, shipped tiny", *LEVELS["shipped"])]


@pytest.mark.parametrize("name, machine, folder, method", CPU_ROWS)
def test_each_cpu_row_is_its_study(name, machine, folder, method):
    entry = study(folder)["study"]["methods"][method]
    step = ratio({"value": entry["step_ratio"], "ci95": entry["step_ratio_ci95"]})
    assert table_rows()[(name, machine)] == [step, levels(method, "steps", folder), levels(method, "time", folder)]
    assert "2-core" in machine and "AMD EPYC" in study(folder)["machine"]["cpu_model"]


def test_each_gpu_row_is_the_h200s():
    """The shipped model's rows: the median-step ratios of the 40-s training runs (pods cost's estimator over their
    logged steps); the 0.4B row: pods cost's interleaved steps. Nothing else is measured on a GPU yet (—)."""
    runs = json.loads((H200 / "reestimate.json").read_text())["runs"]
    big = json.loads((H200 / "cost-0.4b" / "cost_n64_interleaved.json").read_text())
    grpo, pods = big["rows"]
    assert (grpo["n"], pods["n"], pods["m"], big["settings"]["steps"]) == (16, 64, 16, 4)
    expected = {("PODS 64->16", "H200, shipped tiny"): runs["pods-mv-n64m16"]["ratio"]["value"],
                ("adaptive 64->16", "H200, shipped tiny"):
                    runs["pods-mv-n64m16-pilot16"]["ratio"]["value"],
                ("PODS 64->16", "H200, 0.4B random init"): pods["step_ratio"]}
    rows = table_rows()
    for key, value in expected.items():
        assert rows[key] == [f"{value:.2f}x", "—", "—"], (key, rows.get(key))
    assert "4 steps of `pods cost` (0.4B, 128-token completions)" in " ".join(section().split())


def test_the_prose_is_the_studies():
    """What the prose says of the CPU (what a rollout costs, how many adaptive PODS samples) and of the models."""
    text = " ".join(section().split()).replace("**", "")
    rollouts = sorted(study(f)["headline"][m]["rollouts_per_update"]["ratio_to_baseline"] for f, m in LEVELS.values())
    assert f"samples {rollouts[0]:.1f}-{rollouts[1]:.0f} times GRPO's rollouts" in text
    cost = json.loads((ROOT / "benchmarks/results/cpu-2core-amd-epyc/cost/cost_default.json").read_text())["rows"][0]
    assert 0.4 < cost["generation_ms_per_sampled_rollout"] / cost["update_ms_per_kept_rollout"] < 0.6
    assert "sampling a rollout there costs about half as much as training on one" in text
    starts = {key: study(folder)["study"]["methods"][method]["start_accuracy"][0]
              for key, (folder, method) in LEVELS.items()}
    assert f"{round(100 * starts['shipped'])}% at the start on the studies' evaluation" in text
    assert f"built to start at {round(100 * starts['strong'])}%" in text
    seeds, updates = study(LEVELS["strong"][0])["plan"]["seeds"], study(LEVELS["strong"][0])["plan"]["updates"]
    assert f"{seeds} seeds x {updates} updates per method" in text
