"""Every `pods SUB --flag` the docs show is a flag of `pods SUB` (#41): README.md and docs/**/*.md, in code blocks
and inline code, including `make train ARGS="--flag ..."` (which runs `pods train`). The help texts come from the
commands' own parsers, in this process (`pods SUB --help` through the dispatcher, stdout captured)."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

from pods_rl.commands import cli
from pods_rl.commands.study_plan import STUDY_FLAGS
from tests.test_cli_help import flag_texts

ROOT = Path(__file__).resolve().parent.parent
SUBS = tuple(cli.COMMANDS)
# `pods SUB`, `pods --flag` (train, the default sub-command) and `python -m pods_rl.commands.cli SUB`: at the start
# of a command (never the end of a path such as gsm8k/pods).
COMMAND = re.compile(r"(?:(?:^|(?<=[\s($;&|`\"']))pods|pods_rl\.commands\.cli)\s+(" + "|".join(map(re.escape, SUBS))
                     + r"|--[\w-]+)(?![\w-])")
MAKE_TRAIN = re.compile(r"\bmake\s+train\s+ARGS=(\"[^\"]*\"|'[^']*')")
NOT_TRAIN = ("--help", "--version")  # `pods --help`, `pods --version`: the dispatcher's own
PASS_ON_TO_TRAIN = ("cost", "study")  # any other flag of theirs is a `pods train` flag (the recipe)


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def code_snippets(text: str):
    """(line, code) for each line of a fenced code block (``\\``-continued lines joined) and each inline code span
    of the prose (spans that wrap across lines joined)."""
    lines, in_block, prose, block_line = text.split("\n"), False, [], None
    pending = ""
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            prose.append("")
            continue
        if in_block:
            pending, block_line = pending + line.rstrip("\\") + " ", block_line or number
            if not line.rstrip().endswith("\\"):
                yield block_line, pending
                pending, block_line = "", None
            prose.append("")
        else:
            prose.append(line)
    joined = "\n".join(prose)
    for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
        yield joined.count("\n", 0, span.start()) + 1, span.group(1).replace("\n", " ")


def commands_in(code: str):
    """(sub-command, [flags]) for each `pods` command in a line of code."""
    for match in COMMAND.finditer(code):
        sub, rest = match.group(1), code[match.end(1):]
        if sub.startswith("-"):
            if sub in NOT_TRAIN:
                continue
            sub, rest = "train", sub + rest
        rest = re.split(r"\s#|&&|\|\||[;|)]|\$\(", rest)[0]  # the command ends at a comment or shell operator
        try:
            words = shlex.split(rest)
        except ValueError:  # an unbalanced quote inside inline code
            words = rest.split()
        yield sub, [w.split("=")[0] for w in words if re.match(r"--?[A-Za-z]", w)]
    for match in MAKE_TRAIN.finditer(code):
        yield "train", [w.split("=")[0] for w in shlex.split(match.group(1)[1:-1]) if w.startswith("-")]


def doc_flags() -> list[tuple[str, str, str]]:
    """(where, sub-command, flag) for every flag of a `pods` command the docs show."""
    found = []
    for path in doc_files():
        for line, code in code_snippets(path.read_text(encoding="utf-8")):
            for sub, flags in commands_in(code):
                found += [(f"{path.relative_to(ROOT)}:{line}", sub, flag) for flag in flags]
    return found


@functools.cache
def help_text(sub: str) -> str:
    """`pods SUB --help`, run through the dispatcher in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.main([sub, "--help"])
    return out.getvalue()


@functools.cache
def options(sub: str) -> frozenset[str]:
    """The option strings `pods SUB --help` lists."""
    return frozenset(flag_texts(help_text(sub)))


def accepted(sub: str, flag: str) -> bool:
    """Whether `pods SUB` takes ``flag``: its own, or for cost and study a `pods train` flag they pass on (not one
    the study sets for each run and refuses)."""
    if flag in options(sub) or flag in ("-h", "--help", "--debug"):
        return True
    if sub == "study" and flag.replace("-", "_") in {f.replace("-", "_") for f in STUDY_FLAGS}:
        return False
    return sub in PASS_ON_TO_TRAIN and flag in options("train")


def test_the_scan_finds_the_commands_of_each_kind_of_snippet():
    assert list(commands_in("pods cost --config gsm8k/pods --n 16,64  # a comment --not")) == [
        ("cost", ["--config", "--n"])]
    assert list(commands_in("accelerate launch --config_file $(pods accelerate-config zero2) -m "
                            "pods_rl.commands.cli train --config gsm8k/pods --bf16 true")) == [
        ("accelerate-config", []), ("train", ["--config", "--bf16"])]
    assert list(commands_in('make train ARGS="--max_train_seconds 60 --seed=1"')) == [
        ("train", ["--max_train_seconds", "--seed"])]
    assert list(commands_in("ls recipes/gsm8k/pods --all; pods --config tiny")) == [("train", ["--config"])]
    text = "prose `pods build-tiny --steps 3\n--threads 2` more\n```bash\npods study --seeds 2 \\\n  --out st\n```\n"
    assert list(code_snippets(text)) == [(4, "pods study --seeds 2    --out st "),
                                         (1, "pods build-tiny --steps 3 --threads 2")]


def test_the_docs_show_flags_of_every_kind():
    subs = {sub for _, sub, _ in doc_flags()}
    assert {"train", "cost", "study", "eval", "verl-args", "build-tiny", "compare"} <= subs, subs
    assert len(doc_flags()) > 100


def test_every_flag_the_docs_show_is_one_the_command_takes():
    wrong = [f"{where}: pods {sub} {flag}" for where, sub, flag in doc_flags() if not accepted(sub, flag)]
    assert not wrong, "flags the docs show that `pods SUB --help` does not list:\n" + "\n".join(wrong)


@pytest.mark.parametrize("sub, flag, ok", [
    ("study", "--seed", False),  # set by the study for each run: refused
    ("study", "--learning_rate", True),  # a `pods train` flag, passed on to the recipe
    ("eval", "--learning_rate", False),  # eval passes nothing on
    ("cost", "--no_such_flag", False),
    ("train", "--config", True),
])
def test_accepted_tells_flags_apart(sub, flag, ok):
    assert accepted(sub, flag) is ok
