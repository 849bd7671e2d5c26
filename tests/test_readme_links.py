"""The README's relative links point to files of the repository (they are read on GitHub and in the sdist's
long description, outside the documentation site, whose own links `mkdocs build --strict` checks)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
# Markdown links and images: ](target) or ](target "title").
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?")


def relative_links(text: str) -> list[str]:
    """Link targets in Markdown ``text`` that are paths in the repository (no scheme, no bare anchor)."""
    return [target.split("#", 1)[0] for target in LINK.findall(text)
            if "://" not in target and not target.startswith(("#", "mailto:"))]


def test_relative_links_are_found():
    text = "[a](docs/a.md) [b](https://x.org/b) ![c](img/c.png \"t\") [d](#anchor) [e](docs/e.md#part)"
    assert relative_links(text) == ["docs/a.md", "img/c.png", "docs/e.md"]


def test_readme_links_point_to_files_that_exist():
    links = relative_links(README.read_text(encoding="utf-8"))
    assert "docs/get-started.md" in links
    broken = [link for link in links if not (README.parent / link).exists()]
    assert not broken, f"README.md links to files that do not exist: {broken}"
