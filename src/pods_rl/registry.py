"""One registry for everything looked up by name: down-sampling rules, adaptive round rules, budget planners.

Each entry is checked when registered, so a wrong rule fails then, not at the first training step."""

from __future__ import annotations

from collections.abc import Callable


class Registry(dict):
    """name -> entry for one kind of rule; ``check(name, entry)`` validates and returns what ``info[name]`` keeps."""

    def __init__(self, what: str, entries: dict | None = None, check: Callable[[str, object], object] | None = None):
        super().__init__()
        self.what, self.check, self.info = what, check, {}
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    def register(self, name: str, entry=None, *, overwrite: bool = False):
        """Register ``entry`` under ``name`` and return it; without ``entry``, a decorator that does."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.what} name must be a non-empty string, got {name!r}")

        def _register(value):
            info = self.check(name, value) if self.check is not None else None
            if name in self and not overwrite:
                raise ValueError(f"{self.what} {name!r} is already registered; pass overwrite=True to replace it")
            self[name] = value
            self.info[name] = info
            return value

        return _register if entry is None else _register(entry)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self)

    def lookup(self, name: str):
        """The entry registered as ``name``; an unknown name is one ``ValueError`` line listing what exists."""
        if not isinstance(name, str) or name not in self:
            raise ValueError(f"unknown {self.what} {name!r}; available: {self.names()}")
        return self[name]

    def copy(self) -> Registry:
        """A registry with the same entries, checks and info (tests register into a copy and drop it)."""
        other = Registry(self.what, check=self.check)
        dict.update(other, self)
        other.info = dict(self.info)
        return other
