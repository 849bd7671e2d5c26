"""CITATION.cff and the README's BibTeX (#63): the project with its version and licence, and the PODS paper as the
preferred citation, agreeing with each other and with the paper the model card cites (pods_rl/engines/trl/trainer.py).
The file's schema: `cffconvert --validate -i CITATION.cff` (Citation File Format 1.2.0; not a test dependency)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def paper_of_the_model_card() -> dict[str, str]:
    """title, author and eprint of the BibTeX the model card carries, read from the source (no import of TRL)."""
    text = (ROOT / "src" / "pods_rl" / "engines" / "trl" / "trainer.py").read_text(encoding="utf-8")
    return {key: re.search(rf"{key}\s*=\s*\{{+([^}}]+)\}}", text).group(1) for key in ("title", "author", "eprint")}


def test_citation_cff_is_the_project_and_cites_the_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["message"] and cff["authors"]
    assert cff["version"] == re.search(r'^version = "([^"]+)"', pyproject, flags=re.M).group(1)
    assert cff["license"] == re.search(r'^license = "([^"]+)"', pyproject, flags=re.M).group(1)
    paper = paper_of_the_model_card()
    for entry in (cff["preferred-citation"], *cff["references"]):
        assert entry["type"] == "article" and entry["title"] == paper["title"] and entry["year"] == 2025
        names = " and ".join(f"{a['given-names']} {a['family-names']}" for a in entry["authors"])
        assert names == paper["author"], names
        assert paper["eprint"].removeprefix("arXiv:") in entry["url"]


def test_the_readme_bibtex_is_the_same():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("## Citing"):].split("```bibtex\n", 1)[1].split("```", 1)[0]
    paper = paper_of_the_model_card()
    for value in paper.values():
        assert value in block, value
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["title"] in block and f"version = {{{cff['version']}}}" in block
