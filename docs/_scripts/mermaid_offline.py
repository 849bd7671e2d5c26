"""MkDocs hook: the Mermaid diagrams render offline, from a pinned mermaid.min.js served with the site.

mkdocs-material draws a ```mermaid block in the browser with the page's global ``mermaid`` when there is one, and
otherwise loads mermaid 11 from unpkg.com, a CDN: offline, the diagrams stay source. This hook serves mermaid
``VERSION`` from the site itself (``assets/javascripts/mermaid.min.js``, listed in ``extra_javascript``, so every page
defines ``mermaid`` before material looks for it). The file comes from the npm registry's tarball of that version,
checked against the registry's published sha512, and is kept in ``build/docs-assets/`` (checked by its sha256 at
every build), so the network is asked once. Offline without the file, the build stops in one line that says where
to put it.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a hook is loaded by path: its sibling, pinned_npm
from pinned_npm import PinnedFile  # noqa: E402

VERSION = "11.17.2"  # mkdocs-material 9.8 loads mermaid@11 when the page has none
TARBALL = f"https://registry.npmjs.org/mermaid/-/mermaid-{VERSION}.tgz"
TARBALL_SHA512 = "V6K3C8EBdEsPFZXSKMJe6ppQOENxuHARr9GvHX4hh47lAbhMRD9qf4oEK7LoaRQxULMa80/qt5gHO73aCleBBg=="
MEMBER = "package/dist/mermaid.min.js"
FILE_SHA256 = "581ed7d74bd9048d0e3a91363927d72ef22942d7722546b27f7cc29e35390eb8"
SITE_PATH = "assets/javascripts/mermaid.min.js"


class MermaidUnavailable(RuntimeError):
    """mermaid.min.js could not be fetched or failed its checksum."""


def cached_path(repo_root: Path) -> Path:
    """Where the pinned file is kept between builds (``build/`` is not tracked)."""
    return repo_root / "build" / "docs-assets" / f"mermaid-{VERSION}.min.js"


def pinned() -> PinnedFile:
    """This hook's file, as pinned by the module's constants (read at call time: the tests swap them)."""
    return PinnedFile(TARBALL, TARBALL_SHA512, MEMBER, FILE_SHA256, MermaidUnavailable,
                      f"the docs' diagrams need mermaid {VERSION}'s mermaid.min.js and it could not be fetched from")


def extract(tarball: bytes) -> bytes:
    """mermaid.min.js from the npm tarball's bytes, both checked (``pinned_npm``)."""
    return pinned().extract(tarball)


def ensure(path: Path, fetch=lambda url: urllib.request.urlopen(url, timeout=60).read()) -> Path:
    """``path`` holding the pinned file (``PinnedFile.ensure``); ``MermaidUnavailable``: the one line to act on."""
    return pinned().ensure(path, fetch)


def on_config(config):
    """Fetch (once) the pinned file and list it in ``extra_javascript``."""
    from mkdocs.exceptions import PluginError

    try:
        ensure(cached_path(Path(config["docs_dir"]).resolve().parent))
    except MermaidUnavailable as err:
        raise PluginError(str(err)) from None
    if SITE_PATH not in [str(script) for script in config["extra_javascript"]]:
        config["extra_javascript"].append(SITE_PATH)
    return config


def on_files(files, config):
    """Serve the cached file at ``SITE_PATH``."""
    from mkdocs.structure.files import File

    source = cached_path(Path(config["docs_dir"]).resolve().parent)
    files.append(File.generated(config, SITE_PATH, abs_src_path=str(source)))
    return files
