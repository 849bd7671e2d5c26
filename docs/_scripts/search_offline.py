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

import base64
import hashlib
import io
import tarfile
import urllib.request
from pathlib import Path

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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def extract(tarball: bytes) -> bytes:
    """The shim from the npm tarball's bytes, after checking the tarball against the registry's sha512."""
    digest = base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if digest != TARBALL_SHA512:
        raise ShimUnavailable(f"{TARBALL} does not match the registry's sha512 for iframe-worker {VERSION}")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile(MEMBER)
        if member is None:
            raise ShimUnavailable(f"{TARBALL} has no {MEMBER}")
        data = member.read()
    if _sha256(data) != FILE_SHA256:
        raise ShimUnavailable(f"{MEMBER} of iframe-worker {VERSION} is not the file this build pins (sha256)")
    return data


def ensure(path: Path, fetch=lambda url: urllib.request.urlopen(url, timeout=60).read()) -> Path:
    """``path`` holding the pinned shim: the cached file if its sha256 matches, else fetched, checked and written
    there. Raises ``ShimUnavailable`` with the one line to act on."""
    if path.is_file() and _sha256(path.read_bytes()) == FILE_SHA256:
        return path
    try:
        data = extract(fetch(TARBALL))
    except ShimUnavailable:
        raise
    except Exception as err:  # offline, a proxy, a registry error: say what to do instead
        raise ShimUnavailable(
            f"the docs' offline search needs iframe-worker {VERSION}'s shim and it could not be fetched from "
            f"{TARBALL} ({err}); put that file ({MEMBER} of the tarball, sha256 {FILE_SHA256}) at {path}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(path)
    return path


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
