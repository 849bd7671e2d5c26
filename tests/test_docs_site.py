"""The built site reads from disk (#69): opened as site/index.html (file://), its search works, 404.html's links are
relative, and code blocks wrap instead of running past a 1280-px page. Served by a static host (#76), 404.html works
for a missing URL at any depth; code blocks keep clear of the copy button; paths in tables break after a `/`.

The pieces are checked without the doc tools (the hooks, the stylesheet, mkdocs.yml). Where the doc tools are
installed (.venv-docs, made by `make docs`), the site is built into a temporary folder and its HTML checked; where
a Chromium is installed too, the search is run in it from file:// and must list results.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from tests.test_docs_build import load, tarball

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = ROOT / ".venv-docs" / "bin" / "mkdocs"


def test_mkdocs_yml_turns_on_what_reading_from_disk_needs():
    config = (ROOT / "mkdocs.yml").read_text()
    plugins = config[config.index("\nplugins:"):config.index("\nnav:")]
    assert re.search(r"^  - offline$", plugins, flags=re.M), "the offline plugin writes search/search_index.js"
    for hook in ("docs/_scripts/search_offline.py", "docs/_scripts/relative_404.py", "docs/_scripts/break_paths.py"):
        assert f"  - {hook}" in config, hook
    assert "  - stylesheets/extra.css" in config and "use_directory_urls: false" in config
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    block = re.search(r"\.md-typeset pre > code \{([^}]*)\}", css).group(1)
    assert "white-space: pre-wrap;" in block
    # room for Material's copy button (.md-code__nav: 0.25em from the edge, a 1.5-em button in 0.2-rem padding)
    assert re.search(r"padding-right: calc\(1\.75em \+ 0\.4rem \+ [\d.]+em\);", block), block
    paths = re.search(r"\.md-typeset td code\.pods-path \{([^}]*)\}", css).group(1)
    assert "word-break: normal;" in paths and "anywhere" not in paths


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


THEME_404 = ('<html><head><meta charset="utf-8"><link rel="icon" href="./favicon.png">'
             '<link rel="stylesheet" href="./assets/main.css"><script src="./assets/shim.js"></script></head>'
             '<body><a href="./index.html">Home</a><script id="__config" type="application/json">{"base": "."}'
             '</script><script src="./assets/bundle.js"></script></body></html>')


def test_the_404_page_loads_its_files_against_the_sites_root():
    """404.html's stylesheets and scripts are named in data- attributes (nothing the preload scanner fetches from a
    missing folder) and loaded by its first script; Material's configuration follows; the root is site_url's path."""
    relative = load("relative_404")
    page = relative.rebase_404(THEME_404, "/docs/")
    assert not re.search(r'<(?:link rel="(?:stylesheet|icon)"|script) (?:href|src)=', page), page
    assert page.count("data-pods-href=") == 2 and page.count("data-pods-src=") == 2
    assert page.index('new URL("/docs/", location.href)') < page.index("<meta charset")  # before any file is named
    assert page.index('{"base": "."}') < page.index("config.base = window.__pods_site_root") < \
        page.index('data-pods-src="./assets/bundle.js"')
    assert page.endswith("<script>__pods_load(document.body)</script>\n</body></html>")
    assert '<script>__pods_load(document.head)</script>\n</head>' in page
    assert relative.site_root({"site_url": "https://example.org/pods-rl"}) == "/pods-rl/"
    assert relative.site_root({"site_url": None}) == "/"
    assert relative.on_post_template("<p>x</p>", "sitemap.xml", {}) == "<p>x</p>"
    with pytest.raises(ValueError, match="theme changed") as refused:
        relative.rebase_404("<html><body></body></html>", "/")
    assert "\n" not in str(refused.value)


def test_a_path_in_a_table_breaks_after_its_slashes():
    """Code in a table cell gets a <wbr> after each `/`; a path (no space) is marked, and may break after a `_`
    too; code outside tables and code without a `/` are left as they were."""
    paths = load("break_paths")
    html = ("<p><code>a/b</code></p><table><tr><td><code>cpu-2core-intel-xeon/auto_calibration/</code> and "
            "<code>pods study --out a/b</code>, <code>cost.json</code></td></tr></table>")
    assert paths.break_paths(html) == (
        "<p><code>a/b</code></p><table><tr><td><code class=\"pods-path\">cpu-2core-intel-xeon/<wbr>auto_<wbr>"
        "calibration/<wbr></code> and <code>pods study --out a/<wbr>b</code>, <code>cost.json</code></td></tr>"
        "</table>")


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
        # 404.html names its files in data- attributes, which its first script loads (relative_404.py)
        assert re.search(r'<script (?:data-pods-)?src="[./]*assets/javascripts/iframe-worker-shim\.js"', html), page
        assert re.search(r'(?:data-pods-)?href="[./]*stylesheets/extra\.css"', html), page
    not_found = (site / "404.html").read_text(encoding="utf-8")
    rooted = re.findall(r'(?:href|src)="(/[^"/][^"]*)"', not_found)
    assert not rooted, rooted[:5]
    assert '"base": "."' in not_found and "__pods_load(document.body)" in not_found
    results = (site / "results" / "index.html").read_text(encoding="utf-8")
    assert '<code class="pods-path">cpu-2core-intel-xeon/<wbr>auto/<wbr></code>' in results


def chromium() -> str:
    """The headless browser for the site's checks. Where none is installed they skip, except in CI's docs lane, which
    installs Chromium and sets PODS_REQUIRE_CHROMIUM=1 so that a lost browser fails instead of passing unseen."""
    found = next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))),
                 None)
    if found is None:
        if os.environ.get("PODS_REQUIRE_CHROMIUM") == "1":
            pytest.fail("no Chromium, and PODS_REQUIRE_CHROMIUM=1: apt-get install chromium (.ci/docs.sh does)")
        pytest.skip("no Chromium here (apt-get install chromium): the HTML checks above stand in")
    return found


def test_the_search_answers_from_file(site):
    """In a headless Chromium, the site opened from disk answers a search (material reads ?q=)."""
    browser = chromium()
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000",
                           "--dump-dom", (site / "index.html").as_uri() + "?q=down-sampling"],
                          capture_output=True, text=True, timeout=180)
    found = re.search(r'md-search-result__meta">(\d+) matching document', done.stdout)
    assert found and int(found.group(1)) > 0, done.stdout[-2000:]


class StaticHost(http.server.SimpleHTTPRequestHandler):
    """A static host: a missing path gets the site's 404.html with status 404. Every request is recorded."""

    requests: list[tuple[str, int]] = []

    def send_error(self, code, message=None, explain=None):
        if code != 404:
            return super().send_error(code, message, explain)
        body = (Path(self.directory) / "404.html").read_bytes()
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_request(self, code="-", size="-"):
        self.requests.append((self.path, int(code)))


def test_the_404_page_works_at_any_depth_on_a_static_host(site):
    """Served for /no/such/nested/page/ as a static host does, 404.html loads its stylesheets, scripts and the search
    index from the site's root (each found, none requested under the missing folder) and Material's script runs."""
    browser = chromium()
    StaticHost.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(StaticHost, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/no/such/nested/page/"
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000",
                               "--dump-dom", url], capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    assert re.search(r'<html[^>]*class="[^"]*\bjs\b', done.stdout), done.stdout[:500]  # Material's bundle ran
    requested = dict(StaticHost.requests)
    assert requested.pop("/no/such/nested/page/") == 404
    assert not [path for path in requested if path.startswith("/no/")], requested
    assert set(requested.values()) == {200}, requested
    for needed in ("/stylesheets/extra.css", "/assets/javascripts/iframe-worker-shim.js", "/search/search_index.json"):
        assert needed in requested, (needed, sorted(requested))
    assert any(path.startswith("/assets/stylesheets/main.") for path in requested), sorted(requested)
