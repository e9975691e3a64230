"""Follow a run's config call by call from the Trainer, and count where it goes.

    python scripts/walk_config.py [--root DIR] [--start pipeline/training/trainer.py:Trainer]

Static, from the source (ast): a function "receives the config" when a call passes it the
config object (a name bound to it, ``self.cfg``, ``parts.config``) as an argument, or calls a
method on it (``cfg.check()`` enters ``TrainConfig.check``). Calls are resolved through each
module's imports (``from M import f``, ``from P import m`` then ``m.f``), ``self.method`` and
classes (their ``__init__``); what cannot be resolved statically is not followed. Printed:

- files: the files the config enters (the start file included);
- climbs: calls in the walk from a package to a package above it in ``pipeline.LAYERS`` (with
  ``--layers-of-old-layout``, the old flat modules are mapped to the package they moved to,
  ``pipeline.MOVED``);
- the call edges themselves, one per line, with ``--edges``.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline import LAYERS, MOVED  # noqa: E402  (this repository's, whatever --root walks)

# The package each module of the flat layout moved to (judgments and relevance were packages).
OLD_LAYOUT = {old.split(".")[0]: new.split(".")[0] for old, new in MOVED.items()} | {"relevance": "relevance"}


class Module:
    def __init__(self, root: Path, name: str, path: Path):
        self.name, self.path = name, path
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.defs: dict[str, ast.AST] = {}      # top-level functions and classes
        self.imports: dict[str, tuple[str, str | None]] = {}  # local name → (module, attribute)
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
        package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1]
                                    + ([node.module] if node.module else []))
                for a in node.names:
                    self.imports[a.asname or a.name] = (base, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    local = a.asname or a.name.split(".")[0]
                    self.imports[local] = (a.name if a.asname else local, None)


class Walker:
    def __init__(self, root: Path, old_layout: bool):
        self.root, self.old_layout = root, old_layout
        self.modules = {}
        for path in (root / "pipeline").rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self.modules[name] = Module(root, name, path)
        self.seen: set[tuple[str, str]] = set()
        self.files: list[str] = []
        self.edges: list[tuple[str, str, str, str]] = []

    def layer(self, module: str) -> int | None:
        parts = module.split(".")
        if len(parts) < 2:
            return None
        key = OLD_LAYOUT.get(parts[1]) if self.old_layout else parts[1]
        return LAYERS.index(key) if key in LAYERS else None

    def resolve(self, module: Module, func, cls: ast.ClassDef | None):
        """(module, definition, class) a call's function expression names, or None."""
        if isinstance(func, ast.Name):
            if func.id in module.defs:
                return self._definition(module, module.defs[func.id])
            if func.id in module.imports:
                target, attr = module.imports[func.id]
                return self._lookup(target, attr)
        elif isinstance(func, ast.Attribute):
            value = func.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls") and cls is not None:
                for node in cls.body:
                    if isinstance(node, ast.FunctionDef) and node.name == func.attr:
                        return module, node, cls
            if isinstance(value, ast.Name) and value.id in module.imports:
                target, attr = module.imports[value.id]
                full = f"{target}.{attr}" if attr else target
                if full in self.modules:
                    return self._lookup(full, func.attr)
                found = self._lookup(target, attr)
                if found and isinstance(found[1], ast.ClassDef):  # Class.method
                    return self._method(found[0], found[1], func.attr)
            if isinstance(value, ast.Name) and value.id in module.defs and isinstance(module.defs[value.id],
                                                                                      ast.ClassDef):
                return self._method(module, module.defs[value.id], func.attr)
        return None

    def _lookup(self, target: str, attr: str | None):
        if attr is not None and f"{target}.{attr}" in self.modules:
            return None  # a module, not a callable
        module = self.modules.get(target)
        if module is None or attr is None:
            return None
        if attr in module.defs:
            return self._definition(module, module.defs[attr])
        if attr in module.imports:  # re-exported
            inner, inner_attr = module.imports[attr]
            return self._lookup(inner, inner_attr)
        return None

    def _definition(self, module: Module, node):
        if isinstance(node, ast.ClassDef):
            return self._method(module, node, "__init__") or (module, None, node)
        return module, node, None

    @staticmethod
    def _method(module: Module, cls: ast.ClassDef, name: str):
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return module, node, cls
        return None

    def config_class(self):
        for name, module in self.modules.items():
            if name.endswith("config") and "TrainConfig" in module.defs:
                return module, module.defs["TrainConfig"]
        raise SystemExit("no TrainConfig")

    def walk(self, module: Module, func: ast.FunctionDef, cls, names: set[str], attrs: set[str]):
        key = (module.name, f"{cls.name + '.' if cls else ''}{func.name}")
        if key in self.seen:
            return
        self.seen.add(key)
        if module.name not in self.files:
            self.files.append(module.name)
        self.in_config_class = cls is not None and cls.name == "TrainConfig"
        names = set(names)
        for node in ast.walk(func):  # values read from it: x = cfg / x = cfg.loss / x = f(cfg)
            if isinstance(node, ast.Assign) and self.is_config(node.value, names, attrs):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and self.is_config_object(node.func.value, names) and (
                    not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
                    or self.in_config_class):
                cmod, ccls = self.config_class()
                found = self._method(cmod, ccls, node.func.attr)
                if found:
                    self.enter(module, found, {"self"}, set())
                continue
            passed = [i for i, a in enumerate(node.args) if self.is_config(a, names, attrs)]
            keywords = [k.arg for k in node.keywords if k.arg and self.is_config(k.value, names, attrs)]
            if not passed and not keywords:
                continue
            found = self.resolve(module, node.func, cls)
            if not found or found[1] is None:
                continue
            target, callee, callee_cls = found
            params = [a.arg for a in callee.args.args]
            if callee_cls is not None and params and params[0] in ("self", "cls"):
                params = params[1:]
            received = {params[i] for i in passed if i < len(params)} | set(keywords)
            self.enter(module, (target, callee, callee_cls), received, set())

    def enter(self, caller: Module, found, names, attrs):
        target, callee, callee_cls = found
        self.edges.append((caller.name, target.name, callee.name, str(self.layer(target.name))))
        self.walk(target, callee, callee_cls, names, attrs)

    @staticmethod
    def is_config(node, names: set[str], attrs: set[str]) -> bool:
        """The expression is the config or carries a value read from it (``cfg.loss``,
        ``cfg.dataset_options()``, ``str(cfg.features)``)."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in names:
                return True
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and (
                    (sub.value.id, sub.attr) in {("self", "cfg"), ("parts", "config"), ("self", "config")}):
                return True
        return False

    @staticmethod
    def is_config_object(node, names: set[str]) -> bool:
        """The expression is the config object itself (its methods are TrainConfig's)."""
        if isinstance(node, ast.Name):
            return node.id in names and node.id in {"cfg", "config", "self"}
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
            (node.value.id, node.attr) in {("self", "cfg"), ("parts", "config"), ("self", "config")})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".", type=Path)
    parser.add_argument("--start", default=None, help="FILE:Class (default: the Trainer's file)")
    parser.add_argument("--layers-of-old-layout", action="store_true")
    parser.add_argument("--edges", action="store_true")
    args = parser.parse_args(argv)
    walker = Walker(args.root.resolve(), args.layers_of_old_layout)
    start = args.start or next(str(p.relative_to(args.root)) for p in (args.root / "pipeline").rglob("*.py")
                               if "class Trainer" in p.read_text()) + ":Trainer"
    path, _, cls_name = start.partition(":")
    name = ".".join(Path(path).with_suffix("").parts)
    module = walker.modules[name]
    start_node = module.defs[cls_name]
    if isinstance(start_node, ast.FunctionDef):  # a function: the config is its config/cfg parameter
        walker.walk(module, start_node, None, {a.arg for a in start_node.args.args} & {"config", "cfg"},
                    set())
    for node in getattr(start_node, "body", []) if isinstance(start_node, ast.ClassDef) else []:
        if isinstance(node, ast.FunctionDef):
            params = {a.arg for a in node.args.args}
            walker.walk(module, node, start_node, params & {"config", "cfg"}, set())
    layers = [(walker.layer(a), walker.layer(b)) for a, b, _, _ in walker.edges]
    climbs = sum(1 for a, b in layers if a is not None and b is not None and b > a)
    result = {"start": start, "files": len(walker.files), "climbs": climbs, "calls": len(walker.edges),
              "entered": walker.files}
    if args.edges:
        result["edges"] = [f"{a} -> {b}:{f}" for a, b, f, _ in walker.edges]
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
