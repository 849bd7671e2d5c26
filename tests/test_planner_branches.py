"""How many places outside ``pods_rl.budget`` branch on a planner's kind or name (issue #75: at most 10).

Counted per line of src/pods_rl/**/*.py outside src/pods_rl/budget/, with ``BRANCH``: a comparison (==, !=, in,
not in) of a ``*planner*``/``which*``/``how_many*`` value with a quoted planner name; ``.kind ==``/``!=``;
``isinstance`` with a planner Protocol; a per-engine list of planner names (``*PLANNERS``); ``make_planner`` with a
literal planner name; a duck flag (``needs_costs``, ``samples_in_rounds``, ``seed_with``). Engines learn what a
planner needs from ``Planner.needs`` against ``pods_rl.engines.settings.OFFERS`` instead.
"""

import re
from pathlib import Path

import pods_rl

PACKAGE = Path(pods_rl.__file__).parent
NAMES = "auto|cgrpo|knapsack|greso|pilot_commit|reinforce_ada"
BRANCH = re.compile(
    rf"""(?:planner|which|how_many)\w*["'\])]*\s*(?:==|!=|\bnot in\b|\bin\b)\s*[(\[{{]?\s*["'](?:{NAMES})["']"""
    r"""|\.kind\s*(?:==|!=)"""
    r"""|isinstance\([^)]*\b(?:WhichPrompts|HowMany|Committing|Adapting)\b"""
    r"""|\b[A-Z_]*PLANNERS\b"""
    rf"""|make_planner\(\s*["'](?:{NAMES})["']"""
    r"""|\b(?:needs_costs|samples_in_rounds|seed_with)\b""")
DUCK_FLAGS = re.compile(r"\b(?:needs_costs|samples_in_rounds|seed_with)\b")
LIMIT = 10


def branches(pattern=BRANCH) -> list[str]:
    """``path:line: text`` of every matching line of the package outside budget/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "budget":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    return found


def test_the_pattern_catches_each_kind_of_branch():
    for line in ['if config.rollout_planner == "cgrpo":', "if settings.get('pods_rollout_planner') != 'auto':",
                 'if which in ("greso", "pilot_commit"):', "if planner.kind == 'how_many':",
                 "isinstance(p, Committing)", "supported = PLANNERS[engine]", 'make_planner("reinforce_ada")',
                 "if budget.needs_costs:"]:
        assert BRANCH.search(line), line
    for line in ['if backend == "auto":', 'if "costs" in budget.needs:', "make_planner(name, **knobs)"]:
        assert not BRANCH.search(line), line


def test_few_places_outside_the_budget_branch_on_a_planners_kind_or_name():
    found = branches()
    assert len(found) <= LIMIT, "\n".join(found)


def test_no_duck_flags_anywhere():
    assert not branches(DUCK_FLAGS)
    inside = [path for path in (PACKAGE / "budget").rglob("*.py") if DUCK_FLAGS.search(path.read_text())]
    assert not inside, inside
