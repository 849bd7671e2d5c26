"""pytest-markdown-docs, told which code blocks of the docs not to run, by a comment the reader never sees.

pytest-markdown-docs (``pytest --markdown-docs FILE.md``) runs every ```python block of a Markdown file as a test,
and reads options from the block's info string: ``notest`` (do not run it), ``continuation`` (run it in the
namespace of the block before). Words after the language in an info string break the page on the site
(pymdownx.superfences takes ```python notest for no code block at all), so the docs put them in an HTML comment on
the line above the block, which GitHub and the site both hide:

    <!-- docs-test: notest (a CUDA GPU: bf16 and vLLM; downloads a model from the hub) -->
    ```python
    ...
    ```

A ``notest`` block must give its reason in parentheses; ``tests/test_docs_snippets.py`` compiles it and checks its
imports instead. This module is the plugin (``-p tests.markdown_docs_plugin``): it hands pytest-markdown-docs a
Markdown parser that moves each comment's options into the info string of the block below it, and runs each
block against pods-rl's registries (rules, adaptive rules, tasks) as a fresh interpreter has them: a page's
`register_rule("my_rule", ...)` is not refused because another page registered the same name first.
"""

from __future__ import annotations

import re
import sys

import pytest

# <!-- docs-test: OPTION [OPTION ...] [(reason)] -->
MARK = re.compile(r"<!--\s*docs-test:\s*(?P<options>[\w\s-]*?)\s*(?:\((?P<reason>[^)]*)\))?\s*-->")
OPTIONS = frozenset({"notest", "continuation"})


def _move_marks_into_fences(state) -> None:
    """markdown-it core rule: a ``docs-test`` comment's options join the info string of the fence right after it,
    and its reason goes into the fence's ``meta``."""
    tokens = state.tokens
    for comment, fence in zip(tokens, tokens[1:]):
        if comment.type != "html_block" or fence.type != "fence":
            continue
        match = MARK.fullmatch(comment.content.strip())
        if match:
            fence.info = f"{fence.info} {match['options']}".strip()
            fence.meta = {**(fence.meta or {}), "docs_test_reason": (match["reason"] or "").strip()}


def markdown_parser():
    """The CommonMark parser pytest-markdown-docs uses by default, plus the ``docs-test`` comments."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark")
    parser.core.ruler.push("docs_test_marks", _move_marks_into_fences)
    return parser


@pytest.hookimpl(tryfirst=True)
def pytest_markdown_docs_markdown_it():
    return markdown_parser()


@pytest.fixture(autouse=True)
def _fresh_registries():
    """Snapshot the module-level dicts, sets and lists of every loaded ``pods_rl`` module (the registries), and put
    them back after the block, in place. Each page's snippets are written for a fresh interpreter."""
    import pods_rl  # noqa: F401  (loaded before the first block, so that its registries are snapshotted too)

    saved = []
    for name, module in list(sys.modules.items()):
        if name == "pods_rl" or name.startswith("pods_rl."):
            for value in vars(module).values():
                # dict subclasses included: pods_rl.registry.Registry, the registries' own class, is one
                if isinstance(value, (dict, set, list)):
                    kind = dict if isinstance(value, dict) else set if isinstance(value, set) else list
                    saved.append((value, kind, kind(value)))
    yield
    for container, kind, copy in saved:
        if kind is list:
            container[:] = copy
        else:  # the base class's own clear/update: a registry's register() checks are for new entries, not these
            kind.clear(container)
            kind.update(container, copy)
