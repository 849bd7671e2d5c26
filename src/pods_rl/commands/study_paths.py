"""Paths as a study records them: relative, so that its files name no folder of the machine that ran it.

`pods study` writes its command, its plan, its runs' commands and the report's run folders into files that are
filed with the results (``commands.jsonl``, ``plan.json``, ``study_run.json``, ``study.json``). A path under the
folder the study ran from (the checkout, where the study scripts start) is recorded relative to that folder, a run
folder in ``study.json`` relative to the study's folder: the same study run from another clone writes the same text."""

from __future__ import annotations

import os
import re


def portable(value, base: str | os.PathLike | None = None):
    """``value`` (JSON-like: str, list, tuple, dict) with every absolute path under ``base`` (default: the current
    folder) written relative to it: ``base/a/b`` -> ``a/b``, ``base`` itself -> ``.``. Paths inside longer strings
    (a command line, ``--flag=base/x``) are rewritten too; paths outside ``base`` are kept as they are."""
    base = os.path.abspath(base if base is not None else os.getcwd()).rstrip(os.sep)
    if not base:  # the root folder: every path is under it, and none is made shorter by leaving it out
        return value
    # the base where a path starts (not inside a longer path or a word), followed by a separator or the path's end
    pattern = re.compile(r"(?<![\w./~-])" + re.escape(base) + r"(?:" + re.escape(os.sep) + r"|(?![\w./-]))")

    def rewrite(text: str) -> str:
        return pattern.sub(lambda m: "" if m.group(0).endswith(os.sep) else ".", text)

    if isinstance(value, (str, os.PathLike)):
        return rewrite(os.fspath(value))
    if isinstance(value, dict):
        return {key: portable(item, base) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(portable(item, base) for item in value)
    return value
