"""docs/troubleshooting.md quotes the one-line errors as pods-rl raises them (#63): every message's fixed text is in
the code that raises it, and the ones that are cheap to raise are raised here and matched whole against the page."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
PLACEHOLDER = re.compile(r"<[^<>]*?>")
PREFIXES = ("ImportError: ", "ValueError: ", "pods train: error: ")


def messages() -> dict[str, str]:
    """{heading: message} for each quoted error (a plain ``` block) on the page; a section with two messages gives
    ``heading`` and ``heading (2)``."""
    found, heading, block, fence = {}, None, None, None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if fence is not None:  # inside a fenced block
            if line.strip() == "```":
                if fence == "":  # a plain block: a message
                    message = " ".join(" ".join(block).split())
                    for prefix in PREFIXES:
                        message = message.removeprefix(prefix)
                    found[heading if heading not in found else f"{heading} (2)"] = message
                fence = None
            else:
                block.append(line)
        elif line.startswith("```"):
            fence, block = line[3:].strip(), []
        elif line.startswith("### "):
            heading = line[4:].strip()
    return found


@cache
def literals() -> tuple[str, ...]:
    """Every string literal of pods-rl's source and the docs' build scripts. In an f-string, a field naming one of
    its module's string constants (``{DATA_FILE}``) becomes that string, any other field NUL, so that fixed text
    never matches across one."""
    out = []
    for path in [*(ROOT / "src" / "pods_rl").rglob("*.py"), *(ROOT / "docs" / "_scripts").glob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {node.targets[0].id: node.value.value for node in tree.body
                     if isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)
                     and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}

        def text(value, constants=constants) -> str:
            if isinstance(value, ast.Constant):
                return value.value
            if isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) and value.conversion == -1:
                return constants.get(value.value.id, "\0")
            return "\0"

        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                out.append("".join(text(v) for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
    return tuple(out)


def pattern(message: str) -> re.Pattern:
    """The page's message as a regex: fixed text literal, each ``<...>`` anything."""
    parts = PLACEHOLDER.split(message)
    return re.compile(".+?".join(re.escape(part) for part in parts) + r"\Z", flags=re.S)


def test_the_page_quotes_the_errors_and_is_in_the_site():
    found = messages()
    assert len(found) >= 15, sorted(found)
    assert "troubleshooting.md" in (ROOT / "mkdocs.yml").read_text()


@pytest.mark.parametrize("heading", sorted(messages()))
def test_each_message_is_the_codes(heading):
    message = messages()[heading]
    if message.startswith("ModuleNotFoundError"):
        return  # Python's own
    if heading in RAISED:
        return  # matched whole against what the code raises, below
    chunks = [part.strip(" ;:,.()") for part in PLACEHOLDER.split(message)]
    chunks = [chunk for chunk in chunks if len(chunk) >= 8]
    assert chunks, message
    for chunk in chunks:
        pieces = [piece for piece in re.split(r"\s*\(\s*|\s*\)\s*|; ", chunk) if len(piece) >= 8] or [chunk]
        for piece in pieces:  # fixed text may be cut by a field the page writes as text ("(m=<m>)", a clause)
            assert any(piece in literal for literal in literals()), f"{heading}: {piece!r} is in no string of the code"


# The messages raised here (their text is partly a dict's lookup, which the static check cannot read).
RAISED = {"An unknown rule or task"}


def raised(call) -> str:
    try:
        call()
    except Exception as err:  # noqa: BLE001
        return str(err)
    raise AssertionError(f"{call} raised nothing")


def test_the_cheap_ones_are_raised_as_the_page_quotes_them():
    from pods_rl.engines.trl.config import PODSConfig, require_supported_trl
    from pods_rl.models import remote_code_refusal
    from pods_rl.tasks import get_task
    from pods_rl.tasks.base import row_too_long

    def config(**kwargs):
        return PODSConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, report_to="none", **kwargs)

    found = messages()
    cases = {
        "A TRL outside the supported range": lambda: require_supported_trl("0.1.0"),
        "m larger than n": lambda: config(num_generations=8, downsample_to=16, per_device_train_batch_size=16),
        "A batch that splits a group": lambda: config(num_generations=16, downsample_to=8,
                                                      per_device_train_batch_size=12),
        "An unknown rule or task": lambda: config(num_generations=16, downsample_to=8, per_device_train_batch_size=16,
                                                  downsample_rule="max_varianse"),
        "An unknown rule or task (2)": lambda: get_task("arithmetc"),
        "A model with its own code": lambda: (_ for _ in ()).throw(
            remote_code_refusal("./m", " (modeling_x.py, named by auto_map in its config.json)")),
        "A data row that is too long": lambda: (_ for _ in ()).throw(
            ValueError(row_too_long("data/t.jsonl:3", 524288))),
    }
    for heading, call in cases.items():
        message = raised(call)
        assert pattern(found[heading]).match(message), f"{heading}: the code says {message!r}"
