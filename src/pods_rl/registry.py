"""One registry for everything pods-rl looks up by name: the down-sampling rules (which rollouts to train on,
``pods_rl.register_rule``), the adaptive round rules (how many rollouts, in rounds: ``register_adaptive_rule``) and
the rollout-budget planners (which prompts, how many rollouts: ``pods_rl.budget.planners.register_planner``).

Each is a ``Registry``: registration (also as a decorator), the entry's own check at registration time (so that a
wrong rule fails when it is registered, not at the first training step), one-line errors naming the fix, and the
sorted names. Plain Python, no framework.
"""

from __future__ import annotations

from collections.abc import Callable


class Registry(dict):
    """name -> entry for one kind of rule (``what``: "rule", "adaptive rule", "planner").

    ``check(name, entry)`` validates an entry before it is registered (raising ``ValueError`` naming the entry and
    the fix) and returns what the registry keeps about it in ``info[name]`` (e.g. whether a rule takes features).
    """

    def __init__(self, what: str, entries: dict | None = None, check: Callable[[str, object], object] | None = None):
        super().__init__()
        self.what, self.check, self.info = what, check, {}
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    def register(self, name: str, entry=None, *, overwrite: bool = False):
        """Register ``entry`` under ``name`` and return it; without ``entry``, a decorator that does. An existing
        name needs ``overwrite=True``."""
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
