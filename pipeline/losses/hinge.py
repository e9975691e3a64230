"""The hinge losses of VSE0, VSE++ and order embeddings: ``sh`` (the sum of hinges), ``mh`` (the
hardest negative), ``order`` (hinges on the order-embedding score); ``HardestNegativeHinge`` and
``hinge_costs``, which ``lseh`` and ``ladder`` build on too. The sum over the batch, as VSE++.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch, VseLoss


class SumHingeLoss(VseLoss):
    """``sh`` (VSE0): the sum of hinges over all negatives, both directions."""

    name = "sh"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        margin: float = declare(0.2, "The hinge margin.", low=0)

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = hinge_costs(batch.scores, batch.negatives, self.margin)
        return to_captions.sum() + to_images.sum()


class HardestNegativeHinge(VseLoss):
    """The hinge of the hardest negative per query, both directions, after an optional warm-up:
    ``warmup_epochs=E`` sums the hinges over all negatives for epochs 0 … E-1 (``set_epoch``),
    as VSE∞'s code does for its first epoch. Subclasses give the hinge costs."""

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        warmup_epochs: int = declare(0, "Sum of hinges for the first E epochs (VSE∞'s "
                                        "--vse_mean_warmup_epochs).", low=0)

    def collapse_value(self, global_batch: int) -> float | None:
        """Every hardest hinge is (about) the margin: 2 · B · margin (after any warm-up)."""
        return 2 * global_batch * self.margin or None

    def warming_up(self) -> bool:
        return self.epoch < self.warmup_epochs

    def starts(self) -> dict[str, int]:
        return {f"the hardest negative (after warmup_epochs {self.warmup_epochs} of summed hinges)":
                self.warmup_epochs} if self.warmup_epochs else {}

    def reduce(self, to_captions: torch.Tensor, to_images: torch.Tensor) -> torch.Tensor:
        if self.warming_up():
            return to_captions.sum() + to_images.sum()
        return to_captions.amax(dim=1).sum() + to_images.amax(dim=0).sum()


class MaxHingeLoss(HardestNegativeHinge):
    """``mh`` (VSE++): the hinge of the hardest negative per query, both directions.

    ``negative_set_size=k`` searches the hardest negative in a random subset of k of the
    query's negatives (drawn from torch's RNG, independently per query and direction).
    ``warmup_epochs=E`` uses the sum of hinges for epochs 0 … E-1 (see ``set_epoch``).
    """

    name = "mh"

    @dataclass(frozen=True)
    class Options(HardestNegativeHinge.Options):
        margin: float = declare(0.2, "The hinge margin.", low=0)
        negative_set_size: int | None = declare(None, "The hardest negative among k random negatives.",
                                                low=1)

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = hinge_costs(batch.scores, batch.negatives, self.margin)
        if self.negative_set_size is not None and not self.warming_up():
            size = self.negative_set_size
            to_captions = to_captions.masked_fill(~_random_subset(batch.negatives, size), 0.0)
            to_images = to_images.masked_fill(~_random_subset(batch.negatives.T, size).T, 0.0)
        return self.reduce(to_captions, to_images)


class OrderLoss(VseLoss):
    """``order``: hinges on the order-embedding score ``-||max(0, c - i)||^2``
    (``similarity.order_scores``, the one definition evaluation uses too).

    ``reduction="sum"`` is Order0 (sum of hinges), ``"max"`` Order++ (hardest negative).
    ``squared=False`` uses VSE++ code's ``-||max(0, c - i)||`` instead (its published Order++
    numbers come from that form); the run then declares the similarity ``"order-norm"`` and
    is evaluated with the same form.  The embeddings are used as given (the model makes
    them non-negative).
    """

    name = "order"

    similarity = "order"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        margin: float = declare(0.05, "The hinge margin.", low=0)
        reduction: str = declare("sum", "sum (Order0) or max (Order++: the hardest negative).",
                                 choices=("sum", "max"))
        squared: bool = declare(True, "The score -||max(0, c - i)||^2 (false: VSE++ code's unsquared norm).")

    def __init__(self, **options):
        super().__init__(**options)
        self.similarity = "order" if self.squared else "order-norm"

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = hinge_costs(batch.scores, batch.negatives, self.margin)
        if self.reduction == "sum":
            return to_captions.sum() + to_images.sum()
        return to_captions.amax(dim=1).sum() + to_images.amax(dim=0).sum()


def hinge_costs(scores, negatives, margin):
    """(to_captions, to_images): ``[margin + S_ij - S_ii]_+`` (query image i, row) and
    ``[margin + S_ij - S_jj]_+`` (query caption j, column), zero where not a negative."""
    positive = scores.diagonal()
    to_captions = (margin + scores - positive[:, None]).clamp(min=0)
    to_images = (margin + scores - positive[None, :]).clamp(min=0)
    return to_captions.masked_fill(~negatives, 0.0), to_images.masked_fill(~negatives, 0.0)


def _random_subset(negatives, size: int):
    """Per row, a uniformly random subset of ``size`` of its negatives (all if fewer)."""
    keys = torch.rand(negatives.shape, device=negatives.device).masked_fill(~negatives, -1.0)
    chosen = keys.topk(min(size, negatives.shape[1]), dim=1).indices
    return torch.zeros_like(negatives).scatter_(1, chosen, True) & negatives
