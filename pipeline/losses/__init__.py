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

May import: ``pipeline.core``.
"""
