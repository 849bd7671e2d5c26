"""One source for each number (#41): the results that README.md and the docs quote are the ones the results files
under benchmarks/results/ hold. Each expected string is formatted here from the JSON (or the run's own log), so a
page that quotes another number, or a results file that changes, fails this test.

What is checked: the default run (accuracy before and after, gain, steps, wall time) on the README and its results
page; the evidence study's interpolated wall-clock and per-update ratios; the adaptive-rollouts tables,
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
    """The README's "How long" and the default run's page quote `make train` with auto (the default) and the previous
    default's quiet and shared-VM runs (the accuracy before and after, the steps, the wall time), each from its own
    summary.json and time.txt; the README's printed lines end with the auto run's own last two."""
    auto, quiet, shared, loaded = (default_run(f) for f in ("make_train_auto", "default_run_quiet",
                                                            "make_train_shared", "default_run"))
    readme = page("README.md").replace("**", "")
    how_long = readme[readme.index("How long:"):][:800]
    for run, folder in ((auto, "make_train_auto"), (quiet, "default_run_quiet"), (shared, "make_train_shared")):
        for quoted in (run["accuracy"], run["steps"], wall_time(folder)):
            assert quoted in how_long, f"README's 'How long' does not say {quoted!r} ({folder}): {how_long}"
    printed = (RESULTS / "tiny_model" / "make_train_auto" / "train.log").read_text().strip().splitlines()
    accuracy, chose = printed[-2:]
    assert accuracy.startswith("held-out accuracy: before") and chose.startswith("auto chose n = "), printed[-2:]
    assert f"{accuracy}\n{chose}" in (ROOT / "README.md").read_text()
    summary = json.loads((RESULTS / "tiny_model" / "make_train_auto" / "summary.json").read_text())
    assert summary["auto"]["line"] == chose
    results = page("docs/results/default-run.md").replace("**", "")
    headline = results[results.index("The embedded default"):][:800]
    for quoted in (auto["accuracy"], auto["steps"], wall_time("make_train_auto"), f"{auto['train_seconds']} s",
                   f"{summary['auto']['n_mean']:.1f} per prompt", f"{100 * summary['auto']['share_at_m']:.0f}%",
                   f"{summary['auto']['at_h200_n_mean']:.1f} of 32"):
        assert quoted in headline, f"default-run.md's headline does not say {quoted!r}: {headline}"
    previous = results[results.index("The previous default"):]
    for quoted in (quiet["accuracy"], quiet["steps"], wall_time("default_run_quiet"), f"{quiet['train_seconds']} s",
                   shared["accuracy"], shared["steps"], wall_time("make_train_shared"),  # the shared VM's run
                   loaded["accuracy"], loaded["steps"]):  # and the loaded run, given beside it
        assert quoted in previous, f"default-run.md does not quote {quoted!r} for the previous default"


def test_the_number_formats_are_what_the_pages_write():
    assert pct(0.50125) == "50.1%" and pct(0.8) == "80.0%"
    assert ratio({"value": 1.5, "ci95": [1.0, 1.5]}) == "1.50x [1.00, 1.50]"
    assert ratio({"value": 1.7335, "ci95": [1.6043, 1.8603]}, x="") == "1.73 [1.60, 1.86]"


# --- the evidence study (#42) ------------------------------------------------------------------------------------


def interpolated(comparison: str, label: str, folder: str = "evidence/shipped") -> str:
    entry = study(folder)["study"]["comparisons_interpolated"][comparison]["labels"][label]
    return ratio({"value": entry["speedup"], "ci95": entry["speedup_ci95"]})


@pytest.mark.parametrize("relative", ["docs/results/evidence-adaptive.md"])
def test_the_evidence_study_is_quoted_from_its_json(relative):
    text = page(relative).replace("**", "")
    for quoted in (interpolated("time/peak", "pods-mv-n32m8-pilot8c"),  # adaptive vs GRPO, wall clock
                   interpolated("time/peak", "pods-mv-n32m8"),  # PODS 32 -> 8, wall clock
                   interpolated("steps/peak", "pods-mv-n32m8")):  # PODS 32 -> 8, per update
        assert quoted in text, f"{relative} does not quote {quoted!r} (evidence/shipped/study.json)"


@pytest.mark.parametrize("relative, labels", [
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
    """A method's time (x="time") or updates (x="steps") to every accuracy level against GRPO, as the docs print it:
    ``< 0.24x`` when its seed-mean misses a level (an upper bound), ``≤`` before a CI end censoring leaves a bound."""
    entry = study(folder)["study"]["methods"][method]["to_levels"][x]
    bounds = entry.get("ci95_upper_bounds") or [False, False]
    low, high = ("≤" * bound + f"{end:.2f}" for end, bound in zip(entry["ci95"], bounds))
    return f"{'< ' * bool(entry.get('censored'))}{entry['ratio']:.2f}x [{low}, {high}]"


PARTS_3_4 = {"evidence/strong-levels": "pods-mv-n64m16-pilot16c", "evidence/shipped-levels": "pods-mv-n32m8-pilot8c"}


@pytest.mark.parametrize("relative", ["README.md", "docs/results/evidence-adaptive.md"])
@pytest.mark.parametrize("folder", sorted(PARTS_3_4))
def test_the_whole_rise_verdicts_are_quoted_from_their_json(relative, folder):
    """The current verdicts (fresh seeds, time to every accuracy level, paired) and their per-update ratios are the
    studies'; the stopping rule the evidence page states (narrower than 0.2) holds for each interval."""
    text = page(relative).replace("**", "")
    for x in ("time", "steps"):
        quoted = levels(PARTS_3_4[folder], x, folder)
        assert quoted in text, f"{relative} does not quote {quoted!r} ({folder}/study.json, {x})"
    low, high = study(folder)["study"]["methods"][PARTS_3_4[folder]]["to_levels"]["time"]["ci95"]
    assert high - low < 0.2 and low < 1 < high
    if relative != "README.md":  # the README gives the verdict; the evidence page, the rule that stopped the study
        assert "narrower than 0.2" in text


