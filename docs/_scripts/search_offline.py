"""MkDocs hook: the search works on the site opened from disk (file://), with nothing fetched from the network.

mkdocs-material's ``offline`` plugin (mkdocs.yml) writes the search index into a script
(``search/search_index.js``), which a page may load from file://, and lists a polyfill, the ``iframe-worker`` shim,
that runs the search's Web Worker in an iframe, since a browser starts no worker from file://. The plugin lists
that shim at unpkg.com, a CDN: offline, the search would stay at "Initializing search". This hook serves
iframe-worker ``VERSION``'s shim from the site itself (``SITE_PATH``) in the CDN's place. As for Mermaid
(mermaid_offline.py), the file comes from the npm registry's tarball of that version, checked against the
registry's published sha512, and is kept in ``build/docs-assets/`` (checked by its sha256 at every build), so the
network is asked once; offline without the file, the build stops in one line that says where to put it.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a hook is loaded by path: its sibling, pinned_npm
from pinned_npm import PinnedFile  # noqa: E402

VERSION = "1.0.4"  # mkdocs-material 9.8's offline plugin lists https://unpkg.com/iframe-worker/shim, unversioned
TARBALL = f"https://registry.npmjs.org/iframe-worker/-/iframe-worker-{VERSION}.tgz"
TARBALL_SHA512 = "roeaaI+Lg1LJNfgpCjoRe/+WzEjy9+Z08LoEvu85MCPbBjwm+qXz8Ag5U05lHa6V1CysZyGzE0SOkAtSUA5q7Q=="
MEMBER = "package/shim/index.js"
FILE_SHA256 = "e8e412dbcfea9b7e31b5ffa288d7b6035915e714c542f4176a0cdbe262fc9609"
SITE_PATH = "assets/javascripts/iframe-worker-shim.js"
CDN = "unpkg.com/iframe-worker"


class ShimUnavailable(RuntimeError):
    """The shim could not be fetched or failed its checksum."""


def cached_path(repo_root: Path) -> Path:
    """Where the pinned file is kept between builds (``build/`` is not tracked)."""
    return repo_root / "build" / "docs-assets" / f"iframe-worker-{VERSION}-shim.js"


def pinned() -> PinnedFile:
    """This hook's file, as pinned by the module's constants (read at call time: the tests swap them)."""
    return PinnedFile(TARBALL, TARBALL_SHA512, MEMBER, FILE_SHA256, ShimUnavailable,
                      f"the docs' offline search needs iframe-worker {VERSION}'s shim and it could not be fetched from")


def extract(tarball: bytes) -> bytes:
    """The shim from the npm tarball's bytes, both checked (``pinned_npm``)."""
    return pinned().extract(tarball)


def ensure(path: Path, fetch=lambda url: urllib.request.urlopen(url, timeout=60).read()) -> Path:
    """``path`` holding the pinned file (``PinnedFile.ensure``); ``ShimUnavailable``: the one line to act on."""
    return pinned().ensure(path, fetch)


def local_polyfills(polyfills) -> list:
    """The theme's polyfills with the CDN's shim replaced by the site's copy."""
    return [*(script for script in polyfills if CDN not in str(script)), SITE_PATH]


def on_config(config):
    """Fetch (once) the pinned shim and list it, in the CDN's place, among the theme's polyfills. Runs after the
    offline plugin's ``on_config`` (hooks run after plugins), which adds the CDN's address."""
    from mkdocs.exceptions import PluginError

    try:
        ensure(cached_path(Path(config["docs_dir"]).resolve().parent))
    except ShimUnavailable as err:
        raise PluginError(str(err)) from None
    config["extra"]["polyfills"] = local_polyfills(config["extra"].get("polyfills", []))
    return config


def on_files(files, config):
    """Serve the cached shim at ``SITE_PATH``."""
    from mkdocs.structure.files import File

    source = cached_path(Path(config["docs_dir"]).resolve().parent)
    files.append(File.generated(config, SITE_PATH, abs_src_path=str(source)))
    return files
