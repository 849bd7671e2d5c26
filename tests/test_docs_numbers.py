"""One source for each number (#41): the results that README.md and the docs quote are the ones the results files
under benchmarks/results/ hold. Each expected string is formatted here from the JSON (or the run's own log), so a
page that quotes another number, or a results file that changes, fails this test.

What is checked: the default run (accuracy before and after, gain, steps, wall time) on the README and its results
page; the evidence study's interpolated wall-clock and per-update ratios; the README's adaptive-rollouts table,
row by row; the seeds and updates each page gives a study, and the results index's seeds for each study folder.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc"
README = ROOT / "README.md"


def page(relative: str) -> str:
    """A page's text with its line breaks and repeated spaces folded, so that a phrase may wrap."""
    return re.sub(r"\s+", " ", (ROOT / relative).read_text(encoding="utf-8"))


@cache
def study(folder: str) -> dict:
    return json.loads((RESULTS / folder / "study.json").read_text())


def seeds_and_updates(folder: str) -> tuple[int, int]:
    """(seeds per method, updates per run) of a study: `pods study`'s plan, or for the older script's studies its
    methods' seed counts and the baseline's last evaluated update."""
    data = study(folder)
    if data.get("plan"):
        return data["plan"]["seeds"], data["plan"]["updates"]
    seeds = {method["seeds"] for method in data["study"]["methods"].values()}
    assert len(seeds) == 1, (folder, seeds)
    labels = data["study"]["comparisons"]["steps/peak"]["labels"]
    return seeds.pop(), int(max(label["last_step"] for label in labels.values()))


def pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def ratio(entry: dict, x: str = "x") -> str:
    """``1.50x [1.00, 1.50]`` from ``{"value": ..., "ci95": [lo, hi]}``."""
    low, high = entry["ci95"]
    return f"{entry['value']:.2f}{x} [{low:.2f}, {high:.2f}]"


# --- the default run ---------------------------------------------------------------------------------------------


def default_run(folder: str) -> dict:
    summary = json.loads((RESULTS / "tiny_model" / folder / "summary.json").read_text())
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    gain = round(100 * after, 1) - round(100 * before, 1)
    return {"accuracy": f"{pct(before)} -> {pct(after)} (+{gain:.1f} points)", "steps": f"{summary['steps']} steps",
            "train_seconds": summary["train_seconds"]}


def wall_time(folder: str) -> str:
    """``5 min 21 s`` from `/usr/bin/time -v`'s ``Elapsed (wall clock) time (h:mm:ss or m:ss): 5:21.42``."""
    text = (RESULTS / "tiny_model" / folder / "time.txt").read_text()
    minutes, seconds = re.search(r"Elapsed \(wall clock\).*?: (\d+):(\d+(?:\.\d+)?)", text).groups()
    return f"{int(minutes)} min {int(float(seconds))} s"


def test_the_default_run_is_quoted_from_its_summary():
    quiet, loaded = default_run("default_run_quiet"), default_run("default_run")
    readme = page("README.md").replace("**", "")
    bullet = readme[readme.index("The default run (`pods train`"):][:400]
    for quoted in (quiet["accuracy"], quiet["steps"], wall_time("default_run_quiet")):
        assert quoted in bullet, f"README's default run does not say {quoted!r}: {bullet}"
    results = page("docs/results/default-run.md").replace("**", "")
    headline = results[results.index("The embedded default"):][:600]
    for quoted in (quiet["accuracy"], quiet["steps"], wall_time("default_run_quiet"), f"{quiet['train_seconds']} s"):
        assert quoted in headline, f"default-run.md's headline does not say {quoted!r}: {headline}"
    for quoted in (loaded["accuracy"], loaded["steps"]):  # the loaded run, given beside it
        assert quoted in results, f"default-run.md does not quote the loaded run's {quoted!r}"


def test_the_number_formats_are_what_the_pages_write():
    assert pct(0.50125) == "50.1%" and pct(0.8) == "80.0%"
    assert ratio({"value": 1.5, "ci95": [1.0, 1.5]}) == "1.50x [1.00, 1.50]"
    assert ratio({"value": 1.7335, "ci95": [1.6043, 1.8603]}, x="") == "1.73 [1.60, 1.86]"


# --- the evidence study (#42) ------------------------------------------------------------------------------------


def interpolated(comparison: str, label: str, folder: str = "evidence/shipped") -> str:
    entry = study(folder)["study"]["comparisons_interpolated"][comparison]["labels"][label]
    return ratio({"value": entry["speedup"], "ci95": entry["speedup_ci95"]})


@pytest.mark.parametrize("relative", ["README.md", "docs/results/evidence-adaptive.md"])
def test_the_evidence_study_is_quoted_from_its_json(relative):
    text = page(relative).replace("**", "")
    for quoted in (interpolated("time/peak", "pods-mv-n32m8-pilot8c"),  # adaptive vs GRPO, wall clock
                   interpolated("time/peak", "pods-mv-n32m8"),  # PODS 32 -> 8, wall clock
                   interpolated("steps/peak", "pods-mv-n32m8")):  # PODS 32 -> 8, per update
        assert quoted in text, f"{relative} does not quote {quoted!r} (evidence/shipped/study.json)"