@pytest.mark.parametrize("folder", sorted(PARTS_3_4))
def test_the_projection_carries_the_whole_rise_learning_per_update(folder):
    entry = study(folder)["study"]["methods"][PARTS_3_4[folder]]["to_levels"]["steps"]
    text = page("docs/results/projection.md").replace("**", "")
    assert levels(PARTS_3_4[folder], "steps", folder) in text
    assert entry["ratio"] > 1  # (its division by the GPU's step costs: tests/test_docs_gpu_numbers.py)


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
    ("docs/guides/async.md", ["pods steps", "pods time", "adaptive steps", "adaptive time", "pods rows",
                              "adaptive rows"]),
])
def test_the_async_benchmark_is_quoted_from_its_json(relative, keys):
    text = page(relative).replace("**", "")
    quotes = async_quotes()
    for key in keys:
        assert quotes[key] in text, f"{relative} does not quote {quotes[key]!r} ({key}, async/report.json)"


# --- the adaptive-rollouts tables (the earlier, shorter studies) ------------------------------------------------

# (study folder, method label, the row's name in the adaptive-rollouts concept page's tables)
ADAPTIVE_ROWS = [
    ("adaptive_quiet", "pods-mv-n32m8", "PODS 32 -> 8"),
    ("adaptive_quiet", "pods-mv-n32m8-pilot8c", 'adaptive, "mixed" on correctness'),
    ("adaptive_strong", "pods-mv-n64m16", "PODS 64 -> 16"),
    ("adaptive_strong", "pods-mv-n64m16-pilot16c", "adaptive, until_mixed, pilot 16"),
    ("adaptive_strong", "pods-mv-n64m16-pilot32c", "adaptive, until_mixed, pilot 32 (> m)"),
]


