"""The documentation build (`make docs`): the doc tools alone, without torch; the Mermaid diagrams served from the
site, pinned and checked, so that it reads offline. The build itself runs in CI (.ci/docs.sh, `mkdocs build
--strict`); these check its pieces without the doc tools installed."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import re
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "docs" / "_scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_tools_are_the_docs_extra_and_not_the_project(monkeypatch):
    """`make docs` installs the `docs` extra's pins (read with tomllib, or on Python 3.10 as a literal), never the
    project itself, whose dependencies include torch."""
    requirements = load("docs_requirements")
    pinned = requirements.docs_requirements(ROOT / "pyproject.toml")
    assert pinned and all("==" in r for r in pinned) and any(r.startswith("mkdocs-material==") for r in pinned)
    assert not any(r.split("[")[0].split("=")[0] in ("torch", "pods-rl") for r in pinned)
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    assert requirements.docs_requirements(ROOT / "pyproject.toml") == pinned
    target = re.search(r"^docs:\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    assert "docs_requirements.py" in target and "pip install -q -r" in target and "-e ." not in target
    assert "NO_MKDOCS_2_WARNING=1" in target and "DISABLE_MKDOCS_2_WARNING=true" in target  # the banners
    assert "mkdocs build --strict" in target
    assert "make docs" in (ROOT / ".ci" / "docs.sh").read_text()


def tarball(member: bytes, name: str = "package/dist/mermaid.min.js") -> bytes:
    """An npm-like tarball holding ``member``'s bytes at ``name``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(member)
        archive.addfile(info, io.BytesIO(member))
    return buffer.getvalue()


def test_mermaid_is_served_from_the_site_pinned_and_checked(tmp_path, monkeypatch):
    """The hook is in mkdocs.yml; a tarball or file that is not the pinned one is refused; a good cached file is
    used without the network; offline without it, one line says where to put the file."""
    mermaid = load("mermaid_offline")
    assert "docs/_scripts/mermaid_offline.py" in (ROOT / "mkdocs.yml").read_text()
    assert mermaid.VERSION.startswith("11.")  # the major mkdocs-material 9.8 loads from its CDN otherwise
    fake = tarball(b"not mermaid")
    with pytest.raises(mermaid.MermaidUnavailable, match="sha512"):
        mermaid.extract(fake)
    # a tarball that matches the pinned sha512 but holds another file: refused by the file's sha256
    monkeypatch.setattr(mermaid, "TARBALL_SHA512", base64.b64encode(hashlib.sha512(fake).digest()).decode())
    with pytest.raises(mermaid.MermaidUnavailable, match="sha256"):
        mermaid.extract(fake)
    # the pinned file (here: a stand-in with its checksum) is written to the cache and then used offline
    monkeypatch.setattr(mermaid, "FILE_SHA256", hashlib.sha256(b"not mermaid").hexdigest())
    path = tmp_path / "cache" / "mermaid.min.js"
    assert mermaid.ensure(path, fetch=lambda url: fake).read_bytes() == b"not mermaid"

    def offline(url):
        raise OSError("no network")

    assert mermaid.ensure(path, fetch=offline) == path
    path.write_bytes(b"tampered")
    with pytest.raises(mermaid.MermaidUnavailable) as refused:
        mermaid.ensure(path, fetch=offline)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and "no network" in message and mermaid.VERSION in message
