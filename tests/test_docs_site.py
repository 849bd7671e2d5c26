"""The built site reads from disk (#69): opened as site/index.html (file://), its search works, 404.html's links are
relative, and code blocks wrap instead of running past a 1280-px page.

The pieces are checked without the doc tools (the hooks, the stylesheet, mkdocs.yml). Where the doc tools are
installed (.venv-docs, made by `make docs`), the site is built into a temporary folder and its HTML checked; where
a Chromium is installed too, the search is run in it from file:// and must list results.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_docs_build import load, tarball

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = ROOT / ".venv-docs" / "bin" / "mkdocs"


def test_mkdocs_yml_turns_on_what_reading_from_disk_needs():
    config = (ROOT / "mkdocs.yml").read_text()
    plugins = config[config.index("\nplugins:"):config.index("\nnav:")]
    assert re.search(r"^  - offline$", plugins, flags=re.M), "the offline plugin writes search/search_index.js"
    for hook in ("docs/_scripts/search_offline.py", "docs/_scripts/relative_404.py"):
        assert f"  - {hook}" in config, hook
    assert "  - stylesheets/extra.css" in config and "use_directory_urls: false" in config
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert re.search(r"\.md-typeset pre > code \{[^}]*white-space: pre-wrap;", css)


def shim_tarball(member: bytes) -> bytes:
    return tarball(member, "package/shim/index.js")


def test_the_search_worker_shim_is_served_from_the_site_pinned_and_checked(tmp_path, monkeypatch):
    """The hook puts the site's own copy of the shim in the CDN's place among the polyfills; a tarball or file that
    is not the pinned one is refused; offline without the cached file, one line says where to put it."""
    shim = load("search_offline")
    cached = shim.cached_path(tmp_path)
    fake = shim_tarball(b"not the shim")
    with pytest.raises(shim.ShimUnavailable, match="sha512"):
        shim.extract(fake)
    monkeypatch.setattr(shim, "TARBALL_SHA512", base64.b64encode(hashlib.sha512(fake).digest()).decode())
    with pytest.raises(shim.ShimUnavailable, match="sha256"):
        shim.extract(fake)
    monkeypatch.setattr(shim, "FILE_SHA256", hashlib.sha256(b"not the shim").hexdigest())
    assert shim.ensure(cached, fetch=lambda url: fake).read_bytes() == b"not the shim"
    assert shim.local_polyfills(["https://unpkg.com/iframe-worker/shim"]) == [shim.SITE_PATH]
    cached.write_bytes(b"tampered")

    def offline(url):
        raise OSError("no network")

    with pytest.raises(shim.ShimUnavailable) as refused:
        shim.ensure(cached, fetch=offline)
    message = str(refused.value)
    assert "\n" not in message and str(cached) in message and "no network" in message and shim.VERSION in message


def test_the_404_page_gets_a_relative_base():
    relative = load("relative_404")
    assert relative.on_template_context({"base_url": "/"}, "404.html", {})["base_url"] == "."
    assert relative.on_template_context({"base_url": ".."}, "sitemap.xml", {})["base_url"] == ".."


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with the doc tools `make docs` installs, into a temporary folder."""
    if not MKDOCS.is_file():
        pytest.skip("the doc tools are not installed here (make docs installs them into .venv-docs)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--quiet", "--site-dir", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_built_site_reads_from_disk(site):
    """No page loads anything from a CDN; every page lists the shim and the stylesheet; the search index exists as
    a script; 404.html links nothing from the file system's root."""
    assert (site / "search" / "search_index.js").read_text(encoding="utf-8").startswith("var __index = ")
    assert (site / "assets" / "javascripts" / "iframe-worker-shim.js").is_file()
    pages = list(site.rglob("*.html"))
    assert len(pages) > 30
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert "unpkg.com" not in html and "cdn.jsdelivr" not in html, page
    for page in (site / "index.html", site / "guides" / "gpu.html", site / "404.html"):
        html = page.read_text(encoding="utf-8")
        assert re.search(r'<script src="[./]*assets/javascripts/iframe-worker-shim\.js"', html), page
        assert re.search(r'href="[./]*stylesheets/extra\.css"', html), page
    not_found = (site / "404.html").read_text(encoding="utf-8")
    rooted = re.findall(r'(?:href|src)="(/[^"/][^"]*)"', not_found)
    assert not rooted, rooted[:5]
    assert '"base": "."' in not_found


def chromium() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
                None)


def test_the_search_answers_from_file(site):
    """In a headless Chromium, the site opened from disk answers a search (material reads ?q=)."""
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium here (apt-get install chromium): the HTML checks above stand in")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000",
                           "--dump-dom", (site / "index.html").as_uri() + "?q=down-sampling"],
                          capture_output=True, text=True, timeout=180)
    found = re.search(r'md-search-result__meta">(\d+) matching document', done.stdout)
    assert found and int(found.group(1)) > 0, done.stdout[-2000:]