@pytest.mark.parametrize("folder, label, name", ADAPTIVE_ROWS)
def test_the_adaptive_tables_are_their_studies_headline(folder, label, name):
    """Each row of the adaptive-rollouts page's tables: learning per update, step-time ratio, wall clock and verdict
    are its study's headline."""
    headline = study(folder)["headline"][label]
    text = (ROOT / "docs/concepts/adaptive.md").read_text()
    start = text.index(f"`benchmarks/results/cpu-2core-amd-epyc/{folder}/`")  # its table is the first after its path
    rows = [line for line in text[start:].split("\n\n|", 1)[1].split("\n\n", 1)[0].splitlines()
            if line.startswith(f" {name} |") or line.startswith(f"| {name} |")]
    assert len(rows) == 1, f"docs/concepts/adaptive.md has {len(rows)} rows named {name!r}"
    cells = [cell.strip() for cell in rows[0].strip(" |").split("|")]
    assert cells[1] == ratio(headline["learning_per_update"]), (name, cells)
    assert cells[3] == ratio(headline["step_time_ratio"], x=""), (name, cells)
    assert cells[4] == ratio(headline["wall_clock_speedup"]), (name, cells)
    assert cells[5] == headline["break_even"]["verdict"], (name, cells)


# --- the current evidence (the README's verdict: tests/test_readme_verdict.py) -----------------------------------

LEVELS = {"strong": ("evidence/strong-levels", "pods-mv-n64m16-pilot16c"),
          "shipped": ("evidence/shipped-levels", "pods-mv-n32m8-pilot8c")}


# --- seeds and updates -------------------------------------------------------------------------------------------

# (page, study folder): the page says "<seeds> seeds x <updates> updates" of that study.
SEEDS_X_UPDATES = [
    ("docs/results/evidence-adaptive.md", "evidence/shipped"),
    ("docs/results/evidence-adaptive.md", "evidence/strong"),
    ("README.md", "evidence/strong-levels"),
    ("docs/results/evidence-adaptive.md", "evidence/strong-levels"),
    ("README.md", "evidence/shipped-levels"),
    ("docs/results/evidence-adaptive.md", "evidence/shipped-levels"),
    ("docs/results/rollout-budgets.md", "budgets/shipped"),
    ("docs/results/index.md", "budgets/shipped"),
    ("docs/results/rollout-budgets.md", "budgets/strong"),
    ("docs/results/index.md", "budgets/strong"),
    ("docs/results/index.md", "budgets/pilot-commit"),
    ("docs/results/rollout-budgets.md", "budgets/pilot-commit-quiet"),
    ("docs/results/index.md", "budgets/pilot-commit-quiet"),
    ("docs/results/rollout-budgets.md", "budgets/reinforce-ada"),
    ("docs/results/index.md", "budgets/reinforce-ada"),
    ("docs/results/rollout-budgets.md", "budgets/strong-followups"),
    ("docs/results/index.md", "budgets/strong-followups"),
    ("docs/results/rollout-budgets.md", "budgets/dapo"),
    ("docs/results/index.md", "budgets/dapo"),
    ("docs/results/rollout-budgets.md", "budgets/dapo-strong"),
    ("docs/results/index.md", "budgets/dapo-strong"),
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
                   "evidence/shipped-levels", "budgets/shipped", "budgets/strong", "budgets/pilot-commit",
                   "budgets/pilot-commit-quiet", "budgets/reinforce-ada", "budgets/strong-followups",
                   "budgets/dapo", "budgets/dapo-strong"):
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
                       "evidence/shipped-levels", "budgets/shipped", "budgets/strong", "budgets/pilot-commit",
                       "budgets/pilot-commit-quiet", "budgets/reinforce-ada", "budgets/strong-followups",
                       "budgets/dapo", "budgets/dapo-strong"}
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


def test_the_results_index_gives_the_async_study_its_seeds_and_steps():
    report = json.loads((RESULTS / "async" / "report.json").read_text())
    (seeds,) = {len(s) for s in report["seeds"].values()}
    row = next(line for line in (ROOT / "docs/results/index.md").read_text().splitlines() if "| `async/` |" in line)
    assert f"{seeds} seeds x {report['settings']['steps']} steps" in row, row


