"""Print pyproject.toml's `docs` extra, the pinned doc tools, one requirement a line.

`make docs` installs these into .venv-docs rather than `-e ".[docs]"`: the extra would bring pods-rl's own
dependencies, torch among them, which the site does not need (the API reference is read statically). Python 3.10+
with no third-party package: tomllib where it exists (3.11+), else the `docs = [...]` list read as a literal.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def docs_requirements(pyproject: Path) -> list[str]:
    """The requirements of ``[project.optional-dependencies] docs`` in ``pyproject``."""
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:  # Python 3.10: the list is a plain literal (a `]` inside a string is followed by more text)
        match = re.search(r"^docs\s*=\s*(\[.*?\])\s*$", text, flags=re.M | re.S)
        if match is None:
            sys.exit(f"{pyproject} has no `docs = [...]` extra: add the doc tools there")
        return list(ast.literal_eval(match.group(1)))
    return list(tomllib.loads(text)["project"]["optional-dependencies"]["docs"])


if __name__ == "__main__":
    print("\n".join(docs_requirements(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
