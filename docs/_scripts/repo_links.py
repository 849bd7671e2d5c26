"""MkDocs hook: let the docs link to files of the repository outside docs/ (benchmark figures, recipes, scripts).

A page links to such a file by its relative path in the repository (``../../benchmarks/results/.../x.png`` from
``docs/results/``), so the same link works on GitHub. MkDocs only knows files under docs/ and would call the link
broken; this hook adds every non-Markdown repository file a page links to, copied into the site under ``repo/``.
A link to a file that does not exist is left alone, so ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

# Markdown links and images: ](target) or ](target "title"); the target ends at whitespace or ')'.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?")


def on_files(files, config):
    """Add the repository files outside docs/ that the docs' Markdown links to (Markdown files excluded)."""
    docs_dir = Path(config["docs_dir"]).resolve()
    repo_root = docs_dir.parent
    for page in list(files.documentation_pages()):
        if page.abs_src_path is None or not Path(page.abs_src_path).is_file():
            continue  # generated pages (API reference) link inside the site only
        text = Path(page.abs_src_path).read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if "://" in target or target.startswith(("#", "/", "mailto:")):
                continue
            target = target.split("#", 1)[0]
            src_uri = posixpath.normpath(posixpath.join(posixpath.dirname(page.src_uri), target))
            if not src_uri.startswith("../") or target.endswith(".md"):
                continue  # inside docs/ (MkDocs checks it), or a Markdown file outside (not served)
            absolute = (docs_dir / src_uri).resolve()
            if not absolute.is_file() or repo_root not in absolute.parents:
                continue  # missing: MkDocs reports the broken link
            if files.get_file_from_path(src_uri) is None:
                dest_uri = "repo/" + absolute.relative_to(repo_root).as_posix()
                files.append(File(src_uri, str(docs_dir), config["site_dir"], config["use_directory_urls"],
                                  dest_uri=dest_uri, inclusion=InclusionLevel.NOT_IN_NAV))
    return files
