"""Write a generated docs page, or with ``--check`` say in one line that the committed one is out of date."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write_or_check(page: Path, text: str, script: str, argv: list[str]) -> int:
    """Exit status: 0 written (or up to date under ``--check``), 1 out of date under ``--check``."""
    if "--check" in argv:
        if page.read_text(encoding="utf-8") != text:
            print(f"{page.relative_to(ROOT)} is out of date: python docs/_scripts/{script}", file=sys.stderr)
            return 1
        return 0
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text, encoding="utf-8")
    print(f"wrote {page.relative_to(ROOT)}")
    return 0