# (page, which verdicts it quotes): the current wall-clock verdicts, to every accuracy level, wherever they are given
# (the site's home gives the README's one-sentence verdict instead: tests/test_readme_verdict.py)
VERDICT_PAGES = [("docs/results/index.md", ("strong", "shipped")),
                 ("docs/concepts/when-pods-pays.md", ("strong", "shipped")),
                 ("docs/concepts/adaptive.md", ("shipped",)),
                 ("docs/results/projection.md", ("strong", "shipped"))]


@pytest.mark.parametrize("relative, models", VERDICT_PAGES)
def test_the_current_verdict_is_quoted_from_its_json_wherever_it_is_given(relative, models):
    text = page(relative).replace("**", "")
    for model in models:
        folder, method = LEVELS[model]
        assert levels(method, "time", folder) in text, (relative, model, levels(method, "time", folder))


def test_when_pods_pays_quotes_its_ranges_from_the_studies():
    """The concept page's summary: the whole-rise learning and step costs of adaptive PODS, and plain PODS's learning
    to GRPO's peak and step costs, each a range over the two models."""
    text = page("docs/concepts/when-pods-pays.md")
    adaptive = [study(f)["study"]["methods"][m] for f, m in LEVELS.values()]
    plain = [("evidence/strong", "pods-mv-n64m16"), ("evidence/shipped", "pods-mv-n32m8")]

    def span(values, x="x"):
        return f"{min(values):.2f}{x}-{max(values):.2f}{x}"

    quoted = [span([a["to_levels"]["steps"]["ratio"] for a in adaptive]), span([a["step_ratio"] for a in adaptive]),
              span([study(f)["study"]["comparisons_interpolated"]["steps/peak"]["labels"][m]["speedup"]
                    for f, m in plain]),
              span([study(f)["study"]["methods"][m]["step_ratio"] for f, m in plain])]
    for phrase in quoted:
        assert phrase in text, f"when-pods-pays.md does not say {phrase!r}"
    assert interpolated("time/peak", "pods-mv-n32m8") in page("docs/concepts/adaptive.md")


# --- the rollout-budgets study (#54) -----------------------------------------------------------------------------

BUDGETS = {"budgets/shipped": ("grpo-n8", ["pods-mv-n16m8-knap12", "pods-mv-n8m8-greso", "pods-mv-n32m8-pilot8c",
                                           "pods-mv-n16m8"]),
           "budgets/strong": ("grpo-n16", ["pods-mv-n32m16-knap24", "pods-mv-n16m16-greso",
                                           "pods-mv-n64m16-pilot16c"]),
           "budgets/pilot-commit": ("grpo-n8", ["pods-mv-n8m8-pc", "pods-mv-n16m8-pc4", "pods-mv-n8m8-pcstay"]),
           "budgets/pilot-commit-quiet": ("grpo-n8", ["pods-mv-n8m8-pcstay"]),
           "budgets/reinforce-ada": ("grpo-n8", ["pods-mv-n32m8-ra", "pods-mv-n32m8-rastd"]),
           "budgets/strong-followups": ("grpo-n16", ["pods-mv-n16m16-pcstay", "pods-mv-n32m16-pc",
                                                     "pods-mv-n64m16-ra"]),
           "budgets/dapo": ("grpo-n8", ["pods-mv-n8m8-dapo"]),
           "budgets/dapo-strong": ("grpo-n16", ["pods-mv-n16m16-dapo"]),
           # C-GRPO, on another VM (a 2-core Intel Xeon) against its own GRPO baseline
           "../cpu-2core-intel-xeon/cgrpo/shipped": ("grpo-n8", ["pods-mv-n32m8-cgrpo"]),
           "../cpu-2core-intel-xeon/cgrpo/strong": ("grpo-n16", ["pods-mv-n32m16-cgrpo"])}


