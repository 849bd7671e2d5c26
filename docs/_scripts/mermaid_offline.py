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

import base64
import hashlib
import io
import tarfile
import urllib.request
from pathlib import Path

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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def extract(tarball: bytes) -> bytes:
    """mermaid.min.js from the npm tarball's bytes, after checking the tarball against the registry's sha512."""
    digest = base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if digest != TARBALL_SHA512:
        raise MermaidUnavailable(f"{TARBALL} does not match the registry's sha512 for mermaid {VERSION}")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile(MEMBER)
        if member is None:
            raise MermaidUnavailable(f"{TARBALL} has no {MEMBER}")
        data = member.read()
    if _sha256(data) != FILE_SHA256:
        raise MermaidUnavailable(f"{MEMBER} of mermaid {VERSION} is not the file this build pins (sha256)")
    return data


def ensure(path: Path, fetch=lambda url: urllib.request.urlopen(url, timeout=60).read()) -> Path:
    """``path`` holding the pinned mermaid.min.js: the cached file if its sha256 matches, else fetched, checked and
    written there. Raises ``MermaidUnavailable`` with the one line to act on."""
    if path.is_file() and _sha256(path.read_bytes()) == FILE_SHA256:
        return path
    try:
        data = extract(fetch(TARBALL))
    except MermaidUnavailable:
        raise
    except Exception as err:  # offline, a proxy, a registry error: say what to do instead
        raise MermaidUnavailable(
            f"the docs' diagrams need mermaid {VERSION}'s mermaid.min.js and it could not be fetched from {TARBALL} "
            f"({err}); put that file ({MEMBER} of the tarball, sha256 {FILE_SHA256}) at {path}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(path)
    return path


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
