"""The old import paths that users type into other tools, kept: each names the very module object at its new home.

``import pods_rl`` installs ``KeptPathFinder`` first on ``sys.meta_path``, so an old name (``pods_rl.trainer``,
``pods_rl.integrations.verl``, ...) imports the module at its new path, one object under both names: imports,
``mock.patch``, verl's ``pkg://`` paths, vLLM's ``--worker-extension-cls`` and pickles keep working. ``KEPT_PATHS`` is
the one table; an old package's submodules follow it; an old package split several ways (``None``) is an empty package
of its own. docs/concepts/layout.md lists them."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

KEPT_PATHS: dict[str, str | None] = {
    # the synchronous TRL engine
    "pods_rl.trainer": "pods_rl.engines.trl.trainer",
    "pods_rl.trainer_config": "pods_rl.engines.trl.config",
    "pods_rl.trainer_step": "pods_rl.engines.trl.step",
    "pods_rl.trainer_rounds": "pods_rl.engines.trl.rounds",
    "pods_rl.trainer_rows": "pods_rl.engines.trl.rows",
    "pods_rl.phase_clock": "pods_rl.engines.trl.phase_clock",
    # the other engines, once pods_rl.integrations
    "pods_rl.integrations": None,
    "pods_rl.integrations.async_grpo": "pods_rl.engines.trl_async.worker",
    "pods_rl.integrations.async_budget": "pods_rl.engines.trl_async.budget",
    "pods_rl.integrations.async_scoring": "pods_rl.engines.trl_async.scoring",
    "pods_rl.integrations.async_settings": "pods_rl.engines.trl_async.settings",
    "pods_rl.integrations.async_cpu": "pods_rl.engines.trl_async.cpu",
    "pods_rl.integrations.verl": "pods_rl.engines.verl.replay_buffer",
    "pods_rl.integrations.verl_args": "pods_rl.engines.verl.batch_settings",
    "pods_rl.integrations.vllm_cpu": "pods_rl.engines.vllm.cpu",
    "pods_rl.integrations.vllm_server": "pods_rl.engines.vllm.server",
    # the rollout budget (pods_rl.budget itself is now the package, which re-exports the old module's names)
    "pods_rl.ledger": "pods_rl.budget.ledger",
    "pods_rl.planners": "pods_rl.budget.planners",
}


def new_path(name: str) -> str | None:
    """The module an old name (or an old package's submodule) stands for, ``name`` if not old, None for an empty one."""
    if name in KEPT_PATHS:
        return KEPT_PATHS[name]
    parent, _, child = name.rpartition(".")
    while parent:
        target = KEPT_PATHS.get(parent, "")
        if target:  # a submodule of an old package that moved as a whole
            return f"{target}.{name[len(parent) + 1:]}"
        if target is None:  # an old package of its own: only its rows exist
            return ""
        parent, _, child = parent.rpartition(".")
    return name


class KeptPathLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new path (imported there, once)."""

    def __init__(self, target: str | None):
        self.target = target

    def create_module(self, spec):
        """The module at the new path (None for an old package of its own: the import system makes an empty one)."""
        if self.target is None:
            return None
        module = importlib.import_module(self.target)
        spec.loader_state = module.__spec__  # the import system sets module.__spec__ to the old name's spec; undone
        return module

    def exec_module(self, module) -> None:
        """Nothing to run (the module ran at its new path); restore its own spec for reload, pickling, ``-m``."""
        if self.target is None:
            module.__doc__ = "Kept old import paths (pods_rl.kept_paths): the engines live in pods_rl.engines."
            return
        own = module.__spec__.loader_state
        if own is not None:
            module.__spec__ = own


class KeptPathFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of ``KEPT_PATHS``, first on ``sys.meta_path`` so no second copy of a module is made."""

    def find_spec(self, fullname, path=None, target=None):
        """A spec for an old name (loaded by ``KeptPathLoader``), None for any other name."""
        if not fullname.startswith("pods_rl."):
            return None
        new = new_path(fullname)
        if new == fullname or new == "":
            return None
        spec = importlib.machinery.ModuleSpec(fullname, KeptPathLoader(new), is_package=new is None)
        if new is None:
            spec.submodule_search_locations = []
        return spec


def install() -> None:
    """Put one ``KeptPathFinder`` first on ``sys.meta_path`` (again first if something was put before it)."""
    for finder in [f for f in sys.meta_path if isinstance(f, KeptPathFinder)]:
        sys.meta_path.remove(finder)
    sys.meta_path.insert(0, KeptPathFinder())

