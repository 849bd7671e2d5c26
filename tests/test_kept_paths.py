"""The old import paths users type into other tools keep working (pods_rl.kept_paths): each old name imports the very
module at its new path, no file stays at an old path, and docs/concepts/layout.md lists every one as kept."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

import pods_rl
from pods_rl.kept_paths import KEPT_PATHS, KeptPathFinder, new_path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = Path(pods_rl.__file__).parent
MOVED = {old: new for old, new in KEPT_PATHS.items() if new is not None}


def imported(name: str):
    """The module ``name`` imports, or the ImportError it raises (an engine whose extra is not installed)."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        return err


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_module_at_its_new_path(old):
    new = imported(MOVED[old])
    got = imported(old)
    if isinstance(new, ImportError):  # verl's replay buffer without verl: the old name reaches the same refusal
        assert isinstance(got, ImportError) and str(got) == str(new), (got, new)
        return
    assert got is new and sys.modules[old] is new, (old, got, new)
    assert new.__spec__.name == MOVED[old] == new.__name__  # its own spec, not the old name's


@pytest.mark.parametrize("old", sorted(KEPT_PATHS))
def test_no_file_stays_at_an_old_path(old):
    relative = Path(*old.split(".")[1:])
    assert not (PACKAGE_DIR / relative).with_suffix(".py").exists(), old
    assert KEPT_PATHS[old] is None or not (PACKAGE_DIR / relative / "__init__.py").exists(), old


def test_the_names_users_type_reach_the_same_objects():
    from pods_rl.budget.planners.greso import GresoSkip
    from pods_rl.engines.trl import step
    from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer
    from pods_rl.engines.vllm.server import ReloadWeightsExtension

    typed: dict = {}  # the statements as users write them (exec: no sorter reorders them as third-party imports)
    exec("from pods_rl.trainer import PODSConfig, PODSTrainer\nfrom pods_rl.planners.greso import GresoSkip", typed)
    assert (typed["PODSTrainer"], typed["PODSConfig"], typed["GresoSkip"]) == (PODSTrainer, PODSConfig, GresoSkip)
    assert pods_rl.PODSTrainer is PODSTrainer
    # vLLM resolves --worker-extension-cls by importing the module part and taking the attribute
    module, _, attr = "pods_rl.integrations.vllm_server.ReloadWeightsExtension".rpartition(".")
    assert getattr(importlib.import_module(module), attr) is ReloadWeightsExtension
    # a patch through an old path patches the module the code runs in
    with mock.patch("pods_rl.trainer_step.candidate_ids", "patched"):
        assert step.candidate_ids == "patched"
    assert step.candidate_ids != "patched"
    # a pickle that names an old module (a checkpoint's training_args.bin) loads the class at its new path
    payload = pickle.dumps(PODSConfig, protocol=0).replace(b"pods_rl.engines.trl.config", b"pods_rl.trainer_config")
    assert b"pods_rl.trainer_config" in payload and pickle.loads(payload) is PODSConfig


def test_an_old_package_moved_as_a_whole_keeps_its_submodules_and_a_scattered_one_only_its_rows():
    assert new_path("pods_rl.planners.knapsack") == "pods_rl.budget.planners.knapsack"
    assert new_path("pods_rl.selection") == "pods_rl.selection"  # not an old name: left to the usual finders
    assert importlib.import_module("pods_rl.planners.knapsack") is importlib.import_module(
        "pods_rl.budget.planners.knapsack")
    integrations = importlib.import_module("pods_rl.integrations")
    assert integrations.__path__ == [] and "kept" in integrations.__doc__.lower()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pods_rl.integrations.no_such_engine")
    # the moved package's own attribute is not clobbered by the old name's import
    import pods_rl.engines.verl.batch_settings  # noqa: F401
    importlib.import_module("pods_rl.integrations.verl_args")
    assert pods_rl.engines.verl.batch_settings.__name__ == "pods_rl.engines.verl.batch_settings"


def test_the_finder_stays_first_and_single():
    pods_rl.kept_paths.install()
    pods_rl.kept_paths.install()
    finders = [finder for finder in sys.meta_path if isinstance(finder, KeptPathFinder)]
    assert len(finders) == 1 and sys.meta_path[0] is finders[0]


def test_a_fresh_process_imports_the_old_paths_tools_type():
    """What vLLM's server process (``--worker-extension-cls``), verl's ``pkg://`` sampler path and checkpoint callback
    and ``accelerate launch -m pods_rl.commands.cli`` do: import an old name first thing in a new interpreter."""
    code = ("import importlib; m = importlib.import_module('pods_rl.integrations.vllm_server'); "
            "print(m.__name__, m.ReloadWeightsExtension.__module__); "
            "import pods_rl.trainer, pods_rl.engines.trl.trainer as t; print(pods_rl.trainer is t)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "PYTHONPATH": str(PACKAGE_DIR.parent)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["pods_rl.engines.vllm.server", "pods_rl.engines.vllm.server", "True"]


def test_layout_page_lists_every_kept_path_and_every_package():
    page = (ROOT / "docs" / "concepts" / "layout.md").read_text()
    missing = [old for old in KEPT_PATHS if f"`{old}`" not in page]
    assert not missing, f"docs/concepts/layout.md does not list these kept old paths: {missing}"
    packages = sorted(str(path.parent.relative_to(PACKAGE_DIR)) + "/" for path in PACKAGE_DIR.rglob("__init__.py")
                      if path.parent != PACKAGE_DIR)
    absent = [package for package in packages if Path(package).name + "/" not in page]
    assert not absent, f"docs/concepts/layout.md does not draw these packages: {absent}"
