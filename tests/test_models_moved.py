"""``pipeline.models``, the one module of moved names: a plug-in written against 0.1.0's paths
(``from pipeline.models.losses import MaxHingeLoss``) gets the very objects of their new homes, with
a DeprecationWarning, until 0.2.0 (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import importlib
import sys

import pytest

import pipeline
from pipeline.models import DERIVED, GOES_IN, MOVED, SPLIT


def fresh_import(old: str):
    """``pipeline.models.<old>`` imported afresh (the warning comes once per import)."""
    sys.modules.pop(f"pipeline.models.{old}", None)
    with pytest.warns(DeprecationWarning, match=rf"pipeline\.models\.{old} is now .*goes in {GOES_IN}"):
        return importlib.import_module(f"pipeline.models.{old}")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_module_imports_with_a_warning_and_gives_its_new_homes_objects(old):
    module = fresh_import(old)
    home = importlib.import_module(MOVED[old])
    names = [n for n in vars(home) if not n.startswith("__")]
    assert names and all(getattr(module, n) is getattr(home, n) for n in names)
    with pytest.raises(AttributeError, match=f"pipeline.models.{old}"):
        module.no_such_name


@pytest.mark.parametrize("key", sorted(SPLIT))
def test_each_name_that_went_elsewhere_is_the_same_object(key):
    old, _, name = key.partition(".")
    module, _, attribute = SPLIT[key].partition(":")
    assert getattr(fresh_import(old), name) is getattr(importlib.import_module(module), attribute)


def test_an_old_plugins_imports_still_work():
    from pipeline.core.registry import LOSSES
    from pipeline.losses.contrastive import SigmoidPairLoss
    from pipeline.losses.hinge import MaxHingeLoss
    from pipeline.networks.network import DualNetwork

    sys.modules.pop("pipeline.models.losses", None)
    sys.modules.pop("pipeline.models.network", None)
    with pytest.warns(DeprecationWarning):
        from pipeline.models.losses import LOSSES as OLD_LOSSES
        from pipeline.models.losses import MaxHingeLoss as OldMaxHinge
        from pipeline.models.losses import SigmoidPairLoss as OldSigLIP
        from pipeline.models.network import DualNetwork as OldDual
    assert (OldMaxHinge, OldSigLIP, OldDual) == (MaxHingeLoss, SigmoidPairLoss, DualNetwork)
    assert OLD_LOSSES == LOSSES.resolved() and set(DERIVED) == {"losses.LOSSES"}
    assert "MaxHingeLoss" in dir(pipeline.models.losses)
    import pipeline.models as models
    from pipeline.networks.heads import GPO

    assert models.heads.GPO is GPO  # an old module read as an attribute of pipeline.models


def test_the_old_modules_are_0_1_0s_and_the_version_is_before_their_end():
    assert len(MOVED) == 26  # every module of 0.1.0's pipeline/models/ but its __init__.py
    major, minor, _ = (int(p) for p in pipeline.__version__.split("."))
    assert (major, minor) < tuple(int(p) for p in GOES_IN.split(".")[:2])


def test_no_module_of_vse_imports_the_old_paths():
    from test_layers import imports

    users = [m for m, targets in imports().items() for t in targets if t.startswith("pipeline.models")]
    assert users == []


def test_the_old_paths_and_the_package_faces_give_the_same_objects():
    """0.1.0's ``pipeline.models.losses`` and today's face ``pipeline.losses`` hand on one class."""
    import pipeline.losses
    import pipeline.networks

    assert fresh_import("losses").MaxHingeLoss is pipeline.losses.MaxHingeLoss
    assert fresh_import("heads").GPO is pipeline.networks.GPO
    assert fresh_import("sgraf").SGR is pipeline.networks.SGR