@pytest.mark.parametrize("relative, labels", [
    ("README.md", {"time/peak": ["pods-mv-n64m16-pilot16c"]}),
    ("docs/results/evidence-adaptive.md", {"time/peak": ["pods-mv-n64m16-pilot16c", "pods-mv-n64m16"],
                                           "steps/peak": ["pods-mv-n64m16-pilot16c", "pods-mv-n64m16"]}),
    ("docs/results/projection.md", {"steps/peak": ["pods-mv-n64m16-pilot16c", "pods-mv-n64m16"]}),
])
def test_the_strong_models_study_is_quoted_from_its_json(relative, labels):
    text = page(relative).replace("**", "")
    for comparison, methods in labels.items():
        for method in methods:
            quoted = interpolated(comparison, method, "evidence/strong")
            assert quoted in text, f"{relative} does not quote {quoted!r} ({method}, evidence/strong/study.json)"


def levels(method: str, x: str = "time", folder: str = "evidence/strong-levels") -> str:
    """A method's time (x="time") or updates (x="steps") to every accuracy level against GRPO, as the docs print it."""
    entry = study(folder)["study"]["methods"][method]["to_levels"][x]
    return ratio({"value": entry["ratio"], "ci95": entry["ci95"]})


PARTS_3_4 = {"evidence/strong-levels": "pods-mv-n64m16-pilot16c", "evidence/shipped-levels": "pods-mv-n32m8-pilot8c"}


@pytest.mark.parametrize("relative", ["README.md", "docs/results/evidence-adaptive.md"])
@pytest.mark.parametrize("folder", sorted(PARTS_3_4))
def test_parts_3_and_4_are_quoted_from_their_json(relative, folder):
    """The verdicts of parts 3-4 (fresh seeds, time to every accuracy level, paired) and their per-update ratios
    are the studies'; the stopping rule the pages state (narrower than 0.2) holds for each interval."""
    text = page(relative).replace("**", "")
    for x in ("time", "steps"):
        quoted = levels(PARTS_3_4[folder], x, folder)
        assert quoted in text, f"{relative} does not quote {quoted!r} ({folder}/study.json, {x})"
    low, high = study(folder)["study"]["methods"][PARTS_3_4[folder]]["to_levels"]["time"]["ci95"]
    assert high - low < 0.2 and low < 1 < high and "narrower than 0.2" in text


@pytest.mark.parametrize("folder", sorted(PARTS_3_4))
def test_the_projection_carries_the_whole_rise_learning_per_update(folder):
    entry = study(folder)["study"]["methods"][PARTS_3_4[folder]]["to_levels"]["steps"]
    text = page("docs/results/projection.md").replace("**", "")
    assert levels(PARTS_3_4[folder], "steps", folder) in text
    for r in (7.9 / 7.6, 10.1 / 7.6):  # the paper's 32 -> 16 and 64 -> 16 step-time ratios
        quoted = ratio({"value": entry["ratio"] / r, "ci95": [c / r for c in entry["ci95"]]})
        assert quoted in text, f"projection.md does not quote {quoted!r} ({folder}'s learning per update / {r:.2f})"


# --- the asynchronous benchmark (#40) --------------------------------------------------------------------------


def async_quotes() -> dict[str, str]:
    """The asynchronous benchmark's headline ratios (report.json), as the docs print them."""
    report = json.loads((RESULTS / "async" / "report.json").read_text())
    quotes = {}
    for method in ("pods", "adaptive"):
        label = report["labels"][method]
        for x in ("steps", "time"):
            entry = report["accuracy"][f"to_grpo_peak_{x}"]["labels"][label]
            quotes[f"{method} {x}"] = ratio({"value": entry["speedup"], "ci95": entry["speedup_ci95"]})
        rows = report["throughput"][method]["rows_per_second"]
        quotes[f"{method} rows"] = ratio({"value": rows["ratio_to_grpo"], "ci95": rows["ratio_to_grpo_ci95"]})
    return quotes


@pytest.mark.parametrize("relative, keys", [
    ("README.md", ["pods steps", "pods time"]),
    ("docs/guides/async.md", ["pods steps", "pods time", "adaptive steps", "adaptive time", "pods rows",
                              "adaptive rows"]),
])
def test_the_async_benchmark_is_quoted_from_its_json(relative, keys):
    text = page(relative).replace("**", "")
    quotes = async_quotes()
    for key in keys:
        assert quotes[key] in text, f"{relative} does not quote {quotes[key]!r} ({key}, async/report.json)"


# --- the adaptive-rollouts table ---------------------------------------------------------------------------------