@pytest.mark.parametrize("folder", sorted(BUDGETS))
def test_the_rollout_budgets_page_is_its_study(folder):
    """Each method's row on the results page: wall clock and updates to every level (with the verdict the study
    read), the step-time ratio, rollouts per update against GRPO's and the area difference, all from study.json."""
    baseline, names = BUDGETS[folder]
    methods = study(folder)["study"]["methods"]
    rows = {line for line in (ROOT / "docs/results/rollout-budgets.md").read_text().splitlines()
            if line.startswith("| ")}
    for method in names:
        entry = methods[method]
        time = entry["to_levels"]["time"]
        low, high = entry["step_ratio_ci95"]
        area = entry["area_vs_time"]
        rollouts = entry["rollouts_per_update"]["mean"][0] / methods[baseline]["rollouts_per_update"]["mean"][0]
        cells = [f"{levels(method, 'time', folder)}, {time['verdict']}", levels(method, "steps", folder),
                 f"{entry['step_ratio']:.2f} [{low:.2f}, {high:.2f}]", f"{rollouts:.2f}x",
                 f"{area['difference']:+.3f} [{area['difference_ci95'][0]:+.3f}, {area['difference_ci95'][1]:+.3f}]"]
        # each number in its own column (a cell may go on in words, e.g. how many levels were reached)
        row = [r for r in rows if all(cell.startswith(want) for cell, want in zip(r.split(" | ")[1:], cells))]
        assert len(row) == 1, f"rollout-budgets.md has no single row for {method} ({folder}) with {cells}"
        if time.get("censored"):  # a bound says how many levels it measured
            assert f"{time['levels_reached']} of {len(time['levels'])} levels reached" in row[0], (method, folder)


def test_the_cgrpo_readme_quotes_its_bounds():
    """The C-GRPO study's README gives both models' wall clock to every level as the bounds their study.json holds
    (the seed-mean misses the top levels), never a ratio of 0."""
    text = page("benchmarks/results/cpu-2core-intel-xeon/cgrpo/README.md").replace("**", "")
    for model, method in (("shipped", "pods-mv-n32m8-cgrpo"), ("strong", "pods-mv-n32m16-cgrpo")):
        folder = f"../cpu-2core-intel-xeon/cgrpo/{model}"
        assert study(folder)["study"]["methods"][method]["to_levels"]["time"]["censored"], folder
        assert levels(method, "time", folder) in text, (folder, levels(method, "time", folder))
    assert "0.00x" not in text


# A ratio (x) of 0.00, or an interval from 0.00: what a level never reached used to print (issue #76)
ZERO_RATIO = re.compile(r"(?<![\d.+-])0\.00x|\[0\.00,")


