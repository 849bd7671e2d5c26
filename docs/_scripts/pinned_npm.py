"""One file of an npm package, pinned: fetched once from the registry's tarball, checked, and cached for the docs'
build (the hooks mermaid_offline.py and search_offline.py serve theirs from the site, so that it reads offline).

The tarball is checked against the registry's published sha512, the file against its sha256 (also at every build,
from the cache in ``build/docs-assets/``); offline without the file, one line says where to put it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PinnedFile:
    """``member`` of the npm ``tarball`` (its sha512, as the registry publishes it), pinned by the file's sha256;
    ``error`` is the hook's exception class, ``needed_for`` the offline error's words before the tarball's address."""

    tarball: str
    tarball_sha512: str
    member: str
    file_sha256: str
    error: type
    needed_for: str

    def extract(self, tarball: bytes) -> bytes:
        """The file from the tarball's bytes, both checked."""
        if base64.b64encode(hashlib.sha512(tarball).digest()).decode() != self.tarball_sha512:
            raise self.error(f"{self.tarball} does not match the registry's sha512 for {self.member}")
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
            member = archive.extractfile(self.member)
            if member is None:
                raise self.error(f"{self.tarball} has no {self.member}")
            data = member.read()
        if hashlib.sha256(data).hexdigest() != self.file_sha256:
            raise self.error(f"{self.member} of {self.tarball} is not the file this build pins (sha256)")
        return data

    def ensure(self, path: Path, fetch=lambda url: urllib.request.urlopen(url, timeout=60).read()) -> Path:
        """``path`` holding the pinned file: the cached one if its sha256 matches, else fetched, checked and written
        there (by rename: never half written)."""
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == self.file_sha256:
            return path
        try:
            data = self.extract(fetch(self.tarball))
        except self.error:
            raise
        except Exception as err:  # offline, a proxy, a registry error: say what to do instead
            raise self.error(f"{self.needed_for} {self.tarball} ({err}); put that file ({self.member} of the tarball, "
                             f"sha256 {self.file_sha256}) at {path}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(path)
        return path