# (study folder, method label, the row's name in the README's table)
ADAPTIVE_ROWS = [
    ("adaptive_quiet", "pods-mv-n32m8", "PODS 32 -> 8"),
    ("adaptive_quiet", "pods-mv-n32m8-pilot8c", "adaptive PODS"),
    ("adaptive_strong", "pods-mv-n64m16", "PODS 64 -> 16"),
    ("adaptive_strong", "pods-mv-n64m16-pilot16c", "adaptive PODS"),
    ("adaptive_strong", "pods-mv-n64m16-pilot32c", "adaptive, pilot 32 > m (run after the others)"),
]


@pytest.mark.parametrize("folder, label, name", ADAPTIVE_ROWS)
def test_the_readme_adaptive_table_is_its_studies_headline(folder, label, name):
    headline = study(folder)["headline"][label]
    cells = [name, ratio(headline["learning_per_update"]), f"{headline['rollouts_per_update']['mean'][0]:.0f}",
             ratio(headline["step_time_ratio"], x=""),
             f"{ratio(headline['wall_clock_speedup'])} ({headline['break_even']['verdict']})"]
    row = "| " + " | ".join(cells) + " |"
    assert row in README.read_text(encoding="utf-8"), f"README's adaptive table has no row {row!r} ({folder})"


# --- seeds and updates -------------------------------------------------------------------------------------------

# (page, study folder): the page says "<seeds> seeds x <updates> updates" of that study.
SEEDS_X_UPDATES = [
    ("README.md", "adaptive_quiet"),
    ("README.md", "study600"),
    ("README.md", "evidence/shipped"),
    ("docs/results/evidence-adaptive.md", "evidence/shipped"),
    ("README.md", "evidence/strong"),
    ("docs/results/evidence-adaptive.md", "evidence/strong"),
    ("README.md", "evidence/strong-levels"),
    ("docs/results/evidence-adaptive.md", "evidence/strong-levels"),
    ("README.md", "evidence/shipped-levels"),
    ("docs/results/evidence-adaptive.md", "evidence/shipped-levels"),
]


@pytest.mark.parametrize("relative, folder", SEEDS_X_UPDATES)
def test_seeds_and_updates_are_the_studys(relative, folder):
    seeds, updates = seeds_and_updates(folder)
    assert f"{seeds} seeds x {updates} updates" in page(relative), (relative, folder, seeds, updates)


def test_the_results_index_gives_each_study_its_seeds():
    """Each row of the results index that names a study folder gives it that study's seeds, wherever it says
    ``N seeds`` or ``--seeds N`` (and every study has such a row)."""
    rows = [line for line in (ROOT / "docs/results/index.md").read_text().splitlines() if line.startswith("| ")]
    checked = set()
    for folder in ("adaptive", "adaptive_quiet", "adaptive_strong", "study600", "study", "study_strong",
                   "study_cli", "evidence", "evidence/strong", "evidence/strong-levels",
                   "evidence/shipped-levels"):
        json_folder = "evidence/shipped" if folder == "evidence" else folder
        seeds, _ = seeds_and_updates(json_folder)
        for row in rows:
            if f"`{folder}/`" not in row.split("|")[4]:
                continue
            said = {int(n) for n in re.findall(r"(\d+) seeds\b", row) + re.findall(r"--seeds (\d+)", row)}
            if not said:
                continue  # a row that only refers to the study (the projection)
            assert said == {seeds}, f"results index, {folder}/: says {sorted(said)} seeds, study.json has {seeds}"
            checked.add(folder)
    assert checked == {"adaptive", "adaptive_quiet", "adaptive_strong", "study600", "study", "study_strong",
                       "study_cli", "evidence", "evidence/strong", "evidence/strong-levels",
                       "evidence/shipped-levels"}
    options = study("study")["options"]["methods"]
    row = next(row for row in rows if "`study/options/`" in row)
    assert {int(n) for n in re.findall(r"--seeds (\d+)", row)} == {m["seeds"] for m in options.values()}


def test_the_adaptive_concept_page_gives_the_quiet_study_its_seeds():
    seeds, _ = seeds_and_updates("adaptive_quiet")
    assert f"On a quiet machine, {seeds} seeds" in page("docs/concepts/adaptive.md").replace("**", "")


# --- the break-even chart ----------------------------------------------------------------------------------------


def test_the_break_even_chart_is_drawn_from_the_results(tmp_path):
    """The chart on When PODS pays is committed, shown, and drawn by its script from the studies' JSON."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plot_break_even", ROOT / "benchmarks" / "plot_break_even.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    points = script.points()
    assert len(points) == sum(len(methods) for _, _, methods in script.STUDIES)
    evidence = next(p for p in points if p["folder"] == "evidence/shipped" and p["method"] == "PODS 32->8")
    assert ratio(dict(zip(("value", "ci95"), (evidence["learning"][0], evidence["learning"][1:])))) == \
        interpolated("steps/peak", "pods-mv-n32m8")
    assert script.OUT.is_file() and script.OUT.stat().st_size > 10_000
    assert "](../results/img/break_even.png)" in page("docs/concepts/when-pods-pays.md")
    assert script.draw(tmp_path / "chart.png").stat().st_size > 10_000
