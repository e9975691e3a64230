"""Where each name of `vse train --loss` and `--network` lives: in exactly one file of its package,
whose name or whose family's name says where it is (issue 51: "where is the ladder loss?" is
answered by a file name, ``losses/ladder.py``; SigLIP by its family's, ``losses/contrastive.py``)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import pipeline
from pipeline.core import registry

ROOT = Path(pipeline.__file__).parent


def module_file(module: str) -> Path:
    return Path(importlib.util.find_spec(module).origin)


def files_defining(package: str, predicate) -> list[str]:
    """The files of ``package`` with a top-level class for which ``predicate(class node)`` holds."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [path.relative_to(ROOT).as_posix() for node in tree.body
                  if isinstance(node, ast.ClassDef) and predicate(node)]
    return found


def declared_name(node: ast.ClassDef) -> str | None:
    """The ``name = "..."`` a loss class declares in its body."""
    for item in node.body:
        if (isinstance(item, ast.Assign) and [getattr(t, "id", None) for t in item.targets] == ["name"]
                and isinstance(item.value, ast.Constant)):
            return item.value.value
    return None


@pytest.mark.parametrize("name", registry.LOSSES.names)
def test_each_loss_name_lives_in_one_file_that_says_so(name):
    module, _, attribute = registry.LOSSES[name].partition(":")
    cls = registry.LOSSES.get_part(name)
    assert cls.__module__ == module and cls.__name__ == attribute  # defined there, not re-exported
    assert module.startswith("pipeline.losses.") and module != "pipeline.losses.base"
    # exactly one class of pipeline/losses declares the name
    assert files_defining("losses", lambda node: declared_name(node) == name) == \
        [module_file(module).relative_to(ROOT).as_posix()]
    # the file says what it holds in its first lines: the name, as ``name``
    doc = ast.get_docstring(ast.parse(module_file(module).read_text(encoding="utf-8")))
    assert f"``{name}``" in doc.split("\n\n")[0], (name, module)


@pytest.mark.parametrize("name", registry.NETWORKS.names)
def test_each_network_name_lives_in_its_familys_file_beside_its_declaration(name):
    """The declaration (``<family>_spec.py``) and the family's code beside it (``<family>.py``, or
    ``vse_model.py`` for VSE++ and VSE∞); a family that is VSE's model with its own parts (VSRN)
    names its file as the model's fields."""
    spec_module = registry.NETWORKS[name].partition(":")[0]
    spec = registry.NETWORKS.spec(name)
    assert spec_module.startswith("pipeline.networks.") and spec_module.endswith("_spec")
    family = spec_module.removesuffix("_spec")
    own = [target.partition(":")[0] for target in (spec.model, spec.model_fields) if target]
    assert any(module in (family, f"{family}_model") for module in own), (name, spec_module, own)
    model_module, _, model_class = spec.model.partition(":")
    assert registry.NETWORKS.get_part(name).__module__ == model_module
    # the network's class is defined in exactly one file of pipeline/networks
    assert files_defining("networks", lambda node: node.name == model_class) == \
        [module_file(model_module).relative_to(ROOT).as_posix()]


def test_every_file_of_the_new_packages_says_what_it_holds():
    for package in pipeline.SIDE_BY_SIDE:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            assert text.startswith('"""') and ast.get_docstring(ast.parse(text)), path
            assert len(text.splitlines()) <= 400, path
