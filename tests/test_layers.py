"""The house's rule: pipeline's packages import one way (``pipeline.LAYERS``), function-level
imports included, and no module imports itself back through others."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pipeline

ROOT = Path(pipeline.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def imports() -> dict[str, set[str]]:
    """module → the pipeline modules it imports anywhere in its body (not under TYPE_CHECKING)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only:  # annotations only: never imported at run time
                continue
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                found |= {t for t in targets if t in modules}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
        graph[name] = found - {name}
    return graph


def layer(module: str) -> int | None:
    parts = module.split(".")
    return pipeline.LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in pipeline.LAYERS else None


def test_every_module_lives_in_a_package_of_the_layers():
    loose = [m for m in imports() if m != "pipeline" and layer(m) is None]
    assert loose == []


def test_packages_import_only_the_ones_before_them():
    upward = [f"{a} -> {b}" for a, targets in imports().items() for b in targets
              if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)]
    assert upward == []


def test_no_relative_imports():
    """Absolute imports only: a module's imports say which package they reach into."""
    relative = [module_name(p) for p in ROOT.rglob("*.py")
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(p.read_text())))]
    assert relative == []


def test_no_import_cycles():
    graph = imports()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_each_package_says_what_it_holds_and_may_import():
    for name in pipeline.LAYERS:
        doc = (ROOT / name / "__init__.py").read_text(encoding="utf-8")
        assert doc.startswith('"""') and "May import" in doc, name


def test_the_config_followed_from_the_trainer_stays_in_a_few_files():
    """The Trainer is handed its parts (training.build): the config, followed call by call from
    the Trainer (scripts/walk_config.py), reaches few files and never climbs to a higher package.
    Before the parts were built outside it, the same walk entered 26 files."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT.parent / "scripts" / "walk_config.py"), "--root",
                          str(ROOT.parent)], capture_output=True, text=True, check=True).stdout
    walk = json.loads(out)
    assert walk["start"] == "pipeline/training/trainer.py:Trainer"
    assert walk["files"] <= 12 and walk["climbs"] <= 10, walk
    assert "pipeline.training.factories" not in walk["entered"]  # building is build_run's, not the Trainer's
    # the walker itself must see something: the config's own file and the pair source's
    assert {"pipeline.core.config", "pipeline.data.batches"} <= set(walk["entered"]), walk
    built = json.loads(subprocess.run([sys.executable, str(ROOT.parent / "scripts" / "walk_config.py"),
                                       "--root", str(ROOT.parent), "--start",
                                       "pipeline/training/build.py:build_run"],
                                      capture_output=True, text=True, check=True).stdout)
    assert "pipeline.training.factories" in built["entered"] and built["files"] > walk["files"], built