def test_no_page_prints_a_never_reached_level_as_a_zero_ratio():
    """A level a method never reached is a bound (< x, ≤ on a CI end), not a ratio of 0: no page of the site and
    not the README prints 0.00x or an interval starting at 0.00."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for p in pages for m in ZERO_RATIO.finditer(p.read_text("utf-8"))]
    assert not found, "a page prints a zero ratio; quote the censored statistic (pods_rl.curves.format_level_ratio) " \
        f"instead: {found}"


QUOTED = {"docs/concepts/rollout-budgets.md": {"budgets/shipped": ["pods-mv-n16m8-knap12"],
                                               "budgets/strong": ["pods-mv-n32m16-knap24"],
                                               "budgets/pilot-commit-quiet": ["pods-mv-n8m8-pcstay"],
                                               "budgets/reinforce-ada": ["pods-mv-n32m8-ra"],
                                               "budgets/strong-followups": ["pods-mv-n16m16-pcstay",
                                                                            "pods-mv-n32m16-pc",
                                                                            "pods-mv-n64m16-ra"],
                                               "budgets/dapo": ["pods-mv-n8m8-dapo"],
                                               "budgets/dapo-strong": ["pods-mv-n16m16-dapo"]},
          "docs/results/rollout-budgets.md": {folder: names for folder, (_, names) in BUDGETS.items()}}


@pytest.mark.parametrize("relative", sorted(QUOTED))
def test_the_rollout_budgets_wall_clock_is_quoted_from_its_json(relative):
    """The concept page quotes each follow-up's wall clock, the results page every method's; no method is faster:
    the pages say so, and would have to change."""
    text = page(relative).replace("**", "")
    for folder, methods in QUOTED[relative].items():
        for method in methods:
            quoted = levels(method, "time", folder)
            assert quoted in text, f"{relative} does not quote {quoted!r} ({method}, {folder}/study.json)"
    for folder, (_, names) in BUDGETS.items():
        verdicts = {m: study(folder)["study"]["methods"][m]["to_levels"]["time"]["verdict"] for m in names}
        assert "faster" not in verdicts.values(), f"the pages say no method is faster in wall clock ({folder})"


# --- the auto study (issue #67; another VM: a 2-core Intel Xeon) ----------------------------------------------------

AUTO = {"../cpu-2core-intel-xeon/auto/shipped": ("grpo-n8", "pods-mv-n16m8", "pods-mv-n32m8-auto"),
        "../cpu-2core-intel-xeon/auto/strong": ("grpo-n16", "pods-mv-n32m16", "pods-mv-n64m16-auto")}


@pytest.mark.parametrize("folder", sorted(AUTO))
def test_the_auto_study_is_quoted_from_its_json(folder):
    """The study's README table (seeds, rollouts, learning per update, wall clock of auto and fixed PODS) and the
    concepts page's wall-clock numbers are its study.json's; the study's verdicts are the ones the pages give."""
    data, (_, fixed, auto) = study(folder), AUTO[folder]
    seeds = data["plan"]["seeds"]
    readme = page("benchmarks/results/cpu-2core-intel-xeon/auto/README.md").replace("**", "")
    rollouts = data["study"]["methods"][auto]["rollouts_per_update"]
    auto_cells = [f"| {seeds} |", ratio({"value": rollouts["ratio_to_baseline"], "ci95": rollouts["ci95"]}),
                  levels(auto, "steps", folder), levels(auto, "time", folder)]
    fixed_rollouts = data["study"]["methods"][fixed]["rollouts_per_update"]["ratio_to_baseline"]
    fixed_cells = [f"| {seeds} |", f"{fixed_rollouts:.2f}x", levels(fixed, "steps", folder),
                   levels(fixed, "time", folder)]
    for cells in (auto_cells, fixed_cells):
        row = " | ".join(cells[1:])
        assert f"{cells[0]} {row} |" in readme, f"the auto study's README has no row {cells} ({folder})"
    concepts = page("docs/concepts/auto-n.md").replace("**", "")
    assert levels(auto, "time", folder) in concepts and levels(fixed, "time", folder) in concepts, folder
    verdict = data["study"]["methods"][auto]["to_levels"]["time"]["verdict"]
    assert verdict == ("undecided" if folder.endswith("shipped") else "slower"), (folder, verdict)


# --- auto at m against GRPO in interleaved turns (benchmarks/bench_auto_at_m.py) ---------------------------------

def at_m_quotes(name: str) -> dict[str, str]:
    """The strings the pages quote from one ``bench_auto_at_m`` JSON: each ratio's mean [95% CI] (4 places), the CPU
    auto adds (ms, 2 places) and its share of GRPO's step."""
    data = json.loads((RESULTS / name).read_text())
    report = data["report"]

    def interval(numbers: dict, spec: str) -> str:
        return f"{numbers['mean']:{spec}} [{numbers['ci'][0]:{spec}}, {numbers['ci'][1]:{spec}}]"

    added = report["auto"]["added_ms"]
    return {"auto": interval(report["auto"]["ratio"], ".4f"), "control": interval(report["control"]["ratio"], ".4f"),
            "added": interval(added, ".2f").replace(" [", " ms [", 1),
            "share": f"{100 * added['mean'] / data['grpo_step_cpu_ms']:.2f}%"}


@pytest.mark.parametrize("name", ["bench_auto_at_m_permuted_builds.json", "bench_auto_at_m_rotating.json",
                                  "bench_auto_at_m_shipped.json"])
def test_auto_at_m_is_quoted_from_its_json(name):
    text = page("docs/concepts/auto-n.md")
    for key, quote in at_m_quotes(name).items():
        assert quote in text, f"docs/concepts/auto-n.md does not quote {quote!r} ({key}, {name})"
