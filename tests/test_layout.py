"""The house stays as built: imports among pods_rl modules run one way (no cycle), down these layers:
commands -> the public face (``pods_rl``) -> run (recipes, training_run, generation, evaluation) -> engines ->
library -> budget -> core. No library module imports a command or an engine, no command another (but cli.py and
`pods study`'s parts), and the core imports nothing of ours but the core. The graph
is read from the source (every module's AST, function-level imports included), not from what happens to be
imported at run time. Only ``pods_rl.engines`` imports TRL, verl or vLLM."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pods_rl

PACKAGE_DIR = Path(pods_rl.__file__).parent
# The commands: each is a `pods ...` sub-command's module. They sit on top; nothing below may import them. Their
# home is the COMMAND_PACKAGE: any module in it is a command.
COMMAND_PACKAGE = "pods_rl.commands"
COMMANDS = {"pods_rl.commands.cli", "pods_rl.commands.train", "pods_rl.commands.evaluate",
            "pods_rl.commands.cost", "pods_rl.commands.plots", "pods_rl.commands.launch",
            "pods_rl.commands.study", "pods_rl.commands.study_plan", "pods_rl.commands.study_runner",
            "pods_rl.commands.study_report",  # these three: parts of `pods study`
            "pods_rl.commands.build_tiny", "pods_rl.commands.verl_args"}
# The core: plain tensor code, no framework; it imports nothing of ours but the core.
CORE = {"pods_rl.downsample", "pods_rl.advantages", "pods_rl.reward_checks", "pods_rl.adaptive", "pods_rl.registry"}
# The rollout budget (ledger, planners, RolloutBudget): plain torch on top of the core; every module of the package.
BUDGET_PACKAGE = "pods_rl.budget"
# The engines: the only package that imports TRL, verl or vLLM; it stands on the library, the budget and the core.
ENGINE_PACKAGE = "pods_rl.engines"
# What puts an engine to work for a command: a recipe resolved into PODSConfig, generation with vLLM and a model's
# evaluation for `pods eval`, a training run (build, fit) for `pods train` and `pods cost`, and auto's projection for
# `pods cost` (it samples the recipe's starting model for its pass rates).
RUN = {"pods_rl.recipes", "pods_rl.generation", "pods_rl.evaluation", "pods_rl.training_run", "pods_rl.auto_projection"}
# The command modules that may import other command modules: the dispatcher, and `pods study`'s parts (each other,
# and the `pods train` / `pods cost` they run in-process). Every other command stands on the layers below alone.
COMMAND_IMPORTERS = {"pods_rl.commands.cli", "pods_rl.commands.study", "pods_rl.commands.study_plan",
                     "pods_rl.commands.study_runner", "pods_rl.commands.study_report"}
# The public face: `import pods_rl` re-exports the rules and, lazily, PODSConfig / PODSTrainer.
FACE = {"pods_rl"}
LAYERS = ("core", "budget", "library", "engine", "run", "face", "command")


def module_files(package_dir: Path, package: str) -> dict[str, Path]:
    """{module name: file} of every .py file under ``package_dir`` (``__init__.py`` names its package)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` refers to: itself, or its longest prefix that is a module of ours (None if not ours)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_edges(modules: dict[str, Path]) -> dict[str, list[tuple[str, int]]]:
    """{module: [(imported module of ours, line), ...]} from every import statement anywhere in each module
    (top level, functions, methods, ``if`` blocks), relative imports, and ``importlib.import_module("...")`` /
    ``__import__("...")`` calls with a literal name."""
    edges: dict[str, list[tuple[str, int]]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        found = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package, up level - 1 packages
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                # `from pkg import sub` imports the submodule pkg.sub when there is one, else names of pkg.
                names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                         for alias in node.names]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called in ("import_module", "__import__"):
                    names = [node.args[0].value]
            for name in names:
                target = _resolve(name, modules)
                if target is not None and target != module:
                    found.append((target, node.lineno))
        edges[module] = found
    return edges


def find_cycle(edges: dict[str, list[tuple[str, int]]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a] (depth-first search), or None."""
    state: dict[str, str] = {}  # "open" while on the stack, "done" after
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target, _ in edges.get(module, []):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def describe_cycle(cycle: list[str], edges: dict[str, list[tuple[str, int]]], modules: dict[str, Path]) -> str:
    """``a (a.py:12) -> b (b.py:40) -> a``: where each import of the cycle is."""
    hops = []
    for here, there in zip(cycle, cycle[1:]):
        line = next(line for target, line in edges[here] if target == there)
        hops.append(f"{here} ({modules[here].name}:{line})")
    return " -> ".join([*hops, cycle[-1]])


def cycle_message(package_dir: Path, package: str) -> str | None:
    modules = module_files(package_dir, package)
    edges = import_edges(modules)
    cycle = find_cycle(edges)
    return None if cycle is None else describe_cycle(cycle, edges, modules)


def library_imports_of_commands(package_dir: Path, package: str, commands: set[str]) -> list[str]:
    modules = module_files(package_dir, package)
    return [f"{module} ({modules[module].name}:{line}) imports the command {target}"
            for module, found in import_edges(modules).items() if module not in commands
            for target, line in found if target in commands]


def is_command(module: str, commands: set[str]) -> bool:
    """Whether ``module`` is a command: listed in ``commands``, or anywhere in the commands package."""
    return module in commands or module == COMMAND_PACKAGE or module.startswith(COMMAND_PACKAGE + ".")


def in_package(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or any module under it."""
    return module == package or module.startswith(package + ".")


def layer(module: str, commands: set[str], core: set[str]) -> int:
    """The module's layer, an index of LAYERS."""
    if is_command(module, commands):
        return LAYERS.index("command")
    if module in core:
        return LAYERS.index("core")
    for index, found in ((LAYERS.index("budget"), in_package(module, BUDGET_PACKAGE)),
                         (LAYERS.index("engine"), in_package(module, ENGINE_PACKAGE)),
                         (LAYERS.index("run"), module in RUN), (LAYERS.index("face"), module in FACE)):
        if found:
            return index
    return LAYERS.index("library")


def upward_imports(package_dir: Path, package: str, commands: set[str], core: set[str]) -> list[str]:
    """Every import from a lower layer to a higher one, as ``a (a.py:3), core, imports the library b``."""
    modules = module_files(package_dir, package)
    found = []
    for module, targets in import_edges(modules).items():
        for target, line in targets:
            here, there = layer(module, commands, core), layer(target, commands, core)
            if there > here:
                found.append(f"{module} ({modules[module].name}:{line}), {LAYERS[here]}, imports the {LAYERS[there]} "
                             f"{target}")
    return found


# ------------------------------------------------------------------------------------------------------------
def test_no_import_cycle_among_pods_rl_modules():
    message = cycle_message(PACKAGE_DIR, "pods_rl")
    assert message is None, f"import cycle: {message} (make one side import a lower module instead)"


def test_no_library_module_imports_a_command():
    offenders = library_imports_of_commands(PACKAGE_DIR, "pods_rl", COMMANDS)
    assert not offenders, ("library modules must not import commands (move what they need below the commands, "
                           "e.g. into pods_rl.errors): " + "; ".join(offenders))


def test_imports_run_one_way_commands_engines_library_budget_core():
    offenders = upward_imports(PACKAGE_DIR, "pods_rl", COMMANDS, CORE)
    assert not offenders, (f"imports must run one way, down {' <- '.join(LAYERS)} (move what a lower module needs "
                           "down, or the importing code up): " + "; ".join(offenders))


def test_every_sub_command_is_a_command_module():
    """Each `pods` sub-command's module, as the dispatcher names it, is a command; the lists here name real modules."""
    from pods_rl.commands import cli

    modules = module_files(PACKAGE_DIR, "pods_rl")
    dispatched = {module for module, _ in cli.COMMANDS.values()}
    assert dispatched <= set(modules) and all(is_command(module, COMMANDS) for module in dispatched), dispatched
    assert COMMANDS <= set(modules), COMMANDS - set(modules)
    assert {"pods_rl.downsample", "pods_rl.advantages", "pods_rl.reward_checks"} <= CORE & set(modules)


def test_the_walk_sees_function_level_and_lazy_imports():
    """The graph holds imports that only run inside functions; otherwise the two tests above would prove little."""
    edges = import_edges(module_files(PACKAGE_DIR, "pods_rl"))
    assert "pods_rl.engines.trl.trainer" in {t for t, _ in edges["pods_rl"]}  # inside pods_rl.__getattr__
    assert "pods_rl.engines.trl.trainer" in {t for t, _ in edges["pods_rl.training_run"]}  # inside _build_trainer
    assert "pods_rl.runlog.callbacks" in {t for t, _ in edges["pods_rl.runlog"]}  # `from pods_rl.runlog import x`
    assert set(edges) >= {"pods_rl.runlog.store", "pods_rl.tasks.rewards", "pods_rl.models", "pods_rl.recipes"}


def commands_importing_commands(package_dir: Path, package: str, importers: set[str]) -> list[str]:
    """Every import of a command module by another command module outside ``importers``."""
    modules = module_files(package_dir, package)
    command_package = f"{package}.commands"
    return [f"{module} ({modules[module].name}:{line}) imports the command {target}"
            for module, found in import_edges(modules).items()
            if in_package(module, command_package) and module not in importers
            for target, line in found if in_package(target, command_package)]


def test_no_command_imports_another_command():
    """Commands stay thin: what two commands share sits below them (``pods_rl.training_run`` for `pods train` and
    `pods cost`, ``pods_rl.evaluation``, ``pods_rl.figures``), not in one command imported by another."""
    offenders = commands_importing_commands(PACKAGE_DIR, "pods_rl", COMMAND_IMPORTERS)
    assert not offenders, "move what two commands share below pods_rl.commands: " + "; ".join(offenders)
    edges = import_edges(module_files(PACKAGE_DIR, "pods_rl"))
    assert "pods_rl.training_run" in {t for t, _ in edges["pods_rl.commands.cost"]}


def test_a_command_importing_a_command_is_named(tmp_path):
    package = tmp_path / "pkg"
    (package / "commands").mkdir(parents=True)
    sources = {"__init__.py": "", "commands/__init__.py": "", "commands/cli.py": "import pkg.commands.train\n",
               "commands/train.py": "from pkg import run\n", "run.py": "",
               "commands/cost.py": "import os\n\n\ndef f():\n    from pkg.commands import train\n"}
    for name, text in sources.items():
        (package / name).write_text(text)
    assert commands_importing_commands(package, "pkg", {"pkg.commands.cli"}) == [
        "pkg.commands.cost (cost.py:5) imports the command pkg.commands.train"]
    (package / "commands" / "cost.py").write_text("from pkg import run\n")
    assert commands_importing_commands(package, "pkg", {"pkg.commands.cli"}) == []


SOURCES = {
    "__init__.py": "",
    "low.py": "import os\n\n\ndef f():\n    {lazy}\n",
    "high.py": "from pkg import low\n",
    "cmd.py": "from pkg.high import x\n",
}


@pytest.mark.parametrize("lazy", [
    "from pkg.high import x",  # function-level
    "from . import high",  # relative
    "import pkg.high",
    "importlib.import_module('pkg.high')",
])
def test_a_cycle_hidden_in_a_function_is_found_and_named(tmp_path, lazy):
    package = tmp_path / "pkg"
    package.mkdir()
    for name, text in SOURCES.items():
        (package / name).write_text(text.format(lazy=lazy))
    message = cycle_message(package, "pkg")
    assert message is not None and "pkg.low (low.py:5)" in message and "pkg.high (high.py:1)" in message, message
    assert library_imports_of_commands(package, "pkg", {"pkg.high", "pkg.cmd"}) == [
        "pkg.low (low.py:5) imports the command pkg.high"]
    (package / "low.py").write_text("import os\n")
    assert cycle_message(package, "pkg") is None


def test_an_upward_import_is_named(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    sources = {"__init__.py": "", "core.py": "import os\n\n\ndef f():\n    from pkg import lib\n",
               "lib.py": "from pkg import core\n", "cmd.py": "from pkg.lib import x\n"}
    for name, text in sources.items():
        (package / name).write_text(text)
    assert upward_imports(package, "pkg", {"pkg.cmd"}, {"pkg.core"}) == [
        "pkg.core (core.py:5), core, imports the library pkg.lib"]
    (package / "lib.py").write_text("from pkg import cmd\n")
    assert upward_imports(package, "pkg", {"pkg.cmd"}, {"pkg.core"}) == [
        "pkg.core (core.py:5), core, imports the library pkg.lib",
        "pkg.lib (lib.py:1), library, imports the command pkg.cmd"]
    (package / "core.py").write_text("import os\n")
    (package / "lib.py").write_text("from pkg import core\n")
    assert upward_imports(package, "pkg", {"pkg.cmd"}, {"pkg.core"}) == []


FRAMEWORKS = ("trl", "verl", "vllm")


def framework_imports(package_dir: Path, package: str) -> dict[str, list[str]]:
    """{module: ["trl (line)", ...]} for every module that imports TRL, verl or vLLM anywhere in its source."""
    found: dict[str, list[str]] = {}
    for module, path in module_files(package_dir, package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found.setdefault(module, []).extend(f"{name} ({node.lineno})" for name in names
                                                if name.split(".")[0] in FRAMEWORKS)
    return {module: lines for module, lines in found.items() if lines}


def test_only_the_engines_import_trl_verl_or_vllm():
    outside = {module: lines for module, lines in framework_imports(PACKAGE_DIR, "pods_rl").items()
               if not in_package(module, ENGINE_PACKAGE)}
    assert not outside, f"only pods_rl.engines imports TRL, verl or vLLM (move the code into an engine): {outside}"
    engines = framework_imports(PACKAGE_DIR, "pods_rl")
    assert {"pods_rl.engines.trl.config", "pods_rl.engines.trl.parser", "pods_rl.engines.trl.sft",
            "pods_rl.engines.verl.replay_buffer", "pods_rl.engines.vllm.cpu"} <= set(engines), \
        "the walk must see the engines' own imports (function-level ones too)"


def test_a_framework_import_outside_the_engines_is_named(tmp_path):
    package = tmp_path / "pkg"
    (package / "engines").mkdir(parents=True)
    sources = {"__init__.py": "", "engines/__init__.py": "", "engines/a.py": "import trl\n",
               "run.py": "import os\n\n\ndef f():\n    from vllm import LLM\n"}
    for name, text in sources.items():
        (package / name).write_text(text)
    assert framework_imports(package, "pkg") == {"pkg.engines.a": ["trl (1)"], "pkg.run": ["vllm (5)"]}


def test_every_package_is_in_a_layer_that_the_walk_knows():
    """engines/ and budget/ exist and every module of theirs is in its layer (a new engine package lands there too)."""
    modules = module_files(PACKAGE_DIR, "pods_rl")
    engines = [m for m in modules if in_package(m, ENGINE_PACKAGE)]
    budget = [m for m in modules if in_package(m, BUDGET_PACKAGE)]
    assert {"pods_rl.engines.trl.trainer", "pods_rl.engines.trl_async.worker", "pods_rl.engines.verl.replay_buffer",
            "pods_rl.engines.vllm.server"} <= set(engines)
    assert {"pods_rl.budget.ledger", "pods_rl.budget.rollout_budget", "pods_rl.budget.planners.greso"} <= set(budget)
    assert {layer(m, COMMANDS, CORE) for m in engines} == {LAYERS.index("engine")}
    assert {layer(m, COMMANDS, CORE) for m in budget} == {LAYERS.index("budget")}
