"""No module of pipeline/ or cli/ imports another one's private (underscore) name: what one module
needs from another is public there (the readers' ``toolkit``, ``core.checks``, ``core.values``, …),
or lives in the module that uses it. Tests may still read private names; the library may not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------------------- the package faces
# Each package hands on its public names (``__all__``), as pytorch-metric-learning's ``losses`` and
# timm do: every part a registry names is importable from its package's face (the registry's
# "module:attribute", read from the face by its attribute's name).
FACES = {"LOSSES": "pipeline.losses", "NETWORKS": "pipeline.networks", "SET_POOLS": "pipeline.networks",
         "BACKBONES": "pipeline.backbones", "READERS": "pipeline.data.readers"}


def registry_parts():
    """(registry, name, face, attribute, object) of every part of every registry with a face, the
    attribute named by the registry's "module:attribute": a network's class (its declaration's
    ``model``), a reader's function and its layout class."""
    from pipeline.core import registry as registries

    for registry_name, face in FACES.items():
        registry = getattr(registries, registry_name)
        for name in registry:
            part = registry.get_part(name)
            spec = registry.spec(name).model if registry_name == "NETWORKS" else registry[name]
            yield registry_name, name, face, spec.rpartition(":")[2], part
            if registry_name == "READERS" and registry.entries[name].layout:
                spec = registry.entries[name].layout
                yield registry_name, name, face, spec.rpartition(":")[2], registry.layout_class(name)


def test_every_registry_part_is_importable_from_its_face():
    import importlib

    seen = 0
    for registry_name, name, face, attribute, part in registry_parts():
        module = importlib.import_module(face)
        assert attribute in module.__all__, f"{registry_name} {name}: {face}.__all__ lacks {attribute}"
        assert getattr(module, attribute) is part, f"{registry_name} {name}: {face}.{attribute}"
        seen += 1
    assert seen >= 13 + 5 + 4 + 6 + 5  # losses, networks, pools, backbones, readers (+ layouts)


def test_the_issues_names_import_from_the_losses_face():
    from pipeline.losses import LOSS_NAMES, Batch, MaxHingeLoss, VseLoss, build_loss
    from pipeline.losses.base import LOSS_NAMES as NAMES
    from pipeline.losses.base import Batch as BaseBatch

    assert isinstance(build_loss("mh"), MaxHingeLoss) and issubclass(MaxHingeLoss, VseLoss)
    assert (LOSS_NAMES, Batch) == (NAMES, BaseBatch)


@pytest.mark.parametrize("face", sorted(set(FACES.values())))
def test_each_faces_all_is_complete_and_resolves(face):
    """``from face import *`` binds exactly ``__all__``, each name once, each the object of the
    package (defined in one of its modules: a face hands on its own names, not what they import),
    and ``dir`` lists them all before any is read."""
    import importlib

    module = importlib.import_module(face)
    names = module.__all__
    assert len(names) == len(set(names)) and set(names) <= set(dir(module))
    namespace = {}
    exec(f"from {face} import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(names)
    for name in names:
        home = getattr(namespace[name], "__module__", None)
        assert home is None or home.startswith(face), (face, name, home)
    with pytest.raises(AttributeError, match=f"module '{face}' has no attribute 'no_such_name'"):
        module.no_such_name


def test_the_faces_stay_torch_free():
    """Reading a face's module imports nothing heavy: its names resolve when first read, so option
    parsing and config checks that import one stay without torch."""
    import subprocess
    import sys

    code = ("import sys\nimport pipeline, pipeline.losses, pipeline.networks, pipeline.backbones, "
            "pipeline.data.readers, pipeline.evaluation, pipeline.search\n"
            "print('torch' in sys.modules, len(pipeline.losses.__all__) > 13)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["False", "True"], result.stderr


def test_old_flat_modules_that_are_packages_keep_their_names_for_one_version():
    """0.1.0's flat ``pipeline.evaluation`` and ``pipeline.search`` are packages now: their names
    come from the module that took them (``pipeline.MOVED``) with a FutureWarning naming it; a
    submodule still imports without one, and what the module only imported is not handed on."""
    import warnings

    import pipeline.evaluation
    import pipeline.search
    from pipeline.evaluation.evaluate import format_table
    from pipeline.search.searcher import load_embedder

    with pytest.warns(FutureWarning, match=r"pipeline\.evaluation\.format_table is now "
                                           r"pipeline\.evaluation\.evaluate\.format_table"):
        from pipeline.evaluation import format_table as old
    assert old is format_table
    with pytest.warns(FutureWarning, match=r"pipeline\.search\.load_embedder is now pipeline\.search\.searc"):
        assert pipeline.search.load_embedder is load_embedder
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from pipeline.evaluation import stats  # a submodule: no note
        assert stats.__name__ == "pipeline.evaluation.stats"
    for name in ("np", "FeatureCache", "no_such_name", "_json_number"):
        with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
            getattr(pipeline.evaluation, name)
