"""The old import paths of ``pipeline.models`` (0.1.0), kept for plug-ins written against them until
0.2.0, where this module goes: the one place of the moved names.

``pipeline.models`` held networks, losses and backbones side by side; they are three packages now
(docs/ARCHITECTURE.md): ``pipeline.networks``, ``pipeline.losses`` and ``pipeline.backbones``, with
the similarity and the checks' common parts in ``pipeline.core``. A plug-in that imports an old
path, e.g. ``from pipeline.models.losses import MaxHingeLoss``, gets the very object of its new
home, with a ``DeprecationWarning`` naming that home, once per old module imported.

- ``MOVED``: each old module → the module that took it (or, for a module split in several, the one
  that took the rest of its names);
- ``SPLIT``: each old ``module.name`` that went elsewhere → ``"new.module:name"`` (renamed where the
  name changed);
- ``DERIVED``: old names that were computed on use, computed here the same way.

No module of vse imports this one (tests/test_layers.py, tests/test_models_moved.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings

GOES_IN = "0.2.0"

MOVED = {
    "similarity": "pipeline.core.similarity",
    "checks": "pipeline.core.checks",
    "network": "pipeline.networks.network",
    "network_check": "pipeline.networks.network_check",
    "pool_check": "pipeline.networks.pool_check",
    "layers": "pipeline.networks.layers",
    "heads": "pipeline.networks.heads",
    "set_augment": "pipeline.networks.set_augment",
    "vse_model": "pipeline.networks.vse_model",
    "vse_spec": "pipeline.networks.vse_spec",
    "vsrn": "pipeline.networks.vsrn",
    "vsrn_spec": "pipeline.networks.vsrn_spec",
    "sgraf": "pipeline.networks.sgraf",
    "sgraf_ops": "pipeline.networks.sgraf_ops",
    "sgraf_spec": "pipeline.networks.sgraf_spec",
    "cotrain": "pipeline.networks.cotrain",
    "losses": "pipeline.losses.base",
    "loss_check": "pipeline.losses.check",
    "loss_plugins": "pipeline.losses.plugins",
    "noisy_losses": "pipeline.losses.noisy.base",
    "ncr": "pipeline.losses.noisy.ncr",
    "decl": "pipeline.losses.noisy.decl",
    "rcl": "pipeline.losses.noisy.rcl",
    "backbones": "pipeline.backbones.cnns",
    "engines": "pipeline.backbones.engines",
    "crops": "pipeline.backbones.crops",
}

SPLIT = {
    # losses.py: one file per family
    "losses.SumHingeLoss": "pipeline.losses.hinge:SumHingeLoss",
    "losses.MaxHingeLoss": "pipeline.losses.hinge:MaxHingeLoss",
    "losses.OrderLoss": "pipeline.losses.hinge:OrderLoss",
    "losses._HardestNegativeHinge": "pipeline.losses.hinge:HardestNegativeHinge",
    "losses._hinge_costs": "pipeline.losses.hinge:hinge_costs",
    "losses._random_subset": "pipeline.losses.hinge:_random_subset",
    "losses.SemanticHardNegativeLoss": "pipeline.losses.lseh:SemanticHardNegativeLoss",
    "losses.LADDER_DEFAULTS": "pipeline.losses.ladder:LADDER_DEFAULTS",
    "losses.LadderLoss": "pipeline.losses.ladder:LadderLoss",
    "losses._ladder_hinges": "pipeline.losses.ladder:_ladder_hinges",
    "losses.CrossModalInfoNCELoss": "pipeline.losses.convse:CrossModalInfoNCELoss",
    "losses.HardestNegativeContrastiveLoss": "pipeline.losses.convse:HardestNegativeContrastiveLoss",
    "losses.MultiViewNTXentLoss": "pipeline.losses.contrastive:MultiViewNTXentLoss",
    "losses.CLIPInfoNCELoss": "pipeline.losses.contrastive:CLIPInfoNCELoss",
    "losses.SigmoidPairLoss": "pipeline.losses.contrastive:SigmoidPairLoss",
    "losses._clamped_log_scale": "pipeline.losses.contrastive:_clamped_log_scale",
    "losses._finite": "pipeline.core.values:finite",
    # the pixels of RC training went to the backbones
    "vse_model.pixel_constants": "pipeline.backbones.pixels:pixel_constants",
    "vse_model.normalise_pixels": "pipeline.backbones.pixels:normalise_pixels",
    "vse_model.PixelBackbone": "pipeline.backbones.pixels:PixelBackbone",
    # what the commands imported through the loss contract
    "loss_check.format_results": "pipeline.core.checks:format_results",
    # the names noisy_losses forwarded for the methods that moved to a file each
    "noisy_losses.ComplementaryContrastiveLoss": "pipeline.losses.noisy.rcl:ComplementaryContrastiveLoss",
    "noisy_losses.RCL_VARIANTS": "pipeline.losses.noisy.rcl:RCL_VARIANTS",
    "noisy_losses.EvidentialLoss": "pipeline.losses.noisy.decl:EvidentialLoss",
    "noisy_losses.DECL_EVIDENCE_LOSSES": "pipeline.losses.noisy.decl:DECL_EVIDENCE_LOSSES",
    "noisy_losses.NoisyCorrespondenceRectifier": "pipeline.losses.noisy.ncr:NoisyCorrespondenceRectifier",
    "noisy_losses.gmm_clean_probability": "pipeline.losses.noisy.ncr:gmm_clean_probability",
}


def _built_in_losses() -> dict:
    from pipeline.core.registry import LOSSES

    return LOSSES.resolved()


DERIVED = {"losses.LOSSES": _built_in_losses}  # name → class of every built-in loss, as before


def homes(old: str) -> list[str]:
    """The modules that hold the names of old module ``old`` now."""
    split = [target.partition(":")[0] for key, target in SPLIT.items() if key.partition(".")[0] == old]
    return list(dict.fromkeys([MOVED[old], *split]))


def resolve(old: str, name: str):
    """What ``pipeline.models.<old>.<name>`` was: the same object, from its new home."""
    key = f"{old}.{name}"
    if key in DERIVED:
        return DERIVED[key]()
    module, _, attribute = SPLIT.get(key, f"{MOVED[old]}:{name}").partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except AttributeError:
        raise AttributeError(f"module 'pipeline.models.{old}' has no attribute {name!r}") from None


class OldModule(types.ModuleType):
    """An old module of ``pipeline.models``: each name read from its new home."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return resolve(self.__name__.rpartition(".")[2], name)

    def __dir__(self):
        old = self.__name__.rpartition(".")[2]
        names = set(dir(importlib.import_module(MOVED[old])))
        names |= {key.partition(".")[2] for key in [*SPLIT, *DERIVED] if key.partition(".")[0] == old}
        return sorted(names)


class OldPaths:
    """``import pipeline.models.<old>`` gives an ``OldModule``, with a DeprecationWarning."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, OldPaths)

    @staticmethod
    def create_module(spec):
        old = spec.name.rpartition(".")[2]
        warnings.warn(f"{spec.name} is now {', '.join(homes(old))}; pipeline.models goes in {GOES_IN}",
                      DeprecationWarning, stacklevel=2)
        return OldModule(spec.name)

    @staticmethod
    def exec_module(module):
        pass


def __getattr__(name: str):
    """``pipeline.models.<old>`` read as an attribute: the old module, imported."""
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not any(finder is OldPaths for finder in sys.meta_path):
    sys.meta_path.append(OldPaths)
