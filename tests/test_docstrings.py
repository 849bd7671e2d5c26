"""Every public module, class, function and method of pods_rl has a docstring: the API reference on the
documentation site is generated from them (docs/_scripts/gen_ref_pages.py), so a missing one is a hole in it.

Public: a name without a leading underscore, in a module whose dotted path has no part with a leading underscore
(``__init__`` stands for its package). Methods are checked inside public classes; functions nested in functions
are not API. Read from the source (AST), so this needs no doc tools and imports nothing heavy.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pods_rl

PACKAGE_DIR = Path(pods_rl.__file__).parent


def public_modules(package_dir: Path) -> dict[str, Path]:
    """{dotted module name: file} of every public module under ``package_dir``."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        if not any(part.startswith("_") for part in parts):
            modules[".".join(parts)] = path
    return modules


def _is_accessor(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    # A property's setter/deleter shares the getter's name and docstring; an @overload's is on the implementation.
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Attribute) and decorator.attr in ("setter", "deleter"):
            return True
        if (isinstance(decorator, ast.Name) and decorator.id == "overload") or (
                isinstance(decorator, ast.Attribute) and decorator.attr == "overload"):
            return True
    return False


def missing_docstrings(source: str, module: str) -> list[str]:
    """``module:line name`` for the module itself and each public class, function and method without a docstring."""
    tree = ast.parse(source)
    missing = [] if ast.get_docstring(tree) else [f"{module}:1 (module docstring)"]

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_") or (not isinstance(node, ast.ClassDef) and _is_accessor(node)):
                continue
            if not ast.get_docstring(node):
                missing.append(f"{module}:{node.lineno} {prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return missing


def test_the_check_finds_what_it_should():
    source = '''"""A module."""
def documented():
    """Yes."""
def undocumented():
    pass
def _private():
    pass
class Thing:
    """A class."""
    def method(self):
        pass
    def _helper(self):
        pass
    @property
    def size(self):
        """The size."""
    @size.setter
    def size(self, value):
        pass
    class Inner:
        pass
class _Hidden:
    def method(self):
        pass
def outer():
    """Nested functions are not API."""
    def inner():
        pass
'''
    assert missing_docstrings(source, "m") == ["m:4 undocumented", "m:10 Thing.method", "m:20 Thing.Inner"]
    assert missing_docstrings("x = 1\n", "m") == ["m:1 (module docstring)"]


def test_the_walk_skips_private_modules(tmp_path):
    package = tmp_path / "pkg"
    (package / "_private").mkdir(parents=True)
    for name in ("__init__.py", "public.py", "_hidden.py", "_private/inside.py"):
        (package / name).write_text("")
    assert sorted(public_modules(package)) == ["pkg", "pkg.public"]


def test_every_public_object_of_pods_rl_has_a_docstring():
    modules = public_modules(PACKAGE_DIR)
    assert "pods_rl.downsample" in modules and "pods_rl" in modules
    missing = [item for module, path in modules.items()
               for item in missing_docstrings(path.read_text(encoding="utf-8"), module)]
    assert not missing, ("public objects without a docstring (the API reference is built from them; add one, "
                         "with shapes for tensors, or make the name private):\n  " + "\n  ".join(missing))
