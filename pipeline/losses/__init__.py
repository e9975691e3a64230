"""Losses: what a batch's scores cost, one family per file, over one base class.

- ``base``: ``VseLoss`` (the checks, options and masks every loss shares), ``Batch``,
  ``build_loss`` and ``LOSS_NAMES`` (``core.registry.LOSSES`` names each class's file);
- the families: ``hinge`` (sh, mh, order), ``lseh`` (semantic hardness), ``ladder``, ``convse``
  (csn, cmn), ``contrastive`` (infonce, siglip, mvn), and ``noisy/`` for noisy pairs (``base``:
  what a method may ask of the trainer; ``ncr``, ``decl``, ``rcl``);
- ``check``: the loss contract (`vse check-loss`); ``plugins``: a loss by name or a user's
  ``FILE.py:Class``, and the traits the trainer reads from it.

Pure torch, tensors in and tensors out: a loss scores embeddings or a network's score matrix
(``core.similarity``), and never imports a network.

The package hands on its public names (``from pipeline.losses import MaxHingeLoss, build_loss``):
every built-in loss class, named by ``core.registry.LOSSES``, and the seam's names below, each
imported when first read, so ``import pipeline.losses`` stays torch-free.

May import: ``pipeline.core``.
"""

from __future__ import annotations

from pipeline.core.registry import LOSSES, Registry

# name → "module:attribute" of every public name: the registry's classes, then the seam's.
PUBLIC = Registry("name", {
    **{spec.rpartition(":")[2]: spec for spec in LOSSES.values()},
    **{name: f"pipeline.losses.base:{name}" for name in ("VseLoss", "Batch", "build_loss", "LOSS_NAMES")},
    "LADDER_DEFAULTS": "pipeline.losses.ladder:LADDER_DEFAULTS",
    "NoisyPairLoss": "pipeline.losses.noisy.base:NoisyPairLoss",
    **{name: f"pipeline.losses.plugins:{name}" for name in ("make_loss", "loss_class", "loss_traits",
                                                           "LossTraits")},
    "run_contract": "pipeline.losses.check:run_contract",
})
__all__ = list(PUBLIC)

__getattr__, __dir__ = PUBLIC.face(globals())
