"""MkDocs hook: in a table cell, a path in code breaks after a ``/`` (or a ``_``), not in the middle of a name.

Material lets inline code break anywhere (``word-break: break-word``), so a narrow column of the results index cut
``benchmarks/results/cpu-2core-amd-epyc/`` mid-word. This hook puts a ``<wbr>`` (a break opportunity, invisible,
copied as nothing) after each ``/`` of the code in ``<td>`` cells, and marks the code that is a path (no space, a
``/``) with the class ``pods-path``, which docs/stylesheets/extra.css stops from breaking anywhere else; a path also
may break after a ``_`` (``run_budgets_pilot_commit_quiet.sh`` alone widened the results index past the page).
Other code (a command) keeps Material's breaking, so a table of long commands still fits the page.
"""

from __future__ import annotations

import re

PATH_CLASS = "pods-path"
CELL = re.compile(r"(<td\b[^>]*>)(.*?)(</td>)", re.S)
CODE = re.compile(r"<code>(.*?)</code>", re.S)


def break_code(text: str) -> str:
    """One code element's text (HTML-escaped: no tags of its own) -> the element, a ``<wbr>`` after each ``/``; a
    path (a ``/`` and no space) gets the class that keeps it whole between its breaks, and a ``<wbr>`` after each
    ``_`` too."""
    if "/" not in text:
        return f"<code>{text}</code>"
    if re.search(r"\s", text):
        return "<code>" + text.replace("/", "/<wbr>") + "</code>"
    return f'<code class="{PATH_CLASS}">' + re.sub(r"([/_])", r"\1<wbr>", text) + "</code>"


def break_paths(html: str) -> str:
    """Every table cell's code with a break opportunity after each ``/``; the rest of the page as it was."""
    return CELL.sub(lambda cell: cell.group(1) + CODE.sub(lambda code: break_code(code.group(1)), cell.group(2))
                    + cell.group(3), html)


def on_page_content(html, page, config, files):
    return break_paths(html)
