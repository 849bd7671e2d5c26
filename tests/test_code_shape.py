"""The code stays readable in the ways a new contributor relies on: no function longer than 80 lines, and one over 60
says why it is long; no module longer than 550 lines, nor a module docstring over 30; no private (underscore) name
imported from another module of the package; the `pods/*` selection metrics produced in one module that both
engines import. (No import cycle: tests/test_layout.py; lines: ruff's E501 at 120 columns.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "pods_rl"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 550
EXPLAINED_FUNCTION_LINES = 60  # longer than this: a comment with "long" above the def or atop its body says why
MAX_MODULE_DOCSTRING_LINES = 30
MAX_DOCSTRING_SHARE = 0.12  # of the package's source lines: docstrings say what, why and shapes; the story is in docs/


def modules() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def test_no_function_longer_than_80_lines():
    long = [f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in modules() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them by stage): {long}"


def test_no_module_longer_than_550_lines():
    long = [f"{path.relative_to(PACKAGE_DIR)} ({n} lines)" for path in modules()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (do they hold two ideas?): {long}"


def unexplained_long_functions(path: Path) -> list[str]:
    """``name (lines)`` of each function in ``path`` over 60 lines with no comment saying why it is long: a comment
    containing "long" in the two lines above its ``def`` (or decorators) or in the first three lines of its body."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        body_start = node.body[0].end_lineno if ast.get_docstring(node) else node.lineno
        window = lines[max(0, start - 3):start - 1] + lines[body_start:body_start + 3]
        if length > EXPLAINED_FUNCTION_LINES and not any("#" in line and "long" in line.lower() for line in window):
            found.append(f"{node.name} ({length} lines)")
    return found


def test_a_function_over_60_lines_says_why():
    unexplained = {str(path.relative_to(PACKAGE_DIR)): names for path in modules()
                   if (names := unexplained_long_functions(path))}
    assert not unexplained, ("functions over 60 lines with no comment saying why they are long (split them, or say "
                             f"why above the def): {unexplained}")


def test_the_long_function_check_sees_a_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(62))
    module = tmp_path / "m.py"
    module.write_text(f"def f():\n{body}")
    assert unexplained_long_functions(module) == ["f (63 lines)"]
    module.write_text(f"# Long because the test needs it.\ndef f():\n{body}")
    assert unexplained_long_functions(module) == []


def test_module_docstrings_are_at_most_30_lines():
    long = [f"{path.relative_to(PACKAGE_DIR)} ({n} lines)" for path in modules()
            if (tree := ast.parse(path.read_text())).body and ast.get_docstring(tree) is not None
            and (n := tree.body[0].end_lineno - tree.body[0].lineno + 1) > MAX_MODULE_DOCSTRING_LINES]
    assert not long, f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (the rest belongs in docs/): {long}"


def docstring_lines(source: str) -> int:
    """Lines of ``source`` inside docstrings (of the module, its classes and functions)."""
    return sum(node.body[0].end_lineno - node.body[0].lineno + 1 for node in ast.walk(ast.parse(source))
               if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
               and ast.get_docstring(node, clean=False) is not None)


def test_docstrings_are_under_12_percent_of_the_source():
    texts = [path.read_text() for path in modules()]
    share = sum(map(docstring_lines, texts)) / sum(len(text.splitlines()) for text in texts)
    assert share < MAX_DOCSTRING_SHARE, (f"docstrings are {share:.1%} of the package's lines (under "
                                         f"{MAX_DOCSTRING_SHARE:.0%}): say what and why in fewer words")


def test_the_docstring_count_sees_every_kind():
    source = '"""m\n\nmore"""\nclass C:\n    """c"""\n    def f(self):\n        """f\n        g"""\n        return 1\n'
    assert docstring_lines(source) == 3 + 1 + 2


def private_imports(path: Path) -> list[str]:
    """``module.name`` for each underscore name ``path`` imports from another pods_rl module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pods_rl":
            found += [f"{node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_private_name_is_imported_across_modules():
    crossing = {str(path.relative_to(PACKAGE_DIR)): names for path in modules() if (names := private_imports(path))}
    assert not crossing, ("underscore names imported from another module "
                          f"(make them public or keep them home): {crossing}")


def test_the_check_sees_a_private_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from pods_rl.selection import _nanvar, select\n")
    assert private_imports(module) == ["pods_rl.selection._nanvar"]


def test_selection_metrics_are_written_in_one_module():
    """Every `pods/*` selection metric is produced (a dict key `"pods/...":` or an `.append`) in pods_rl/selection.py
    and nowhere else (commands may read them): the TRL step and the verl buffer both take them from `select`."""
    metrics = ("reward_all_mean", "reward_kept_std", "frac_zero_std_all", "frac_zero_std_kept", "prompts_sampled",
               "groups_zero_std", "groups_zero_std_kept", "kept_groups_var_mean")
    writers = {name: sorted(str(path.relative_to(PACKAGE_DIR)) for path in modules()
                            if f'"pods/{name}":' in (text := path.read_text()) or f'"pods/{name}"].append' in text)
               for name in metrics}
    assert all(where == ["selection.py"] for where in writers.values()), writers
    for engine in ("engines/trl/step.py", "engines/verl/replay_buffer.py"):
        imported = {alias.name for node in ast.walk(ast.parse((PACKAGE_DIR / engine).read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module == "pods_rl.selection" for alias in node.names}
        assert "select" in imported, f"{engine} does not take its selection from pods_rl.selection.select"
