"""No module of pipeline/ or cli/ imports another one's private (underscore) name: what one module
needs from another is public there (the readers' ``toolkit``, ``core.checks``, ``core.values``, …),
or lives in the module that uses it. Tests may still read private names; the library may not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "cli")


def imported_module(relative: Path, node: ast.ImportFrom) -> str:
    """The absolute name of the module an ``ImportFrom`` in file ``relative`` (to the repository)
    reads: relative imports resolved (``__init__`` counts as a module of its package)."""
    if not node.level:
        return node.module or ""
    base = list(relative.with_suffix("").parts)[:-node.level]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(root: Path = ROOT, packages=PACKAGES) -> list[str]:
    """``file:line: from module import _name`` for every single-underscore name a module of
    ``packages`` imports from a module of ``packages`` (at any depth, inside functions too)."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(relative))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                module = imported_module(relative, node)
                if module.split(".")[0] not in packages:
                    continue
                found += [f"{relative.as_posix()}:{node.lineno}: from {module} import {alias.name}"
                          for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_another_ones_private_name():
    assert private_imports() == [], "make the name public where it is defined, or move it to its one user"


def test_the_walk_sees_a_private_import(tmp_path):
    """The check itself: a private name imported absolutely, relatively and inside a function is found;
    a dunder name and a name from outside the packages are not."""
    package = tmp_path / "pipeline" / "sub"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pipeline.core.values import _x\nfrom . import _y\n"
                                  "from os import _exit\nfrom pipeline import __version__\n\n"
                                  "def f():\n    from ..b import _z, fine\n")
    found = private_imports(tmp_path, ("pipeline",))
    assert found == ["pipeline/sub/a.py:1: from pipeline.core.values import _x",
                     "pipeline/sub/a.py:2: from pipeline.sub import _y",
                     "pipeline/sub/a.py:7: from pipeline.b import _z"]
